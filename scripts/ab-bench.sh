#!/usr/bin/env bash
# ab-bench.sh: performance A/B of two `sluice` binaries on one model, cold
# starts side by side in one run (docs/BENCHMARKS.md, SPEC "Measuring").
#
#   scripts/ab-bench.sh [-r RUNS] [-m MBPS] [-c CASES] [-o DIR] [-a] BIN_A BIN_B MODEL
#
#   -r RUNS   runs per case and binary (default 5; 3 at least for a claim)
#   -m MBPS   flash read limit in MB/s for flashrun (default 800; 0: none)
#   -c CASES  comma-separated subset of the cases below (default: all four)
#   -o DIR    keep every run's JSON, stderr and times in DIR (default: a
#             temporary directory, removed at the end)
#   -a        alternate the order of each pair: A then B in odd rounds, B then
#             A in even ones (the first run after a round's raw read can be
#             slower; use an even RUNS)
#
# Cases, each run a fresh process after the page cache is dropped, in a fresh
# read-limited cgroup (../shared/tools/flashrun; $FLASHRUN overrides it):
#   ttft128     flashrun -m MBPS -f MODEL -- BIN run MODEL --prompt-tokens 128 -n 1 --json
#   ttft512     ... --prompt-tokens 512 -n 1: cold TTFT, the JSON's ttft_s (process
#               start, taken first thing in main(), to the first token sampled)
#   decode128   ... --prompt-tokens 128 -n 64
#   decode1000  ... --prompt-tokens 1000 -n 64: decode tokens/s at that context,
#               the JSON's decode_tokens_per_s ((generated - 1) / time from the
#               first token to the last); a run that stopped early (EOS) is
#               flagged, one with under 2 tokens generated has no rate
# Interleaved: for each round, for each case, BIN_A then BIN_B (-a: B then A
# in even rounds), so the two runs of a pair see the same machine. Each round
# also measures the raw rate of the limited device once (dd with O_DIRECT of MODEL under flashrun), for
# reading the TTFTs against the bound (bytes read / raw rate).
# The command is also timed inside flashrun (bash's $EPOCHREALTIME around
# it, so the cache drop and cgroup setup are not counted): `wall` is exec to
# exit, which adds dynamic loading and teardown to the TTFT.
# Prints per case and binary: runs, min, median (of an even count: the mean
# of the two middle runs), the median wall time, the median MB read, whether
# both binaries generated the same text in every run, and the ratio of
# medians B/A (TTFT: below 1 means B is faster; tokens/s: above 1 means B is
# faster).
#
# Why `sluice run --json` and not `sluice bench coldstart`: bench coldstart's
# `full` row is the same measurement (a child `sluice run --prompt-tokens N
# -n 1 --json`, its ttft_s, the page cache dropped and a fresh limited cgroup
# per run, full policy, stream load, chunk 256 as here), but one invocation
# runs all eight contenders with no way to pick `full` alone (about 14 s per
# run at 128 tokens against 0.8 s for full), it interleaves the contenders of
# one binary, not two binaries (an A/B would alternate whole invocations
# with --runs 1: the same samples for about 15x the device time), it writes
# INT8 and INT4/INT8 variants next to MODEL that both binaries would then
# share (reused while newer than MODEL), and it has no decode case. Run it
# once per binary when the bound and the baselines are wanted; for A/B
# ratios this script's runs are the same number, cheaper and interleaved.
#
# Needs root (flashrun), bash 5, jq, dd, awk.
set -euo pipefail

usage() {
  sed -n '5,14p' "$0" | sed 's/^# \{0,1\}//' >&2
  echo "(-h: the whole description)" >&2
  exit 2
}

runs=5 mbps=800 cases=ttft128,ttft512,decode128,decode1000 keep="" alt=0
while getopts r:m:c:o:ah opt; do
  case $opt in
    r) runs=$OPTARG ;;
    m) mbps=$OPTARG ;;
    c) cases=$OPTARG ;;
    o) keep=$OPTARG ;;
    a) alt=1 ;;
    h) sed -n '2,/^# Needs root/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 3 ] || usage
bin_a=$1 bin_b=$2 model=$3
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "ab-bench: -r needs a positive count" >&2; exit 2; }
[[ $mbps =~ ^[0-9]+$ ]] || { echo "ab-bench: -m needs MB/s (0: no limit)" >&2; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
flashrun=${FLASHRUN:-$here/../../shared/tools/flashrun}
[ -x "$flashrun" ] || flashrun=$(command -v flashrun || true)
if [ -z "$flashrun" ] || [ ! -x "$flashrun" ]; then
  echo "ab-bench: flashrun not found (../shared/tools/flashrun or \$FLASHRUN)" >&2
  exit 1
fi
[ "$(id -u)" = 0 ] || { echo "ab-bench: needs root (flashrun drops the page cache)" >&2; exit 1; }
command -v jq >/dev/null || { echo "ab-bench: needs jq (apt-get install jq)" >&2; exit 1; }
for b in "$bin_a" "$bin_b"; do
  [ -x "$b" ] || { echo "ab-bench: $b is not an executable" >&2; exit 1; }
done
[ -r "$model" ] || { echo "ab-bench: cannot read $model" >&2; exit 1; }

# case -> prompt tokens, tokens to generate, JSON key, unit
case_spec() {
  case $1 in
    ttft128) echo "128 1 ttft_s s" ;;
    ttft512) echo "512 1 ttft_s s" ;;
    decode128) echo "128 64 decode_tokens_per_s tok/s" ;;
    decode1000) echo "1000 64 decode_tokens_per_s tok/s" ;;
    *) return 1 ;;
  esac
}
IFS=, read -r -a case_list <<<"$cases"
for c in "${case_list[@]}"; do
  case_spec "$c" >/dev/null || { echo "ab-bench: unknown case '$c'" >&2; exit 2; }
done

if [ -n "$keep" ]; then
  mkdir -p "$keep"
  out=$keep
else
  out=$(mktemp -d "${TMPDIR:-/tmp}/ab-bench.XXXXXX")
  trap 'rm -rf "$out"' EXIT
fi
samples=$out/samples.tsv
printf 'round\tcase\tbin\tvalue\twall_s\tgenerated\tbytes_read\ttext_md5\n' >"$samples"
: >"$out/raw.txt"

# One cold run; appends a line to $samples (value empty when it failed).
one_run() {
  local round=$1 c=$2 label=$3 bin=$4 p n key unit
  read -r p n key unit <<<"$(case_spec "$c")"
  local base=$out/$c.$label.$round
  local value="" wall="" gen="" bytes="" md5=""
  # shellcheck disable=SC2016 # expanded by the inner bash
  if "$flashrun" -m "$mbps" -f "$model" -- bash -c \
    't0=$EPOCHREALTIME; "${@:2}"; rc=$?; t1=$EPOCHREALTIME; echo "$t0 $t1" >"$1"; exit $rc' \
    ab-bench "$base.time" "$bin" run "$model" --prompt-tokens "$p" -n "$n" --json \
    >"$base.json" 2>"$base.err" && jq -e . "$base.json" >/dev/null 2>&1; then
    value=$(jq -r ".$key" "$base.json")
    gen=$(jq -r .generated_tokens "$base.json")
    bytes=$(jq -r .pipeline.bytes_read "$base.json")
    md5=$(jq -r .text "$base.json" | md5sum | cut -c1-12)
    wall=$(awk '{printf "%.4f", $2 - $1}' "$base.time")
    # fewer than 2 tokens generated: no decode step, no rate (the JSON says 0)
    [ "$key" = decode_tokens_per_s ] && [ "$gen" -lt 2 ] && value=""
  else
    echo "ab-bench: round $round $c $label FAILED:" >&2
    tail -n 3 "$base.err" >&2 || true
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$c" "$label" "$value" "$wall" "$gen" \
    "$bytes" "$md5" >>"$samples"
  local flag=""
  [ -n "$gen" ] && [ "$gen" != "$n" ] && flag=" (generated $gen of $n: stopped early)"
  printf '  round %d %-10s %s %s %s, wall %s s%s\n' "$round" "$c" "$label" "${value:-none}" \
    "$unit" "${wall:--}" "$flag" >&2
}

# The limited device's raw rate: one O_DIRECT read of MODEL.
raw_rate() {
  local log=$out/raw.$1.err
  if "$flashrun" -m "$mbps" -f "$model" -- dd if="$model" of=/dev/null bs=16M iflag=direct \
    2>"$log"; then
    LC_ALL=C awk '/bytes/ && /copied/ {for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) t = $(i-1);
      if (t > 0) printf "%.1f\n", $1 / t / 1e6}' "$log" >>"$out/raw.txt"
  fi
}

echo "ab-bench: A = $bin_a" >&2
echo "ab-bench: B = $bin_b" >&2
order="A then B"
[ "$alt" = 1 ] && order="A then B, B then A in even rounds"
echo "ab-bench: $model, $mbps MB/s, $runs rounds of: raw read, ${cases//,/ } ($order); files in $out" >&2
start=$EPOCHREALTIME
for ((r = 1; r <= runs; r++)); do
  t_round=$EPOCHREALTIME
  raw_rate "$r"
  for c in "${case_list[@]}"; do
    if [ "$alt" = 1 ] && ((r % 2 == 0)); then
      one_run "$r" "$c" B "$bin_b"
      one_run "$r" "$c" A "$bin_a"
    else
      one_run "$r" "$c" A "$bin_a"
      one_run "$r" "$c" B "$bin_b"
    fi
  done
  awk -v a="$t_round" -v b="$EPOCHREALTIME" -v r="$r" \
    'BEGIN {printf "round %d took %.1f s\n", r, b - a}' >&2
done
total=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')

# Summary: min and median per case and binary, ratio of medians B/A.
stats() { # values on stdin -> "n min median"
  sort -g | awk '{v[NR] = $1} END {
    if (NR == 0) { print "0 - -"; exit }
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%d %.4f %.4f\n", NR, v[1], m }'
}
col() { # case bin column -> successful runs' values of that column
  awk -F'\t' -v c="$1" -v b="$2" -v k="$3" 'NR > 1 && $2 == c && $3 == b && $4 != "" {print $k}' \
    "$samples"
}
echo
echo "A = $bin_a (md5 $(md5sum <"$bin_a" | cut -c1-12))"
echo "B = $bin_b (md5 $(md5sum <"$bin_b" | cut -c1-12))"
read -r nraw rawmin rawmed <<<"$(stats <"$out/raw.txt")"
if [ "$nraw" = 0 ]; then
  raw="raw O_DIRECT read: not measured"
else
  raw=$(awk -v a="$rawmin" -v b="$rawmed" -v n="$nraw" \
    'BEGIN {printf "raw O_DIRECT read: min %.1f, median %.1f MB/s (%d runs)", a, b, n}')
fi
echo "$model; flash limit $mbps MB/s; $raw; $runs rounds in $total s"
echo
printf '%-11s %-3s %4s %10s %10s %8s %9s %9s %6s %7s\n' case bin runs min median unit "wall med" \
  "MB read" same "B/A"
for c in "${case_list[@]}"; do
  read -r _ _ _ unit <<<"$(case_spec "$c")"
  same=yes
  # the same text in every round where both ran
  if [ -n "$(awk -F'\t' -v c="$c" 'NR > 1 && $2 == c && $4 != "" {t[$1, $3] = $8; r[$1] = 1}
      END {for (k in r) if ((k, "A") in t && (k, "B") in t && t[k, "A"] != t[k, "B"]) print k}' \
      "$samples")" ]; then
    same=no
  fi
  med_a=""
  for label in A B; do
    read -r n mn md <<<"$(col "$c" "$label" 4 | stats)"
    read -r _ _ wmd <<<"$(col "$c" "$label" 5 | stats)"
    read -r _ _ bmd <<<"$(col "$c" "$label" 7 | stats)"
    mb=$(awk -v x="$bmd" 'BEGIN {if (x == "-") printf "-"; else printf "%.1f", x / 1e6}')
    ratio="" same_col=""
    if [ "$label" = A ]; then
      med_a=$md
    elif [ "$md" != - ] && [ "$med_a" != - ]; then
      same_col=$same
      ratio=$(awk -v a="$med_a" -v b="$md" 'BEGIN {if (a > 0) printf "%.3fx", b / a; else printf "-"}')
    fi
    printf '%-11s %-3s %4s %10s %10s %8s %9s %9s %6s %7s\n' "$c" "$label" "$n" "$mn" "$md" "$unit" \
      "$wmd" "$mb" "$same_col" "$ratio"
  done
done
early=$(awk -F'\t' 'NR > 1 && $2 ~ /^decode/ && $6 != "" && $6 != 64' "$samples" | wc -l)
[ "$early" = 0 ] || echo "note: $early decode runs stopped before 64 tokens (their rate counts fewer tokens)"
echo "TTFT cases: B/A below 1 means B is faster; decode cases (tokens/s): above 1 means B is faster."
