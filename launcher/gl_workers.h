/* The worker group: each worker's environment (torchrun's variables and the
 * runtime's), fork/exec in a session of its own, signals to the group (stop,
 * the discard notice, the kill timer) and reaping on SIGCHLD. A gl_group is
 * embedded by its owner (gl_main.c), which hears of each worker's exit, of a
 * worker that could not start and of each closed pipe through the callbacks
 * it gave; what those mean for the round (a failure, a restart) is the
 * owner's to decide. */
#ifndef GPULAUNCH_GL_WORKERS_H
#define GPULAUNCH_GL_WORKERS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "gl_options.h"
#include "gl_output.h"
#include "gl_worker.h"
#include "gpulaunch/rdzv.h"

/* Workers of a round that is over are stopped with SIGTERM, and then those
 * still running hear through sigqueue that their state is discarded
 * (gb_stop.h): a checkpoint handler then lets SIGTERM end the process, so a
 * rank stuck in a framework's collective is not held until --shutdown-timeout.
 * After a local failure that comes GL_DISCARD_GRACE_MS later, so that a rank
 * waiting in libgpulaunch's collective can report the dead peer first (it
 * learns of the round's end within 20 ms); when the rendezvous ended the
 * round, at once: the server already said why, and healing waits for it. */
#define GL_DISCARD_GRACE_MS 500

typedef struct gl_group gl_group;

typedef struct gl_group_callbacks {
    /* w exited (status, or the signal that killed it); it is no longer
     * counted in nrunning. */
    void (*on_exit)(gl_group *g, worker *w, int64_t status, int sig);
    /* w could not be started (err: an errno); its pipes are being closed. */
    void (*on_spawn_error)(gl_group *g, worker *w, int err);
    /* One of w's pipes closed: with the exits, what gl_group_idle waits for. */
    void (*on_closed)(gl_group *g, worker *w);
} gl_group_callbacks;

/* What every round's workers are told about the job (strings the owner keeps). */
typedef struct gl_group_job {
    const char *run_id, *hostname, *addr;
    const char *rdzv_ep; /* the rendezvous endpoint the workers are given */
    const char *token;   /* NULL: none */
    size_t token_len;
} gl_group_job;

struct gl_group {
    void *data; /* the owner's */
    /* read-only outside gl_workers.c */
    worker *w;    /* nproc records, NULL before the first round */
    int n;        /* nproc */
    int nrunning; /* workers not yet reaped */
    int stopping; /* SIGTERM sent: exits are expected; clears when the group is idle */
    /* private */
    uv_loop_t *loop;
    const gl_config *cfg;
    gl_group_job job;
    gl_group_callbacks cb;
    uv_timer_t kill_timer, discard_timer;
    uv_signal_t sigchld;
    gl_output out;
};

/* Sets g up on loop and starts reaping on SIGCHLD; cfg and job's strings
 * must outlive it. */
void gl_group_init(gl_group *g, uv_loop_t *loop, const gl_config *cfg, const gl_group_job *job,
                   const gl_group_callbacks *cb);
/* Where worker w writes its error file (TORCHELASTIC_ERROR_FILE, as torch's
 * @record does); it is removed before each start of the worker. */
void gl_group_error_file(const gl_group *g, const worker *w, char *out, size_t len);
/* Whether the program can be run as spawning would run it (the interpreter
 * and the script for a .py or -m program, else the program on PATH): 0, or
 * -1 with err naming the path and the errno. */
int gl_group_check_program(const gl_config *cfg, char *err, size_t errlen);
/* Starts a round's workers with their environment and output (restarts:
 * TORCHELASTIC_RESTART_COUNT and the log attempt; nccl_ifname: "" to leave
 * NCCL_SOCKET_IFNAME alone); a NULL: before their round (a warm join), with
 * GPULAUNCH_ROUND_PENDING=1 for RANK & co. Returns how many could not start. */
int gl_group_spawn(gl_group *g, const rdzv_assignment *a, int restarts, const char *nccl_ifname);
/* Whether the workers get the progress channel (and its round block),
 * unless nothing reads it (--progress-timeout 0 --stats-interval 0). */
int gl_group_channel(const gl_config *cfg);
/* The workers' global ranks from base_rank on (a round taken in place; the
 * ranks of workers started before their round, a == NULL above). */
void gl_group_ranks(gl_group *g, uint32_t base_rank);
/* Whether every worker is reaped and every pipe closed. */
int gl_group_idle(const gl_group *g);
/* Local rank i's record, NULL before the first round. */
const worker *gl_group_worker(const gl_group *g, int i);
/* Sends sig to every running worker's process group and the worker itself. */
void gl_group_signal(gl_group *g, int sig);
/* Marks the group stopping and SIGKILLs the workers still running after ms
 * (the signal itself is the caller's: gl_group_signal). */
void gl_group_kill_after(gl_group *g, uint64_t ms);
/* Stops the workers of a round that is over: SIGTERM, then the discard notice
 * after discard_after_ms (at once for 0), then SIGKILL after --shutdown-timeout.
 * Nothing when none runs or the group is already stopping. */
void gl_group_stop(gl_group *g, uint64_t discard_after_ms);
/* "SIGTERM", or the number when the signal has no name. */
const char *gl_signame(int sig);

#endif
