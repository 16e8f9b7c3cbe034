/* testfmt.c: container helpers shared by the tests (testfmt.h). */
#include "testfmt.h"

#include <stdlib.h>

#include "testutil.h"

float *test_tensor_f32(struct format_reader *r, int layer, uint32_t role, uint64_t *n,
                       const struct format_tensor_info **info)
{
    int i = format_reader_find(r, layer, role);
    if (i < 0)
        fail_msg("no tensor of role %u in layer %d", role, layer);
    const struct format_tensor_info *t = format_reader_tensor(r, (uint32_t)i);
    void *raw = malloc(t->length);
    assert_non_null(raw);
    struct sl_err err;
    if (format_reader_read_tensor(r, (uint32_t)i, raw, t->length, &err) < 0)
        fail_msg("reading %s: %s", t->name, err.msg);
    *n = format_tensor_numel(t);
    float *f = malloc(sizeof(float) * (*n ? *n : 1));
    assert_non_null(f);
    if (format_decode_float(t->encoding, raw, f, *n) != 0)
        fail_msg("%s: encoding %u is not a float one", t->name, t->encoding);
    free(raw);
    if (info)
        *info = t;
    return f;
}
