/* Live re-formation, the launcher's side (see gl_reform.h). */
#include <stdio.h>
#include <string.h>

#include "gb_time.h"
#include "gl_progress.h"
#include "gl_reform.h"

void gl_reform_init(gl_reform *r, uv_loop_t *loop, int nproc, const gl_reform_callbacks *cb) {
    memset(r, 0, sizeof *r);
    r->loop = loop;
    r->nproc = nproc;
    r->cb = *cb;
    uv_timer_init(loop, &r->tick);
    r->tick.data = r;
    r->inited = 1;
}

int gl_reform_possible(const gl_reform *r) { return gl_progress_reform_ok(r->nproc); }

enum gl_reform_state gl_reform_state(const gl_reform *r) { return r->state; }

void gl_reform_begin(gl_reform *r, const char *why) {
    uv_timer_stop(&r->tick);
    r->state = GL_REFORM_WAITING;
    r->told_ns = gb_now_ns();
    gl_progress_publish(GB_ROUND_OVER, NULL, NULL, 0, why);
}

void gl_reform_first(gl_reform *r) {
    uv_timer_stop(&r->tick);
    r->state = GL_REFORM_WAITING;
    r->first = 1;
    r->told_ns = gb_now_ns();
}

static void on_tick(uv_timer_t *t) {
    gl_reform *r = t->data;
    if (r->state != GL_REFORM_HANDED)
        return;
    int acked = gl_progress_acked(r->nproc, r->round);
    uint64_t now = gb_now_ns();
    if (acked == r->nproc) {
        uv_timer_stop(&r->tick);
        r->state = GL_REFORM_NONE;
        r->cb.on_taken(r, r->round, (double)(now - r->told_ns) / 1e6,
                       (double)(now - r->handed_ns) / 1e6);
        r->first = 0;
        return;
    }
    int limit_ms = r->first ? GL_REFORM_FIRST_TAKE_MS : GL_REFORM_TAKE_MS;
    if (now - r->handed_ns > (uint64_t)limit_ms * 1000000u) {
        char why[200];
        snprintf(why, sizeof why,
                 "%d of %d local workers did not take round %u within %d s of being handed it",
                 r->nproc - acked, r->nproc, r->round, limit_ms / 1000);
        r->cb.on_failed(r, why);
    }
}

void gl_reform_hand(gl_reform *r, const rdzv_assignment *a, const char *ifname, int restarts) {
    r->state = GL_REFORM_HANDED;
    r->round = a->round;
    r->handed_ns = gb_now_ns();
    gl_progress_publish(GB_ROUND_NEW, a, ifname, restarts, "");
    uv_timer_start(&r->tick, on_tick, GL_REFORM_TICK_MS, GL_REFORM_TICK_MS);
}

void gl_reform_abort(gl_reform *r, const char *why) {
    if (r->state == GL_REFORM_NONE)
        return;
    uv_timer_stop(&r->tick);
    r->state = GL_REFORM_NONE;
    r->first = 0;
    gl_progress_publish(GB_ROUND_RESTART, NULL, NULL, 0, why);
}
