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
                                 wait loops, every 100 ms): a rank in a collective whose this
                                 goes stale is stuck there itself, not waiting for a peer */
    char reserved[GB_PROGRESS_SLOT_BYTES - 9 * 8 - 4 * 4];
} gb_progress_slot;

typedef struct gb_progress_header {
    uint32_t magic, version, nslots, slot_bytes;
    char reserved[GB_PROGRESS_SLOT_BYTES - 16];
} gb_progress_header;

_Static_assert(sizeof(gb_progress_slot) == GB_PROGRESS_SLOT_BYTES, "slot size is the ABI");
_Static_assert(sizeof(gb_progress_header) == GB_PROGRESS_SLOT_BYTES, "header size is the ABI");

/* Bytes of a region with n slots (the header, then the slots). */
static inline uint64_t gb_progress_region_bytes(uint32_t n) {
    return (uint64_t)GB_PROGRESS_SLOT_BYTES * (1u + n);
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

#endif
