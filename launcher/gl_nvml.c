/* NVML through dlopen (see gl_nvml.h): the library and its functions, the
 * bound devices matched to what NVML lists, samples and the XID wait. The few
 * types and prototypes used are declared in gl_nvml_abi.h, matching NVML's
 * ABI: the symbol names are the versioned ones nvml.h maps its calls to
 * (nvmlInit_v2, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetPciInfo_v3, ...).
 * The preflight checks are gl_gpucheck.c's. */
#include "gl_nvml_abi.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

gl_nvml_fns gl_nv;

#define FN(field, sym, what)                                                                       \
    { sym, offsetof(gl_nvml_fns, field), what }
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
        memcpy((char *)&gl_nv + fns[i].off, &p, sizeof p);
    }
    if (gl_nv.reasons == NULL)
        gl_nv.reasons = gl_nv.reasons_old;
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        void *p;
        memcpy(&p, (char *)&gl_nv + fns[i].off, sizeof p);
        if (p == NULL && fns[i].what == NULL && fns[i].off != offsetof(gl_nvml_fns, reasons) &&
            fns[i].off != offsetof(gl_nvml_fns, reasons_old)) {
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
        memcpy(&p, (char *)&gl_nv + fns[i].off, sizeof p);
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
    if (gl_nv.reasons == NULL)
        fprintf(stderr, "gpulaunch: NVML lacks nvmlDeviceGetCurrentClocksEventReasons (an older "
                        "driver): the clock slowdown check is off\n");
    fdset before;
    fds_now(&before);
    nvmlReturn_t r = gl_nv.init();
    cloexec_since(&before);
    if (r != NVML_SUCCESS) {
        fprintf(stderr,
                "gpulaunch: NVML did not start (%s): GPU health checks are off; "
                "nvidia-smi says why\n",
                gl_nv.errstr(r));
        dlclose(h);
        return;
    }
    loaded = 0;
}

static atomic_int stuck; /* a preflight call never returned: NVML is not used again */

void gl_nvml_set_stuck(void) { atomic_store(&stuck, 1); }

int gl_nvml_open(void) {
    if (atomic_load(&stuck))
        return -1;
    pthread_once(&once, load);
    return loaded;
}

/* ---- the bound devices ---- */

int gl_nvml_lost(nvmlReturn_t r, gl_gpu *g) {
    if (r == NVML_ERROR_GPU_IS_LOST)
        g->lost = 1;
    return r == NVML_ERROR_GPU_IS_LOST;
}

/* Fills uuid, bus id, index and MIG ids from g->dev. */
static void describe(gl_gpu *g) {
    g->found = 1;
    g->phys = g->dev;
    if (gl_nv.mig_parent) {
        nvmlDevice_t p;
        if (gl_nv.mig_parent((nvmlDevice_t)g->dev, &p) == NVML_SUCCESS && p != NULL) {
            g->mig = 1;
            g->phys = p;
        }
    }
    nvmlReturn_t r = gl_nv.uuid((nvmlDevice_t)g->dev, g->uuid, sizeof g->uuid);
    gl_nvml_lost(r, g);
    if (r != NVML_SUCCESS)
        snprintf(g->uuid, sizeof g->uuid, "UUID unknown");
    nvmlPciInfo_t pci;
    memset(&pci, 0, sizeof pci);
    r = gl_nv.pci((nvmlDevice_t)g->phys, &pci);
    gl_nvml_lost(r, g);
    if (r != NVML_SUCCESS)
        snprintf(g->busid, sizeof g->busid, "bus id unknown");
    else
        snprintf(g->busid, sizeof g->busid, "%s", pci.busId);
    unsigned v;
    if (gl_nv.index && gl_nv.index((nvmlDevice_t)g->phys, &v) == NVML_SUCCESS)
        g->index = (int)v;
    if (g->mig && gl_nv.gi_id && gl_nv.gi_id((nvmlDevice_t)g->dev, &v) == NVML_SUCCESS)
        g->gi = v;
    if (g->mig && gl_nv.ci_id && gl_nv.ci_id((nvmlDevice_t)g->dev, &v) == NVML_SUCCESS)
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
        if (!parent.found || !gl_nv.mig_max || !gl_nv.mig_by_index || !gl_nv.gi_id ||
            !gl_nv.ci_id || gl_nv.mig_max((nvmlDevice_t)parent.dev, &max) != NVML_SUCCESS) {
            snprintf(g->why, sizeof g->why, "NVML does not find that MIG instance");
            g->lost = parent.lost;
            return;
        }
        for (unsigned k = 0; k < max; k++) {
            unsigned a, b;
            if (gl_nv.mig_by_index((nvmlDevice_t)parent.dev, k, &d) == NVML_SUCCESS &&
                gl_nv.gi_id(d, &a) == NVML_SUCCESS && gl_nv.ci_id(d, &b) == NVML_SUCCESS &&
                a == gi && b == ci) {
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
    if (gl_nv.by_uuid) {
        r = gl_nv.by_uuid(want, &d);
        if (r == NVML_SUCCESS) {
            g->dev = d;
            describe(g);
            return;
        }
        any_lost = r == NVML_ERROR_GPU_IS_LOST;
    }
    /* a prefix, or no lookup by UUID: list the GPUs and their MIG instances */
    unsigned n = 0;
    if (gl_nv.count(&n) != NVML_SUCCESS)
        n = 0;
    size_t wl = strlen(want);
    for (unsigned i = 0; i < n && !g->found; i++) {
        char u[96];
        if (gl_nv.by_index(i, &d) != NVML_SUCCESS)
            continue;
        if (gl_nv.uuid(d, u, sizeof u) == NVML_SUCCESS && strncmp(u, want, wl) == 0) {
            g->dev = d;
            describe(g);
            return;
        }
        unsigned max = 0;
        if (gl_nv.mig_max && gl_nv.mig_by_index && gl_nv.mig_max(d, &max) == NVML_SUCCESS)
            for (unsigned k = 0; k < max; k++) {
                nvmlDevice_t m;
                if (gl_nv.mig_by_index(d, k, &m) == NVML_SUCCESS &&
                    gl_nv.uuid(m, u, sizeof u) == NVML_SUCCESS && strncmp(u, want, wl) == 0) {
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
    nvmlReturn_t r = gl_nv.by_index(i, &d);
    if (r != NVML_SUCCESS) {
        g->lost = r == NVML_ERROR_GPU_IS_LOST;
        snprintf(g->why, sizeof g->why, "NVML has no GPU %u (%s)", i, gl_nv.errstr(r));
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
        if (gl_nv.count(&c) != NVML_SUCCESS)
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
    if (gl_nv.util && (r = gl_nv.util(g->mig ? p : d, &u)) == NVML_SUCCESS)
        s->util = (int)u.gpu;
    else if (gl_nv.util && r == NVML_ERROR_GPU_IS_LOST)
        s->lost = 1;
    nvmlMemory_t m;
    if (gl_nv.mem && gl_nv.mem(d, &m) == NVML_SUCCESS) {
        s->mem_used = (int64_t)m.used;
        s->mem_total = (int64_t)m.total;
    }
    unsigned v;
    if (gl_nv.temp && (r = gl_nv.temp(p, NVML_TEMPERATURE_GPU, &v)) == NVML_SUCCESS)
        s->temp = (int)v;
    else if (gl_nv.temp && r == NVML_ERROR_GPU_IS_LOST)
        s->lost = 1;
    if (gl_nv.power && gl_nv.power(p, &v) == NVML_SUCCESS)
        s->power_w = v / 1000.0;
    unsigned long long rs;
    if (gl_nv.reasons && gl_nv.reasons(p, &rs) == NVML_SUCCESS)
        s->reasons = (int64_t)rs;
    return s->lost ? -1 : 0;
}

void *gl_nvml_events_create(gl_gpu *g, int n) {
    if (gl_nvml_open() != 0 || !gl_nv.ev_create || !gl_nv.ev_register || !gl_nv.ev_wait)
        return NULL;
    nvmlEventSet_t set = NULL;
    fdset before;
    fds_now(&before);
    if (gl_nv.ev_create(&set) != NVML_SUCCESS)
        return NULL;
    int any = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int k = 0; k < i; k++)
            seen |= g[k].found && g[k].phys == g[i].phys;
        /* events are the physical GPU's; a MIG instance's come with its GI id */
        if (g[i].found && !seen &&
            gl_nv.ev_register((nvmlDevice_t)g[i].phys, NVML_EVENT_XID, set) == NVML_SUCCESS)
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
    nvmlReturn_t r = gl_nv.ev_wait((nvmlEventSet_t)set, &e, timeout_ms);
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
