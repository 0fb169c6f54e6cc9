/* What the options mean: each value of the table (gl_options.c) parsed and
 * checked into the launcher's configuration: the mode (standalone, static,
 * dynamic), node and process counts, durations, sizes, signals, the torchrun
 * options that map onto others, GPU binding. A bad value is refused with the
 * option's name and accepted forms (exit 2). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include "gl_cloud.h"
#include "gl_numa.h"
#include "gl_nvml.h"
#include "gl_options.h"
#include "gl_slurm.h"
#include "gpulaunch/rdzv.h"

static int parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int64_t gl_parse_size(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -1;
    double mul = 1;
    switch (tolower((unsigned char)*end)) {
    case 'k':
        mul = 1024.0;
        break;
    case 'm':
        mul = 1024.0 * 1024;
        break;
    case 'g':
        mul = 1024.0 * 1024 * 1024;
        break;
    case 't':
        mul = 1024.0 * 1024 * 1024 * 1024;
        break;
    case '\0':
        break;
    default:
        return -1;
    }
    if (*end) {
        end++;
        if (tolower((unsigned char)*end) == 'i')
            end++;
        if (tolower((unsigned char)*end) == 'b')
            end++;
        if (*end)
            return -1;
    }
    return (int64_t)(v * mul);
}

/* "SIGUSR1" or "USR1" -> the number; 0 when unknown or not forwardable. */
static int signal_number(const char *name, size_t len) {
    if (len > 3 && strncmp(name, "SIG", 3) == 0) {
        name += 3;
        len -= 3;
    }
    /* KILL and STOP cannot be caught; the launcher reaps workers by CHLD,
     * ignores PIPE, and its own faults must not be forwarded */
    static const char *const never[] = {"KILL", "STOP", "CHLD", "PIPE", "SEGV",
                                        "BUS",  "FPE",  "ILL",  "TRAP", "SYS"};
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
        if (strlen(never[i]) == len && strncmp(name, never[i], len) == 0)
            return 0;
    for (int sig = 1; sig < 32; sig++) {
        const char *n = sigabbrev_np(sig);
        if (n && strlen(n) == len && strncmp(name, n, len) == 0)
            return sig;
    }
    return 0;
}

/* The options torchrun gained since 2.3 (docs/torchrun.md). */
static int resolve_torchrun(gl_config *c, char *err, size_t errlen) {
    const char *v = c->val[GL_START_METHOD];
    if (strcmp(v, "spawn") && strcmp(v, "fork") && strcmp(v, "forkserver"))
        return gl_opt_bad(err, errlen, GL_START_METHOD, v);
    v = c->val[GL_EVENT_LOG_HANDLER];
    if (strcmp(v, "null") && strcmp(v, "console")) {
        snprintf(err, errlen,
                 "--event-log-handler %s: torchrun loads a Python handler registered in "
                 "torch.distributed.elastic.events; gpulaunch runs no Python of its own. Its "
                 "events are its stderr lines and the rendezvous server's /metrics and /status: "
                 "use null or console, or drop the option",
                 v);
        return 2;
    }
    if (c->val[GL_LOGS_SPECS][0]) {
        snprintf(err, errlen,
                 "--logs-specs %s: torchrun loads a Python LogsSpecs plugin (entry point group "
                 "torchrun.logs_specs); gpulaunch writes worker logs itself: --log-dir, "
                 "--redirects, --tee, --local-ranks-filter, --log-line-prefix-template and "
                 "--duplicate-stdout-filters do what the default LogsSpecs does; drop the option",
                 c->val[GL_LOGS_SPECS]);
        return 2;
    }
    c->numa_binding = gl_numa_parse_mode(c->val[GL_NUMA_BINDING]);
    if (c->numa_binding < 0)
        return gl_opt_bad(err, errlen, GL_NUMA_BINDING, c->val[GL_NUMA_BINDING]);
    v = c->val[GL_PRINT_COMPLETION];
    if (*v && strcmp(v, "bash") && strcmp(v, "zsh") && strcmp(v, "tcsh"))
        return gl_opt_bad(err, errlen, GL_PRINT_COMPLETION, v);
    c->run_path = c->val[GL_RUN_PATH][0] == '1' || c->val[GL_RUN_PATH][0] == 't';
    c->virtual_local_rank =
        c->val[GL_VIRTUAL_LOCAL_RANK][0] == '1' || c->val[GL_VIRTUAL_LOCAL_RANK][0] == 't';
    if (c->no_python && c->module && !c->run_path) {
        snprintf(err, errlen, "--no-python and --module contradict each other; drop one");
        return 2;
    }
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (c->virtual_local_rank && cvd && *cvd) {
        int n = 1;
        for (const char *p = cvd; *p; p++)
            n += *p == ',';
        if (n < c->nproc) {
            snprintf(err, errlen,
                     "--virtual-local-rank gives local rank i the i-th device of "
                     "CUDA_VISIBLE_DEVICES=%s, which lists %d for %d workers; lower "
                     "--nproc-per-node or widen CUDA_VISIBLE_DEVICES",
                     cvd, n, c->nproc);
            return 2;
        }
    }
    for (int id = GL_DUPLICATE_STDOUT_FILTERS; id <= GL_DUPLICATE_STDERR_FILTERS; id++)
        if (c->val[id][0] && c->val[GL_LOG_DIR][0] == '\0') {
            snprintf(err, errlen,
                     "--%s writes LOG_DIR/RUN_ID/attempt_N/filtered_%s.log from the --tee'd "
                     "streams; give --log-dir (and --tee)",
                     gl_opt_name(id), id == GL_DUPLICATE_STDOUT_FILTERS ? "stdout" : "stderr");
            return 2;
        }
    c->nsignals = 0;
    for (const char *p = c->val[GL_SIGNALS_TO_HANDLE]; *p;) {
        p += strspn(p, " \t");
        size_t n = strcspn(p, ",");
        size_t m = n;
        while (m > 0 && (p[m - 1] == ' ' || p[m - 1] == '\t'))
            m--;
        if (m > 0) {
            int sig = signal_number(p, m);
            if (sig == 0 || c->nsignals == GL_MAX_SIGNALS) {
                snprintf(err, errlen,
                         "--signals-to-handle: '%.*s' is not a signal gpulaunch can forward; "
                         "expected up to %d names such as SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,"
                         "SIGUSR2 (not SIGKILL, SIGSTOP, SIGCHLD, SIGPIPE or a fault)",
                         (int)m, p, GL_MAX_SIGNALS);
                return 2;
            }
            int dup = 0;
            for (int i = 0; i < c->nsignals; i++)
                dup |= c->signals[i] == sig;
            if (!dup)
                c->signals[c->nsignals++] = sig;
        }
        p += n;
        if (*p == ',')
            p++;
    }
    return 0;
}

/* "90", "90s", "30m", "1h" -> seconds; -1 when malformed. */
static double parse_duration(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0))
        return -1;
    double mul = *end == '\0' || strcmp(end, "s") == 0 ? 1
                 : strcmp(end, "m") == 0               ? 60
                 : strcmp(end, "h") == 0               ? 3600
                                                       : -1;
    return mul < 0 ? -1 : v * mul;
}

/* --gpu-health, --gpu-monitor-interval, --gpu-idle-alert (docs/gpu-health.md). */
static int resolve_gpu(gl_config *c, char *err, size_t errlen) {
    const char *v = c->val[GL_GPU_HEALTH];
    c->gpu_health = strcmp(v, "refuse") == 0 ? GL_GPU_HEALTH_REFUSE
                    : strcmp(v, "warn") == 0 ? GL_GPU_HEALTH_WARN
                                             : GL_GPU_HEALTH_OFF;
    if (c->gpu_health == GL_GPU_HEALTH_OFF && strcmp(v, "off"))
        return gl_opt_bad(err, errlen, GL_GPU_HEALTH, v);
    char *end;
    v = c->val[GL_GPU_MONITOR_INTERVAL];
    c->gpu_interval_s = strtod(v, &end);
    if (*end || end == v || !(c->gpu_interval_s >= 0) ||
        (c->gpu_interval_s > 0 && c->gpu_interval_s < 0.1) || c->gpu_interval_s > 3600)
        return gl_opt_bad(err, errlen, GL_GPU_MONITOR_INTERVAL, v);
    v = c->val[GL_GPU_IDLE_ALERT];
    c->gpu_idle_s = 0;
    if (strcmp(v, "off") && strcmp(v, "0")) {
        const char *colon = strchr(v, ':');
        long pct = strtol(v, &end, 10);
        if (colon == NULL || end != colon || pct < 1 || pct > 100)
            return gl_opt_bad(err, errlen, GL_GPU_IDLE_ALERT, v);
        c->gpu_idle_pct = (int)pct;
        c->gpu_idle_s = parse_duration(colon + 1);
        if (!(c->gpu_idle_s > 0) || c->gpu_idle_s > 86400 * 7)
            return gl_opt_bad(err, errlen, GL_GPU_IDLE_ALERT, v);
    }
    return 0;
}

int gl_config_resolve(gl_config *c, char *err, size_t errlen) {
    const char *v;
    long n;
    /* nnodes */
    v = c->val[GL_NNODES];
    const char *colon = strchr(v, ':');
    if (colon) {
        char a[32];
        size_t l = (size_t)(colon - v);
        long lo, hi;
        if (l >= sizeof a)
            return gl_opt_bad(err, errlen, GL_NNODES, v);
        memcpy(a, v, l);
        a[l] = '\0';
        if (parse_int(a, 1, 65536, &lo) || parse_int(colon + 1, 1, 65536, &hi) || lo > hi)
            return gl_opt_bad(err, errlen, GL_NNODES, v);
        c->min_nodes = (uint32_t)lo;
        c->max_nodes = (uint32_t)hi;
    } else {
        if (parse_int(v, 1, 65536, &n))
            return gl_opt_bad(err, errlen, GL_NNODES, v);
        c->min_nodes = c->max_nodes = (uint32_t)n;
    }
    /* nproc-per-node */
    v = c->val[GL_NPROC_PER_NODE];
    if (strcmp(v, "gpu") == 0 || strcmp(v, "auto") == 0) {
        int g = gpl_visible_gpu_count();
        if (g == 0 && strcmp(v, "gpu") == 0) {
            snprintf(err, errlen,
                     "--nproc-per-node gpu: this node exposes no GPU (check "
                     "nvidia.com/gpu limits and CUDA_VISIBLE_DEVICES), or use "
                     "a number or cpu");
            return 2;
        }
        c->nproc = g > 0 ? g : (int)sysconf(_SC_NPROCESSORS_ONLN);
    } else if (strcmp(v, "cpu") == 0) {
        c->nproc = (int)sysconf(_SC_NPROCESSORS_ONLN);
    } else if (parse_int(v, 1, 4096, &n) == 0) {
        c->nproc = (int)n;
    } else {
        return gl_opt_bad(err, errlen, GL_NPROC_PER_NODE, v);
    }
    if (parse_int(c->val[GL_NODE_RANK], 0, 65535, &n))
        return gl_opt_bad(err, errlen, GL_NODE_RANK, c->val[GL_NODE_RANK]);
    c->node_rank = (int)n;
    if (parse_int(c->val[GL_MASTER_PORT], 1, 65535, &n))
        return gl_opt_bad(err, errlen, GL_MASTER_PORT, c->val[GL_MASTER_PORT]);
    c->master_port = (int)n;
    if (parse_int(c->val[GL_MAX_RESTARTS], 0, 1000000, &n))
        return gl_opt_bad(err, errlen, GL_MAX_RESTARTS, c->val[GL_MAX_RESTARTS]);
    c->max_restarts = (int)n;
    char *end;
    c->shutdown_timeout_s = strtod(c->val[GL_SHUTDOWN_TIMEOUT], &end);
    if (*end || end == c->val[GL_SHUTDOWN_TIMEOUT] || !(c->shutdown_timeout_s > 0))
        return gl_opt_bad(err, errlen, GL_SHUTDOWN_TIMEOUT, c->val[GL_SHUTDOWN_TIMEOUT]);
    double mi = strtod(c->val[GL_MONITOR_INTERVAL], &end);
    if (*end || !(mi >= 0))
        return gl_opt_bad(err, errlen, GL_MONITOR_INTERVAL, c->val[GL_MONITOR_INTERVAL]);
    int64_t sz = gl_parse_size(c->val[GL_SHM_MIN]);
    if (sz < 0)
        return gl_opt_bad(err, errlen, GL_SHM_MIN, c->val[GL_SHM_MIN]);
    c->shm_min = (uint64_t)sz;
    for (int id = 0; id < GL_OPT_COUNT; id++) {
        if (!gl_opt_is_flag(id))
            continue;
        v = c->val[id];
        if (strcmp(v, "1") && strcmp(v, "0") && strcmp(v, "true") && strcmp(v, "false"))
            return gl_opt_bad(err, errlen, id, v);
    }
    c->standalone =
        strcmp(c->val[GL_STANDALONE], "1") == 0 || !strcmp(c->val[GL_STANDALONE], "true");
    c->no_python = c->val[GL_NO_PYTHON][0] == '1' || c->val[GL_NO_PYTHON][0] == 't';
    c->module = c->val[GL_MODULE][0] == '1' || c->val[GL_MODULE][0] == 't';
    c->check = c->val[GL_CHECK][0] == '1' || c->val[GL_CHECK][0] == 't';
    c->print_config = c->val[GL_PRINT_CONFIG][0] == '1' || c->val[GL_PRINT_CONFIG][0] == 't';
    c->bind_gpus = c->val[GL_BIND_GPUS][0] == '1' || c->val[GL_BIND_GPUS][0] == 't';
    c->nccl_ifname_auto = strcmp(c->val[GL_NCCL_IFNAME_AUTO], "0") != 0;
    c->preemption_source = gl_cloud_parse_source(c->val[GL_PREEMPTION_SOURCE]);
    if (c->preemption_source < 0)
        return gl_opt_bad(err, errlen, GL_PREEMPTION_SOURCE, c->val[GL_PREEMPTION_SOURCE]);
    c->preemption_poll_s = strtod(c->val[GL_PREEMPTION_POLL], &end);
    if (*end || !(c->preemption_poll_s > 0) || c->preemption_poll_s > 3600)
        return gl_opt_bad(err, errlen, GL_PREEMPTION_POLL, c->val[GL_PREEMPTION_POLL]);
    const char *pe = c->val[GL_PREEMPTION_ENDPOINT];
    if (*pe && strncmp(pe, "http://", 7) != 0 && strncmp(pe, "https://", 8) != 0)
        return gl_opt_bad(err, errlen, GL_PREEMPTION_ENDPOINT, pe);
    for (const char *r = c->val[GL_REDIRECTS]; r == c->val[GL_REDIRECTS]; r++)
        if (strspn(r, "0123:,") != strlen(r))
            return gl_opt_bad(err, errlen, GL_REDIRECTS, r);
    if (strspn(c->val[GL_TEE], "0123:,") != strlen(c->val[GL_TEE]))
        return gl_opt_bad(err, errlen, GL_TEE, c->val[GL_TEE]);
    /* progress-timeout, stats-interval */
    v = c->val[GL_PROGRESS_TIMEOUT];
    c->progress_floor_s = GL_AUTO_FLOOR_DEFAULT_S;
    if (strncmp(v, "auto", 4) == 0) {
        c->progress_auto = 1;
        if (v[4] == ':') {
            c->progress_floor_s = strtod(v + 5, &end);
            if (*end || end == v + 5 || !(c->progress_floor_s > 0) ||
                c->progress_floor_s > 86400 * 7)
                return gl_opt_bad(err, errlen, GL_PROGRESS_TIMEOUT, v);
        } else if (v[4]) {
            return gl_opt_bad(err, errlen, GL_PROGRESS_TIMEOUT, v);
        }
    } else {
        c->progress_timeout_s = strtod(v, &end);
        if (*end || end == v || !(c->progress_timeout_s >= 0) || c->progress_timeout_s > 86400 * 7)
            return gl_opt_bad(err, errlen, GL_PROGRESS_TIMEOUT, v);
    }
    c->stats_interval_s = strtod(c->val[GL_STATS_INTERVAL], &end);
    if (*end || end == c->val[GL_STATS_INTERVAL] || !(c->stats_interval_s >= 0) ||
        (c->stats_interval_s > 0 && c->stats_interval_s < 0.1) || c->stats_interval_s > 3600)
        return gl_opt_bad(err, errlen, GL_STATS_INTERVAL, c->val[GL_STATS_INTERVAL]);
    c->warm_start_s = strtod(c->val[GL_WARM_START_TIMEOUT], &end);
    if (*end || end == c->val[GL_WARM_START_TIMEOUT] || !(c->warm_start_s >= 0) ||
        c->warm_start_s > 3600)
        return gl_opt_bad(err, errlen, GL_WARM_START_TIMEOUT, c->val[GL_WARM_START_TIMEOUT]);
    const char *ca = c->val[GL_CHECKPOINT_ASYNC];
    if (strcmp(ca, "on") != 0 && strcmp(ca, "off") != 0)
        return gl_opt_bad(err, errlen, GL_CHECKPOINT_ASYNC, ca);
    c->ckpt_async = strcmp(ca, "on") == 0;
    const char *cd = c->val[GL_CHECKPOINT_DURABLE];
    if (cd[0] && cd[0] != '/' && strncmp(cd, "s3://", 5) != 0)
        return gl_opt_bad(err, errlen, GL_CHECKPOINT_DURABLE, cd);
    if (strncmp(cd, "s3://", 5) == 0 && (cd[5] == '\0' || cd[5] == '/'))
        return gl_opt_bad(err, errlen, GL_CHECKPOINT_DURABLE, cd);
    int rg = resolve_gpu(c, err, errlen);
    if (rg)
        return rg;
    /* rdzv-conf */
    c->join_timeout_ms = RDZV_DEFAULT_JOIN_TIMEOUT_MS;
    c->last_call_ms = RDZV_DEFAULT_LAST_CALL_MS;
    c->hb_timeout_ms = RDZV_DEFAULT_HEARTBEAT_TIMEOUT_MS;
    c->rdzv_is_host = -1;
    char conf[512];
    snprintf(conf, sizeof conf, "%s", c->val[GL_RDZV_CONF]);
    char *save = NULL;
    for (char *kv = strtok_r(conf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (eq == NULL)
            return gl_opt_bad(err, errlen, GL_RDZV_CONF, kv);
        *eq = '\0';
        if (strcmp(kv, "is_host") == 0) { /* torchrun's c10d: host the store or not */
            const char *b = eq + 1;
            if (!strcasecmp(b, "true") || !strcmp(b, "1") || !strcasecmp(b, "yes"))
                c->rdzv_is_host = 1;
            else if (!strcasecmp(b, "false") || !strcmp(b, "0") || !strcasecmp(b, "no"))
                c->rdzv_is_host = 0;
            else
                return gl_opt_bad(err, errlen, GL_RDZV_CONF, b);
            continue;
        }
        double s = strtod(eq + 1, &end);
        if (*end || !(s >= 0) || s > 86400)
            return gl_opt_bad(err, errlen, GL_RDZV_CONF, eq + 1);
        uint32_t ms = (uint32_t)(s * 1000);
        if (strcmp(kv, "join_timeout") == 0)
            c->join_timeout_ms = ms;
        else if (strcmp(kv, "last_call_timeout") == 0)
            c->last_call_ms = ms;
        else if (strcmp(kv, "heartbeat_timeout") == 0)
            c->hb_timeout_ms = ms ? ms : 1;
        else if (strcmp(kv, "close_timeout") && strcmp(kv, "read_timeout") && strcmp(kv, "timeout"))
            return gl_opt_bad(err, errlen, GL_RDZV_CONF, kv);
    }
    /* mode */
    const char *be = c->val[GL_RDZV_BACKEND];
    if (strcmp(be, "static") && strcmp(be, "c10d") && strcmp(be, "gpulaunch") &&
        strcmp(be, "etcd") && strcmp(be, "etcd-v2"))
        return gl_opt_bad(err, errlen, GL_RDZV_BACKEND, be);
    if (!strcmp(be, "etcd") || !strcmp(be, "etcd-v2")) {
        snprintf(err, errlen,
                 "--rdzv-backend %s needs an etcd server, which gpulaunch does not speak; use "
                 "--rdzv-backend c10d with --rdzv-endpoint naming one of the job's nodes (its "
                 "launcher hosts the rendezvous) or a gpulaunch-rdzv server",
                 be);
        return 2;
    }
    if (c->standalone) {
        if (c->max_nodes > 1) {
            snprintf(err, errlen,
                     "--standalone runs one node but --nnodes is %s; drop one of "
                     "them",
                     c->val[GL_NNODES]);
            return 2;
        }
        if (c->src[GL_RDZV_ENDPOINT] == GL_SRC_CLI) {
            snprintf(err, errlen, "--standalone conflicts with --rdzv-endpoint; drop one");
            return 2;
        }
        c->mode = GL_MODE_STANDALONE;
    } else if (strcmp(be, "static") == 0) {
        if (c->min_nodes != c->max_nodes) {
            snprintf(err, errlen,
                     "--nnodes %s (elastic) needs --rdzv-backend c10d and "
                     "--rdzv-endpoint; static mode takes a fixed N",
                     c->val[GL_NNODES]);
            return 2;
        }
        if ((uint32_t)c->node_rank >= c->max_nodes)
            return gl_opt_bad(err, errlen, GL_NODE_RANK, c->val[GL_NODE_RANK]);
        /* torchrun's static backend: an endpoint given is the master's address */
        if (c->val[GL_RDZV_ENDPOINT][0]) {
            char host[256];
            int port;
            if (rdzv_parse_endpoint(c->val[GL_RDZV_ENDPOINT], c->master_port, host, sizeof host,
                                    &port) != GPL_OK)
                return gl_opt_bad(err, errlen, GL_RDZV_ENDPOINT, c->val[GL_RDZV_ENDPOINT]);
            free(c->val[GL_MASTER_ADDR]);
            c->val[GL_MASTER_ADDR] = strdup(host);
            c->src[GL_MASTER_ADDR] = c->src[GL_RDZV_ENDPOINT];
            c->master_port = port;
            char ps[16];
            snprintf(ps, sizeof ps, "%d", port);
            free(c->val[GL_MASTER_PORT]);
            c->val[GL_MASTER_PORT] = strdup(ps);
            c->src[GL_MASTER_PORT] = c->src[GL_RDZV_ENDPOINT];
        }
        c->mode = GL_MODE_STATIC;
    } else {
        if (c->val[GL_RDZV_ENDPOINT][0] == '\0') {
            snprintf(err, errlen,
                     "--rdzv-backend %s needs --rdzv-endpoint HOST[:PORT]: one of the job's "
                     "nodes (its launcher hosts the rendezvous) or a gpulaunch-rdzv server",
                     be);
            return 2;
        }
        char host[256];
        int port;
        if (rdzv_parse_endpoint(c->val[GL_RDZV_ENDPOINT], RDZV_DEFAULT_PORT, host, sizeof host,
                                &port) != GPL_OK)
            return gl_opt_bad(err, errlen, GL_RDZV_ENDPOINT, c->val[GL_RDZV_ENDPOINT]);
        c->mode = GL_MODE_DYNAMIC;
    }
    int rt = resolve_torchrun(c, err, errlen);
    if (rt)
        return rt;
    if (c->prog_argc == 0 && !c->check && !c->print_config && !c->val[GL_PRINT_COMPLETION][0]) {
        snprintf(err, errlen,
                 "no PROGRAM to run; usage: gpulaunch [options] PROGRAM [ARGS...] "
                 "(see --help)");
        return 2;
    }
    return 0;
}
