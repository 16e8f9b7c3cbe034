/* tools_shadow.c: see tools_shadow.h. */
#include "tools_shadow.h"

#include <errno.h>
#include <string.h>

int tools_shadow_parse(const char *s, int *mode)
{
    if (!strcmp(s, "auto"))
        *mode = -1;
    else if (!strcmp(s, "on"))
        *mode = 1;
    else if (!strcmp(s, "off"))
        *mode = 0;
    else
        return -1;
    return 0;
}

int tools_shadow_setup(struct infer_model *m, int mode, struct sl_err *err)
{
    if (mode == 0)
        return 0;
    int ret = infer_model_shadow_enable(m, err);
    if (ret == -ENOENT && mode < 0) {
        memset(err, 0, sizeof *err);
        return 0;
    }
    return ret;
}

struct view {
    struct infer_shadow_stats st;
    uint32_t linears, on;
    size_t bytes;
};

static int view_of(const struct infer_model *m, struct view *v)
{
    const struct infer_shadow *sh = m ? infer_model_shadow(m) : NULL;
    if (!sh)
        return 0;
    infer_shadow_get_stats(sh, &v->st);
    v->linears = infer_shadow_linears(sh, &v->on);
    v->bytes = infer_shadow_bytes(sh);
    return 1;
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

static void view_json(const struct view *vp, cJSON *o)
{
    const struct view v = *vp;
    cJSON_AddBoolToObject(o, "shadow", 1);
    cJSON_AddNumberToObject(o, "shadow_linears", v.linears);
    cJSON_AddNumberToObject(o, "shadow_linears_on", v.on);
    cJSON_AddNumberToObject(o, "shadow_bytes", (double)v.bytes);
    cJSON_AddNumberToObject(o, "shadow_outlier_rate", ratio(v.st.clipped, v.st.elements));
    cJSON_AddNumberToObject(o, "shadow_outliers", (double)v.st.clipped);
    cJSON_AddNumberToObject(o, "shadow_token_rows", (double)v.st.token_rows);
    cJSON_AddNumberToObject(o, "shadow_rows_hot", (double)v.st.cols_hot);
    cJSON_AddNumberToObject(o, "shadow_rows_cold", (double)v.st.cols_cold);
    cJSON_AddNumberToObject(o, "shadow_calls", (double)v.st.calls);
}

void tools_shadow_json(const struct infer_model *m, cJSON *o)
{
    struct view v;
    if (!view_of(m, &v)) {
        cJSON_AddBoolToObject(o, "shadow", 0);
        return;
    }
    view_json(&v, o);
}

void tools_shadow_snap(const struct infer_model *m, struct tools_shadow_snap *s)
{
    struct view v;
    memset(s, 0, sizeof *s);
    if (!view_of(m, &v))
        return;
    s->on = 1;
    s->st = v.st;
    s->linears = v.linears;
    s->enabled = v.on;
    s->bytes = v.bytes;
}

void tools_shadow_snap_json(const struct tools_shadow_snap *s, cJSON *o)
{
    if (!s->on) {
        cJSON_AddBoolToObject(o, "shadow", 0);
        return;
    }
    struct view v = {.st = s->st, .linears = s->linears, .on = s->enabled, .bytes = s->bytes};
    view_json(&v, o);
}

void tools_shadow_print(const struct infer_model *m, FILE *f)
{
    struct view v;
    if (!view_of(m, &v)) {
        fprintf(f, "shadow outlier execution: off\n");
        return;
    }
    fprintf(f,
            "shadow outlier execution: %u of %u linears, %zu resident bytes; outliers %.4f%% of "
            "%llu activations (%llu), in %llu input rows of %llu calls; weight rows read: "
            "%llu hot (resident), %llu cold (%.1f%% hot)\n",
            v.on, v.linears, v.bytes, 100 * ratio(v.st.clipped, v.st.elements),
            (unsigned long long)v.st.elements, (unsigned long long)v.st.clipped,
            (unsigned long long)v.st.token_rows, (unsigned long long)v.st.calls,
            (unsigned long long)v.st.cols_hot, (unsigned long long)v.st.cols_cold,
            100 * ratio(v.st.cols_hot, v.st.cols_hot + v.st.cols_cold));
}
