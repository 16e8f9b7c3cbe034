#!/bin/bash
# test_spec_serve.sh: `--spec auto` on `sluice serve` and `sluice chat`, on
# kjv6L-1k (float) and kjv6L (5-bit, static activation scales) from
# ../shared: greedy answers equal those of a server with --spec off, token
# for token (completions, JSON and streamed; two requests at once on a
# batching server, one on a --no-batch server), drafts were accepted on the
# context-heavy prompts, the answer's "sluice"."spec" and the server's log
# carry the statistics; chat's replies with --spec auto -v equal --spec off's
# and -v prints the statistics. Skips (77) without ../shared's models, node
# (JSON) or curl.
set -u
BIN=${SLUICE_BIN:-}
SHARED=${SLUICE_SHARED:-}
skip() { echo "SKIP: $*" >&2; exit 77; }
[ -n "$BIN" ] && [ -x "$BIN" ] || skip "the sluice binary is not known (\$SLUICE_BIN)"
M=$SHARED/models
[ -f "$M/kjv6L-1k.bin" ] && [ -f "$M/kjv6L.bin" ] || skip "kjv6L-1k.bin or kjv6L.bin is absent in $M"
command -v node >/dev/null || skip "node is not installed (JSON)"
command -v curl >/dev/null || skip "curl is not installed"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_spec_serve.XXXXXX") || exit 1
PIDS=""
cleanup() { for p in $PIDS; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$BIN" import "$M/kjv6L-1k.bin" --tokenizer "$M/kjv6L-1k.tok1024.bin" -o "$TMP/k1.sluice" \
    >/dev/null 2>&1 || fail "cannot import kjv6L-1k"
"$BIN" import "$M/kjv6L.bin" --tokenizer "$M/kjv6L.tok1024.bin" -o "$TMP/f.sluice" >/dev/null 2>&1 &&
    "$BIN" quantize "$TMP/f.sluice" -o "$TMP/q5.sluice" --bits 5 --method uniform \
        --calib "$M/kjv6L.calib.txt" >/dev/null 2>&1 || fail "cannot import and quantize kjv6L"

PORT=
start() { # NAME MODEL ARGS...: a server; its port in $PORT
    local name=$1 model=$2
    shift 2
    "$BIN" serve "$model" --port 0 --model-id m "$@" </dev/null >/dev/null 2>"$TMP/$name.log" &
    PIDS="$PIDS $!"
    PORT=
    for _ in $(seq 1 300); do
        PORT=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$TMP/$name.log" | sed 's/.*://')
        [ -n "$PORT" ] && return 0
        sleep 0.05
    done
    fail "server $name did not start: $(cat "$TMP/$name.log")"
}
# a completion's JSON body for a prompt (read from a file)
body() { # PROMPT_FILE [stream]
    node -e 'const fs=require("fs");process.stdout.write(JSON.stringify({model:"m",
        prompt:fs.readFileSync(process.argv[1],"utf8"),max_tokens:60,temperature:0,
        stream:process.argv[2]==="stream"}))' "$@"
}
field() { # FILE EXPR: a value of the JSON answer in FILE (j is the answer)
    node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8"));
        const v=eval(process.argv[2]);process.stdout.write(String(v))' "$1" "$2"
}
sse_text() { # FILE: the last chunk's sluice.spec.drafted, the streamed text
    node -e 'const ls=require("fs").readFileSync(process.argv[1],"utf8").split("\n");
        let t="",d="none";for(const l of ls){if(!l.startsWith("data: {"))continue;
        const j=JSON.parse(l.slice(6));if(j.choices&&j.choices[0])t+=j.choices[0].text||"";
        if(j.sluice&&j.sluice.spec)d=j.sluice.spec.drafted}
        process.stdout.write(d+" "+JSON.stringify(t))' "$1"
}

# prompts: a passage of Psalms then its opening again (context-heavy), one
# from its middle, and a free one
CAL=$M/kjv6L.calib.txt
{ sed -n 1,3p "$CAL" | tr '\n' ' '; printf 'Blessed is the man'; } >"$TMP/p1"
{ sed -n 11,13p "$CAL" | tr '\n' ' '; sed -n 11p "$CAL" | cut -d' ' -f1-5 | tr -d '\n'; } >"$TMP/p2"
printf 'And God said' >"$TMP/p3"

for model in k1 q5; do
    start "$model-off" "$TMP/$model.sluice" --parallel 2 --spec off
    P_OFF=$PORT
    start "$model-auto" "$TMP/$model.sluice" --parallel 2 --spec auto --spec-rows 8
    P_AUTO=$PORT
    start "$model-nobatch" "$TMP/$model.sluice" --parallel 2 --no-batch --spec auto --spec-rows 16
    P_NB=$PORT
    accepted=0
    for p in p1 p2 p3; do
        body "$TMP/$p" >"$TMP/body"
        url=/v1/completions
        cpids=""
        for f in off:$P_OFF a1:$P_AUTO a2:$P_AUTO nb:$P_NB; do
            curl -s -m 60 "http://127.0.0.1:${f#*:}$url" -d @"$TMP/body" >"$TMP/${f%%:*}.json" &
            cpids="$cpids $!"
        done
        # shellcheck disable=SC2086 # the clients' ids
        wait $cpids
        want=$(field "$TMP/off.json" 'JSON.stringify(j.choices[0].text)')
        [ -n "$want" ] && [ "$want" != '""' ] || fail "$model $p: no text: $(cat "$TMP/off.json")"
        [ "$(field "$TMP/off.json" 'j.sluice.spec === undefined')" = true ] ||
            fail "$model $p: --spec off answered spec statistics"
        for f in a1 a2 nb; do
            got=$(field "$TMP/$f.json" 'JSON.stringify(j.choices[0].text)')
            [ "$got" = "$want" ] || fail "$model $p ($f): --spec auto gave $got, --spec off $want"
            mode=$(field "$TMP/$f.json" 'j.sluice.spec.mode')
            [ "$mode" = auto ] || fail "$model $p ($f): sluice.spec.mode '$mode'"
            field "$TMP/$f.json" '["drafted","accepted","mean_acceptance_length"].every(k=>typeof j.sluice.spec[k]==="number")' |
                grep -qx true || fail "$model $p ($f): statistics missing: $(cat "$TMP/$f.json")"
            accepted=$((accepted + $(field "$TMP/$f.json" 'j.sluice.spec.accepted')))
        done
        # streamed: the same text, the statistics in the last chunk
        body "$TMP/$p" stream >"$TMP/body"
        curl -sN -m 60 "http://127.0.0.1:$P_AUTO$url" -d @"$TMP/body" >"$TMP/sse"
        read -r drafted text < <(sse_text "$TMP/sse")
        [ "$text" = "$want" ] || fail "$model $p (stream): --spec auto gave $text, --spec off $want"
        [ "$drafted" != none ] || fail "$model $p (stream): no sluice.spec in the last chunk"
    done
    [ "$accepted" -gt 0 ] || fail "$model: no draft was accepted on any prompt"
    grep -q "spec: [0-9]* verifications.*mean acceptance length" "$TMP/$model-auto.log" ||
        fail "$model: the server's log has no statistics: $(cat "$TMP/$model-auto.log")"
    echo "serve $model: --spec auto answers equal --spec off's (batching, two at once; --no-batch;" \
        "streamed); $accepted drafts accepted"
done

# chat: the same replies with --spec auto as with --spec off; -v's statistics
MSGS=$(sed -n 1,2p "$CAL" | tr '\n' ' ')
printf '%s\nBlessed is the man\nAnd God said\n' "$MSGS" >"$TMP/chat_in"
for model in k1 q5; do
    timeout 60 "$BIN" chat "$TMP/$model.sluice" --temp 0 -n 60 --spec off <"$TMP/chat_in" \
        >"$TMP/chat_off" 2>/dev/null || fail "chat --spec off exited $?"
    timeout 60 "$BIN" chat "$TMP/$model.sluice" --temp 0 -n 60 --spec auto -v <"$TMP/chat_in" \
        >"$TMP/chat_auto" 2>"$TMP/chat_err" || fail "chat --spec auto exited $?: $(cat "$TMP/chat_err")"
    [ -s "$TMP/chat_off" ] || fail "chat $model: no reply"
    cmp -s "$TMP/chat_off" "$TMP/chat_auto" ||
        fail "chat $model: --spec auto replied '$(cat "$TMP/chat_auto")', --spec off '$(cat "$TMP/chat_off")'"
    [ "$(grep -c '^spec: .*drafted [0-9]*, accepted [0-9]*.*mean acceptance length' "$TMP/chat_err")" = 3 ] ||
        fail "chat $model -v: want a statistics line per reply: $(cat "$TMP/chat_err")"
done
echo "chat: --spec auto replies equal --spec off's; -v prints the statistics"
