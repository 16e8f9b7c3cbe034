#!/bin/bash
# test_serve_openai.sh: `sluice serve` driven by the official `openai` npm
# package (chat completions and completions, streaming and not, typed
# errors) and by the curl command line (server-sent events parsed line by
# line), on kjv6L from ../shared quantized here. The package is installed
# with npm into $SLUICE_NPM_DIR (the build tree; kept between runs). Skips
# (77) without ../shared's model, without node/npm/curl, or when npm cannot
# install the package (no registry).
set -u
BIN=${SLUICE_BIN:-}
SHARED=${SLUICE_SHARED:-}
NPM_DIR=${SLUICE_NPM_DIR:-${TMPDIR:-/tmp}/sluice-npm}
skip() { echo "SKIP: $*" >&2; exit 77; }
[ -n "$BIN" ] && [ -x "$BIN" ] || skip "the sluice binary is not known (\$SLUICE_BIN)"
M=$SHARED/models
[ -f "$M/kjv6L.bin" ] || skip "$M/kjv6L.bin is absent"
command -v node >/dev/null && command -v npm >/dev/null || skip "node or npm is not installed"
command -v curl >/dev/null || skip "curl is not installed"
# openai 5 and later want Node 20; Debian 12's node is 18, for which openai 4
NODE_MAJOR=$(node -p 'process.versions.node.split(".")[0]')
PKG=openai
[ "$NODE_MAJOR" -lt 20 ] && PKG=openai@4 && NPM_DIR=$NPM_DIR-4
if [ ! -f "$NPM_DIR/node_modules/openai/package.json" ]; then
    mkdir -p "$NPM_DIR"
    timeout 120 npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error "$PKG" \
        >"$NPM_DIR/install.log" 2>&1 || skip "npm cannot install $PKG: $(tail -1 "$NPM_DIR/install.log")"
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_serve_openai.XXXXXX") || exit 1
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$BIN" import "$M/kjv6L.bin" --tokenizer "$M/kjv6L.tok1024.bin" -o "$TMP/f.sluice" >/dev/null 2>&1 &&
    "$BIN" quantize "$TMP/f.sluice" -o "$TMP/m.sluice" --bits 5 --method uniform \
        --calib "$M/kjv6L.calib.txt" >/dev/null 2>&1 || fail "cannot import and quantize kjv6L"
"$BIN" serve "$TMP/m.sluice" --port 0 --api-key k --parallel 2 2>"$TMP/log" &
PID=$!
PORT=
for _ in $(seq 1 200); do
    PORT=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$TMP/log" | sed 's/.*://')
    [ -n "$PORT" ] && break
    sleep 0.05
done
[ -n "$PORT" ] || fail "the server did not start: $(cat "$TMP/log")"

# sluice run's greedy continuations (its text is the prompt, then them)
json_text() { node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.parse(s).text))'; }
run_cont() { # PROMPT
    "$BIN" run "$TMP/m.sluice" -p "$1" -n 24 --json 2>/dev/null | json_text | tail -c +$((${#1} + 1))
}
WANT_COMPLETION=$(run_cont "And God said"; printf x); WANT_COMPLETION=${WANT_COMPLETION%x}
CHAT_PROMPT=$'User: Tell me of the land of Egypt\nAssistant:'
WANT_CHAT=$(run_cont "$CHAT_PROMPT"; printf x); WANT_CHAT=${WANT_CHAT%x}
WANT_CHAT=${WANT_CHAT%%$'\n'User:*} # the reply ends at the template's turn end
[ -n "$WANT_COMPLETION" ] && [ -n "$WANT_CHAT" ] || fail "sluice run gave no text"

# curl: the event stream, line by line
curl -sN -H 'Authorization: Bearer k' "http://127.0.0.1:$PORT/v1/completions" \
    -d '{"model":"m","prompt":"And God said","max_tokens":24,"temperature":0,"stream":true}' \
    >"$TMP/sse" || fail "curl failed"
grep -v '^$' "$TMP/sse" | grep -qv '^data: ' && fail "a non-data line in the stream: $(cat "$TMP/sse")"
[ "$(grep -v '^$' "$TMP/sse" | tail -1)" = "data: [DONE]" ] || fail "the stream does not end in [DONE]"
GOT=$(grep '^data: {' "$TMP/sse" | sed 's/^data: //' |
      node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{let t="";for(const l of s.split("\n")){if(!l)continue;const o=JSON.parse(l);if(o.choices.length)t+=o.choices[0].text;}process.stdout.write(t+"x")})')
[ "${GOT%x}" = "$WANT_COMPLETION" ] || fail "curl stream text '${GOT%x}', want '$WANT_COMPLETION'"

OPENAI_PREFIX=$NPM_DIR SERVE_URL="http://127.0.0.1:$PORT/v1" API_KEY=k \
    WANT_COMPLETION=$WANT_COMPLETION WANT_CHAT=$WANT_CHAT \
    timeout 60 node "$(dirname "$0")/serve_openai.js" || fail "the openai client checks failed"
kill "$PID"
wait "$PID" || fail "the server did not exit cleanly"
PID=
echo "curl and openai clients: all checks passed"
