#!/bin/sh
# test.sh: builds Sluice and runs every test.
#   1. release build (warnings are errors), all tests (unit + integration)
#   2. ASan+UBSan build, unit tests
#   3. every libFuzzer target for FUZZ_SECONDS (default 15) each (scripts/fuzz.sh)
#   (the NEON kernels are cross-built for aarch64 and run under qemu-user as
#   one of the tests)
# Prints each test runner's summary; exits non-zero if anything failed.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=$(nproc 2>/dev/null || echo 2)
"$ROOT/scripts/install-deps.sh" || { echo "test.sh: installing dependencies failed" >&2; exit 1; }

status=0
summary=""

run_ctest() { # name builddir ctest-args...
  name=$1; dir=$2; shift 2
  log="$dir/ctest.log"
  ctest --test-dir "$dir" --output-on-failure -j"$JOBS" "$@" 2>&1 | tee "$log"
  rc=$?
  line=$(grep -E "tests passed|tests failed" "$log" | tail -n 1)
  summary="$summary
$name: ${line:-no summary (ctest did not run)}"
  grep -q "100% tests passed" "$log" || status=1
  return $rc
}

build() { # dir cmake-args...
  dir=$1; shift
  cmake -S "$ROOT" -B "$dir" -DSLUICE_WERROR=ON "$@" >/dev/null &&
    cmake --build "$dir" -j"$JOBS"
}

echo "== release build and all tests"
if build "$ROOT/build" -DCMAKE_BUILD_TYPE=Release; then
  run_ctest "release (all tests)" "$ROOT/build" --timeout 600
else
  echo "test.sh: release build failed" >&2; status=1
  summary="$summary
release: BUILD FAILED"
fi

echo "== ASan+UBSan build, unit tests"
# -O1, as the sanitizers' documentation advises: at -O0 the SIMD kernels keep
# their accumulators in (instrumented) stack memory and test_eval alone took
# 370 s of the 382 s the unit tests took; at -O1 it takes a third of that.
if build "$ROOT/build-asan" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" \
    -DSLUICE_SANITIZE=ON; then
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    run_ctest "asan+ubsan (unit tests)" "$ROOT/build-asan" -L unit --timeout 600
else
  echo "test.sh: sanitizer build failed" >&2; status=1
  summary="$summary
asan+ubsan: BUILD FAILED"
fi

# 3. every libFuzzer target for a short bounded time, from its seeds and the
#    committed corpus (scripts/fuzz.sh; FUZZ_SECONDS per target, default 15)
echo "== fuzzing (clang libFuzzer, ASan+UBSan), ${FUZZ_SECONDS:-15}s per target"
mkdir -p "$ROOT/build-fuzz"
FUZZ_JOBS=${FUZZ_JOBS:-$JOBS} "$ROOT/scripts/fuzz.sh" "${FUZZ_SECONDS:-15}" 2>&1 |
  tee "$ROOT/build-fuzz/ci.log"
fuzz_line=$(grep -E "^fuzz.sh: " "$ROOT/build-fuzz/ci.log" | tail -n 1)
summary="$summary
fuzzing: ${fuzz_line:-fuzz.sh did not finish}"
grep -q "^fuzz.sh: no findings" "$ROOT/build-fuzz/ci.log" || status=1

echo
echo "== summary"
echo "$summary" | sed '/^$/d'
[ $status = 0 ] && echo "ALL TESTS PASSED" || echo "SOME TESTS FAILED"
exit $status
