/* tiny_q5.c: the shared small models and prompts of the infer tests (tiny_q5.h). */
#include <stdio.h>
#include <stdlib.h>

#include "import.h"
#include "infer.h"
#include "quantizer.h"
#include "testutil.h"
#include "tiny_q5.h"

/* 5-bit EdgeFlow, tensor budget, adaptive encoding */
static const struct quantizer_opts q5_opts = {.method = QUANTIZER_METHOD_EDGEFLOW, .bits = 5,
                                              .budget = QUANTIZER_BUDGET_TENSOR, .alpha = -1,
                                              .encoding = FORMAT_ENC_ADAPTIVE};

int tiny_q5_models(uint32_t seed, char float_model[4096], char q_model[4096])
{
    const char *dir = test_tmpdir();
    struct sl_err err = {{0}};
    snprintf(float_model, 4096, "%s/tiny.sluice", dir);
    snprintf(q_model, 4096, "%s/tiny-q5.sluice", dir);
    if (import_synth("tiny", seed, float_model, NULL, NULL, &err) < 0 ||
        quantizer_quantize(float_model, NULL, &q5_opts, q_model, NULL, &err) < 0) {
        fprintf(stderr, "tiny models: %s\n", err.msg);
        return -1;
    }
    return 0;
}

int *tiny_prompt(uint32_t n, uint32_t vocab, uint32_t salt)
{
    int *ids = malloc(sizeof(int) * (n ? n : 1));
    for (uint32_t i = 0; ids && i < n; i++)
        ids[i] = i == 0 ? 1 : 3 + (int)((i * 2654435761u + salt) % (vocab - 3));
    return ids;
}

int tiny_q5_static_model(const char *float_model, uint32_t salt, char static_model[4096])
{
    struct sl_err err = {{0}};
    snprintf(static_model, 4096, "%s/tiny-q5-static.sluice", test_tmpdir());
    struct infer_model *m;
    struct infer_state *s = NULL;
    struct quantizer_calib *calib = NULL;
    if (infer_model_load(float_model, NULL, &m, &err) < 0) {
        fprintf(stderr, "tiny static model: %s\n", err.msg);
        return -1;
    }
    const struct format_config *c = infer_model_config(m);
    int ret = quantizer_calib_create(c, 64, &calib);
    if (ret == 0) {
        infer_model_set_observer(m, quantizer_calib_observe, calib);
        ret = infer_state_create(m, 256, &s, &err);
    }
    int *ids = tiny_prompt(200, c->vocab_size, salt);
    float *lg = malloc(sizeof(float) * c->vocab_size);
    if (ret == 0)
        ret = ids && lg ? infer_forward(m, s, ids, 200, 0, lg, INFER_LOGITS_LAST, &err) : -1;
    free(lg);
    free(ids);
    if (s)
        infer_state_destroy(s);
    infer_model_destroy(m);
    if (ret == 0)
        ret = quantizer_quantize(float_model, calib, &q5_opts, static_model, NULL, &err);
    if (calib)
        quantizer_calib_destroy(calib);
    if (ret < 0)
        fprintf(stderr, "tiny static model: %s\n", err.msg[0] ? err.msg : "out of memory");
    return ret < 0 ? -1 : 0;
}

/* A packed-resident session of model (its int8 copies dropped). */
struct infer_session *tiny_packed_session(const char *model, int no_npu)
{
    struct sl_err err = {{0}};
    struct infer_session_opts so = {.max_batch = 32, .npu_min_weights = 1, .no_npu = no_npu};
    struct infer_pipeline_opts po;
    infer_pipeline_opts_init(&po);
    po.chunk = 32;
    po.resident = INFER_RESIDENT_PACKED;
    int p[8] = {1, 5, 9, 12, 40, 41, 7, 3};
    struct infer_session *s;
    if (infer_session_cold_start(model, p, 8, &so, &po, &s, NULL, &err) < 0)
        fail_msg("cold start: %s", err.msg);
    infer_session_drop_int8(s);
    return s;
}
