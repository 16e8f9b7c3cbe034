/* test_pipeline_faults.c: every allocation of a prefill may fail, and each
 * failure is clean. A small prefill is run once counting its allocations
 * (N, through common.h's fault seam); then for every k in 1..N the k-th
 * allocation fails: infer_pipeline_prefill must return a negative errno with
 * a message, within a watchdog's time (a lost task or a missed wake-up would
 * hang), and leak nothing (LeakSanitizer, in the ASan build, where this test
 * runs too: label unit); or, where a fallback absorbs the failure (the
 * loader reads with a pread pool where io_uring cannot be set up), give the
 * same logits. The threads allocate concurrently, so which allocation is
 * the k-th can differ between runs: a run that made fewer than k
 * allocations must succeed instead. Configurations: full (pieces, prepared
 * weights, prefault, stealing), sequential with the file read whole, and a
 * float model (matmuls on the CPU). Every k is tried: a few hundred tiny
 * prefills, well under a second (seconds under ASan). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "import.h"
#include "infer.h"
#include "quantizer.h"
#include "testutil.h"
#include "tiny_q5.h"

#define WATCHDOG_S 20

/* q_model: dynamic activation scales (no trimmed last layer); s_model:
 * static ones, so the last layer is trimmed and its one-row products (and
 * the classifier's) run from the packed codes with packed residency */
static char q_model[4096], f_model[4096], s_model[4096];
static long current_k; /* for the watchdog's message */

static void watchdog(int sig)
{
    (void)sig;
    char msg[96];
    int n = snprintf(msg, sizeof msg, "watchdog: prefill hung with allocation %ld failing\n",
                     current_k);
    if (write(2, msg, (size_t)n) < 0)
        _exit(2);
    _exit(1);
}

static int setup(void **st)
{
    (void)st;
    const char *dir = test_tmpdir();
    struct sl_err err;
    snprintf(f_model, sizeof f_model, "%s/tiny.sluice", dir);
    snprintf(q_model, sizeof q_model, "%s/tiny-q.sluice", dir);
    if (import_synth("tiny", 5, f_model, NULL, NULL, &err) < 0)
        return -1;
    struct quantizer_opts o = {.method = QUANTIZER_METHOD_EDGEFLOW, .bits = 5,
                               .budget = QUANTIZER_BUDGET_TENSOR, .alpha = -1,
                               .encoding = FORMAT_ENC_ADAPTIVE};
    if (quantizer_quantize(f_model, NULL, &o, q_model, NULL, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    if (tiny_q5_static_model(f_model, 5, s_model) < 0)
        return -1;
    struct sigaction sa = {.sa_handler = watchdog};
    return sigaction(SIGALRM, &sa, NULL);
}

/* One prefill with allocation k failing (k < 0: none, counting). Returns
 * the allocations counted; *ret the prefill's result. */
static long run(const char *model, const struct infer_pipeline_opts *o, long k, int *ret,
                float *logits, struct sl_err *err)
{
    static const int ids[] = {1, 7, 300, 41, 5, 99, 12, 250, 3, 17, 18, 60, 61, 62, 400, 8,
                              9, 10, 11, 200, 201, 33, 34, 35, 36, 37, 38, 39, 40, 42, 43, 44,
                              45, 46, 47, 48, 49, 50, 51, 52};
    struct infer_model *m = NULL;
    struct infer_state *s = NULL;
    memset(err, 0, sizeof *err);
    current_k = k;
    alarm(WATCHDOG_S);
    sl_fault_alloc_arm(k);
    *ret = infer_pipeline_prefill(model, ids, sizeof ids / sizeof ids[0], o, &m, &s, logits,
                                  NULL, err);
    long seen = sl_fault_alloc_count();
    sl_fault_alloc_arm(0);
    alarm(0);
    if (*ret == 0) {
        infer_state_destroy(s);
        infer_model_destroy(m);
    }
    return seen;
}

static void sweep(const char *model, const struct infer_pipeline_opts *o, const char *what)
{
    struct sl_err err;
    int ret;
    float want[512], got[512]; /* the tiny models' vocabulary */
    long n = run(model, o, -1, &ret, want, &err);
    if (ret < 0)
        fail_msg("%s: the prefill fails without a fault: %s", what, err.msg);
    assert_true(n > 0);
    long failed = 0, absorbed = 0, bad = 0;
    for (long k = 1; k <= n; k++) {
        long seen = run(model, o, k, &ret, got, &err);
        if (seen > n) /* a run with more (stealing varies): up to its last */
            n = seen;
        if (seen < k) { /* this run made fewer allocations: none failed */
            if (ret < 0 && ++bad)
                fprintf(stderr, "%s: no allocation failed, yet: %s\n", what, err.msg);
            continue;
        }
        failed++;
        /* a failure a fallback absorbs (the loader reads with a pread pool
         * where io_uring cannot be set up) must leave the logits unchanged */
        if (ret == 0 && !memcmp(want, got, sizeof want))
            absorbed++;
        else if (ret >= 0 && ++bad)
            fprintf(stderr, "%s: allocation %ld of %ld failed, and the logits differ\n", what,
                    k, n);
        else if (!err.msg[0] && ++bad)
            fprintf(stderr, "%s: allocation %ld of %ld failed with %d and no message\n", what,
                    k, n, ret);
    }
    fprintf(stderr, "%s: %ld allocations, %ld failures injected, %ld absorbed, %ld not clean\n",
            what, n, failed, absorbed, bad);
    assert_int_equal(bad, 0);
    assert_true(failed > 0);
}

/* The seam itself: the k-th allocation fails once, counting goes on. */
static void test_seam(void **st)
{
    (void)st;
    sl_fault_alloc_arm(2);
    void *a = sl_malloc(8), *b = sl_calloc(1, 8), *c = sl_realloc(NULL, 8);
    char *d = sl_strdup("x");
    void *e = sl_alloc_aligned(8, 64);
    assert_int_equal(sl_fault_alloc_count(), 5); /* sl_strdup is one */
    sl_fault_alloc_arm(0);
    assert_non_null(a);
    assert_null(b);
    assert_non_null(c);
    assert_non_null(d);
    assert_non_null(e);
    free(a);
    free(c);
    free(d);
    sl_free_aligned(e);
    sl_fault_alloc_arm(-1);
    e = sl_alloc_aligned(8, 64);
    assert_non_null(e);
    assert_int_equal(sl_fault_alloc_count(), 1);
    sl_fault_alloc_arm(0);
    sl_free_aligned(e);
    assert_int_equal(sl_fault_alloc_count(), 0);
}

static void test_full(void **st)
{
    (void)st;
    struct infer_pipeline_opts o = {.policy = INFER_POLICY_FULL, .chunk = 16, .split = 16,
                                    .steal_threshold = 5, .steal_ahead = 1.0};
    sweep(q_model, &o, "full");
}

static void test_sequential_read(void **st)
{
    (void)st;
    struct infer_pipeline_opts o = {.policy = INFER_POLICY_SEQUENTIAL, .load = INFER_LOAD_READ,
                                    .chunk = 64};
    sweep(q_model, &o, "sequential, read whole");
}

static void test_float(void **st)
{
    (void)st;
    struct infer_pipeline_opts o = {.policy = INFER_POLICY_FULL, .chunk = 32};
    sweep(f_model, &o, "float");
}

/* The trimmed last layer, each residency, two policies, mapped or read. */
static void test_trimmed(void **st)
{
    (void)st;
    static const struct {
        enum infer_policy policy;
        enum infer_resident resident;
        int slices_read;
        const char *what;
    } cf[] = {
        {INFER_POLICY_FULL, INFER_RESIDENT_PACKED, 0, "trimmed, packed"},
        {INFER_POLICY_FULL, INFER_RESIDENT_PACKED, 1, "trimmed, packed, slices read"},
        {INFER_POLICY_FULL, INFER_RESIDENT_INT8, 0, "trimmed, int8"},
        {INFER_POLICY_SEQUENTIAL_GRANULAR, INFER_RESIDENT_INT8, 0, "trimmed, int8, granular"},
    };
    for (size_t i = 0; i < sizeof cf / sizeof cf[0]; i++) {
        struct infer_pipeline_opts o = {.policy = cf[i].policy, .chunk = 16, .split = 16,
                                        .steal_threshold = 5, .steal_ahead = 1.0,
                                        .resident = cf[i].resident,
                                        .slices_read = cf[i].slices_read};
        sweep(s_model, &o, cf[i].what);
    }
}

/* The caller's open reader (infer_pipeline_opts.reader): no run opens the
 * container again, whichever allocation fails; every failure leaves the
 * caller's reader open and the model's hold released (LeakSanitizer: the
 * reader is freed by the caller's close alone). */
static void test_shared_reader(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct format_reader *r;
    assert_int_equal(format_reader_open(q_model, &r, &err), 0);
    uint64_t opens = format_reader_opens();
    struct infer_pipeline_opts o = {.policy = INFER_POLICY_FULL, .chunk = 16, .split = 16,
                                    .steal_threshold = 5, .steal_ahead = 1.0, .reader = r};
    sweep(q_model, &o, "full, the caller's reader");
    assert_true(format_reader_opens() == opens);
    assert_int_equal(format_reader_config(r)->vocab_size, 512); /* still the caller's */
    format_reader_close(r);
}

/* The prompt's embedding rows fail to read (the file cut inside the
 * embedding table after the caller's reader was opened on it): the prefill
 * fails with the rows' own error, no logits, and the caller's reader stays
 * open. */
static void test_embed_read_fails(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    const char *cut = test_tmp_path("tiny-q-cut.sluice");
    assert_int_equal(test_system("cp '%s' '%s'", q_model, cut), 0);
    struct format_reader *r;
    assert_int_equal(format_reader_open(cut, &r, &err), 0);
    int ti = format_reader_find(r, -1, FORMAT_ROLE_TOK_EMBD);
    assert_true(ti >= 0);
    const struct format_tensor_info *t = format_reader_tensor(r, (uint32_t)ti);
    /* the rows of tokens 300 and 400 (of 512) past the end */
    assert_int_equal(truncate(cut, (off_t)(t->offset + t->length / 2)), 0);
    struct infer_pipeline_opts o = {.policy = INFER_POLICY_FULL, .chunk = 16, .split = 16,
                                    .steal_threshold = 5, .steal_ahead = 1.0, .reader = r};
    float logits[512];
    int ret;
    run(cut, &o, -1, &ret, logits, &err);
    assert_true(ret < 0);
    if (!strstr(err.msg, "embedding rows"))
        fail_msg("the cut embedding table's error: %s", err.msg);
    assert_int_equal(format_reader_config(r)->vocab_size, 512); /* still the caller's */
    format_reader_close(r);
    unlink(cut);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seam),
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_sequential_read),
        cmocka_unit_test(test_float),
        cmocka_unit_test(test_trimmed),
        cmocka_unit_test(test_shared_reader),
        cmocka_unit_test(test_embed_read_fails),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
