#!/bin/sh
# test_agree.sh: `sluice inspect`, `sluice run` and `sluice mount` accept or
# refuse the same containers (issue 21): every file of the committed container
# corpus (tests/fuzz/corpus/fuzz_format/) goes through all three, and their
# verdicts must be equal. inspect: exit 0. run: exit 0 for one token of "a".
# mount: the mount succeeds and every file under it reads to the end. Run by
# ctest with $SLUICE_BIN and $SLUICE_SOURCE_DIR; exits 77 (skip) without the
# binary, and after comparing inspect with run when FUSE is not usable here.
BIN=${SLUICE_BIN:-}
SRC=${SLUICE_SOURCE_DIR:-$(dirname "$0")/../..}
CORPUS=$SRC/tests/fuzz/corpus/fuzz_format
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
    echo "SKIP: the sluice binary is not known (\$SLUICE_BIN)" >&2
    exit 77
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_agree.XXXXXX") || exit 1
MNT=$TMP/mnt
cleanup() {
    grep -qF " $MNT " /proc/self/mountinfo 2>/dev/null && "$BIN" umount --lazy "$MNT" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
mkdir "$MNT"

# FUSE: /dev/fuse, and root or fusermount3
fuse=1
why=""
if [ ! -c /dev/fuse ]; then
    fuse=0; why="no /dev/fuse"
elif [ "$(id -u)" != 0 ] && ! command -v fusermount3 >/dev/null; then
    fuse=0; why="not root and no fusermount3"
fi

verdict() { [ "$1" = 0 ] && echo accept || echo reject; }
failures=0
n=0
for f in "$CORPUS"/*; do
    [ -f "$f" ] || continue
    n=$((n + 1))
    name=$(basename "$f")
    timeout 60 "$BIN" inspect "$f" >/dev/null 2>"$TMP/inspect.err"
    i=$(verdict $?)
    timeout 60 "$BIN" run "$f" -p a -n 1 >/dev/null 2>"$TMP/run.err"
    r=$(verdict $?)
    m=$i
    if [ $fuse = 1 ]; then
        if timeout 60 "$BIN" mount "$f" "$MNT" >/dev/null 2>"$TMP/mount.err"; then
            rc=0
            # every file, read to the end (slices, tensors, the computed views)
            find "$MNT" -type f >"$TMP/files" 2>>"$TMP/mount.err" || rc=1
            while read -r g; do
                cat "$g" >/dev/null 2>>"$TMP/mount.err" || rc=1
            done <"$TMP/files"
            timeout 60 "$BIN" umount "$MNT" 2>>"$TMP/mount.err" ||
                { echo "FAIL: $name: umount failed: $(cat "$TMP/mount.err")" >&2; exit 1; }
            m=$(verdict $rc)
        else
            if grep -qiE "fuse|mount refused|permission" "$TMP/mount.err" &&
               ! grep -qF "$f" "$TMP/mount.err"; then
                echo "SKIP: sluice mount cannot mount here: $(head -1 "$TMP/mount.err")" >&2
                fuse=0; why="mount refused"
                m=$i
            else
                m=reject
            fi
        fi
    fi
    if [ "$i" != "$r" ] || [ "$i" != "$m" ]; then
        echo "FAIL: $name: inspect ${i}s, run ${r}s, mount ${m}s" >&2
        echo "  inspect: $(head -c 300 "$TMP/inspect.err")" >&2
        echo "  run:     $(head -c 300 "$TMP/run.err")" >&2
        [ $fuse = 1 ] && echo "  mount:   $(head -c 300 "$TMP/mount.err")" >&2
        failures=$((failures + 1))
    else
        echo "ok: $name: all ${i}"
    fi
done
if [ $n = 0 ]; then
    echo "FAIL: no files in $CORPUS" >&2
    exit 1
fi
if [ $failures != 0 ]; then
    echo "FAIL: $failures of $n containers got different verdicts" >&2
    exit 1
fi
if [ $fuse = 0 ]; then
    echo "SKIP: inspect and run agree on all $n containers; mount not checked ($why)" >&2
    exit 77
fi
echo "inspect, run and mount agree on all $n containers"
