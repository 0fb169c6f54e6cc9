/* The progress channel: how a worker tells its launcher, on every step and
 * without a system call, that it is alive and how long it waits for its peers.
 *
 * The launcher maps one shared-memory region per round (a memfd) with one
 * slot per local worker and gives each worker
 *   GPULAUNCH_PROGRESS_SHM=FD:SLOT  the region (an inherited descriptor) and
 *                                   the worker's slot (its local rank);
 *   GPULAUNCH_PROGRESS_FD=FD        a pipe: any program reports a step with one
 *                                   line, `echo $STEP >&$GPULAUNCH_PROGRESS_FD`;
 *   GPULAUNCH_STACK_SIGNAL=N        the signal a hung worker gets before it is
 *                                   stopped: a Python worker that registered
 *                                   faulthandler on it prints its stacks.
 * The slot layout below is the channel's ABI (docs/health.md); every field is
 * written by its worker alone, with relaxed 8-byte atomic stores, and read by
 * the launcher. Times are CLOCK_MONOTONIC nanoseconds (one clock per machine). */
#ifndef GPULAUNCH_GB_PROGRESS_H
#define GPULAUNCH_GB_PROGRESS_H

#include <stdatomic.h>
#include <stdint.h>

#define GB_PROGRESS_MAGIC 0x676c5052u /* "glPR" */
#define GB_PROGRESS_VERSION 1u
#define GB_PROGRESS_SLOT_BYTES 128 /* two cache lines: no false sharing between workers */
#define GB_PROGRESS_MAX_SLOTS 4096 /* = the most workers a launcher starts */

enum gb_progress_state {
    GB_PROGRESS_RUNNING = 0,
    GB_PROGRESS_SAVING = 1 /* writing a checkpoint: the watchdog waits */
};

typedef struct gb_progress_slot {
    _Atomic uint64_t joined_ns;     /* when the worker attached (0: not yet): watched from then */
    _Atomic uint64_t beat_ns;       /* last sign of progress: a step or a finished collective */
    _Atomic uint64_t step_ns;       /* last step report */
    _Atomic int64_t step;           /* the step last reported */
    _Atomic uint64_t steps;         /* step reports so far */
    _Atomic uint64_t coll_ns;       /* time spent in collectives, in total */
    _Atomic uint64_t coll_since_ns; /* start of the collective in progress; 0: none */
    _Atomic uint64_t colls;         /* collectives finished */
    _Atomic uint32_t state;         /* enum gb_progress_state */
    _Atomic int32_t stack_signal;   /* signal that dumps this worker's stacks; 0: none */
    _Atomic int32_t pid;
    _Atomic int32_t ckpt_ready; /* 1: the worker saves a checkpoint when stopped (its
                                   runtime handles SIGTERM): a preemption's stop is held
                                   for workers that have not said so yet */
    _Atomic uint64_t wait_ns; /* last sign of life while waiting inside a collective (libgpulaunch's
                                 wait loops, every 20 ms): a rank in a collective whose this
                                 goes stale is stuck there itself, not waiting for a peer */
    _Atomic int32_t reform_ok;  /* 1: the worker re-forms in place when its round ends (it
                                   waits for the next round in the round block instead of
                                   being restarted: docs/reliability.md, live re-formation) */
    _Atomic uint32_t round_ack; /* the round the worker runs in since a re-formation (0: the
                                   one it was started in) */
    /* checkpoints (libgpulaunch's, docs/checkpoints.md), steps + 1 (0: none yet) */
    _Atomic int64_t ckpt_local1;      /* newest step of this worker's files in the first tier */
    _Atomic int64_t ckpt_durable1;    /* newest step every rank's files are in the durable tier */
    _Atomic uint64_t ckpt_stall_us;   /* what the last save stopped training for */
    _Atomic uint64_t ckpt_drain_left; /* bytes of the drain in flight still to copy (0: none) */
} gb_progress_slot;

typedef struct gb_progress_header {
    uint32_t magic, version, nslots, slot_bytes;
    uint32_t round_off; /* byte offset of the round block (0: none, an older launcher) */
    char reserved[GB_PROGRESS_SLOT_BYTES - 20];
} gb_progress_header;

/* The round block, after the slots: written by the launcher alone, read by
 * its workers that re-form in place. The launcher writes the fields, then
 * state, then bumps seq (release) and wakes the futex on seq. */
enum gb_round_state {
    GB_ROUND_RUNNING = 0, /* the round the workers were started in, or took */
    GB_ROUND_OVER = 1,    /* the round ended; the next one is being formed: wait */
    GB_ROUND_NEW = 2,     /* the next round, for the workers to take (the fields below) */
    GB_ROUND_RESTART = 3  /* no re-formation: the workers are stopped and restarted */
};

#define GB_ROUND_ADDR_MAX 256
#define GB_ROUND_WHY_MAX 256
#define GB_ROUND_IFNAME_MAX 64
#define GB_PROGRESS_ROUND_BYTES 1024

typedef struct gb_progress_round {
    _Atomic uint32_t seq;   /* futex word: bumped on every change */
    _Atomic uint32_t state; /* enum gb_round_state */
    uint32_t round, node_rank, nnodes, base_rank, world_size, master_port;
    uint32_t restarts; /* TORCHELASTIC_RESTART_COUNT of the workers */
    uint32_t go_on;    /* 1: a preemption notice from another node does not stop the
                          workers that re-form in place: they save the same step as
                          every rank and go on (the launcher keeps them) */
    char master_addr[GB_ROUND_ADDR_MAX];
    char why[GB_ROUND_WHY_MAX]; /* why the round ended (GB_ROUND_OVER, GB_ROUND_RESTART) */
    char nccl_ifname[GB_ROUND_IFNAME_MAX]; /* NCCL_SOCKET_IFNAME the launcher chose for the
                                              round ("": none), for workers started before it */
    char reserved[GB_PROGRESS_ROUND_BYTES - 10 * 4 - GB_ROUND_ADDR_MAX - GB_ROUND_WHY_MAX -
                  GB_ROUND_IFNAME_MAX];
} gb_progress_round;

_Static_assert(sizeof(gb_progress_round) == GB_PROGRESS_ROUND_BYTES, "round block size is the ABI");

_Static_assert(sizeof(gb_progress_slot) == GB_PROGRESS_SLOT_BYTES, "slot size is the ABI");
_Static_assert(sizeof(gb_progress_header) == GB_PROGRESS_SLOT_BYTES, "header size is the ABI");

/* Bytes of a region with n slots (the header, then the slots). */
static inline uint64_t gb_progress_region_bytes(uint32_t n) {
    return (uint64_t)GB_PROGRESS_SLOT_BYTES * (1u + n);
}

/* Bytes of a region with n slots and the round block after them. */
static inline uint64_t gb_progress_region_bytes_v2(uint32_t n) {
    return gb_progress_region_bytes(n) + GB_PROGRESS_ROUND_BYTES;
}

/* ---- the worker's side (libgpulaunch; one slot per process) ---- */

/* This process's slot from GPULAUNCH_PROGRESS_SHM, mapped on first use; NULL
 * outside gpulaunch or when the variable is malformed (said once on stderr).
 * Attaching marks the worker as joined: the watchdog watches it from then. */
gb_progress_slot *gb_progress_attach(void);
/* A step finished. No system call: one clock read (vDSO) and a few stores. */
void gb_progress_step(int64_t step);
/* A collective begins / ends: the time with at least one in progress, in
 * any thread, counts once (nested and overlapping calls). */
void gb_progress_coll_begin(void);
void gb_progress_coll_end(void);
void gb_progress_set_state(enum gb_progress_state s);
/* Alive while waiting inside a collective (called by its wait loop). */
void gb_progress_wait_alive(void);
void gb_progress_set_stack_signal(int sig);
/* The worker can save a checkpoint when stopped from now on (1), or no more (0). */
void gb_progress_set_ckpt_ready(int ready);
/* The checkpoint's figures for the launcher (steps: -1 for none). */
void gb_progress_ckpt(int64_t local_step, int64_t durable_step, uint64_t stall_us,
                      uint64_t drain_left);
/* The worker re-forms in place when its round ends (1), or no more (0).
 * -1 when the launcher has no round block (an older one, or none). */
int gb_progress_set_reform_ok(int ok);
/* The round block, NULL without one. */
const gb_progress_round *gb_progress_round_block(void);
/* Waits until the round block's seq differs from seen (futex), at most
 * timeout_ms; then copies the block into out (a consistent copy: seq the same
 * before and after). 0 with out filled, 1 on timeout, -1 without a block. */
int gb_progress_round_wait(uint32_t seen, uint32_t timeout_ms, gb_progress_round *out);
/* Tells the launcher this worker runs in round `round` now. */
void gb_progress_round_ack(uint32_t round);
/* 1 when this worker re-forms in place and its launcher keeps such workers
 * through another node's preemption (the round block's go_on), else 0. */
int gb_progress_goes_on(void);
/* 1 when this worker re-forms in place and the launcher published a round
 * state since seq `seen` other than RUNNING (its round ended, or the next one
 * waits to be taken), else 0. One atomic load: for every collective's entry. */
int gb_progress_round_moved(uint32_t seen);

#endif
