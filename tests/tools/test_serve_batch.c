/* test_serve_batch.c: the server's continuous batching (tools/serve_batch.c)
 * without HTTP. Eight threads, each with a session over one tiny model,
 * hand prompts of different lengths (one longer than a chunk) and decode
 * steps to the batch, joining and leaving at different times, with one and
 * with two lanes; every session's logits after every step must equal a
 * session run alone, bit for bit, and passes of several sessions must have
 * happened. A step past its session's context fails that session alone.
 * The threads all join before any hands a step in (a barrier), but whether
 * two steps meet within the gather time is up to the scheduler: on a loaded
 * machine a run may have none, so the scenario runs up to ATTEMPTS times
 * until one has passes of several sessions (every run checks the logits). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "infer.h"
#include "serve_batch.h"
#include "testutil.h"

#define THREADS 8
#define STEPS 12
#define ATTEMPTS 5

static char model_path[4096];
static struct infer_model *model;

static int setup(void **st)
{
    (void)st;
    struct sl_err err;
    snprintf(model_path, sizeof model_path, "%s/tiny.sluice", test_tmpdir());
    if (import_synth("tiny", 3, model_path, NULL, NULL, &err) < 0 ||
        infer_model_load(model_path, NULL, &model, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    infer_model_destroy(model);
    return 0;
}

struct worker {
    int id, errors;
    struct serve_batch *b;
    pthread_barrier_t *joined;
    uint32_t chunk;
    char msg[256];
};

static void *worker_main(void *p)
{
    struct worker *w = p;
    const struct format_config *c = infer_model_config(model);
    uint32_t V = c->vocab_size, plen = 1 + (uint32_t)w->id * 5;
    if (w->id == THREADS - 1)
        plen = w->chunk + 7; /* more than one chunk */
    int *prompt = malloc(sizeof(int) * plen);
    for (uint32_t j = 0; j < plen; j++)
        prompt[j] = j == 0 ? 1 : 3 + (int)((j * 2654435761u + (uint32_t)w->id) % (V - 3));
    struct infer_session_opts so = {.max_batch = w->chunk, .no_npu = 1};
    struct infer_session *s, *ref;
    struct sl_err err = {{0}};
    if (infer_session_create(model, &so, &s, &err) < 0 ||
        infer_session_create(model, &so, &ref, &err) < 0) {
        snprintf(w->msg, sizeof w->msg, "%s", err.msg);
        w->errors++;
        free(prompt);
        return NULL;
    }
    serve_batch_join(w->b);
    pthread_barrier_wait(w->joined);
    int ret = serve_batch_run(w->b, s, prompt, plen, 0, &err);
    if (ret == 0)
        ret = infer_session_prefill(ref, prompt, plen, &err);
    for (int k = 0; ret == 0; k++) {
        if (memcmp(infer_session_logits(s), infer_session_logits(ref), sizeof(float) * V)) {
            snprintf(w->msg, sizeof w->msg, "thread %d: logits differ after %d steps", w->id, k);
            w->errors++;
            break;
        }
        if (k == STEPS - w->id % 3) /* threads leave at different times */
            break;
        int tok = 3 + (int)(((uint32_t)k * 40503u + (uint32_t)w->id * 7u) % (V - 3));
        ret = serve_batch_run(w->b, s, &tok, 1, 1, &err);
        if (ret == 0)
            ret = infer_session_step(ref, tok, &err);
    }
    if (ret < 0) {
        snprintf(w->msg, sizeof w->msg, "thread %d: %s", w->id, err.msg);
        w->errors++;
    }
    serve_batch_leave(w->b);
    infer_session_destroy(s);
    infer_session_destroy(ref);
    free(prompt);
    return NULL;
}

/* One run of the scenario: 0 when every session's logits matched; the
 * batch's statistics in *st. */
static int run_once(uint32_t lanes, struct serve_batch_stats *st)
{
    const uint32_t chunk = 16;
    struct serve_batch *b;
    struct sl_err err = {{0}};
    assert_int_equal(serve_batch_create(model, THREADS, chunk, lanes, 0, &b, &err), 0);
    pthread_barrier_t joined;
    assert_int_equal(pthread_barrier_init(&joined, NULL, THREADS), 0);
    pthread_t th[THREADS];
    struct worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker){.id = i, .b = b, .joined = &joined, .chunk = chunk};
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    int errors = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        if (w[i].errors)
            fprintf(stderr, "%s\n", w[i].msg);
        errors += w[i].errors;
    }
    pthread_barrier_destroy(&joined);
    serve_batch_stats(b, st);
    printf("  %u lane(s): %llu passes, %llu rows, %llu of several sessions\n", lanes,
           (unsigned long long)st->steps, (unsigned long long)st->rows,
           (unsigned long long)st->multi_steps);
    serve_batch_destroy(b);
    return errors;
}

static void run_threads(uint32_t lanes)
{
    struct serve_batch_stats st = {0};
    for (int a = 0; a < ATTEMPTS && st.multi_steps == 0; a++)
        assert_int_equal(run_once(lanes, &st), 0);
    assert_true(st.multi_steps > 0 && st.rows > st.steps);
}

static void test_one_lane(void **st)
{
    (void)st;
    run_threads(1);
}

static void test_two_lanes(void **st)
{
    (void)st;
    run_threads(2);
}

/* A step past the context fails its own session, and the batch serves on. */
static void test_past_context(void **st)
{
    (void)st;
    const struct format_config *c = infer_model_config(model);
    struct serve_batch *b;
    struct sl_err err = {{0}};
    assert_int_equal(serve_batch_create(model, 2, c->seq_len, 1, 0, &b, &err), 0);
    struct infer_session_opts so = {.no_npu = 1};
    struct infer_session *s;
    assert_int_equal(infer_session_create(model, &so, &s, &err), 0);
    int *toks = calloc(c->seq_len + 1, sizeof(int));
    assert_non_null(toks);
    for (uint32_t i = 0; i <= c->seq_len; i++)
        toks[i] = 3 + (int)(i % 50);
    serve_batch_join(b);
    assert_int_equal(serve_batch_run(b, s, toks, 3, 0, &err), 0);
    err.msg[0] = 0;
    assert_int_equal(serve_batch_run(b, s, toks, c->seq_len - 1, 0, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "context"));
    assert_int_equal(infer_session_len(s), 3);
    assert_int_equal(serve_batch_run(b, s, toks, 2, 0, &err), 0);
    assert_int_equal(infer_session_len(s), 5);
    serve_batch_leave(b);
    free(toks);
    infer_session_destroy(s);
    serve_batch_destroy(b);
    serve_batch_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_lane),
        cmocka_unit_test(test_two_lanes),
        cmocka_unit_test(test_past_context),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
