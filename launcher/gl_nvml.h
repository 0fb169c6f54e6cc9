/* NVML, loaded at run time: the GPUs this node binds (CUDA_VISIBLE_DEVICES
 * indices or UUIDs, MIG instances included) matched to NVML devices, the
 * preflight health checks (--gpu-health), one sample of a GPU's state and the
 * XID event wait. libnvidia-ml.so.1 is opened with dlopen on first use
 * (GPULAUNCH_NVML_LIBRARY names another file, for tests); the launcher never
 * links it. Every function is looked up on its own: one an older driver lacks
 * turns off the check that needs it, and that is said once. */
#ifndef GPULAUNCH_GL_NVML_H
#define GPULAUNCH_GL_NVML_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define GL_NVML_MAX_GPUS 64  /* bound devices looked at; more are not checked */
#define GL_NVML_MAX_LINKS 36 /* NVML_NVLINK_MAX_LINKS of NVML 13 (18 before) */
#define GL_NVML_XID_UNKNOWN 999
#define GL_NVML_PREFLIGHT_TIMEOUT_S 30 /* NVML hanging longer fails the preflight */

enum { GL_GPU_HEALTH_OFF = 0, GL_GPU_HEALTH_WARN = 1, GL_GPU_HEALTH_REFUSE = 2 };

/* Clock slowdown reasons (NVML's nvmlClocksEventReason* bits). */
#define GL_SLOW_SW_POWER_CAP 0x4ull
#define GL_SLOW_HW 0x8ull
#define GL_SLOW_SW_THERMAL 0x20ull
#define GL_SLOW_HW_THERMAL 0x40ull
#define GL_SLOW_HW_POWER_BRAKE 0x80ull
#define GL_SLOW_FAULTS                                                                             \
    (GL_SLOW_HW | GL_SLOW_SW_THERMAL | GL_SLOW_HW_THERMAL | GL_SLOW_HW_POWER_BRAKE)

/* One bound device: a whole GPU or a MIG instance. */
typedef struct gl_gpu {
    char bound[96];   /* its entry in CUDA_VISIBLE_DEVICES, or its index */
    int found;        /* NVML has a handle for it */
    int listed;       /* not bound: every GPU NVML lists (no CUDA_VISIBLE_DEVICES) */
    int lost;         /* NVML_ERROR_GPU_IS_LOST on the way */
    int index;        /* NVML index of the physical GPU, -1 unknown */
    int mig;          /* a MIG instance */
    unsigned gi, ci;  /* its GPU and compute instance ids */
    char uuid[96];    /* GPU-... or MIG-... */
    char busid[32];   /* the physical GPU's PCI bus id */
    char why[160];    /* when !found: why not */
    void *dev, *phys; /* nvmlDevice_t of the device and of its physical GPU */
} gl_gpu;

/* One look at a device; -1 where NVML could not say. */
typedef struct gl_gpu_sample {
    int util;                    /* percent of time a kernel ran */
    int64_t mem_used, mem_total; /* bytes */
    int temp;                    /* Celsius */
    double power_w;
    int64_t reasons; /* slowdown reasons, -1 unknown */
    int lost;
} gl_gpu_sample;

/* Loads and starts NVML once per process; 0, or -1 when it is absent or does
 * not start (said once on stderr unless it is simply not installed). */
int gl_nvml_open(void);
/* The devices the workers may use: the CUDA_VISIBLE_DEVICES list (or
 * NVIDIA_VISIBLE_DEVICES' UUIDs), else every GPU NVML lists. Returns the
 * count (entries NVML cannot match have found = 0), or -1 without NVML. */
int gl_nvml_bound(gl_gpu *out, int max);
/* "GPU 1 (GPU-..., PCI 00000000:18:00.0)" */
const char *gl_nvml_name(const gl_gpu *g, char *buf, size_t len);
/* The preflight checks of every bound device; faults are FAIL lines in
 * refuse mode and warn lines in warn mode. Returns the number of FAILs.
 * NVML that does not answer within GL_NVML_PREFLIGHT_TIMEOUT_S (the
 * environment's GPULAUNCH_NVML_TIMEOUT_S, for tests) is a fault itself, and
 * NVML is then not used again by this process. */
int gl_nvml_preflight(int mode, FILE *out, int verbose);
/* One sample; 0, or -1 when the device is lost. */
int gl_nvml_sample(const gl_gpu *g, gl_gpu_sample *s);
/* "hw thermal, sw power cap" into buf. */
const char *gl_nvml_reasons(int64_t mask, char *buf, size_t len);

/* XID events. NULL when NVML lacks the event API or no device takes it. */
void *gl_nvml_events_create(gl_gpu *g, int n);
/* Waits up to timeout_ms for an XID on one of the devices: 1 with the device's
 * position in g[], the XID and its GPU instance (0xffffffff: none), 0 on
 * timeout, -1 when waiting failed. */
int gl_nvml_events_wait(void *set, const gl_gpu *g, int n, unsigned timeout_ms, int *which,
                        uint64_t *xid, unsigned *gi);
/* What an XID means and what to do, for the common ones; "" for others. */
const char *gl_nvml_xid_hint(uint64_t xid);

#endif
