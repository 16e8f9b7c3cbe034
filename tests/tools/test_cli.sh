#!/bin/sh
# test_cli.sh: the command line's option parsing, for every subcommand (issue 21,
# finding 5). Run by ctest with $SLUICE_BIN (the built binary), $SLUICE_SOURCE_DIR
# and $SLUICE_SHARED; exits 77 (skip) without the binary.
#
# 1. --help lists exactly the options its parser compares arguments with (the
#    "-x"/"--xx" literals in strcmp calls of the subcommand's source file; -h and
#    --help themselves aside). Listed means: in the synopsis (the help's lines
#    up to the first blank one) or at the start of an indented option line.
# 2. Every listed option is accepted: given first, followed by a made-up option,
#    the complaint is about the made-up one (an option taking a value takes it
#    as its value; every subcommand then stops for a missing argument, so
#    nothing runs).
# 3. A made-up option is refused: exit 2, "unknown option 'X'" and the usage
#    on stderr.
# 4. A table of bad values: exit 2 and a message naming the option and value.
# 5. With ../shared's smallest model: the stated clamps of run -n and
#    --prompt-tokens, and -n 0 (the prompt only).

BIN=${SLUICE_BIN:-}
SRC=${SLUICE_SOURCE_DIR:-$(dirname "$0")/../..}
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
    echo "SKIP: the sluice binary is not known (\$SLUICE_BIN)" >&2
    exit 77
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_cli.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

BOGUS=--zz-not-an-option
OPT='-{1,2}[A-Za-z][A-Za-z0-9-]*'

# subcommand (words) : its parser's source file under tools/
while IFS=: read -r cmd file; do
    [ -n "$cmd" ] || continue
    # shellcheck disable=SC2086 # $cmd is one or two words on purpose
    if ! "$BIN" $cmd --help </dev/null >"$TMP/help" 2>"$TMP/err"; then
        fail "sluice $cmd --help: exit status not 0"
        continue
    fi
    # 1. listed options against the parser's
    {
        sed '/^$/q' "$TMP/help" | grep -oE "(^|[[ (|])$OPT" | sed -E 's/^[[ (|]//'
        grep -oE "^ +$OPT(, $OPT)*" "$TMP/help" | tr ',' '\n' | tr -d ' '
    } | grep -vxE -- '-h|--help' | sort -u >"$TMP/listed"
    # shellcheck disable=SC2086 # $file lists the parser's files
    (cd "$SRC/tools" && grep -hoE "strcmp\([^,]+, \"-[^\"]+\"\)" $file) |
        sed -E 's/.*"(-[^"]+)".*/\1/' | grep -vxE -- '-h|--help' | sort -u >"$TMP/parsed"
    if ! diff "$TMP/parsed" "$TMP/listed" >"$TMP/diff"; then
        fail "sluice $cmd: --help and the parser differ (< parser only, > help only):"
        cat "$TMP/diff" >&2
    fi
    # 2. each listed option accepted
    while read -r o; do
        # shellcheck disable=SC2086
        timeout 60 "$BIN" $cmd "$o" "$BOGUS" </dev/null >/dev/null 2>"$TMP/err"
        if grep -qF "unknown option '$o'" "$TMP/err"; then
            fail "sluice $cmd: listed option $o is refused"
        fi
    done <"$TMP/listed"
    # 3. a made-up option refused
    # shellcheck disable=SC2086
    "$BIN" $cmd "$BOGUS" </dev/null >/dev/null 2>"$TMP/err"
    rc=$?
    if [ "$rc" != 2 ] || ! grep -qF "unknown option '$BOGUS'" "$TMP/err" ||
        ! grep -q 'usage:' "$TMP/err"; then
        fail "sluice $cmd $BOGUS: exit $rc, stderr: $(head -1 "$TMP/err")"
    fi
done <<'EOF'
import:sluice_import.c
inspect:sluice_inspect.c
synth:sluice_synth.c
quantize:sluice_quantize.c
run:sluice_run.c tools_spec.c tools_spec_hist.c
eval:sluice_eval.c
profile-attn:sluice_profile_attn.c
mount:sluice_mount.c
umount:sluice_umount.c
bench unpack:bench_unpack.c
bench load:bench_load.c
bench gemm:bench_gemm.c
bench coldstart:bench_coldstart.c
serve:sluice_serve.c tools_spec.c
chat:sluice_chat.c tools_spec.c
bench spec:bench_spec.c
bench attn:bench_attn.c
bench serve:bench_serve.c
EOF

# 3'. the dispatchers
for cmd in "" bench; do
    # shellcheck disable=SC2086
    "$BIN" $cmd "$BOGUS" >/dev/null 2>"$TMP/err"
    rc=$?
    if [ "$rc" != 2 ] || ! grep -qF "unknown option '$BOGUS'" "$TMP/err"; then
        fail "sluice $cmd $BOGUS: exit $rc, stderr: $(head -1 "$TMP/err")"
    fi
done

# 4. bad values: arguments | the message expected on stderr (exit status 2)
while IFS='|' read -r args want; do
    [ -n "$args" ] || continue
    # shellcheck disable=SC2086 # the table's arguments are split on spaces
    "$BIN" $args </dev/null >/dev/null 2>"$TMP/err"
    rc=$?
    if [ "$rc" != 2 ] || ! grep -qF -- "$want" "$TMP/err"; then
        fail "sluice $args: exit $rc (want 2), stderr: $(head -1 "$TMP/err") (want: $want)"
    fi
done <<'EOF'
run -p|sluice run: -p needs a value
run m.sluice -p|sluice run: -p needs a value
run m.sluice -n|sluice run: -n needs a value
run m.sluice -n abc|sluice run: -n wants a whole number in 0..4294967295, not 'abc'
run m.sluice -n -1|sluice run: -n wants a whole number in 0..4294967295, not '-1'
run m.sluice --temp inf|sluice run: --temp wants a number in [0, 1e+06], not 'inf'
run m.sluice --temp nan|sluice run: --temp wants a number in [0, 1e+06], not 'nan'
run m.sluice --temp -0.5|sluice run: --temp wants a number in [0, 1e+06], not '-0.5'
run m.sluice --cpu-workers 100000|sluice run: --cpu-workers wants a whole number in 1..8, not '100000'
run m.sluice --cpu-workers 0|sluice run: --cpu-workers wants a whole number in 1..8, not '0'
run m.sluice --top-p 1.5|sluice run: --top-p wants a number in [0, 1], not '1.5'
run m.sluice --npu-share 1|sluice run: --npu-share wants a number in [0, 1), not '1'
run m.sluice --chunk 0|sluice run: --chunk wants a whole number in 1..65536, not '0'
run m.sluice --load fast|sluice run: --load wants one of stream, read or mmap, not 'fast'
run m.sluice --policy fast|sluice run: --policy wants full, sequential,
run m.sluice --prompt-tokens 0|sluice run: --prompt-tokens wants a whole number in 1..
run m.sluice extra|sluice run: unexpected argument 'extra'
run|sluice run: no MODEL given
quantize m.sluice -o q.sluice --bits 4 --bogus|sluice quantize: unknown option '--bogus'
quantize m.sluice -o q.sluice --bits|sluice quantize: --bits needs a value
quantize m.sluice -o q.sluice --bits 9|sluice quantize: --bits wants a number in [1, 8], not '9'
quantize m.sluice -o q.sluice --bits inf|sluice quantize: --bits wants a number in [1, 8], not 'inf'
quantize m.sluice --budget some|sluice quantize: --budget wants one of tensor, global or auto, not 'some'
quantize m.sluice --alpha-steps 0|sluice quantize: --alpha-steps wants a whole number in 1..1000, not '0'
quantize m.sluice --method best|sluice quantize: --method wants edgeflow, uniform,
eval m.sluice --ref|sluice eval: --ref needs a value
eval m.sluice --ctx 3|sluice eval: --ctx wants a whole number in 4..
import a.bin --dtype f8|sluice import: --dtype wants one of f32, f16 or bf16, not 'f8'
import a.bin --seq-len 0|sluice import: --seq-len wants a whole number in 1..
import a.bin -o|sluice import: -o needs a value
synth --shape|sluice synth: --shape needs a value
synth --seed x|sluice synth: --seed wants a whole number in 0..
synth --seed +1|sluice synth: --seed wants a whole number in 0..
inspect a b|sluice inspect: unexpected argument 'b'
mount m.sluice -o|sluice mount: -o needs a value
umount -x|sluice umount: unknown option '-x'
bench unpack --seconds inf|sluice bench unpack: --seconds wants a number in (0, 3600], not 'inf'
bench unpack --rows 0|sluice bench unpack: --rows wants a whole number in 1..1048576, not '0'
bench gemm --seconds 0|sluice bench gemm: --seconds wants a number in (0, 600], not '0'
bench gemm --m|sluice bench gemm: --m needs a value
bench load m.sluice --runs 0|sluice bench load: --runs wants a whole number in 1..64, not '0'
bench load m.sluice --chunk-kib 6|sluice bench load: --chunk-kib wants a multiple of 4, not '6'
bench coldstart m.sluice --runs 33|sluice bench coldstart: --runs wants a whole number in 1..32, not '33'
serve m.sluice --port 65536|sluice serve: --port wants a whole number in 0..65535, not '65536'
serve m.sluice --parallel 0|sluice serve: --parallel wants a whole number in 1..256, not '0'
serve m.sluice --max-body 0|sluice serve: --max-body wants a whole number in 1..
serve m.sluice --api-key|sluice serve: --api-key needs a value
serve|sluice serve: no MODEL given
chat m.sluice --temp 3|sluice chat: --temp wants a number in [0, 2], not '3'
chat m.sluice --template jinja|sluice chat: --template wants one of
chat|sluice chat: no MODEL given
chat m.sluice --spec maybe|sluice chat: --spec wants one of off or auto, not 'maybe'
chat m.sluice --spec-rows 5|sluice chat: --spec-rows wants 4, 8 or 16, not 5
chat m.sluice --spec-history d|sluice chat: unknown option '--spec-history'
serve m.sluice --spec on|sluice serve: --spec wants one of off or auto, not 'on'
serve m.sluice --spec-rows 32|sluice serve: --spec-rows wants a whole number in 4..16, not '32'
serve m.sluice --spec-kind k|sluice serve: unknown option '--spec-kind'
run m.sluice --attn fast|sluice run: --attn wants one of dense, sparse or auto, not 'fast'
run m.sluice --keep 0|sluice run: --keep wants a number in (0, 1], not '0'
eval m.sluice --keep 1.5|sluice eval: --keep wants a number in (0, 1], not '1.5'
eval m.sluice --keep-floor 2|sluice eval: --keep-floor wants a number in [0, 1], not '2'
eval m.sluice --select kv|sluice eval: --select wants one of head or group, not 'kv'
run m.sluice --select all|sluice run: --select wants one of head or group, not 'all'
run m.sluice --estimate npu|sluice run: --estimate wants one of device or inline, not 'npu'
profile-attn m.sluice --buckets 0|sluice profile-attn: --buckets wants a whole number in 1..64, not '0'
profile-attn m.sluice --step 1|sluice profile-attn: --step wants a number in (0, 1), not '1'
bench spec m.sluice --verify-cost 64 --resident fp16|sluice bench spec: --resident wants int8 or packed, not 'fp16'
bench spec m.sluice --text t.txt --resident packed|sluice bench spec: --resident goes with --verify-cost
bench spec m.sluice --verify-cost 64 --one-thread --resident packed|sluice bench spec: --one-thread times the int8 or float weights, not --resident packed
bench spec m.sluice --verify-cost 64 --history|sluice bench spec: --verify-cost times forwards alone
bench spec m.sluice --verify-cost 64 --history-shared|sluice bench spec: --verify-cost times forwards alone
bench spec m.sluice --verify-cost 64 --history-shared-all|sluice bench spec: --verify-cost times forwards alone
bench spec m.sluice --verify-cost 64 --shape 5|sluice bench spec: --shape wants 1, 4, 8 or 16
bench spec m.sluice --text t.txt --shape 8|sluice bench spec: --shape goes with --verify-cost
bench attn --ctx 8|sluice bench attn: --ctx: '8' is not a length in 16..65536
bench attn --shape gpt|sluice bench attn: unknown shape 'gpt'
bench attn --threads 3|sluice bench attn: --threads wants a whole number in 1..2, not '3'
bench attn --select kv|sluice bench attn: --select wants one of head, group or both, not 'kv'
bench attn --estimate gpu|sluice bench attn: --estimate wants one of device, inline or both, not 'gpu'
bench serve m.sluice --clients 0|sluice bench serve: --clients wants up to 8 numbers in 1..1024
bench serve m.sluice --llama-server x|sluice bench serve: --llama-server and --gguf go together
bench serve m.sluice --cold 3|sluice bench serve: --cold needs --flashrun PATH
EOF

# 5. the stated clamps, on a real model (a 128-token context)
SHARED=${SLUICE_SHARED:-$SRC/../shared}
M=$SHARED/models/aidreams260K.bin
TOK=$SHARED/models/aidreams260K.tok512.bin
if [ -f "$M" ] && [ -f "$TOK" ]; then
    if ! "$BIN" import "$M" --tokenizer "$TOK" -o "$TMP/m.sluice" 2>"$TMP/err"; then
        fail "import $M: $(cat "$TMP/err")"
    fi
    "$BIN" run "$TMP/m.sluice" -p Hi -n 1000000 --json >"$TMP/out" 2>"$TMP/err" ||
        fail "run -n 1000000: exit $?, $(head -1 "$TMP/err")"
    grep -qF -- "-n 1000000: the context of 128 tokens leaves room for" "$TMP/err" ||
        fail "run -n 1000000: the cut is not said: $(head -1 "$TMP/err")"
    "$BIN" run "$TMP/m.sluice" -p Hi -n 3 --json >"$TMP/out" 2>"$TMP/err" ||
        fail "run -n 3: exit $?"
    [ -s "$TMP/err" ] && fail "run -n 3: something on stderr: $(head -1 "$TMP/err")"
    "$BIN" run "$TMP/m.sluice" --prompt-tokens 1000 -n 1 --json >"$TMP/out" 2>"$TMP/err" ||
        fail "run --prompt-tokens 1000: exit $?"
    grep -qF -- "--prompt-tokens 1000: the context is 128 tokens; using 128" "$TMP/err" ||
        fail "run --prompt-tokens 1000: the cut is not said: $(head -1 "$TMP/err")"
    # a synthetic prompt's pieces, written at once before the cold start:
    # they come whole before the generated ones (the prompt alone is a
    # prefix of the run that generates, less its closing newline)
    "$BIN" run "$TMP/m.sluice" --prompt-tokens 40 -n 0 >"$TMP/p0" 2>"$TMP/err" ||
        fail "run --prompt-tokens 40 -n 0: exit $?"
    "$BIN" run "$TMP/m.sluice" --prompt-tokens 40 -n 5 >"$TMP/p5" 2>"$TMP/err" ||
        fail "run --prompt-tokens 40 -n 5: exit $?"
    n0=$(($(stat -c %s "$TMP/p0") - 1))
    [ "$n0" -gt 0 ] && [ "$(stat -c %s "$TMP/p5")" -gt "$((n0 + 1))" ] ||
        fail "run --prompt-tokens 40: $n0 bytes of prompt, $(stat -c %s "$TMP/p5") with -n 5"
    head -c "$n0" "$TMP/p0" >"$TMP/p0n"
    head -c "$n0" "$TMP/p5" | cmp -s - "$TMP/p0n" ||
        fail "run --prompt-tokens 40 -n 5: the prompt's pieces are not printed first"
    "$BIN" run "$TMP/m.sluice" -p Hi -n 0 --json >"$TMP/out" 2>"$TMP/err" ||
        fail "run -n 0: exit $?"
    grep -qF '"generated_tokens":0' "$TMP/out" ||
        fail "run -n 0: $(cat "$TMP/out")"
    # bad containers: run opens the container once (its reader serves the
    # tokenizer and the cold start); each still fails with its sentence, the
    # truncated ones at the open, a corrupt layer in the pipeline's checksum
    head -c 3000 "$TMP/m.sluice" >"$TMP/bad1.sluice"
    head -c 100000 "$TMP/m.sluice" >"$TMP/bad2.sluice"
    { printf 'SLUICE\032\n'; head -c 8192 /dev/zero; } >"$TMP/bad3.sluice"
    cp "$TMP/m.sluice" "$TMP/bad4.sluice"
    printf '\377\377\377\377' | dd of="$TMP/bad4.sluice" bs=1 seek=20000 conv=notrunc 2>/dev/null
    while IFS='|' read -r f want; do
        "$BIN" run "$TMP/$f" -p Hi -n 3 >/dev/null 2>"$TMP/err"
        rc=$?
        if [ "$rc" != 1 ] || ! grep -qF -- "$want" "$TMP/err"; then
            fail "run $f: exit $rc (want 1), stderr: $(head -1 "$TMP/err") (want: $want)"
        fi
    done <<'BAD'
bad1.sluice|truncated: 3000 bytes, shorter than the header
bad2.sluice|file is 100000 bytes, its header says
bad3.sluice|container version 0, this build reads versions
bad4.sluice|checksum mismatch in slice 'layer 0'
BAD
    # a stdout that cannot take the text (a full disk) fails the run, text or JSON
    if [ -w /dev/full ]; then
        for j in "" --json; do
            "$BIN" run "$TMP/m.sluice" -p Hi -n 3 $j >/dev/full 2>"$TMP/err"
            rc=$?
            if [ "$rc" != 1 ] || ! grep -qF "cannot write the output to stdout" "$TMP/err"; then
                fail "run $j >/dev/full: exit $rc (want 1), stderr: $(head -1 "$TMP/err")"
            fi
        done
    fi
else
    echo "note: $M absent; the clamps on a real model are not tested" >&2
fi

if [ "$failures" != 0 ]; then
    echo "$failures failures" >&2
    exit 1
fi
echo "all command-line cases passed"
