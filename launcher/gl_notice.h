/* The preemption notices this node hears, each made one checkpoint EVENT for
 * the whole job (so that every rank saves the same step) and then this node's
 * stop: SIGTERM (a pod deleted, a spot reclaim under Kubernetes), Slurm's
 * SIGUSR1/SIGUSR2 inside a Slurm job (--slurm auto: sbatch --signal=USR1@90),
 * and a cloud's metadata notice (gl_cloud.c, polled from a second after the
 * first workers start). Other --signals-to-handle signals are the owner's.
 * What a stop does is the owner's decision (gl_main.c's preempt). */
#ifndef GPULAUNCH_GL_NOTICE_H
#define GPULAUNCH_GL_NOTICE_H

#include <stdint.h>
#include <uv.h>

#include "gl_cloud.h"
#include "gl_options.h"
#include "gpulaunch/rdzv.h"

#define GL_CLOUD_AFTER_MS 1000 /* cloud polling starts this long after the first workers */

typedef struct gl_notice_callbacks {
    /* A notice for this node (told to the job already): stop by the deadline. */
    void (*preempt)(uint64_t deadline_unix_ms, const char *why);
    /* A --signals-to-handle signal that is no notice: the owner forwards it. */
    void (*on_signal)(int sig);
    /* Whether this node stops already (a notice then changes nothing). */
    int (*stopping)(void);
} gl_notice_callbacks;

/* Starts the signal handlers (cfg's --signals-to-handle, and Slurm's two
 * when they are not among them). cli may be set later (gl_notice_client). */
void gl_notice_start(uv_loop_t *loop, const gl_config *cfg, const char *hostname,
                     const gl_notice_callbacks *cb);
void gl_notice_client(rdzv_client *cli);
/* The first workers started: a cloud source is polled from a second on. */
void gl_notice_workers_started(void);

#endif
