#!/bin/sh
# demo.sh: the main job on a built-in default. Builds Sluice, makes a model
# (the real kjv6L model from ../shared when present, else a synthetic one),
# quantizes it with EdgeFlow adaptive 5-bit, and runs a cold start: the page
# cache is dropped (when root) and the model streams from storage into the
# pipeline, printing text and time to first token.
#   ./scripts/demo.sh ["PROMPT"]
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PROMPT=${1:-"In the beginning"}
"$ROOT/scripts/install-deps.sh"
cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$ROOT/build" -j"$(nproc)" --target sluice >/dev/null
S="$ROOT/build/tools/sluice"
OUT="$ROOT/out"
mkdir -p "$OUT"
SHARED="${SLUICE_SHARED:-$ROOT/../shared}"
if [ -f "$SHARED/models/kjv6L.bin" ]; then
  echo "demo: importing the real kjv6L model from $SHARED/models" >&2
  "$S" import "$SHARED/models/kjv6L.bin" --tokenizer "$SHARED/models/kjv6L.tok1024.bin" -o "$OUT/kjv6L.sluice"
  SRC="$OUT/kjv6L.sluice"; CALIB="--calib $SHARED/models/kjv6L.calib.txt"
else
  echo "demo: ../shared not found; synthesizing a small model" >&2
  "$S" synth --shape tiny -o "$OUT/tiny.sluice"
  SRC="$OUT/tiny.sluice"; CALIB=""
fi
# shellcheck disable=SC2086
"$S" quantize "$SRC" -o "$OUT/demo-q5.sluice" --bits 5 $CALIB
"$S" inspect "$OUT/demo-q5.sluice" --no-verify | tail -n 1
if [ "$(id -u)" = 0 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi
"$S" run "$OUT/demo-q5.sluice" -p "$PROMPT" -n 64
