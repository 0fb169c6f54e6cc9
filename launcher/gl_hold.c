/* A preemption's stop of the local workers, held while they start
 * (gl_hold.h, docs/preemption.md). */
#include "gl_hold.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>

#include "gb_progress.h"
#include "gb_time.h"
#include "gl_progress.h"

void gl_hold_init(gl_hold *h, uv_loop_t *loop, gl_group *g, int nproc, void (*on_gone)(void)) {
    uv_timer_init(loop, &h->timer);
    h->timer.data = h;
    h->g = g;
    h->nproc = nproc;
    h->on_gone = on_gone;
}

void gl_hold_spawned(gl_hold *h) { h->t_spawn_ns = gb_now_ns(); }

/* Running local workers that have not said they can checkpoint (0 without
 * a progress channel: nothing to wait on). */
static int unready_workers(const gl_hold *h) {
    int n = 0;
    for (int i = 0; i < h->nproc; i++) {
        const worker *w = gl_group_worker(h->g, i);
        if (w == NULL || !w->running)
            continue;
        gb_progress_slot *s = gl_progress_slot(i);
        if (s == NULL)
            return 0;
        n += atomic_load_explicit(&s->ckpt_ready, memory_order_acquire) == 0;
    }
    return n;
}

static void stop_now(gl_hold *h, uint64_t deadline_unix_ms) {
    gl_group_signal(h->g, SIGTERM);
    double left_ms = (double)deadline_unix_ms - gb_wall_s() * 1000.0;
    if (left_ms < 1000)
        left_ms = 1000;
    gl_group_kill_after(h->g, (uint64_t)left_ms);
}

static void on_tick(uv_timer_t *t) {
    gl_hold *h = t->data;
    if (h->g->stopping) { /* stopped for another reason meanwhile (a round's end, a signal) */
        uv_timer_stop(t);
        return;
    }
    if (h->g->nrunning == 0) { /* they ended by themselves meanwhile */
        /* e.g. another node's notice reached them through the job's
         * checkpoint agreement between two ticks */
        fprintf(stderr,
                "gpulaunch: every worker ended by itself while its stop was held (%.1f s after "
                "they started): nothing left to stop\n",
                (double)(gb_now_ns() - h->t_spawn_ns) / 1e9);
        uv_timer_stop(t);
        h->on_gone();
        return;
    }
    int n = unready_workers(h);
    double left_ms = (double)h->deadline_unix_ms - gb_wall_s() * 1000.0;
    double age_ms = (double)(gb_now_ns() - h->t_spawn_ns) / 1e6;
    if (n > 0 && left_ms > GL_HOLD_MARGIN_MS && age_ms < GL_HOLD_STARTUP_MS)
        return;
    uv_timer_stop(t);
    if (n == 0)
        fprintf(stderr,
                "gpulaunch: every worker can checkpoint now (%.1f s after they started): "
                "stopping them\n",
                age_ms / 1000.0);
    else
        fprintf(stderr,
                "gpulaunch: %d worker(s) still cannot checkpoint %.0f s after they started, %.0f s "
                "before the notice's deadline: stopping them anyway\n",
                n, age_ms / 1000.0, left_ms / 1000.0);
    stop_now(h, h->deadline_unix_ms);
}

void gl_hold_stop(gl_hold *h, uint64_t deadline_unix_ms) {
    int n = unready_workers(h);
    double left_ms = (double)deadline_unix_ms - gb_wall_s() * 1000.0;
    double age_ms = (double)(gb_now_ns() - h->t_spawn_ns) / 1e6;
    if (n > 0 && left_ms > GL_HOLD_MARGIN_MS && age_ms < GL_HOLD_STARTUP_MS) {
        fprintf(stderr,
                "gpulaunch: %d of %d workers cannot checkpoint yet (started %.1f s ago): their "
                "stop is held until they can, at most until %.0f s before the deadline (%.0f s "
                "from now)\n",
                n, h->g->nrunning, age_ms / 1000.0, GL_HOLD_MARGIN_MS / 1000.0,
                (left_ms - GL_HOLD_MARGIN_MS) / 1000.0);
        h->deadline_unix_ms = deadline_unix_ms;
        uv_timer_start(&h->timer, on_tick, GL_HOLD_TICK_MS, GL_HOLD_TICK_MS);
        return;
    }
    stop_now(h, deadline_unix_ms);
}

void gl_hold_end(gl_hold *h) {
    if (!uv_is_active((uv_handle_t *)&h->timer))
        return;
    uv_timer_stop(&h->timer);
    if (h->g->nrunning && !h->g->stopping)
        stop_now(h, h->deadline_unix_ms);
}
