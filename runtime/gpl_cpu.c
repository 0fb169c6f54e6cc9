/* The CPU backend's collectives: shared memory inside a node, the ring of
 * node leaders between nodes. All-reduce per chunk: every rank stages its
 * chunk, rank r reduces slice r of it across the stages in rank order
 * (reduce-scatter), leaders all-reduce the node's result over the ring, and
 * every rank copies the result out (all-gather). Small buffers take the
 * latency path instead: on one node every rank reduces the whole buffer
 * itself, in the same order, so the results are bitwise identical on every
 * rank; across nodes the leader reduces the node's buffers and all-reduces
 * them over the ring, with one barrier before and one after. */
#include <stdlib.h>
#include <string.h>

#include "gb_time.h"
#include "gpl_int.h"

#define MIN_(a, b) ((a) < (b) ? (a) : (b))

static uint8_t *slot(gpl_comm_t c, int r) { return c->slots + (size_t)r * GPL_SHM_SLOT_BYTES; }

/* The ring all-reduce of a node with one rank. It must make the same ring
 * calls as every other node: nodes with several ranks make one per chunk of a
 * buffer over small_bytes, so when any node has several, this one does too;
 * when none has, one call for the whole buffer. */
static gpl_result_t ring_alone(gpl_comm_t c, void *r, size_t count, gpl_dtype_t t, gpl_op_t op,
                               uint64_t deadline) {
    size_t es = gpl_dtype_size(t);
    int several = 0;
    for (int i = 0; i < c->nnodes && !several; i++)
        several = gpl_ring_node_size(c, i) > 1;
    if (!several || count * es <= c->small_bytes)
        return gpl_ring_allreduce(c, r, count, t, op, deadline);
    size_t chunk = c->chunk_bytes / es ? c->chunk_bytes / es : 1;
    gpl_result_t rc = GPL_OK;
    for (size_t off = 0; off < count && rc == GPL_OK; off += chunk)
        rc = gpl_ring_allreduce(c, (uint8_t *)r + off * es, MIN_(chunk, count - off), t, op,
                                deadline);
    return rc;
}

static gpl_result_t allreduce_native(gpl_comm_t c, const void *s, void *r, size_t count,
                                     gpl_dtype_t t, gpl_op_t op, uint64_t deadline) {
    size_t es = gpl_dtype_size(t);
    gpl_op_t rop = op == GPL_AVG ? GPL_SUM : op;
    gpl_result_t rc = GPL_OK;
    if (c->cma && c->nnodes == 1 && count * es >= GPL_CMA_MIN_BYTES) {
        /* single copy: peers read s directly; no staging of r */
        rc = gpl_cma_allreduce(c, s, r, count, t, rop, deadline);
        goto out;
    }
    if (s != r)
        memmove(r, s, count * es);
    if (c->local_world == 1) {
        if (c->nnodes > 1)
            rc = ring_alone(c, r, count, t, rop, deadline);
        goto out;
    }
    const int n = c->local_world, me = c->local_rank;
    if (count * es <= c->small_bytes && c->nnodes == 1) {
        memcpy(slot(c, me), r, count * es);
        if ((rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
            goto out;
        memcpy(r, slot(c, 0), count * es);
        for (int k = 1; k < n; k++)
            gpl_reduce_into(r, slot(c, k), count, t, rop);
        rc = gpl_shm_barrier(c, deadline);
        goto out;
    }
    if (count * es <= c->small_bytes) {
        /* several nodes: the leader reduces the node's stages in rank order
         * and all-reduces that over the ring while the others wait */
        memcpy(slot(c, me), r, count * es);
        if ((rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
            goto out;
        if (me == 0) {
            memcpy(c->result, slot(c, 0), count * es);
            for (int k = 1; k < n; k++)
                gpl_reduce_into(c->result, slot(c, k), count, t, rop);
            if ((rc = gpl_ring_allreduce(c, c->result, count, t, rop, deadline)) != GPL_OK)
                goto out;
        }
        if ((rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
            goto out;
        memcpy(r, c->result, count * es);
        /* a broadcast or all-gather writes the result area before its first barrier */
        rc = gpl_shm_barrier(c, deadline);
        goto out;
    }
    /* Chunks small enough to stay in cache, double-buffered: chunk k uses
     * half k % 2 of every staging slot and of the result area, so the copy-out
     * of chunk k and the copy-in of chunk k + 1 need no barrier between them
     * (the barrier after the next copy-in already orders them). */
    size_t chunk = c->chunk_bytes / es;
    if (chunk == 0)
        chunk = 1;
    uint8_t *rb = r;
    size_t half = GPL_SHM_SLOT_BYTES / 2;
    for (size_t off = 0, k = 0; off < count; off += chunk, k++) {
        size_t m = MIN_(chunk, count - off);
        size_t buf = (k % 2) * half;
        memcpy(slot(c, me) + buf, rb + off * es, m * es);
        if ((rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
            goto out;
        /* my slice of the chunk */
        size_t per = (m + (size_t)n - 1) / (size_t)n;
        size_t lo = MIN_((size_t)me * per, m), hi = MIN_(lo + per, m);
        uint8_t *res = c->result + buf;
        if (hi > lo) {
            uint8_t *dst = res + lo * es;
            memcpy(dst, slot(c, 0) + buf + lo * es, (hi - lo) * es);
            for (int q = 1; q < n; q++)
                gpl_reduce_into(dst, slot(c, q) + buf + lo * es, hi - lo, t, rop);
        }
        if ((rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
            goto out;
        if (c->nnodes > 1) {
            if (me == 0 && (rc = gpl_ring_allreduce(c, res, m, t, rop, deadline)) != GPL_OK)
                goto out;
            if ((rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
                goto out;
        }
        memcpy(rb + off * es, res, m * es);
    }
    /* nobody may stage the next collective before everyone has copied out */
    rc = gpl_shm_barrier(c, deadline);
out:
    if (rc == GPL_ERR_PEER_FAILED && c->local_rank == 0)
        gpl_shm_abort(c, c->err.msg); /* a ring failure: tell the node's other ranks */
    if (rc == GPL_OK && op == GPL_AVG)
        gpl_scale_avg(r, count, t, c->world);
    return rc;
}

gpl_result_t gpl_cpu_allreduce(gpl_comm_t c, const void *s, void *r, size_t count, gpl_dtype_t t,
                               gpl_op_t op) {
    uint64_t deadline = gb_now_ms() + c->timeout_ms;
    if (t != GPL_FLOAT16 && t != GPL_BFLOAT16)
        return allreduce_native(c, s, r, count, t, op, deadline);
    /* half types: widen, reduce in float32, round once */
    float *w = malloc((count ? count : 1) * sizeof *w);
    if (w == NULL)
        return gb_seterr(&c->err, GPL_ERR_NOMEM, "rank %d: out of memory widening %zu elements",
                         c->rank, count);
    gpl_widen(w, s, count, t);
    gpl_result_t rc = allreduce_native(c, w, w, count, GPL_FLOAT32, op, deadline);
    if (rc == GPL_OK)
        gpl_narrow(r, w, count, t);
    free(w);
    return rc;
}

static int node_of(gpl_comm_t c, int rank) {
    for (int i = 0; i < c->nnodes; i++) {
        int b = gpl_ring_node_base(c, i);
        if (rank >= b && rank < b + gpl_ring_node_size(c, i))
            return i;
    }
    return 0;
}

gpl_result_t gpl_cpu_broadcast(gpl_comm_t c, void *buf, size_t count, gpl_dtype_t t, int root) {
    uint64_t deadline = gb_now_ms() + c->timeout_ms;
    size_t es = gpl_dtype_size(t), bytes = count * es;
    if (c->world == 1)
        return GPL_OK;
    if (c->local_world == 1)
        return gpl_ring_bcast(c, buf, bytes, node_of(c, root), deadline);
    int root_node = c->nnodes > 1 ? node_of(c, root) : 0;
    int root_local = root_node == c->node_rank ? root - c->base_rank : -1;
    uint8_t *b = buf;
    gpl_result_t rc = GPL_OK;
    for (size_t off = 0; off < bytes; off += GPL_SHM_SLOT_BYTES) {
        size_t m = MIN_((size_t)GPL_SHM_SLOT_BYTES, bytes - off);
        if (c->local_rank == root_local)
            memcpy(c->result, b + off, m);
        if ((rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
            return rc;
        if (c->nnodes > 1) {
            if (c->local_rank == 0 && (rc = gpl_ring_bcast(c, c->result, m, root_node, deadline)))
                return rc;
            if ((rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
                return rc;
        }
        if (c->local_rank != root_local)
            memcpy(b + off, c->result, m);
        if ((rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
            return rc;
    }
    return rc;
}

gpl_result_t gpl_cpu_allgather(gpl_comm_t c, const void *s, void *r, size_t count, gpl_dtype_t t) {
    uint64_t deadline = gb_now_ms() + c->timeout_ms;
    size_t es = gpl_dtype_size(t);
    const uint8_t *sb = s;
    uint8_t *rb = r;
    if (c->world == 1) {
        memmove(r, s, count * es);
        return GPL_OK;
    }
    size_t per_rank = GPL_SHM_SLOT_BYTES / ((size_t)c->world * es);
    if (per_rank == 0)
        return gb_seterr(&c->err, GPL_ERR_LIMIT,
                         "allgather over %d ranks of %zu-byte elements exceeds the %u-byte "
                         "staging area",
                         c->world, es, GPL_SHM_SLOT_BYTES);
    size_t *off = NULL, *len = NULL;
    uint8_t *tmp = NULL;
    gpl_result_t rc = GPL_OK;
    if (c->nnodes > 1) {
        off = calloc((size_t)c->nnodes, sizeof *off);
        len = calloc((size_t)c->nnodes, sizeof *len);
        if (!off || !len) {
            rc = gb_seterr(&c->err, GPL_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    uint8_t *stage = c->local_world > 1 ? c->result : NULL;
    if (stage == NULL) { /* one rank per node: gather in private memory */
        tmp = malloc((size_t)c->world * per_rank * es);
        if (tmp == NULL) {
            rc = gb_seterr(&c->err, GPL_ERR_NOMEM, "out of memory");
            goto out;
        }
        stage = tmp;
    }
    for (size_t k0 = 0; k0 < count || (count == 0 && k0 == 0); k0 += per_rank) {
        size_t m = MIN_(per_rank, count - k0);
        memcpy(stage + (size_t)c->rank * m * es, sb + k0 * es, m * es);
        if (c->local_world > 1 && (rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
            goto out;
        if (c->nnodes > 1) {
            for (int i = 0; i < c->nnodes; i++) {
                off[i] = (size_t)gpl_ring_node_base(c, i) * m * es;
                len[i] = (size_t)gpl_ring_node_size(c, i) * m * es;
            }
            if (c->local_rank == 0 && (rc = gpl_ring_allgather(c, stage, off, len, deadline)))
                goto out;
            if (c->local_world > 1 && (rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
                goto out;
        }
        for (int q = 0; q < c->world; q++)
            memcpy(rb + ((size_t)q * count + k0) * es, stage + (size_t)q * m * es, m * es);
        if (c->local_world > 1 && (rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
            goto out;
        if (count == 0)
            break;
    }
out:
    free(tmp);
    free(off);
    free(len);
    return rc;
}

gpl_result_t gpl_cpu_barrier(gpl_comm_t c) {
    uint64_t deadline = gb_now_ms() + c->timeout_ms;
    gpl_result_t rc = GPL_OK;
    if (c->local_world > 1 && (rc = gpl_shm_barrier(c, deadline)) != GPL_OK)
        return rc;
    if (c->nnodes > 1 && c->local_rank == 0) {
        int32_t token = 1;
        if ((rc = gpl_ring_allreduce(c, &token, 1, GPL_INT32, GPL_SUM, deadline)) != GPL_OK)
            return rc;
    }
    if (c->local_world > 1)
        rc = gpl_shm_barrier(c, deadline);
    return rc;
}
