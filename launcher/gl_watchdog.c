/* The hang watchdog (see gl_watchdog.h). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb_log.h"
#include "gb_proc.h"
#include "gb_time.h"
#include "gl_launch.h"
#include "gl_output.h"
#include "gl_progress.h"
#include "gl_watchdog.h"
#include "gl_workers.h"

#define GB_COMPONENT "launcher"

typedef struct watch {
    uint64_t last_beat;  /* the beat seen at the last tick */
    uint64_t max_gap_ns; /* auto: the slowest step interval seen after warm-up */
    int saving_seen;     /* a save since the last beat: that gap is not a step */
} watch;

static struct {
    uv_timer_t tick, dump;
    int inited;
    watch *w;
    int n;
    int fired;
    uint64_t victims_since; /* every silent rank waits in a collective: since when */
    double learned_s;       /* auto: the timeout learned (0: still warming up) */
    double said_s;          /* auto: the timeout last said */
    int culprit;            /* local rank named */
    int *kill;              /* per local rank: SIGKILL it after the stack dump */
    int *silent;            /* per local rank: no progress for the timeout */
    char detail[768];
    char msg[1024];
} W;

/* The timeout now, in seconds; 0 when not judging (off, or auto warming up). */
static double timeout_s(void) {
    if (L.cfg.progress_timeout_s > 0)
        return L.cfg.progress_timeout_s;
    if (!L.cfg.progress_auto)
        return 0;
    return W.learned_s;
}

static void learn(uint64_t now) {
    if (!L.cfg.progress_auto)
        return;
    uint64_t max_gap = 0;
    int warm = 0;
    for (int i = 0; i < W.n; i++) {
        gb_progress_slot *s = gl_progress_slot(i);
        if (atomic_load(&s->steps) >= GL_AUTO_WARMUP_STEPS)
            warm = 1;
        if (W.w[i].max_gap_ns > max_gap)
            max_gap = W.w[i].max_gap_ns;
    }
    if (!warm || max_gap == 0) /* no interval seen yet: nothing learned */
        return;
    double t = GL_AUTO_FACTOR * (double)max_gap / 1e9;
    if (t < L.cfg.progress_floor_s)
        t = L.cfg.progress_floor_s;
    W.learned_s = t;
    if (W.said_s == 0 || t > W.said_s * 1.5) {
        W.said_s = t;
        fprintf(stderr,
                "gpulaunch: progress watchdog: steps take up to %.3f s here; a rank without "
                "progress for %.1f s is hung (%dx the slowest step, at least %.0f s)\n",
                (double)max_gap / 1e9, t, GL_AUTO_FACTOR, L.cfg.progress_floor_s);
    }
    (void)now;
}

/* A hung rank's state is lost anyway, and a stopped one would hold SIGTERM
 * pending until --shutdown-timeout: it goes at once, also when the round
 * ended during the stack dump (another node, a failure, a preemption). */
static void kill_hung(void) {
    for (int i = 0; i < W.n; i++)
        if (W.kill[i] && L.w[i].running && L.w[i].pid > 0) {
            kill(-L.w[i].pid, SIGKILL);
            kill(L.w[i].pid, SIGKILL);
        }
}

/* Whether the process is stopped (SIGSTOP, a debugger): state T or t. */
static int proc_stopped(pid_t pid) {
    char st = gb_proc_state(pid);
    return st == 'T' || st == 't';
}

/* Whether local rank i waits in a collective for a peer (a hang's victim)
 * rather than being stuck itself: inside one, not stopped, and, when its
 * collective says it is alive while waiting (libgpulaunch's wait loops do,
 * every 100 ms), having said so within GL_WAIT_ALIVE_MS. */
static int rank_waits(int i, uint64_t now) {
    gb_progress_slot *s = gl_progress_slot(i);
    uint64_t since = atomic_load(&s->coll_since_ns);
    if (since == 0 || proc_stopped(L.w[i].pid))
        return 0;
    uint64_t alive = atomic_load(&s->wait_ns);
    if (alive >= since && now > alive && now - alive > (uint64_t)GL_WAIT_ALIVE_MS * 1000000)
        return 0;
    return 1;
}

static void on_dump_done(uv_timer_t *t) {
    if (L.stopping || L.round_over || L.exit_requested) {
        kill_hung();
        return;
    }
    worker *cw = &L.w[W.culprit];
    if (!L.first.set) {
        failure *f = &L.first;
        f->set = 1;
        f->hung = 1;
        f->when = gb_wall_s();
        f->rank = cw->rank;
        f->local_rank = cw->local_rank;
        f->pid = cw->pid;
        f->exit_code = -1;
        snprintf(f->why, sizeof f->why, "%s", W.detail);
        gl_output_tail(cw, f->tail, sizeof f->tail);
    }
    L.group_failed = 1;
    rdzv_client_hang(L.cli, (uint32_t)cw->rank, W.detail);
    kill_hung(); /* the others stop as after a failure */
    gl_stop_group(0);
}

static void fire(uint64_t now, double tmo, const int *silent, int only_victims) {
    W.fired = 1;
    memset(W.kill, 0, (size_t)W.n * sizeof *W.kill);
    /* the culprit: the silent rank with the oldest progress not waiting in a
     * collective (else, all waiting, the oldest) */
    int c = -1;
    uint64_t oldest = UINT64_MAX;
    for (int i = 0; i < W.n; i++) {
        if (!silent[i])
            continue;
        gb_progress_slot *s = gl_progress_slot(i);
        int waiting = rank_waits(i, now);
        if (waiting && !only_victims)
            continue;
        uint64_t b = atomic_load(&s->beat_ns);
        if (b < oldest) {
            oldest = b;
            c = i;
        }
    }
    if (c < 0)
        return;
    W.culprit = c;
    gb_progress_slot *cs = gl_progress_slot(c);
    worker *cw = &L.w[c];
    double quiet = (double)(now - atomic_load(&cs->beat_ns)) / 1e9;
    char last[160];
    if (atomic_load(&cs->steps))
        snprintf(last, sizeof last, "last step %lld, %.1f s ago", (long long)atomic_load(&cs->step),
                 (double)(now - atomic_load(&cs->step_ns)) / 1e9);
    else
        snprintf(last, sizeof last, "no step reported yet");
    if (proc_stopped(cw->pid))
        snprintf(last + strlen(last), sizeof last - strlen(last), "; the process is stopped");
    else if (atomic_load(&cs->state) != GB_PROGRESS_RUNNING)
        snprintf(last + strlen(last), sizeof last - strlen(last),
                 "; inside checkpoint I/O, which has %dx the timeout", GL_SAVE_TIMEOUT_FACTOR);
    /* the detail goes to the rendezvous, which names rank and node itself */
    int len = snprintf(W.detail, sizeof W.detail,
                       "no progress for %.1f s (--progress-timeout %.1f s; %s)%s", quiet, tmo, last,
                       only_victims ? " while waiting in a collective; the rank it waits for "
                                      "is on another node or stuck too"
                                    : "");
    /* the ranks blocked in a collective behind it */
    int nv = 0;
    for (int i = 0; i < W.n && len > 0 && (size_t)len < sizeof W.detail - 64; i++) {
        if (i == c || !L.w[i].running || !rank_waits(i, now))
            continue;
        len += snprintf(W.detail + len, sizeof W.detail - (size_t)len, "%s%d",
                        nv++ ? "," : "; waiting for it in a collective: rank ", L.w[i].rank);
    }
    snprintf(W.msg, sizeof W.msg, "rank %d (node %s, local rank %d, pid %d) hung: %s", cw->rank,
             L.hostname, c, (int)cw->pid, W.detail);
    fprintf(stderr, "gpulaunch: %s\n", W.msg);
    GB_ERROR("%s", W.msg);
    /* stacks first (Python's faulthandler prints them to stderr) */
    int dumped = 0;
    for (int i = 0; i < W.n; i++) {
        gb_progress_slot *s = gl_progress_slot(i);
        int sig = atomic_load(&s->stack_signal);
        if (!silent[i] || !L.w[i].running)
            continue;
        if (i == c || !rank_waits(i, now))
            W.kill[i] = 1;
        if (sig > 0 && sig < 65) {
            kill(L.w[i].pid, sig);
            dumped++;
        }
    }
    if (dumped)
        fprintf(stderr, "gpulaunch: stacks of %d hung rank(s) follow in their stderr\n", dumped);
    uv_timer_start(&W.dump, on_dump_done, dumped ? GL_STACK_DUMP_MS : 0, 0);
}

static void on_tick(uv_timer_t *t) {
    if (W.fired || L.w == NULL || L.nrunning == 0 || L.stopping || L.round_over ||
        L.exit_requested || L.group_failed)
        return;
    uint64_t now = gb_now_ns();
    int *silent = W.silent;
    int any = 0, all_waiting = 1, saving = 0;
    /* the slowest step interval, from the beats seen (exact for gaps longer
     * than a tick, which are the ones that matter) */
    for (int i = 0; i < W.n; i++) {
        gb_progress_slot *s = gl_progress_slot(i);
        watch *w = &W.w[i];
        uint64_t b = atomic_load(&s->beat_ns);
        if (atomic_load(&s->state) != GB_PROGRESS_RUNNING)
            w->saving_seen = 1;
        if (b != w->last_beat) {
            /* b may be older: two threads of a worker store the beat, each
             * its own clock read (a step and a collective's end) */
            if (w->last_beat && b > w->last_beat && !w->saving_seen &&
                atomic_load(&s->steps) >= 2 && b - w->last_beat > w->max_gap_ns)
                w->max_gap_ns = b - w->last_beat;
            w->last_beat = b;
            w->saving_seen = atomic_load(&s->state) != GB_PROGRESS_RUNNING;
        }
    }
    learn(now);
    double tmo = timeout_s();
    if (tmo <= 0)
        return;
    for (int i = 0; i < W.n; i++) {
        gb_progress_slot *s = gl_progress_slot(i);
        silent[i] = 0;
        if (!L.w[i].running || atomic_load(&s->joined_ns) == 0)
            continue;
        /* checkpoint I/O gets GL_SAVE_TIMEOUT_FACTOR times the timeout
         * (from the save's start); a stopped process is stuck wherever it is */
        double limit = tmo;
        if (atomic_load(&s->state) != GB_PROGRESS_RUNNING && !proc_stopped(L.w[i].pid)) {
            saving = 1;
            limit = tmo * GL_SAVE_TIMEOUT_FACTOR;
        }
        uint64_t b = atomic_load(&s->beat_ns);
        if (now > b && (double)(now - b) / 1e9 > limit) {
            silent[i] = 1;
            any = 1;
            if (!rank_waits(i, now))
                all_waiting = 0;
        }
    }
    /* ranks waiting in a collective for a local rank that writes its
     * checkpoint wait for I/O, which is not a hang */
    if (!any || (all_waiting && saving)) {
        W.victims_since = 0;
        return;
    }
    if (!all_waiting) {
        fire(now, tmo, silent, 0);
        return;
    }
    if (W.victims_since == 0)
        W.victims_since = now;
    else if (now - W.victims_since >= (uint64_t)GL_HANG_VICTIM_GRACE_MS * 1000000)
        fire(now, tmo, silent, 1);
}

void gl_watchdog_round(void) {
    if (!W.inited) {
        W.inited = 1;
        uv_timer_init(L.loop, &W.tick);
        uv_timer_init(L.loop, &W.dump);
        W.n = L.cfg.nproc;
        W.w = calloc((size_t)W.n, sizeof *W.w);
        W.kill = calloc((size_t)W.n, sizeof *W.kill);
        W.silent = calloc((size_t)W.n, sizeof *W.silent);
        if (W.w == NULL || W.kill == NULL || W.silent == NULL)
            return;
        if (L.cfg.progress_timeout_s > 0 || L.cfg.progress_auto)
            uv_timer_start(&W.tick, on_tick, GL_WATCH_TICK_MS, GL_WATCH_TICK_MS);
    }
    /* a stack dump of the last round still pending (its round ended by
     * another node and the workers exited within GL_STACK_DUMP_MS) must not
     * fire on this round's workers, which have the same local ranks */
    uv_timer_stop(&W.dump);
    if (W.w == NULL || W.kill == NULL || W.silent == NULL || gl_progress_slot(0) == NULL) {
        uv_timer_stop(&W.tick); /* no memory or no channel: no watchdog */
        return;
    }
    memset(W.kill, 0, (size_t)W.n * sizeof *W.kill);
    memset(W.w, 0, (size_t)W.n * sizeof *W.w);
    W.fired = 0;
    W.victims_since = 0;
    W.learned_s = 0;
}
