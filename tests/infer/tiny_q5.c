/* tiny_q5.c: the shared small models of the infer tests (tiny_q5.h). */
#include <stdio.h>

#include "import.h"
#include "quantizer.h"
#include "testutil.h"
#include "tiny_q5.h"

int tiny_q5_models(uint32_t seed, char float_model[4096], char q_model[4096])
{
    const char *dir = test_tmpdir();
    struct sl_err err = {{0}};
    snprintf(float_model, 4096, "%s/tiny.sluice", dir);
    snprintf(q_model, 4096, "%s/tiny-q5.sluice", dir);
    struct quantizer_opts o = {.method = QUANTIZER_METHOD_EDGEFLOW, .bits = 5,
                               .budget = QUANTIZER_BUDGET_TENSOR, .alpha = -1,
                               .encoding = FORMAT_ENC_ADAPTIVE};
    if (import_synth("tiny", seed, float_model, NULL, NULL, &err) < 0 ||
        quantizer_quantize(float_model, NULL, &o, q_model, NULL, &err) < 0) {
        fprintf(stderr, "tiny models: %s\n", err.msg);
        return -1;
    }
    return 0;
}
