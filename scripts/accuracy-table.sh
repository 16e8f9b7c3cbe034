#!/bin/sh
# accuracy-table.sh: the accuracy table of docs/BENCHMARKS.md: every real model
# in ../shared/models, methods edgeflow, uniform, smoothquant, cmpq at average
# 4, 5, 6 and 7 bits: mean and p99 KL divergence against the float model,
# top-1 agreement, perplexity, file size; plus EdgeFlow's budget (tensor vs
# global) and activation (static vs dynamic) variants at 5 bits.
# Held-out text: each model's calib.txt is split by lines; the first half
# calibrates, the second half is evaluated.
#   scripts/accuracy-table.sh [BUILD_DIR] > table.md
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}/tools/sluice
SHARED=${SLUICE_SHARED:-../shared}
M=$SHARED/models
W=${TMPDIR:-/tmp}/sluice-accuracy
mkdir -p "$W"
[ -x "$B" ] || { echo "accuracy-table: build first ($B missing)" >&2; exit 1; }
[ -d "$M" ] || { echo "accuracy-table: $M not found" >&2; exit 77; }

row() { # model method bits variant-label file ref text ctx
  j=$("$B" eval "$5" --ref "$6" --text "$7" --ctx "$8" --json 2>/dev/null)
  size=$(stat -c %s "$5")
  python3 - "$1" "$2" "$3" "$4" "$size" "$j" <<'PY'
import json, sys
m, meth, bits, var, size, j = sys.argv[1:7]
d = json.loads(j)
print(f"| {m} | {meth}{var} | {bits} | {d['kl_mean']:.5f} | {d['kl_p99']:.4f} | "
      f"{100*d['top1_agreement']:.2f}% | {d['ppl']:.3f} | {d['ppl_ref']:.3f} | {int(size)/1e6:.3f} | {d['tokens']} |")
PY
}

echo "| model | method | bits | KL mean | KL p99 | top-1 | PPL | PPL float | file MB | tokens |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for model in aidreams260K kjv6L; do
  case $model in
    aidreams260K) tok=$M/aidreams260K.tok512.bin; ctx=128 ;;
    kjv6L) tok=$M/kjv6L.tok1024.bin; ctx=256 ;;
  esac
  n=$(wc -l < "$M/$model.calib.txt")
  head -n $((n / 2)) "$M/$model.calib.txt" > "$W/$model.calib-a.txt"
  tail -n +$((n / 2 + 1)) "$M/$model.calib.txt" > "$W/$model.calib-b.txt"
  "$B" import "$M/$model.bin" --tokenizer "$tok" -o "$W/$model.f32.sluice" 2>/dev/null
  for bits in 4 5 6 7; do
    for method in edgeflow uniform smoothquant cmpq; do
      out=$W/$model.$method.$bits.sluice
      "$B" quantize "$W/$model.f32.sluice" -o "$out" --bits $bits --method $method \
        --calib "$W/$model.calib-a.txt" >/dev/null 2>&1
      row $model $method $bits "" "$out" "$W/$model.f32.sluice" "$W/$model.calib-b.txt" $ctx
    done
  done
  for v in "global static" "tensor dynamic"; do
    set -- $v
    out=$W/$model.edgeflow.5.$1.$2.sluice
    "$B" quantize "$W/$model.f32.sluice" -o "$out" --bits 5 --budget $1 --act $2 \
      --calib "$W/$model.calib-a.txt" >/dev/null 2>&1
    row $model edgeflow 5 " ($1 budget, $2 act.)" "$out" "$W/$model.f32.sluice" "$W/$model.calib-b.txt" $ctx
  done
done
