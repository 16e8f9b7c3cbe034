/* serve_text.h: text rules of the server and chat, pure functions: where a
 * stop sequence ends a reply, how much of a growing reply may be sent
 * (nothing that could start a stop sequence, no partial UTF-8 character),
 * and chat messages to one prompt text (the model's chat template where
 * one is recognized, else a plain transcript). */
#ifndef SLUICE_SERVE_TEXT_H
#define SLUICE_SERVE_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "serve_req.h"

/* Scans text[0..len), of which [0..sent) was sent already, for the stop
 * sequences stop[0..n). Returns 1 with *cut at the start of the first one
 * found (at or after sent), else 0 with *safe (>= sent) the end of what may
 * be sent now: text a later token could turn into a stop sequence, and an
 * unfinished UTF-8 character at the end, are held back. */
int serve_stop_scan(char *const *stop, uint32_t n, const char *text, size_t len, size_t sent,
                    size_t *cut, size_t *safe);

/* Chat templates recognized in a GGUF's tokenizer.chat_template (the Jinja
 * source is matched by its markers, not executed). */
enum serve_template {
    SERVE_TPL_TRANSCRIPT = 0, /* "System: ...\nUser: ...\nAssistant: ...\n" */
    SERVE_TPL_CHATML,         /* <|im_start|>role\n...<|im_end|>\n */
    SERVE_TPL_LLAMA2,         /* [INST] <<SYS>>...<</SYS>> ... [/INST] ... */
    SERVE_TPL_LLAMA3,         /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
};

enum serve_template serve_template_detect(const char *jinja); /* NULL: transcript */
const char *serve_template_name(enum serve_template t);

/* The prompt for messages m[0..n) followed by the assistant's turn
 * (malloc'ed, NULL when out of memory); *stop (static) receives the
 * sequence that ends an assistant turn in this template. The BOS token is
 * the tokenizer's, not part of the text. */
char *serve_template_render(enum serve_template t, const struct serve_msg *m, uint32_t n,
                            const char **stop);

#endif
