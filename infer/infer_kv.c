/* infer_kv.c: the KV cache: append, truncate, commit an accepted draft path,
 * and an optional int8 mirror of the keys kept in step. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"

#define KV_ALIGN 64 /* bytes: a cache line */

int infer_kv_create(const struct format_config *c, uint32_t capacity, unsigned flags,
                    struct infer_kv **out, struct sl_err *err)
{
    if (capacity == 0)
        capacity = c->seq_len;
    if (capacity > c->seq_len || c->n_kv_heads == 0 || c->head_dim == 0) {
        sl_err_set(err, "a KV cache of %u slots does not fit the context of %u", capacity,
                   c->seq_len);
        return -EINVAL;
    }
    struct infer_kv *kv = sl_calloc(1, sizeof *kv);
    if (!kv)
        goto nomem;
    kv->n_layers = c->n_layers;
    kv->n_kv_heads = c->n_kv_heads;
    kv->head_dim = c->head_dim;
    kv->kv_dim = c->n_kv_heads * c->head_dim;
    kv->cap = capacity;
    size_t cells = (size_t)c->n_layers * capacity * kv->kv_dim;
    /* calloc: untouched slots cost no memory until written (fresh zero
     * pages); the keys and values start on a cache line: calloc's 16-byte
     * alignment put every other 32-byte load of the attention kernels
     * across two lines (decode attention over 1000 keys about 35% slower) */
    kv->k_mem = sl_calloc(cells + KV_ALIGN / sizeof(float), sizeof(float));
    kv->v_mem = sl_calloc(cells + KV_ALIGN / sizeof(float), sizeof(float));
    kv->pos = sl_calloc(capacity, sizeof *kv->pos);
    if (!kv->k_mem || !kv->v_mem || !kv->pos)
        goto nomem;
    kv->k = (float *)(uintptr_t)sl_align_up((uintptr_t)kv->k_mem, KV_ALIGN);
    kv->v = (float *)(uintptr_t)sl_align_up((uintptr_t)kv->v_mem, KV_ALIGN);
    if (flags & INFER_KV_K8) {
        kv->k8 = sl_calloc(cells, 1);
        kv->k8_scale = sl_calloc((size_t)c->n_layers * capacity * c->n_kv_heads, sizeof(float));
        if (!kv->k8 || !kv->k8_scale)
            goto nomem;
    }
    *out = kv;
    return 0;
nomem:
    infer_kv_destroy(kv);
    sl_err_set(err, "out of memory for a KV cache of %u slots", capacity);
    return -ENOMEM;
}

void infer_kv_destroy(struct infer_kv *kv)
{
    if (!kv)
        return;
    free(kv->k_mem);
    free(kv->v_mem);
    free(kv->pos);
    free(kv->k8);
    free(kv->k8_scale);
    free(kv);
}

uint32_t infer_kv_len(const struct infer_kv *kv) { return kv->len; }
uint32_t infer_kv_capacity(const struct infer_kv *kv) { return kv->cap; }
uint32_t infer_kv_pos(const struct infer_kv *kv, uint32_t slot)
{
    return slot < kv->len ? kv->pos[slot] : UINT32_MAX;
}

static size_t layer_off(const struct infer_kv *kv, uint32_t layer)
{
    return (size_t)layer * kv->cap * kv->kv_dim;
}

const float *infer_kv_keys(const struct infer_kv *kv, uint32_t layer)
{
    return kv->k + layer_off(kv, layer);
}
const float *infer_kv_values(const struct infer_kv *kv, uint32_t layer)
{
    return kv->v + layer_off(kv, layer);
}
const int8_t *infer_kv_keys_i8(const struct infer_kv *kv, uint32_t layer)
{
    return kv->k8 ? kv->k8 + layer_off(kv, layer) : NULL;
}
const float *infer_kv_keys_i8_scale(const struct infer_kv *kv, uint32_t layer)
{
    return kv->k8_scale ? kv->k8_scale + (size_t)layer * kv->cap * kv->n_kv_heads : NULL;
}

int infer_kv_reserve(struct infer_kv *kv, uint32_t n, const uint32_t *pos, uint32_t pos0)
{
    if (n > kv->cap - kv->len)
        return -ENOSPC;
    for (uint32_t i = 0; i < n; i++)
        kv->pos[kv->len + i] = pos ? pos[i] : pos0 + i;
    kv->len += n;
    return 0;
}

/* int8 keys of slot `slot`, heads [kv0, kv1) of one layer, from its floats */
static void mirror_k8(struct infer_kv *kv, uint32_t layer, uint32_t slot, uint32_t kv0,
                      uint32_t kv1)
{
    const float *k = kv->k + layer_off(kv, layer) + (size_t)slot * kv->kv_dim;
    int8_t *q = kv->k8 + layer_off(kv, layer) + (size_t)slot * kv->kv_dim;
    float *sc = kv->k8_scale + ((size_t)layer * kv->cap + slot) * kv->n_kv_heads;
    for (uint32_t h = kv0; h < kv1; h++) {
        const float *kh = k + (size_t)h * kv->head_dim;
        float amax = 0.0f;
        for (uint32_t j = 0; j < kv->head_dim; j++)
            amax = fabsf(kh[j]) > amax ? fabsf(kh[j]) : amax;
        float s = amax > 0.0f && isfinite(amax) ? amax / 127.0f : 1.0f;
        float inv = 1.0f / s;
        for (uint32_t j = 0; j < kv->head_dim; j++) {
            float r = rintf(kh[j] * inv);
            q[(size_t)h * kv->head_dim + j] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : r);
        }
        sc[h] = s;
    }
}

void infer_kv_write(struct infer_kv *kv, uint32_t layer, uint32_t slot0, uint32_t n,
                    const float *k, const float *v, uint32_t kv0, uint32_t kv1)
{
    size_t hd = kv->head_dim, w = (size_t)(kv1 - kv0) * hd;
    float *kc = kv->k + layer_off(kv, layer), *vc = kv->v + layer_off(kv, layer);
    for (uint32_t r = 0; r < n; r++) {
        size_t dst = (size_t)(slot0 + r) * kv->kv_dim + kv0 * hd, src = (size_t)r * kv->kv_dim + kv0 * hd;
        memcpy(kc + dst, k + src, sizeof(float) * w);
        memcpy(vc + dst, v + src, sizeof(float) * w);
        if (kv->k8)
            mirror_k8(kv, layer, slot0 + r, kv0, kv1);
    }
}

int infer_kv_append(struct infer_kv *kv, const float *k, const float *v, uint32_t n)
{
    uint32_t slot0 = kv->len, pos0 = slot0 ? kv->pos[slot0 - 1] + 1 : 0;
    int ret = infer_kv_reserve(kv, n, NULL, pos0);
    if (ret < 0)
        return ret;
    for (uint32_t l = 0; l < kv->n_layers; l++)
        infer_kv_write(kv, l, slot0, n, k, v, 0, kv->n_kv_heads);
    return 0;
}

int infer_kv_truncate(struct infer_kv *kv, uint32_t n)
{
    if (n > kv->len)
        return -EINVAL;
    kv->len = n;
    return 0;
}

static void move_slot(struct infer_kv *kv, uint32_t from, uint32_t to)
{
    size_t w = kv->kv_dim;
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        size_t o = layer_off(kv, l);
        memmove(kv->k + o + to * w, kv->k + o + from * w, w * sizeof(float));
        memmove(kv->v + o + to * w, kv->v + o + from * w, w * sizeof(float));
        if (kv->k8) {
            memmove(kv->k8 + o + to * w, kv->k8 + o + from * w, w);
            float *sc = kv->k8_scale + (size_t)l * kv->cap * kv->n_kv_heads;
            memmove(sc + (size_t)to * kv->n_kv_heads, sc + (size_t)from * kv->n_kv_heads,
                    kv->n_kv_heads * sizeof(float));
        }
    }
    kv->pos[to] = kv->pos[from];
}

int infer_kv_commit(struct infer_kv *kv, uint32_t base, const uint32_t *slots, uint32_t n)
{
    if (base > kv->len || n > kv->len - base)
        return -EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (slots[i] < base || slots[i] >= kv->len || (i && slots[i] <= slots[i - 1]))
            return -EINVAL;
    /* slots ascend and slots[i] >= base + i: moving down in order never
     * overwrites a slot still to be moved */
    for (uint32_t i = 0; i < n; i++)
        if (slots[i] != base + i)
            move_slot(kv, slots[i], base + i);
    kv->len = base + n;
    return 0;
}
