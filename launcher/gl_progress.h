/* The launcher's side of the progress channel (base/gb_progress.h): the
 * shared-memory region with a slot per local worker, a pipe per worker for
 * programs that report a step with one line of text, and the per-rank window
 * summaries sent to the rendezvous every --stats-interval. */
#ifndef GPULAUNCH_GL_PROGRESS_H
#define GPULAUNCH_GL_PROGRESS_H

#include <signal.h>
#include <stdint.h>

#include "gb_progress.h"

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
/* After the fork: the parent closes the worker's pipe end and reads the other. */
void gl_progress_started(int local_rank);
/* The slot of a local worker, NULL without a channel. */
gb_progress_slot *gl_progress_slot(int local_rank);
/* Starts the summaries to the rendezvous (every interval_s; 0: off). */
void gl_progress_start_stats(double interval_s);

#endif
