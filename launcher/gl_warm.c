/* What this node's workers can do, and the warm join (see gl_warm.h). */
#include <stdio.h>
#include <string.h>

#define GB_COMPONENT "launcher"
#include "gb_log.h"
#include "gb_time.h"
#include "gl_progress.h"
#include "gl_warm.h"

static void say(gl_warm *w) {
    uint16_t f = 0;
    if (w->phase == GL_WARM_NONE && w->cb.live(w))
        f |= RDZV_NODE_LIVE;
    if (w->phase == GL_WARM_READY)
        f |= RDZV_NODE_READY;
    if (f != w->said) {
        w->said = f;
        rdzv_client_node(w->cli, f);
    }
}

static void on_tick(uv_timer_t *t) {
    gl_warm *w = t->data;
    if (w->phase == GL_WARM_STARTING) {
        uint64_t now = gb_now_ns();
        if (gl_progress_reform_ok(w->nproc)) {
            w->phase = GL_WARM_READY;
            fprintf(stderr,
                    "gpulaunch: the %d workers started in %.0f ms and wait for their first round: "
                    "the job's round ends to take this node in\n",
                    w->nproc, (double)(now - w->start_ns) / 1e6);
        } else if (now - w->start_ns > (uint64_t)w->start_ms * 1000000u) {
            char why[200];
            snprintf(why, sizeof why,
                     "not every one said within %.0f s that it re-forms in place (--warm-start-"
                     "timeout): does the program make its communicator, or gpulaunch.Elastic, at "
                     "its start?",
                     w->start_ms / 1000.0);
            gl_warm_give_up(w, why);
        }
    }
    if (w->phase == GL_WARM_GIVEN_UP && w->cb.gone(w))
        w->phase = GL_WARM_READY; /* taken in as a cold node: started once assigned */
    say(w);
}

void gl_warm_init(gl_warm *w, uv_loop_t *loop, rdzv_client *cli, int nproc, uint32_t start_ms,
                  const gl_warm_callbacks *cb) {
    void *data = w->data;
    memset(w, 0, sizeof *w);
    w->data = data;
    w->loop = loop;
    w->cli = cli;
    w->nproc = nproc;
    w->start_ms = start_ms;
    w->cb = *cb;
    uv_timer_init(loop, &w->tick);
    w->tick.data = w;
    uv_timer_start(&w->tick, on_tick, GL_WARM_TICK_MS, GL_WARM_TICK_MS);
}

void gl_warm_start(gl_warm *w, const char *run_id, uint32_t members) {
    fprintf(stderr,
            "gpulaunch: job %s runs %u node(s) that re-form in place: starting the %d workers "
            "before this node joins (they wait for their first round)\n",
            run_id, members, w->nproc);
    w->phase = GL_WARM_STARTING;
    w->start_ns = gb_now_ns();
}

void gl_warm_give_up(gl_warm *w, const char *why) {
    if (w->phase != GL_WARM_STARTING && w->phase != GL_WARM_READY)
        return;
    fprintf(stderr,
            "gpulaunch: the workers started before this node's round are given up (%s); it "
            "joins as a new node and starts them once it has its round\n",
            why);
    GB_WARN("warm join given up: %s", why);
    w->phase = GL_WARM_GIVEN_UP;
    w->cb.stop(w, why);
}

void gl_warm_assigned(gl_warm *w) { w->phase = GL_WARM_NONE; }

enum gl_warm_phase gl_warm_phase(const gl_warm *w) { return w->phase; }
