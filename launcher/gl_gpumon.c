/* The running GPU monitor (see gl_gpumon.h). Local rank i holds the i-th
 * bound device: its own with --bind-gpus, cuda:LOCAL_RANK by torchrun's
 * convention otherwise. It owns the NVML thread, the samples and the XIDs
 * seen; the workers it reads from the group, and its notices go to the owner's
 * callback. */
#include "gl_ckptview.h"
#include "gl_story.h"
#include "gl_gpumon.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gb_log.h"
#include "gb_time.h"
#include "gl_metrics.h"
#include "gl_nvml.h"
#include "gpulaunch/rdzv.h"

#define GB_COMPONENT "launcher"

typedef struct gpu_state {
    gl_gpu_sample s;
    int sampled;
    uint64_t below_since_ms; /* utilisation under the threshold since; 0: not */
    int idle;                /* the alert is on */
    uint64_t idle_alerts;
    int64_t slowed; /* the fault reasons last said */
    uint64_t xids;
    uint64_t last_xid;
    char dcgm[PATH_MAX]; /* the job-mapping file written, "" none */
} gpu_state;

typedef struct xid_rec {
    int gpu; /* position in M.g[], -1 unknown */
    uint64_t xid;
    unsigned gi;
    double when;               /* wall clock */
    uint64_t seen_ns;          /* monotonic, when the thread got it */
    int rank, local_rank, pid; /* the worker on it when it came first */
    uint64_t count;            /* in the report: how many of this XID on this GPU */
} xid_rec;

static struct {
    int started;
    uv_loop_t *loop;
    const gl_config *cfg;
    const gl_group *group;
    gl_gpumon_event_cb on_event;
    void *data;
    char job[256];
    gl_gpu *g;
    gpu_state *st;
    int n;    /* bound devices */
    int held; /* those the workers hold: min(n, nproc) */
    /* the NVML thread -> the loop: XIDs and samples */
    void *events;
    pthread_t thread;
    uv_async_t async;
    pthread_mutex_t mu;
    xid_rec queue[GL_GPUMON_XID_MAX];
    int qn;
    gl_gpu_sample fresh[GL_NVML_MAX_GPUS]; /* the last sample, not yet evaluated */
    int have_fresh;
    double fresh_ms;               /* what it cost the thread */
    atomic_uint_fast64_t every_ms; /* sampling period, 0 until the first round */
    atomic_int stop;
    xid_rec seen[GL_GPUMON_XID_MAX]; /* for the failure report: one per GPU and XID */
    int nseen;
    /* --metrics */
} M = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ---- the worker on a device ---- */

static const worker *holder(int i) { return gl_group_worker(M.group, i); }

static void who(int i, char *buf, size_t len) {
    const worker *w = holder(i);
    if (w == NULL || w->pid <= 0)
        snprintf(buf, len, "no worker");
    else
        snprintf(buf, len, "rank %d (local rank %d, pid %d)", w->rank, w->local_rank, (int)w->pid);
}

/* ---- sampling and the idle alert ---- */

/* A GPU notice on the job's timeline at the rendezvous (its page and /status):
 * the idle alert, its end, an XID. */
static void gpu_event(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void gpu_event(const char *fmt, ...) {
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    M.on_event(M.data, text);
}

static void idle_event(int i, int on) {
    char name[256], w[128];
    gl_nvml_name(&M.g[i], name, sizeof name);
    who(i, w, sizeof w);
    if (on)
        gpu_event("idle GPU: %s of %s under %d %% for %s (now %d %%)", name, w, M.cfg->gpu_idle_pct,
                  M.cfg->val[GL_GPU_IDLE_ALERT], M.st[i].s.util);
    else
        gpu_event("%s of %s is busy again (%d %%)", name, w, M.st[i].s.util);
}

/* A sample from the NVML thread, judged on the loop: lost GPUs, slowdowns,
 * the idle alert. */
static void evaluate(const gl_gpu_sample *fresh, double cost_ms) {
    uint64_t now = gb_now_ms();
    for (int i = 0; i < M.held; i++) {
        gpu_state *st = &M.st[i];
        char name[256], w[128], why[128];
        if (!M.g[i].found)
            continue;
        int was_lost = st->s.lost;
        st->s = fresh[i];
        st->sampled = 1;
        gl_nvml_name(&M.g[i], name, sizeof name);
        who(i, w, sizeof w);
        if (st->s.lost && !was_lost)
            fprintf(stderr, "gpulaunch: %s of %s is lost (NVML: GPU is lost): drain the node\n",
                    name, w);
        GB_INFO("%s of %s: utilisation %d %%, memory %.2f of %.2f GiB, %d C, %.0f W, slowdown %s",
                name, w, st->s.util, st->s.mem_used / 1073741824.0, st->s.mem_total / 1073741824.0,
                st->s.temp, st->s.power_w, gl_nvml_reasons(st->s.reasons, why, sizeof why));
        int64_t slow = st->s.reasons > 0 ? (st->s.reasons & (int64_t)GL_SLOW_FAULTS) : 0;
        if (slow && slow != st->slowed)
            fprintf(stderr,
                    "gpulaunch: %s of %s: clocks slowed (%s): it holds every rank back; check "
                    "cooling and power\n",
                    name, w, gl_nvml_reasons(slow, why, sizeof why));
        st->slowed = slow;
        const worker *wk = holder(i);
        if (wk == NULL || !wk->running) /* between rounds: nobody to blame */
            st->below_since_ms = 0;
        if (M.cfg->gpu_idle_s <= 0 || st->s.util < 0 || wk == NULL || !wk->running)
            continue;
        if (st->s.util < M.cfg->gpu_idle_pct) {
            if (st->below_since_ms == 0)
                st->below_since_ms = now;
            if (!st->idle && now - st->below_since_ms >= (uint64_t)(M.cfg->gpu_idle_s * 1000)) {
                st->idle = 1;
                st->idle_alerts++;
                fprintf(stderr,
                        "gpulaunch: idle GPU: %s of %s under %d %% utilisation for %.0f s (now "
                        "%d %%, --gpu-idle-alert %s): the job may wait on input, a straggler "
                        "or a hang\n",
                        name, w, M.cfg->gpu_idle_pct, (double)(now - st->below_since_ms) / 1000.0,
                        st->s.util, M.cfg->val[GL_GPU_IDLE_ALERT]);
                idle_event(i, 1);
            }
        } else {
            if (st->idle) {
                fprintf(stderr, "gpulaunch: %s of %s is busy again (%d %%)\n", name, w, st->s.util);
                idle_event(i, 0);
            }
            st->idle = 0;
            st->below_since_ms = 0;
        }
    }
    /* what a sample costs (NVML's calls; on the NVML thread, not the loop) */
    GB_INFO("GPU sample of %d device(s) in %.3f ms", M.held, cost_ms);
}

void gl_gpumon_round(void) {
    if (!M.started || M.n == 0 || M.cfg->gpu_interval_s <= 0)
        return;
    atomic_store(&M.every_ms, (uint_fast64_t)(M.cfg->gpu_interval_s * 1000));
}

/* ---- the NVML thread ---- */

static void sleep_ms(unsigned ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Every NVML call of the running job is made here, never on the loop: a
 * driver that hangs (as nvidia-smi does on a sick GPU) stalls this thread,
 * not the launcher's heartbeats, signals and workers. It waits for XID events
 * (or sleeps without the event API) until the next sample is due. */
static void *nvml_thread(void *arg) {
    (void)arg;
    uint64_t next = 0;
    while (!atomic_load(&M.stop)) {
        uint64_t every = atomic_load(&M.every_ms), now = gb_now_ms();
        if (every > 0 && now >= next) {
            gl_gpu_sample s[GL_NVML_MAX_GPUS] = {{0}};
            uint64_t t0 = gb_now_ns();
            for (int i = 0; i < M.held; i++)
                gl_nvml_sample(&M.g[i], &s[i]);
            double cost = (double)(gb_now_ns() - t0) / 1e6;
            pthread_mutex_lock(&M.mu);
            memcpy(M.fresh, s, (size_t)M.held * sizeof s[0]);
            M.have_fresh = 1;
            M.fresh_ms = cost;
            pthread_mutex_unlock(&M.mu);
            uv_async_send(&M.async);
            next = (next && now - next < every ? next : now) + every;
            now = gb_now_ms();
        }
        unsigned wait = GL_XID_WAIT_MS;
        if (every > 0 && next > now && next - now < wait)
            wait = (unsigned)(next - now);
        if (every > 0 && next <= now)
            wait = 0;
        if (M.events == NULL) {
            sleep_ms(wait ? wait : 1);
            continue;
        }
        int which;
        uint64_t xid;
        unsigned gi;
        int r = gl_nvml_events_wait(M.events, M.g, M.held, wait, &which, &xid, &gi);
        if (r < 0) {
            sleep_ms(wait ? wait : 1); /* a lost GPU fails every wait */
            continue;
        }
        if (r == 0)
            continue;
        pthread_mutex_lock(&M.mu);
        if (M.qn < GL_GPUMON_XID_MAX)
            M.queue[M.qn++] = (xid_rec){
                .gpu = which, .xid = xid, .gi = gi, .when = gb_wall_s(), .seen_ns = gb_now_ns()};
        pthread_mutex_unlock(&M.mu);
        uv_async_send(&M.async);
    }
    return NULL;
}

static void on_async(uv_async_t *a) {
    (void)a;
    xid_rec q[GL_GPUMON_XID_MAX];
    gl_gpu_sample fresh[GL_NVML_MAX_GPUS];
    pthread_mutex_lock(&M.mu);
    int n = M.qn, have = M.have_fresh;
    double cost = M.fresh_ms;
    memcpy(q, M.queue, (size_t)n * sizeof q[0]);
    if (have)
        memcpy(fresh, M.fresh, (size_t)M.held * sizeof fresh[0]);
    M.qn = 0;
    M.have_fresh = 0;
    pthread_mutex_unlock(&M.mu);
    if (have)
        evaluate(fresh, cost);
    for (int k = 0; k < n; k++) {
        xid_rec *x = &q[k];
        char name[256], w[128];
        const worker *wk = holder(x->gpu);
        x->rank = wk && wk->pid > 0 ? wk->rank : -1;
        x->local_rank = wk ? wk->local_rank : -1;
        x->pid = wk ? (int)wk->pid : 0;
        if (x->gpu >= 0) {
            gl_nvml_name(&M.g[x->gpu], name, sizeof name);
            M.st[x->gpu].xids++;
            M.st[x->gpu].last_xid = x->xid;
        } else {
            snprintf(name, sizeof name, "a GPU of this node");
        }
        who(x->gpu, w, sizeof w);
        const char *hint = gl_nvml_xid_hint(x->xid);
        uint64_t nth = x->gpu >= 0 ? M.st[x->gpu].xids : 1;
        if (nth <= GL_XID_LINES_MAX) /* a storm of XID 13 must not drown the log */
            fprintf(stderr,
                    "gpulaunch: XID %llu on %s, held by %s%s%s (named %.1f ms after NVML "
                    "reported it)\n",
                    (unsigned long long)x->xid, name, w, hint[0] ? ": " : "", hint,
                    (double)(gb_now_ns() - x->seen_ns) / 1e6);
        if (nth <= GL_XID_LINES_MAX)
            gpu_event("XID %llu on %s, held by %s%s%s", (unsigned long long)x->xid, name, w,
                      hint[0] ? ": " : "", hint);
        if (nth == GL_XID_LINES_MAX)
            fprintf(stderr,
                    "gpulaunch: further XIDs on %s are counted "
                    "(gpulaunch_gpu_xid_errors_total), not printed\n",
                    name);
        int k2 = 0;
        while (k2 < M.nseen && (M.seen[k2].gpu != x->gpu || M.seen[k2].xid != x->xid))
            k2++;
        if (k2 < M.nseen) {
            M.seen[k2].count++;
        } else if (M.nseen < GL_GPUMON_XID_MAX) {
            x->count = 1;
            M.seen[M.nseen++] = *x;
        }
    }
}

/* ---- dcgm-exporter's job-mapping files ---- */

/* One file per GPU the workers hold, named by its index (index.GI for a MIG
 * instance), holding the job id: dcgm-exporter --hpc-job-mapping-dir then
 * labels that GPU's metrics with the job. Written whole (rename). */
static void dcgm_write(const char *dir) {
    mkdir(dir, 0755);
    for (int i = 0; i < M.held; i++) {
        gl_gpu *g = &M.g[i];
        if (!g->found || g->index < 0)
            continue;
        char path[PATH_MAX], tmp[PATH_MAX + 32];
        if (g->mig)
            snprintf(path, sizeof path, "%s/%d.%u", dir, g->index, g->gi);
        else
            snprintf(path, sizeof path, "%s/%d", dir, g->index);
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
        FILE *f = fopen(tmp, "w");
        if (f == NULL) {
            fprintf(stderr,
                    "gpulaunch: --dcgm-job-mapping-dir: cannot write %s: %s; DCGM's "
                    "metrics will not carry the job\n",
                    tmp, strerror(errno));
            continue;
        }
        int ok = fprintf(f, "%s\n", M.job) > 0;
        ok = fclose(f) == 0 && ok;
        if (!ok || rename(tmp, path) != 0) {
            fprintf(stderr, "gpulaunch: --dcgm-job-mapping-dir: cannot write %s: %s\n", path,
                    strerror(errno));
            unlink(tmp);
            continue;
        }
        snprintf(M.st[i].dcgm, sizeof M.st[i].dcgm, "%s", path);
    }
}

void gl_gpumon_stop(void) {
    atomic_store(&M.stop, 1);
    for (int i = 0; M.st && i < M.n; i++) {
        if (!M.st[i].dcgm[0])
            continue;
        /* another job may have taken the GPU since: remove only our own */
        char buf[300] = "";
        FILE *f = fopen(M.st[i].dcgm, "r");
        if (f) {
            if (fgets(buf, sizeof buf, f) == NULL)
                buf[0] = '\0';
            fclose(f);
        }
        buf[strcspn(buf, "\n")] = '\0';
        if (strcmp(buf, M.job) == 0)
            unlink(M.st[i].dcgm);
        M.st[i].dcgm[0] = '\0';
    }
}

static void at_exit(void) { gl_gpumon_stop(); }

/* ---- the Prometheus exposition (served by gl_metrics.c) ---- */

/* A label value with \, " and newlines escaped. */
static const char *esc(const char *s, char *buf, size_t len) {
    size_t o = 0;
    for (; *s && o + 3 < len; s++) {
        if (*s == '\\' || *s == '"') {
            buf[o++] = '\\';
            buf[o++] = *s;
        } else if (*s == '\n') {
            buf[o++] = '\\';
            buf[o++] = 'n';
        } else {
            buf[o++] = *s;
        }
    }
    buf[o] = '\0';
    return buf;
}

static void labels(int i, char *buf, size_t len) {
    char job[600], uuid[200];
    const worker *w = holder(i);
    const gl_gpu *g = &M.g[i];
    char gpu[48];
    if (g->mig)
        snprintf(gpu, sizeof gpu, "%d.%u", g->index, g->gi);
    else if (g->index >= 0)
        snprintf(gpu, sizeof gpu, "%d", g->index);
    else
        snprintf(gpu, sizeof gpu, "%s", g->bound);
    snprintf(buf, len,
             "job=\"%s\",gpu=\"%s\",uuid=\"%s\",pci_bus_id=\"%s\",rank=\"%d\",local_rank=\"%d\"",
             esc(M.job, job, sizeof job), gpu, esc(g->uuid, uuid, sizeof uuid), g->busid,
             w && w->pid > 0 ? w->rank : -1, i);
}

static void render(gl_pbuf *b) {
    static const struct {
        const char *name, *type, *help;
    } m[] = {
        {"gpulaunch_gpu_utilization_percent", "gauge", "percent of time a kernel ran (NVML)"},
        {"gpulaunch_gpu_memory_used_bytes", "gauge", "GPU memory in use"},
        {"gpulaunch_gpu_memory_total_bytes", "gauge", "GPU memory"},
        {"gpulaunch_gpu_temperature_celsius", "gauge", "GPU temperature"},
        {"gpulaunch_gpu_power_watts", "gauge", "GPU power draw"},
        {"gpulaunch_gpu_clock_slowdown_reasons", "gauge",
         "NVML clocks event reasons bitmask (0x8 hw, 0x20 sw thermal, 0x40 hw thermal, 0x80 "
         "power brake)"},
        {"gpulaunch_gpu_idle", "gauge", "1 while the --gpu-idle-alert is on for this GPU"},
        {"gpulaunch_gpu_idle_alerts_total", "counter", "idle alerts raised"},
        {"gpulaunch_gpu_xid_errors_total", "counter", "XID errors seen"},
        {"gpulaunch_gpu_last_xid", "gauge", "the last XID seen (0: none)"},
    };
    for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) {
        gl_pb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", m[k].name, m[k].help, m[k].name, m[k].type);
        for (int i = 0; i < M.held; i++) {
            const gpu_state *st = &M.st[i];
            if (!M.g[i].found)
                continue;
            double v;
            switch (k) {
            case 0:
                v = st->s.util;
                break;
            case 1:
                v = (double)st->s.mem_used;
                break;
            case 2:
                v = (double)st->s.mem_total;
                break;
            case 3:
                v = st->s.temp;
                break;
            case 4:
                v = st->s.power_w;
                break;
            case 5:
                v = (double)st->s.reasons;
                break;
            case 6:
                v = st->idle;
                break;
            case 7:
                v = (double)st->idle_alerts;
                break;
            case 8:
                v = (double)st->xids;
                break;
            default:
                v = (double)st->last_xid;
                break;
            }
            if (k <= 5 && (!st->sampled || v < 0))
                continue; /* not known: no sample rather than a made-up value */
            char lb[1200];
            labels(i, lb, sizeof lb);
            gl_pb_printf(b, "%s{%s} %.17g\n", m[k].name, lb, v);
        }
    }
}

/* The exposition text for gl_metrics.c. */
static size_t render_text(char *p, size_t cap) {
    gl_pbuf b = {.p = p, .cap = cap};
    p[0] = '\0';
    render(&b);
    if (b.len < cap) { /* the workers' checkpoints (gl_ckptview.c) after the GPUs' figures */
        char job[600];
        b.len += gl_ckptview_metrics(p + b.len, cap - b.len, esc(M.job, job, sizeof job));
        if (b.len < cap) /* how each round began and what it cost (gl_story.c) */
            b.len += gl_story_metrics(p + b.len, cap - b.len, job);
    }
    if (b.len < cap) /* then the launcher's own: process, threads, heap, children, handles */
        b.len +=
            gl_metrics_process(p + b.len, cap - b.len, M.loop, M.group ? M.group->nrunning : 0);
    return b.len;
}

/* ---- start ---- */

int gl_gpumon_start(uv_loop_t *loop, const gl_config *cfg, const char *job, const gl_group *group,
                    gl_gpumon_event_cb on_event, void *data, char *err, size_t errlen) {
    M.loop = loop;
    M.cfg = cfg;
    M.group = group;
    M.on_event = on_event;
    M.data = data;
    snprintf(M.job, sizeof M.job, "%s", job);
    M.started = 1;
    const char *ms = M.cfg->val[GL_METRICS];
    if (ms[0] && gl_metrics_listen(loop, ms, render_text, err, errlen) != 0)
        return 2;
    if (M.cfg->gpu_health == GL_GPU_HEALTH_OFF || gpl_visible_gpu_count() == 0)
        return 0;
    M.g = calloc(GL_NVML_MAX_GPUS, sizeof *M.g);
    M.st = calloc(GL_NVML_MAX_GPUS, sizeof *M.st);
    if (M.g == NULL || M.st == NULL)
        return 0;
    int n = gl_nvml_bound(M.g, GL_NVML_MAX_GPUS);
    if (n <= 0)
        return 0; /* no NVML: nothing more runs */
    M.n = n;
    M.held = n < M.cfg->nproc ? n : M.cfg->nproc;
    atexit(at_exit);
    if (M.cfg->val[GL_DCGM_JOB_MAPPING_DIR][0])
        dcgm_write(M.cfg->val[GL_DCGM_JOB_MAPPING_DIR]);
    M.events = gl_nvml_events_create(M.g, M.held);
    if (M.events == NULL && M.cfg->gpu_interval_s <= 0)
        return 0; /* nothing to wait for, nothing to sample: no thread */
    uv_async_init(loop, &M.async, on_async);
    uv_unref((uv_handle_t *)&M.async);
    int r = pthread_create(&M.thread, NULL, nvml_thread, NULL);
    if (r != 0) {
        GB_WARN("cannot start the GPU monitor's thread: %s; GPUs are not watched", strerror(r));
        return 0;
    }
    pthread_setname_np(M.thread, "gpulaunch-gpu"); /* top -H, and the tests */
    pthread_detach(M.thread);
    return 0;
}

void gl_gpumon_report(FILE *out) {
    if (M.nseen == 0)
        return;
    fprintf(out, "  GPU errors :\n");
    for (int k = 0; k < M.nseen; k++) {
        const xid_rec *x = &M.seen[k];
        char name[256], when[32];
        time_t t = (time_t)x->when;
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(when, sizeof when, "%H:%M:%SZ", &tm);
        if (x->gpu >= 0)
            gl_nvml_name(&M.g[x->gpu], name, sizeof name);
        else
            snprintf(name, sizeof name, "a GPU of this node");
        char times[32] = "";
        if (x->count > 1)
            snprintf(times, sizeof times, " (%llu times from then)", (unsigned long long)x->count);
        if (x->rank >= 0)
            fprintf(out, "    %s XID %llu on %s, rank %d (local rank %d, pid %d)%s\n", when,
                    (unsigned long long)x->xid, name, x->rank, x->local_rank, x->pid, times);
        else
            fprintf(out, "    %s XID %llu on %s, no worker on it%s\n", when,
                    (unsigned long long)x->xid, name, times);
    }
}

void gl_gpumon_json(FILE *out) {
    fprintf(out, "[");
    for (int k = 0; k < M.nseen; k++) {
        const xid_rec *x = &M.seen[k];
        char uuid[200] = "";
        if (x->gpu >= 0)
            esc(M.g[x->gpu].uuid, uuid, sizeof uuid);
        fprintf(out,
                "%s{\"xid\":%llu,\"gpu\":%d,\"uuid\":\"%s\",\"rank\":%d,\"local_rank\":%d,"
                "\"count\":%llu}",
                k ? "," : "", (unsigned long long)x->xid, x->gpu >= 0 ? M.g[x->gpu].index : -1,
                uuid, x->rank, x->local_rank, (unsigned long long)x->count);
    }
    fprintf(out, "]");
}
