/* import_gguf_cur.c: the GGUF importer's cursor over the mapped file:
 * little-endian integers, strings, values of every GGUF type (skipped or
 * read as an integer or a float), each checked against the file's end. */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "import_gguf_internal.h"

int qg_need(struct qg_cur *c, uint64_t n, const char *what)
{
    if (c->bad)
        return -1;
    if ((uint64_t)(c->end - c->p) < n) {
        sl_err_set(c->err, "%s: truncated GGUF file (while reading %s)", c->path, what);
        c->bad = 1;
        return -1;
    }
    return 0;
}

uint32_t qg_rd32(struct qg_cur *c, const char *what)
{
    if (qg_need(c, 4, what))
        return 0;
    uint32_t v = sl_load_le32(c->p);
    c->p += 4;
    return v;
}

uint64_t qg_rd64(struct qg_cur *c, const char *what)
{
    if (qg_need(c, 8, what))
        return 0;
    uint64_t v = sl_load_le64(c->p);
    c->p += 8;
    return v;
}

/* A string as (pointer, length) into the file. */
const char *qg_rdstr(struct qg_cur *c, uint64_t *len, const char *what)
{
    uint64_t n = qg_rd64(c, what);
    if (qg_need(c, n, what))
        return NULL;
    const char *s = (const char *)c->p;
    c->p += n;
    *len = n;
    return s;
}

static uint64_t scalar_size(uint32_t t)
{
    static const uint8_t sz[GGUF_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < GGUF_NTYPES ? sz[t] : 0;
}

int qg_skip_value(struct qg_cur *c, uint32_t type, int depth)
{
    if (type == GGUF_STRING) {
        uint64_t n;
        return qg_rdstr(c, &n, "a string value") ? 0 : -1;
    }
    if (type == GGUF_ARRAY) {
        if (depth > 4) {
            sl_err_set(c->err, "%s: GGUF arrays nested too deeply", c->path);
            return -1;
        }
        uint32_t et = qg_rd32(c, "an array type");
        uint64_t n = qg_rd64(c, "an array length");
        if (c->bad)
            return -1;
        uint64_t es = scalar_size(et);
        if (es) {
            if (n > UINT64_MAX / es) {
                sl_err_set(c->err, "%s: truncated GGUF file (an array of %" PRIu64 " values)",
                           c->path, n);
                return c->bad = 1, -1;
            }
            if (qg_need(c, n * es, "an array"))
                return -1;
            c->p += n * es;
            return 0;
        }
        for (uint64_t i = 0; i < n; i++)
            if (qg_skip_value(c, et, depth + 1))
                return -1;
        return 0;
    }
    uint64_t s = scalar_size(type);
    if (!s) {
        sl_err_set(c->err, "%s: unknown GGUF value type %u", c->path, type);
        return c->bad = 1, -1;
    }
    if (qg_need(c, s, "a value"))
        return -1;
    c->p += s;
    return 0;
}

/* Reads an integer of any GGUF integer type. */
int qg_rd_int(struct qg_cur *c, uint32_t type, uint64_t *v)
{
    switch (type) {
    case GGUF_U8:
    case GGUF_I8:
    case GGUF_BOOL:
        if (qg_need(c, 1, "an integer"))
            return -1;
        *v = type == GGUF_I8 ? (uint64_t)(int64_t)(int8_t)c->p[0] : c->p[0];
        c->p += 1;
        return 0;
    case GGUF_U16:
    case GGUF_I16:
        if (qg_need(c, 2, "an integer"))
            return -1;
        *v = sl_load_le16(c->p);
        c->p += 2;
        return 0;
    case GGUF_U32:
    case GGUF_I32:
        *v = qg_rd32(c, "an integer");
        return c->bad ? -1 : 0;
    case GGUF_U64:
    case GGUF_I64:
        *v = qg_rd64(c, "an integer");
        return c->bad ? -1 : 0;
    default:
        return 1; /* not an integer */
    }
}

int qg_rd_float(struct qg_cur *c, uint32_t type, double *v)
{
    if (type == GGUF_F32) {
        if (qg_need(c, 4, "a float"))
            return -1;
        *v = sl_load_lef32(c->p);
        c->p += 4;
        return 0;
    }
    if (type == GGUF_F64) {
        uint64_t u = qg_rd64(c, "a float");
        memcpy(v, &u, 8);
        return c->bad ? -1 : 0;
    }
    return 1;
}

int qg_key_is(const char *k, uint64_t n, const char *want)
{
    return strlen(want) == n && !memcmp(k, want, n);
}
