#!/bin/bash
# fuzz.sh: builds Sluice's libFuzzer targets (clang, -DSLUICE_FUZZ=ON, ASan +
# UBSan) and runs each of them for SECONDS, printing per target the executions,
# the coverage (cov and ft from libFuzzer's final line) and the findings.
#
#   scripts/fuzz.sh [options] [SECONDS]        (default 60 seconds per target)
#     --build-only             build the targets and their seeds into a kit and
#                              stop: $FUZZ_BUILD_DIR/fuzz-kit/{bin,lib,seeds} and
#                              a copy of this script, everything a machine with
#                              no compiler needs (copy the folder, then run
#                              KIT/fuzz.sh --no-build KIT/bin KIT/seeds SECONDS)
#     --no-build BINDIR SEEDDIR  run the binaries BINDIR/fuzz_* (their shared
#                              libraries in BINDIR/../lib) with the seeds
#                              SEEDDIR/<target>/; builds nothing
#     --out DIR                per-target output (default $FUZZ_BUILD_DIR/fuzz-out,
#                              or ./fuzz-out with --no-build): DIR/<target>/corpus
#                              (the grown corpus: a second run with the same
#                              DIR continues the campaign), DIR/<target>/artifacts
#                              (crash-, leak-, timeout-, oom- inputs), DIR/<target>/log
#     --targets a,b,...        only these targets (names as in BINDIR)
#   Environment: FUZZ_JOBS=N targets at once (default 1); FUZZ_BUILD_DIR (default
#   build-fuzz); FUZZ_RSS_MB memory limit per target (default 2048);
#   FUZZ_TIMEOUT seconds one input may take (default 10); SLUICE_SHARED, the
#   shared models seeds are made from (default ../shared; skipped when absent);
#   SLUICE_BIN, the sluice that makes container seeds from them (default
#   build/tools/sluice, else one built in FUZZ_BUILD_DIR).
# Exit status: 0 when no target found anything, 1 when one did, 2 on a usage
# or build error.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_EACH=60
MODE=all
BINDIR=""
SEEDDIR=""
OUT=""
ONLY=""
while [ $# -gt 0 ]; do
  case $1 in
    --build-only) MODE=build ;;
    --no-build)
      [ $# -ge 3 ] || { echo "fuzz.sh: --no-build needs BINDIR and SEEDDIR" >&2; exit 2; }
      MODE=run; BINDIR=$2; SEEDDIR=$3; shift 2 ;;
    --out) [ $# -ge 2 ] || { echo "fuzz.sh: --out needs a folder" >&2; exit 2; }
      OUT=$2; shift ;;
    --targets) [ $# -ge 2 ] || { echo "fuzz.sh: --targets needs a list" >&2; exit 2; }
      ONLY=$(echo "$2" | tr ',' ' '); shift ;;
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$1'" >&2; exit 2 ;;
    *) case $1 in
         ''|*[!0-9]*) echo "fuzz.sh: SECONDS wants a whole number, not '$1'" >&2; exit 2 ;;
       esac
       SECONDS_EACH=$1 ;;
  esac
  shift
done
JOBS=${FUZZ_JOBS:-1}
case $JOBS in ''|*[!0-9]*|0) echo "fuzz.sh: FUZZ_JOBS wants a whole number >= 1" >&2; exit 2 ;; esac
RSS=${FUZZ_RSS_MB:-2048}
TIMEOUT=${FUZZ_TIMEOUT:-10}
BUILD=${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
SHARED=${SLUICE_SHARED:-$ROOT/../shared}

# ---- build -------------------------------------------------------------------------
# The targets and, for the seeds, their ctest replay drivers and the sluice tool.
TARGETS="fuzz_format fuzz_import fuzz_unpack fuzz_gguf fuzz_llama2c fuzz_tokenizer
fuzz_safetensors fuzz_hfconfig fuzz_mountopt fuzz_text fuzz_serve_req"

build_kit() {
  command -v clang >/dev/null &&
    [ -n "$(find /usr/lib/llvm-*/lib/clang -name 'libclang_rt.fuzzer-*.a' 2>/dev/null | head -1)" ] || {
    echo "fuzz.sh: needs clang and its libFuzzer runtime (scripts/install-deps.sh installs" \
         "clang and libclang-rt-14-dev)" >&2
    return 2
  }
  drivers=""
  for t in $TARGETS; do
    case $t in
      fuzz_format) drivers="$drivers fuzz_format_replay" ;;
      fuzz_import|fuzz_unpack|fuzz_serve_req) drivers="$drivers ${t}_replay" ;;
      *) drivers="$drivers ${t}_corpus" ;;
    esac
  done
  # the sluice tool makes container seeds from the shared models: $SLUICE_BIN,
  # else the release build's, else built here (only when the models are there)
  SL=${SLUICE_BIN:-$ROOT/build/tools/sluice}
  extra=""
  if [ ! -x "$SL" ]; then
    SL=$BUILD/tools/sluice
    [ -d "$SHARED/models" ] && extra=sluice
  fi
  echo "== building the fuzz targets in $BUILD (clang, ASan+UBSan, libFuzzer)"
  mkdir -p "$BUILD"
  CC=clang cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_FUZZ=ON \
    -DSLUICE_SANITIZE=ON -DSLUICE_WERROR=OFF >"$BUILD/fuzz-cmake.log" 2>&1 || {
    cat "$BUILD/fuzz-cmake.log" >&2; echo "fuzz.sh: cmake failed" >&2; return 2; }
  # shellcheck disable=SC2086
  cmake --build "$BUILD" -j"$(nproc 2>/dev/null || echo 2)" --target $TARGETS $drivers $extra ||
    { echo "fuzz.sh: build failed" >&2; return 2; }
  KIT=$BUILD/fuzz-kit
  rm -rf "$KIT"
  mkdir -p "$KIT/bin" "$KIT/lib" "$KIT/seeds"
  for t in $TARGETS; do
    f=$(find "$BUILD/tests" -type f -name "$t" -perm -u+x | head -1)
    [ -n "$f" ] || { echo "fuzz.sh: $t was not built" >&2; return 2; }
    cp "$f" "$KIT/bin/"
  done
  # the shared libraries the targets need beyond libc's (the kit's machine may lack them)
  for f in "$KIT"/bin/*; do ldd "$f"; done | awk '/=> \//{print $3}' | sort -u |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|libgcc_s|ld-linux[^/]*)\.so' |
    while read -r so; do cp -L "$so" "$KIT/lib/"; done
  cp "$ROOT/scripts/fuzz.sh" "$KIT/fuzz.sh"
  make_seeds "$KIT/seeds" || return 2
  echo "== kit: $KIT ($(ls "$KIT/bin" | wc -l) targets, $(ls "$KIT/lib" | wc -l) libraries)"
}

# Seeds: each target's built-in seeds, the committed corpus, and inputs made
# from the real models in $SHARED when it is there.
make_seeds() {
  S=$1
  export ASAN_OPTIONS=detect_leaks=0
  d=$BUILD/tests
  for t in $TARGETS; do mkdir -p "$S/$t"; done
  "$d/fuzz/fuzz_format_replay" --write-seed "$S/fuzz_format/writer.sluice" &&
    "$d/import/fuzz_import_replay" --write-seeds "$S/fuzz_import" &&
    "$d/unpack/fuzz_unpack_replay" --write-seeds "$S/fuzz_unpack" &&
    "$d/tools/fuzz_serve_req_replay" --write-seeds "$S/fuzz_serve_req" || return 1
  for t in fuzz_gguf fuzz_llama2c fuzz_tokenizer fuzz_safetensors fuzz_hfconfig fuzz_mountopt \
           fuzz_text; do
    "$d/fuzz/${t}_corpus" --write-seeds "$S/$t" || return 1
  done
  for t in $TARGETS; do
    [ -d "$ROOT/tests/fuzz/corpus/$t" ] && cp "$ROOT/tests/fuzz/corpus/$t"/* "$S/$t/" 2>/dev/null
  done
  M=$SHARED/models
  if [ ! -d "$M" ]; then
    echo "fuzz.sh: $M is absent: seeds from the real models skipped"
    return 0
  fi
  sl=$SL
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/sluice-seeds.XXXXXX")
  kind() { # kind-byte file out: the all-kinds importer's input
    { printf "\\$(printf %03o "$1")"; cat "$2"; } >"$3"
  }
  cp "$M/aidreams260K.bin" "$S/fuzz_llama2c/aidreams260K.bin"
  cp "$M/aidreams260K.tok512.bin" "$M/kjv6L.tok1024.bin" "$S/fuzz_tokenizer/"
  cp "$M/aidreams260K.gguf" "$S/fuzz_gguf/"
  cp "$M/kjv6L-hf/config.json" "$S/fuzz_hfconfig/kjv6L-config.json"
  for f in aidreams260K kjv6L; do # 4 KB of each calibration text: short inputs fuzz faster
    head -c 4096 "$M/$f.calib.txt" >"$S/fuzz_text/$f.calib.txt"
  done
  st=$M/kjv6L-hf/model.safetensors
  if [ -f "$st" ]; then # its header only (the file is large)
    hl=$(od -An -t u8 -N 8 "$st" | tr -d ' ')
    head -c $((8 + hl)) "$st" >"$S/fuzz_safetensors/kjv6L-header.safetensors"
  fi
  kind 0 "$M/aidreams260K.gguf" "$S/fuzz_import/shared-gguf"
  kind 1 "$M/aidreams260K.bin" "$S/fuzz_import/shared-llama2c"
  kind 2 "$M/aidreams260K.tok512.bin" "$S/fuzz_import/shared-tok"
  kind 4 "$M/kjv6L-hf/config.json" "$S/fuzz_import/shared-config"
  if [ -x "$sl" ] && "$sl" import "$M/aidreams260K.bin" --tokenizer "$M/aidreams260K.tok512.bin" \
       -o "$tmp/f.sluice" >/dev/null 2>&1; then
    cp "$tmp/f.sluice" "$S/fuzz_format/aidreams-f32.sluice"
    for enc in adaptive int4int8 bitplane; do
      "$sl" quantize "$tmp/f.sluice" -o "$tmp/q.sluice" --bits 4 --method uniform \
        --encoding $enc >/dev/null 2>&1 && cp "$tmp/q.sluice" "$S/fuzz_format/aidreams-$enc.sluice"
    done
  else
    echo "fuzz.sh: could not make container seeds from $M (sluice import failed)" >&2
  fi
  rm -rf "$tmp"
  echo "== seeds: $S ($(find "$S" -type f | wc -l) files)"
}

if [ "$MODE" != run ]; then
  build_kit || exit 2
  [ "$MODE" = build ] && exit 0
  BINDIR=$BUILD/fuzz-kit/bin
  SEEDDIR=$BUILD/fuzz-kit/seeds
  [ -n "$OUT" ] || OUT=$BUILD/fuzz-out
fi
[ -n "$OUT" ] || OUT=$(pwd)/fuzz-out

# ---- run ---------------------------------------------------------------------------
[ -d "$BINDIR" ] || { echo "fuzz.sh: no folder $BINDIR" >&2; exit 2; }
LIBDIR=$(cd "$BINDIR/.." && pwd)/lib
list=""
for f in "$BINDIR"/fuzz_*; do
  t=$(basename "$f")
  [ -x "$f" ] || continue
  if [ -n "$ONLY" ]; then
    case " $ONLY " in *" $t "*) ;; *) continue ;; esac
  fi
  list="$list $t"
done
[ -n "$list" ] || { echo "fuzz.sh: no fuzz_* targets in $BINDIR" >&2; exit 2; }

run_one() { # target
  t=$1
  o=$OUT/$t
  mkdir -p "$o/corpus" "$o/artifacts"
  seeds=""
  [ -d "$SEEDDIR/$t" ] && seeds="$SEEDDIR/$t"
  # the grown corpus first: libFuzzer writes new inputs into the first folder
  # shellcheck disable=SC2086
  LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    timeout $((SECONDS_EACH + 120)) "$BINDIR/$t" -max_total_time="$SECONDS_EACH" \
      -print_final_stats=1 -timeout="$TIMEOUT" -rss_limit_mb="$RSS" \
      -artifact_prefix="$o/artifacts/" "$o/corpus" $seeds >"$o/log" 2>&1
  echo $? >"$o/rc"
}

summarize() { # target
  t=$1
  o=$OUT/$t
  rc=$(cat "$o/rc" 2>/dev/null || echo "?")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$o/log" | tail -1)
  last=$(grep -E '^#[0-9]+.* cov: ' "$o/log" | tail -1)
  cov=$(echo "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
  ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
  corp=$(ls "$o/corpus" | wc -l)
  finds=$(ls "$o/artifacts" | wc -l)
  printf "%-18s %8s %12s %8s %8s %8s %9s %s\n" "$t" "$SECONDS_EACH" "${execs:-?}" "${cov:-?}" \
    "${ft:-?}" "$corp" "$finds" "$([ "$rc" = 0 ] && echo ok || echo "rc $rc: see $o/log")"
  [ "$rc" = 0 ] && [ "$finds" = 0 ]
}

echo "== fuzzing$list for ${SECONDS_EACH}s each, $JOBS at a time, output in $OUT"
mkdir -p "$OUT"
running=0
for t in $list; do
  run_one "$t" &
  running=$((running + 1))
  if [ $running -ge "$JOBS" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait
status=0
printf "%-18s %8s %12s %8s %8s %8s %9s %s\n" target seconds executions cov ft corpus findings status
for t in $list; do
  summarize "$t" || status=1
done
for t in $list; do
  for a in "$OUT/$t"/artifacts/*; do
    [ -e "$a" ] && echo "finding: $a (replay: $t $a; details in $OUT/$t/log)"
  done
done
[ $status = 0 ] && echo "fuzz.sh: no findings" || echo "fuzz.sh: FINDINGS (see above)"
exit $status
