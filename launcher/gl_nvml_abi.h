/* NVML's ABI as gl_nvml.c declares it for itself (the versioned symbol names
 * nvml.h maps its calls to; test/nvml_abi_check.c checks it against nvml.h)
 * and the table of functions gl_nvml.c loads: shared by the NVML files of the
 * launcher (gl_nvml.c, gl_gpucheck.c), internal to them. */
#ifndef GPULAUNCH_GL_NVML_ABI_H
#define GPULAUNCH_GL_NVML_ABI_H

#include "gl_nvml.h"

/* NVML's ABI: the few types and values used */

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

/* The functions, each looked up on its own (gl_nvml.c); NULL: missing. */
typedef struct gl_nvml_fns {
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
} gl_nvml_fns;

extern gl_nvml_fns gl_nv;

/* Notes a lost GPU; 1 when r says it is. */
int gl_nvml_lost(nvmlReturn_t r, gl_gpu *g);
/* A call never returned: NVML is not used again in this process. */
void gl_nvml_set_stuck(void);

#endif
