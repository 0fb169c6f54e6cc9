/* Single-copy all-reduce inside a node. Instead of staging every buffer in
 * shared memory (copy in, reduce, copy out), ranks read each other's buffers
 * directly with process_vm_readv (cross-memory attach): rank r reduces slice
 * r of the buffer from every rank's input, in rank order, then every rank
 * reads the finished slices from the ranks that own them. The result is
 * computed once per element, so it is bitwise identical everywhere. Used when
 * the kernel lets ranks read each other (same user; Yama allows it once each
 * rank names any process as its tracer); otherwise the staged path runs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>

#include "gb_time.h"
#include "gpl_int.h"

#define MIN_(a, b) ((a) < (b) ? (a) : (b))

static volatile uint64_t cma_probe_word = 0x47504c43u;

/* Reads n bytes at address src of peer q into dst (or copies, for ourselves). */
static gpl_result_t peer_read(gpl_comm_t c, int q, uint64_t src, void *dst, size_t n) {
    if (q == c->local_rank) {
        memcpy(dst, (const void *)(uintptr_t)src, n);
        return GPL_OK;
    }
    struct iovec l = {dst, n}, r = {(void *)(uintptr_t)src, n};
    ssize_t got = process_vm_readv(c->shm->pid[q], &l, 1, &r, 1, 0);
    if (got != (ssize_t)n)
        return gb_seterr(&c->err, GPL_ERR_PEER_FAILED,
                         "rank %d: reading rank %d's buffer during %s #%llu failed: %s", c->rank,
                         c->base_rank + q, c->coll, (unsigned long long)c->seq,
                         got < 0 ? strerror(errno) : "short read");
    return GPL_OK;
}

gpl_result_t gpl_cma_setup(gpl_comm_t c) {
    if (getenv("GPULAUNCH_NO_CMA"))
        return GPL_OK;
#ifdef PR_SET_PTRACER
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
    gpl_shm_hdr *h = c->shm;
    h->cma_src[c->local_rank] = (uint64_t)(uintptr_t)&cma_probe_word;
    uint64_t deadline = gb_now_ms() + c->timeout_ms;
    gpl_result_t rc = gpl_shm_barrier(c, deadline);
    if (rc != GPL_OK)
        return rc;
    int q = (c->local_rank + 1) % c->local_world;
    uint64_t got = 0;
    struct iovec l = {&got, sizeof got}, r = {(void *)(uintptr_t)h->cma_src[q], sizeof got};
    h->cma_ok[c->local_rank] =
        process_vm_readv(h->pid[q], &l, 1, &r, 1, 0) == (ssize_t)sizeof got &&
        got == cma_probe_word;
    if ((rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
        return rc;
    int ok = 1;
    for (int i = 0; i < c->local_world; i++)
        ok &= h->cma_ok[i] != 0;
    c->cma_tmp = ok ? malloc(2 * GPL_CMA_PIECE) : NULL;
    c->cma = ok && c->cma_tmp != NULL;
    return gpl_shm_barrier(c, deadline);
}

gpl_result_t gpl_cma_allreduce(gpl_comm_t c, const void *s, void *r, size_t count, gpl_dtype_t t,
                               gpl_op_t op, uint64_t deadline) {
    gpl_shm_hdr *h = c->shm;
    const int n = c->local_world, me = c->local_rank;
    size_t es = gpl_dtype_size(t);
    gpl_result_t rc;
    h->cma_src[me] = (uint64_t)(uintptr_t)s;
    h->cma_dst[me] = (uint64_t)(uintptr_t)r;
    if ((rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
        return rc;
    /* reduce-scatter: my slice, accumulated in place in my own output, with
     * the other ranks' pieces read in rank order (each element is computed
     * once, by its slice's owner, so every rank ends with the same bits) */
    size_t per = (count + (size_t)n - 1) / (size_t)n;
    size_t lo = MIN_((size_t)me * per, count), hi = MIN_(lo + per, count);
    size_t piece = GPL_CMA_PIECE / es;
    uint8_t *in = c->cma_tmp;
    if (s != r && hi > lo)
        memcpy((uint8_t *)r + lo * es, (const uint8_t *)s + lo * es, (hi - lo) * es);
    for (size_t off = lo; off < hi; off += piece) {
        size_t m = MIN_(piece, hi - off);
        for (int q = 0; q < n; q++) {
            if (q == me)
                continue;
            if ((rc = peer_read(c, q, h->cma_src[q] + off * es, in, m * es)) != GPL_OK)
                return rc;
            gpl_reduce_into((uint8_t *)r + off * es, in, m, t, op);
        }
    }
    if ((rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
        return rc;
    /* all-gather: every other slice from the rank that owns it */
    for (int q = 0; q < n; q++) {
        if (q == me)
            continue;
        size_t qlo = MIN_((size_t)q * per, count), qhi = MIN_(qlo + per, count);
        if (qhi > qlo && (rc = peer_read(c, q, h->cma_dst[q] + qlo * es, (uint8_t *)r + qlo * es,
                                         (qhi - qlo) * es)) != GPL_OK)
            return rc;
    }
    /* my buffers must outlive every peer's reads */
    return gpl_shm_barrier(c, deadline);
}
