/* NVML through dlopen (see gl_nvml.h). The few types and prototypes used are
 * declared here, matching NVML's ABI (nvml.h of CUDA 12): the symbol names are
 * the versioned ones nvml.h maps its calls to (nvmlInit_v2,
 * nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetPciInfo_v3, ...). */
#include "gl_nvml.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- NVML's ABI ---- */

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
};

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    char busIdLegacy[16]; /* NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE */
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32]; /* NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE */
} nvmlPciInfo_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

#define NVML_EVENT_XID 0x8ull           /* nvmlEventTypeXidCriticalError */
#define NVML_TEMPERATURE_GPU 0          /* nvmlTemperatureSensors_t */
#define NVML_MEMORY_ERROR_UNCORRECTED 1 /* nvmlMemoryErrorType_t */
#define NVML_VOLATILE_ECC 0             /* nvmlEccCounterType_t */

/* ---- the functions, each looked up on its own ---- */

static struct {
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*count)(unsigned int *);
    nvmlReturn_t (*by_index)(unsigned int, nvmlDevice_t *);
    nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned int);
    nvmlReturn_t (*pci)(nvmlDevice_t, nvmlPciInfo_t *);
    const char *(*errstr)(nvmlReturn_t);
    nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *);
    nvmlReturn_t (*index)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*retired_pending)(nvmlDevice_t, int *);
    nvmlReturn_t (*remapped)(nvmlDevice_t, unsigned int *, unsigned int *, unsigned int *,
                             unsigned int *);
    nvmlReturn_t (*ecc)(nvmlDevice_t, int, int, unsigned long long *);
    nvmlReturn_t (*nvlink)(nvmlDevice_t, unsigned int, int *);
    nvmlReturn_t (*reasons)(nvmlDevice_t, unsigned long long *);
    nvmlReturn_t (*reasons_old)(nvmlDevice_t, unsigned long long *);
    nvmlReturn_t (*mig_mode)(nvmlDevice_t, unsigned int *, unsigned int *);
    nvmlReturn_t (*mig_max)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*mig_by_index)(nvmlDevice_t, unsigned int, nvmlDevice_t *);
    nvmlReturn_t (*mig_parent)(nvmlDevice_t, nvmlDevice_t *);
    nvmlReturn_t (*gi_id)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*ci_id)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*util)(nvmlDevice_t, nvmlUtilization_t *);
    nvmlReturn_t (*mem)(nvmlDevice_t, nvmlMemory_t *);
    nvmlReturn_t (*temp)(nvmlDevice_t, int, unsigned int *);
    nvmlReturn_t (*power)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*ev_create)(nvmlEventSet_t *);
    nvmlReturn_t (*ev_register)(nvmlDevice_t, unsigned long long, nvmlEventSet_t);
    nvmlReturn_t (*ev_wait)(nvmlEventSet_t, nvmlEventData_t *, unsigned int);
} N;

#define FN(field, sym, what)                                                                       \
    { sym, offsetof(__typeof__(N), field), what }
static const struct {
    const char *sym;
    size_t off;
    const char *what; /* what its absence turns off, said once; NULL: required */
} fns[] = {
    FN(init, "nvmlInit_v2", NULL),
    FN(count, "nvmlDeviceGetCount_v2", NULL),
    FN(by_index, "nvmlDeviceGetHandleByIndex_v2", NULL),
    FN(uuid, "nvmlDeviceGetUUID", NULL),
    FN(pci, "nvmlDeviceGetPciInfo_v3", NULL),
    FN(errstr, "nvmlErrorString", NULL),
    FN(by_uuid, "nvmlDeviceGetHandleByUUID",
       "devices bound by UUID are found by listing every GPU"),
    FN(index, "nvmlDeviceGetIndex", "MIG instances are named without their GPU's index"),
    FN(retired_pending, "nvmlDeviceGetRetiredPagesPendingStatus", "the retired-pages check is off"),
    FN(remapped, "nvmlDeviceGetRemappedRows", "the row-remapping check is off"),
    FN(ecc, "nvmlDeviceGetTotalEccErrors", "the uncorrectable-ECC check is off"),
    FN(nvlink, "nvmlDeviceGetNvLinkState", "the NVLink check is off"),
    FN(reasons, "nvmlDeviceGetCurrentClocksEventReasons", NULL), /* or the old name */
    FN(reasons_old, "nvmlDeviceGetCurrentClocksThrottleReasons", NULL),
    FN(mig_mode, "nvmlDeviceGetMigMode", "the MIG layout check is off"),
    FN(mig_max, "nvmlDeviceGetMaxMigDeviceCount",
       "MIG-GPU-<uuid>/<gi>/<ci> names and UUID prefixes of MIG instances are not found"),
    FN(mig_by_index, "nvmlDeviceGetMigDeviceHandleByIndex",
       "MIG-GPU-<uuid>/<gi>/<ci> names and UUID prefixes of MIG instances are not found"),
    FN(mig_parent, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
       "MIG instances are taken for whole GPUs"),
    FN(gi_id, "nvmlDeviceGetGpuInstanceId", "MIG instances are named without their instance ids"),
    FN(ci_id, "nvmlDeviceGetComputeInstanceId",
       "MIG instances are named without their instance ids"),
    FN(util, "nvmlDeviceGetUtilizationRates", "utilisation and the idle alert are off"),
    FN(mem, "nvmlDeviceGetMemoryInfo", "memory use is not sampled"),
    FN(temp, "nvmlDeviceGetTemperature", "temperature is not sampled"),
    FN(power, "nvmlDeviceGetPowerUsage", "power is not sampled"),
    FN(ev_create, "nvmlEventSetCreate", "XID events are not watched"),
    FN(ev_register, "nvmlDeviceRegisterEvents", "XID events are not watched"),
    FN(ev_wait, "nvmlEventSetWait_v2", "XID events are not watched"),
};
#undef FN

/* The descriptors NVML opens (/dev/nvidiactl, /dev/nvidia<N>, event fds) are
 * not the workers' business: each worker's CUDA opens its own. Those that
 * appeared since `before` are made close-on-exec. */
#define FD_SEEN_MAX 4096
typedef struct fdset {
    unsigned char open[FD_SEEN_MAX / 8];
} fdset;

static void fds_now(fdset *s) {
    memset(s, 0, sizeof *s);
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        long fd = strtol(e->d_name, NULL, 10);
        /* not the listing's own descriptor: NVML may get its number next */
        if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && fd < FD_SEEN_MAX && fd != dirfd(d))
            s->open[fd / 8] |= (unsigned char)(1u << (fd % 8));
    }
    if (d)
        closedir(d);
}

static void cloexec_since(const fdset *before) {
    fdset now;
    fds_now(&now);
    for (int fd = 3; fd < FD_SEEN_MAX; fd++)
        if ((now.open[fd / 8] & ~before->open[fd / 8]) & (1u << (fd % 8))) {
            int fl = fcntl(fd, F_GETFD);
            if (fl >= 0 && !(fl & FD_CLOEXEC))
                fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
        }
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int loaded = -1; /* 0 ready, -1 not */

static void load(void) {
    const char *path = getenv("GPULAUNCH_NVML_LIBRARY");
    int custom = path && *path;
    void *h = dlopen(custom ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        if (custom) /* a driver-less node is normal; a wrong override is not */
            fprintf(stderr,
                    "gpulaunch: GPULAUNCH_NVML_LIBRARY=%s cannot be loaded (%s): GPU "
                    "health checks are off\n",
                    path, dlerror());
        return;
    }
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        void *p = dlsym(h, fns[i].sym);
        memcpy((char *)&N + fns[i].off, &p, sizeof p);
    }
    if (N.reasons == NULL)
        N.reasons = N.reasons_old;
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        void *p;
        memcpy(&p, (char *)&N + fns[i].off, sizeof p);
        if (p == NULL && fns[i].what == NULL && fns[i].off != offsetof(__typeof__(N), reasons) &&
            fns[i].off != offsetof(__typeof__(N), reasons_old)) {
            fprintf(stderr,
                    "gpulaunch: NVML (%s) lacks %s: GPU health checks are off; update "
                    "the NVIDIA driver\n",
                    custom ? path : "libnvidia-ml.so.1", fns[i].sym);
            dlclose(h);
            return;
        }
    }
    /* said once per process: what an older driver turns off */
    const char *said[sizeof fns / sizeof fns[0]] = {NULL};
    size_t nsaid = 0;
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        void *p;
        memcpy(&p, (char *)&N + fns[i].off, sizeof p);
        if (p || fns[i].what == NULL)
            continue;
        int dup = 0;
        for (size_t k = 0; k < nsaid; k++)
            dup |= strcmp(said[k], fns[i].what) == 0;
        if (dup)
            continue;
        said[nsaid++] = fns[i].what;
        fprintf(stderr, "gpulaunch: NVML lacks %s (an older driver): %s\n", fns[i].sym,
                fns[i].what);
    }
    if (N.reasons == NULL)
        fprintf(stderr, "gpulaunch: NVML lacks nvmlDeviceGetCurrentClocksEventReasons (an older "
                        "driver): the clock slowdown check is off\n");
    fdset before;
    fds_now(&before);
    nvmlReturn_t r = N.init();
    cloexec_since(&before);
    if (r != NVML_SUCCESS) {
        fprintf(stderr,
                "gpulaunch: NVML did not start (%s): GPU health checks are off; "
                "nvidia-smi says why\n",
                N.errstr(r));
        dlclose(h);
        return;
    }
    loaded = 0;
}

static atomic_int stuck; /* a preflight call never returned: NVML is not used again */

int gl_nvml_open(void) {
    if (atomic_load(&stuck))
        return -1;
    pthread_once(&once, load);
    return loaded;
}

/* ---- the bound devices ---- */

/* Notes a lost GPU; 1 when r says it is. */
static int lost(nvmlReturn_t r, gl_gpu *g) {
    if (r == NVML_ERROR_GPU_IS_LOST)
        g->lost = 1;
    return r == NVML_ERROR_GPU_IS_LOST;
}

/* Fills uuid, bus id, index and MIG ids from g->dev. */
static void describe(gl_gpu *g) {
    g->found = 1;
    g->phys = g->dev;
    if (N.mig_parent) {
        nvmlDevice_t p;
        if (N.mig_parent((nvmlDevice_t)g->dev, &p) == NVML_SUCCESS && p != NULL) {
            g->mig = 1;
            g->phys = p;
        }
    }
    nvmlReturn_t r = N.uuid((nvmlDevice_t)g->dev, g->uuid, sizeof g->uuid);
    lost(r, g);
    if (r != NVML_SUCCESS)
        snprintf(g->uuid, sizeof g->uuid, "UUID unknown");
    nvmlPciInfo_t pci;
    memset(&pci, 0, sizeof pci);
    r = N.pci((nvmlDevice_t)g->phys, &pci);
    lost(r, g);
    if (r != NVML_SUCCESS)
        snprintf(g->busid, sizeof g->busid, "bus id unknown");
    else
        snprintf(g->busid, sizeof g->busid, "%s", pci.busId);
    unsigned v;
    if (N.index && N.index((nvmlDevice_t)g->phys, &v) == NVML_SUCCESS)
        g->index = (int)v;
    if (g->mig && N.gi_id && N.gi_id((nvmlDevice_t)g->dev, &v) == NVML_SUCCESS)
        g->gi = v;
    if (g->mig && N.ci_id && N.ci_id((nvmlDevice_t)g->dev, &v) == NVML_SUCCESS)
        g->ci = v;
}

/* A UUID or a prefix of one (CUDA accepts "GPU-8932f937"), of a GPU or of a
 * MIG instance; legacy MIG-GPU-<uuid>/<gi>/<ci> too. */
static void find_uuid(gl_gpu *g, const char *want) {
    nvmlDevice_t d;
    nvmlReturn_t r;
    if (strncmp(want, "MIG-GPU-", 8) == 0) {
        char gpu[96];
        unsigned gi, ci;
        const char *slash = strchr(want + 4, '/');
        if (slash == NULL || sscanf(slash, "/%u/%u", &gi, &ci) != 2 ||
            (size_t)(slash - want - 4) >= sizeof gpu) {
            snprintf(g->why, sizeof g->why, "not a MIG-GPU-<uuid>/<gi>/<ci> name");
            return;
        }
        snprintf(gpu, sizeof gpu, "%.*s", (int)(slash - want - 4), want + 4);
        gl_gpu parent = {.index = -1};
        find_uuid(&parent, gpu);
        unsigned max = 0;
        if (!parent.found || !N.mig_max || !N.mig_by_index || !N.gi_id || !N.ci_id ||
            N.mig_max((nvmlDevice_t)parent.dev, &max) != NVML_SUCCESS) {
            snprintf(g->why, sizeof g->why, "NVML does not find that MIG instance");
            g->lost = parent.lost;
            return;
        }
        for (unsigned k = 0; k < max; k++) {
            unsigned a, b;
            if (N.mig_by_index((nvmlDevice_t)parent.dev, k, &d) == NVML_SUCCESS &&
                N.gi_id(d, &a) == NVML_SUCCESS && N.ci_id(d, &b) == NVML_SUCCESS && a == gi &&
                b == ci) {
                g->dev = d;
                describe(g);
                return;
            }
        }
        snprintf(g->why, sizeof g->why,
                 "GPU %s has no MIG instance %u/%u now: the MIG layout changed", gpu, gi, ci);
        return;
    }
    /* nvmlDeviceGetHandleByUUID answers GPU_IS_LOST when any GPU of the node
     * is lost, not only this one: the listing below tells which */
    int any_lost = 0;
    if (N.by_uuid) {
        r = N.by_uuid(want, &d);
        if (r == NVML_SUCCESS) {
            g->dev = d;
            describe(g);
            return;
        }
        any_lost = r == NVML_ERROR_GPU_IS_LOST;
    }
    /* a prefix, or no lookup by UUID: list the GPUs and their MIG instances */
    unsigned n = 0;
    if (N.count(&n) != NVML_SUCCESS)
        n = 0;
    size_t wl = strlen(want);
    for (unsigned i = 0; i < n && !g->found; i++) {
        char u[96];
        if (N.by_index(i, &d) != NVML_SUCCESS)
            continue;
        if (N.uuid(d, u, sizeof u) == NVML_SUCCESS && strncmp(u, want, wl) == 0) {
            g->dev = d;
            describe(g);
            return;
        }
        unsigned max = 0;
        if (N.mig_max && N.mig_by_index && N.mig_max(d, &max) == NVML_SUCCESS)
            for (unsigned k = 0; k < max; k++) {
                nvmlDevice_t m;
                if (N.mig_by_index(d, k, &m) == NVML_SUCCESS &&
                    N.uuid(m, u, sizeof u) == NVML_SUCCESS && strncmp(u, want, wl) == 0) {
                    g->dev = m;
                    describe(g);
                    return;
                }
            }
    }
    g->lost = any_lost; /* not listed, and a GPU is lost: most likely this one */
    if (strncmp(want, "MIG-", 4) == 0)
        snprintf(g->why, sizeof g->why,
                 "NVML does not find this MIG instance: the MIG layout changed or it belongs "
                 "to another node");
    else
        snprintf(g->why, sizeof g->why, "NVML does not find this UUID on the node");
}

static void find_index(gl_gpu *g, unsigned i) {
    nvmlDevice_t d;
    g->index = (int)i;
    nvmlReturn_t r = N.by_index(i, &d);
    if (r != NVML_SUCCESS) {
        g->lost = r == NVML_ERROR_GPU_IS_LOST;
        snprintf(g->why, sizeof g->why, "NVML has no GPU %u (%s)", i, N.errstr(r));
        return;
    }
    g->dev = d;
    describe(g);
    g->index = (int)i;
}

int gl_nvml_bound(gl_gpu *out, int max) {
    if (gl_nvml_open() != 0)
        return -1;
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v == NULL) {
        /* inside a container NVIDIA_VISIBLE_DEVICES says what the runtime
         * mounted: NVML then lists those GPUs alone, from index 0 */
        const char *nv = getenv("NVIDIA_VISIBLE_DEVICES");
        if (nv && (strncmp(nv, "GPU-", 4) == 0 || strncmp(nv, "MIG-", 4) == 0))
            v = nv;
    }
    int n = 0;
    if (v == NULL) {
        unsigned c = 0;
        if (N.count(&c) != NVML_SUCCESS)
            c = 0;
        for (unsigned i = 0; i < c && n < max; i++) {
            gl_gpu *g = &out[n++];
            memset(g, 0, sizeof *g);
            snprintf(g->bound, sizeof g->bound, "%u", i);
            g->listed = 1;
            find_index(g, i);
        }
        return n;
    }
    for (const char *p = v; *p && n < max;) {
        size_t len = strcspn(p, ",");
        gl_gpu *g = &out[n];
        memset(g, 0, sizeof *g);
        g->index = -1;
        snprintf(g->bound, sizeof g->bound, "%.*s", (int)len, p);
        /* CUDA stops at the first entry it cannot parse; so do we */
        char *end;
        unsigned long idx = strtoul(g->bound, &end, 10);
        if (g->bound[0] >= '0' && g->bound[0] <= '9' && *end == '\0')
            find_index(g, (unsigned)idx);
        else if (strncmp(g->bound, "GPU-", 4) == 0 || strncmp(g->bound, "MIG-", 4) == 0)
            find_uuid(g, g->bound);
        else
            break;
        n++;
        p += len;
        if (*p == ',')
            p++;
    }
    return n;
}

const char *gl_nvml_name(const gl_gpu *g, char *buf, size_t len) {
    char idx[112]; /* g->bound (96) and " MIG <gi>/<ci>" */
    if (g->index < 0)
        snprintf(idx, sizeof idx, "%s", g->bound);
    else if (g->mig)
        snprintf(idx, sizeof idx, "%d MIG %u/%u", g->index, g->gi, g->ci);
    else
        snprintf(idx, sizeof idx, "%d", g->index);
    if (g->found)
        snprintf(buf, len, "GPU %s (%s, PCI %s)", idx, g->uuid, g->busid);
    else
        snprintf(buf, len, "GPU %s (CUDA_VISIBLE_DEVICES entry %s)", idx, g->bound);
    return buf;
}

const char *gl_nvml_reasons(int64_t mask, char *buf, size_t len) {
    static const struct {
        uint64_t bit;
        const char *name;
    } r[] = {{GL_SLOW_HW_THERMAL, "hw thermal"},
             {GL_SLOW_SW_THERMAL, "sw thermal"},
             {GL_SLOW_HW_POWER_BRAKE, "power brake"},
             {GL_SLOW_HW, "hw slowdown"},
             {GL_SLOW_SW_POWER_CAP, "sw power cap"}};
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof r / sizeof r[0] && mask > 0; i++)
        if ((uint64_t)mask & r[i].bit) {
            int w = snprintf(buf + off, len - off, "%s%s", off ? ", " : "", r[i].name);
            if (w > 0 && (size_t)w < len - off)
                off += (size_t)w;
        }
    if (off == 0)
        snprintf(buf, len, "none");
    return buf;
}

/* ---- preflight ---- */

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
    if (N.retired_pending) {
        r = N.retired_pending(d, &state);
        if (lost(r, g))
            goto gone;
        if (r == NVML_SUCCESS && state)
            fault(c, g,
                  "retired memory pages are pending: they take effect at the next reset; reset "
                  "the GPU (nvidia-smi -r -i %d with nothing running on it) or reboot before "
                  "using it",
                  g->index);
    }
    if (N.remapped) {
        unsigned corr = 0, unc = 0, pending = 0, failed = 0;
        r = N.remapped(d, &corr, &unc, &pending, &failed);
        if (lost(r, g))
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
    if (N.ecc) {
        unsigned long long n = 0;
        r = N.ecc(d, NVML_MEMORY_ERROR_UNCORRECTED, NVML_VOLATILE_ECC, &n);
        if (lost(r, g))
            goto gone;
        if (r == NVML_SUCCESS && n)
            fault(c, g,
                  "%llu uncorrectable ECC error(s) since the driver loaded: a kernel on it may "
                  "have read corrupt memory; reset the GPU, and drain the node if they come back",
                  n);
    }
    if (N.nvlink) {
        int have = 0, up = 0;
        char down[128] = "";
        size_t off = 0;
        for (unsigned l = 0; l < GL_NVML_MAX_LINKS; l++) {
            int on = 0;
            r = N.nvlink(d, l, &on);
            if (lost(r, g))
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
    if (N.reasons) {
        unsigned long long m = 0;
        r = N.reasons(d, &m);
        if (lost(r, g))
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
    if (N.mig_mode == NULL)
        return;
    unsigned cur = 0, pend = 0;
    if (N.mig_mode((nvmlDevice_t)g->phys, &cur, &pend) != NVML_SUCCESS)
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
        atomic_store(&stuck, 1);
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

/* ---- sampling and events ---- */

int gl_nvml_sample(const gl_gpu *g, gl_gpu_sample *s) {
    s->util = s->temp = -1;
    s->mem_used = s->mem_total = s->reasons = -1;
    s->power_w = -1;
    s->lost = 0;
    if (gl_nvml_open() != 0 || !g->found)
        return -1;
    nvmlDevice_t d = (nvmlDevice_t)g->dev, p = (nvmlDevice_t)g->phys;
    nvmlReturn_t r;
    nvmlUtilization_t u;
    /* a MIG instance has no utilisation of its own in NVML, and a GPU in MIG
     * mode has none either (nvml.h: not supported on MIG-enabled GPUs): asked
     * of the GPU, in case a later driver answers; -1 until then */
    if (N.util && (r = N.util(g->mig ? p : d, &u)) == NVML_SUCCESS)
        s->util = (int)u.gpu;
    else if (N.util && r == NVML_ERROR_GPU_IS_LOST)
        s->lost = 1;
    nvmlMemory_t m;
    if (N.mem && N.mem(d, &m) == NVML_SUCCESS) {
        s->mem_used = (int64_t)m.used;
        s->mem_total = (int64_t)m.total;
    }
    unsigned v;
    if (N.temp && (r = N.temp(p, NVML_TEMPERATURE_GPU, &v)) == NVML_SUCCESS)
        s->temp = (int)v;
    else if (N.temp && r == NVML_ERROR_GPU_IS_LOST)
        s->lost = 1;
    if (N.power && N.power(p, &v) == NVML_SUCCESS)
        s->power_w = v / 1000.0;
    unsigned long long rs;
    if (N.reasons && N.reasons(p, &rs) == NVML_SUCCESS)
        s->reasons = (int64_t)rs;
    return s->lost ? -1 : 0;
}

void *gl_nvml_events_create(gl_gpu *g, int n) {
    if (gl_nvml_open() != 0 || !N.ev_create || !N.ev_register || !N.ev_wait)
        return NULL;
    nvmlEventSet_t set = NULL;
    fdset before;
    fds_now(&before);
    if (N.ev_create(&set) != NVML_SUCCESS)
        return NULL;
    int any = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int k = 0; k < i; k++)
            seen |= g[k].found && g[k].phys == g[i].phys;
        /* events are the physical GPU's; a MIG instance's come with its GI id */
        if (g[i].found && !seen &&
            N.ev_register((nvmlDevice_t)g[i].phys, NVML_EVENT_XID, set) == NVML_SUCCESS)
            any = 1;
    }
    cloexec_since(&before);
    /* nvmlEventSetFree is not needed: the set lives as long as the launcher */
    return any ? set : NULL;
}

int gl_nvml_events_wait(void *set, const gl_gpu *g, int n, unsigned timeout_ms, int *which,
                        uint64_t *xid, unsigned *gi) {
    nvmlEventData_t e;
    memset(&e, 0, sizeof e);
    nvmlReturn_t r = N.ev_wait((nvmlEventSet_t)set, &e, timeout_ms);
    if (r == NVML_ERROR_TIMEOUT)
        return 0;
    if (r != NVML_SUCCESS)
        return -1;
    if (!(e.eventType & NVML_EVENT_XID))
        return 0;
    *which = -1;
    *xid = e.eventData;
    *gi = e.gpuInstanceId;
    /* the MIG instance the XID is attributable to, else the GPU's first */
    for (int i = 0; i < n && *which < 0; i++)
        if (g[i].found && g[i].phys == (void *)e.device && g[i].mig && g[i].gi == e.gpuInstanceId)
            *which = i;
    for (int i = 0; i < n && *which < 0; i++)
        if (g[i].found && g[i].phys == (void *)e.device)
            *which = i;
    return 1;
}

const char *gl_nvml_xid_hint(uint64_t xid) {
    switch (xid) {
    case 13:
        return "graphics engine exception: usually the program's own bug (an illegal address)";
    case 31:
        return "GPU memory page fault: usually the program's own bug (an illegal address)";
    case 43:
        return "the GPU stopped processing: the program's own fault, the GPU is fine";
    case 45:
        return "preemptive cleanup after another error";
    case 48:
        return "double-bit ECC error: reset the GPU; drain the node if it recurs";
    case 61:
    case 62:
        return "internal micro-controller error: reset the GPU; drain the node if it recurs";
    case 63:
    case 64:
        return "row remapping event: reset the GPU to apply it";
    case 74:
        return "NVLink error: check nvidia-smi nvlink -s; drain the node if it recurs";
    case 79:
        return "the GPU has fallen off the bus: drain the node, reset or reboot it, and have the "
               "GPU inspected";
    case 92:
        return "high single-bit ECC error rate: watch it; reset the GPU at the next chance";
    case 94:
        return "contained uncorrectable ECC error: the application on it must restart";
    case 95:
        return "uncontained uncorrectable ECC error: reset the GPU before further use";
    case 119:
    case 120:
        return "GSP firmware error: reset the GPU; drain the node if it recurs";
    default:
        return "";
    }
}
