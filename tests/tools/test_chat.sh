#!/bin/bash
# test_chat.sh: `sluice chat` with a scripted stdin, on kjv6L from ../shared
# quantized here: a greedy reply equals `sluice run`'s continuation of the
# same transcript; /reset forgets the history (the same message gets the same
# reply again); Ctrl-C (SIGINT) stops a reply and not the program, which
# answers the next message in full and exits 0 at the end of its input.
set -u
BIN=${SLUICE_BIN:-}
SHARED=${SLUICE_SHARED:-}
skip() { echo "SKIP: $*" >&2; exit 77; }
[ -n "$BIN" ] && [ -x "$BIN" ] || skip "the sluice binary is not known (\$SLUICE_BIN)"
M=$SHARED/models
[ -f "$M/kjv6L.bin" ] || skip "$M/kjv6L.bin is absent"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_chat.XXXXXX") || exit 1
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; exec 7>&- 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$BIN" import "$M/kjv6L.bin" --tokenizer "$M/kjv6L.tok1024.bin" -o "$TMP/f.sluice" >/dev/null 2>&1 &&
    "$BIN" quantize "$TMP/f.sluice" -o "$TMP/m.sluice" --bits 5 --method uniform \
        --calib "$M/kjv6L.calib.txt" >/dev/null 2>&1 || fail "cannot import and quantize kjv6L"

MSG="Tell me of the land of Egypt"
# sluice run on the transcript the chat renders: its continuation, up to the
# next turn, without the leading space
PROMPT="User: $MSG"$'\nAssistant:'
RUN=$("$BIN" run "$TMP/m.sluice" -p "$PROMPT" -n 24 2>/dev/null)
WANT=${RUN#"$PROMPT"}
WANT=${WANT%%$'\n'User:*}
WANT=${WANT# }
[ -n "$WANT" ] || fail "sluice run gave no reply: '$RUN'"
RUN=$("$BIN" run "$TMP/m.sluice" -p "$PROMPT" -n 200 2>/dev/null)
WANT200=${RUN#"$PROMPT"}
WANT200=${WANT200%%$'\n'User:*}
WANT200=${WANT200# }

# 1. scripted: a reply, a second turn (with history), /reset, the first again
printf '%s\nAnd the LORD said unto Moses\n/reset\n%s\n' "$MSG" "$MSG" |
    timeout 60 "$BIN" chat "$TMP/m.sluice" --temp 0 -n 24 >"$TMP/out" 2>"$TMP/err" ||
    fail "chat exited $?: $(cat "$TMP/err")"
[ "$(sed -n 1p "$TMP/out")" = "$WANT" ] || fail "first reply '$(sed -n 1p "$TMP/out")', want '$WANT'"
[ "$(sed -n 3p "$TMP/out")" = "$WANT" ] || fail "after /reset: '$(sed -n 3p "$TMP/out")', want '$WANT'"
[ "$(wc -l <"$TMP/out")" = 3 ] || fail "want 3 replies: $(cat "$TMP/out")"

# 2. Ctrl-C: SIGINT right after each of 10 messages, then one message left alone
mkfifo "$TMP/in"
"$BIN" chat "$TMP/m.sluice" --temp 0 -n 200 <"$TMP/in" >"$TMP/out2" 2>"$TMP/err2" &
PID=$!
exec 7>"$TMP/in"
for _ in $(seq 1 10); do
    printf '%s\n' "In the beginning God created the heaven and the earth" >&7
    sleep 0.003
    kill -INT "$PID" 2>/dev/null || fail "chat died after a SIGINT: $(cat "$TMP/err2")"
    sleep 0.2
done
kill -0 "$PID" 2>/dev/null || fail "chat is gone after the SIGINTs: $(cat "$TMP/err2")"
printf '/reset\n%s\n' "$MSG" >&7
exec 7>&-
wait "$PID"
rc=$?
PID=
[ "$rc" = 0 ] || fail "chat exited $rc after SIGINTs: $(cat "$TMP/err2")"
stopped=$(grep -o '\[stopped\]' "$TMP/err2" | wc -l)
[ "$stopped" -ge 1 ] || fail "no reply was stopped by SIGINT (stderr: $(cat "$TMP/err2"))"
[ "$(tail -1 "$TMP/out2")" = "$WANT200" ] ||
    fail "the reply after the SIGINTs: '$(tail -1 "$TMP/out2")', want '$WANT200'"
echo "chat: replies equal sluice run's; $stopped of 10 replies stopped by SIGINT, the program went on"
