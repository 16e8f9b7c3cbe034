#!/bin/sh
# test-neon.sh: cross-compiles the unpack module (scalar and NEON kernels,
# dispatch), the packer and the format/common code it needs for aarch64 with
# gcc-aarch64-linux-gnu, and runs tests/unpack/test_unpack_neon.c under
# qemu-user (qemu-aarch64 -L /usr/aarch64-linux-gnu). The test is a plain C
# program (no cmocka: arm64 cmocka is usually not installable next to amd64).
# Exit 0 pass, 1 fail, 77 (skip) when the cross compiler or qemu is missing.
# ctest runs it as test_unpack_neon. SLUICE_TEST_SEED=<n> replays a seed.
set -u
cd "$(dirname "$0")/.."
CC=${AARCH64_CC:-aarch64-linux-gnu-gcc}
QEMU=${QEMU_AARCH64:-qemu-aarch64}
command -v "$CC" >/dev/null 2>&1 || {
  echo "SKIP: test-neon: $CC not installed (apt-get install gcc-aarch64-linux-gnu)"; exit 77; }
command -v "$QEMU" >/dev/null 2>&1 || {
  echo "SKIP: test-neon: $QEMU not installed (apt-get install qemu-user)"; exit 77; }
[ -d /usr/aarch64-linux-gnu/lib ] || {
  echo "SKIP: test-neon: no aarch64 C library in /usr/aarch64-linux-gnu"; exit 77; }
OUT=$(mktemp -d "${TMPDIR:-/tmp}/sluice-neon.XXXXXX") || exit 1
trap 'rm -rf "$OUT"' EXIT
"$CC" -std=c11 -O2 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-declarations \
  -Wno-unused-parameter -Werror -D_GNU_SOURCE -DSLUICE_KERNELS_ARM64=1 \
  -Iunpack -Iunpack/include -Iformat -Iformat/include -Icommon/include -Iquantizer/include \
  unpack/unpack.c unpack/unpack_scalar.c unpack/unpack_neon.c format/format_enc_packed.c \
  quantizer/quantizer_pack.c common/common.c common/common_cpu.c \
  tests/unpack/test_unpack_neon.c -lm -lpthread \
  -o "$OUT/test_unpack_neon" || { echo "test-neon: cross build failed"; exit 1; }
"$QEMU" -L /usr/aarch64-linux-gnu "$OUT/test_unpack_neon"
