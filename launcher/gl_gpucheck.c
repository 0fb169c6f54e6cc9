/* The GPU preflight (--check, and before workers start; --gpu-health): each
 * bound GPU's health from NVML (retired pages, row remapping, uncorrectable
 * ECC, lost GPUs, NVLink links down, clock slowdowns, a MIG layout that
 * contradicts the binding), each fault named with what to do, in a thread
 * with a deadline so that a hung driver fails the check instead of the node.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gl_nvml_abi.h"

typedef struct check_ctx {
    FILE *out;
    int refuse, verbose, fails;
    int faults; /* found, in either mode */
} check_ctx;

static void fault(check_ctx *c, const gl_gpu *g, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fault(check_ctx *c, const gl_gpu *g, const char *fmt, ...) {
    char name[256], what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fprintf(c->out, "%s %s: %s\n", c->refuse ? "FAIL" : "warn", gl_nvml_name(g, name, sizeof name),
            what);
    c->faults++;
    if (c->refuse)
        c->fails++;
}

static const char lost_fix[] =
    "NVML cannot reach it (GPU is lost, XID 79 in dmesg): it fell off the bus; drain the "
    "node, reset the GPU (nvidia-smi -r) or reboot, and have it inspected if it recurs";

/* One physical GPU's checks (also for a MIG instance: they are the GPU's). */
static void check_gpu(check_ctx *c, gl_gpu *g) {
    nvmlDevice_t d = (nvmlDevice_t)g->phys;
    int state = 0;
    nvmlReturn_t r;
    int faults = c->faults;
    if (gl_nv.retired_pending) {
        r = gl_nv.retired_pending(d, &state);
        if (gl_nvml_lost(r, g))
            goto gone;
        if (r == NVML_SUCCESS && state)
            fault(c, g,
                  "retired memory pages are pending: they take effect at the next reset; reset "
                  "the GPU (nvidia-smi -r -i %d with nothing running on it) or reboot before "
                  "using it",
                  g->index);
    }
    if (gl_nv.remapped) {
        unsigned corr = 0, unc = 0, pending = 0, failed = 0;
        r = gl_nv.remapped(d, &corr, &unc, &pending, &failed);
        if (gl_nvml_lost(r, g))
            goto gone;
        if (r == NVML_SUCCESS && failed)
            fault(c, g,
                  "a memory row remapping failed (%u uncorrectable rows): the GPU cannot hide "
                  "its bad memory; drain the node and have the GPU replaced (RMA, dcgmi diag -r 3 "
                  "first)",
                  unc);
        else if (r == NVML_SUCCESS && pending)
            fault(c, g,
                  "a memory row remapping is pending: reset the GPU (nvidia-smi -r -i %d) or "
                  "reboot before using it",
                  g->index);
    }
    if (gl_nv.ecc) {
        unsigned long long n = 0;
        r = gl_nv.ecc(d, NVML_MEMORY_ERROR_UNCORRECTED, NVML_VOLATILE_ECC, &n);
        if (gl_nvml_lost(r, g))
            goto gone;
        if (r == NVML_SUCCESS && n)
            fault(c, g,
                  "%llu uncorrectable ECC error(s) since the driver loaded: a kernel on it may "
                  "have read corrupt memory; reset the GPU, and drain the node if they come back",
                  n);
    }
    if (gl_nv.nvlink) {
        int have = 0, up = 0;
        char down[128] = "";
        size_t off = 0;
        for (unsigned l = 0; l < GL_NVML_MAX_LINKS; l++) {
            int on = 0;
            r = gl_nv.nvlink(d, l, &on);
            if (gl_nvml_lost(r, g))
                goto gone;
            if (r != NVML_SUCCESS)
                continue;
            have++;
            if (on) {
                up++;
            } else {
                int w = snprintf(down + off, sizeof down - off, "%s%u", off ? "," : "", l);
                if (w > 0 && (size_t)w < sizeof down - off)
                    off += (size_t)w;
            }
        }
        /* every link down: a card without NVLink bridges reads the same as a
         * board whose fabric is down, so that is a warning, not a refusal */
        if (up > 0 && up < have)
            fault(c, g,
                  "NVLink link(s) %s down (%d of %d up): NCCL falls back to slower paths or "
                  "hangs; check nvidia-smi nvlink -s, drain the node and reset the GPU",
                  down, up, have);
        else if (have > 0 && up == 0)
            fprintf(c->out,
                    "warn GPU %d: no NVLink link is up (of %d): fine for a card without NVLink; "
                    "on an NVLink board check nvidia-fabricmanager and nvidia-smi nvlink -s\n",
                    g->index, have);
        else if (c->verbose && have)
            fprintf(c->out, "ok   GPU %d: %d NVLink link(s) up\n", g->index, up);
    }
    if (gl_nv.reasons) {
        unsigned long long m = 0;
        r = gl_nv.reasons(d, &m);
        if (gl_nvml_lost(r, g))
            goto gone;
        char why[128];
        if (r == NVML_SUCCESS && (m & GL_SLOW_FAULTS))
            fault(c, g,
                  "clocks are slowed (%s) before any work: this GPU will hold every rank back; "
                  "check cooling and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE)",
                  gl_nvml_reasons((int64_t)(m & GL_SLOW_FAULTS), why, sizeof why));
    }
    if (c->verbose && c->faults == faults) {
        char name[256];
        fprintf(c->out, "ok   %s\n", gl_nvml_name(g, name, sizeof name));
    }
    return;
gone:
    fault(c, g, "%s", lost_fix);
}

/* A binding that contradicts the MIG layout. */
static void check_mig(check_ctx *c, gl_gpu *g) {
    if (gl_nv.mig_mode == NULL)
        return;
    unsigned cur = 0, pend = 0;
    if (gl_nv.mig_mode((nvmlDevice_t)g->phys, &cur, &pend) != NVML_SUCCESS)
        return;
    if (!g->mig && cur && g->listed)
        fprintf(c->out,
                "warn GPU %d: MIG mode is on and nothing binds its instances: CUDA may see one "
                "of them at most; set CUDA_VISIBLE_DEVICES to their UUIDs (nvidia-smi -L)\n",
                g->index);
    else if (!g->mig && cur)
        fault(c, g,
              "MIG mode is on but the binding names the whole GPU, so CUDA gets no or one slice "
              "of it; bind its MIG instances (nvidia-smi -L lists their UUIDs) or turn MIG off "
              "(nvidia-smi -mig 0 -i %d)",
              g->index);
    else if (cur != pend)
        fault(c, g,
              "a MIG mode change (to %s) is pending: it takes effect at the next GPU reset; "
              "reset the GPU (nvidia-smi -r -i %d) first",
              pend ? "on" : "off", g->index);
}

static int preflight_here(int mode, FILE *out, int verbose) {
    check_ctx c = {.out = out, .refuse = mode == GL_GPU_HEALTH_REFUSE, .verbose = verbose};
    gl_gpu *g = calloc(GL_NVML_MAX_GPUS, sizeof *g);
    if (g == NULL)
        return 0;
    int n = gl_nvml_bound(g, GL_NVML_MAX_GPUS);
    if (n < 0) {
        if (verbose)
            fprintf(out, "ok   NVML not loaded: GPU health checks skipped\n");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        if (!g[i].found) {
            if (g[i].lost)
                fault(&c, &g[i], "%s", lost_fix);
            else
                fault(&c, &g[i], "%s; check CUDA_VISIBLE_DEVICES against nvidia-smi -L", g[i].why);
            continue;
        }
        if (g[i].lost) {
            fault(&c, &g[i], "%s", lost_fix);
            continue;
        }
        /* MIG instances of one GPU share its health: check it once */
        int seen = 0;
        for (int k = 0; k < i; k++)
            seen |= g[k].found && g[k].phys == g[i].phys;
        check_mig(&c, &g[i]);
        if (!seen)
            check_gpu(&c, &g[i]);
    }
    if (verbose && n == 0)
        fprintf(out, "ok   NVML lists no GPU bound to this node\n");
out:
    free(g);
    return c.fails;
}

/* The checks run in a thread of their own, with a deadline: a driver that
 * hangs on a sick GPU (nvidia-smi then hangs too) must not hold the node's
 * start forever. Their lines are kept and printed whole when they finish. */
typedef struct timed {
    int mode, verbose, fails, done;
    char *buf;
    size_t len;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} timed;

static void *preflight_thread(void *arg) {
    timed *t = arg;
    FILE *f = open_memstream(&t->buf, &t->len);
    int fails = f ? preflight_here(t->mode, f, t->verbose) : 0;
    if (f)
        fclose(f);
    pthread_mutex_lock(&t->mu);
    t->fails = fails;
    t->done = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int gl_nvml_preflight(int mode, FILE *out, int verbose) {
    if (mode == GL_GPU_HEALTH_OFF)
        return 0;
    double limit = GL_NVML_PREFLIGHT_TIMEOUT_S;
    const char *e = getenv("GPULAUNCH_NVML_TIMEOUT_S"); /* tests */
    if (e && *e && strtod(e, NULL) > 0)
        limit = strtod(e, NULL);
    /* the thread may outlive this call when NVML hangs: its state stays */
    timed *t = calloc(1, sizeof *t);
    if (t == NULL)
        return 0;
    t->mode = mode;
    t->verbose = verbose;
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_t th;
    if (pthread_create(&th, NULL, preflight_thread, t) != 0) {
        free(t);
        return preflight_here(mode, out, verbose);
    }
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += (time_t)limit;
    dl.tv_nsec += (long)((limit - (double)(time_t)limit) * 1e9);
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&t->mu);
    while (!t->done && pthread_cond_timedwait(&t->cv, &t->mu, &dl) == 0)
        ;
    int done = t->done;
    pthread_mutex_unlock(&t->mu);
    if (!done) {
        gl_nvml_set_stuck();
        pthread_detach(th);
        fprintf(out,
                "%s NVML did not answer within %g s: the driver hangs, usually on a GPU in a bad "
                "state (nvidia-smi would hang too); check dmesg for XID errors, drain the node "
                "and reset or reboot it\n",
                mode == GL_GPU_HEALTH_REFUSE ? "FAIL" : "warn", limit);
        return mode == GL_GPU_HEALTH_REFUSE;
    }
    pthread_join(th, NULL);
    if (t->buf)
        fwrite(t->buf, 1, t->len, out);
    int fails = t->fails;
    free(t->buf);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
    return fails;
}
