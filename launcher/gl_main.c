/* gpulaunch: options -> preflight -> rendezvous -> spawn -> supervise ->
 * report, on one libuv loop. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netdb.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "gb_log.h"
#include "gb_stop.h"
#include "gb_time.h"
#include "gl_cloud.h"
#include "gl_options.h"
#include "gl_preflight.h"
#include "gpulaunch/rdzv.h"

#define GB_COMPONENT "launcher"

#define GL_EXIT_USAGE 2
#define GL_EXIT_PREFLIGHT 3
#define GL_EXIT_RDZV 200
#define GL_LINE_MAX 65536     /* a longer output line is written in pieces */
#define GL_ERR_TAIL_LINES 20  /* stderr lines kept for the failure report */
#define GL_DONE_WAIT_MS 60000 /* wait for the rest of the job after local success */

extern char **environ;

typedef struct linebuf {
    char buf[GL_LINE_MAX];
    size_t len;
} linebuf;

typedef struct worker {
    pid_t pid;
    int redirect, tee, show; /* stream bits (1 out, 2 err); show: on the console */
    uv_pipe_t out, err;
    int local_rank, rank;
    int running, pipes_open;
    linebuf lout, lerr;
    char tail[GL_ERR_TAIL_LINES][256];
    int tail_n;
    int log_fd;
} worker;

typedef struct failure {
    int set;
    double when;
    int rank, local_rank, pid;
    int64_t exit_code;
    int signal;
    char tail[GL_ERR_TAIL_LINES * 256];
} failure;

static struct launcher {
    gl_config cfg;
    uv_loop_t *loop;
    rdzv_server *srv;
    rdzv_client *cli;
    rdzv_assignment a;
    worker *w;
    int nrunning;
    int restarts;
    int stopping;       /* SIGTERM sent to the group */
    int group_failed;   /* a local worker failed this round */
    int round_over;     /* the rendezvous ended the round */
    int scale_up;       /* ... to take in waiting nodes: not a failure */
    int assigned;       /* holds an assignment of the current round */
    int exit_requested; /* a signal to us: exit once workers are gone */
    int exit_code;
    int done_sent;
    uv_timer_t kill_timer, done_timer, cloud_timer, discard_timer;
    gl_cloud *cloud;
    uv_signal_t sigchld;
    uv_signal_t sigs[4];
    char hostname[256], addr[256], run_id[256], instance[64];
    char nccl_ifname[64]; /* chosen NCCL_SOCKET_IFNAME, "" when left alone */
    char *token;
    size_t token_len;
    failure first;
    uint64_t t_start_ns;
    uint64_t t_join_ns; /* this node's last JOIN: the banner's rendezvous time */
} L;

/* ---- output ---- */

static void write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

static void emit_line(worker *w, int is_err, const char *line, size_t n) {
    char out[GL_LINE_MAX + 64];
    int h = snprintf(out, sizeof out, "[%s%d]:", L.cfg.val[GL_ROLE], w->local_rank);
    if (n > sizeof out - (size_t)h - 1)
        n = sizeof out - (size_t)h - 1;
    memcpy(out + h, line, n);
    out[h + (int)n] = '\n';
    int bit = is_err ? 2 : 1;
    /* one write per line: lines of different ranks never mix */
    if (w->show && !(w->redirect & bit))
        write_all(is_err ? 2 : 1, out, (size_t)h + n + 1);
    if (w->log_fd >= 0 && ((w->redirect | w->tee) & bit))
        write_all(w->log_fd, out + h, n + 1);
    if (is_err) {
        size_t k = n < 255 ? n : 255;
        memcpy(w->tail[w->tail_n % GL_ERR_TAIL_LINES], line, k);
        w->tail[w->tail_n % GL_ERR_TAIL_LINES][k] = '\0';
        w->tail_n++;
    }
}

static void feed(worker *w, int is_err, const char *p, size_t n) {
    linebuf *lb = is_err ? &w->lerr : &w->lout;
    while (n) {
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        if (lb->len + take > sizeof lb->buf) {
            size_t room = sizeof lb->buf - lb->len;
            memcpy(lb->buf + lb->len, p, room);
            emit_line(w, is_err, lb->buf, sizeof lb->buf);
            lb->len = 0;
            p += room;
            n -= room;
            continue;
        }
        memcpy(lb->buf + lb->len, p, take);
        lb->len += take;
        if (!nl)
            return;
        emit_line(w, is_err, lb->buf, lb->len);
        lb->len = 0;
        p += take + 1;
        n -= take + 1;
    }
}

static void on_alloc(uv_handle_t *h, size_t s, uv_buf_t *b) {
    static char slab[65536];
    b->base = slab;
    b->len = sizeof slab;
}

static void maybe_finish_round(void);

static void on_pipe_closed(uv_handle_t *h) {
    worker *w = h->data;
    if (--w->pipes_open == 0 && w->log_fd >= 0) {
        close(w->log_fd);
        w->log_fd = -1;
    }
    maybe_finish_round();
}

static void on_out(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
    worker *w = s->data;
    int is_err = s == (uv_stream_t *)&w->err;
    if (n > 0) {
        feed(w, is_err, b->base, (size_t)n);
        return;
    }
    if (n < 0) {
        linebuf *lb = is_err ? &w->lerr : &w->lout;
        if (lb->len) {
            emit_line(w, is_err, lb->buf, lb->len);
            lb->len = 0;
        }
        uv_close((uv_handle_t *)s, on_pipe_closed);
    }
}

/* ---- stopping and finishing ---- */

static void signal_group(int sig) {
    for (int i = 0; i < L.cfg.nproc; i++)
        if (L.w[i].running && L.w[i].pid > 0) {
            /* the group, and the process itself in case it has not called
             * setsid() yet (the signal then waits, blocked, until it has) */
            kill(-L.w[i].pid, sig);
            kill(L.w[i].pid, sig);
        }
}

static void on_kill_timer(uv_timer_t *t) {
    GB_WARN("workers still running %.0f s after SIGTERM: sending SIGKILL",
            L.cfg.shutdown_timeout_s);
    signal_group(SIGKILL);
}

/* Workers of a round that is over are stopped with SIGTERM, and then those
 * still running hear through sigqueue that their state is discarded
 * (gb_stop.h): a checkpoint handler then lets SIGTERM end the process, so a
 * rank stuck in a framework's collective is not held until --shutdown-timeout.
 * After a local failure that comes GL_DISCARD_GRACE_MS later, so that a rank
 * waiting in libgpulaunch's collective can report the dead peer first (it
 * learns of the round's end within 100 ms); when the rendezvous ended the
 * round, at once: the server already said why, and healing waits for it. */
#define GL_DISCARD_GRACE_MS 500

static void on_discard_timer(uv_timer_t *t) {
    for (int i = 0; i < L.cfg.nproc; i++)
        if (L.w[i].running && L.w[i].pid > 0)
            sigqueue(L.w[i].pid, SIGTERM, (union sigval){.sival_int = GB_SIGVAL_ROUND_OVER});
}

/* Stops the workers of a round that is over (not a preemption: see preempt). */
static void stop_group(uint64_t discard_after_ms) {
    if (L.nrunning == 0 || L.stopping)
        return;
    L.stopping = 1;
    if (discard_after_ms == 0)
        on_discard_timer(&L.discard_timer);
    else
        uv_timer_start(&L.discard_timer, on_discard_timer, discard_after_ms, 0);
    signal_group(SIGTERM);
    uv_timer_start(&L.kill_timer, on_kill_timer, (uint64_t)(L.cfg.shutdown_timeout_s * 1000), 0);
}

static const char *signame(int sig) {
    static char buf[16];
    const char *n = sigabbrev_np(sig);
    if (n == NULL) {
        snprintf(buf, sizeof buf, "%d", sig);
        return buf;
    }
    snprintf(buf, sizeof buf, "SIG%s", n);
    return buf;
}

static void report_failure(void) {
    if (!L.first.set)
        return;
    failure *f = &L.first;
    char when[64];
    time_t t = (time_t)f->when;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    char what[64];
    if (f->signal)
        snprintf(what, sizeof what, "signal %d (%s)", f->signal, signame(f->signal));
    else
        snprintf(what, sizeof what, "exit code %lld", (long long)f->exit_code);
    char ef[PATH_MAX + 64] = "";
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char errfile[PATH_MAX];
    snprintf(errfile, sizeof errfile, "%s/gpulaunch-%s-error-%d.json", dir, L.run_id, f->rank);
    FILE *ej = fopen(errfile, "r");
    if (ej) {
        size_t n = fread(ef, 1, sizeof ef - 1, ej);
        ef[n] = '\0';
        fclose(ej);
    }
    fprintf(stderr,
            "\n========== gpulaunch: job failed ==========\n"
            "first failure (root cause):\n"
            "  time       : %s\n"
            "  node       : %s (node rank %u)\n"
            "  rank       : %d (local rank %d)\n"
            "  pid        : %d\n"
            "  result     : %s\n"
            "  error file : %s\n"
            "  last stderr lines:\n%s"
            "==========================================\n",
            when, L.hostname, L.a.node_rank, f->rank, f->local_rank, f->pid, what,
            ef[0] ? ef : "(none written)", f->tail[0] ? f->tail : "    (none)\n");
    if (L.cfg.val[GL_LOG_DIR][0]) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/failure.json", L.cfg.val[GL_LOG_DIR]);
        FILE *j = fopen(path, "w");
        if (j) {
            fprintf(j,
                    "{\"time\":\"%s\",\"node\":\"%s\",\"node_rank\":%u,\"rank\":%d,"
                    "\"local_rank\":%d,\"pid\":%d,\"exit_code\":%lld,\"signal\":%d}\n",
                    when, L.hostname, L.a.node_rank, f->rank, f->local_rank, f->pid,
                    (long long)f->exit_code, f->signal);
            fclose(j);
        }
    }
}

static void finish(int code) {
    L.exit_code = code;
    if (code != 0)
        report_failure();
    fflush(stdout);
    fflush(stderr);
    exit(code);
}

static void spawn_workers(void);
static void on_done_timeout(uv_timer_t *t);
static void on_cloud_timer(uv_timer_t *t);

/* Everything local is gone: decide between done, restart and exit. */
static void maybe_finish_round(void) {
    if (L.nrunning > 0)
        return;
    for (int i = 0; i < L.cfg.nproc; i++)
        if (L.w && L.w[i].pipes_open)
            return;
    uv_timer_stop(&L.kill_timer);
    uv_timer_stop(&L.discard_timer);
    if (L.exit_requested)
        finish(L.exit_code);
    if (!L.group_failed && !L.round_over) {
        /* local success: wait (bounded) for the rest of the job */
        if (!L.done_sent) {
            L.done_sent = 1;
            rdzv_client_done(L.cli);
            uv_timer_start(&L.done_timer, on_done_timeout, GL_DONE_WAIT_MS, 0);
        }
        return;
    }
    /* A membership change (the round ended to take in waiting nodes) is not
     * a failure: like torchelastic, it does not use up --max-restarts. */
    if (L.scale_up && !L.group_failed) {
        fprintf(stderr, "gpulaunch: re-rendezvous to take in waiting nodes (not counted as a "
                        "restart)\n");
        L.round_over = L.scale_up = L.stopping = 0;
        L.t_join_ns = gb_now_ns();
        rdzv_client_rejoin(L.cli);
        return;
    }
    if (L.restarts >= L.cfg.max_restarts) {
        if (L.first.set) {
            if (L.first.signal)
                finish(128 + L.first.signal);
            finish(L.first.exit_code > 0 && L.first.exit_code < 128 ? (int)L.first.exit_code : 1);
        }
        fprintf(stderr, "gpulaunch: the round ended and no restarts are left (--max-restarts %d)\n",
                L.cfg.max_restarts);
        finish(GL_EXIT_RDZV);
    }
    L.restarts++;
    GB_WARN("restarting the worker group (restart %d of %d)", L.restarts, L.cfg.max_restarts);
    fprintf(stderr, "gpulaunch: restarting workers (%d/%d)\n", L.restarts, L.cfg.max_restarts);
    L.group_failed = L.round_over = L.scale_up = L.stopping = 0;
    L.t_join_ns = gb_now_ns();
    rdzv_client_rejoin(L.cli);
}

static void on_done_timeout(uv_timer_t *t) {
    fprintf(stderr, "gpulaunch: local workers finished; other nodes did not finish within %d s\n",
            GL_DONE_WAIT_MS / 1000);
    finish(0);
}

static void on_worker_exit(worker *w, int64_t status, int sig) {
    w->running = 0;
    L.nrunning--;
    int failed = status != 0 || sig != 0;
    if (failed && !L.stopping && !L.exit_requested && !L.round_over) {
        if (!L.first.set) {
            failure *f = &L.first;
            f->set = 1;
            f->when = gb_wall_s();
            f->rank = w->rank;
            f->local_rank = w->local_rank;
            f->pid = w->pid;
            f->exit_code = status;
            f->signal = sig;
            size_t off = 0;
            int start = w->tail_n > GL_ERR_TAIL_LINES ? w->tail_n - GL_ERR_TAIL_LINES : 0;
            for (int i = start; i < w->tail_n && off < sizeof f->tail; i++) {
                int k = snprintf(f->tail + off, sizeof f->tail - off, "    %s\n",
                                 w->tail[i % GL_ERR_TAIL_LINES]);
                if (k > 0)
                    off += (size_t)k;
            }
        }
        L.group_failed = 1;
        char msg[256];
        if (sig)
            snprintf(msg, sizeof msg, "rank %d (local rank %d) killed by %s", w->rank,
                     w->local_rank, signame(sig));
        else
            snprintf(msg, sizeof msg, "rank %d (local rank %d) exited with code %lld", w->rank,
                     w->local_rank, (long long)status);
        GB_ERROR("%s: stopping the local workers", msg);
        stop_group(GL_DISCARD_GRACE_MS);
        rdzv_client_fail(L.cli, msg);
    }
    maybe_finish_round();
}

/* ---- spawning ---- */

static int env_add(char **env, int n, int max, const char *k, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int env_add(char **env, int n, int max, const char *k, const char *fmt, ...) {
    if (n >= max)
        return n;
    char v[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    size_t len = strlen(k) + strlen(v) + 2;
    env[n] = malloc(len);
    if (env[n] == NULL)
        return n;
    snprintf(env[n], len, "%s=%s", k, v);
    return n + 1;
}

static const char *const managed[] = {"RANK",
                                      "LOCAL_RANK",
                                      "GROUP_RANK",
                                      "ROLE_RANK",
                                      "ROLE_NAME",
                                      "WORLD_SIZE",
                                      "LOCAL_WORLD_SIZE",
                                      "GROUP_WORLD_SIZE",
                                      "ROLE_WORLD_SIZE",
                                      "MASTER_ADDR",
                                      "MASTER_PORT",
                                      "TORCHELASTIC_RESTART_COUNT",
                                      "TORCHELASTIC_MAX_RESTARTS",
                                      "TORCHELASTIC_RUN_ID",
                                      "TORCHELASTIC_ERROR_FILE",
                                      "GPULAUNCH_RDZV_ENDPOINT",
                                      "GPULAUNCH_RUN_ID",
                                      "GPULAUNCH_ROUND",
                                      "GPULAUNCH_RDZV_TOKEN",
                                      "GPULAUNCH_NODE_RANK",
                                      "GPULAUNCH_HOSTNAME",
                                      "GPULAUNCH_NODE_ADDR",
                                      "GPULAUNCH_GRACE_S",
                                      NULL};

/* The i-th device this node exposes, for --bind-gpus. */
static void bound_device(int i, char *out, size_t len) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v == NULL) {
        v = getenv("NVIDIA_VISIBLE_DEVICES");
        if (v && strcmp(v, "all") == 0)
            v = NULL;
    }
    snprintf(out, len, "%d", i);
    if (v == NULL)
        return;
    const char *p = v;
    for (int k = 0; k < i && p; k++) {
        p = strchr(p, ',');
        if (p)
            p++;
    }
    if (p == NULL)
        return;
    size_t n = strcspn(p, ",");
    snprintf(out, len, "%.*s", (int)n, p);
}

static int is_managed(const char *kv) {
    for (int i = 0; managed[i]; i++) {
        size_t l = strlen(managed[i]);
        if (strncmp(kv, managed[i], l) == 0 && kv[l] == '=')
            return 1;
    }
    return 0;
}

static char **build_env(worker *w, const char *rdzv_ep) {
    int max = 64;
    for (char **e = environ; *e; e++)
        max++;
    char **env = calloc((size_t)max + 1, sizeof *env);
    if (env == NULL)
        return NULL;
    int n = 0;
    int have_omp = 0, have_async = 0;
    for (char **e = environ; *e; e++) {
        if (is_managed(*e) || (L.cfg.bind_gpus && strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) == 0))
            continue;
        if (strncmp(*e, "OMP_NUM_THREADS=", 16) == 0)
            have_omp = 1;
        if (strncmp(*e, "TORCH_NCCL_ASYNC_ERROR_HANDLING=", 32) == 0)
            have_async = 1;
        env[n++] = strdup(*e);
    }
    const rdzv_assignment *a = &L.a;
    const char *role = L.cfg.val[GL_ROLE];
    n = env_add(env, n, max, "RANK", "%u", a->base_rank + (uint32_t)w->local_rank);
    n = env_add(env, n, max, "LOCAL_RANK", "%d", w->local_rank);
    n = env_add(env, n, max, "GROUP_RANK", "%u", a->node_rank);
    n = env_add(env, n, max, "ROLE_RANK", "%u", a->base_rank + (uint32_t)w->local_rank);
    n = env_add(env, n, max, "ROLE_NAME", "%s", role);
    n = env_add(env, n, max, "WORLD_SIZE", "%u", a->world_size);
    n = env_add(env, n, max, "LOCAL_WORLD_SIZE", "%d", L.cfg.nproc);
    n = env_add(env, n, max, "GROUP_WORLD_SIZE", "%u", a->nnodes);
    n = env_add(env, n, max, "ROLE_WORLD_SIZE", "%u", a->world_size);
    n = env_add(env, n, max, "MASTER_ADDR", "%s", a->master_addr);
    n = env_add(env, n, max, "MASTER_PORT", "%u", a->master_port);
    n = env_add(env, n, max, "TORCHELASTIC_RESTART_COUNT", "%d", L.restarts);
    n = env_add(env, n, max, "TORCHELASTIC_MAX_RESTARTS", "%d", L.cfg.max_restarts);
    n = env_add(env, n, max, "TORCHELASTIC_RUN_ID", "%s", L.run_id);
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    n = env_add(env, n, max, "TORCHELASTIC_ERROR_FILE", "%s/gpulaunch-%s-error-%u.json", dir,
                L.run_id, a->base_rank + (uint32_t)w->local_rank);
    if (!have_omp && L.cfg.nproc > 1)
        n = env_add(env, n, max, "OMP_NUM_THREADS", "1");
    if (!have_async)
        n = env_add(env, n, max, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
    n = env_add(env, n, max, "GPULAUNCH_RDZV_ENDPOINT", "%s", rdzv_ep);
    n = env_add(env, n, max, "GPULAUNCH_RUN_ID", "%s", L.run_id);
    n = env_add(env, n, max, "GPULAUNCH_ROUND", "%u", a->round);
    n = env_add(env, n, max, "GPULAUNCH_NODE_RANK", "%u", a->node_rank);
    n = env_add(env, n, max, "GPULAUNCH_HOSTNAME", "%s", L.hostname);
    n = env_add(env, n, max, "GPULAUNCH_NODE_ADDR", "%s", L.addr);
    n = env_add(env, n, max, "GPULAUNCH_GRACE_S", "%g", L.cfg.shutdown_timeout_s);
    if (L.token)
        n = env_add(env, n, max, "GPULAUNCH_RDZV_TOKEN", "%.*s", (int)L.token_len, L.token);
    if (L.nccl_ifname[0])
        n = env_add(env, n, max, "NCCL_SOCKET_IFNAME", "%s", L.nccl_ifname);
    if (L.cfg.bind_gpus) {
        char dev[128];
        bound_device(w->local_rank, dev, sizeof dev);
        n = env_add(env, n, max, "CUDA_VISIBLE_DEVICES", "%s", dev);
    }
    env[n] = NULL;
    return env;
}

static char rdzv_ep_str[300];

/* "3" for every rank or "0:1,1:2" per local rank -> the stream bits of lr. */
static int stream_bits(const char *spec, int lr) {
    if (strchr(spec, ':') == NULL)
        return (int)strtol(spec, NULL, 10) & 3;
    for (const char *p = spec; *p;) {
        char *end;
        long r = strtol(p, &end, 10);
        if (*end != ':')
            return 0;
        long b = strtol(end + 1, &end, 10);
        if (r == lr)
            return (int)b & 3;
        p = *end == ',' ? end + 1 : end;
        if (*end == '\0')
            break;
    }
    return 0;
}

static int rank_shown(int lr) {
    const char *f = L.cfg.val[GL_LOCAL_RANKS_FILTER];
    if (*f == '\0')
        return 1;
    for (const char *p = f; *p;) {
        char *end;
        long r = strtol(p, &end, 10);
        if (end == p)
            return 0;
        if (r == lr)
            return 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

static void mkdirs(const char *path) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (char *q = p + 1; *q; q++)
        if (*q == '/') {
            *q = '\0';
            mkdir(p, 0755);
            *q = '/';
        }
    mkdir(p, 0755);
}

/* fork, then in the child: its own session (signals reach its whole process
 * group), death with the launcher (PR_SET_PDEATHSIG, which no spawn API
 * offers), the pipes as stdout and stderr, exec. 0 or -errno. */
static int spawn_one(char **argv, char **env, int out_w, int err_w, pid_t *pid) {
    pid_t parent = getpid();
    /* Signals stay blocked across the fork: a signal that reaches the child
     * before it has reset our handlers must not run them (they would write to
     * the launcher's own signal pipe). */
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);
    pid_t p = fork();
    if (p != 0) {
        int e = errno;
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (p < 0)
            return -e;
    }
    if (p == 0) {
        static const int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGCHLD, SIGPIPE};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            signal(sigs[i], SIG_DFL);
        setsid();
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) /* the launcher died before the prctl */
            _exit(137);
        if (dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)
            _exit(127);
        execvpe(argv[0], argv, env);
        static const char msg[] = "gpulaunch: cannot run the program: exec failed\n";
        if (write(2, msg, sizeof msg - 1) < 0)
            _exit(126);
        _exit(127);
    }
    *pid = p;
    return 0;
}

/* The interpreter for a .py or -m program: python3 from PATH, as torchrun's
 * own interpreter would be; but a launcher installed from the wheel lives in
 * PREFIX/lib[64]/pythonX.Y/site-packages/gpulaunch.scripts/, and then the Python it
 * was installed into (PREFIX/bin/python3, a virtual environment's) runs the
 * program even when that environment is not on PATH. */
static const char *python_for_workers(void) {
    static char py[PATH_MAX];
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return "python3";
    exe[n] = '\0';
    char *cut = strstr(exe, "/site-packages/gpulaunch.scripts/");
    char *lib = cut ? memrchr(exe, '/', (size_t)(cut - exe)) : NULL; /* .../lib/pythonX.Y */
    int d = lib == NULL                                            ? 0
            : lib - exe >= 6 && strncmp(lib - 6, "/lib64", 6) == 0 ? 6
            : lib - exe >= 4 && strncmp(lib - 4, "/lib", 4) == 0   ? 4
                                                                   : 0;
    if (d == 0)
        return "python3";
    snprintf(py, sizeof py, "%.*s/bin/python3", (int)(lib - d - exe), exe);
    return access(py, X_OK) == 0 ? py : "python3";
}

static void spawn_workers(void) {
    int np = L.cfg.nproc;
    if (L.w == NULL)
        L.w = calloc((size_t)np, sizeof *L.w);
    /* argv: the shim, then the program as torchrun would run it */
    int pa = L.cfg.prog_argc;
    char **argv = calloc((size_t)pa + 4, sizeof *argv);
    int k = 0;
    const char *prog = L.cfg.prog_argv[0];
    size_t pl = strlen(prog);
    if (L.cfg.module) {
        argv[k++] = (char *)python_for_workers();
        argv[k++] = "-m";
    } else if (!L.cfg.no_python && pl > 3 && strcmp(prog + pl - 3, ".py") == 0) {
        argv[k++] = (char *)python_for_workers();
    }
    for (int i = 0; i < pa; i++)
        argv[k++] = L.cfg.prog_argv[i];
    argv[k] = NULL;
    L.stopping = 0;
    for (int i = 0; i < np; i++) {
        worker *w = &L.w[i];
        memset(w, 0, sizeof *w);
        w->local_rank = i;
        w->rank = (int)L.a.base_rank + i;
        w->log_fd = -1;
        w->redirect = stream_bits(L.cfg.val[GL_REDIRECTS], i);
        w->tee = stream_bits(L.cfg.val[GL_TEE], i);
        w->show = rank_shown(i);
        if (L.cfg.val[GL_LOG_DIR][0] && (w->redirect | w->tee)) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%s/attempt_%d/%d", L.cfg.val[GL_LOG_DIR], L.run_id,
                     L.restarts, i);
            mkdirs(path);
            snprintf(path + strlen(path), sizeof path - strlen(path), "/output.log");
            w->log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
            if (w->log_fd < 0)
                fprintf(stderr, "gpulaunch: cannot write %s: %s\n", path, strerror(errno));
        }
        uv_pipe_init(L.loop, &w->out, 0);
        uv_pipe_init(L.loop, &w->err, 0);
        w->out.data = w->err.data = w;
        char **env = build_env(w, rdzv_ep_str);
        int po[2] = {-1, -1}, pe[2] = {-1, -1};
        int r = 0;
        if (pipe2(po, O_CLOEXEC) != 0 || pipe2(pe, O_CLOEXEC) != 0)
            r = -errno;
        else
            r = spawn_one(argv, env, po[1], pe[1], &w->pid);
        for (char **e = env; e && *e; e++)
            free(*e);
        free(env);
        if (po[1] >= 0)
            close(po[1]);
        if (pe[1] >= 0)
            close(pe[1]);
        w->pipes_open = 2;
        if (r == 0 && (uv_pipe_open(&w->out, po[0]) != 0 || uv_pipe_open(&w->err, pe[0]) != 0))
            r = -EBADF;
        if (r != 0) {
            fprintf(stderr, "gpulaunch: cannot start %s: %s\n", prog, strerror(-r));
            uv_close((uv_handle_t *)&w->out, on_pipe_closed);
            uv_close((uv_handle_t *)&w->err, on_pipe_closed);
            if (!L.first.set) {
                L.first.set = 1;
                L.first.when = gb_wall_s();
                L.first.rank = w->rank;
                L.first.local_rank = i;
                L.first.exit_code = 127;
                snprintf(L.first.tail, sizeof L.first.tail, "    cannot start %s: %s\n", prog,
                         strerror(-r));
            }
            L.group_failed = 1;
            continue;
        }
        w->running = 1;
        L.nrunning++;
        uv_read_start((uv_stream_t *)&w->out, on_alloc, on_out);
        uv_read_start((uv_stream_t *)&w->err, on_alloc, on_out);
    }
    free(argv);
    if (L.group_failed) {
        stop_group(GL_DISCARD_GRACE_MS);
        rdzv_client_fail(L.cli, "a worker could not be started");
        maybe_finish_round();
    }
}

/* ---- rendezvous callbacks ---- */

/* Several candidate interfaces and no NCCL_SOCKET_IFNAME: NCCL may pick one
 * that cannot reach the other nodes and hang (pytorch/pytorch#64926). Pin it
 * to the interface that routes to the master. */
static void choose_ifname(const char *master) {
    L.nccl_ifname[0] = '\0';
    if (!L.cfg.nccl_ifname_auto || getenv("NCCL_SOCKET_IFNAME") || L.a.nnodes < 2)
        return;
    char names[GL_MAX_IFACES][32];
    if (gl_list_ifaces(names, GL_MAX_IFACES) < 2)
        return;
    char ifn[64];
    if (gl_route_iface(master, ifn, sizeof ifn) == 0 && strcmp(ifn, "lo") != 0)
        snprintf(L.nccl_ifname, sizeof L.nccl_ifname, "=%s", ifn);
}

static void on_assigned(rdzv_client *c, const rdzv_assignment *a) {
    L.a = *a;
    L.assigned = 1;
    choose_ifname(a->master_addr);
    if (L.cloud == NULL && L.cfg.preemption_source != GL_CLOUD_NONE)
        uv_timer_start(&L.cloud_timer, on_cloud_timer, 1000, 0);
    /* the same in every round: from this node's JOIN (connecting included) to its rank */
    double ms = (double)(gb_now_ns() - L.t_join_ns) / 1e6;
    fprintf(stderr,
            "gpulaunch: job %s round %u: node rank %u of %u, ranks %u-%u of %u, master %s:%u, "
            "%d workers (rendezvous %.1f ms)\n",
            L.run_id, a->round, a->node_rank, a->nnodes, a->base_rank,
            a->base_rank + (uint32_t)L.cfg.nproc - 1, a->world_size, a->master_addr, a->master_port,
            L.cfg.nproc, ms);
    spawn_workers();
}

static void on_round_over(rdzv_client *c, uint32_t round, uint32_t reason, uint32_t node_rank,
                          const char *host, const char *msg) {
    fprintf(stderr, "gpulaunch: round %u is over: %s\n", round, msg);
    L.round_over = 1;
    L.assigned = 0;
    L.scale_up = reason == RDZV_REASON_SCALE_UP;
    if (L.nrunning)
        stop_group(0);
    else
        maybe_finish_round();
}

static void on_progress(rdzv_client *c, uint32_t joined, uint32_t expected, uint32_t waited,
                        const char *missing) {
    /* the server says what the round waits for, with the counts (an older
     * server may not: then the counts alone) */
    if (missing[0])
        fprintf(stderr, "gpulaunch: waiting for the rendezvous (%.0f s): %s\n", waited / 1000.0,
                missing);
    else
        fprintf(stderr, "gpulaunch: waiting for the rendezvous (%.0f s): %u of %u nodes joined\n",
                waited / 1000.0, joined, expected);
}

static void on_waiting(rdzv_client *c, uint32_t waiting, uint32_t members) {
    GB_INFO("%u node(s) waiting to join the next round", waiting);
}

static void on_job_done(rdzv_client *c) {
    if (L.nrunning == 0 && L.done_sent)
        finish(0);
    if (L.nrunning == 0 && !L.assigned) {
        fprintf(stderr,
                "gpulaunch: job %s finished while this node waited to join it; nothing "
                "left to do\n",
                L.run_id);
        finish(0);
    }
}

static void on_rdzv_error(rdzv_client *c, gpl_result_t code, const char *msg) {
    fprintf(stderr, "gpulaunch: rendezvous failed: %s\n", msg);
    if (L.nrunning) {
        L.exit_requested = 1;
        L.exit_code = GL_EXIT_RDZV;
        stop_group(GL_DISCARD_GRACE_MS);
        return;
    }
    finish(code == GPL_ERR_CONFIG || code == GPL_ERR_EXISTS || code == GPL_ERR_INVALID_ARG
               ? GL_EXIT_USAGE
               : GL_EXIT_RDZV);
}

/* A preemption: every node's workers checkpoint the same step and stop; the
 * launcher exits 143 (retryable). Workers get SIGTERM: those that use the
 * runtime turn it into a checkpoint request, others (PyTorch) stop as they
 * always do. SIGKILL comes only after the deadline. */
static void preempt(uint64_t deadline_unix_ms, const char *why) {
    if (L.exit_requested)
        return;
    L.exit_requested = 1;
    L.exit_code = 128 + SIGTERM;
    fprintf(stderr, "gpulaunch: preemption (%s): workers checkpoint and stop%s\n", why,
            L.nrunning ? "" : " (none running)");
    if (L.nrunning == 0) {
        maybe_finish_round();
        return;
    }
    signal_group(SIGTERM);
    L.stopping = 1;
    double left_ms = (double)deadline_unix_ms - gb_wall_s() * 1000.0;
    if (left_ms < 1000)
        left_ms = 1000;
    uv_timer_start(&L.kill_timer, on_kill_timer, (uint64_t)left_ms, 0);
}

static void on_event(rdzv_client *c, uint32_t kind, uint64_t deadline_unix_ms, const char *node,
                     const char *reason) {
    if (kind != RDZV_EVENT_CHECKPOINT)
        return;
    char why[512];
    snprintf(why, sizeof why, "%s", reason[0] ? reason : node);
    preempt(deadline_unix_ms, why);
}

/* A cloud notice on this node: tell every node, then stop like SIGTERM. */
static void on_cloud_notice(void *data, uint64_t deadline_unix_ms, const char *why) {
    char msg[600];
    snprintf(msg, sizeof msg, "%s on %s", why, L.hostname);
    if (!L.exit_requested && L.cli)
        rdzv_client_event(L.cli, RDZV_EVENT_CHECKPOINT, deadline_unix_ms, msg);
    preempt(deadline_unix_ms, msg);
}

/* Polling starts a second after the workers: short jobs never pay for it. */
static void on_cloud_timer(uv_timer_t *t) {
    if (L.cloud == NULL)
        L.cloud = gl_cloud_start(L.loop, L.cfg.preemption_source, L.cfg.val[GL_PREEMPTION_ENDPOINT],
                                 L.cfg.preemption_poll_s, on_cloud_notice, NULL);
}

static void on_signal(uv_signal_t *h, int sig) {
    if (sig == SIGTERM && !L.exit_requested && L.cli) {
        /* tell every node first, so that all ranks save the same step */
        uint64_t deadline = (uint64_t)((gb_wall_s() + L.cfg.shutdown_timeout_s) * 1000.0);
        char why[300];
        snprintf(why, sizeof why, "SIGTERM on %s", L.hostname);
        rdzv_client_event(L.cli, RDZV_EVENT_CHECKPOINT, deadline, why);
        preempt(deadline, why);
        return;
    }
    fprintf(stderr, "gpulaunch: got %s: stopping the workers\n", signame(sig));
    L.exit_requested = 1;
    L.exit_code = 128 + sig;
    if (L.nrunning == 0)
        finish(L.exit_code);
    signal_group(sig);
    if (!L.stopping) {
        L.stopping = 1;
        uv_timer_start(&L.kill_timer, on_kill_timer, (uint64_t)(L.cfg.shutdown_timeout_s * 1000),
                       0);
    }
}

/* Every child exit, ours or an orphan's (as PID 1 we inherit them all), is
 * reaped here: no zombie stays behind. */
static void on_sigchld(uv_signal_t *h, int sig) {
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        for (int i = 0; L.w && i < L.cfg.nproc; i++) {
            worker *w = &L.w[i];
            if (!w->running || w->pid != pid)
                continue;
            if (WIFSIGNALED(st))
                on_worker_exit(w, 0, WTERMSIG(st));
            else
                on_worker_exit(w, WEXITSTATUS(st), 0);
            break;
        }
    }
}

/* ---- preflight ---- */

static int preflight(int verbose) {
    gl_preflight_env e = {
        .shm_path = "/dev/shm",
        .shm_min = L.cfg.shm_min,
        .nccl_ifname = getenv("NCCL_SOCKET_IFNAME"),
        .gpus_visible = -1,
        .gpus_needed =
            L.cfg.bind_gpus || strcmp(L.cfg.val[GL_NPROC_PER_NODE], "gpu") == 0 ? L.cfg.nproc : 0,
        .memlock_min = gpl_visible_gpu_count() > 0 ? 64ull << 20 : 0,
    };
    int fails = gl_preflight(&e, stdout, verbose);
    fflush(stdout);
    return fails;
}

/* --check: the rendezvous this node would join resolves and answers. Retries
 * with backoff (a pod's DNS name appears late) within the join timeout, at
 * most 10 s. Returns the number of FAILs. */
static int check_rendezvous(void) {
    char host[256];
    int port;
    if (L.cfg.mode == GL_MODE_STANDALONE || (L.cfg.mode == GL_MODE_STATIC && L.cfg.node_rank == 0))
        return 0; /* this node hosts it */
    if (L.cfg.mode == GL_MODE_STATIC) {
        snprintf(host, sizeof host, "%s", L.cfg.val[GL_MASTER_ADDR]);
        port = L.cfg.master_port;
    } else if (rdzv_parse_endpoint(L.cfg.val[GL_RDZV_ENDPOINT], RDZV_DEFAULT_PORT, host,
                                   sizeof host, &port) != GPL_OK) {
        return 1;
    }
    uint64_t budget = L.cfg.join_timeout_ms < 10000 ? L.cfg.join_timeout_ms : 10000;
    uint64_t deadline = gb_now_ms() + budget;
    unsigned backoff = 100;
    int resolved = 0;
    char why[256] = "";
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
        char ps[16];
        snprintf(ps, sizeof ps, "%d", port);
        int g = getaddrinfo(host, ps, &hints, &res);
        if (g == 0) {
            resolved = 1;
            int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            int ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
            snprintf(why, sizeof why, "%s", ok ? "" : strerror(errno));
            if (fd >= 0)
                close(fd);
            freeaddrinfo(res);
            if (ok) {
                printf("ok   rendezvous %s:%d resolves and answers\n", host, port);
                return 0;
            }
        } else {
            snprintf(why, sizeof why, "%s", gai_strerror(g));
        }
        if (gb_now_ms() + backoff > deadline)
            break;
        usleep(backoff * 1000);
        backoff = backoff < 2000 ? backoff * 2 : 2000;
    }
    if (!resolved)
        printf("FAIL the rendezvous host %s does not resolve (%s) after %.1f s: check "
               "--master-addr / --rdzv-endpoint; in Kubernetes the master pod's DNS name "
               "appears only once it is scheduled\n",
               host, why, budget / 1000.0);
    else
        printf("FAIL nothing answers at %s:%d (%s) after %.1f s: is node rank 0 / the "
               "gpulaunch-rdzv server up, and the port open?\n",
               host, port, why, budget / 1000.0);
    return 1;
}

/* ---- main ---- */

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t len = sizeof sa;
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc && argv[i][0] == '-'; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(gl_usage, stdout);
            return 0;
        }
    L.t_start_ns = gb_now_ns();
    /* a peer that closed its socket is an error to handle, not a reason to die
     * (libuv writes with write(2); workers get SIGPIPE back to default) */
    signal(SIGPIPE, SIG_IGN);
    char err[1024] = "";
    if (gl_config_load(&L.cfg, argc, argv, err, sizeof err) != 0) {
        fprintf(stderr, "gpulaunch: %s\n", err);
        return GL_EXIT_USAGE;
    }
    if (L.cfg.print_config) {
        gl_config_print(&L.cfg, stdout);
        if (L.cfg.prog_argc == 0)
            return 0;
    }
    if (L.cfg.check) {
        int f = preflight(1) + check_rendezvous();
        return f ? GL_EXIT_PREFLIGHT : 0;
    }
    L.loop = uv_default_loop();

    gethostname(L.hostname, sizeof L.hostname);
    snprintf(L.instance, sizeof L.instance, "%s-%d-%llu", L.hostname, (int)getpid(),
             (unsigned long long)gb_now_ns());
    const char *tf = L.cfg.val[GL_RDZV_TOKEN_FILE][0] ? L.cfg.val[GL_RDZV_TOKEN_FILE] : NULL;
    if (rdzv_load_token(tf, &L.token, &L.token_len, err, sizeof err) != GPL_OK) {
        fprintf(stderr, "gpulaunch: --rdzv-token-file: %s\n", err);
        return GL_EXIT_USAGE;
    }
    fflush(stdout);
    if (preflight(0)) {
        fprintf(stderr, "gpulaunch: preflight failed (see above); nothing was started\n");
        return GL_EXIT_PREFLIGHT;
    }
    fflush(stdout);

    /* who hosts the rendezvous, where it is, and who we are */
    const char *rid = L.cfg.val[GL_RDZV_ID];
    char rhost[256];
    int rport = 0;
    if (L.cfg.mode == GL_MODE_STANDALONE) {
        snprintf(L.run_id, sizeof L.run_id, "standalone-%d-%llu", (int)getpid(),
                 (unsigned long long)(gb_now_ns() % 1000000));
        snprintf(L.addr, sizeof L.addr, "127.0.0.1");
        snprintf(rhost, sizeof rhost, "127.0.0.1");
    } else if (L.cfg.mode == GL_MODE_STATIC) {
        if (strcmp(rid, "none") == 0)
            snprintf(L.run_id, sizeof L.run_id, "static-%s-%d", L.cfg.val[GL_MASTER_ADDR],
                     L.cfg.master_port);
        else
            snprintf(L.run_id, sizeof L.run_id, "%s", rid);
        snprintf(rhost, sizeof rhost, "%s", L.cfg.val[GL_MASTER_ADDR]);
        rport = L.cfg.master_port;
    } else {
        snprintf(L.run_id, sizeof L.run_id, "%s", strcmp(rid, "none") ? rid : "default");
        rdzv_parse_endpoint(L.cfg.val[GL_RDZV_ENDPOINT], RDZV_DEFAULT_PORT, rhost, sizeof rhost,
                            &rport);
    }
    if (L.addr[0] == '\0')
        snprintf(L.addr, sizeof L.addr, "%s",
                 L.cfg.val[GL_LOCAL_ADDR][0] ? L.cfg.val[GL_LOCAL_ADDR] : L.hostname);
    int hosts =
        L.cfg.mode == GL_MODE_STANDALONE || (L.cfg.mode == GL_MODE_STATIC && L.cfg.node_rank == 0);
    if (hosts) {
        rdzv_server_options so = RDZV_SERVER_OPTIONS_INIT;
        so.listen_addr = L.cfg.mode == GL_MODE_STANDALONE ? "127.0.0.1" : "0.0.0.0";
        so.listen_port = rport;
        so.token = L.token;
        so.token_len = L.token_len;
        so.heartbeat_timeout_ms = L.cfg.hb_timeout_ms;
        if (rdzv_server_start(L.loop, &so, &L.srv, err, sizeof err) != GPL_OK) {
            fprintf(stderr, "gpulaunch: node rank 0 hosts the rendezvous: %s\n", err);
            return GL_EXIT_RDZV;
        }
        rport = rdzv_server_port(L.srv);
    }
    snprintf(rdzv_ep_str, sizeof rdzv_ep_str, "%s:%d",
             hosts ? (L.cfg.mode == GL_MODE_STANDALONE ? "127.0.0.1" : L.addr) : rhost, rport);
    rdzv_client_options co = {.host = rhost,
                              .port = rport,
                              .token = L.token,
                              .token_len = L.token_len,
                              .connect_timeout_ms = L.cfg.join_timeout_ms};
    rdzv_join_params jp = {
        .run_id = L.run_id,
        .hostname = L.hostname,
        .addr = L.addr,
        .instance = L.instance,
        .master_port = (uint16_t)free_port(),
        .nproc = (uint32_t)L.cfg.nproc,
        .ngpus = (uint32_t)gpl_visible_gpu_count(),
        .static_rank = L.cfg.mode == GL_MODE_STATIC ? L.cfg.node_rank : -1,
        .min_nodes = L.cfg.min_nodes,
        .max_nodes = L.cfg.max_nodes,
        .last_call_ms = L.cfg.mode == GL_MODE_DYNAMIC ? L.cfg.last_call_ms : 0,
        .join_timeout_ms = L.cfg.join_timeout_ms,
        .heartbeat_interval_ms = L.cfg.hb_timeout_ms / 5 ? L.cfg.hb_timeout_ms / 5 : 1,
        .heartbeat_timeout_ms = L.cfg.hb_timeout_ms,
    };
    rdzv_client_callbacks cb = {.on_assigned = on_assigned,
                                .on_round_over = on_round_over,
                                .on_waiting = on_waiting,
                                .on_progress = on_progress,
                                .on_job_done = on_job_done,
                                .on_event = on_event,
                                .on_error = on_rdzv_error};
    uv_timer_init(L.loop, &L.kill_timer);
    uv_timer_init(L.loop, &L.discard_timer);
    uv_timer_init(L.loop, &L.done_timer);
    uv_timer_init(L.loop, &L.cloud_timer);
    static const int sigs[4] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
    for (int i = 0; i < 4; i++) {
        uv_signal_init(L.loop, &L.sigs[i]);
        uv_signal_start(&L.sigs[i], on_signal, sigs[i]);
    }
    uv_signal_init(L.loop, &L.sigchld);
    uv_signal_start(&L.sigchld, on_sigchld, SIGCHLD);
    L.t_join_ns = gb_now_ns();
    if (rdzv_client_start(L.loop, &co, &jp, &cb, &L.cli, err, sizeof err) != GPL_OK) {
        fprintf(stderr, "gpulaunch: %s\n", err);
        return GL_EXIT_RDZV;
    }
    uv_run(L.loop, UV_RUN_DEFAULT);
    return L.exit_code;
}
