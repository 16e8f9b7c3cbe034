#!/bin/sh
# test-neon.sh: cross-compiles the NEON unpackers with their scalar reference
# for aarch64 and runs the bit-exactness test under qemu-user.
# Exit 0 pass, 1 fail, 77 when the cross compiler or qemu is missing.
set -u
cd "$(dirname "$0")/.."
CC=${AARCH64_CC:-aarch64-linux-gnu-gcc}
QEMU=${QEMU_AARCH64:-qemu-aarch64}
command -v "$CC" >/dev/null 2>&1 || { echo "test-neon: $CC not installed (gcc-aarch64-linux-gnu)"; exit 77; }
command -v "$QEMU" >/dev/null 2>&1 || { echo "test-neon: $QEMU not installed (qemu-user)"; exit 77; }
OUT=${TMPDIR:-/tmp}/sluice-neon.$$
mkdir -p "$OUT"
trap 'rm -rf "$OUT"' EXIT
"$CC" -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE \
  -Iunpack -Iunpack/include -Iformat/include -Icommon/include \
  unpack/unpack_scalar.c unpack/unpack_neon.c tests/unpack/test_unpack_neon.c \
  format/format_enc_packed.c common/common.c -Iformat -lm \
  -o "$OUT/test_unpack_neon" || { echo "test-neon: cross build failed"; exit 1; }
"$QEMU" -L /usr/aarch64-linux-gnu "$OUT/test_unpack_neon"
