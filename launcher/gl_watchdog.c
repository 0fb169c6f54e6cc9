/* The hang watchdog (see gl_watchdog.h). It owns its timers, what it learned
 * of the step time (auto) and the hung ranks it named; the workers it only
 * reads from the group, and the hang it reports to its owner. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb_log.h"
#include "gb_proc.h"
#include "gb_time.h"
#include "gl_progress.h"
#include "gl_watchdog.h"

#define GB_COMPONENT "launcher"

struct gl_watch {
    uint64_t last_beat;  /* the beat seen at the last tick */
    uint64_t max_gap_ns; /* auto: the slowest step interval seen after warm-up */
    int saving_seen;     /* a save since the last beat: that gap is not a step */
};

/* The timeout now, in seconds; 0 when not judging (off, or auto warming up). */
static double timeout_s(const gl_watchdog *wd) {
    if (wd->cfg->progress_timeout_s > 0)
        return wd->cfg->progress_timeout_s;
    if (!wd->cfg->progress_auto)
        return 0;
    return wd->learned_s;
}

static void learn(gl_watchdog *wd, uint64_t now) {
    if (!wd->cfg->progress_auto)
        return;
    uint64_t max_gap = 0;
    int warm = 0;
    for (int i = 0; i < wd->n; i++) {
        gb_progress_slot *s = gl_progress_slot(i);
        if (atomic_load(&s->steps) >= GL_AUTO_WARMUP_STEPS)
            warm = 1;
        if (wd->w[i].max_gap_ns > max_gap)
            max_gap = wd->w[i].max_gap_ns;
    }
    if (!warm || max_gap == 0) /* no interval seen yet: nothing learned */
        return;
    double t = GL_AUTO_FACTOR * (double)max_gap / 1e9;
    if (t < wd->cfg->progress_floor_s)
        t = wd->cfg->progress_floor_s;
    wd->learned_s = t;
    if (wd->said_s == 0 || t > wd->said_s * 1.5) {
        wd->said_s = t;
        fprintf(stderr,
                "gpulaunch: progress watchdog: steps take up to %.3f s here; a rank without "
                "progress for %.1f s is hung (%dx the slowest step, at least %.0f s)\n",
                (double)max_gap / 1e9, t, GL_AUTO_FACTOR, wd->cfg->progress_floor_s);
    }
    (void)now;
}

/* A hung rank's state is lost anyway, and a stopped one would hold SIGTERM
 * pending until --shutdown-timeout: it goes at once, also when the round
 * ended during the stack dump (another node, a failure, a preemption). */
void gl_watchdog_kill_hung(gl_watchdog *wd) {
    const worker *ws = wd->group->w;
    for (int i = 0; i < wd->n; i++)
        if (wd->kill[i] && ws[i].running && ws[i].pid > 0) {
            kill(-ws[i].pid, SIGKILL);
            kill(ws[i].pid, SIGKILL);
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
static int rank_waits(const gl_watchdog *wd, int i, uint64_t now) {
    return gl_progress_waiting_since(i, now) != 0 && !proc_stopped(wd->group->w[i].pid);
}

static void on_dump_done(uv_timer_t *t) {
    gl_watchdog *wd = t->data;
    wd->on_hang(wd, &wd->group->w[wd->culprit], wd->detail);
}

static void fire(gl_watchdog *wd, uint64_t now, double tmo, const int *silent, int only_victims) {
    const worker *ws = wd->group->w;
    wd->fired = 1;
    memset(wd->kill, 0, (size_t)wd->n * sizeof *wd->kill);
    /* the culprit: the silent rank with the oldest progress not waiting in a
     * collective (else, all waiting, the oldest) */
    int c = -1;
    uint64_t oldest = UINT64_MAX;
    for (int i = 0; i < wd->n; i++) {
        if (!silent[i])
            continue;
        gb_progress_slot *s = gl_progress_slot(i);
        int waiting = rank_waits(wd, i, now);
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
    wd->culprit = c;
    gb_progress_slot *cs = gl_progress_slot(c);
    const worker *cw = &ws[c];
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
    int len = snprintf(wd->detail, sizeof wd->detail,
                       "no progress for %.1f s (--progress-timeout %.1f s; %s)%s", quiet, tmo, last,
                       only_victims ? " while waiting in a collective; the rank it waits for "
                                      "is on another node or stuck too"
                                    : "");
    /* the ranks blocked in a collective behind it */
    int nv = 0;
    for (int i = 0; i < wd->n && len > 0 && (size_t)len < sizeof wd->detail - 64; i++) {
        if (i == c || !ws[i].running || !rank_waits(wd, i, now))
            continue;
        len += snprintf(wd->detail + len, sizeof wd->detail - (size_t)len, "%s%d",
                        nv++ ? "," : "; waiting for it in a collective: rank ", ws[i].rank);
    }
    snprintf(wd->msg, sizeof wd->msg, "rank %d (node %s, local rank %d, pid %d) hung: %s", cw->rank,
             wd->hostname, c, (int)cw->pid, wd->detail);
    fprintf(stderr, "gpulaunch: %s\n", wd->msg);
    GB_ERROR("%s", wd->msg);
    /* stacks first (Python's faulthandler prints them to stderr) */
    int dumped = 0;
    for (int i = 0; i < wd->n; i++) {
        gb_progress_slot *s = gl_progress_slot(i);
        int sig = atomic_load(&s->stack_signal);
        if (!silent[i] || !ws[i].running)
            continue;
        if (i == c || !rank_waits(wd, i, now))
            wd->kill[i] = 1;
        /* only to a process catching it now: one whose handler is gone (an
         * interpreter in its exit) would be killed by it instead */
        if (sig > 0 && sig < 65 && gb_proc_catches(ws[i].pid, sig) == 1) {
            kill(ws[i].pid, sig);
            dumped++;
        }
    }
    if (dumped)
        fprintf(stderr, "gpulaunch: stacks of %d hung rank(s) follow in their stderr\n", dumped);
    uv_timer_start(&wd->dump, on_dump_done, dumped ? GL_STACK_DUMP_MS : 0, 0);
}

static void on_tick(uv_timer_t *t) {
    gl_watchdog *wd = t->data;
    const gl_group *g = wd->group;
    if (wd->fired || g->w == NULL || g->nrunning == 0 || g->stopping || wd->ending(wd))
        return;
    const worker *ws = g->w;
    uint64_t now = gb_now_ns();
    int *silent = wd->silent;
    int any = 0, all_waiting = 1, saving = 0;
    /* the slowest step interval, from the beats seen (exact for gaps longer
     * than a tick, which are the ones that matter) */
    for (int i = 0; i < wd->n; i++) {
        gb_progress_slot *s = gl_progress_slot(i);
        gl_watch *w = &wd->w[i];
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
    learn(wd, now);
    double tmo = timeout_s(wd);
    if (tmo <= 0)
        return;
    for (int i = 0; i < wd->n; i++) {
        gb_progress_slot *s = gl_progress_slot(i);
        silent[i] = 0;
        if (!ws[i].running || atomic_load(&s->joined_ns) == 0)
            continue;
        /* checkpoint I/O gets GL_SAVE_TIMEOUT_FACTOR times the timeout
         * (from the save's start); a stopped process is stuck wherever it is */
        double limit = tmo;
        if (atomic_load(&s->state) != GB_PROGRESS_RUNNING && !proc_stopped(ws[i].pid)) {
            saving = 1;
            limit = tmo * GL_SAVE_TIMEOUT_FACTOR;
        }
        uint64_t b = atomic_load(&s->beat_ns);
        if (now > b && (double)(now - b) / 1e9 > limit) {
            silent[i] = 1;
            any = 1;
            if (!rank_waits(wd, i, now))
                all_waiting = 0;
        }
    }
    /* ranks waiting in a collective for a local rank that writes its
     * checkpoint wait for I/O, which is not a hang */
    if (!any || (all_waiting && saving)) {
        wd->victims_since = 0;
        return;
    }
    if (!all_waiting) {
        fire(wd, now, tmo, silent, 0);
        return;
    }
    if (wd->victims_since == 0)
        wd->victims_since = now;
    else if (now - wd->victims_since >= (uint64_t)GL_HANG_VICTIM_GRACE_MS * 1000000)
        fire(wd, now, tmo, silent, 1);
}

void gl_watchdog_init(gl_watchdog *wd, uv_loop_t *loop, const gl_config *cfg, const char *hostname,
                      const gl_group *group, gl_watchdog_ending_cb ending,
                      gl_watchdog_hang_cb on_hang) {
    wd->loop = loop;
    wd->cfg = cfg;
    wd->hostname = hostname;
    wd->group = group;
    wd->ending = ending;
    wd->on_hang = on_hang;
    wd->inited = wd->fired = 0;
    wd->w = NULL;
    wd->kill = wd->silent = NULL;
    wd->said_s = 0;
}

int gl_watchdog_dumping(const gl_watchdog *wd) {
    return wd->inited && uv_is_active((const uv_handle_t *)&wd->dump);
}

void gl_watchdog_round(gl_watchdog *wd) {
    if (!wd->inited) {
        wd->inited = 1;
        uv_timer_init(wd->loop, &wd->tick);
        uv_timer_init(wd->loop, &wd->dump);
        wd->tick.data = wd->dump.data = wd;
        wd->n = wd->cfg->nproc;
        wd->w = calloc((size_t)wd->n, sizeof *wd->w);
        wd->kill = calloc((size_t)wd->n, sizeof *wd->kill);
        wd->silent = calloc((size_t)wd->n, sizeof *wd->silent);
        if (wd->w == NULL || wd->kill == NULL || wd->silent == NULL)
            return;
        if (wd->cfg->progress_timeout_s > 0 || wd->cfg->progress_auto)
            uv_timer_start(&wd->tick, on_tick, GL_WATCH_TICK_MS, GL_WATCH_TICK_MS);
    }
    /* a stack dump of the last round still pending (its round ended by
     * another node and the workers exited within GL_STACK_DUMP_MS) must not
     * fire on this round's workers, which have the same local ranks */
    uv_timer_stop(&wd->dump);
    if (wd->w == NULL || wd->kill == NULL || wd->silent == NULL || gl_progress_slot(0) == NULL) {
        uv_timer_stop(&wd->tick); /* no memory or no channel: no watchdog */
        return;
    }
    memset(wd->kill, 0, (size_t)wd->n * sizeof *wd->kill);
    memset(wd->w, 0, (size_t)wd->n * sizeof *wd->w);
    wd->fired = 0;
    wd->victims_since = 0;
    wd->learned_s = 0;
}
