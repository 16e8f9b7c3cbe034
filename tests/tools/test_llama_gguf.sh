#!/bin/sh
# test_llama_gguf.sh: unmodified llama.cpp runs a Sluice model (issue 20).
# The real kjv6L model from ../shared (else a synthetic tiny one) is quantized
# at 8 bits, exported with `sluice export --gguf` (Q8_0, and F16), and served
# by `sluice mount` as MOUNT/model.gguf; llama.cpp's llama-simple must load
# every one and its greedy text on the mount must equal its text on the
# exported file (and, for kjv6L, read as English: the first words are fixed).
#
# llama.cpp is found in $SLUICE_LLAMA_CPP_BIN (the directory holding
# llama-simple), else ../peers/llama.cpp/build/bin beside the source tree, else
# on $PATH; without it the test is skipped (exit 77) with a message saying so.
# Without FUSE (no /dev/fuse, not root) only the exported files are checked.
# With llama-quantize beside llama-simple, K-quant files it makes are imported
# and Sluice's greedy text on them must equal llama.cpp's.

BIN=${SLUICE_BIN:-}
SRC=${SLUICE_SOURCE_DIR:-$(dirname "$0")/../..}
SHARED=${SLUICE_SHARED:-$SRC/../shared}
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
    echo "SKIP: the sluice binary is not known (\$SLUICE_BIN)" >&2
    exit 77
fi
LLAMA=${SLUICE_LLAMA_CPP_BIN:-}
if [ -z "$LLAMA" ]; then
    if [ -x "$SRC/../peers/llama.cpp/build/bin/llama-simple" ]; then
        LLAMA=$SRC/../peers/llama.cpp/build/bin
    elif command -v llama-simple >/dev/null 2>&1; then
        LLAMA=$(dirname "$(command -v llama-simple)")
    fi
fi
if [ -z "$LLAMA" ] || [ ! -x "$LLAMA/llama-simple" ]; then
    echo "SKIP: llama.cpp's llama-simple not found: set SLUICE_LLAMA_CPP_BIN to the directory" \
         "holding it (a llama.cpp build's bin/), or put it on PATH" >&2
    exit 77
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_llama_gguf.XXXXXX") || exit 1
MNT=$TMP/mnt
trap '"$BIN" umount --lazy "$MNT" 2>/dev/null; rm -rf "$TMP"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}

if [ -f "$SHARED/models/kjv6L.bin" ]; then
    "$BIN" import "$SHARED/models/kjv6L.bin" --tokenizer "$SHARED/models/kjv6L.tok1024.bin" \
        -o "$TMP/f.sluice" 2>"$TMP/log" || fail "import: $(cat "$TMP/log")"
    PROMPT="In the beginning"
    EXPECT="In the beginning of the creation of the children of Israel"
else
    echo "note: ../shared/models/kjv6L.bin is absent: a synthetic tiny model instead" >&2
    "$BIN" synth --shape tiny -o "$TMP/f.sluice" 2>"$TMP/log" || fail "synth: $(cat "$TMP/log")"
    PROMPT="hello"
    EXPECT=""
fi
"$BIN" quantize "$TMP/f.sluice" -o "$TMP/q8.sluice" --bits 8 --method uniform --act dynamic \
    >/dev/null 2>"$TMP/log" || fail "quantize: $(cat "$TMP/log")"

# llama-simple's greedy text (stdout) for a GGUF file
gen() {
    "$LLAMA/llama-simple" -m "$1" -n 24 "$PROMPT" >"$2" 2>"$TMP/llama.log" ||
        fail "llama-simple on $1: $(tail -5 "$TMP/llama.log")"
    [ -s "$2" ] || fail "llama-simple on $1 printed nothing"
}

for type in q8_0 f16; do
    "$BIN" export --gguf "$TMP/$type.gguf" --type "$type" "$TMP/q8.sluice" 2>"$TMP/log" ||
        fail "export --type $type: $(cat "$TMP/log")"
    gen "$TMP/$type.gguf" "$TMP/$type.file.txt"
    if [ -n "$EXPECT" ] && ! grep -q "$EXPECT" "$TMP/$type.file.txt"; then
        fail "llama.cpp on the $type export wrote '$(cat "$TMP/$type.file.txt")'," \
             "expected it to start '$EXPECT'"
    fi
done

# K-quants the other way: llama.cpp's llama-quantize (when built) makes Q4_K_M
# and Q6_K files from the float export; `sluice import` dequantizes them and
# Sluice's greedy text must equal llama.cpp's on the same file (kjv6L only:
# random weights have near ties that the two implementations may break apart).
if [ -n "$EXPECT" ] && [ -x "$LLAMA/llama-quantize" ]; then
    "$BIN" export --gguf "$TMP/f32.gguf" "$TMP/f.sluice" 2>"$TMP/log" || fail "export f32: $(cat "$TMP/log")"
    for k in Q4_K_M Q6_K; do
        "$LLAMA/llama-quantize" "$TMP/f32.gguf" "$TMP/$k.gguf" "$k" >"$TMP/log" 2>&1 ||
            fail "llama-quantize $k: $(tail -3 "$TMP/log")"
        "$BIN" import "$TMP/$k.gguf" -o "$TMP/$k.sluice" 2>"$TMP/log" || fail "import $k: $(cat "$TMP/log")"
        gen "$TMP/$k.gguf" "$TMP/$k.llama.txt"
        "$BIN" run "$TMP/$k.sluice" -p "$PROMPT" -n 24 >"$TMP/$k.sluice.txt" 2>"$TMP/log" ||
            fail "sluice run $k: $(cat "$TMP/log")"
        a=$(sed 's/^<s> //' "$TMP/$k.llama.txt" | tr -d '\n')
        b=$(tr -d '\n' <"$TMP/$k.sluice.txt")
        [ "$a" = "$b" ] || fail "$k: llama.cpp wrote '$a', sluice on the imported file '$b'"
    done
else
    echo "note: llama-quantize not found (or no kjv6L): the K-quant import is not checked here" >&2
fi

if [ ! -e /dev/fuse ] || [ "$(id -u)" != 0 ] || ! command -v fusermount3 >/dev/null; then
    echo "note: no FUSE here (needs /dev/fuse, root and fusermount3): the mount is not checked" >&2
    exit 0
fi
mkdir -p "$MNT"
for type in q8_0 f16; do
    "$BIN" mount -o "gguf=$type" "$TMP/q8.sluice" "$MNT" 2>"$TMP/log" ||
        fail "mount -o gguf=$type: $(cat "$TMP/log")"
    cmp -s "$MNT/model.gguf" "$TMP/$type.gguf" || fail "MOUNT/model.gguf ($type) differs from the export"
    gen "$MNT/model.gguf" "$TMP/$type.mount.txt"
    "$BIN" umount "$MNT" 2>"$TMP/log" || fail "umount: $(cat "$TMP/log")"
    cmp -s "$TMP/$type.mount.txt" "$TMP/$type.file.txt" ||
        fail "llama.cpp's text on the mount ($type): '$(cat "$TMP/$type.mount.txt")'" \
             "differs from its text on the exported file: '$(cat "$TMP/$type.file.txt")'"
done
echo "llama.cpp on MOUNT/model.gguf: $(cat "$TMP/q8_0.mount.txt")"
exit 0
