/* The collective waits of this node's workers: gl_waits.h says what and why. */
#include "gl_waits.h"

#include <stdatomic.h>

#include "gb_progress.h"
#include "gb_time.h"
#include "gl_progress.h"

static struct {
    uv_timer_t timer;
    rdzv_client *cli;
    const gl_group *g;
    int on;
} V;

/* The threshold: GL_WAITS_FACTOR x the longest mean collective of a local
 * worker this round, at least GL_WAITS_MIN_MS. */
static uint64_t threshold_ns(void) {
    uint64_t mean = 0;
    for (int i = 0; i < V.g->n; i++) {
        gb_progress_slot *s = gl_progress_slot(i);
        uint64_t n = s ? atomic_load(&s->colls) : 0;
        if (n && atomic_load(&s->coll_ns) / n > mean)
            mean = atomic_load(&s->coll_ns) / n;
    }
    uint64_t t = mean * GL_WAITS_FACTOR, floor = (uint64_t)GL_WAITS_MIN_MS * 1000000;
    return t > floor ? t : floor;
}

/* For how long every running local worker has waited in one collective, in
 * ms; 0 when not all wait, or not for longer than the threshold. */
static uint32_t waited_ms(void) {
    if (V.g == NULL || V.g->w == NULL || V.g->nrunning != V.g->n || V.g->stopping ||
        gl_progress_slot(0) == NULL)
        return 0;
    uint64_t now = gb_now_ns(), latest = 0;
    for (int i = 0; i < V.g->n; i++) {
        /* one that computes, or is stuck itself (the hang watchdog's): the
         * node is not waiting for a peer */
        uint64_t since = gl_progress_waiting_since(i, now);
        if (since == 0)
            return 0;
        if (since > latest)
            latest = since;
    }
    uint64_t waited = now - latest;
    if (waited < threshold_ns())
        return 0;
    uint64_t ms = waited / 1000000;
    return ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

static void on_tick(uv_timer_t *t) {
    (void)t;
    rdzv_client_waiting(V.cli, waited_ms());
}

void gl_waits_start(uv_loop_t *loop, rdzv_client *cli, const gl_group *g) {
    if (V.on)
        return;
    V.on = 1;
    V.cli = cli;
    V.g = g;
    uv_timer_init(loop, &V.timer);
    uv_timer_start(&V.timer, on_tick, GL_WAITS_TICK_MS, GL_WAITS_TICK_MS);
    uv_unref((uv_handle_t *)&V.timer); /* never what keeps the launcher running */
}
