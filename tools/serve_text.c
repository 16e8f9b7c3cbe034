/* serve_text.c: stop sequences, UTF-8 hold-back and chat templates (see
 * serve_text.h). */
#include <stdlib.h>
#include <string.h>

#include "serve_text.h"

/* Bytes at the end of s[0..len) that start a UTF-8 character not yet
 * complete (0..3). */
static size_t utf8_partial(const char *s, size_t len)
{
    for (size_t back = 1; back <= 4 && back <= len; back++) {
        unsigned char c = (unsigned char)s[len - back];
        if ((c & 0xC0) == 0x80)
            continue; /* a continuation byte: look further back */
        size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                                  : (c & 0xF8) == 0xF0 ? 4 : 1;
        return need > back ? back : 0;
    }
    return 0; /* only continuation bytes: invalid anyway, send them */
}

int serve_stop_scan(char *const *stop, uint32_t n, const char *text, size_t len, size_t sent,
                    size_t *cut, size_t *safe)
{
    size_t best = len + 1;
    for (uint32_t i = 0; i < n; i++) {
        size_t sl = strlen(stop[i]);
        if (!sl || len - sent < sl)
            continue;
        const char *p = memmem(text + sent, len - sent, stop[i], sl);
        if (p && (size_t)(p - text) < best)
            best = (size_t)(p - text);
    }
    if (best <= len) {
        *cut = best;
        return 1;
    }
    size_t hold = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t sl = strlen(stop[i]);
        for (size_t k = sl - 1; k > hold && k >= 1; k--)
            if (k <= len - sent && !memcmp(text + len - k, stop[i], k)) {
                hold = k;
                break;
            }
    }
    size_t end = len - hold;
    end -= utf8_partial(text, end);
    *safe = end > sent ? end : sent;
    return 0;
}

enum serve_template serve_template_detect(const char *jinja)
{
    if (!jinja)
        return SERVE_TPL_TRANSCRIPT;
    if (strstr(jinja, "<|im_start|>"))
        return SERVE_TPL_CHATML;
    if (strstr(jinja, "<|start_header_id|>"))
        return SERVE_TPL_LLAMA3;
    if (strstr(jinja, "[INST]"))
        return SERVE_TPL_LLAMA2;
    return SERVE_TPL_TRANSCRIPT;
}

const char *serve_template_name(enum serve_template t)
{
    static const char *const names[] = {"transcript", "chatml", "llama2", "llama3"};
    return (unsigned)t < 4 ? names[t] : "?";
}

struct buf {
    char *s;
    size_t len, cap;
    int failed;
};

static void put(struct buf *b, const char *s)
{
    size_t n = strlen(s);
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n + 1);
    b->len += n;
}

static const char *title(const char *role)
{
    return !strcmp(role, "system") ? "System" : !strcmp(role, "user") ? "User" : "Assistant";
}

char *serve_template_render(enum serve_template t, const struct serve_msg *m, uint32_t n,
                            const char **stop)
{
    struct buf b = {0};
    put(&b, "");
    switch (t) {
    case SERVE_TPL_CHATML:
        for (uint32_t i = 0; i < n; i++) {
            put(&b, "<|im_start|>");
            put(&b, m[i].role);
            put(&b, "\n");
            put(&b, m[i].content);
            put(&b, "<|im_end|>\n");
        }
        put(&b, "<|im_start|>assistant\n");
        *stop = "<|im_end|>";
        break;
    case SERVE_TPL_LLAMA3:
        for (uint32_t i = 0; i < n; i++) {
            put(&b, "<|start_header_id|>");
            put(&b, m[i].role);
            put(&b, "<|end_header_id|>\n\n");
            put(&b, m[i].content);
            put(&b, "<|eot_id|>");
        }
        put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        *stop = "<|eot_id|>";
        break;
    case SERVE_TPL_LLAMA2: {
        /* a system message folds into the first user turn */
        const char *sys = n && !strcmp(m[0].role, "system") ? m[0].content : NULL;
        int open = 0;
        for (uint32_t i = sys ? 1 : 0; i < n; i++) {
            if (!strcmp(m[i].role, "assistant")) {
                put(&b, " ");
                put(&b, m[i].content);
                put(&b, " ");
                open = 0;
                continue;
            }
            put(&b, "[INST] ");
            if (sys) {
                put(&b, "<<SYS>>\n");
                put(&b, sys);
                put(&b, "\n<</SYS>>\n\n");
                sys = NULL;
            }
            put(&b, m[i].content);
            put(&b, " [/INST]");
            open = 1;
        }
        if (!open)
            put(&b, "[INST]  [/INST]");
        *stop = "[INST]";
        break;
    }
    default:
        for (uint32_t i = 0; i < n; i++) {
            put(&b, title(m[i].role));
            put(&b, ": ");
            put(&b, m[i].content);
            put(&b, "\n");
        }
        put(&b, "Assistant:");
        *stop = "\nUser:";
        break;
    }
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
