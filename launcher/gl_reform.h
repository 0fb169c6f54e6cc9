/* Live re-formation, the launcher's side: when a round ends and every local
 * worker said it re-forms in place (its progress slot's reform_ok), the
 * workers are not stopped. The round's end is published in the progress
 * region's round block (GB_ROUND_OVER: a worker blocked in a collective gives
 * up on it), the launcher joins the next round, publishes it
 * (GB_ROUND_NEW: rank, world, master) and waits for every worker to say it
 * took it (round_ack). A worker that exits meanwhile or does not take the
 * round within GL_REFORM_TAKE_MS makes the owner fall back to restarting
 * (GB_ROUND_RESTART). Whether a round's end may re-form is the owner's
 * decision (gl_main.c); this file owns the block's states and the wait. */
#ifndef GPULAUNCH_GL_REFORM_H
#define GPULAUNCH_GL_REFORM_H

#include <stdint.h>
#include <uv.h>

#include "gb_progress.h"
#include "gpulaunch/rdzv.h"

#define GL_REFORM_TAKE_MS 30000 /* from the next round handed to every worker having taken it */
#define GL_REFORM_TICK_MS 5     /* how often the workers' acknowledgements are looked at */
#define GL_REFORM_FIRST_TAKE_MS                                                                    \
    120000 /* the same for workers started before their first                                      \
              round (a warm join): they may still be starting */

enum gl_reform_state {
    GL_REFORM_NONE = 0,    /* no re-formation under way */
    GL_REFORM_WAITING = 1, /* workers kept; the launcher joins the next round */
    GL_REFORM_HANDED = 2   /* the next round is published; waiting for every worker to take it */
};

typedef struct gl_reform gl_reform;

typedef struct gl_reform_callbacks {
    /* Every local worker runs in `round`: told_ms after the last round's end
     * was published (r->first: after they were started before it), taken_ms
     * after the new one was. */
    void (*on_taken)(gl_reform *r, uint32_t round, double told_ms, double taken_ms);
    /* A worker did not take the round in time: fall back to restarting. */
    void (*on_failed)(gl_reform *r, const char *why);
} gl_reform_callbacks;

struct gl_reform {
    void *data; /* the owner's */
    /* private */
    uv_loop_t *loop;
    int nproc, inited;
    int first; /* the workers were started before their first round */
    enum gl_reform_state state;
    uint32_t round;
    uint64_t told_ns, handed_ns;
    uv_timer_t tick;
    gl_reform_callbacks cb;
};

void gl_reform_init(gl_reform *r, uv_loop_t *loop, int nproc, const gl_reform_callbacks *cb);
/* Whether every local worker said it re-forms in place. */
int gl_reform_possible(const gl_reform *r);
/* The round is over (why): the workers hear it and wait. */
void gl_reform_begin(gl_reform *r, const char *why);
/* The workers were started before their first round (a warm join): they
 * wait for it as kept workers do (GL_REFORM_WAITING, nothing published). */
void gl_reform_first(gl_reform *r);
/* Hands the workers the next round a (ifname: the NCCL_SOCKET_IFNAME chosen
 * for it, "" for none; restarts: their restart count). */
void gl_reform_hand(gl_reform *r, const rdzv_assignment *a, const char *ifname, int restarts);
/* No re-formation (why): the workers are told to exit; they are restarted. */
void gl_reform_abort(gl_reform *r, const char *why);
enum gl_reform_state gl_reform_state(const gl_reform *r);

#endif
