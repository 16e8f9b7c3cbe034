/* test_pipeline.c: the cold-start pipeline computes exactly what the
 * sequential runtime computes. On a synthetic model quantized two ways
 * (dynamic activation scales; static scales from a calibration run through
 * the observer), for every policy, chunk sizes 16/64/256 and prompts shorter
 * than, equal to and longer than a chunk, and every load mode, the logits of
 * the last prompt position are bit-identical to infer_forward with
 * max_batch = chunk, and a decoding step after the pipeline matches too.
 * The trace is valid JSON with matching begin/end spans per track; a corrupt
 * slice fails the pipeline with a checksum error instead of wrong logits. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "infer.h"
#include "testutil.h"
#include "tiny_q5.h"

static char dyn_model[4096], static_model[4096], float_model[4096];

static int setup(void **st)
{
    (void)st;
    /* the dynamic-scale 5-bit model, and one with static activation scales
     * calibrated through the runtime's observer */
    if (tiny_q5_models(11, float_model, dyn_model) < 0)
        return -1;
    return tiny_q5_static_model(float_model, 99, static_model);
}

/* Pipeline vs infer_forward on `model`; returns 0 when bit-identical. */
static void check(const char *model, enum infer_policy pol, enum infer_load load, uint32_t chunk,
                  uint32_t n, const char *trace)
{
    struct sl_err err = {{0}};
    struct infer_model *m;
    struct infer_state *s;
    assert_int_equal(infer_model_load(model, NULL, &m, &err), 0);
    const struct format_config *c = infer_model_config(m);
    uint32_t V = c->vocab_size;
    int *ids = tiny_prompt(n, V, n * 7 + chunk);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    assert_int_equal(infer_state_create(m, chunk, &s, &err), 0);
    assert_int_equal(infer_forward(m, s, ids, n, 0, a, INFER_LOGITS_LAST, &err), 0);

    /* full and sequential_granular split matmuls and their weights' unpacking into
     * pieces: uneven ones (48 rounds to pieces of 48, 32 and 16 channels
     * here), 16-channel ones, and the default (512: one piece at this size) */
    struct infer_pipeline_opts o = {.policy = pol, .load = load, .chunk = chunk,
                                    .steal_threshold = 5, .steal_ahead = 1.0,
                                    .trace_path = trace,
                                    .split = chunk == 64 ? 48 : chunk == 16 ? 16 : 0};
    struct infer_model *pm;
    struct infer_state *ps;
    struct infer_pipeline_stats st;
    if (infer_pipeline_prefill(model, ids, n, &o, &pm, &ps, b, &st, &err) < 0)
        fail_msg("%s, policy %s, chunk %u, %u tokens: %s", model, infer_policy_name(pol), chunk,
                 n, err.msg);
    if (memcmp(a, b, sizeof(float) * V) != 0)
        fail_msg("%s, policy %s, load %d, chunk %u, %u tokens: logits differ", model,
                 infer_policy_name(pol), load, chunk, n);
    assert_true(st.bubble_npu >= 0 && st.bubble_npu <= 1 && st.bubble_cpu >= 0 &&
                st.bubble_cpu <= 1);
    assert_true(st.bytes_read > 0);
    assert_true(st.prefault_s >= 0 && (pol == INFER_POLICY_FULL || st.prefault_s == 0));
    if (pol == INFER_POLICY_FULL) { /* the other stealing rule, stealing at every chance;
                                     * no faulting in ahead; one activation set */
        struct infer_pipeline_opts o2 = o;
        o2.steal_top = 1;
        o2.steal_threshold = 0;
        o2.steal_ahead = 0;
        o2.no_prefault = 1;
        o2.act_sets = 1; /* one (layer, chunk) at a time */
        o2.trace_path = NULL;
        struct infer_model *m2;
        struct infer_state *s2;
        float *b2 = malloc(sizeof(float) * V);
        assert_non_null(b2);
        if (infer_pipeline_prefill(model, ids, n, &o2, &m2, &s2, b2, &st, &err) < 0)
            fail_msg("%s, steal_top, chunk %u, %u tokens: %s", model, chunk, n, err.msg);
        if (memcmp(a, b2, sizeof(float) * V) != 0)
            fail_msg("%s, steal_top, chunk %u, %u tokens: logits differ", model, chunk, n);
        assert_true(st.prefault_s == 0);
        infer_state_destroy(s2);
        infer_model_destroy(m2);
        free(b2);
    }
    /* one decoding step on each, from the same token */
    if (n < c->seq_len) {
        int t = 5;
        assert_int_equal(infer_forward(m, s, &t, 1, n, a, INFER_LOGITS_LAST, &err), 0);
        assert_int_equal(infer_forward(pm, ps, &t, 1, n, b, INFER_LOGITS_LAST, &err), 0);
        assert_memory_equal(a, b, sizeof(float) * V);
    }
    infer_state_destroy(ps);
    infer_model_destroy(pm);
    infer_state_destroy(s);
    infer_model_destroy(m);
    free(ids);
    free(a);
    free(b);
}

static void test_identical_dynamic(void **st)
{
    (void)st;
    static const uint32_t chunks[] = {16, 64, 256};
    static const uint32_t lens[] = {1, 15, 16, 17, 64, 200};
    for (int p = 0; p < INFER_POLICY_COUNT; p++)
        for (size_t c = 0; c < 3; c++)
            for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
                check(dyn_model, (enum infer_policy)p, INFER_LOAD_STREAM, chunks[c], lens[l], NULL);
}

static void test_identical_static(void **st)
{
    (void)st;
    for (int p = 0; p < INFER_POLICY_COUNT; p++) {
        check(static_model, (enum infer_policy)p, INFER_LOAD_STREAM, 64, 150, NULL);
        check(static_model, (enum infer_policy)p, INFER_LOAD_STREAM, 256, 40, NULL);
    }
}

static void test_load_modes_and_float(void **st)
{
    (void)st;
    check(static_model, INFER_POLICY_FULL, INFER_LOAD_READ, 64, 100, NULL);
    check(static_model, INFER_POLICY_SEQUENTIAL, INFER_LOAD_MMAP, 64, 100, NULL);
    check(static_model, INFER_POLICY_LAYER_OVERLAP, INFER_LOAD_READ, 32, 70, NULL);
    /* a float model: its matmuls run on the CPU workers */
    check(float_model, INFER_POLICY_FULL, INFER_LOAD_STREAM, 64, 100, NULL);
}

static void test_trace(void **st)
{
    (void)st;
    char trace[4200];
    snprintf(trace, sizeof trace, "%s/trace.json", test_tmpdir());
    check(static_model, INFER_POLICY_FULL, INFER_LOAD_STREAM, 32, 100, trace);
    char *text = test_read_file(trace, NULL);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    cJSON *ev = cJSON_GetObjectItem(j, "traceEvents");
    assert_true(cJSON_IsArray(ev));
    /* per track, every B is closed by an E of the same name, in order */
    int depth[256] = {0}, spans = 0, tasks = 0, with_cpu = 0, setup = 0;
    double setup_end = 0;
    char open_name[256][128];
    double open_ts[256], open_cpu[256]; /* a task's start and its thread's CPU time in it */
    cJSON *e;
    cJSON_ArrayForEach(e, ev)
    {
        const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring;
        if (!strcmp(ph, "M"))
            continue;
        int tid = (int)cJSON_GetObjectItem(e, "tid")->valuedouble;
        const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
        assert_true(tid >= 0 && tid < 256);
        if (!strcmp(ph, "B")) {
            assert_int_equal(depth[tid], 0); /* tasks on one track do not nest */
            const char *cat = cJSON_GetObjectItem(e, "cat")->valuestring;
            if (!strcmp(cat, "prefault")) /* the prefault thread's own track */
                assert_int_equal(tid, 99);
            if (!strcmp(cat, "setup")) {
                /* the driver's setup around the stream's start, on its own
                 * track: open, the embedding's prefix (the rows asked for),
                 * the stream's start, the graph and the rows read; back to
                 * back from the pipeline's start */
                static const char *const want[4] = {"open", "embedding prefix",
                                                    "stream start", "graph, embedding rows"};
                assert_int_equal(tid, 98);
                assert_true(setup < 4);
                assert_string_equal(name, want[setup]);
                assert_true(cJSON_GetObjectItem(e, "ts")->valuedouble == setup_end);
                setup++;
            }
            if (strcmp(cat, "load") && strcmp(cat, "prefault") && strcmp(cat, "setup")) {
                /* a task: its wait */
                cJSON *w = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "ready_wait_us");
                assert_true(cJSON_IsNumber(w) && w->valuedouble >= 0);
                cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "cpu_us");
                assert_true(cJSON_IsNumber(c) && c->valuedouble >= 0);
                open_cpu[tid] = c->valuedouble;
                with_cpu += c->valuedouble > 0;
                tasks++;
            } else {
                open_cpu[tid] = 0;
            }
            open_ts[tid] = cJSON_GetObjectItem(e, "ts")->valuedouble;
            snprintf(open_name[tid], sizeof open_name[tid], "%s", name);
            depth[tid]++;
        } else {
            assert_string_equal(ph, "E");
            assert_int_equal(depth[tid], 1);
            assert_string_equal(open_name[tid], name);
            /* the CPU time was read inside the span (1 us: the printed rounding;
             * 0.1%: the two clocks' rates, NTP slews the monotonic one) */
            double span = cJSON_GetObjectItem(e, "ts")->valuedouble - open_ts[tid];
            assert_true(open_cpu[tid] <= span * 1.001 + 1.0);
            if (tid == 98)
                setup_end = cJSON_GetObjectItem(e, "ts")->valuedouble;
            depth[tid]--;
            spans++;
        }
    }
    for (int i = 0; i < 256; i++)
        assert_int_equal(depth[i], 0);
    assert_true(spans > 50);
    assert_true(tasks > 0 && with_cpu > tasks / 2); /* the tasks' CPU times are there */
    assert_int_equal(setup, 4);
    cJSON *other = cJSON_GetObjectItem(j, "otherData");
    assert_non_null(cJSON_GetObjectItem(other, "bubble_npu"));
    cJSON_Delete(j);
    free(text);
}

static void test_corrupt(void **st)
{
    (void)st;
    size_t len;
    uint8_t *b = test_read_file(static_model, &len);
    struct format_reader *r;
    struct sl_err err;
    assert_int_equal(format_reader_open(static_model, &r, &err), 0);
    const struct format_slice_info *s = format_reader_slice(r, 1);
    b[s->offset + 100] ^= 1;
    format_reader_close(r);
    char bad[4200];
    snprintf(bad, sizeof bad, "%s/bad.sluice", test_tmpdir());
    FILE *f = fopen(bad, "wb");
    fwrite(b, 1, len, f);
    fclose(f);
    free(b);
    int *ids = tiny_prompt(40, 512, 1);
    float lg[512];
    struct infer_model *m = NULL;
    struct infer_state *ps = NULL;
    struct infer_pipeline_opts o = {.policy = INFER_POLICY_FULL, .chunk = 16};
    assert_true(infer_pipeline_prefill(bad, ids, 40, &o, &m, &ps, lg, NULL, &err) < 0);
    assert_non_null(strstr(err.msg, "checksum"));
    free(ids);
}

/* The stealing rules end to end: with the count threshold out of reach, the
 * CPU steals only under steal_ahead, and never without it; pieces of 16
 * channels are never cut (split stealing needs 32 on each side) nor leave a
 * tail (64 or more); with cutting off, neither happens. The logits stay
 * bit-identical throughout. Whether a rule fires in a given run depends on
 * timing, so the rules themselves are checked deterministically on a
 * synthetic queue (test_pipeline_steal.c); here only that stealing happens
 * at all: the prompt's Q/K/V tasks are ready together while the CPU worker
 * has nothing to run, and three runs without a single take would mean the
 * rules never fire (none missed in 30 runs of each mode, on a loaded
 * machine). One run per mode, no retries. */
static void test_steal_ahead(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct infer_model *m;
    struct infer_state *s;
    assert_int_equal(infer_model_load(static_model, NULL, &m, &err), 0);
    uint32_t V = infer_model_config(m)->vocab_size, n = 100;
    int *ids = tiny_prompt(n, V, 3);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(infer_state_create(m, 64, &s, &err), 0);
    assert_int_equal(infer_forward(m, s, ids, n, 0, a, INFER_LOGITS_LAST, &err), 0);
    /* modes: 0 threshold only; 1 steal-ahead, 16-channel pieces (too small
     * to cut); 2 steal-ahead, whole tensors; 3 the same without cutting */
    uint32_t stolen[4] = {0}, splits[4] = {0}, tails[4] = {0};
    for (int mode = 0; mode < 4; mode++) {
        struct infer_pipeline_opts o = {.policy = INFER_POLICY_FULL, .chunk = 64,
                                        .split = mode == 1 ? 16 : 4096,
                                        .steal_threshold = UINT32_MAX,
                                        .steal_ahead = mode ? 1.0 : 0.0,
                                        .no_steal_split = mode == 3};
        struct infer_model *pm;
        struct infer_state *ps;
        struct infer_pipeline_stats ps_st;
        if (infer_pipeline_prefill(static_model, ids, n, &o, &pm, &ps, b, &ps_st, &err) < 0)
            fail_msg("mode %d: %s", mode, err.msg);
        if (memcmp(a, b, sizeof(float) * V) != 0)
            fail_msg("mode %d: logits differ", mode);
        assert_true(ps_st.splits <= ps_st.stolen);
        stolen[mode] = ps_st.stolen;
        splits[mode] = ps_st.splits;
        tails[mode] = ps_st.tails;
        infer_state_destroy(ps);
        infer_model_destroy(pm);
    }
    fprintf(stderr, "stolen, splits, tails per mode: %u %u %u, %u %u %u, %u %u %u, %u %u %u\n",
            stolen[0], splits[0], tails[0], stolen[1], splits[1], tails[1], stolen[2], splits[2],
            tails[2], stolen[3], splits[3], tails[3]);
    assert_int_equal(stolen[0], 0);
    assert_int_equal(tails[0], 0);
    assert_int_equal(splits[1], 0);
    assert_int_equal(tails[1], 0);
    assert_int_equal(splits[3], 0);
    assert_int_equal(tails[3], 0);
    assert_true(stolen[1] + stolen[2] + stolen[3] > 0);
    infer_state_destroy(s);
    infer_model_destroy(m);
    free(ids);
    free(a);
    free(b);
}

/* The default number of CPU workers counts the CPUs the process may run on
 * (sl_cpu_count): a mask of one CPU gives 1, the original mask its size. */
static void test_cpu_count(void **st)
{
    (void)st;
    cpu_set_t orig, one;
    assert_int_equal(sched_getaffinity(0, sizeof orig, &orig), 0);
    assert_int_equal(sl_cpu_count(), CPU_COUNT(&orig));
    int first = 0;
    while (!CPU_ISSET(first, &orig))
        first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    long n = sl_cpu_count();
    assert_int_equal(sched_setaffinity(0, sizeof orig, &orig), 0);
    assert_int_equal(n, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identical_dynamic), cmocka_unit_test(test_identical_static),
        cmocka_unit_test(test_load_modes_and_float), cmocka_unit_test(test_trace),
        cmocka_unit_test(test_corrupt), cmocka_unit_test(test_steal_ahead),
        cmocka_unit_test(test_cpu_count),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
