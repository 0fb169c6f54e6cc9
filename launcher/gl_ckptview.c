/* The node's view of its workers' checkpoints (see gl_ckptview.h). */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "gb_progress.h"
#include "gb_time.h"
#include "gl_ckptview.h"
#include "gl_progress.h"

typedef struct node_ckpt {
    int workers;         /* workers that reported a checkpoint */
    int64_t local;       /* newest step every such worker wrote (-1) */
    int64_t durable;     /* newest step every rank made durable (-1) */
    uint64_t stall_us;   /* the longest last stall */
    uint64_t drain_left; /* bytes the node's drains still copy */
} node_ckpt;

static struct {
    uv_timer_t timer;
    int on, nproc;
    node_ckpt last;
    double drain_said_s, drain_since_s;
    uint64_t drain_prev;
    double drain_prev_s;
} V = {.last = {0, -1, -1, 0, 0}};

static node_ckpt look(void) {
    node_ckpt n = {0, -1, -1, 0, 0};
    for (int i = 0; i < V.nproc; i++) {
        gb_progress_slot *s = gl_progress_slot(i);
        if (s == NULL || atomic_load(&s->joined_ns) == 0)
            continue;
        int64_t l = atomic_load(&s->ckpt_local1) - 1, d = atomic_load(&s->ckpt_durable1) - 1;
        uint64_t st = atomic_load(&s->ckpt_stall_us);
        if (l < 0 && d < 0 && st == 0)
            continue; /* no checkpoints (yet) */
        n.local = n.workers == 0 || l < n.local ? l : n.local;
        n.durable = n.workers == 0 || d < n.durable ? d : n.durable;
        n.workers++;
        if (st > n.stall_us)
            n.stall_us = st;
        n.drain_left += atomic_load(&s->ckpt_drain_left);
    }
    return n;
}

static void on_tick(uv_timer_t *t) {
    (void)t;
    node_ckpt n = look();
    if (n.workers == 0)
        return;
    double now = gb_wall_s();
    if (n.local > V.last.local)
        fprintf(stderr,
                "gpulaunch: checkpoint: step %lld written by this node's %d workers (training "
                "stalled %.3f s at most)%s\n",
                (long long)n.local, n.workers, (double)n.stall_us / 1e6,
                n.durable >= 0 ? "" : "; none durable yet");
    if (n.durable > V.last.durable)
        fprintf(stderr,
                "gpulaunch: checkpoint: step %lld durable: every rank's files are in the durable "
                "tier\n",
                (long long)n.durable);
    if (n.drain_left > 0) {
        if (V.last.drain_left == 0) {
            V.drain_since_s = V.drain_said_s = now;
            V.drain_prev = n.drain_left;
            V.drain_prev_s = now;
        } else if (now - V.drain_said_s >= GL_CKPTVIEW_DRAIN_SAY_S) {
            double rate = now > V.drain_prev_s && V.drain_prev > n.drain_left
                              ? (double)(V.drain_prev - n.drain_left) / (now - V.drain_prev_s)
                              : 0;
            if (rate > 0)
                fprintf(stderr,
                        "gpulaunch: checkpoint: draining to the durable tier for %.0f s: %.1f MB "
                        "left, %.1f MB/s, about %.0f s more\n",
                        now - V.drain_since_s, (double)n.drain_left / 1e6, rate / 1e6,
                        (double)n.drain_left / rate);
            else
                fprintf(stderr,
                        "gpulaunch: checkpoint: draining to the durable tier for %.0f s: %.1f MB "
                        "left\n",
                        now - V.drain_since_s, (double)n.drain_left / 1e6);
            V.drain_said_s = now;
            V.drain_prev = n.drain_left;
            V.drain_prev_s = now;
        }
    }
    V.last = n;
}

void gl_ckptview_start(uv_loop_t *loop, int nproc) {
    V.nproc = nproc;
    if (V.on)
        return;
    V.on = 1;
    uv_timer_init(loop, &V.timer);
    uv_timer_start(&V.timer, on_tick, GL_CKPTVIEW_TICK_MS, GL_CKPTVIEW_TICK_MS);
    uv_unref((uv_handle_t *)&V.timer); /* never what keeps the launcher running */
}

size_t gl_ckptview_metrics(char *p, size_t cap, const char *job) {
    static const struct {
        const char *name, *help;
    } m[] = {
        {"gpulaunch_checkpoint_local_step", "newest step this worker's files are written locally"},
        {"gpulaunch_checkpoint_durable_step", "newest step every rank's files are durable"},
        {"gpulaunch_checkpoint_stall_seconds", "what the last save stopped training for"},
        {"gpulaunch_checkpoint_drain_bytes_left", "bytes the drain in flight still copies"},
    };
    size_t len = 0;
    for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) {
        int w = snprintf(p + len, cap - len, "# HELP %s %s\n# TYPE %s gauge\n", m[k].name,
                         m[k].help, m[k].name);
        if (w < 0 || (size_t)w >= cap - len)
            return len;
        len += (size_t)w;
        for (int i = 0; i < V.nproc; i++) {
            gb_progress_slot *s = gl_progress_slot(i);
            if (s == NULL || atomic_load(&s->joined_ns) == 0)
                continue;
            double v = k == 0   ? (double)(atomic_load(&s->ckpt_local1) - 1)
                       : k == 1 ? (double)(atomic_load(&s->ckpt_durable1) - 1)
                       : k == 2 ? (double)atomic_load(&s->ckpt_stall_us) / 1e6
                                : (double)atomic_load(&s->ckpt_drain_left);
            w = snprintf(p + len, cap - len, "%s{job=\"%s\",local_rank=\"%d\"} %.17g\n", m[k].name,
                         job, i, v);
            if (w < 0 || (size_t)w >= cap - len)
                return len;
            len += (size_t)w;
        }
    }
    return len;
}

void gl_ckptview_exit_note(void) {
    node_ckpt n = look();
    if (n.workers == 0)
        return;
    if (n.drain_left > 0 || (n.durable >= 0 && n.durable < n.local)) {
        char left[64] = "", newest[64] = "none is durable";
        if (n.drain_left > 0)
            snprintf(left, sizeof left, " (%.1f MB not sent)", (double)n.drain_left / 1e6);
        if (n.durable >= 0)
            snprintf(newest, sizeof newest, "the newest durable step is %lld",
                     (long long)n.durable);
        fprintf(stderr,
                "gpulaunch: checkpoint: step %lld written on this node but not durable before "
                "the deadline%s; %s\n",
                (long long)n.local, left, newest);
    } else if (n.durable >= 0)
        fprintf(stderr, "gpulaunch: checkpoint: step %lld is durable; this node's files are safe\n",
                (long long)n.durable);
    else
        fprintf(stderr, "gpulaunch: checkpoint: step %lld written on this node (no durable tier)\n",
                (long long)n.local);
}
