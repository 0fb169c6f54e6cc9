/* The worker group: each worker's environment (torchrun's variables and the
 * runtime's), fork/exec in a session of its own, signals to the group (stop,
 * the discard notice, the kill timer) and reaping on SIGCHLD. */
#ifndef GPULAUNCH_GL_WORKERS_H
#define GPULAUNCH_GL_WORKERS_H

#include <stdint.h>
#include <uv.h>

#include "gl_launch.h"

/* Workers of a round that is over are stopped with SIGTERM, and then those
 * still running hear through sigqueue that their state is discarded
 * (gb_stop.h): a checkpoint handler then lets SIGTERM end the process, so a
 * rank stuck in a framework's collective is not held until --shutdown-timeout.
 * After a local failure that comes GL_DISCARD_GRACE_MS later, so that a rank
 * waiting in libgpulaunch's collective can report the dead peer first (it
 * learns of the round's end within 100 ms); when the rendezvous ended the
 * round, at once: the server already said why, and healing waits for it. */
#define GL_DISCARD_GRACE_MS 500

/* Starts the round's workers (L.a assigned) with their environment and output. */
void gl_spawn_workers(void);
/* Sends sig to every running worker's process group and the worker itself. */
void gl_signal_group(int sig);
/* SIGKILLs the workers still running after SIGTERM (L.kill_timer). */
void gl_on_kill_timer(uv_timer_t *t);
/* Stops the workers of a round that is over: SIGTERM, then the discard notice
 * after discard_after_ms (at once for 0), then SIGKILL after --shutdown-timeout. */
void gl_stop_group(uint64_t discard_after_ms);
/* Reaps every child on SIGCHLD (as PID 1, orphans too) and notes worker exits. */
void gl_on_sigchld(uv_signal_t *h, int sig);
/* "SIGTERM", or the number when the signal has no name. */
const char *gl_signame(int sig);

#endif
