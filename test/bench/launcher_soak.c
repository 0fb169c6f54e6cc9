/* launcher_soak: one gpulaunch launcher through thousands of rounds of what
 * it handles, and everything it holds counted before and after.
 *
 *   launcher_soak [--rounds N] [--slow N] [--blocks B] [--nproc P]
 *                 [--kinds LIST] [--launcher PATH] [--progress-timeout S]
 *                 [--rss-growth-kib K] [--keep] [--ci]
 *
 * A real gpulaunch-rdzv and one real launcher (--nnodes 1:2, P = 2 workers,
 * --log-dir with --tee 3, --metrics); its workers are this program in worker
 * mode: they report steps on the progress channel and re-form in place
 * through the round block. Per kind (N rounds of each fast one, --slow of
 * each slow one; default 10000 and 1000):
 *   restart        local rank 0 exits 1 at once, its sibling is stopped; the
 *                  launcher fails the round, re-joins and starts both again;
 *   reform         a second node joins (a protocol peer of this program) and
 *                  leaves: the workers are kept and take each new round in
 *                  place (one re-formation each);
 *   warm           the second node joins warm (held until it says READY, the
 *                  launcher having said its workers re-form in place), then
 *                  leaves (one warm join, two re-formations);
 *   preempt_peer   (slow) the second node joins and sends a preemption
 *                  notice: the workers go on; the node leaves;
 *   hang           (slow) local rank 0 stops reporting: the watchdog names it
 *                  after --progress-timeout (0.5 s) and the job restarts;
 *   preempt_held   (slow) the launcher's own preemption ends it (exit 143, by
 *                  design), so each is one more launcher's whole life
 *                  (--standalone): SIGTERM while its worker cannot yet
 *                  checkpoint, the stop held, released once it can;
 *   warm_launcher  (slow) one more launcher joins the job warm: its workers
 *                  start before its round and take it in place, the first
 *                  launcher re-forms to take it in; SIGINT ends it, and the
 *                  first launcher re-forms without it.
 * The rounds run in B blocks (each also scrapes /metrics N/B times) after a
 * warm-up block of every kind. At the start, after the warm-up and at the
 * end, in the same state (its workers running, alone in a round, nothing in
 * flight), the launcher is counted from outside: descriptors (/proc/PID/fd,
 * by kind), threads (/proc/PID/task), child processes, /dev/shm/gpulaunch-soak-r*
 * entries and files in the launchers' TMPDIR; and from its /metrics: libuv
 * handles by type, the progress channel's regions and pipes, the workers it
 * holds, its heap in use (exact: malloc's per-thread cache is off); RSS
 * after every block. Workers of the launchers that ended must be gone. Exits
 * 1 when a count differs between the warm-up and the end, RSS grew more
 * than --rss-growth-kib (512) after the warm-up, a worker outlived its
 * launcher, or a round could not be driven (the launcher's last lines are
 * shown). --ci: 40 fast and 4 slow rounds of each kind (the ctest test). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gb_procstat.h"
#include "gb_progress.h"
#include "harness.h"
#include "proc_count.h"

#define GL GPL_BUILD_DIR "/launcher/gpulaunch"
#define RDZV GPL_BUILD_DIR "/rendezvous/gpulaunch-rdzv"

/* this soak's shared-memory segments (its run id is "soak", then "-r<round>"): only these are
 * counted, since the runtime removes other, dead jobs' stale segments on the
 * way (a run of the suite that was killed leaves some) */
#define SOAK_SHM_PREFIX "gpulaunch-soak-r"
#define SOAK_STEP_MS 10           /* a live worker's step */
#define SOAK_FAST_ROUND_MS 5000   /* a fast round longer than this: it was not driven */
#define SOAK_SLOW_ROUND_MS 20000  /* a slow round longer than this: the same */
#define SOAK_SETTLE_MS 300        /* quiet before a count: the last round's timers done */
#define SOAK_LIVE_SAY_MS 25       /* a re-formed launcher says LIVE again (a warm tick, 20 ms) */
#define SOAK_RSS_GROWTH_KIB 512   /* default bound on RSS growth after the warm-up */
#define SOAK_TAIL_LINES 40        /* the launcher's last lines, shown when a round fails */
#define SOAK_LINE_MAX 4096        /* a longer output line is cut */
#define SOAK_METRICS_MAX 262144   /* bytes of one /metrics answer (GL_METRICS_BODY_MAX) */
#define SOAK_MAX_ROUNDS 10000000L /* --rounds, --slow */
#define SOAK_NPROC_MAX 64         /* --nproc */

/* ---- worker modes (run by the launchers) ---- */

static volatile sig_atomic_t reread;

static void on_usr1(int sig) {
    (void)sig;
    reread = 1;
}

static void on_term_held(int sig) {
    (void)sig;
    _exit(143); /* as a runtime does once its checkpoint is saved */
}

/* The control file's mode: 'f' fail (exit 1 at start) or 'h' hang (stop
 * reporting) while TORCHELASTIC_RESTART_COUNT < *until; 'l' live. */
static char read_mode(const char *dir, long *until) {
    char path[PATH_MAX], m = 'l';
    snprintf(path, sizeof path, "%s/mode", dir);
    FILE *f = fopen(path, "re");
    *until = 0;
    if (f == NULL)
        return 'l';
    if (fscanf(f, " %c %ld", &m, until) != 2)
        m = 'l';
    fclose(f);
    return m;
}

static void hang_here(void) {
    for (;;)
        pause();
}

static int worker_main(const char *dir) {
    signal(SIGUSR1, on_usr1);
    const char *rc = getenv("TORCHELASTIC_RESTART_COUNT"), *lr = getenv("LOCAL_RANK");
    long k = rc ? strtol(rc, NULL, 10) : 0, until;
    int first = lr == NULL || strtol(lr, NULL, 10) == 0; /* local rank 0 fails and hangs */
    char m = first ? read_mode(dir, &until) : 'l';
    if (m == 'f' && k < until)
        return 1;
    if (gb_progress_attach() == NULL) {
        fprintf(stderr, "soak-worker: no progress channel (GPULAUNCH_PROGRESS_SHM): run it under "
                        "gpulaunch with --progress-timeout\n");
        return 3;
    }
    gb_progress_step(0);
    if (m == 'h' && k < until)
        hang_here();
    const gb_progress_round *rb = gb_progress_round_block();
    if (gb_progress_set_reform_ok(1) != 0 || rb == NULL) {
        fprintf(stderr, "soak-worker: the launcher gave no round block\n");
        return 3;
    }
    uint32_t seen = atomic_load(&rb->seq);
    fprintf(stderr, "soak-worker live restarts=%ld pid=%d local=%d\n", k, (int)getpid(), !first);
    for (int64_t step = 1;; step++) {
        gb_progress_step(step);
        if (reread) {
            reread = 0;
            m = read_mode(dir, &until);
            if (m == 'f' && k < until)
                return 1;
            if (m == 'h' && k < until)
                hang_here();
        }
        gb_progress_round r;
        int w = gb_progress_round_wait(seen, SOAK_STEP_MS, &r);
        if (w == 0) {
            seen = atomic_load(&r.seq);
            if (atomic_load(&r.state) == GB_ROUND_NEW)
                gb_progress_round_ack(r.round);
        } else if (w < 0) {
            usleep(SOAK_STEP_MS * 1000);
        }
    }
}

/* A worker whose launcher is preempted while it cannot checkpoint: it can
 * once DIR/ready exists; SIGTERM then ends it with 143. */
static int held_worker_main(const char *dir) {
    signal(SIGTERM, on_term_held);
    char ready[PATH_MAX];
    snprintf(ready, sizeof ready, "%s/ready", dir);
    if (gb_progress_attach() == NULL) {
        fprintf(stderr, "soak-held-worker: no progress channel\n");
        return 3;
    }
    gb_progress_step(0);
    fprintf(stderr, "soak-held-worker started pid=%d\n", (int)getpid());
    for (int64_t s = 1;; s++) {
        gb_progress_step(s);
        if (access(ready, F_OK) == 0)
            gb_progress_set_ckpt_ready(1);
        usleep(5000);
    }
}

/* ---- a child's output, line by line ---- */

enum mark {
    M_ROUND,     /* "gpulaunch: job ... round N: node rank ..." */
    M_RESTART,   /* "restarting workers (" */
    M_REFORMED,  /* "workers re-formed in place (" */
    M_HUNG,      /* the watchdog named a rank */
    M_PEER_PRE,  /* "preemption of another node" */
    M_LIVE,      /* the soak worker runs live */
    M_HELD,      /* a preemption's stop held */
    M_RELEASED,  /* ... released */
    M_HELD_UP,   /* the held worker started */
    M_WARM_TOOK, /* workers started before their round took it (a warm start) */
    M_FALLBACK,  /* a re-formation fell back to a restart: not expected */
    M_RDZV_FAIL, /* the launcher lost the rendezvous: not expected */
    M_COUNT
};

static const char *const mark_text[M_COUNT] = {
    [M_ROUND] = ": node rank ",
    [M_RESTART] = "gpulaunch: restarting workers (",
    [M_REFORMED] = "workers re-formed in place (",
    [M_HUNG] = "gpulaunch: rank ",
    [M_PEER_PRE] = "gpulaunch: preemption of another node (",
    [M_LIVE] = "soak-worker live restarts=",
    [M_HELD] = "their stop is held until they can",
    [M_RELEASED] = "every worker can checkpoint now",
    [M_HELD_UP] = "soak-held-worker started pid=",
    [M_WARM_TOOK] = "workers started before it took it (",
    [M_FALLBACK] = "re-forming in place failed",
    [M_RDZV_FAIL] = "gpulaunch: rendezvous failed",
};

typedef struct child {
    pid_t pid;
    int fd; /* stdout and stderr, -1 once closed */
    char line[SOAK_LINE_MAX];
    size_t len;
    long n[M_COUNT];
    long live_restarts;            /* the restart count the workers last said they run live in */
    int live_n;                    /* ... how many said so */
    pid_t live_pid;                /* local rank 0 among them */
    pid_t workers[SOAK_NPROC_MAX]; /* the workers it said it started (the last ones) */
    int nworkers;
    char tail[SOAK_TAIL_LINES][256];
    int tail_at;
} child;

/* ... and what the line must hold besides (the log's copy of a line starts
 * otherwise). */
static const char *const mark_also[M_COUNT] = {
    [M_HUNG] = ") hung: no progress for",
};

static void on_line(child *c, const char *l) {
    snprintf(c->tail[c->tail_at], sizeof c->tail[0], "%s", l);
    c->tail_at = (c->tail_at + 1) % SOAK_TAIL_LINES;
    for (int m = 0; m < M_COUNT; m++) {
        const char *s = strstr(l, mark_text[m]);
        if (s == NULL || (mark_also[m] && strstr(s, mark_also[m]) == NULL))
            continue;
        c->n[m]++;
        if (m == M_HELD_UP)
            c->workers[c->nworkers++ % SOAK_NPROC_MAX] =
                (pid_t)strtol(s + strlen(mark_text[m]), NULL, 10);
        if (m == M_LIVE) {
            long k = -1, pid = 0;
            int other = 0;
            if (sscanf(s + strlen(mark_text[m]), "%ld pid=%ld local=%d", &k, &pid, &other) != 3)
                continue;
            c->workers[c->nworkers++ % SOAK_NPROC_MAX] = (pid_t)pid;
            c->live_n = k == c->live_restarts ? c->live_n + 1 : 1;
            c->live_restarts = k;
            if (!other)
                c->live_pid = (pid_t)pid;
        }
    }
}

/* Reads what c wrote, waiting up to timeout_ms for the first bytes. -1
 * once its output is closed. */
static int pump(child *c, int timeout_ms) {
    if (c->fd < 0)
        return -1;
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
    if (poll(&pfd, 1, timeout_ms) <= 0)
        return 0;
    char buf[65536];
    for (;;) {
        ssize_t r = read(c->fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return 0;
        if (r <= 0) {
            close(c->fd);
            c->fd = -1;
            return -1;
        }
        for (ssize_t i = 0; i < r; i++) {
            if (buf[i] == '\n' || c->len == sizeof c->line - 1) {
                c->line[c->len] = '\0';
                on_line(c, c->line);
                c->len = 0;
                if (buf[i] == '\n')
                    continue;
            }
            c->line[c->len++] = buf[i];
        }
    }
}

static void show_tail(const child *c, const char *who) {
    fprintf(stderr, "launcher_soak: the last lines of %s:\n", who);
    for (int i = 0; i < SOAK_TAIL_LINES; i++) {
        const char *l = c->tail[(c->tail_at + i) % SOAK_TAIL_LINES];
        if (l[0])
            fprintf(stderr, "  | %s\n", l);
    }
}

/* Starts argv with stdout and stderr into c (log == NULL) or into the file log. */
static int spawn(child *c, char *const argv[], const char *log) {
    memset(c, 0, sizeof *c);
    c->fd = -1;
    int fds[2] = {-1, -1};
    if (log == NULL && pipe2(fds, O_CLOEXEC) != 0)
        return -1;
    pid_t parent = getpid();
    c->pid = fork();
    if (c->pid < 0) {
        if (fds[0] >= 0) {
            close(fds[0]);
            close(fds[1]);
        }
        return -1;
    }
    if (c->pid == 0) {
        int out = log ? open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644) : fds[1];
        if (out < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0)
            _exit(127);
        setpgid(0, 0);
        /* a soak killed (its timeout) takes its launchers and server along;
         * their workers go with the launchers */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    if (log == NULL) {
        close(fds[1]);
        c->fd = fds[0];
        fcntl(c->fd, F_SETFL, O_NONBLOCK);
    }
    return 0;
}

/* Ends c (sig, then SIGKILL after wait_ms); its wait status, -1 when killed. */
static int finish(child *c, int sig, int wait_ms) {
    if (c->pid <= 0)
        return -1;
    if (sig)
        kill(c->pid, sig);
    uint64_t deadline = now_ms() + (uint64_t)wait_ms;
    int st = -1;
    for (;;) {
        pump(c, 10);
        pid_t r = waitpid(c->pid, &st, WNOHANG);
        if (r == c->pid)
            break;
        if (now_ms() >= deadline) {
            kill(-c->pid, SIGKILL);
            kill(c->pid, SIGKILL);
            waitpid(c->pid, &st, 0);
            st = -1;
            break;
        }
    }
    while (pump(c, 0) == 0 && c->fd >= 0)
        ;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->pid = 0;
    return st;
}

/* ---- the soak's state ---- */

static struct {
    const char *gl; /* the launcher's program (--launcher) */
    char dir[128], ctl[PATH_MAX], tmp[PATH_MAX];
    char self[PATH_MAX];
    child a;      /* the launcher */
    child srv;    /* gpulaunch-rdzv, its output in dir/rdzv.log */
    int port;     /* the rendezvous' */
    int mport;    /* the launcher's --metrics */
    peer b;       /* the second node */
    int b_serial; /* its joins so far */
    char why[512];
} S;

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(S.why, sizeof S.why, fmt, ap);
    va_end(ap);
    return -1;
}

static int nproc = 2; /* --nproc: the launcher's workers */

/* Waits until every worker of the launcher runs live after `restarts`. */
static int await_live(long restarts, int timeout_ms) {
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    while (S.a.live_restarts != restarts || S.a.live_n < nproc) {
        if (now_ms() >= deadline)
            return fail("%d of %d workers said they run live after %ld restarts within %d ms",
                        S.a.live_restarts == restarts ? S.a.live_n : 0, nproc, restarts,
                        timeout_ms);
        if (pump(&S.a, 20) < 0)
            return fail("the launcher exited");
    }
    return 0;
}

/* Waits until mark m of the launcher reaches want. */
static int await_mark(int m, long want, int timeout_ms) {
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    while (S.a.n[m] < want) {
        if (S.a.n[M_FALLBACK] || S.a.n[M_RDZV_FAIL])
            return fail("the launcher %s",
                        S.a.n[M_FALLBACK] ? "fell back to a restart" : "lost the rendezvous");
        if (now_ms() >= deadline)
            return fail("the launcher said \"%s\" %ld times, not %ld, within %d ms", mark_text[m],
                        S.a.n[m], want, timeout_ms);
        if (pump(&S.a, 20) < 0)
            return fail("the launcher exited");
    }
    return 0;
}

static int write_mode(char mode, long until) {
    char path[PATH_MAX + 8], tmp[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/mode", S.ctl);
    snprintf(tmp, sizeof tmp, "%s/mode.tmp", S.ctl);
    FILE *f = fopen(tmp, "we");
    if (f == NULL)
        return fail("cannot write %s: %s", tmp, strerror(errno));
    fprintf(f, "%c %ld\n", mode, until);
    if (fclose(f) != 0 || rename(tmp, path) != 0)
        return fail("cannot write %s: %s", path, strerror(errno));
    return 0;
}

/* ---- the second node: a protocol peer ---- */

/* Waits for a frame of type from the peer while the launcher's output is
 * read (its pipe must not fill). */
static int b_await(uint16_t type, int timeout_ms) {
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    while (now_ms() < deadline) {
        pump(&S.a, 0);
        if (peer_recv(&S.b, 10) == 0 && S.b.last.type == type)
            return 0;
    }
    return fail("the second node got no %s within %d ms", rdzv_type_name(type), timeout_ms);
}

static int b_join(int warm) {
    if (peer_open(&S.b, S.port, NULL) != 0)
        return fail("the second node cannot connect to the rendezvous on port %d", S.port);
    rdzv_msg m = {.type = RDZV_JOIN, .req_id = 1, .flags = warm ? RDZV_JOIN_WARM : 0};
    int n = ++S.b_serial;
    snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "soak");
    snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "soak-peer");
    snprintf(m.u.join.addr, sizeof m.u.join.addr, "127.0.0.2");
    snprintf(m.u.join.instance, sizeof m.u.join.instance, "soak-peer-%d", n);
    m.u.join.master_port = 29999;
    m.u.join.nproc = 1;
    m.u.join.static_rank = -1;
    m.u.join.min_nodes = 1;
    m.u.join.max_nodes = 2;
    m.u.join.join_timeout_ms = 60000;
    m.u.join.heartbeat_timeout_ms = 60000;
    if (peer_send(&S.b, &m) != 0)
        return fail("the second node's JOIN could not be sent");
    return 0;
}

static void b_leave(void) { peer_close(&S.b); }

/* The second node joins (warm: held until it says READY, *held = whether the
 * server held it) and the launcher re-forms to take it in. */
static int b_in(int warm, int *held) {
    long before = S.a.n[M_REFORMED];
    if (held)
        *held = 0;
    if (b_join(warm) != 0)
        return -1;
    uint64_t deadline = now_ms() + SOAK_FAST_ROUND_MS;
    for (;;) { /* WAITING with the warm flag (held), or ASSIGNED (not held) */
        pump(&S.a, 0);
        if (now_ms() >= deadline)
            return fail("the second node was neither held nor given a rank");
        if (peer_recv(&S.b, 10) != 0)
            continue;
        if (S.b.last.type == RDZV_ASSIGNED)
            break;
        if (S.b.last.type == RDZV_WAITING && (S.b.last.flags & RDZV_WAITING_WARM)) {
            if (held)
                *held = 1;
            rdzv_msg r = {.type = RDZV_NODE, .req_id = 2, .flags = RDZV_NODE_READY};
            if (peer_send(&S.b, &r) != 0)
                return fail("the second node's READY could not be sent");
            if (b_await(RDZV_ASSIGNED, SOAK_FAST_ROUND_MS) != 0)
                return -1;
            break;
        }
    }
    return await_mark(M_REFORMED, before + 1, SOAK_FAST_ROUND_MS);
}

/* The second node leaves; the launcher re-forms without it. */
static int b_out(void) {
    long before = S.a.n[M_REFORMED];
    b_leave();
    return await_mark(M_REFORMED, before + 1, SOAK_FAST_ROUND_MS);
}

/* ---- the kinds ---- */

typedef struct kind_stat {
    const char *name;
    long rounds;
    double seconds;
    long extra; /* reform: re-formations; warm: joins not held (retried) */
} kind_stat;

enum kind {
    K_RESTART,
    K_REFORM,
    K_WARM,
    K_PREEMPT_PEER,
    K_HANG,
    K_PREEMPT_HELD,
    K_WARM_LAUNCHER,
    K_N
};
static kind_stat ks[K_N] = {
    {"restart", 0, 0, 0},       {"reform", 0, 0, 0}, {"warm", 0, 0, 0},
    {"preempt_peer", 0, 0, 0},  {"hang", 0, 0, 0},   {"preempt_held", 0, 0, 0},
    {"warm_launcher", 0, 0, 0},
};

/* n rounds in which the worker exits at once ('f') or stops reporting
 * ('h'): the live worker is told to, and the one that finally runs live
 * has a restart count n higher. */
static int run_restarts(char mode, long n, int round_ms) {
    long k = S.a.live_restarts;
    long restarts = S.a.n[M_RESTART], hung = S.a.n[M_HUNG];
    if (n <= 0)
        return 0;
    if (write_mode(mode, k + n) != 0)
        return -1;
    if (kill(S.a.live_pid, SIGUSR1) != 0)
        return fail("the live worker (pid %d) is gone: %s", (int)S.a.live_pid, strerror(errno));
    if (await_live(k + n, (int)(n * round_ms)) != 0 || write_mode('l', 0) != 0)
        return -1;
    if (S.a.n[M_RESTART] - restarts != n)
        return fail("%ld restarts for %ld rounds", S.a.n[M_RESTART] - restarts, n);
    if (mode == 'h' && S.a.n[M_HUNG] - hung != n)
        return fail("%ld hangs named for %ld rounds", S.a.n[M_HUNG] - hung, n);
    return 0;
}

static int run_reform(long n) {
    for (long i = 0; i < n; i += 2) {
        if (b_in(0, NULL) != 0 || b_out() != 0)
            return -1;
        ks[K_REFORM].extra += 2;
    }
    return 0;
}

static int run_warm(long n) {
    for (long i = 0; i < n;) {
        int held;
        usleep(SOAK_LIVE_SAY_MS * 1000); /* the launcher says LIVE again after a re-formation */
        if (b_in(1, &held) != 0 || b_out() != 0)
            return -1;
        if (held)
            i++;
        else
            ks[K_WARM].extra++;
        if (ks[K_WARM].extra > n + 10)
            return fail("%ld warm joins were not held: the launcher does not say its workers "
                        "re-form in place",
                        ks[K_WARM].extra);
    }
    return 0;
}

static int run_preempt_peer(long n) {
    for (long i = 0; i < n; i++) {
        long said = S.a.n[M_PEER_PRE];
        if (b_in(0, NULL) != 0)
            return -1;
        rdzv_msg e = {.type = RDZV_EVENT, .req_id = 3};
        e.u.event.kind = RDZV_EVENT_CHECKPOINT;
        e.u.event.deadline_unix_ms = (uint64_t)time(NULL) * 1000 + 120000;
        snprintf(e.u.event.node, sizeof e.u.event.node, "soak-peer");
        snprintf(e.u.event.reason, sizeof e.u.event.reason, "soak: the second node is preempted");
        if (peer_send(&S.b, &e) != 0)
            return fail("the second node's preemption notice could not be sent");
        if (await_mark(M_PEER_PRE, said + 1, SOAK_FAST_ROUND_MS) != 0 || b_out() != 0)
            return -1;
    }
    return 0;
}

static long orphans; /* workers still alive after their launcher ended */

/* After a launcher ended: those of its workers still alive. */
static void count_orphans(const child *c) {
    int n = c->nworkers < SOAK_NPROC_MAX ? c->nworkers : SOAK_NPROC_MAX;
    for (int i = 0; i < n; i++)
        if (c->workers[i] > 0 && kill(c->workers[i], 0) == 0) {
            fprintf(stderr, "launcher_soak: worker %d outlived its launcher\n", (int)c->workers[i]);
            orphans++;
        }
}
static int kind_on[K_N] = {1, 1, 1, 1, 1, 1, 1}; /* --kinds */

/* One launcher's life: preempted while its worker cannot checkpoint. */
static int run_held_one(void) {
    char ready[PATH_MAX + 8];
    snprintf(ready, sizeof ready, "%s/ready", S.ctl);
    unlink(ready);
    /* a SIGTERM's grace (--shutdown-timeout) over the hold's margin leaves room to hold */
    char *argv[] = {(char *)S.gl,
                    "--standalone",
                    "--nproc-per-node",
                    "1",
                    "--shutdown-timeout",
                    "90",
                    "--no-python",
                    S.self,
                    "--held-worker",
                    S.ctl,
                    NULL};
    child h;
    int rc = -1;
    if (spawn(&h, argv, NULL) != 0)
        return fail("cannot start %s: %s", S.gl, strerror(errno));
    uint64_t deadline = now_ms() + SOAK_SLOW_ROUND_MS;
    while (h.n[M_HELD_UP] == 0 && now_ms() < deadline && pump(&h, 20) >= 0)
        ;
    if (h.n[M_HELD_UP] == 0) {
        fail("the preempted launcher's worker did not start");
        goto out;
    }
    kill(h.pid, SIGTERM);
    while (h.n[M_HELD] == 0 && now_ms() < deadline && pump(&h, 20) >= 0)
        ;
    if (h.n[M_HELD] == 0) {
        fail("the preempted launcher did not hold the stop of a worker that cannot checkpoint");
        show_tail(&h, "the preempted launcher");
        goto out;
    }
    int fd = open(ready, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0)
        close(fd);
    int st = finish(&h, 0, SOAK_SLOW_ROUND_MS);
    count_orphans(&h);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 143 || h.n[M_RELEASED] == 0) {
        fail("the preempted launcher ended with status %d (expected exit 143 after releasing "
             "the held stop)",
             st);
        show_tail(&h, "the preempted launcher");
        goto out;
    }
    rc = 0;
out:
    if (h.pid > 0)
        finish(&h, SIGKILL, 2000);
    return rc;
}

static int run_held(long n) {
    for (long i = 0; i < n; i++)
        if (run_held_one() != 0)
            return -1;
    return 0;
}

/* One more launcher's life as the job's second node: its join is held (the
 * first launcher's workers re-form in place), its workers start before it
 * has a round and take it in place, the first launcher re-forms to take it
 * in; SIGINT ends it, and the first launcher re-forms without it. */
static int run_warm_launcher_one(void) {
    char ep[32], np[16];
    snprintf(ep, sizeof ep, "127.0.0.1:%d", S.port);
    snprintf(np, sizeof np, "%d", nproc);
    char *argv[] = {(char *)S.gl,
                    "--nnodes",
                    "1:2",
                    "--nproc-per-node",
                    np,
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    ep,
                    "--rdzv-id",
                    "soak",
                    "--rdzv-conf",
                    "is_host=0,last_call_timeout=0.05",
                    "--no-python",
                    S.self,
                    "--worker",
                    S.ctl,
                    NULL};
    child c;
    int rc = -1;
    long before = S.a.n[M_REFORMED];
    usleep(SOAK_LIVE_SAY_MS * 1000); /* the first launcher says LIVE again */
    if (spawn(&c, argv, NULL) != 0)
        return fail("cannot start %s: %s", S.gl, strerror(errno));
    uint64_t deadline = now_ms() + SOAK_SLOW_ROUND_MS;
    while (c.n[M_WARM_TOOK] == 0 && now_ms() < deadline && pump(&c, 5) >= 0)
        pump(&S.a, 0);
    if (c.n[M_WARM_TOOK] == 0) {
        fail("the second launcher's workers did not start before its round and take it");
        show_tail(&c, "the second launcher");
        goto out;
    }
    if (await_mark(M_REFORMED, before + 1, SOAK_FAST_ROUND_MS) != 0)
        goto out;
    int st = finish(&c, SIGINT, SOAK_SLOW_ROUND_MS);
    count_orphans(&c);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 128 + SIGINT) {
        fail("the second launcher ended with status %d on SIGINT (expected exit %d)", st,
             128 + SIGINT);
        show_tail(&c, "the second launcher");
        goto out;
    }
    rc = await_mark(M_REFORMED, before + 2, SOAK_FAST_ROUND_MS);
out:
    if (c.pid > 0)
        finish(&c, SIGKILL, 2000);
    return rc;
}

static int run_warm_launcher(long n) {
    for (long i = 0; i < n; i++)
        if (run_warm_launcher_one() != 0)
            return -1;
    return 0;
}

static int run_kind(int k, long n) {
    uint64_t t0 = now_ms();
    int r = 0;
    switch ((enum kind)k) {
    case K_RESTART:
        r = run_restarts('f', n, SOAK_FAST_ROUND_MS);
        break;
    case K_REFORM:
        r = run_reform(n);
        break;
    case K_WARM:
        r = run_warm(n);
        break;
    case K_PREEMPT_PEER:
        r = run_preempt_peer(n);
        break;
    case K_HANG:
        r = run_restarts('h', n, SOAK_SLOW_ROUND_MS);
        break;
    case K_PREEMPT_HELD:
        r = run_held(n);
        break;
    case K_WARM_LAUNCHER:
        r = run_warm_launcher(n);
        break;
    case K_N:
        break;
    }
    ks[k].rounds += n;
    ks[k].seconds += (double)(now_ms() - t0) / 1000.0;
    return r;
}

/* ---- counting ---- */

/* GET /metrics from the launcher into buf. */
static int scrape(char *buf, size_t len) {
    int fd = raw_connect(S.mport);
    if (fd < 0)
        return fail("cannot connect to the launcher's --metrics port %d", S.mport);
    static const char req[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    size_t got = 0;
    ssize_t r;
    if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
        close(fd);
        return fail("cannot send a request to the launcher's --metrics port");
    }
    while (got + 1 < len && (r = read(fd, buf + got, len - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    close(fd);
    return strncmp(buf, "HTTP/1.1 200", 12) == 0 ? 0 : fail("/metrics answered: %.60s", buf);
}

static int snapshot(long *c, long *rss_kib) {
    static char body[SOAK_METRICS_MAX];
    if (proc_count(S.a.pid, c, rss_kib) != 0)
        return fail("the launcher (pid %d) is gone", (int)S.a.pid);
    c[PC_SHM] = proc_count_dir("/dev/shm", SOAK_SHM_PREFIX);
    c[PC_TMPFILES] = proc_count_dir(S.tmp, "");
    if (scrape(body, sizeof body) != 0)
        return -1;
    if (proc_count_metrics(body, c) != 0)
        return fail("the launcher's /metrics has no process figures: %.200s", body);
    return 0;
}

/* The launcher's steady state: its worker live, alone in a round, nothing
 * in flight; then a quiet moment for the last round's timers. */
static int settle(void) {
    uint64_t until = now_ms() + SOAK_SETTLE_MS;
    while (now_ms() < until)
        if (pump(&S.a, 20) < 0)
            return fail("the launcher exited");
    return 0;
}

/* ---- main ---- */

static long parse_count(const char *opt, const char *v) {
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || end == v || n < 0 || n > SOAK_MAX_ROUNDS) {
        fprintf(stderr, "launcher_soak: %s takes 0 to %ld, not '%s'\n", opt, SOAK_MAX_ROUNDS, v);
        exit(2);
    }
    return n;
}

static int start_server(void) {
    char listen[32], log[PATH_MAX];
    S.port = free_tcp_port();
    snprintf(listen, sizeof listen, "127.0.0.1:%d", S.port);
    snprintf(log, sizeof log, "%s/rdzv.log", S.dir);
    char *argv[] = {RDZV, "--listen", listen, NULL};
    if (spawn(&S.srv, argv, log) != 0)
        return fail("cannot start %s: %s", RDZV, strerror(errno));
    for (int i = 0; i < 250; i++) {
        int fd = raw_connect(S.port);
        if (fd >= 0) {
            close(fd);
            return 0;
        }
        usleep(20000);
    }
    return fail("%s does not listen on %s (its log: %s)", RDZV, listen, log);
}

static int start_launcher(const char *timeout_s) {
    char ep[32], ms[32], logs[PATH_MAX], np[16];
    snprintf(np, sizeof np, "%d", nproc);
    snprintf(logs, sizeof logs, "%s/logs", S.dir);
    snprintf(ep, sizeof ep, "127.0.0.1:%d", S.port);
    S.mport = free_tcp_port();
    snprintf(ms, sizeof ms, "127.0.0.1:%d", S.mport);
    char *argv[] = {(char *)S.gl,
                    "--nnodes",
                    "1:2",
                    "--nproc-per-node",
                    np,
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    ep,
                    "--rdzv-id",
                    "soak",
                    "--rdzv-conf",
                    "is_host=0,last_call_timeout=0.05",
                    "--max-restarts",
                    "1000000",
                    "--progress-timeout",
                    (char *)timeout_s,
                    "--metrics",
                    ms,
                    "--log-dir",
                    logs,
                    "--tee",
                    "3",
                    "--no-python",
                    S.self,
                    "--worker",
                    S.ctl,
                    NULL};
    if (spawn(&S.a, argv, NULL) != 0)
        return fail("cannot start %s: %s", S.gl, strerror(errno));
    return await_live(0, SOAK_SLOW_ROUND_MS);
}

static long scrapes;
/* One block: n fast rounds of each fast kind, slow of each slow one, and
 * as many scrapes of the launcher's /metrics. */
static int run_block(long n, long slow) {
    static char body[SOAK_METRICS_MAX];
    for (long i = 0; i < n; i++, scrapes++)
        if (scrape(body, sizeof body) != 0)
            return -1;
    for (int k = 0; k < K_N; k++) {
        long want = !kind_on[k] ? 0 : k == K_RESTART || k == K_REFORM || k == K_WARM ? n : slow;
        if (run_kind(k, want) != 0)
            return -1;
    }
    return settle();
}

static double pct(long a, long b) { return b > 0 ? 100.0 * (double)(a - b) / (double)b : 0; }

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--worker") == 0)
        return worker_main(argv[2]);
    if (argc == 3 && strcmp(argv[1], "--held-worker") == 0)
        return held_worker_main(argv[2]);
    long rounds = 10000, slow = 1000, blocks = 10, growth_kib = SOAK_RSS_GROWTH_KIB;
    const char *timeout_s = "0.5";
    int keep = 0, rc = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = parse_count("--rounds", argv[++i]);
        else if (strcmp(argv[i], "--slow") == 0 && i + 1 < argc)
            slow = parse_count("--slow", argv[++i]);
        else if (strcmp(argv[i], "--blocks") == 0 && i + 1 < argc)
            blocks = parse_count("--blocks", argv[++i]);
        else if (strcmp(argv[i], "--rss-growth-kib") == 0 && i + 1 < argc)
            growth_kib = parse_count("--rss-growth-kib", argv[++i]);
        else if (strcmp(argv[i], "--progress-timeout") == 0 && i + 1 < argc)
            timeout_s = argv[++i];
        else if (strcmp(argv[i], "--nproc") == 0 && i + 1 < argc)
            nproc = (int)parse_count("--nproc", argv[++i]);
        else if (strcmp(argv[i], "--launcher") == 0 && i + 1 < argc)
            S.gl = argv[++i];
        else if (strcmp(argv[i], "--kinds") == 0 && i + 1 < argc) {
            const char *list = argv[++i];
            for (int k = 0; k < K_N; k++) {
                const char *p = strstr(list, ks[k].name);
                size_t l = strlen(ks[k].name);
                /* a whole name of the comma list ("preempt_peer" is not "reform") */
                kind_on[k] = p && (p == list || p[-1] == ',') && (p[l] == ',' || p[l] == '\0');
            }
        } else if (strcmp(argv[i], "--keep") == 0)
            keep = 1;
        else if (strcmp(argv[i], "--ci") == 0) {
            rounds = 40;
            slow = 4;
            blocks = 2;
        } else {
            fprintf(stderr, "usage: launcher_soak [--rounds N] [--slow N] [--blocks B] [--nproc P] "
                            "[--kinds LIST] [--launcher PATH] [--progress-timeout S] "
                            "[--rss-growth-kib K] [--keep] [--ci]\n");
            return 2;
        }
    }
    if (blocks < 1)
        blocks = 1;
    if (nproc < 1 || nproc > SOAK_NPROC_MAX) {
        fprintf(stderr, "launcher_soak: --nproc takes 1 to %d\n", SOAK_NPROC_MAX);
        return 2;
    }
    if (S.gl == NULL)
        S.gl = GL;
    signal(SIGPIPE, SIG_IGN);
    /* hermetic launchers, as the test suite runs them */
    setenv("PET_SHM_MIN", "16m", 1);
    setenv("PET_PREEMPTION_SOURCE", "none", 1);
    setenv("PET_SLURM", "off", 1);
    /* malloc's per-thread cache counts as in use in gpulaunch_heap_bytes: without it
     * the heap in use is exact, and equal in equal states */
    setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0", 1);
    ssize_t sl = readlink("/proc/self/exe", S.self, sizeof S.self - 1);
    tmpdir_make(S.dir, sizeof S.dir, "launcher-soak");
    if (sl <= 0 || S.dir[0] == '\0') {
        fprintf(stderr, "launcher_soak: cannot find this program or make a directory in /tmp\n");
        return 1;
    }
    S.self[sl] = '\0';
    snprintf(S.ctl, sizeof S.ctl, "%s/ctl", S.dir);
    snprintf(S.tmp, sizeof S.tmp, "%s/tmp", S.dir);
    mkdir(S.ctl, 0755);
    mkdir(S.tmp, 0755);
    setenv("TMPDIR", S.tmp, 1); /* the launchers' temporary files, counted */
    long c0[PC_N], cw[PC_N], ce[PC_N], rss0, rssw, rsse, rss_max;
    long children0 = gb_procstat_children(0), shm0 = proc_count_dir("/dev/shm", SOAK_SHM_PREFIX);
    uint64_t t0 = now_ms();
    if (start_server() != 0 || start_launcher(timeout_s) != 0 || settle() != 0 ||
        snapshot(c0, &rss0) != 0)
        goto out;
    printf("launcher_soak: launcher pid %d, gpulaunch-rdzv pid %d, --progress-timeout %s; "
           "%ld rounds of each fast kind, %ld of each slow one, in %ld blocks after a warm-up\n",
           (int)S.a.pid, (int)S.srv.pid, timeout_s, rounds, slow, blocks);
    /* warm-up: every kind, so that what is made once (timers, the region) is made */
    long wn = rounds < 20 ? (rounds > 2 ? 2 : rounds) : 20, ws = slow < 2 ? slow : 2;
    if (run_block(wn ? wn : 2, ws ? ws : 1) != 0 || snapshot(cw, &rssw) != 0)
        goto out;
    for (int k = 0; k < K_N; k++) {
        ks[k].rounds = ks[k].extra = 0;
        ks[k].seconds = 0;
    }
    printf("launcher_soak: warm-up done in %.1f s, rss %ld KiB\n", (double)(now_ms() - t0) / 1000.0,
           rssw);
    fflush(stdout);
    rss_max = rssw;
    for (long b = 0; b < blocks; b++) {
        long n = rounds / blocks + (b < rounds % blocks);
        long s = slow / blocks + (b < slow % blocks);
        uint64_t tb = now_ms();
        long bc[PC_N], r;
        double before[K_N];
        for (int k = 0; k < K_N; k++)
            before[k] = ks[k].seconds;
        if (run_block(n, s) != 0 || snapshot(bc, &r) != 0)
            goto out;
        if (r > rss_max)
            rss_max = r;
        printf("launcher_soak block %ld/%ld: %ld fast + %ld slow rounds of each kind in %.1f s, "
               "rss %ld KiB, heap %ld B, descriptors %ld, handles %ld, threads %ld, children %ld; "
               "seconds",
               b + 1, blocks, n, s, (double)(now_ms() - tb) / 1000.0, r, bc[PC_M_HEAP], bc[PC_FDS],
               bc[PC_HANDLES], bc[PC_THREADS], bc[PC_CHILDREN]);
        for (int k = 0; k < K_N; k++) /* a kind that slows down block after block holds more */
            if (kind_on[k])
                printf(" %s %.2f", ks[k].name, ks[k].seconds - before[k]);
        printf("\n");
        fflush(stdout);
    }
    if (snapshot(ce, &rsse) != 0)
        goto out;
    double total = 0;
    for (int k = 0; k < K_N; k++) {
        total += ks[k].seconds;
        printf("launcher_soak kind=%s rounds=%ld seconds=%.1f rounds_per_s=%.1f", ks[k].name,
               ks[k].rounds, ks[k].seconds,
               ks[k].seconds > 0 ? (double)ks[k].rounds / ks[k].seconds : 0.0);
        if (k == K_REFORM)
            printf(" reformations=%ld", ks[k].extra);
        if (k == K_WARM)
            printf(" not_held_retried=%ld", ks[k].extra);
        printf("\n");
    }
    printf("launcher_soak launcher rounds=%ld restarts=%ld reformations=%ld scrapes=%ld in %.1f "
           "s\n",
           S.a.n[M_ROUND], S.a.n[M_RESTART], S.a.n[M_REFORMED], scrapes, total);
    printf("launcher_soak %-40s %8s %8s %8s %6s\n", "count", "start", "warm-up", "end", "diff");
    int differ = 0;
    for (int i = 0; i < PC_N; i++) {
        printf("launcher_soak %-40s %8ld %8ld %8ld %6ld%s\n", proc_count_name[i], c0[i], cw[i],
               ce[i], ce[i] - cw[i], ce[i] != cw[i] ? "  DIFFERS" : "");
        differ += ce[i] != cw[i];
    }
    long grew = rsse - rssw;
    printf("launcher_soak rss_kib start=%ld warmup=%ld end=%ld max=%ld drift_kib=%ld "
           "drift_pct=%.2f bound_kib=%ld\n",
           rss0, rssw, rsse, rss_max, grew, pct(rsse, rssw), growth_kib);
    printf(
        "launcher_soak workers that outlived their launcher (preempt_held, warm_launcher): %ld\n",
        orphans);
    if (differ)
        fail("%d count(s) differ between the warm-up and the end", differ);
    else if (orphans)
        fail("%ld worker(s) outlived their launcher", orphans);
    else if (grew > growth_kib)
        fail("RSS grew %ld KiB after the warm-up (bound %ld KiB)", grew, growth_kib);
    else
        rc = 0;
out:
    if (S.a.pid > 0 && finish(&S.a, SIGINT, 10000) == -1 && rc == 0) {
        fail("the launcher did not stop on SIGINT within 10 s");
        rc = 1;
    }
    if (rc != 0 && S.a.tail[0][0])
        show_tail(&S.a, "the launcher");
    b_leave();
    if (S.srv.pid > 0)
        finish(&S.srv, SIGTERM, 5000);
    long children1 = gb_procstat_children(0), shm1 = proc_count_dir("/dev/shm", SOAK_SHM_PREFIX);
    if (rc == 0 && (children1 != children0 || shm1 != shm0)) {
        fail("left behind: %ld child process(es) (before %ld), %ld /dev/shm/" SOAK_SHM_PREFIX "* "
             "(before %ld)",
             children1, children0, shm1, shm0);
        rc = 1;
    }
    if (rc == 0)
        printf("launcher_soak: every count equal at the end, RSS within %ld KiB: PASS\n",
               growth_kib);
    else
        fprintf(stderr, "launcher_soak: FAIL: %s (work directory %s)\n", S.why, S.dir);
    if (!keep && rc == 0)
        tmpdir_remove(S.dir);
    return rc;
}
