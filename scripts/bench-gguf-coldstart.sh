#!/bin/sh
# bench-gguf-coldstart.sh: cold start of llama.cpp on a GGUF file exported by
# `sluice export --gguf` against the same model read through `sluice mount`
# (MOUNT/model.gguf), each run on emulated flash (../shared/tools/flashrun:
# page cache dropped, reads limited to MBPS in a cgroup). The FUSE daemon is
# started inside the limited cgroup, so its container reads are throttled
# like llama.cpp's own reads of the exported file. Runs are interleaved
# (file, mount, file, mount, ...). Prints one line per run: the contender,
# the wall time of llama-simple (load + prompt + N tokens) in seconds, and
# llama.cpp's own "load time". The mount is made before the clock starts
# (a mount that is already there); the daemon does no model work before
# llama.cpp opens model.gguf.
#
#   scripts/bench-gguf-coldstart.sh MODEL.sluice EXPORTED.gguf LLAMA_BIN_DIR \
#       [RUNS] [MBPS] [N_PREDICT]
# Needs root (flashrun). Defaults: 5 runs, 800 MB/s, 1 token.
# VARIANTS="LABEL:SLUICE_BINARY:MOUNT_OPTIONS ..." (environment) replaces the
# one mount contender with several, each run in turn after the file (to
# compare builds or -o options side by side); an empty MOUNT_OPTIONS is none.
set -eu
model=$1 gguf=$2 llama=$3 runs=${4:-5} mbps=${5:-800} n=${6:-1}
here=$(cd "$(dirname "$0")/.." && pwd)
sluice=${SLUICE_BIN:-$here/build/tools/sluice}
flashrun=${FLASHRUN:-$here/../shared/tools/flashrun}
work=$(mktemp -d)
mnt=$work/mnt
mkdir -p "$mnt"
trap '"$sluice" umount --lazy "$mnt" 2>/dev/null || true; rm -rf "$work"' EXIT

now() { date +%s.%N; }

run_file() {
  "$flashrun" -m "$mbps" -f "$gguf" -- sh -c '
    t0=$(date +%s.%N)
    "$1/llama-simple" -m "$2" -n "$3" "In the beginning" >/dev/null 2>"$4/err" || exit 1
    t1=$(date +%s.%N)
    echo "$t0 $t1"' sh "$llama" "$gguf" "$n" "$work"
}

run_mount() { # BINARY OPTIONS
  "$flashrun" -m "$mbps" -f "$model" -- sh -c '
    "$5" mount "$6" "$4/mnt" ${7:+-o "$7"} || exit 1
    t0=$(date +%s.%N)
    "$1/llama-simple" -m "$4/mnt/model.gguf" -n "$3" "In the beginning" >/dev/null 2>"$4/err" || exit 1
    t1=$(date +%s.%N)
    "$5" umount "$4/mnt"
    echo "$t0 $t1"' sh "$llama" "$gguf" "$n" "$work" "$1" "$model" "$2"
}

report() {
  load=$(grep -o 'load time = *[0-9.]* ms' "$work/err" | grep -o '[0-9.]* ms' || echo "?")
  echo "$2" | awk -v w="$1" -v l="$load" '{printf "%s %.3f load %s\n", w, $2 - $1, l}'
}

variants=${VARIANTS:-"mount:$sluice:"}
i=0
while [ "$i" -lt "$runs" ]; do
  report file "$(run_file)"
  for v in $variants; do
    label=${v%%:*} rest=${v#*:}
    report "$label" "$(run_mount "${rest%%:*}" "${rest#*:}")"
  done
  i=$((i + 1))
done
