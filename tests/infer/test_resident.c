/* test_resident.c: decoding straight from packed weights (--resident packed).
 * - a cold start with packed residency gives the same first logits and the
 *   same logits at every decode step, bit for bit, as int8 residency, with
 *   the NPU device thread taking part of each matmul (a decode step's in
 *   chunks from the two ends of its channels) and the calling thread alone;
 *   also for later prompts of several rows (prefill, m > 1) and for
 *   the scheduling policies that unpack whole tensors (sequential), and
 *   with the prefill's int8 copies from a bounded pool of any budget;
 * - after the first step the model holds no int8 copy of an adaptive linear
 *   and its packed bytes instead; int8 residency keeps int8 only;
 * - the baseline encodings (bitplane) decode from packed bytes too;
 * - activation sets: one, a few or one per chunk, the same logits;
 * - auto picks int8 for a model that fits in cache;
 * - no_decode: the same first logits without the untied embedding's read,
 *   and (packed) the layers' mapped slices lose their page table entries;
 * - npu_device_call runs host work on the device thread in FIFO order and
 *   hands back its status. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "import.h"
#include "infer_internal.h"
#include "npu.h"
#include "quantizer.h"
#include "testutil.h"
#include "tiny_q5.h"

static char q_model[4096], bp_model[4096];

static int setup(void **st)
{
    (void)st;
    char float_model[4096];
    struct sl_err err;
    if (tiny_q5_models(7, float_model, q_model) < 0)
        return -1;
    snprintf(bp_model, sizeof bp_model, "%s/tiny-bp4.sluice", test_tmpdir());
    struct quantizer_opts o = {.method = QUANTIZER_METHOD_EDGEFLOW, .bits = 4,
                               .budget = QUANTIZER_BUDGET_TENSOR, .alpha = -1,
                               .encoding = FORMAT_ENC_BITPLANE};
    if (quantizer_quantize(float_model, NULL, &o, bp_model, NULL, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

static int *ids(uint32_t n, uint32_t vocab, uint32_t salt)
{
    int *t = malloc(sizeof(int) * n);
    assert_non_null(t);
    for (uint32_t i = 0; i < n; i++)
        t[i] = i == 0 ? 1 : 3 + (int)((i * 2654435761u + salt) % (vocab - 3));
    return t;
}

/* packed residency's int8 pool (pipeline_pool.c): its budget and the
 * matmul split for run(), and the pool's peak of the last run */
static uint64_t g_budget;
static uint32_t g_split;
static uint64_t g_pool_peak;
/* the pool's bytes of linears given fresh / recycled storage in the last run */
static uint64_t g_pool_fresh, g_pool_reused;
/* packed residency's slices read with O_DIRECT (1) or mapped (0), and
 * whether the last run's model maps them */
static int g_slices_read, g_mapped;
/* mapped slices: bytes hashed at a time (0: the default) */
static uint32_t g_hash_step;
/* the prefill's chunk rows (0: 32) and activation sets (pipeline_acts.c), and
 * the sets of the last run */
static uint32_t g_chunk, g_sets, g_sets_used;

/* A cold start of `model` with the given residency, then steps and a
 * 5-token prompt; every logits vector appended to out [(2 + steps) * V]. */
static void run(const char *model, enum infer_resident res, enum infer_policy pol, int no_npu,
                uint32_t steps, float *out, size_t *int8_b, size_t *packed_b)
{
    struct sl_err err = {{0}};
    struct infer_session_opts so = {.max_batch = 32, .npu_min_weights = 1, .no_npu = no_npu};
    struct infer_pipeline_opts po;
    infer_pipeline_opts_init(&po);
    po.chunk = g_chunk ? g_chunk : 32;
    po.act_sets = g_sets;
    po.policy = pol;
    po.resident = res;
    po.int8_budget = g_budget;
    po.slices_read = g_slices_read;
    po.hash_step = g_hash_step;
    if (g_split)
        po.split = g_split;
    struct infer_session *s;
    struct infer_pipeline_stats pst;
    int *p = ids(40, 512, 3);
    if (infer_session_cold_start(model, p, 40, &so, &po, &s, &pst, &err) < 0)
        fail_msg("cold start: %s", err.msg);
    g_pool_peak = pst.int8_pool_bytes;
    g_pool_fresh = pst.int8_pool_fresh;
    g_pool_reused = pst.int8_pool_reused;
    g_mapped = infer_session_model(s)->slices_mapped != 0;
    g_sets_used = pst.act_sets;
    uint32_t V = infer_model_config(infer_session_model(s))->vocab_size;
    memcpy(out, infer_session_logits(s), sizeof(float) * V);
    for (uint32_t i = 0; i < steps; i++) {
        if (infer_session_step(s, 60 + (int)i, &err) < 0)
            fail_msg("step: %s", err.msg);
        memcpy(out + (size_t)(1 + i) * V, infer_session_logits(s), sizeof(float) * V);
    }
    int more[5] = {7, 8, 9, 10, 11};
    if (infer_session_prefill(s, more, 5, &err) < 0)
        fail_msg("prefill: %s", err.msg);
    memcpy(out + (size_t)(1 + steps) * V, infer_session_logits(s), sizeof(float) * V);
    infer_model_weight_bytes(infer_session_model(s), int8_b, packed_b);
    infer_session_destroy(s);
    free(p);
}

static void compare(const char *model, enum infer_policy pol, int adaptive)
{
    const uint32_t steps = 10, V = 512;
    size_t n = (size_t)(2 + steps) * V;
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    float *c = malloc(sizeof(float) * n);
    size_t i8a, pka, i8b, pkb, i8c, pkc;
    run(model, INFER_RESIDENT_INT8, pol, 0, steps, a, &i8a, &pka);
    run(model, INFER_RESIDENT_PACKED, pol, 0, steps, b, &i8b, &pkb);
    run(model, INFER_RESIDENT_PACKED, pol, 1, steps, c, &i8c, &pkc);
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)))
            fail_msg("%s: packed logits differ at step %zu token %zu: %.9g vs int8 %.9g",
                     infer_policy_name(pol), i / V, i % V, (double)b[i], (double)a[i]);
        if (memcmp(&a[i], &c[i], sizeof(float)))
            fail_msg("%s: packed (calling thread alone) logits differ at %zu", infer_policy_name(pol),
                     i);
    }
    assert_true(i8a > 0);
    assert_true(pkb > pka); /* int8 residency keeps only an untied embedding packed */
    if (adaptive) /* every linear of an adaptive model is packed: no int8 left */
        assert_int_equal(i8b, 0);
    assert_true(pkb < i8a);
    fprintf(stderr, "%s %s: int8 resident %zu bytes, packed resident %zu (+%zu int8)\n", model,
            infer_policy_name(pol), i8a, pkb, i8b);
    free(a);
    free(b);
    free(c);
}

static void test_same_logits(void **st)
{
    (void)st;
    compare(q_model, INFER_POLICY_FULL, 1);
    compare(q_model, INFER_POLICY_SEQUENTIAL, 1);
    compare(q_model, INFER_POLICY_LAYER_OVERLAP, 1);
}

static void test_bitplane(void **st)
{
    (void)st;
    compare(bp_model, INFER_POLICY_FULL, 1);
}

/* The int8 pool: with any budget (one linear at a time, a few, every one)
 * and matmuls split in pieces, the same logits as int8 residency; the
 * storage the pool holds stays within the budget plus one linear (the
 * largest, gate/up/down of 352 x 128: 45056 bytes of codes). */
static void test_int8_pool(void **st)
{
    (void)st;
    const uint64_t largest = 352 * 128 + 8 * 352;
    uint64_t budgets[] = {1, 3 * largest, 0};
    uint32_t splits[] = {64, 0};
    for (int b = 0; b < 3; b++)
        for (int k = 0; k < 2; k++) {
            g_budget = budgets[b];
            g_split = splits[k];
            compare(q_model, INFER_POLICY_FULL, 1);
            assert_true(g_pool_peak > 0);
            if (budgets[b])
                assert_true(g_pool_peak <= budgets[b] + largest);
            fprintf(stderr, "budget %" PRIu64 " split %u: pool peak %" PRIu64 " bytes\n",
                    budgets[b], splits[k], g_pool_peak);
        }
    g_budget = 0;
    g_split = 0;
    compare(q_model, INFER_POLICY_SEQUENTIAL_GRANULAR, 1);
    assert_true(g_pool_peak > 0);
}

/* Recycling across shapes: with room for two of the largest linear, a
 * linear without a free storage of its shape takes a larger free one
 * (npu_weights_reshape): the same logits, and part of the linears get
 * recycled memory. Every linear gets fresh or recycled storage, so fresh +
 * reused is the int8 size of the model's linears whatever the budget. */
static void test_int8_pool_reuse(void **st)
{
    (void)st;
    const uint64_t largest = 352 * 128;
    g_budget = 2 * largest;
    compare(q_model, INFER_POLICY_FULL, 1);
    uint64_t total = g_pool_fresh + g_pool_reused;
    fprintf(stderr, "budget %" PRIu64 ": fresh %" PRIu64 ", recycled %" PRIu64 " bytes\n",
            g_budget, g_pool_fresh, g_pool_reused);
    g_budget = 0;
    assert_true(g_pool_peak <= 2 * largest + largest);
    assert_true(g_pool_reused > 0);
    assert_true(g_pool_fresh < total);
    /* the default budget holds the whole (tiny) model: all fresh */
    compare(q_model, INFER_POLICY_FULL, 1);
    assert_int_equal(g_pool_fresh + g_pool_reused, total);
}

/* q_model copied to `bad` with the byte at `off` flipped */
static void write_flipped(const char *bad, uint64_t off)
{
    FILE *in = fopen(q_model, "rb"), *out = fopen(bad, "wb");
    assert_non_null(in);
    assert_non_null(out);
    int ch;
    for (uint64_t k = 0; (ch = fgetc(in)) != EOF; k++)
        fputc(k == off ? ch ^ 0x40 : ch, out);
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

/* Packed residency's slices mapped from the page cache (the default here,
 * hashed in pieces as they arrive: 2 MiB, and 4 KiB pieces so that every
 * slice here is several) and read with O_DIRECT into the model's memory: the
 * same logits as int8 residency every way; a flipped byte (in the middle or
 * at the start of a layer's slice, or the last byte of the slice read last,
 * in its last piece) is an error naming the checksum on every path, and no
 * session (no logits) comes back. */
static void test_slices_mapped(void **st)
{
    (void)st;
    compare(q_model, INFER_POLICY_FULL, 1);
    assert_int_equal(g_mapped, 1);
    g_hash_step = 4096;
    compare(q_model, INFER_POLICY_FULL, 1);
    assert_int_equal(g_mapped, 1);
    g_hash_step = 0;
    g_slices_read = 1;
    compare(q_model, INFER_POLICY_FULL, 1);
    assert_int_equal(g_mapped, 0);
    g_slices_read = 0;

    char bad[4096];
    snprintf(bad, sizeof bad, "%s/tiny-flip.sluice", test_tmpdir());
    struct sl_err err = {{0}};
    struct format_reader *r;
    assert_int_equal(format_reader_open(q_model, &r, &err), 0);
    uint64_t offs[3] = {0, 0, 0}, last = 0;
    for (uint32_t i = 0; i < format_reader_n_slices(r); i++) {
        const struct format_slice_info *s = format_reader_slice(r, i);
        if (s->kind == FORMAT_SLICE_LAYER && s->layer == 1) {
            assert_true(s->length > 3 * 4096); /* several 4 KiB pieces */
            offs[0] = s->offset + s->length / 2;
            offs[1] = s->offset;
        }
        /* the slice read last for the first token: not the untied embedding */
        if (s->kind != FORMAT_SLICE_EMBED && s->length && s->offset + s->length > last)
            last = s->offset + s->length;
    }
    format_reader_close(r);
    assert_true(offs[0] > 0 && last > 0);
    offs[2] = last - 1;
    for (int at = 0; at < 3; at++) {
        write_flipped(bad, offs[at]);
        for (int mode = 0; mode < 3; mode++) { /* mapped, mapped in 4 KiB pieces, read */
            struct infer_session_opts so = {.max_batch = 32};
            struct infer_pipeline_opts po;
            infer_pipeline_opts_init(&po);
            po.chunk = 32;
            po.resident = INFER_RESIDENT_PACKED;
            po.slices_read = mode == 2;
            po.hash_step = mode == 1 ? 4096 : 0;
            struct infer_session *s = NULL;
            int *p = ids(40, 512, 3);
            memset(&err, 0, sizeof err);
            assert_true(infer_session_cold_start(bad, p, 40, &so, &po, &s, NULL, &err) < 0);
            assert_null(s);
            if (!strstr(err.msg, "checksum"))
                fail_msg("byte %" PRIu64 ", mode %d: the error does not name the checksum: %s",
                         offs[at], mode, err.msg);
            free(p);
        }
    }
    remove(bad);
}

/* Activation sets (pipeline_acts.c): five chunks of 8 rows computed with
 * one, two, three or five sets of activation scratch give the logits of
 * every step bit for bit, packed (the pool's default budget holds a layer)
 * and int8; where the budget cannot hold a layer (1 byte) every chunk gets
 * a set (limiting them could deadlock), with the same logits. */
static void test_act_sets(void **st)
{
    (void)st;
    const uint32_t steps = 3, V = 512;
    size_t n = (size_t)(2 + steps) * V, i8, pk;
    float *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    assert_non_null(ref);
    assert_non_null(got);
    g_chunk = 8;
    g_sets = 5;
    run(q_model, INFER_RESIDENT_INT8, INFER_POLICY_FULL, 0, steps, ref, &i8, &pk);
    assert_int_equal(g_sets_used, 5);
    static const uint32_t sets[] = {1, 2, 3, 0, 9};
    static const uint32_t used[] = {1, 2, 3, 2, 5};
    for (int r = 0; r < 2; r++)
        for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) {
            g_sets = sets[k];
            run(q_model, r ? INFER_RESIDENT_INT8 : INFER_RESIDENT_PACKED, INFER_POLICY_FULL, 0,
                steps, got, &i8, &pk);
            assert_int_equal(g_sets_used, used[k]);
            if (memcmp(ref, got, sizeof(float) * n) != 0)
                fail_msg("%s, %u activation sets: logits differ", r ? "int8" : "packed", sets[k]);
        }
    g_budget = 1; /* a linear at a time: no limit on the sets */
    g_sets = 1;
    run(q_model, INFER_RESIDENT_PACKED, INFER_POLICY_FULL, 0, steps, got, &i8, &pk);
    assert_int_equal(g_sets_used, 5);
    assert_memory_equal(ref, got, sizeof(float) * n);
    g_sets = 2;
    g_split = 64;
    run(q_model, INFER_RESIDENT_PACKED, INFER_POLICY_SEQUENTIAL_GRANULAR, 0, steps, got, &i8, &pk);
    assert_memory_equal(ref, got, sizeof(float) * n);
    g_budget = 0;
    g_split = 0;
    g_chunk = 0;
    g_sets = 0;
    free(ref);
    free(got);
}

/* auto: int8 for a model whose int8 weights fit in any last-level cache
 * (about 200 KB); the explicit choices stay; names parse both ways */
static void test_auto(void **st)
{
    (void)st;
    struct format_reader *r;
    struct sl_err err;
    assert_int_equal(format_reader_open(q_model, &r, &err), 0);
    assert_int_equal(infer_resident_resolve(INFER_RESIDENT_AUTO, r, 0), INFER_RESIDENT_INT8);
    assert_int_equal(infer_resident_resolve(INFER_RESIDENT_PACKED, r, 0), INFER_RESIDENT_PACKED);
    assert_int_equal(infer_resident_resolve(INFER_RESIDENT_INT8, r, 0), INFER_RESIDENT_INT8);
    format_reader_close(r);
    enum infer_resident e;
    assert_int_equal(infer_resident_parse("auto", &e), 0);
    assert_int_equal(e, INFER_RESIDENT_AUTO);
    assert_string_equal(infer_resident_name(e), "auto");
    assert_int_equal(infer_resident_parse("int4", &e), -EINVAL);
}

/* Of the whole pages inside [p, p + len): how many (*whole), and how many
 * have their page table entry present (/proc/self/pagemap, bit 63); -1 if
 * the pagemap cannot be read. */
static long present_pages(const uint8_t *p, size_t len, long *whole)
{
    uintptr_t ps = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + ps - 1) & ~(ps - 1), b = ((uintptr_t)p + len) & ~(ps - 1);
    *whole = b > a ? (long)((b - a) / ps) : 0;
    int fd = open("/proc/self/pagemap", O_RDONLY);
    if (fd < 0)
        return -1;
    long n = 0;
    for (uintptr_t v = a; v < b; v += ps) {
        uint64_t e;
        if (pread(fd, &e, sizeof e, (off_t)(v / ps * sizeof e)) != (ssize_t)sizeof e) {
            close(fd);
            return -1;
        }
        n += (long)(e >> 63);
    }
    close(fd);
    return n;
}

/* A packed cold start with no_decode 0/1: the first logits equal `want`;
 * the layer slices' whole pages with a mapped entry, and their count. */
static void layer_pages(int no_decode, const float *want, long *present, long *whole)
{
    const uint32_t V = 512;
    struct sl_err err = {{0}};
    struct infer_session_opts so = {.max_batch = 32};
    struct infer_pipeline_opts po;
    infer_pipeline_opts_init(&po);
    po.chunk = 32;
    po.resident = INFER_RESIDENT_PACKED;
    po.no_decode = no_decode;
    struct infer_session *s;
    int *p = ids(40, 512, 3);
    assert_int_equal(infer_session_cold_start(q_model, p, 40, &so, &po, &s, NULL, &err), 0);
    assert_memory_equal(infer_session_logits(s), want, sizeof(float) * V);
    const struct infer_model *m = infer_session_model(s);
    assert_true(m->slices_mapped != 0);
    struct format_reader *r;
    assert_int_equal(format_reader_open(q_model, &r, &err), 0);
    *present = *whole = 0;
    for (uint32_t i = 0; i < format_reader_n_slices(r); i++) {
        const struct format_slice_info *si = format_reader_slice(r, i);
        if (si->kind != FORMAT_SLICE_LAYER)
            continue;
        long w, n = present_pages((const uint8_t *)m->slices + si->offset, si->length, &w);
        if (n < 0)
            fail_msg("cannot read /proc/self/pagemap");
        *present += n;
        *whole += w;
    }
    format_reader_close(r);
    infer_session_destroy(s);
    free(p);
}

/* no_decode (sluice run -n 0/1): the same first logits; what only decoding
 * needs (the untied embedding) is not read, so a step fails with a sentence.
 * With packed residency the layers' mapped slices lose their page table
 * entries once their matmuls are done (pl_map_release), so that tearing
 * them down is not left for the exit; without no_decode they stay. */
static void test_no_decode(void **st)
{
    (void)st;
    const uint32_t V = 512;
    float *a = malloc(sizeof(float) * 12 * V);
    size_t i8, pk;
    run(q_model, INFER_RESIDENT_INT8, INFER_POLICY_FULL, 0, 10, a, &i8, &pk);
    struct sl_err err = {{0}};
    struct infer_session_opts so = {.max_batch = 32};
    struct infer_pipeline_opts po;
    infer_pipeline_opts_init(&po);
    po.chunk = 32;
    po.no_decode = 1;
    struct infer_session *s;
    int *p = ids(40, 512, 3);
    assert_int_equal(infer_session_cold_start(q_model, p, 40, &so, &po, &s, NULL, &err), 0);
    assert_memory_equal(infer_session_logits(s), a, sizeof(float) * V);
    assert_true(infer_session_step(s, 60, &err) < 0);
    assert_true(err.msg[0] != 0);
    infer_session_destroy(s);
    free(p);

    long present, whole;
    layer_pages(0, a, &present, &whole);
    assert_true(whole > 0);
    assert_int_equal(present, whole); /* populated, and kept for decoding */
    layer_pages(1, a, &present, &whole);
    assert_true(whole > 0);
    assert_int_equal(present, 0);
    free(a);
}

/* Every allocation of a packed cold start and its first steps fails once in
 * turn: an error with a sentence, or (absorbed) the very same logits;
 * nothing leaks (LeakSanitizer in the ASan build). */
static int packed_run(float *out, struct sl_err *err)
{
    struct infer_session_opts so = {.max_batch = 32, .npu_min_weights = 1};
    struct infer_pipeline_opts po;
    infer_pipeline_opts_init(&po);
    po.chunk = 32;
    po.resident = INFER_RESIDENT_PACKED;
    struct infer_session *s = NULL;
    int p[20];
    for (int i = 0; i < 20; i++)
        p[i] = i == 0 ? 1 : 3 + i * 7;
    int ret = infer_session_cold_start(q_model, p, 20, &so, &po, &s, NULL, err);
    for (int i = 0; ret == 0 && i < 3; i++)
        ret = infer_session_step(s, 40 + i, err);
    if (ret == 0)
        memcpy(out, infer_session_logits(s), sizeof(float) * 512);
    infer_session_destroy(s);
    return ret;
}

static void test_packed_faults(void **st)
{
    (void)st;
    float want[512], got[512];
    struct sl_err err = {{0}};
    sl_fault_alloc_arm(-1);
    assert_int_equal(packed_run(want, &err), 0);
    long n = sl_fault_alloc_count();
    sl_fault_alloc_arm(0);
    uint32_t failed = 0;
    for (long k = 1; k <= n + 2; k++) {
        memset(&err, 0, sizeof err);
        sl_fault_alloc_arm(k);
        int ret = packed_run(got, &err);
        sl_fault_alloc_arm(0);
        if (ret < 0) {
            failed++;
            if (!err.msg[0])
                fail_msg("allocation %ld failed without a sentence (%d)", k, ret);
        } else {
            assert_memory_equal(got, want, sizeof want);
        }
    }
    fprintf(stderr, "packed cold start: %ld allocations, %u failures reported\n", n, failed);
    assert_true(failed > 0);
}

static int call_fn(void *ctx)
{
    int *v = ctx;
    (*v)++;
    return *v == 1 ? 7 : -EIO;
}

static void test_device_call(void **st)
{
    (void)st;
    struct npu_device *d;
    struct sl_err err = {{0}};
    assert_int_equal(npu_device_create(&d), 0);
    int v = 0;
    struct npu_ticket *t;
    assert_int_equal(npu_device_call(d, call_fn, &v, &t, &err), 0);
    assert_int_equal(npu_ticket_wait(t), 7);
    assert_int_equal(npu_device_call(d, call_fn, &v, &t, &err), 0);
    assert_int_equal(npu_ticket_wait(t), -EIO);
    assert_int_equal(v, 2);
    assert_int_equal(npu_device_call(d, NULL, &v, &t, &err), -EINVAL);
    assert_true(err.msg[0] != 0);
    struct npu_device_stats ds;
    npu_device_stats(d, &ds);
    assert_int_equal(ds.jobs, 2);
    npu_device_destroy(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_call),
        cmocka_unit_test(test_same_logits),
        cmocka_unit_test(test_bitplane),
        cmocka_unit_test(test_int8_pool),
        cmocka_unit_test(test_int8_pool_reuse),
        cmocka_unit_test(test_slices_mapped),
        cmocka_unit_test(test_act_sets),
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_no_decode),
        cmocka_unit_test(test_packed_faults),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
