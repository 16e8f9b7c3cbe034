#!/usr/bin/env bash
# peer-llamacpp.sh: llama.cpp's K-quants of a llama2.c model, measured the way
# `sluice eval` measures Sluice's (docs/BENCHMARKS.md, issue 16).
#
#   scripts/peer-llamacpp.sh (-s LLAMA_SRC | -b LLAMA_BIN) -o DIR [-t TYPES] [-c CTX]
#                            MODEL.bin VOCAB TEXT
#
#   -s LLAMA_SRC  a llama.cpp source tree (a fetched snapshot, outside this
#                 repository): built CPU-only Release into LLAMA_SRC/build-sluice
#                 (targets llama-perplexity, llama-quantize, llama-simple,
#                 llama-convert-llama2c-to-ggml), unless already built there
#   -b LLAMA_BIN  a directory with those binaries already built
#   -o DIR        working directory (GGUFs, logs, results.tsv)
#   -t TYPES      comma-separated llama-quantize types
#                 (default Q3_K_M,Q4_K_M,Q5_K_M,Q6_K,Q8_0)
#   -c CTX        chunk length (default 256: sluice eval's min(context, 512) for
#                 kjv6L; set it to the model's context when smaller than 512)
#   MODEL.bin     llama2.c float32 checkpoint
#   VOCAB         a GGUF (or llama2.c tokenizer) to copy the vocabulary from
#   TEXT          the evaluation text
#
# Steps: the feed-forward width is padded to a multiple of 256 with zero rows
# of w1/w3 and zero columns of w2 (scripts/pad-llama2c-ffn.py: the function is
# unchanged, and K-quants, which need rows of a multiple of 256, apply); the
# padded model is converted to an F32 GGUF with llama.cpp's llama2.c converter;
# its greedy text (llama-simple, 48 tokens) is printed beside the unpadded
# model's, as a check that the function is unchanged; each type is made with
# llama-quantize; llama-perplexity -c CTX -b CTX --kl-divergence scores each
# against the F32 GGUF's logits on TEXT: chunks of CTX tokens, the first
# replaced by BOS, the second half scored (sluice eval's chunking). Sizes are
# given as written and corrected for the padding (scripts/gguf-size.py: each
# padded tensor counted at 688/768 of its bytes for kjv6L).
# results.tsv: type, file bytes, corrected bytes, KL mean, its standard error,
# top-1 agreement (%), PPL of the quantized model. Needs python3 (standard
# library), cmake and a C++ compiler for -s.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src= bin= dir= types=Q3_K_M,Q4_K_M,Q5_K_M,Q6_K,Q8_0 ctx=256
usage() { sed -n 2,40p "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while getopts "s:b:o:t:c:h" opt; do
  case $opt in
    s) src=$OPTARG ;;
    b) bin=$OPTARG ;;
    o) dir=$OPTARG ;;
    t) types=$OPTARG ;;
    c) ctx=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 3 ] && [ -n "$dir" ] && { [ -n "$src" ] || [ -n "$bin" ]; } || usage
model=$1 vocab=$2 text=$3
for f in "$model" "$vocab" "$text"; do
  [ -r "$f" ] || { echo "peer-llamacpp: cannot read $f" >&2; exit 1; }
done
[[ $ctx =~ ^[0-9]+$ ]] && [ "$ctx" -ge 4 ] || { echo "peer-llamacpp: -c wants a number >= 4" >&2; exit 2; }
if [ -n "$src" ]; then
  bin=$src/build-sluice/bin
  if [ ! -x "$bin/llama-perplexity" ]; then
    cmake -S "$src" -B "$src/build-sluice" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF \
      -DGGML_METAL=OFF -DLLAMA_CURL=OFF > "$dir.cmake.log" 2>&1 || {
      echo "peer-llamacpp: cmake failed, see $dir.cmake.log" >&2; exit 1; }
    cmake --build "$src/build-sluice" -j"$(nproc)" --target llama-perplexity llama-quantize \
      llama-simple llama-convert-llama2c-to-ggml > "$dir.build.log" 2>&1 || {
      echo "peer-llamacpp: build failed, see $dir.build.log" >&2; exit 1; }
  fi
fi
for t in llama-perplexity llama-quantize llama-simple llama-convert-llama2c-to-ggml; do
  [ -x "$bin/$t" ] || { echo "peer-llamacpp: $bin/$t missing" >&2; exit 1; }
done
mkdir -p "$dir"
name=$(basename "$model" .bin)
python3 "$here/pad-llama2c-ffn.py" "$model" "$dir/$name-pad.bin" 256
read -r orig padded < <(python3 - "$model" "$dir/$name-pad.bin" <<'PY'
import struct, sys
print(struct.unpack("<7i", open(sys.argv[1], "rb").read(28))[1],
      struct.unpack("<7i", open(sys.argv[2], "rb").read(28))[1])
PY
)
"$bin/llama-convert-llama2c-to-ggml" --copy-vocab-from-model "$vocab" --llama2c-model "$model" \
  --llama2c-output-model "$dir/$name-f32.gguf" > "$dir/convert.log" 2>&1
"$bin/llama-convert-llama2c-to-ggml" --copy-vocab-from-model "$vocab" \
  --llama2c-model "$dir/$name-pad.bin" --llama2c-output-model "$dir/$name-pad-f32.gguf" \
  >> "$dir/convert.log" 2>&1
prompt=$(head -c 40 "$text" | cut -d' ' -f1-4)
a=$("$bin/llama-simple" -m "$dir/$name-f32.gguf" -n 48 "$prompt" 2>/dev/null)
b=$("$bin/llama-simple" -m "$dir/$name-pad-f32.gguf" -n 48 "$prompt" 2>/dev/null)
echo "greedy, unpadded: $a"
echo "greedy, padded:   $b"
[ "$a" = "$b" ] && echo "greedy texts: identical" || echo "greedy texts: DIFFER" >&2
"$bin/llama-perplexity" -m "$dir/$name-pad-f32.gguf" -f "$text" -c "$ctx" -b "$ctx" \
  --kl-divergence-base "$dir/base.kld" > "$dir/base.log" 2>&1
printf 'type\tfile_bytes\tcorrected_bytes\tkl_mean\tkl_se\ttop1_pct\tppl\n' > "$dir/results.tsv"
IFS=, read -ra tl <<< "$types"
for t in "${tl[@]}"; do
  q=$dir/$name-pad-$t.gguf
  "$bin/llama-quantize" "$dir/$name-pad-f32.gguf" "$q" "$t" > "$dir/quantize-$t.log" 2>&1
  "$bin/llama-perplexity" -m "$q" -f "$text" -c "$ctx" -b "$ctx" --kl-divergence-base \
    "$dir/base.kld" --kl-divergence > "$dir/kl-$t.log" 2>&1
  read -r fb cb < <(python3 "$here/gguf-size.py" "$q" "$orig" "$padded")
  kl=$(sed -n 's/^Mean    KLD: *\([-0-9.e]*\) *± *\([-0-9.e]*\).*/\1\t\2/p' "$dir/kl-$t.log")
  top=$(sed -n 's/^Same top p: *\([0-9.]*\).*/\1/p' "$dir/kl-$t.log")
  ppl=$(sed -n 's/^Mean PPL(Q) *: *\([0-9.]*\).*/\1/p' "$dir/kl-$t.log")
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$fb" "$cb" "$kl" "$top" "$ppl" | tee -a "$dir/results.tsv"
done
