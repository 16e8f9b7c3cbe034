/* test_bench_spec_tasks.c: `sluice bench spec`'s task set and history stores
 * (bench_spec_tasks.c):
 * - every task names its passage; the kinds of one passage share it;
 * - a task's history: its kind's earlier outputs (per kind), the earlier
 *   outputs on other passages (shared), all earlier outputs (shared_all),
 *   each followed by -1, in task order; empty outputs and later tasks left
 *   out; none: nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_spec.h"
#include "testutil.h"

#define NT (BENCH_SPEC_KINDS * BENCH_SPEC_TASKS_PER_KIND)

static void test_passages(void **state)
{
    (void)state;
    uint32_t nl = (BENCH_SPEC_TASKS_PER_KIND + 1) * (BENCH_SPEC_PASSAGE_VERSES + 2) + 3;
    char **lines = calloc(nl, sizeof *lines);
    assert_non_null(lines);
    for (uint32_t i = 0; i < nl; i++) {
        lines[i] = malloc(64);
        assert_non_null(lines[i]);
        snprintf(lines[i], 64, "verse %u has these seven words in it", i);
    }
    struct bench_spec_task t[NT];
    uint32_t nt;
    assert_int_equal(bench_spec_make_tasks(lines, nl, t, &nt), 0);
    assert_int_equal(nt, NT);
    int seen[BENCH_SPEC_TASKS_PER_KIND][BENCH_SPEC_KINDS] = {{0}};
    for (uint32_t i = 0; i < nt; i++) {
        assert_true(t[i].passage >= 0 && t[i].passage < BENCH_SPEC_TASKS_PER_KIND);
        assert_int_equal(seen[t[i].passage][t[i].k]++, 0);
        /* the context kinds' prompts open with their passage's first verse */
        if (t[i].k < 3) {
            char first[64];
            snprintf(first, sizeof first, "verse %u ",
                     t[i].passage * (nl / (BENCH_SPEC_TASKS_PER_KIND + 1)));
            assert_true(!strncmp(t[i].prompt, first, strlen(first)));
        }
        free(t[i].prompt);
    }
    bench_spec_free_lines(lines, nl);
}

static void test_history(void **state)
{
    (void)state;
    /* 2 passages x 2 kinds, in task order: (p0,k0) (p0,k1) (p1,k0) (p1,k1) (p2,k0) */
    struct bench_spec_task t[5] = {{"a", 0, 0, NULL},
                                   {"b", 1, 0, NULL},
                                   {"a", 0, 1, NULL},
                                   {"b", 1, 1, NULL},
                                   {"a", 0, 2, NULL}};
    int o0[] = {10, 11}, o1[] = {20}, o2[] = {30, 31, 32}, o3[] = {0};
    int *outs[5] = {o0, o1, o2, o3, NULL};
    uint32_t n_outs[5] = {2, 1, 3, 0, 0}; /* task 3's output empty */
    int *h;
    uint32_t nh;
    /* task 3 (p1, k1): per kind = task 1's; shared = tasks 0, 1; all = 0, 1, 2 */
    assert_int_equal(bench_spec_history(t, outs, n_outs, 3, BENCH_SPEC_HIST_KIND, &h, &nh), 0);
    const int want_k[] = {20, -1};
    assert_int_equal(nh, 2);
    assert_memory_equal(h, want_k, sizeof want_k);
    free(h);
    assert_int_equal(bench_spec_history(t, outs, n_outs, 3, BENCH_SPEC_HIST_SHARED, &h, &nh), 0);
    const int want_s[] = {10, 11, -1, 20, -1};
    assert_int_equal(nh, 5);
    assert_memory_equal(h, want_s, sizeof want_s);
    free(h);
    assert_int_equal(bench_spec_history(t, outs, n_outs, 3, BENCH_SPEC_HIST_SHARED_ALL, &h, &nh),
                     0);
    const int want_a[] = {10, 11, -1, 20, -1, 30, 31, 32, -1};
    assert_int_equal(nh, 9);
    assert_memory_equal(h, want_a, sizeof want_a);
    free(h);
    /* task 4 (p2, k0): task 3's empty output adds nothing, not a lone -1 */
    assert_int_equal(bench_spec_history(t, outs, n_outs, 4, BENCH_SPEC_HIST_SHARED, &h, &nh), 0);
    const int want_4[] = {10, 11, -1, 20, -1, 30, 31, 32, -1};
    assert_int_equal(nh, 9);
    assert_memory_equal(h, want_4, sizeof want_4);
    free(h);
    /* task 1 (p0, k1): no earlier task on another passage; none: nothing */
    h = (int *)1;
    assert_int_equal(bench_spec_history(t, outs, n_outs, 1, BENCH_SPEC_HIST_SHARED, &h, &nh), 0);
    assert_true(h == NULL && nh == 0);
    h = (int *)1;
    nh = 7;
    assert_int_equal(bench_spec_history(t, outs, n_outs, 4, BENCH_SPEC_HIST_NONE, &h, &nh), 0);
    assert_true(h == NULL && nh == 0);
    /* the first task: nothing before it */
    assert_int_equal(bench_spec_history(t, outs, n_outs, 0, BENCH_SPEC_HIST_SHARED_ALL, &h, &nh),
                     0);
    assert_true(h == NULL && nh == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_passages),
        cmocka_unit_test(test_history),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
