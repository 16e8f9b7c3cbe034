/* fuzz_serve_req.c: libFuzzer target for the server's request parser
 * (tools/serve_req.c) and what follows it without a model (chat templates,
 * the error body). Any bytes must give a request or an error with a status
 * and a JSON body in OpenAI's shape, never a crash, hang or leak. Built with
 * -DSLUICE_FUZZ=ON (clang); fuzz_serve_driver.c replays it in ctest. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve_req.h"
#include "serve_text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct serve_limits lim = {.model_id = "m", .max_tokens = 256};
    for (int kind = 0; kind < 2; kind++) {
        struct serve_req r;
        struct serve_error e;
        if (serve_req_parse((enum serve_kind)kind, (const char *)data, size, &lim, &r, &e) == 0) {
            if ((kind == SERVE_CHAT) != (r.msgs != NULL) || (kind == SERVE_COMPLETIONS && !r.prompt))
                abort();
            if (r.max_tokens_set && (r.max_tokens < 1 || r.max_tokens > 256))
                abort();
            if (!(r.temperature >= 0 && r.temperature <= 2) || !(r.top_p >= 0 && r.top_p <= 1) ||
                r.n_stop > SERVE_MAX_STOP)
                abort();
            for (int t = 0; t < 4 && kind == SERVE_CHAT; t++) {
                const char *stop;
                free(serve_template_render((enum serve_template)t, r.msgs, r.n_msgs, &stop));
            }
            serve_req_free(&r);
        } else {
            if (e.status < 400 || e.status > 599 || !e.message[0])
                abort();
            free(serve_error_json(&e));
        }
    }
    return 0;
}
