/* The NCCL backend: device from the launcher's binding or LOCAL_RANK, the
 * unique id shared through the rendezvous store, a non-blocking communicator
 * whose async errors are watched, and ncclCommAbort on error, timeout or a
 * round that ended. Without CUDA the entry points report "unsupported". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb_time.h"
#include "gpl_int.h"

#ifdef GPL_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

typedef struct nccl_state {
    ncclComm_t comm;
    int device;
    int aborted;
} nccl_state;

static gpl_result_t nccl_fail(gpl_comm_t c, const char *what, ncclResult_t r) {
    nccl_state *n = c->nccl;
    const char *last = n && n->comm ? ncclGetLastError(n->comm) : "";
    return gb_seterr(&c->err, GPL_ERR_NCCL, "rank %d: %s #%llu: %s (%s)%s%s", c->rank, what,
                     (unsigned long long)c->seq, ncclGetErrorString(r), last ? last : "",
                     r == ncclInvalidUsage ? "; two ranks on one GPU? use --bind-gpus" : "",
                     r == ncclSystemError ? "; check /dev/shm and NCCL_SOCKET_IFNAME" : "");
}

static void nccl_abort(gpl_comm_t c) {
    nccl_state *n = c->nccl;
    if (n && n->comm && !n->aborted) {
        ncclCommAbort(n->comm);
        n->aborted = 1;
        n->comm = NULL;
    }
}

/* Waits for the communicator's pending work (and the stream, when given),
 * watching async errors, the deadline and the rendezvous. */
static gpl_result_t nccl_wait(gpl_comm_t c, cudaStream_t stream, const char *what) {
    nccl_state *n = c->nccl;
    uint64_t deadline = gb_now_ms() + c->timeout_ms, next_check = 0;
    for (;;) {
        ncclResult_t ar = ncclSuccess;
        ncclCommGetAsyncError(n->comm, &ar);
        if (ar != ncclSuccess && ar != ncclInProgress) {
            gpl_result_t rc = nccl_fail(c, what, ar);
            nccl_abort(c);
            return rc;
        }
        if (ar == ncclSuccess) {
            if (stream == (cudaStream_t)-1)
                return GPL_OK;
            cudaError_t q = cudaStreamQuery(stream);
            if (q == cudaSuccess)
                return GPL_OK;
            if (q != cudaErrorNotReady) {
                nccl_abort(c);
                return gb_seterr(&c->err, GPL_ERR_CUDA, "rank %d: %s: %s", c->rank, what,
                                 cudaGetErrorString(q));
            }
        }
        uint64_t now = gb_now_ms();
        if (now >= next_check) {
            next_check = now + GPL_POLL_MS;
            gpl_result_t rc = gpl_check_abort(c, deadline, "its NCCL peers");
            if (rc != GPL_OK) {
                nccl_abort(c);
                return rc;
            }
        }
    }
}

gpl_result_t gpl_nccl_init(gpl_comm_t c, int device) {
    nccl_state *n = calloc(1, sizeof *n);
    if (n == NULL)
        return GPL_ERR_NOMEM;
    c->nccl = n;
    int ndev = gpl_cuda_device_count();
    if (ndev == 0)
        return gb_seterr(&c->err, GPL_ERR_CUDA,
                         "rank %d: the NCCL backend needs a GPU; none is "
                         "visible (CUDA_VISIBLE_DEVICES?)",
                         c->rank);
    n->device = device >= 0 ? device : c->local_rank % ndev;
    cudaError_t ce = cudaSetDevice(n->device);
    if (ce != cudaSuccess)
        return gb_seterr(&c->err, GPL_ERR_CUDA, "rank %d: cudaSetDevice(%d): %s", c->rank,
                         n->device, cudaGetErrorString(ce));
    ncclUniqueId uid;
    ncclResult_t r;
    c->coll = "nccl-init";
    char key[48];
    snprintf(key, sizeof key, "gpl/%u/nccl/uid", c->inst);
    if (c->rank == 0) {
        if ((r = ncclGetUniqueId(&uid)) != ncclSuccess)
            return nccl_fail(c, "ncclGetUniqueId", r);
        if (c->rdzv && rdzv_bclient_set(c->rdzv, key, &uid, sizeof uid) != GPL_OK)
            return gb_seterr(&c->err, GPL_ERR_CLOSED, "rank 0: publishing the NCCL id: %s",
                             rdzv_bclient_error(c->rdzv));
    } else {
        const char *k[1] = {key};
        void *v = NULL;
        size_t len = 0;
        gpl_result_t rc = rdzv_bclient_wait(c->rdzv, k, 1, c->timeout_ms);
        if (rc == GPL_OK)
            rc = rdzv_bclient_get(c->rdzv, key, &v, &len);
        if (rc != GPL_OK || len != sizeof uid) {
            free(v);
            return gb_seterr(&c->err, rc ? rc : GPL_ERR_PROTOCOL,
                             "rank %d: rank 0 never published the NCCL unique id: %s", c->rank,
                             rdzv_bclient_error(c->rdzv));
        }
        memcpy(&uid, v, sizeof uid);
        free(v);
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    r = ncclCommInitRankConfig(&n->comm, c->world, uid, c->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        return nccl_fail(c, "ncclCommInitRankConfig", r);
    return nccl_wait(c, (cudaStream_t)-1, "ncclCommInitRankConfig");
}

void gpl_nccl_finalize(gpl_comm_t c) {
    nccl_state *n = c->nccl;
    if (n == NULL)
        return;
    /* A non-blocking communicator finalizes in the background: it must be done
     * (the async state back to success) before ncclCommDestroy; an error or
     * the deadline aborts it instead (nccl_wait). */
    if (n->comm) {
        ncclResult_t r = ncclCommFinalize(n->comm);
        if (r != ncclSuccess && r != ncclInProgress)
            nccl_abort(c);
        else
            (void)nccl_wait(c, (cudaStream_t)-1, "ncclCommFinalize"); /* aborts on failure */
        if (n->comm)
            ncclCommDestroy(n->comm);
    }
    free(n);
    c->nccl = NULL;
}

void gpl_nccl_abort(gpl_comm_t c) {
    nccl_abort(c);
    free(c->nccl);
    c->nccl = NULL;
}

void gpl_nccl_bind_thread(gpl_comm_t c) {
    nccl_state *n = c->nccl;
    if (n != NULL) /* a thread starts on device 0; the comm lives on n->device */
        (void)cudaSetDevice(n->device);
}

int gpl_nccl_is_device_ptr(const void *p) {
    struct cudaPointerAttributes a;
    if (p == NULL || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static ncclDataType_t dt(gpl_dtype_t t) {
    switch (t) {
    case GPL_FLOAT32:
        return ncclFloat32;
    case GPL_FLOAT64:
        return ncclFloat64;
    case GPL_FLOAT16:
        return ncclFloat16;
    case GPL_BFLOAT16:
        return ncclBfloat16;
    case GPL_INT32:
        return ncclInt32;
    default:
        return ncclInt64;
    }
}

static ncclRedOp_t rop(gpl_op_t o) {
    switch (o) {
    case GPL_PROD:
        return ncclProd;
    case GPL_MIN:
        return ncclMin;
    case GPL_MAX:
        return ncclMax;
    case GPL_AVG:
        return ncclAvg;
    default:
        return ncclSum;
    }
}

static gpl_result_t ready(gpl_comm_t c) {
    nccl_state *n = c->nccl;
    if (n == NULL || n->comm == NULL)
        return gb_seterr(&c->err, GPL_ERR_STATE,
                         "rank %d: the NCCL communicator was aborted after an earlier error; "
                         "the workers must restart",
                         c->rank);
    return GPL_OK;
}

/* A non-blocking communicator may still be taking the call when it returns
 * ncclInProgress: that is waited for, not the result (gradient buckets are
 * enqueued one after another and waited for once, gpl_dp.c). */
gpl_result_t gpl_nccl_allreduce_enqueue(gpl_comm_t c, const void *s, void *r, size_t count,
                                        gpl_dtype_t t, gpl_op_t op, void *stream) {
    gpl_result_t rc = ready(c);
    if (rc != GPL_OK)
        return rc;
    ncclResult_t e = ncclAllReduce(s, r, count, dt(t), rop(op), ((nccl_state *)c->nccl)->comm,
                                   (cudaStream_t)stream);
    if (e != ncclSuccess && e != ncclInProgress)
        return nccl_fail(c, "ncclAllReduce", e);
    return e == ncclInProgress ? nccl_wait(c, (cudaStream_t)-1, "allreduce") : GPL_OK;
}

gpl_result_t gpl_nccl_wait(gpl_comm_t c, void *stream, const char *what) {
    gpl_result_t rc = ready(c);
    if (rc != GPL_OK)
        return rc;
    return nccl_wait(c, (cudaStream_t)stream, what);
}

gpl_result_t gpl_nccl_broadcast(gpl_comm_t c, void *buf, size_t count, gpl_dtype_t t, int root,
                                void *stream) {
    gpl_result_t rc = ready(c);
    if (rc != GPL_OK)
        return rc;
    ncclResult_t e = ncclBroadcast(buf, buf, count, dt(t), root, ((nccl_state *)c->nccl)->comm,
                                   (cudaStream_t)stream);
    if (e != ncclSuccess && e != ncclInProgress)
        return nccl_fail(c, "ncclBroadcast", e);
    return nccl_wait(c, (cudaStream_t)stream, "broadcast");
}

gpl_result_t gpl_nccl_allgather(gpl_comm_t c, const void *s, void *r, size_t count, gpl_dtype_t t,
                                void *stream) {
    gpl_result_t rc = ready(c);
    if (rc != GPL_OK)
        return rc;
    ncclResult_t e =
        ncclAllGather(s, r, count, dt(t), ((nccl_state *)c->nccl)->comm, (cudaStream_t)stream);
    if (e != ncclSuccess && e != ncclInProgress)
        return nccl_fail(c, "ncclAllGather", e);
    return nccl_wait(c, (cudaStream_t)stream, "allgather");
}

void *gpl_dev_alloc(size_t bytes) {
    void *p = NULL;
    return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}

void gpl_dev_free(void *p) { cudaFree(p); }

int gpl_dev_copy(void *dst, const void *src, size_t bytes) {
    return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice) == cudaSuccess ? 0 : -1;
}

#else /* no CUDA in this build */

void *gpl_dev_alloc(size_t bytes) { return NULL; }
void gpl_dev_free(void *p) {}
int gpl_dev_copy(void *dst, const void *src, size_t bytes) { return -1; }

static gpl_result_t unsupported(gpl_comm_t c) {
    return gb_seterr(&c->err, GPL_ERR_UNSUPPORTED,
                     "this build has no CUDA/NCCL; rebuild with -DGPULAUNCH_CUDA=ON");
}
gpl_result_t gpl_nccl_init(gpl_comm_t c, int device) { return unsupported(c); }
void gpl_nccl_finalize(gpl_comm_t c) {}
void gpl_nccl_abort(gpl_comm_t c) {}
void gpl_nccl_bind_thread(gpl_comm_t c) {}
int gpl_nccl_is_device_ptr(const void *p) { return 0; }
gpl_result_t gpl_nccl_allreduce_enqueue(gpl_comm_t c, const void *s, void *r, size_t count,
                                        gpl_dtype_t t, gpl_op_t op, void *stream) {
    return unsupported(c);
}
gpl_result_t gpl_nccl_wait(gpl_comm_t c, void *stream, const char *what) { return unsupported(c); }
gpl_result_t gpl_nccl_broadcast(gpl_comm_t c, void *buf, size_t count, gpl_dtype_t t, int root,
                                void *stream) {
    return unsupported(c);
}
gpl_result_t gpl_nccl_allgather(gpl_comm_t c, const void *s, void *r, size_t count, gpl_dtype_t t,
                                void *stream) {
    return unsupported(c);
}
#endif
