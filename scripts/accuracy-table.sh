#!/bin/sh
# accuracy-table.sh: the accuracy tables of docs/BENCHMARKS-accuracy.md.
# For every real model in ../shared/models (aidreams260K, kjv6L; llama2.c
# .bin with its tokenizer): methods edgeflow, uniform, smoothquant, cmpq at
# average 4, 5, 6 and 7 bits: mean and p99 KL divergence from the float model,
# top-1 agreement, perplexity of both, file size (sluice eval, llama.cpp's
# llama-perplexity --kl-divergence convention), and the per-token paired
# difference of each method's KL from EdgeFlow's; then variants at 4 and 5
# bits: each budget alone (per-tensor; global with both objectives; the
# default --budget auto keeps the better of per-tensor and global-weight by
# KL on the calibration text), the in-sample alpha search, the
# one-standard-error alpha rule, the exact RE metric, EdgeFlow's halves alone (smoothing with uniform widths; the
# allocation without smoothing), dynamic activation scales and unclipped
# (max|w|) weight scales for every method.
#
# Held-out text: each calib.txt is split by lines; the first half calibrates,
# the second half is evaluated. aidreams260K's second half is short (about
# 1100 scored tokens), so 200 more samples of the float model itself (the way
# its calib.txt was made: temperature 1, seeds 5001-5200, `sluice run`) are
# appended to its evaluation text.
#
#   scripts/accuracy-table.sh [BUILD_DIR] > table.md    (about 30 minutes here)
# Every command is echoed to stderr; results also go to $W/results.jsonl.
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}/tools/sluice
SHARED=${SLUICE_SHARED:-../shared}
M=$SHARED/models
W=${TMPDIR:-/tmp}/sluice-accuracy
mkdir -p "$W/kl"
[ -x "$B" ] || { echo "accuracy-table: build first ($B missing)" >&2; exit 1; }
[ -d "$M" ] || { echo "accuracy-table: $M not found" >&2; exit 77; }
: > "$W/results.jsonl"

exec 3>&2
x() { echo "+ $*" >&3; "$@"; } # echoes every command to the script's stderr

# row MODEL LABEL BITS QUANT_ARGS...: quantize, evaluate, print a table row
row() {
  model=$1 label=$2 bits=$3
  shift 3
  out=$W/$model.q.sluice
  x "$B" quantize "$W/$model.f32.sluice" -o "$out" --bits "$bits" --calib "$W/$model.calib-a.txt" \
    "$@" > "$W/quantize.log" 2>&1 || { cat "$W/quantize.log" >&2; exit 1; }
  slug=$(echo "$label" | tr -c 'A-Za-z0-9\n' '_')
  j=$(x "$B" eval "$out" --ref "$W/$model.f32.sluice" --text "$W/$model.eval.txt" --json \
    --kl-out "$W/kl/$model.$slug.$bits.txt" 2>/dev/null)
  size=$(stat -c %s "$out")
  bpw=$(sed -n 's/.*: \([0-9.]*\) bits per weight.*/\1/p' "$W/quantize.log")
  python3 - "$model" "$label" "$bits" "$size" "$bpw" "$j" "$*" "$W/results.jsonl" <<'PY'
import json, sys
m, label, bits, size, bpw, j, args, log = sys.argv[1:9]
d = json.loads(j)
d.update(model=m, method=label, bits=float(bits), file_bytes=int(size), bits_per_weight=float(bpw),
         args=args)
open(log, "a").write(json.dumps(d) + "\n")
print(f"| {m} | {label} | {bits} | {d['kl_mean']:.5f} ± {d['kl_mean_se']:.5f} | {d['kl_p99']:.4f} | "
      f"{100*d['top1_agreement']:.2f}% | {d['ppl']:.3f} | {d['ppl_ref']:.3f} | "
      f"{int(size)/1e6:.3f} | {float(bpw):.3f} |")
PY
}

header() {
  echo
  echo "| model | method | bits | KL mean | KL p99 | top-1 | PPL | PPL float | file MB | bits/weight |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
}

prepare() { # model tokenizer
  model=$1 tok=$2
  x "$B" import "$M/$model.bin" --tokenizer "$M/$tok" -o "$W/$model.f32.sluice" >/dev/null 2>&1
  n=$(wc -l < "$M/$model.calib.txt")
  head -n $((n / 2)) "$M/$model.calib.txt" > "$W/$model.calib-a.txt"
  tail -n +$((n / 2 + 1)) "$M/$model.calib.txt" > "$W/$model.eval.txt"
  if [ "$model" = aidreams260K ]; then
    for s in $(seq 5001 5200); do
      "$B" run "$W/$model.f32.sluice" --temp 1 --seed "$s" -n 256 2>/dev/null
      echo
    done >> "$W/$model.eval.txt"
  fi
}

prepare aidreams260K aidreams260K.tok512.bin
prepare kjv6L kjv6L.tok1024.bin

echo "### Methods at 4-7 bits (defaults: --budget auto, static activations, MSE clipping)"
header
for model in aidreams260K kjv6L; do
  for bits in 4 5 6 7; do
    for method in edgeflow uniform smoothquant cmpq; do
      row $model $method $bits --method $method
    done
  done
done

echo
echo "### Paired differences: KL(method) - KL(edgeflow) per scored token, mean ± standard error"
echo
echo "| model | bits | uniform | smoothquant | cmpq |"
echo "| --- | --- | --- | --- | --- |"
python3 - "$W/kl" <<'PY'
import math, sys
d = sys.argv[1]
def load(m, meth, b):
    return [float(x) for x in open(f"{d}/{m}.{meth}.{b}.txt")]
for m in ("aidreams260K", "kjv6L"):
    for b in (4, 5, 6, 7):
        e = load(m, "edgeflow", b)
        cells = []
        for meth in ("uniform", "smoothquant", "cmpq"):
            o = load(m, meth, b)
            diff = [x - y for x, y in zip(o, e)]
            n = len(diff)
            mu = sum(diff) / n
            se = math.sqrt(sum((x - mu) ** 2 for x in diff) / (n - 1) / n)
            cells.append(f"{mu:+.5f} ± {se:.5f}")
        print(f"| {m} | {b} | " + " | ".join(cells) + " |")
PY

echo
echo "### Variants at 4 and 5 bits"
header
for model in aidreams260K kjv6L; do
  for bits in 4 5; do
    row $model "edgeflow, per-tensor budget" $bits --budget tensor
    row $model "edgeflow, global budget (weight)" $bits --budget global
    row $model "edgeflow, global budget (tensor-mean)" $bits --budget global \
      --global-objective tensor-mean
    row $model "cmpq, per-tensor budget" $bits --method cmpq --budget tensor
    row $model "cmpq, global budget (weight)" $bits --method cmpq --budget global
    row $model "edgeflow, in-sample alpha search" $bits --alpha-search in-sample
    row $model "edgeflow, one-standard-error alpha rule" $bits --alpha-rule 1se
    row $model "edgeflow, exact RE metric" $bits --metric exact
    row $model "edgeflow, smoothing only (uniform widths)" $bits --uniform-widths
    row $model "edgeflow, allocation only (alpha 0)" $bits --alpha 0
    for method in edgeflow uniform smoothquant cmpq; do
      row $model "$method, dynamic activations" $bits --method $method --act dynamic
      row $model "$method, no clipping (max scale)" $bits --method $method --clip none
    done
  done
done
