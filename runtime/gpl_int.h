/* Internal state of the runtime shared by its files. */
#ifndef GPULAUNCH_GPL_INT_H
#define GPULAUNCH_GPL_INT_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "gb_error.h"
#include "gpulaunch/gpulaunch.h"
#include "gpulaunch/rdzv.h"

#define GPL_MAX_LOCAL 256             /* ranks on one node */
#define GPL_SHM_SLOT_BYTES (4u << 20) /* staging bytes per rank per chunk */
/* a segment never initialised whose name carries no creator (an older
 * version's) is removed as stale once this old: a creator writes its header
 * within milliseconds of creating it */
#define GPL_SHM_UNINIT_STALE_S 600
#define GPL_DEFAULT_TIMEOUT_MS 300000u
#define GPL_DEFAULT_SMALL_BYTES (32u << 10)
#define GPL_DEFAULT_CHUNK_BYTES (256u << 10) /* per all-reduce step; at most half a slot */
#define GPL_CMA_MIN_BYTES (64u << 10)        /* single-copy all-reduce from this size up */
#define GPL_CMA_PIECE (128u << 10)           /* bytes read from a peer per step */
#define GPL_POLL_MS 20 /* how often a waiting rank checks peers and the rendezvous */

/* The shared-memory segment of one node: a header, then one staging slot per
 * local rank, then the result area. */
typedef struct gpl_shm_hdr {
    _Atomic uint32_t ready; /* GPL_SHM_MAGIC once initialised */
    uint32_t nlocal;
    uint64_t slot_bytes;
    _Atomic uint32_t bar_count;
    _Atomic uint32_t bar_gen; /* futex word */
    _Atomic uint32_t bar_waiters;
    _Atomic uint32_t abort_flag; /* 1 being written, 2 set: a rank saw a fatal error */
    char abort_msg[512];
    pid_t pid[GPL_MAX_LOCAL];
    /* single-copy path (cross-memory attach): each rank's buffers this collective */
    uint64_t cma_src[GPL_MAX_LOCAL], cma_dst[GPL_MAX_LOCAL];
    uint32_t cma_ok[GPL_MAX_LOCAL];
    _Atomic uint64_t arrived[GPL_MAX_LOCAL]; /* barrier sequence each rank reached */
} gpl_shm_hdr;

#define GPL_SHM_MAGIC 0x47504c53u

typedef struct gpl_ring gpl_ring;

struct gpl_comm {
    int rank, world, local_rank, local_world, node_rank, nnodes, base_rank;
    gpl_backend_t backend;
    uint32_t timeout_ms;
    size_t small_bytes, chunk_bytes;
    gb_err err;
    char run_id[256];
    int round;
    unsigned inst; /* this process's n-th communicator of the round: scopes its bootstrap keys */
    char hostname[256];
    rdzv_bclient *rdzv;
    /* shared memory */
    char shm_name[128];
    gpl_shm_hdr *shm;
    size_t shm_len;
    uint8_t *slots, *result;
    uint64_t bar_seq;
    int spin; /* spin before sleeping: only when ranks <= cores */
    int cma;  /* ranks may read each other's memory (process_vm_readv) */
    uint8_t *cma_tmp;
    /* leaders' ring between nodes */
    gpl_ring *ring;
    int *node_base, *node_size; /* every node's first rank and rank count */
    char (*node_host)[256];
    uint64_t seq;                /* collective sequence number */
    uint64_t round_over_seen_ms; /* when a wait first saw the round's end (0: not yet) */
    const char *coll;            /* name of the collective in progress */
    void *nccl;                  /* gpl_nccl state */
    gpl_external_ops ext;        /* GPL_BACKEND_EXTERNAL: the caller's collectives */
    struct gpl_ckpt *ckpt;       /* gpl_ckpt state */
    /* what gpl_comm_connect needs again when the round is re-formed */
    char rdzv_ep[300];
    char *token;
    int device;
    uint32_t round_seq; /* the round block's seq this process last acted on */
    int reforms;        /* rounds re-formed in place */
};

/* The transport of the current round (rendezvous attachment, shared memory,
 * the node ring, NCCL) from the communicator's rank, world and round, and its
 * teardown (abort: NCCL's communicator aborted, not finalized). */
gpl_result_t gpl_comm_connect(gpl_comm_t c);
/* The round block's seq of the first round a worker started before it took
 * (gpl_await_round); 0 for a worker started in its round. */
uint32_t gpl__first_round_seq(void);
void gpl_comm_disconnect(gpl_comm_t c, int abort);
/* The checkpoint state freed, its background threads ended once what they
 * hold is written (runtime/ckpt/ckpt.c). */
void gpl__ckpt_destroy(gpl_comm_t c);
/* kernels (gpl_reduce.c) */
void gpl_reduce_into(void *acc, const void *in, size_t count, gpl_dtype_t t, gpl_op_t op);
void gpl_scale_avg(void *buf, size_t count, gpl_dtype_t t, int n);
/* float16/bfloat16 <-> float32 */
void gpl_widen(float *dst, const void *src, size_t count, gpl_dtype_t t);
void gpl_narrow(void *dst, const float *src, size_t count, gpl_dtype_t t);

/* waiting (gpl_comm.c): checks the rendezvous for a round end; GPL_OK to keep waiting */
gpl_result_t gpl_check_abort(gpl_comm_t c, uint64_t deadline_ms, const char *waiting_for);

/* shared memory (gpl_shm.c) */
gpl_result_t gpl_shm_setup(gpl_comm_t c);
void gpl_shm_teardown(gpl_comm_t c);
gpl_result_t gpl_shm_barrier(gpl_comm_t c, uint64_t deadline_ms);
/* Tells the node's other ranks that this collective cannot complete. */
void gpl_shm_abort(gpl_comm_t c, const char *why);

/* single-copy all-reduce inside a node (gpl_cma.c) */
gpl_result_t gpl_cma_setup(gpl_comm_t c);
gpl_result_t gpl_cma_allreduce(gpl_comm_t c, const void *s, void *r, size_t count, gpl_dtype_t t,
                               gpl_op_t op, uint64_t deadline);

/* ring of node leaders (gpl_ring.c). Leaders publish their address; every
 * rank then loads the node table. */
/* A connection to host:port, or -1 with why saying what failed (the name's
 * lookup or the connection): the node ring's and the state copy's chain's. */
int gpl_dial(const char *host, int port, char *why, size_t whylen);
gpl_result_t gpl_ring_publish(gpl_comm_t c);
gpl_result_t gpl_nodes_load(gpl_comm_t c);
gpl_result_t gpl_ring_setup(gpl_comm_t c);
void gpl_ring_teardown(gpl_comm_t c);
gpl_result_t gpl_ring_allreduce(gpl_comm_t c, void *buf, size_t count, gpl_dtype_t t, gpl_op_t op,
                                uint64_t deadline_ms);
/* Each node contributes bytes [off[i], off[i]+len[i]) of buf (node i's block). */
gpl_result_t gpl_ring_allgather(gpl_comm_t c, void *buf, const size_t *off, const size_t *len,
                                uint64_t deadline_ms);
gpl_result_t gpl_ring_bcast(gpl_comm_t c, void *buf, size_t bytes, int root_node,
                            uint64_t deadline_ms);
/* base rank and local world size of each node, known after setup */
int gpl_ring_node_base(gpl_comm_t c, int node);
int gpl_ring_node_size(gpl_comm_t c, int node);

/* CPU collectives (gpl_cpu.c) */
gpl_result_t gpl_cpu_allreduce(gpl_comm_t c, const void *s, void *r, size_t count, gpl_dtype_t t,
                               gpl_op_t op);
gpl_result_t gpl_cpu_broadcast(gpl_comm_t c, void *buf, size_t count, gpl_dtype_t t, int root);
gpl_result_t gpl_cpu_allgather(gpl_comm_t c, const void *s, void *r, size_t count, gpl_dtype_t t);
gpl_result_t gpl_cpu_barrier(gpl_comm_t c);

/* NCCL (gpl_nccl.c; stubs without CUDA) */
gpl_result_t gpl_nccl_init(gpl_comm_t c, int device);
void gpl_nccl_finalize(gpl_comm_t c);
/* ncclCommAbort and the state freed: a round whose peers may be gone. */
void gpl_nccl_abort(gpl_comm_t c);
int gpl_nccl_is_device_ptr(const void *p);
/* Makes the comm's GPU current on the calling thread (a helper thread). */
void gpl_nccl_bind_thread(gpl_comm_t c);
/* Enqueues an all-reduce on stream and returns once NCCL holds it, without
 * waiting for its result; gpl_nccl_wait waits for everything on the stream
 * (and watches errors, the deadline and the rendezvous). */
gpl_result_t gpl_nccl_allreduce_enqueue(gpl_comm_t c, const void *s, void *r, size_t count,
                                        gpl_dtype_t t, gpl_op_t op, void *stream);
gpl_result_t gpl_nccl_wait(gpl_comm_t c, void *stream, const char *what);
/* gpl_allreduce in place, but a device buffer on the NCCL backend is only
 * enqueued (gpl_nccl_wait finishes it); *enqueued says which it was. */
gpl_result_t gpl_allreduce_deferred(gpl_comm_t c, void *buf, size_t count, gpl_dtype_t t,
                                    gpl_op_t op, int *enqueued);
gpl_result_t gpl_nccl_broadcast(gpl_comm_t c, void *buf, size_t count, gpl_dtype_t t, int root,
                                void *stream);
gpl_result_t gpl_nccl_allgather(gpl_comm_t c, const void *s, void *r, size_t count, gpl_dtype_t t,
                                void *stream);
/* device memory for gradient buckets (NULL / failure without CUDA) */
void *gpl_dev_alloc(size_t bytes);
void gpl_dev_free(void *p);
int gpl_dev_copy(void *dst, const void *src, size_t bytes);

#endif
