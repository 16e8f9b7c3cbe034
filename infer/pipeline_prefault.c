/* pipeline_prefault.c: memory the prefill's first tasks would otherwise
 * fault in themselves, on the critical path, faulted in ahead.
 *
 * A fresh mapping costs its first writer a page fault per page (and, in a
 * VM whose host backs the guest's memory lazily, sometimes a host fault
 * too). The first layer's tasks wrote every page of the activation sets and
 * of the pool's first int8 storages: about 10,000 faults in the first half
 * second of a 512-token prefill on the TinyLlama shape (perf record -e
 * page-faults), while both executors wait for those tasks. The same memory
 * is put first in the prefault thread's list, which steps while a CPU
 * worker is idle, as it is before the first slice arrives: activation
 * memory (never skipped: every (layer, chunk) writes it), then the storages
 * pl_pool_admit gave out at setup (skipped as the int8 weights are, once
 * their layer's unpacking has begun). Region steps take the address range,
 * not the storage, so a storage freed meanwhile leaves nothing dangling: a
 * step on an unmapped range fails and is skipped, one on memory
 * mapped again for something else only faults it in. Calls nothing else. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pipeline.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#define STEP ((size_t)2 << 20)

int pl_prefault_region(uint8_t *addr, size_t len)
{
    if (!addr || !len)
        return 0;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)addr & ~(page - 1), hi = (uintptr_t)addr + len;
    return madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE) == 0 ? 0 : -errno;
}

/* region [addr, addr + len) in STEP steps at out[*n...] (room checked by the caller) */
static void add_region(struct prefault *out, uint32_t *n, uint8_t *addr, size_t len, int layer)
{
    for (size_t off = 0; addr && off < len; off += STEP)
        out[(*n)++] = (struct prefault){
            .addr = addr, .off = off, .len = len - off < STEP ? len - off : STEP, .layer = layer};
}

static size_t steps(size_t len) { return (len + STEP - 1) / STEP; }

int pl_prefault_early(struct pl *p)
{
    if (p->o->policy != INFER_POLICY_FULL || p->o->no_prefault)
        return 0;
    size_t n = steps(p->act_x_len) + steps(p->set_len);
    for (uint32_t i = 0; i < p->acq_next; i++) {
        const struct infer_linear *lin = pl_graph_linear(p, p->acq[i].layer, p->acq[i].role);
        if (lin->npu)
            n += steps(npu_weights_storage(lin->npu));
    }
    if (!n)
        return 0;
    if (n > UINT32_MAX - p->n_pf)
        return -ENOMEM;
    struct prefault *a = sl_malloc(sizeof *a * (n + p->n_pf));
    if (!a)
        return -ENOMEM;
    uint32_t k = 0;
    add_region(a, &k, (uint8_t *)p->act_x, p->act_x_len, PL_PF_ACTS);
    add_region(a, &k, p->set_mem, p->set_len, PL_PF_ACTS);
    for (uint32_t i = 0; i < p->acq_next; i++) {
        const struct infer_linear *lin = pl_graph_linear(p, p->acq[i].layer, p->acq[i].role);
        size_t bb;
        if (lin->npu) /* the address only: populating leaves the contents alone */
            add_region(a, &k, (uint8_t *)(uintptr_t)npu_weights_packed(lin->npu, &bb),
                       npu_weights_storage(lin->npu), p->acq[i].layer);
    }
    if (p->n_pf)
        memcpy(a + k, p->pf, sizeof *a * p->n_pf);
    free(p->pf);
    p->pf = a;
    p->n_pf += k;
    p->cap_pf = p->n_pf;
    return 0;
}
