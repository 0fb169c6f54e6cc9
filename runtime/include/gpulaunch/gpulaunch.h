/* gpulaunch runtime: the C library that training code links for
 * data-parallel gradient sync (NCCL on GPUs, a CPU backend everywhere).
 * One prefix (gpl_), opaque handles, versioned options. */
#ifndef GPULAUNCH_GPULAUNCH_H
#define GPULAUNCH_GPULAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include "gpulaunch/gpl_error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GPL_VERSION_MAJOR 0
#define GPL_VERSION_MINOR 1
#define GPL_VERSION_PATCH 0
#define GPL_VERSION_CODE (GPL_VERSION_MAJOR * 10000 + GPL_VERSION_MINOR * 100 + GPL_VERSION_PATCH)

/* The library's version as GPL_VERSION_CODE, for comparing with the header's. */
GPL_API int gpl_version(void);

/* Whether this build has the NCCL backend, and how many CUDA devices the
 * process sees (0 without a driver or a device: that is not an error). */
GPL_API int gpl_have_nccl(void);
GPL_API int gpl_cuda_device_count(void);

/* ---- communicator ---- */

typedef struct gpl_comm *gpl_comm_t;

typedef enum gpl_dtype {
    GPL_FLOAT32 = 0,
    GPL_FLOAT64 = 1,
    GPL_FLOAT16 = 2,
    GPL_BFLOAT16 = 3, /* half types are reduced in float32 */
    GPL_INT32 = 4,
    GPL_INT64 = 5,
    GPL_DTYPE_COUNT
} gpl_dtype_t;

typedef enum gpl_op {
    GPL_SUM = 0,
    GPL_PROD = 1,
    GPL_MIN = 2,
    GPL_MAX = 3,
    GPL_AVG = 4,
    GPL_OP_COUNT
} gpl_op_t;

typedef enum gpl_backend {
    GPL_BACKEND_AUTO = 0, /* NCCL when built with CUDA and a device is present, else CPU */
    GPL_BACKEND_CPU = 1,
    GPL_BACKEND_NCCL = 2,
    GPL_BACKEND_EXTERNAL = 3 /* the caller's collectives: gpl_init_external */
} gpl_backend_t;

#define GPL_OPTIONS_VERSION 1
/* Options for gpl_init. Always start from GPL_OPTIONS_INIT so that fields
 * added later get their defaults. -1 / NULL mean "from the launcher's
 * environment". */
typedef struct gpl_options {
    size_t size;           /* sizeof(gpl_options) */
    uint32_t version;      /* GPL_OPTIONS_VERSION */
    gpl_backend_t backend; /* also GPULAUNCH_BACKEND=auto|cpu|nccl */
    uint32_t timeout_ms;   /* per collective; also GPULAUNCH_TIMEOUT_MS (default 300000) */
    int rank, world_size, local_rank, local_world_size;
    const char *rdzv_endpoint, *run_id, *token;
    int round;
    size_t small_bytes; /* all-reduce at or under this uses the latency-optimal path */
    int device;         /* CUDA device; -1: the launcher's binding, else LOCAL_RANK */
} gpl_options;

#define GPL_OPTIONS_INIT                                                                           \
    {                                                                                              \
        sizeof(gpl_options), GPL_OPTIONS_VERSION, GPL_BACKEND_AUTO, 0, -1, -1, -1, -1, NULL, NULL, \
            NULL, -1, 0, -1                                                                        \
    }

/* Creates the communicator of this process from the launcher's environment
 * (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GPULAUNCH_RDZV_ENDPOINT,
 * GPULAUNCH_RUN_ID, GPULAUNCH_ROUND, GPULAUNCH_RDZV_TOKEN). Without a launcher
 * it is a world of one. On failure *comm is still set when memory allowed, so
 * that gpl_last_error(*comm) can say why; free it with gpl_finalize. */
GPL_API gpl_result_t gpl_init(const gpl_options *opts, gpl_comm_t *comm);
GPL_API void gpl_finalize(gpl_comm_t comm);

/* Collectives of another framework, for a program that another launcher
 * started (torchrun: torch.distributed's process group). Each runs in place
 * over every rank and returns 0, or non-zero when it failed (the call then
 * fails with GPL_ERR_PEER_FAILED). Start from GPL_EXTERNAL_OPS_INIT. */
#define GPL_EXTERNAL_OPS_VERSION 1
typedef struct gpl_external_ops {
    size_t size;
    uint32_t version;
    int (*allreduce)(void *buf, size_t count, gpl_dtype_t dtype, gpl_op_t op, void *user);
    int (*broadcast)(void *buf, size_t count, gpl_dtype_t dtype, int root, void *user);
    int (*barrier)(void *user);
    void *user;
} gpl_external_ops;
#define GPL_EXTERNAL_OPS_INIT                                                                      \
    { sizeof(gpl_external_ops), GPL_EXTERNAL_OPS_VERSION, NULL, NULL, NULL, NULL }

/* A communicator whose collectives on host memory are the caller's ops
 * (backend GPL_BACKEND_EXTERNAL): the checkpoint agreement, restore and
 * barrier work under any launcher. No rendezvous: checkpoint events of other
 * nodes do not reach it, SIGTERM does. Errors as gpl_init. */
GPL_API gpl_result_t gpl_init_external(int rank, int world_size, int local_rank,
                                       int local_world_size, const gpl_external_ops *ops,
                                       gpl_comm_t *comm);

GPL_API int gpl_rank(gpl_comm_t comm);
GPL_API int gpl_world_size(gpl_comm_t comm);
GPL_API int gpl_local_rank(gpl_comm_t comm);
GPL_API int gpl_local_world_size(gpl_comm_t comm);
GPL_API gpl_backend_t gpl_backend(gpl_comm_t comm);
/* What failed last on this communicator, where, and what to do. */
GPL_API const char *gpl_last_error(gpl_comm_t comm);
GPL_API size_t gpl_dtype_size(gpl_dtype_t t);

/* Collectives. stream is a cudaStream_t for NCCL (NULL: the default
 * stream) and ignored by the CPU backend. Every call has the communicator's
 * timeout; a peer that dies or a round that ends makes it return an error
 * naming the ranks that never arrived and the collective's sequence number. */
GPL_API gpl_result_t gpl_allreduce(gpl_comm_t comm, const void *sendbuf, void *recvbuf,
                                   size_t count, gpl_dtype_t dtype, gpl_op_t op, void *stream);
GPL_API gpl_result_t gpl_broadcast(gpl_comm_t comm, void *buf, size_t count, gpl_dtype_t dtype,
                                   int root, void *stream);
/* recvbuf holds world_size * count elements, rank r's at r * count. */
GPL_API gpl_result_t gpl_allgather(gpl_comm_t comm, const void *sendbuf, void *recvbuf,
                                   size_t count, gpl_dtype_t dtype, void *stream);
GPL_API gpl_result_t gpl_barrier(gpl_comm_t comm);

/* Removes this library's shared-memory segments (/dev/shm/gpulaunch-*) whose
 * creating process is dead; gpl_init does it on every node. Returns how many
 * were removed; report (may be NULL) lists them. */
GPL_API int gpl_shm_clean_stale(char *report, size_t len);

/* ---- data-parallel gradient sync ---- */

typedef struct gpl_dp *gpl_dp_t;

#define GPL_DP_OPTIONS_VERSION 1
typedef struct gpl_dp_options {
    size_t size;
    uint32_t version;
    size_t bucket_cap_bytes;   /* default 25 MiB */
    size_t first_bucket_bytes; /* default 1 MiB */
} gpl_dp_options;
#define GPL_DP_OPTIONS_INIT                                                                        \
    { sizeof(gpl_dp_options), GPL_DP_OPTIONS_VERSION, 25u << 20, 1u << 20 }

GPL_API gpl_result_t gpl_dp_create(gpl_comm_t comm, const gpl_dp_options *opts, gpl_dp_t *dp);
/* Registers one gradient buffer; buffers are bucketed in registration order
 * reversed (backward produces the last layer's gradient first). *index
 * names it in gpl_dp_ready. Register all buffers before the first step.
 * Gradients that lie back to back in one allocation are reduced in place (no
 * copies): between gpl_dp_ready and gpl_dp_wait a gradient must not be
 * written. */
GPL_API gpl_result_t gpl_dp_register(gpl_dp_t dp, void *grad, size_t count, gpl_dtype_t dtype,
                                     int *index);
/* Marks a gradient as produced for this step; a full bucket is reduced at once. */
GPL_API gpl_result_t gpl_dp_ready(gpl_dp_t dp, int index);
/* Finishes the step: every registered gradient averaged over the world. */
GPL_API gpl_result_t gpl_dp_wait(gpl_dp_t dp);
/* The buckets (built at the first step, or by this call) and how many of them
 * are reduced in place. */
GPL_API gpl_result_t gpl_dp_info(gpl_dp_t dp, int *buckets, int *in_place);
GPL_API void gpl_dp_destroy(gpl_dp_t dp);

/* ---- checkpoints and preemption ---- */

/* The exit code of a worker that stopped after a preemption checkpoint:
 * retryable under PyTorchJob restartPolicy: ExitCode. */
#define GPL_EXIT_PREEMPTED 143

typedef struct gpl_ckpt *gpl_ckpt_t;

/* Writes this rank's state for step with gpl_ckpt_write; seconds_left is the
 * time before the node goes away (a large number for periodic checkpoints). */
typedef gpl_result_t (*gpl_save_fn)(gpl_ckpt_t ck, int64_t step, double seconds_left, void *user);
/* Reads the state of step with gpl_ckpt_read. */
typedef gpl_result_t (*gpl_load_fn)(gpl_ckpt_t ck, int64_t step, void *user);

/* Version 2 added durable, keep_durable and async_save; a version 1 struct
 * (its smaller size) is still taken, with their defaults. */
#define GPL_CKPT_OPTIONS_VERSION 3
typedef struct gpl_ckpt_options {
    size_t size;
    uint32_t version;
    const char *dir;      /* the first tier: where step-NNNNNNNNNNNN/ directories go, usually
                             the node's local disk (NVMe); NULL: the durable tier alone, or
                             never save without one */
    int keep;             /* complete checkpoints kept in dir (default 3) */
    int64_t every_steps;  /* periodic checkpoint every N steps (0: off) */
    double every_seconds; /* periodic checkpoint every T seconds, rank 0's clock (0: off) */
    int handle_sigterm;   /* 1: SIGTERM asks for a checkpoint instead of killing (default) */
    /* version 2 */
    const char *durable; /* the durable tier, drained to in the background from dir: a
                            shared directory (a PVC on EFS, FSx, NFS) or s3://bucket/prefix
                            (which needs dir); NULL: none (docs/checkpoints.md) */
    int keep_durable;    /* complete checkpoints kept in the durable tier (0: keep's value) */
    int async_save;      /* 1 (default): step_end stalls only for the copy of the state into
                            a staging buffer in host memory, and the files are written in the
                            background; 0: step_end returns once this rank's files are written */
    /* version 3 */
    uint64_t state_bytes; /* this rank's checkpoint size when known (0: not known): with
                             async_save its staging buffer is faulted in at setup, in the
                             background, so that the first save too stalls only for the copy */
} gpl_ckpt_options;
#define GPL_CKPT_OPTIONS_INIT                                                                      \
    { sizeof(gpl_ckpt_options), GPL_CKPT_OPTIONS_VERSION, NULL, 3, 0, 0.0, 1, NULL, 0, 1, 0 }

GPL_API gpl_result_t gpl_ckpt_setup(gpl_comm_t comm, const gpl_ckpt_options *opts, gpl_save_fn save,
                                    gpl_load_fn load, void *user);
/* Loads the newest complete checkpoint (torn or partial ones are skipped and
 * reported on stderr) through the load callback; *step is its step, or -1
 * when there is none. */
GPL_API gpl_result_t gpl_ckpt_restore(gpl_comm_t comm, int64_t *step);
/* Call once per step, after the update. Every rank agrees (one small
 * all-reduce) on whether to checkpoint this step: a preemption anywhere
 * (SIGTERM here, or a checkpoint event from the rendezvous) or a periodic
 * checkpoint. Returns GPL_ERR_PREEMPTED when the loop must stop: the
 * checkpoint of this step is written; exit with GPL_EXIT_PREEMPTED. */
GPL_API gpl_result_t gpl_step_end(gpl_comm_t comm, int64_t step);
/* In the save callback: one named file of this rank, written to a temporary
 * name, fsync'd, renamed, with its size and SHA-256 in the rank's manifest. */
GPL_API gpl_result_t gpl_ckpt_write(gpl_ckpt_t ck, const char *name, const void *data, size_t len);
/* In the load callback: this rank's file of that name, else rank 0's (so
 * replicated state reloads at any world size). GPL_ERR_NOT_FOUND when
 * neither exists; GPL_ERR_CORRUPT when the size differs from len. */
GPL_API gpl_result_t gpl_ckpt_read(gpl_ckpt_t ck, const char *name, void *data, size_t len);

/* For state too large to hold twice in memory, written by the caller's own
 * writer (torch.save): in the save callback, gpl_ckpt_temp_path gives the
 * temporary file to write `name` to; gpl_ckpt_commit then fsyncs it, hashes
 * it in GPL_CKPT_HASH_PIECE pieces, renames it into place and records it in
 * the manifest, as gpl_ckpt_write does. */
#define GPL_CKPT_HASH_PIECE (1u << 20)
GPL_API gpl_result_t gpl_ckpt_temp_path(gpl_ckpt_t ck, const char *name, char *path, size_t len);
GPL_API gpl_result_t gpl_ckpt_commit(gpl_ckpt_t ck, const char *name);
/* In the load callback: the path of this rank's file `name`, else rank 0's
 * (GPL_ERR_NOT_FOUND when neither exists), for the caller's own reader. */
GPL_API gpl_result_t gpl_ckpt_path(gpl_ckpt_t ck, const char *name, char *path, size_t len);
/* In the load callback, for state sharded across ranks (each rank saved its
 * own part; a world of another size reads the parts it now owns): the path of
 * file `name` as rank `rank` of the saving world saved it, checked against
 * that rank's manifest (size and SHA-256; GPL_ERR_CORRUPT when no tier has a
 * good copy), fetched from the durable tier when it is not in the first one
 * (a node's local disk holds its own ranks' files only). GPL_ERR_NOT_FOUND
 * when that rank saved no such file. */
GPL_API gpl_result_t gpl_ckpt_rank_path(gpl_ckpt_t ck, int rank, const char *name, char *path,
                                        size_t len);
/* In the load callback: how many ranks saved the step being loaded (0 outside it). */
GPL_API int gpl_ckpt_saved_world(gpl_ckpt_t ck);
/* The communicator a save or load callback's checkpoint belongs to. */
GPL_API gpl_comm_t gpl_ckpt_comm(gpl_ckpt_t ck);

/* In the save callback: `size` bytes of the staging buffer that become this
 * rank's file `name`; the caller fills *buf before the callback returns (a
 * CUDA program copies device memory into it; gpl_ckpt_write is this plus a
 * memcpy). The pointer is valid until the callback returns. */
GPL_API gpl_result_t gpl_ckpt_stage(gpl_ckpt_t ck, const char *name, size_t size, void **buf);

/* Waits until this rank's saves are written and drained to the durable tier,
 * then agrees with every rank (a collective) and marks the newest step every
 * rank wrote COMPLETE in each tier. Call it once after the training loop:
 * the last checkpoint is then complete everywhere. */
GPL_API gpl_result_t gpl_ckpt_wait(gpl_comm_t comm);

/* What the checkpoints of this rank are doing (versioned like the options). */
#define GPL_CKPT_STATUS_VERSION 1
typedef struct gpl_ckpt_status {
    size_t size;
    uint32_t version;
    int64_t local_step;    /* newest step this rank's files are written in the first tier (-1) */
    int64_t durable_step;  /* newest step this rank's files are in the durable tier (-1) */
    int64_t complete_step; /* newest step this rank knows every rank wrote (-1) */
    int64_t durable_complete_step;     /* newest step every rank drained (-1) */
    double last_stall_s;               /* what the last save stopped training for */
    double last_wait_s;                /* of that, waiting for the previous save still writing */
    uint64_t drain_bytes, drain_total; /* the drain in flight (0, 0: none) */
    double drain_rate;                 /* bytes/s of the last drain */
} gpl_ckpt_status;
#define GPL_CKPT_STATUS_INIT                                                                       \
    { sizeof(gpl_ckpt_status), GPL_CKPT_STATUS_VERSION, -1, -1, -1, -1, 0, 0, 0, 0, 0 }
GPL_API gpl_result_t gpl_ckpt_status_get(gpl_comm_t comm, gpl_ckpt_status *out);

/* ---- progress: the launcher's hang watchdog and straggler detection ---- */

/* Tells this worker's launcher that `step` finished (gpulaunch
 * --progress-timeout; docs/health.md): one clock read and a few stores into
 * memory shared with the launcher, no system call, well under 1 us. A no-op
 * outside gpulaunch. gpl_step_end calls it; programs that do not use
 * checkpoints call it once per step. The collectives also count as progress,
 * and the time spent in them (waiting for the last rank) names stragglers. */
GPL_API void gpl_progress(int64_t step);
/* This process prints its stacks on signal sig (Python's faulthandler): the
 * watchdog sends it to a hung worker before stopping it. */
GPL_API void gpl_progress_stack_signal(int sig);
/* Bracket the time this process waits in a collective outside libgpulaunch
 * (a framework's all-reduce; gpulaunch.allreduce_hook does it for PyTorch
 * DDP), so that the launcher learns who waits for whom. Calls may nest and
 * overlap across threads: the time with at least one open counts. */
GPL_API void gpl_progress_wait_begin(void);
GPL_API void gpl_progress_wait_end(void);

/* ---- live re-formation: a round's end without a restart ----
 *
 * A worker that calls gpl_reform_enable is not stopped when its round ends
 * (a node lost, preempted, or a new node to take in): its launcher keeps it,
 * joins the next round and hands it over through memory shared with the
 * worker. The program's collectives of the ended round fail
 * (GPL_ERR_ROUND_OVER, GPL_ERR_PEER_FAILED or GPL_ERR_TIMEOUT); it calls
 * gpl_reform, which waits for the next round and re-makes the communicator
 * in place (same handle, new rank and world), then gpl_reform_agree, which
 * says which rank's state every rank goes on from and whether it must be
 * copied (gpl_copy_state from info.root, e.g. to a new node's ranks). A
 * re-formation that cannot be done ends in the launcher's restart, as
 * without it (docs/reliability.md). */

typedef enum gpl_round_state {
    GPL_ROUND_RUNNING = 0, /* the round this worker was started in, or took */
    GPL_ROUND_OVER = 1,    /* the round ended; the next one is being formed */
    GPL_ROUND_NEW = 2,     /* the next round is there to take */
    GPL_ROUND_RESTART = 3  /* no re-formation: this worker is stopped and restarted */
} gpl_round_state;

/* The launcher's view of this worker's round (gpl_round_wait). */
typedef struct gpl_round_info {
    uint32_t seq; /* changes with every change below */
    gpl_round_state state;
    int round, node_rank, nnodes, base_rank, world_size, master_port, restarts;
    char master_addr[256];
    char why[256]; /* why the round ended */
} gpl_round_info;

/* Tells the launcher this worker re-forms in place from now on.
 * GPL_ERR_UNSUPPORTED outside gpulaunch or when its progress channel is off
 * (--progress-timeout 0 --stats-interval 0): the worker is restarted then. */
GPL_API gpl_result_t gpl_reform_enable(void);
/* Waits until the launcher's round state differs from seq (0 the first time;
 * then the last info.seq), at most timeout_ms: GPL_OK with *info filled,
 * GPL_ERR_TIMEOUT, or GPL_ERR_UNSUPPORTED without a launcher that hands
 * rounds over. Takes no communicator: a watcher thread may wait in it. */
GPL_API gpl_result_t gpl_round_wait(uint32_t seq, uint32_t timeout_ms, gpl_round_info *info);
/* Tells the launcher this worker runs in round `round` now (gpl_reform does
 * it; a program re-forming its own framework calls it). */
GPL_API void gpl_round_ack(int round);
/* A worker started before its node had a round (a warm join: a new node of a
 * job whose nodes all re-form in place starts its workers first, with
 * GPULAUNCH_ROUND_PENDING=1 and no RANK, WORLD_SIZE, MASTER_ADDR, ...): says
 * it re-forms in place, waits for its first round (at most timeout_ms; 0: as
 * long as its launcher takes), takes it, and sets RANK, ROLE_RANK,
 * GROUP_RANK, WORLD_SIZE, ROLE_WORLD_SIZE, GROUP_WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT, GPULAUNCH_ROUND, GPULAUNCH_NODE_RANK and
 * TORCHELASTIC_RESTART_COUNT in the environment as a worker started in that
 * round has them; *info (may be NULL) says the round. Any other worker:
 * GPL_OK at once, info->round -1. gpl_init calls it first; a program that
 * reads RANK & co. before gpl_init calls it itself (gpulaunch.Elastic does).
 * GPL_ERR_ROUND_OVER when the launcher gives the worker up (exit then: it is
 * started again once its node has a round), GPL_ERR_TIMEOUT,
 * GPL_ERR_UNSUPPORTED without the launcher's round block. */
GPL_API gpl_result_t gpl_await_round(uint32_t timeout_ms, gpl_round_info *info);
/* After a collective of an ended round failed: waits (at most timeout_ms) for
 * the next round and re-makes comm for it in place: the rendezvous
 * attachment, shared memory, the node ring and NCCL (ncclCommAbort, then a
 * new communicator). gpl_rank and gpl_world_size say the new ones; the
 * program's buffers, gpl_dp and gpl_ckpt objects stay valid. A round that
 * ends again while it is re-made is waited for again. GPL_ERR_ROUND_OVER when
 * the launcher restarts this worker instead (exit then), GPL_ERR_TIMEOUT. */
GPL_API gpl_result_t gpl_reform(gpl_comm_t comm, uint32_t timeout_ms);
/* The round comm runs in. */
GPL_API int gpl_round(gpl_comm_t comm);

typedef struct gpl_reform_info {
    int64_t step;  /* the step every rank goes on after (-1: no rank has state) */
    int root;      /* the rank whose state that is (lowest rank at that step); -1: none */
    int survivors; /* ranks that came with state */
    int copy;      /* 1: some rank's state is not that one's: copy it from root */
    int mine;      /* 1: this rank's state is replaced by the copy */
} gpl_reform_info;

/* Every rank says the step its state is at (the last one it completed; -1
 * for none: a new node's rank) and learns where the job goes on from (one
 * small allgather). When info->copy, every rank then calls gpl_copy_state
 * (or gpl_broadcast(..., info->root, ...) on each buffer) with its state (a
 * rank ahead of the others, whose last collective completed where another's
 * failed, is set back). */
GPL_API gpl_result_t gpl_reform_agree(gpl_comm_t comm, int64_t step, gpl_reform_info *info);

/* After gpl_reform_agree: gives the ranks that lack it (info->mine) the
 * state of info->root, n buffers of bytes[i] bytes each (the same sizes on
 * every rank; a buffer of 0 bytes may be NULL). Every rank of the world calls
 * it with its own info; when !info->copy it returns GPL_OK at once, without
 * communication. Host buffers go, on every backend, through a chain that only
 * the root and the ranks that need the state are in: the root sends the state
 * once over TCP to the first of them (in rank order), which passes each byte
 * on to the next as soon as it has it, and so on; every other rank takes part
 * in one small allgather (the needers' addresses), then waits for the copy's
 * end asleep (in the rendezvous' store, not spinning on the cores the copy
 * needs), as it would wait for those ranks anyway. So the copy runs at
 * about one link's bandwidth (each link is two TCP connections from 16 MiB
 * on), whatever the number of ranks that need it.
 * Device buffers on the NCCL backend go by ncclBroadcast, and every buffer on
 * a gpl_init_external communicator by the framework's broadcast: their sizes
 * must be multiples of 2 bytes (else GPL_ERR_INVALID_ARG). Limits: worlds of
 * up to 15,000 ranks (the allgather's 4 MiB staging area; GPL_ERR_LIMIT
 * beyond), the collective timeout for the whole copy (GPL_ERR_TIMEOUT).
 * GPL_ERR_ROUND_OVER when the round ends during the copy (call gpl_reform
 * and gpl_reform_agree again: a rank that needed the state holds part of it,
 * so it agrees with step -1), GPL_ERR_PEER_FAILED when a rank of the chain
 * drops out otherwise, GPL_ERR_INVALID_ARG when the sizes differ between the
 * root and a rank that needs the state. */
GPL_API gpl_result_t gpl_copy_state(gpl_comm_t comm, void *const bufs[], const size_t bytes[],
                                    int n, const gpl_reform_info *info);

/* ---- copies of sharded state in peers' memory (gpl_mirror) ----
 *
 * Sharded state (FSDP: each rank holds 1/N of the parameters and optimizer
 * state) has no second copy: a lost node takes its ranks' shards with it.
 * A mirror keeps one in a peer's host memory, on another node. The program
 * registers host buffers (its own snapshot), and every K steps fills them
 * (between gpl_mirror_stage and gpl_mirror_push) with its state; the push
 * sends them in the background, with their SHA-256, to its buddy (the same
 * local rank on the next node; the next rank in a one-node job), which keeps
 * the two newest checked copies. After a loss and gpl_reform, every rank of
 * the new world calls gpl_mirror_agree: the newest step for which every
 * rank of the old world has a copy (its own snapshot on a survivor, or the
 * one its buddy holds), and who holds each; the program then goes back to
 * that step: gpl_mirror_view (a copy held here) and gpl_mirror_fetch (from
 * whichever rank holds it) give each old rank's buffers.
 *
 * Host memory: the registered buffers (one snapshot), and on the buddy two
 * copies of each rank it holds (the newest checked one, and the one being
 * received): three times a rank's shard bytes in all. Limits: 64 buffers a
 * rank, 8 ranks held by one rank (a node of more ranks than the next one's). */
#define GPL_MIRROR_MAX_BUFS 64
#define GPL_MIRROR_OPTIONS_VERSION 1

typedef struct gpl_mirror *gpl_mirror_t;
typedef struct gpl_mirror_plan *gpl_mirror_plan_t;

typedef struct gpl_mirror_options {
    int version;         /* GPL_MIRROR_OPTIONS_VERSION */
    uint32_t timeout_ms; /* one push's or fetch's deadline; 0: the communicator's timeout */
} gpl_mirror_options;
#define GPL_MIRROR_OPTIONS_INIT                                                                    \
    { GPL_MIRROR_OPTIONS_VERSION, 0 }

/* Collective over comm: each rank's server (a thread that takes its buddy's
 * pushes and serves fetches) and the buddies' addresses. opts may be NULL. */
GPL_API gpl_result_t gpl_mirror_create(gpl_comm_t comm, const gpl_mirror_options *opts,
                                       gpl_mirror_t *m);
/* Adds a host buffer to the snapshot (before the first stage). */
GPL_API gpl_result_t gpl_mirror_register(gpl_mirror_t m, void *buf, size_t bytes);
/* Waits for the push in flight (its time: status.last_wait_s), then hands the
 * registered buffers to the program to fill: they hold no step until the
 * next gpl_mirror_push. */
GPL_API gpl_result_t gpl_mirror_stage(gpl_mirror_t m);
/* The buffers hold step's state: sends them to the buddy in the background
 * and returns. They must not change until the next gpl_mirror_stage. */
GPL_API gpl_result_t gpl_mirror_push(gpl_mirror_t m, int64_t step);
/* Waits for the push in flight: GPL_OK once the buddy holds it checked;
 * GPL_ERR_PEER_FAILED (the buddy is gone: the copy is not held),
 * GPL_ERR_CORRUPT (the buddy's SHA-256 differed), GPL_ERR_TIMEOUT. */
GPL_API gpl_result_t gpl_mirror_wait(gpl_mirror_t m);

typedef struct gpl_mirror_status {
    int rank, world, round; /* this rank in the world its copies are made in */
    int buddy;              /* the rank they go to (-1: a world of one) */
    int buddy_same_node;    /* 1: on this node (a one-node job): a lost node takes both */
    int64_t own_step;       /* the step the registered buffers hold (-1: none) */
    int64_t sent_step;      /* the newest step the buddy holds checked (-1: none) */
    int in_flight;          /* a push is being sent */
    size_t bytes;           /* registered */
    size_t held_bytes;      /* host memory holding other ranks' copies */
    int held_ranks;         /* ranks whose copies this one holds */
    double last_push_s;     /* the last push's time to its buddy's check */
    double last_rate_mbs;   /* its rate, MB/s */
    double last_wait_s;     /* how long the last stage waited for the push before */
} gpl_mirror_status;
GPL_API gpl_result_t gpl_mirror_status_get(gpl_mirror_t m, gpl_mirror_status *st);
/* What the last failed call on m said (what, where, what to do). */
GPL_API const char *gpl_mirror_last_error(gpl_mirror_t m);
/* Cancels a push in flight, stops the server; frees the held copies. */
GPL_API void gpl_mirror_destroy(gpl_mirror_t m);

/* After a loss: collective over comm (re-formed: the new world), m this
 * rank's mirror of the old world (NULL: none, e.g. a new node's rank). Stops
 * m taking pushes; agrees on the newest step at which every rank of the
 * newest old world has a copy on a rank of the new one; *plan says it.
 * GPL_ERR_STATE (gpl_last_error(comm) names the old ranks whose copies are
 * gone, e.g. a rank and its buddy both lost) when there is none: restore a
 * checkpoint instead. */
GPL_API gpl_result_t gpl_mirror_agree(gpl_comm_t comm, gpl_mirror_t m, gpl_mirror_plan_t *plan);
/* The agreed step and the old world's size and round. */
GPL_API void gpl_mirror_plan_info(gpl_mirror_plan_t p, int64_t *step, int *old_world,
                                  int *old_round);
/* The rank (of the new world) that holds old rank's copy: the rank that
 * was it, else the lowest one holding its buddy's copy. */
GPL_API int gpl_mirror_holder(gpl_mirror_plan_t p, int old_rank);
/* Buffer i of old rank's copy, when this rank holds it (GPL_ERR_NOT_FOUND
 * otherwise): read-only, valid until gpl_mirror_destroy of the mirror. */
GPL_API gpl_result_t gpl_mirror_view(gpl_mirror_plan_t p, int old_rank, int i, const void **data,
                                     size_t *bytes);
/* Old rank's copy into n buffers of its sizes (GPL_ERR_INVALID_ARG when they
 * differ): from this rank's memory, or over TCP from its holder, checked
 * against its SHA-256 (GPL_ERR_CORRUPT). Not collective: holders serve
 * while they run (keep every mirror until every rank fetched: a barrier). */
GPL_API gpl_result_t gpl_mirror_fetch(gpl_mirror_plan_t p, int old_rank, void *const bufs[],
                                      const size_t bytes[], int n);
GPL_API void gpl_mirror_plan_free(gpl_mirror_plan_t p);

#ifdef __cplusplus
}
#endif
#endif
