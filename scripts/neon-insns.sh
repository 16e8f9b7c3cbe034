#!/bin/sh
# neon-insns.sh: instructions per weight of the NEON unpack kernels, counted
# under qemu-user (no ARM hardware is needed, and none gives timings here:
# these are instruction counts, not speed). For each encoding (adaptive,
# bitplane, int4int8) and width 1..8 it cross-builds tools/neon/neon_insns.c
# with unpack_neon.c (static, aarch64), runs it under qemu-aarch64 with one
# instruction per translation block and execution logging restricted to the
# address range of unpack_neon.c's functions (from the symbol table), once
# with 1 and once with 3 passes over 16 rows of 4096 weights, and divides the
# difference by the weights of two passes.
#
#   scripts/neon-insns.sh [--mix N1,N2,...,N8]
#
# --mix gives a channel count per width 1..8 (as `sluice bench unpack` prints
# them per bit mix) and adds the mix's average per encoding.
# Needs gcc-aarch64-linux-gnu and qemu-user (scripts/install-deps.sh).
set -eu
cd "$(dirname "$0")/.."
CC=${AARCH64_CC:-aarch64-linux-gnu-gcc}
QEMU=${QEMU_AARCH64:-qemu-aarch64}
MIX=""
while [ $# -gt 0 ]; do
  case "$1" in
    --mix) [ $# -ge 2 ] || { echo "neon-insns: --mix needs 8 counts" >&2; exit 2; }; MIX=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "neon-insns: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [ -n "$MIX" ] && [ "$(echo "$MIX" | tr ',' '\n' | grep -c '^[0-9][0-9]*$')" != 8 ]; then
  echo "neon-insns: --mix needs 8 comma-separated counts (widths 1..8), got '$MIX'" >&2; exit 2
fi
for tool in "$CC" "$QEMU" aarch64-linux-gnu-readelf; do
  command -v "$tool" >/dev/null 2>&1 || { echo "neon-insns: $tool is not installed" >&2; exit 1; }
done
OUT=$(mktemp -d "${TMPDIR:-/tmp}/sluice-neon-insns.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
"$CC" -std=c11 -O2 -static -D_GNU_SOURCE -DSLUICE_KERNELS_ARM64=1 -Iunpack -Iunpack/include \
  -Iformat/include -Icommon/include unpack/unpack_neon.c unpack/unpack_scalar.c \
  tools/neon/neon_insns.c -o "$OUT/neon_insns"
# unpack_neon.c's functions: the FUNC symbols after its FILE symbol
MIN=""; MAX=0
for sym in $(aarch64-linux-gnu-readelf -sW "$OUT/neon_insns" | awk '
    $4 == "FILE" { in_neon = ($8 == "unpack_neon.c") }
    in_neon && $4 == "FUNC" && $3 > 0 { print $2 ":" $3 }'); do
  lo=$((0x${sym%%:*})); hi=$((lo + ${sym##*:}))
  if [ -z "$MIN" ] || [ "$lo" -lt "$MIN" ]; then MIN=$lo; fi
  if [ "$hi" -gt "$MAX" ]; then MAX=$hi; fi
done
RANGE=""
[ -z "$MIN" ] || RANGE=$(printf "0x%x..0x%x" "$MIN" $((MAX - 1)))
[ -n "$RANGE" ] || { echo "neon-insns: no functions of unpack_neon.c in the symbol table" >&2; exit 1; }
ONE=-singlestep # renamed -one-insn-per-tb in qemu 8.1
"$QEMU" -h 2>/dev/null | grep -q -- -one-insn-per-tb && ONE=-one-insn-per-tb
count() { # encoding width reps
  "$QEMU" $ONE -d exec,nochain -dfilter "$RANGE" -D "$OUT/log" \
    "$OUT/neon_insns" "$1" "$2" 16 "$3" >/dev/null
  grep -c '^Trace' "$OUT/log"
}
echo "instructions per weight, NEON kernels (qemu-aarch64 count in $RANGE, 4096-weight rows)"
printf "%-6s %9s %9s %9s\n" width adaptive bitplane int4int8
RES=""
for b in 1 2 3 4 5 6 7 8; do
  line="$b"
  for e in adaptive bitplane int4int8; do
    one=$(count $e $b 1); three=$(count $e $b 3)
    line="$line $(awk -v a="$one" -v c="$three" 'BEGIN { printf "%.4f", (c - a) / 2 / (16 * 4096) }')"
  done
  RES="$RES$line
"
  echo "$line" | awk '{ printf "%-6s %9s %9s %9s\n", $1, $2, $3, $4 }'
done
if [ -n "$MIX" ]; then
  printf "%s" "$RES" | awk -v mix="$MIX" '
    BEGIN { n = split(mix, m, ",") }
    { for (e = 2; e <= 4; e++) s[e] += m[$1] * $e; t += m[$1] }
    END { printf "mix %s: adaptive %.3f, bitplane %.3f, int4int8 %.3f per weight; bitplane / adaptive %.2fx\n",
                 mix, s[2] / t, s[3] / t, s[4] / t, s[3] / s[2] }'
fi
