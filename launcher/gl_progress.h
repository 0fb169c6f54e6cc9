/* The launcher's side of the progress channel (base/gb_progress.h): the
 * shared-memory region with a slot per local worker, a pipe per worker for
 * programs that report a step with one line of text, and the per-rank window
 * summaries sent to the rendezvous every --stats-interval. */
#ifndef GPULAUNCH_GL_PROGRESS_H
#define GPULAUNCH_GL_PROGRESS_H

#include <signal.h>
#include <stdint.h>
#include <uv.h>

#include "gb_progress.h"
#include "gpulaunch/rdzv.h"

#define GL_PROGRESS_LINE_MAX 64 /* a longer progress line is malformed */
/* Sent to a hung worker that registered for it (gpl_progress_stack_signal):
 * a real-time signal, so that no program's own SIGUSR1/2 use is disturbed. */
#define GL_STACK_SIGNAL (SIGRTMIN + 3)

/* Makes the round's channel for nproc workers (the region is made once and
 * cleared each round). 0, or -1 with the reason said on stderr: the job then
 * runs without the watchdog. */
int gl_progress_round(int nproc);
/* In the worker's child between fork and exec: keeps its descriptors open
 * across exec. Async-signal-safe. */
void gl_progress_child(int local_rank);
/* The environment entries of a worker ("K=V", malloc'd) into env[n..max). */
int gl_progress_env(int local_rank, char **env, int n, int max);
/* The worker of the slot this round, as the summaries name it: its rank and
 * gpu (its CUDA_VISIBLE_DEVICES, "" without). */
void gl_progress_holder(int local_rank, int rank, const char *gpu);
/* After the fork: the parent closes the worker's pipe end and reads the
 * other on loop. */
void gl_progress_started(uv_loop_t *loop, int local_rank);
/* The slot of a local worker, NULL without a channel. */
gb_progress_slot *gl_progress_slot(int local_rank);
/* A rank waiting in libgpulaunch's collective says so every 20 ms (wait_ns):
 * one whose wait loop has been silent this long is stuck itself. */
#define GL_WAIT_ALIVE_MS 1000
/* Since when (CLOCK_MONOTONIC ns) the local worker has waited inside a
 * collective for its peers; 0 when it is in none, or its wait loop went
 * silent for GL_WAIT_ALIVE_MS (stuck itself, not waiting). A collective
 * without a wait loop (a framework's) counts as waiting. */
uint64_t gl_progress_waiting_since(int local_rank, uint64_t now_ns);
/* Live re-formation (docs/reliability.md). Whether each of the nproc local
 * workers said it re-forms in place (its slot's reform_ok). */
int gl_progress_reform_ok(int nproc);
/* How many of the nproc local workers said they run in `round`. */
int gl_progress_acked(int nproc, uint32_t round);
/* Whether workers that re-form in place go on through another node's
 * preemption (the round block's go_on), for this and every later round. */
void gl_progress_set_go_on(int on);
/* Writes the round block and wakes the workers waiting on it: the round is
 * over (a NULL), or here is the next one (a, with the NCCL_SOCKET_IFNAME
 * chosen for it, "" or NULL: none), or they are to be restarted. */
void gl_progress_publish(enum gb_round_state state, const rdzv_assignment *a, const char *ifname,
                         int restarts, const char *why);
/* Where a local worker's state came from, as it said on its pipe ("state
 * peer|checkpoint STEP BYTES MS ROOT": docs/health.md, the progress channel). */
enum { GL_STATE_NONE = 0, GL_STATE_PEER = 1, GL_STATE_CHECKPOINT = 2 };
typedef struct gl_state_report {
    int source;     /* GL_STATE_* */
    int64_t step;   /* the step of the state taken */
    uint64_t bytes; /* copied or read */
    uint32_t ms;    /* how long it took */
    int32_t root;   /* the peer rank it came from (-1: a checkpoint) */
    uint64_t at_ns; /* when it was said (0: never) */
} gl_state_report;
/* The last report of a local worker this round: 0, or -1 when it made none. */
int gl_progress_state(int local_rank, gl_state_report *out);
/* What the channel holds now, for --metrics: regions mapped (0 or 1: made
 * once) and their bytes, and pipe ends open (the workers' write ends until
 * they are started, the read ends until a worker's pipe closes). */
void gl_progress_held(int *regions, long long *bytes, int *pipes);
/* Whether the workers run, not stopping: a summary is due (else the window
 * goes on). */
typedef int (*gl_progress_active_cb)(void *data);
/* A window's summaries, one per slot that has reported. */
typedef void (*gl_progress_send_cb)(void *data, uint32_t window_ms, const rdzv_rank_stats *rs,
                                    uint32_t n);
/* Starts the summaries on loop (every interval_s; 0: off; once: later calls
 * do nothing). */
void gl_progress_start_stats(uv_loop_t *loop, double interval_s, gl_progress_active_cb active,
                             gl_progress_send_cb send, void *data);

#endif
