/* The worker group (see gl_workers.h): each worker's environment, fork/exec
 * in a session of its own with PR_SET_PDEATHSIG, signals to the group (stop,
 * the discard notice, the kill timer), and supervision: reaping on SIGCHLD.
 * It owns the worker records, the running count, the stop and its timers,
 * and the output router; the first failure and the round are its owner's. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "gb_log.h"
#include "gb_stop.h"
#include "gb_time.h"
#include "gl_numa.h"
#include "gl_output.h"
#include "gl_progress.h"
#include "gl_workers.h"

#define GB_COMPONENT "launcher"

extern char **environ;

/* ---- signalling the group ---- */

void gl_group_signal(gl_group *g, int sig) {
    for (int i = 0; i < g->n; i++)
        if (g->w[i].running && g->w[i].pid > 0) {
            /* the group, and the process itself in case it has not called
             * setsid() yet (the signal then waits, blocked, until it has) */
            kill(-g->w[i].pid, sig);
            kill(g->w[i].pid, sig);
            if (sig == SIGTERM || sig == SIGINT) { /* a stopped worker would hold it
                                                      pending until the kill timer */
                kill(-g->w[i].pid, SIGCONT);
                kill(g->w[i].pid, SIGCONT);
            }
        }
}

static void on_kill_timer(uv_timer_t *t) {
    gl_group *g = t->data;
    GB_WARN("workers still running %.0f s after SIGTERM: sending SIGKILL",
            g->cfg->shutdown_timeout_s);
    gl_group_signal(g, SIGKILL);
}

void gl_group_kill_after(gl_group *g, uint64_t ms) {
    g->stopping = 1;
    uv_timer_start(&g->kill_timer, on_kill_timer, ms, 0);
}

static void on_discard_timer(uv_timer_t *t) {
    gl_group *g = t->data;
    for (int i = 0; i < g->n; i++)
        if (g->w[i].running && g->w[i].pid > 0)
            sigqueue(g->w[i].pid, SIGTERM, (union sigval){.sival_int = GB_SIGVAL_ROUND_OVER});
}

/* Not a preemption's stop, which the owner makes of gl_group_signal and
 * gl_group_kill_after: that one lets workers checkpoint instead. */
void gl_group_stop(gl_group *g, uint64_t discard_after_ms) {
    if (g->nrunning == 0 || g->stopping)
        return;
    g->stopping = 1;
    if (discard_after_ms == 0)
        on_discard_timer(&g->discard_timer);
    else
        uv_timer_start(&g->discard_timer, on_discard_timer, discard_after_ms, 0);
    gl_group_signal(g, SIGTERM);
    uv_timer_start(&g->kill_timer, on_kill_timer, (uint64_t)(g->cfg->shutdown_timeout_s * 1000), 0);
}

int gl_group_idle(const gl_group *g) {
    if (g->nrunning > 0)
        return 0;
    for (int i = 0; g->w && i < g->n; i++)
        if (g->w[i].pipes_open)
            return 0;
    return 1;
}

const worker *gl_group_worker(const gl_group *g, int i) {
    return g->w == NULL || i < 0 || i >= g->n ? NULL : &g->w[i];
}

/* A stop ends with the group's last worker and pipe, once the owner has
 * heard of them (so that it takes no exit during the stop for a failure). */
static void settle(gl_group *g) {
    if (!gl_group_idle(g))
        return;
    uv_timer_stop(&g->kill_timer);
    uv_timer_stop(&g->discard_timer);
    g->stopping = 0;
}

const char *gl_signame(int sig) {
    static char buf[16];
    const char *n = sigabbrev_np(sig);
    if (n == NULL) {
        snprintf(buf, sizeof buf, "%d", sig);
        return buf;
    }
    snprintf(buf, sizeof buf, "SIG%s", n);
    return buf;
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
                                      "TORCHELASTIC_USE_AGENT_STORE",
                                      "TORCHELASTIC_SIGNALS_TO_HANDLE",
                                      "GPULAUNCH_LOCAL_RANK",
                                      "GPULAUNCH_RDZV_ENDPOINT",
                                      "GPULAUNCH_RUN_ID",
                                      "GPULAUNCH_ROUND",
                                      "GPULAUNCH_RDZV_TOKEN",
                                      "GPULAUNCH_NODE_RANK",
                                      "GPULAUNCH_HOSTNAME",
                                      "GPULAUNCH_NODE_ADDR",
                                      "GPULAUNCH_GRACE_S",
                                      "GPULAUNCH_CKPT_DURABLE",
                                      "GPULAUNCH_CKPT_ASYNC",
                                      "GPULAUNCH_PROGRESS_SHM",
                                      "GPULAUNCH_PROGRESS_FD",
                                      "GPULAUNCH_STACK_SIGNAL",
                                      "GPULAUNCH_ROUND_PENDING",
                                      NULL};

/* The i-th device this node exposes, for --bind-gpus: the i-th entry of
 * CUDA_VISIBLE_DEVICES; else of NVIDIA_VISIBLE_DEVICES when it lists UUIDs
 * (they name a device anywhere); its indices are the host's, and the
 * container runtime numbers the devices it mounted from 0: then i. */
static void bound_device(int i, char *out, size_t len) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v == NULL) {
        v = getenv("NVIDIA_VISIBLE_DEVICES");
        if (v && strncmp(v, "GPU-", 4) != 0 && strncmp(v, "MIG-", 4) != 0)
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

static char **build_env(const gl_group *g, const worker *w, const rdzv_assignment *a, int restarts,
                        const char *nccl_ifname) {
    const gl_config *cfg = g->cfg;
    const gl_group_job *job = &g->job;
    int max = 64;
    for (char **e = environ; *e; e++)
        max++;
    char **env = calloc((size_t)max + 1, sizeof *env);
    if (env == NULL)
        return NULL;
    int n = 0;
    int have_omp = 0, have_async = 0;
    for (char **e = environ; *e; e++) {
        if (is_managed(*e) || ((cfg->bind_gpus || cfg->virtual_local_rank) &&
                               strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) == 0))
            continue;
        if (strncmp(*e, "OMP_NUM_THREADS=", 16) == 0)
            have_omp = 1;
        if (strncmp(*e, "TORCH_NCCL_ASYNC_ERROR_HANDLING=", 32) == 0)
            have_async = 1;
        env[n++] = strdup(*e);
    }
    const char *role = cfg->val[GL_ROLE];
    /* a worker started before its round (a warm join: a == NULL) has no
     * global rank, world or master yet: it takes them from the round block */
    if (a == NULL)
        n = env_add(env, n, max, "GPULAUNCH_ROUND_PENDING", "1");
    else {
        n = env_add(env, n, max, "RANK", "%u", a->base_rank + (uint32_t)w->local_rank);
        n = env_add(env, n, max, "GROUP_RANK", "%u", a->node_rank);
        n = env_add(env, n, max, "ROLE_RANK", "%u", a->base_rank + (uint32_t)w->local_rank);
        n = env_add(env, n, max, "WORLD_SIZE", "%u", a->world_size);
        n = env_add(env, n, max, "GROUP_WORLD_SIZE", "%u", a->nnodes);
        n = env_add(env, n, max, "ROLE_WORLD_SIZE", "%u", a->world_size);
        n = env_add(env, n, max, "MASTER_ADDR", "%s", a->master_addr);
        n = env_add(env, n, max, "MASTER_PORT", "%u", a->master_port);
        n = env_add(env, n, max, "GPULAUNCH_ROUND", "%u", a->round);
        n = env_add(env, n, max, "GPULAUNCH_NODE_RANK", "%u", a->node_rank);
    }
    /* --virtual-local-rank: every worker is local rank 0 of its one GPU;
     * libgpulaunch still needs the true one */
    n = env_add(env, n, max, "LOCAL_RANK", "%d", cfg->virtual_local_rank ? 0 : w->local_rank);
    n = env_add(env, n, max, "GPULAUNCH_LOCAL_RANK", "%d", w->local_rank);
    n = env_add(env, n, max, "ROLE_NAME", "%s", role);
    n = env_add(env, n, max, "LOCAL_WORLD_SIZE", "%d", cfg->nproc);
    n = env_add(env, n, max, "TORCHELASTIC_RESTART_COUNT", "%d", restarts);
    n = env_add(env, n, max, "TORCHELASTIC_MAX_RESTARTS", "%d", cfg->max_restarts);
    n = env_add(env, n, max, "TORCHELASTIC_RUN_ID", "%s", job->run_id);
    char ef[PATH_MAX];
    gl_group_error_file(g, w, ef, sizeof ef);
    unlink(ef); /* an earlier round's or run's must not be taken for this worker's */
    n = env_add(env, n, max, "TORCHELASTIC_ERROR_FILE", "%s", ef);
    /* workers create their own store on MASTER_PORT (rank 0 listens) */
    n = env_add(env, n, max, "TORCHELASTIC_USE_AGENT_STORE", "False");
    n = env_add(env, n, max, "TORCHELASTIC_SIGNALS_TO_HANDLE", "%s",
                cfg->val[GL_SIGNALS_TO_HANDLE]);
    if (!have_omp && cfg->nproc > 1)
        n = env_add(env, n, max, "OMP_NUM_THREADS", "1");
    if (!have_async)
        n = env_add(env, n, max, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
    n = env_add(env, n, max, "GPULAUNCH_RDZV_ENDPOINT", "%s", job->rdzv_ep);
    n = env_add(env, n, max, "GPULAUNCH_RUN_ID", "%s", job->run_id);
    n = env_add(env, n, max, "GPULAUNCH_HOSTNAME", "%s", job->hostname);
    n = env_add(env, n, max, "GPULAUNCH_NODE_ADDR", "%s", job->addr);
    n = env_add(env, n, max, "GPULAUNCH_GRACE_S", "%g", cfg->shutdown_timeout_s);
    /* the checkpoints' tiers (libgpulaunch reads them: docs/checkpoints.md) */
    if (cfg->val[GL_CHECKPOINT_DURABLE][0])
        n = env_add(env, n, max, "GPULAUNCH_CKPT_DURABLE", "%s", cfg->val[GL_CHECKPOINT_DURABLE]);
    if (!cfg->ckpt_async)
        n = env_add(env, n, max, "GPULAUNCH_CKPT_ASYNC", "0");
    n = gl_progress_env(w->local_rank, env, n, max);
    if (job->token)
        n = env_add(env, n, max, "GPULAUNCH_RDZV_TOKEN", "%.*s", (int)job->token_len, job->token);
    if (nccl_ifname[0])
        n = env_add(env, n, max, "NCCL_SOCKET_IFNAME", "%s", nccl_ifname);
    if (cfg->bind_gpus || cfg->virtual_local_rank) {
        char dev[128];
        bound_device(w->local_rank, dev, sizeof dev);
        n = env_add(env, n, max, "CUDA_VISIBLE_DEVICES", "%s", dev);
    }
    env[n] = NULL;
    return env;
}

/* fork, then in the child: its own session (signals reach its whole process
 * group), death with the launcher (PR_SET_PDEATHSIG, which no spawn API
 * offers), the pipes as stdout and stderr, exec. 0 or -errno. */
static int spawn_one(const gl_config *cfg, char **argv, char **env, int out_w, int err_w,
                     int local_rank, pid_t *pid) {
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
        static const int sigs[] = {SIGTERM, SIGINT,  SIGHUP,  SIGQUIT,
                                   SIGCHLD, SIGPIPE, SIGUSR1, SIGUSR2};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            signal(sigs[i], SIG_DFL);
        for (int i = 0; i < cfg->nsignals; i++) /* SIGUSR1 & co. */
            signal(cfg->signals[i], SIG_DFL);
        if (cfg->slurm) { /* Slurm signals every process of the step; the
                              launcher alone makes the notice a checkpoint */
            signal(SIGUSR1, SIG_IGN);
            signal(SIGUSR2, SIG_IGN);
        }
        setsid();
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) /* the launcher died before the prctl */
            _exit(137);
        if (dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)
            _exit(127);
        if (gl_numa_apply(gl_numa_for(local_rank)) != 0) {
            static const char m[] = "gpulaunch: --numa-binding: sched_setaffinity failed\n";
            if (write(2, m, sizeof m - 1) < 0)
                _exit(126);
            _exit(127);
        }
        gl_progress_child(local_rank);
        execvpe(argv[0], argv, env);
        /* only async-signal-safe calls here: strerrordesc_np reads a table */
        int e = errno;
        const char *parts[] = {"gpulaunch: cannot run ",
                               argv[0],
                               ": ",
                               strerrordesc_np(e) ? strerrordesc_np(e) : "exec failed",
                               " (",
                               strerrorname_np(e) ? strerrorname_np(e) : "?",
                               ")\n"};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
            if (write(2, parts[i], strlen(parts[i])) < 0)
                break;
        _exit(e == ENOENT ? 127 : 126);
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

/* torchrun's ${local_rank} macro in the program's arguments (also
 * $local_rank): a copy of argv for local rank lr, or NULL when no argument
 * uses it. $$ is left alone (a shell's pid), unlike torchrun. */
static char **argv_for_rank(char **argv, int lr) {
    int n = 0, uses = 0;
    for (; argv[n]; n++)
        uses |= strstr(argv[n], "$local_rank") != NULL || strstr(argv[n], "${local_rank}") != NULL;
    if (!uses)
        return NULL;
    char **out = calloc((size_t)n + 1, sizeof *out);
    char num[16];
    snprintf(num, sizeof num, "%d", lr);
    static const char *const names[] = {"local_rank"};
    const char *vals[] = {num};
    for (int i = 0; out && i < n; i++) {
        size_t len = strlen(argv[i]) + 16; /* a number is shorter than the macro */
        out[i] = malloc(len);
        if (out[i])
            gl_subst(argv[i], names, vals, 1, 0, out[i], len);
    }
    return out;
}

static void argv_free(char **a) {
    for (char **p = a; p && *p; p++)
        free(*p);
    free(a);
}

/* Where execvp would find name: 0, or the errno it would fail with. */
static int find_exec(const char *name, char *found, size_t len) {
    if (strchr(name, '/')) {
        snprintf(found, len, "%s", name);
        struct stat st;
        if (stat(name, &st) != 0)
            return errno;
        if (S_ISDIR(st.st_mode))
            return EISDIR;
        return access(name, X_OK) == 0 ? 0 : errno;
    }
    const char *path = getenv("PATH");
    int seen = ENOENT;
    for (const char *p = path && *path ? path : "/usr/local/bin:/usr/bin:/bin"; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(found, len, "%.*s%s%s", (int)n, p, n ? "/" : "", name);
        struct stat st;
        if (stat(found, &st) == 0 && !S_ISDIR(st.st_mode)) {
            if (access(found, X_OK) == 0)
                return 0;
            seen = errno;
        }
        p += n + (p[n] == ':');
    }
    snprintf(found, len, "%s", name);
    return seen;
}

void gl_group_error_file(const gl_group *g, const worker *w, char *out, size_t len) {
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(out, len, "%s/gpulaunch-%s-error-%d.json", dir, g->job.run_id, w->rank);
}

int gl_group_check_program(const gl_config *cfg, char *err, size_t errlen) {
    const char *prog = cfg->prog_argv[0];
    size_t pl = strlen(prog);
    int script = cfg->run_path ||
                 (!cfg->no_python && !cfg->module && pl > 3 && strcmp(prog + pl - 3, ".py") == 0);
    char found[PATH_MAX];
    const char *what = "the program";
    int e;
    if (script || cfg->module) {
        const char *py = getenv("PYTHON_EXEC") && *getenv("PYTHON_EXEC") ? getenv("PYTHON_EXEC")
                                                                         : python_for_workers();
        e = find_exec(py, found, sizeof found);
        what = "the Python interpreter";
        if (e == 0 && script) {
            snprintf(found, sizeof found, "%s", prog);
            e = access(prog, R_OK) == 0 ? 0 : errno;
            what = "the script";
        }
    } else {
        e = find_exec(prog, found, sizeof found);
    }
    if (e == 0)
        return 0;
    snprintf(err, errlen, "cannot run %s %s: %s (%s)%s", what, found, strerror(e),
             strerrorname_np(e) ? strerrorname_np(e) : "?",
             e == ENOENT && !strchr(found, '/') ? "; it is not on PATH" : "");
    return -1;
}

int gl_group_spawn(gl_group *g, const rdzv_assignment *a, int restarts, const char *nccl_ifname) {
    const gl_config *cfg = g->cfg;
    int np = cfg->nproc;
    if (g->w == NULL)
        g->w = calloc((size_t)np, sizeof *g->w);
    /* argv: the shim, then the program as torchrun would run it */
    int pa = cfg->prog_argc;
    char **argv = calloc((size_t)pa + 4, sizeof *argv);
    int k = 0;
    const char *prog = cfg->prog_argv[0];
    size_t pl = strlen(prog);
    /* python -u as torchrun runs it (PYTHON_EXEC overrides the interpreter);
     * --run-path runs the script in a fresh interpreter, as runpy would */
    const char *py = getenv("PYTHON_EXEC") && *getenv("PYTHON_EXEC") ? getenv("PYTHON_EXEC")
                                                                     : python_for_workers();
    if (cfg->run_path ||
        (!cfg->no_python && !cfg->module && pl > 3 && strcmp(prog + pl - 3, ".py") == 0)) {
        argv[k++] = (char *)py;
        argv[k++] = "-u";
    } else if (cfg->module) {
        argv[k++] = (char *)py;
        argv[k++] = "-u";
        argv[k++] = "-m";
    }
    for (int i = 0; i < pa; i++)
        argv[k++] = cfg->prog_argv[i];
    argv[k] = NULL;
    g->stopping = 0;
    static int told_omp;
    if (!told_omp && np > 1 && getenv("OMP_NUM_THREADS") == NULL) {
        told_omp = 1; /* torchrun's warning, at INFO */
        GB_INFO("OMP_NUM_THREADS=1 for each worker (unset and %d workers, as torchrun does); "
                "set it to tune",
                np);
    }
    /* the channel, unless nothing reads it (--progress-timeout 0 --stats-interval 0) */
    if (gl_group_channel(cfg))
        gl_progress_round(np);
    int failed = 0;
    for (int i = 0; i < np; i++) {
        worker *w = &g->w[i];
        memset(w, 0, sizeof *w);
        w->local_rank = i;
        w->rank = a ? (int)a->base_rank + i : -1; /* pending: gl_group_ranks() */
        w->log_fd = -1;
        gl_output_open(&g->out, w, restarts);
        uv_pipe_init(g->loop, &w->out, 0);
        uv_pipe_init(g->loop, &w->err, 0);
        w->out.data = w->err.data = w;
        char **env = build_env(g, w, a, restarts, nccl_ifname);
        for (char **e = env; e && *e; e++)
            if (strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) == 0)
                snprintf(w->gpu, sizeof w->gpu, "%s", *e + 21);
        gl_progress_holder(i, w->rank, w->gpu);
        int po[2] = {-1, -1}, pe[2] = {-1, -1};
        int r = 0;
        if (pipe2(po, O_CLOEXEC) != 0 || pipe2(pe, O_CLOEXEC) != 0)
            r = -errno;
        else {
            char **wargv = argv_for_rank(argv, i);
            r = spawn_one(cfg, wargv ? wargv : argv, env, po[1], pe[1], i, &w->pid);
            argv_free(wargv);
        }
        for (char **e = env; e && *e; e++)
            free(*e);
        free(env);
        if (po[1] >= 0)
            close(po[1]);
        if (pe[1] >= 0)
            close(pe[1]);
        w->pipes_open = 2;
        /* A read end opened by its handle is closed with it; one that is not
         * (a pipe or the fork failed: no fd left, no process) is closed here,
         * or every failed start would keep it. */
        if (r == 0 && uv_pipe_open(&w->out, po[0]) == 0)
            po[0] = -1;
        if (r == 0 && po[0] < 0 && uv_pipe_open(&w->err, pe[0]) == 0)
            pe[0] = -1;
        if (r == 0 && (po[0] >= 0 || pe[0] >= 0))
            r = -EBADF;
        if (po[0] >= 0)
            close(po[0]);
        if (pe[0] >= 0)
            close(pe[0]);
        if (r != 0) {
            fprintf(stderr, "gpulaunch: cannot start %s: %s\n", prog, strerror(-r));
            gl_output_close(w);
            failed++;
            g->cb.on_spawn_error(g, w, -r);
            continue;
        }
        w->running = 1;
        g->nrunning++;
        gl_output_start(w);
        gl_progress_started(g->loop, i);
    }
    free(argv);
    return failed;
}

int gl_group_channel(const gl_config *cfg) {
    return cfg->progress_timeout_s > 0 || cfg->progress_auto || cfg->stats_interval_s > 0;
}

void gl_group_ranks(gl_group *g, uint32_t base_rank) {
    for (int i = 0; g->w && i < g->cfg->nproc; i++) {
        g->w[i].rank = (int)base_rank + i;
        gl_progress_holder(i, g->w[i].rank, g->w[i].gpu);
    }
}

/* ---- supervision ---- */

static void on_worker_exit(gl_group *g, worker *w, int64_t status, int sig) {
    w->running = 0;
    g->nrunning--;
    g->cb.on_exit(g, w, status, sig);
    settle(g);
}

/* Every child exit, ours or an orphan's (as PID 1 we inherit them all), is
 * reaped here: no zombie stays behind. */
static void on_sigchld(uv_signal_t *h, int sig) {
    gl_group *g = h->data;
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        for (int i = 0; g->w && i < g->n; i++) {
            worker *w = &g->w[i];
            if (!w->running || w->pid != pid)
                continue;
            if (WIFSIGNALED(st))
                on_worker_exit(g, w, 0, WTERMSIG(st));
            else
                on_worker_exit(g, w, WEXITSTATUS(st), 0);
            break;
        }
    }
}

static void on_output_closed(gl_output *o, worker *w) {
    gl_group *g = o->data;
    g->cb.on_closed(g, w);
    settle(g);
}

void gl_group_init(gl_group *g, uv_loop_t *loop, const gl_config *cfg, const gl_group_job *job,
                   const gl_group_callbacks *cb) {
    g->w = NULL;
    g->n = cfg->nproc;
    g->nrunning = 0;
    g->stopping = 0;
    g->loop = loop;
    g->cfg = cfg;
    g->job = *job;
    g->cb = *cb;
    gl_output_init(&g->out, cfg, job->run_id, job->hostname, on_output_closed);
    g->out.data = g;
    uv_timer_init(loop, &g->kill_timer);
    uv_timer_init(loop, &g->discard_timer);
    g->kill_timer.data = g->discard_timer.data = g;
    uv_signal_init(loop, &g->sigchld);
    g->sigchld.data = g;
    uv_signal_start(&g->sigchld, on_sigchld, SIGCHLD);
}
