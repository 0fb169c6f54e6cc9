/* A preemption's stop of the local workers, held while they start. A notice
 * minutes ahead may come while the workers are still starting (importing a
 * framework, setting up DDP) and cannot save yet: a SIGTERM then would end
 * them without a checkpoint. Their stop is held until every local worker says
 * it can checkpoint (the progress channel's ckpt_ready, set when the
 * runtime's SIGTERM handler is in place) or until GL_HOLD_MARGIN_MS before
 * the notice's deadline, whichever comes first. Only a round younger than
 * GL_HOLD_STARTUP_MS is held: a program that never says so (one without the
 * runtime) is stopped as before once it has run that long. The stop itself
 * is SIGTERM, then SIGKILL at the deadline (at least a second later).
 * Whether to stop is the owner's decision (gl_main.c); this file owns when. */
#ifndef GPULAUNCH_GL_HOLD_H
#define GPULAUNCH_GL_HOLD_H

#include <stdint.h>
#include <uv.h>

#include "gl_workers.h"

#define GL_HOLD_MARGIN_MS 30000   /* a held stop comes no later than this before the deadline */
#define GL_HOLD_STARTUP_MS 120000 /* workers started longer ago than this are not waited for */
#define GL_HOLD_TICK_MS 100       /* how often a held stop looks at the workers */

typedef struct gl_hold {
    uv_timer_t timer;
    gl_group *g;
    int nproc;
    uint64_t deadline_unix_ms; /* the held notice's (timer running) */
    uint64_t t_spawn_ns;       /* when this round's workers were started */
    void (*on_gone)(void);     /* the workers ended by themselves while held */
} gl_hold;

void gl_hold_init(gl_hold *h, uv_loop_t *loop, gl_group *g, int nproc, void (*on_gone)(void));
/* This round's workers were started now. */
void gl_hold_spawned(gl_hold *h);
/* Stops the running workers for a notice due at deadline_unix_ms: now, or
 * held (said on stderr) while they cannot checkpoint yet. */
void gl_hold_stop(gl_hold *h, uint64_t deadline_unix_ms);
/* A held stop happens now (the round ended, the rendezvous failed): the
 * workers get the preemption's SIGTERM first, so that those that can still
 * save. Nothing when none is held. */
void gl_hold_end(gl_hold *h);

#endif
