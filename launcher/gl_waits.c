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

uint32_t gl_waits_now(uint32_t *threshold_ms) {
    if (threshold_ms)
        *threshold_ms = 0;
    if (V.g == NULL || V.g->w == NULL || V.g->nrunning != V.g->n || V.g->stopping ||
        gl_progress_slot(0) == NULL)
        return 0;
    uint64_t now = gb_now_ns(), latest = 0;
    for (int i = 0; i < V.g->n; i++) {
        gb_progress_slot *s = gl_progress_slot(i);
        uint64_t since = atomic_load(&s->coll_since_ns);
        if (since == 0 || since > now)
            return 0; /* this one computes: the node is not waiting */
        uint64_t alive = atomic_load(&s->wait_ns);
        if (alive >= since && now - alive > (uint64_t)GL_WAITS_ALIVE_MS * 1000000)
            return 0; /* stuck itself: the hang watchdog's, not a wait for a peer */
        if (since > latest)
            latest = since;
    }
    uint64_t t = threshold_ns();
    if (threshold_ms)
        *threshold_ms = (uint32_t)(t / 1000000);
    uint64_t waited = now - latest;
    if (waited < t)
        return 0;
    uint64_t ms = waited / 1000000;
    return ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

static void on_tick(uv_timer_t *t) {
    (void)t;
    rdzv_client_waiting(V.cli, gl_waits_now(NULL));
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
