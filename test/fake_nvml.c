/* A fake NVML for the tests: a shared library exporting the real symbol
 * names (nvmlInit_v2, nvmlDeviceGetHandleByIndex_v2, ...) with NVML's ABI,
 * loaded by the launcher through GPULAUNCH_NVML_LIBRARY. Each test scripts its
 * GPUs in the file FAKE_NVML_SCRIPT names, one directive a line (I: a GPU's
 * index; times in seconds after nvmlInit_v2):
 *
 *   gpus N                  N healthy GPUs (UUID GPU-fake-I, bus 00000000:I+10:00.0)
 *   uuid I UUID             its UUID
 *   retired_pending I       retired pages pending
 *   remap_pending I         a row remapping pending
 *   remap_failure I         a row remapping failed
 *   ecc I N                 N volatile uncorrectable ECC errors
 *   lost I                  NVML_ERROR_GPU_IS_LOST from every query on it
 *   nvlink I N UPMASK       N NVLink links, those in UPMASK up
 *   reasons I MASK          clocks event reasons (0x40: hw thermal)
 *   util I PCT [T PCT2]     utilisation PCT, PCT2 from T on
 *   xid I CODE T [GI]       an XID CODE on GPU I at T (of its MIG GPU instance GI)
 *   mig I N                 MIG mode on, N instances MIG-fake-I-K (GI K+1, CI 0)
 *   hang I                  every health query on GPU I blocks forever (a hung driver)
 *
 * Built twice: fake_nvml (every function) and fake_nvml_old (-DFAKE_OLD_DRIVER:
 * without nvmlDeviceGetRemappedRows and the new name of the clock reasons
 * call, as an older driver). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAKE_MAX 16
#define FAKE_MIG 7
#define FAKE_XIDS 16

typedef int nvmlReturn_t;
typedef struct fdev *nvmlDevice_t;
typedef struct fset *nvmlEventSet_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

struct fdev {
    int gpu, mig; /* mig: -1 for the GPU itself */
};

typedef struct fgpu {
    struct fdev self, migs[FAKE_MIG];
    char uuid[96];
    int retired, remap_pending, remap_failure, lost, nlinks, nmig, hang;
    unsigned long long ecc, reasons, upmask;
    int util, util2;
    double util_at;
} fgpu;

static struct {
    int loaded, n;
    fgpu g[FAKE_MAX];
    struct {
        int gpu;
        unsigned long long code;
        double at;
        int sent;
        unsigned gi; /* 0xffffffff: not a MIG instance's */
    } xid[FAKE_XIDS];
    int nxid;
    struct timespec t0;
    int registered[FAKE_MAX];
    int ctl_fd;
} F;

static double since_init(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - F.t0.tv_sec) + (t.tv_nsec - F.t0.tv_nsec) / 1e9;
}

static void load(void) {
    if (F.loaded)
        return;
    F.loaded = 1;
    const char *path = getenv("FAKE_NVML_SCRIPT");
    FILE *f = path ? fopen(path, "r") : NULL;
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        char cmd[32], s[96];
        int i = 0, a = 0, b = 0;
        double t = 0;
        unsigned long long m = 0;
        long long sm = 0; /* masks: 0x... */
        if (sscanf(line, "%31s", cmd) != 1 || cmd[0] == '#')
            continue;
        if (strcmp(cmd, "gpus") == 0 && sscanf(line, "%*s %d", &a) == 1) {
            F.n = a < FAKE_MAX ? a : FAKE_MAX;
            for (int k = 0; k < F.n; k++) {
                F.g[k].self = (struct fdev){k, -1};
                snprintf(F.g[k].uuid, sizeof F.g[k].uuid, "GPU-fake-%d", k);
                F.g[k].util = F.g[k].util2 = 100;
                F.g[k].util_at = 1e30;
            }
            continue;
        }
        if (sscanf(line, "%*s %d", &i) != 1 || i < 0 || i >= FAKE_MAX)
            continue;
        fgpu *g = &F.g[i];
        if (strcmp(cmd, "uuid") == 0 && sscanf(line, "%*s %*d %95s", s) == 1)
            snprintf(g->uuid, sizeof g->uuid, "%s", s);
        else if (strcmp(cmd, "retired_pending") == 0)
            g->retired = 1;
        else if (strcmp(cmd, "remap_pending") == 0)
            g->remap_pending = 1;
        else if (strcmp(cmd, "remap_failure") == 0)
            g->remap_failure = 1;
        else if (strcmp(cmd, "ecc") == 0 && sscanf(line, "%*s %*d %llu", &m) == 1)
            g->ecc = m;
        else if (strcmp(cmd, "lost") == 0)
            g->lost = 1;
        else if (strcmp(cmd, "hang") == 0)
            g->hang = 1;
        else if (strcmp(cmd, "nvlink") == 0 && sscanf(line, "%*s %*d %d %lli", &a, &sm) == 2) {
            g->nlinks = a;
            g->upmask = (unsigned long long)sm;
        } else if (strcmp(cmd, "reasons") == 0 && sscanf(line, "%*s %*d %lli", &sm) == 1)
            g->reasons = (unsigned long long)sm;
        else if (strcmp(cmd, "util") == 0) {
            int k = sscanf(line, "%*s %*d %d %lf %d", &a, &t, &b);
            g->util = g->util2 = a;
            if (k == 3) {
                g->util_at = t;
                g->util2 = b;
            }
        } else if (strcmp(cmd, "xid") == 0 && sscanf(line, "%*s %*d %llu %lf", &m, &t) == 2 &&
                   F.nxid < FAKE_XIDS) {
            F.xid[F.nxid].gi = sscanf(line, "%*s %*d %*u %*f %d", &b) == 1 ? (unsigned)b : ~0u;
            F.xid[F.nxid].gpu = i;
            F.xid[F.nxid].code = m;
            F.xid[F.nxid++].at = t;
        } else if (strcmp(cmd, "mig") == 0 && sscanf(line, "%*s %*d %d", &a) == 1) {
            g->nmig = a < FAKE_MIG ? a : FAKE_MIG;
            for (int k = 0; k < g->nmig; k++)
                g->migs[k] = (struct fdev){i, k};
        }
    }
    if (f)
        fclose(f);
}

/* The GPU behind a handle; NULL when the handle is not ours. */
static fgpu *gpu_of(nvmlDevice_t d) {
    if (d == NULL || d->gpu < 0 || d->gpu >= F.n)
        return NULL;
    return &F.g[d->gpu];
}

static void hang_forever(void) {
    for (;;) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
}

/* A handle's GPU; a hung one blocks, a lost one answers GPU_IS_LOST. */
#define DEV(d, g)                                                                                  \
    fgpu *g = gpu_of(d);                                                                           \
    if (g == NULL)                                                                                 \
        return 2; /* NVML_ERROR_INVALID_ARGUMENT */                                                \
    if (g->hang)                                                                                   \
        hang_forever();                                                                            \
    if (g->lost)                                                                                   \
    return 15 /* NVML_ERROR_GPU_IS_LOST */

nvmlReturn_t nvmlInit_v2(void) {
    load();
    /* as a driver's /dev/nvidiactl: open, and not close-on-exec */
    const char *path = getenv("FAKE_NVML_SCRIPT");
    if (path)
        F.ctl_fd = open(path, O_RDONLY);
    clock_gettime(CLOCK_MONOTONIC, &F.t0);
    return 0;
}

nvmlReturn_t nvmlShutdown(void) { return 0; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case 0:
        return "Success";
    case 3:
        return "Not Supported";
    case 6:
        return "Not Found";
    case 15:
        return "GPU is lost";
    default:
        return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    *n = (unsigned)F.n;
    return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i >= (unsigned)F.n)
        return 2;
    *d = &F.g[i].self;
    return 0;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned int len) {
    fgpu *g = gpu_of(d);
    if (g == NULL)
        return 2;
    if (d->mig >= 0)
        snprintf(buf, len, "MIG-fake-%d-%d", d->gpu, d->mig);
    else
        snprintf(buf, len, "%s", g->uuid);
    return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    /* as NVML's: GPU_IS_LOST when any GPU of the node is lost */
    for (int i = 0; i < F.n; i++)
        if (F.g[i].lost)
            return 15;
    for (int i = 0; i < F.n; i++) {
        char u[96];
        if (strcmp(F.g[i].uuid, uuid) == 0) {
            *d = &F.g[i].self;
            return 0;
        }
        for (int k = 0; k < F.g[i].nmig; k++) {
            snprintf(u, sizeof u, "MIG-fake-%d-%d", i, k);
            if (strcmp(u, uuid) == 0) {
                *d = &F.g[i].migs[k];
                return 0;
            }
        }
    }
    return 6;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    fgpu *g = gpu_of(d);
    if (g == NULL)
        return 2;
    memset(p, 0, sizeof *p);
    p->bus = (unsigned)(0x10 + d->gpu);
    snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", p->bus);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", p->bus);
    p->pciDeviceId = 0x233510de;
    return 0;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) {
    if (gpu_of(d) == NULL)
        return 2;
    *i = (unsigned)d->gpu;
    return 0;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, int *pending) {
    DEV(d, g);
    *pending = g->retired;
    return 0;
}

#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failed) {
    DEV(d, g);
    *corr = 0;
    *unc = g->remap_failure ? 3 : 0;
    *pending = (unsigned)g->remap_pending;
    *failed = (unsigned)g->remap_failure;
    return 0;
}
#endif

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter,
                                         unsigned long long *n) {
    DEV(d, g);
    *n = type == 1 && counter == 0 ? g->ecc : 0;
    return 0;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *active) {
    DEV(d, g);
    if (link >= (unsigned)g->nlinks)
        return 3;
    *active = (int)((g->upmask >> link) & 1);
    return 0;
}

static nvmlReturn_t reasons(nvmlDevice_t d, unsigned long long *m) {
    DEV(d, g);
    *m = g->reasons;
    return 0;
}

#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *m) {
    return reasons(d, m);
}
#endif
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *m) {
    return reasons(d, m);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending) {
    DEV(d, g);
    *cur = *pending = g->nmig > 0;
    return 0;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *n) {
    DEV(d, g);
    *n = (unsigned)g->nmig;
    return 0;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int k, nvmlDevice_t *m) {
    DEV(d, g);
    if (k >= (unsigned)g->nmig)
        return 6;
    *m = &g->migs[k];
    return 0;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t m, nvmlDevice_t *d) {
    fgpu *g = gpu_of(m);
    if (g == NULL || m->mig < 0)
        return 2; /* as NVML: not a MIG handle */
    *d = &g->self;
    return 0;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t m, unsigned int *id) {
    if (gpu_of(m) == NULL || m->mig < 0)
        return 3;
    *id = (unsigned)m->mig + 1;
    return 0;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t m, unsigned int *id) {
    if (gpu_of(m) == NULL || m->mig < 0)
        return 3;
    *id = 0;
    return 0;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    DEV(d, g);
    if (d->mig >= 0 || g->nmig > 0)
        return 3; /* as NVML: not supported on MIG-enabled GPUs */
    u->gpu = (unsigned)(since_init() >= g->util_at ? g->util2 : g->util);
    u->memory = u->gpu / 2;
    return 0;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    DEV(d, g);
    m->total = 141ull << 30;
    m->used = d->mig >= 0 ? 1ull << 30 : 70ull << 30;
    m->free = m->total - m->used;
    return 0;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
    DEV(d, g);
    *t = sensor == 0 ? 40u + (unsigned)d->gpu : 0u;
    return 0;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    DEV(d, g);
    *mw = 350000;
    return 0;
}

struct fset {
    int unused;
};
static struct fset the_set;

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *s) {
    *s = &the_set;
    return 0;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t s) {
    (void)s;
    return 0;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t s) {
    (void)s;
    DEV(d, g);
    (void)g;
    if (!(types & 0x8ull))
        return 3;
    F.registered[d->gpu] = 1;
    return 0;
}

/* Sleeps in 5 ms steps until a scripted XID of a registered GPU is due. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t s, nvmlEventData_t *e, unsigned int timeout_ms) {
    (void)s;
    for (unsigned waited = 0;; waited += 5) {
        double now = since_init();
        for (int k = 0; k < F.nxid; k++)
            if (!F.xid[k].sent && F.xid[k].at <= now && F.registered[F.xid[k].gpu]) {
                F.xid[k].sent = 1;
                memset(e, 0, sizeof *e);
                e->device = &F.g[F.xid[k].gpu].self;
                e->eventType = 0x8ull;
                e->eventData = F.xid[k].code;
                e->gpuInstanceId = F.xid[k].gi;
                e->computeInstanceId = F.xid[k].gi == ~0u ? ~0u : 0;
                return 0;
            }
        if (waited >= timeout_ms)
            return 10; /* NVML_ERROR_TIMEOUT */
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
}
