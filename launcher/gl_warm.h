/* What this node's workers can do, told to the rendezvous (RDZV_NODE), and
 * the warm join that it makes possible. A node whose running workers all
 * said they re-form in place is LIVE. A new node that joins a running job
 * whose nodes are all LIVE is held instead of ending the round at once: its
 * launcher starts the workers before it has a round (they wait for their
 * first one in the round block, GPULAUNCH_ROUND_PENDING=1), and says READY
 * once every one of them said it re-forms in place (reform_ok). Only then
 * does the round end to take the node in: the others stop for the
 * re-formation and the state copy alone, not for the new workers' start
 * (importing PyTorch, setting up CUDA). Workers that do not get there within
 * --warm-start-timeout (120 s), or exit, are given up (the owner stops them), and READY
 * follows once they are gone: the node is taken in and started as today. */
#ifndef GPULAUNCH_GL_WARM_H
#define GPULAUNCH_GL_WARM_H

#include <stdint.h>
#include <uv.h>

#include "gpulaunch/rdzv.h"

#define GL_WARM_TICK_MS 20 /* how often the workers' reform_ok is looked at */

enum gl_warm_phase {
    GL_WARM_NONE = 0,     /* no warm start under way */
    GL_WARM_STARTING = 1, /* the workers start; READY once each said reform_ok */
    GL_WARM_READY = 2,    /* READY said: the next round takes this node in */
    GL_WARM_GIVEN_UP = 3  /* the workers did not get there: READY once they are gone */
};

typedef struct gl_warm gl_warm;

typedef struct gl_warm_callbacks {
    /* Whether this node's running workers go on through a round's end. */
    int (*live)(gl_warm *w);
    /* Whether the workers given up are all gone (reaped, pipes closed). */
    int (*gone)(gl_warm *w);
    /* Stop the workers started before their round (why: said already). */
    void (*stop)(gl_warm *w, const char *why);
} gl_warm_callbacks;

struct gl_warm {
    void *data; /* the owner's */
    /* private */
    uv_loop_t *loop;
    rdzv_client *cli;
    int nproc;
    uint32_t start_ms; /* --warm-start-timeout: from the start to every worker waiting */
    enum gl_warm_phase phase;
    uint64_t start_ns;
    uint16_t said;
    uv_timer_t tick;
    gl_warm_callbacks cb;
};

/* Looks at the workers every GL_WARM_TICK_MS and tells cli what they can do;
 * workers started before their round get start_ms to all wait for it. */
void gl_warm_init(gl_warm *w, uv_loop_t *loop, rdzv_client *cli, int nproc, uint32_t start_ms,
                  const gl_warm_callbacks *cb);
/* The workers are started before their round (job run_id's join is held:
 * its `members` nodes re-form in place). */
void gl_warm_start(gl_warm *w, const char *run_id, uint32_t members);
/* They are given up (why: one exited, or could not start): said, cb.stop,
 * and READY once cb.gone. Also after --warm-start-timeout (120 s) without them all. */
void gl_warm_give_up(gl_warm *w, const char *why);
/* A round took this node in: the warm start is over. */
void gl_warm_assigned(gl_warm *w);
enum gl_warm_phase gl_warm_phase(const gl_warm *w);

#endif
