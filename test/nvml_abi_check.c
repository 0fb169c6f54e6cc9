/* The NVML ABI that launcher/gl_nvml.c declares for itself, checked against
 * NVIDIA's own nvml.h at compile time: every struct's size and field offsets,
 * every constant and return code it uses, and the prototype of every versioned
 * function it looks up. The fake NVML of the tests shares gl_nvml.c's
 * declarations, so only this check can tell them wrong. Compiled where nvml.h
 * exists (the CUDA toolkit ships it; so does PyPI's nvidia-nvml-dev-cu12):
 *
 *   cc -std=gnu11 -I launcher -I /usr/local/cuda/include \
 *      test/nvml_abi_check.c -o nvml_abi_check -ldl -lpthread && ./nvml_abi_check
 *
 * and run (cc ... -o nvml_abi_check -ldl -lpthread): it says which function
 * fns[] looks up unchecked. scripts/gpu_check.sh does both. */
#define _GNU_SOURCE

/* gl_nvml.c's names, moved aside so that nvml.h can declare the real ones */
#define nvmlReturn_t gl_nvmlReturn_t
#define nvmlDevice_t gl_nvmlDevice_t
#define nvmlDevice_st gl_nvmlDevice_st
#define nvmlEventSet_t gl_nvmlEventSet_t
#define nvmlEventSet_st gl_nvmlEventSet_st
#define nvmlUtilization_t gl_nvmlUtilization_t
#define nvmlMemory_t gl_nvmlMemory_t
#define nvmlPciInfo_t gl_nvmlPciInfo_t
#define nvmlEventData_t gl_nvmlEventData_t
#define NVML_SUCCESS GL_NVML_SUCCESS
#define NVML_ERROR_NOT_SUPPORTED GL_NVML_ERROR_NOT_SUPPORTED
#define NVML_ERROR_NOT_FOUND GL_NVML_ERROR_NOT_FOUND
#define NVML_ERROR_TIMEOUT GL_NVML_ERROR_TIMEOUT
#define NVML_ERROR_FUNCTION_NOT_FOUND GL_NVML_ERROR_FUNCTION_NOT_FOUND
#define NVML_ERROR_GPU_IS_LOST GL_NVML_ERROR_GPU_IS_LOST
#include "../launcher/gl_nvml.c"
enum { GL_NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU, GL_NVML_VOLATILE_ECC = NVML_VOLATILE_ECC };
#undef nvmlReturn_t
#undef nvmlDevice_t
#undef nvmlDevice_st
#undef nvmlEventSet_t
#undef nvmlEventSet_st
#undef nvmlUtilization_t
#undef nvmlMemory_t
#undef nvmlPciInfo_t
#undef nvmlEventData_t
#undef NVML_SUCCESS
#undef NVML_ERROR_NOT_SUPPORTED
#undef NVML_ERROR_NOT_FOUND
#undef NVML_ERROR_TIMEOUT
#undef NVML_ERROR_FUNCTION_NOT_FOUND
#undef NVML_ERROR_GPU_IS_LOST
#undef NVML_TEMPERATURE_GPU
#undef NVML_VOLATILE_ECC

#include <nvml.h>

/* NVML 13 marks the older calls gl_nvml.c falls back on (or still uses) as
 * deprecated: they are still exported, and checked here all the same */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define SAME_SIZE(t) _Static_assert(sizeof(gl_##t) == sizeof(t), "sizeof " #t)
#define SAME_AT(t, f)                                                                              \
    _Static_assert(offsetof(gl_##t, f) == offsetof(t, f) &&                                        \
                       sizeof(((gl_##t *)0)->f) == sizeof(((t *)0)->f),                            \
                   #t "." #f)

SAME_SIZE(nvmlUtilization_t);
SAME_AT(nvmlUtilization_t, gpu);
SAME_AT(nvmlUtilization_t, memory);
SAME_SIZE(nvmlMemory_t); /* the v1 struct of nvmlDeviceGetMemoryInfo, no version field */
SAME_AT(nvmlMemory_t, total);
SAME_AT(nvmlMemory_t, free);
SAME_AT(nvmlMemory_t, used);
SAME_SIZE(nvmlPciInfo_t); /* nvmlDeviceGetPciInfo_v3's */
SAME_AT(nvmlPciInfo_t, busIdLegacy);
SAME_AT(nvmlPciInfo_t, domain);
SAME_AT(nvmlPciInfo_t, bus);
SAME_AT(nvmlPciInfo_t, device);
SAME_AT(nvmlPciInfo_t, pciDeviceId);
SAME_AT(nvmlPciInfo_t, pciSubSystemId);
SAME_AT(nvmlPciInfo_t, busId);
SAME_SIZE(nvmlEventData_t); /* nvmlEventSetWait_v2's */
SAME_AT(nvmlEventData_t, device);
SAME_AT(nvmlEventData_t, eventType);
SAME_AT(nvmlEventData_t, eventData);
SAME_AT(nvmlEventData_t, gpuInstanceId);
SAME_AT(nvmlEventData_t, computeInstanceId);

_Static_assert((int)GL_NVML_SUCCESS == (int)NVML_SUCCESS, "NVML_SUCCESS");
_Static_assert((int)GL_NVML_ERROR_NOT_SUPPORTED == (int)NVML_ERROR_NOT_SUPPORTED, "NOT_SUPPORTED");
_Static_assert((int)GL_NVML_ERROR_NOT_FOUND == (int)NVML_ERROR_NOT_FOUND, "NOT_FOUND");
_Static_assert((int)GL_NVML_ERROR_TIMEOUT == (int)NVML_ERROR_TIMEOUT, "TIMEOUT");
_Static_assert((int)GL_NVML_ERROR_FUNCTION_NOT_FOUND == (int)NVML_ERROR_FUNCTION_NOT_FOUND,
               "FN_NOT_FOUND");
_Static_assert((int)GL_NVML_ERROR_GPU_IS_LOST == (int)NVML_ERROR_GPU_IS_LOST, "GPU_IS_LOST");
_Static_assert((int)GL_NVML_TEMPERATURE_GPU == (int)NVML_TEMPERATURE_GPU, "NVML_TEMPERATURE_GPU");
_Static_assert((int)GL_NVML_VOLATILE_ECC == (int)NVML_VOLATILE_ECC, "NVML_VOLATILE_ECC");
_Static_assert(NVML_MEMORY_ERROR_UNCORRECTED == NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
               "NVML_MEMORY_ERROR_TYPE_UNCORRECTED");
_Static_assert(NVML_EVENT_XID == (unsigned long long)nvmlEventTypeXidCriticalError,
               "nvmlEventTypeXidCriticalError");
/* every link the header knows is looked at (18 in NVML 12, 36 in NVML 13) */
_Static_assert(GL_NVML_MAX_LINKS >= NVML_NVLINK_MAX_LINKS, "NVML_NVLINK_MAX_LINKS");
_Static_assert(GL_SLOW_SW_POWER_CAP == (unsigned long long)nvmlClocksThrottleReasonSwPowerCap, "");
_Static_assert(GL_SLOW_HW == (unsigned long long)nvmlClocksThrottleReasonHwSlowdown, "");
_Static_assert(GL_SLOW_SW_THERMAL == (unsigned long long)nvmlClocksThrottleReasonSwThermalSlowdown,
               "");
_Static_assert(GL_SLOW_HW_THERMAL == (unsigned long long)nvmlClocksThrottleReasonHwThermalSlowdown,
               "");
_Static_assert(GL_SLOW_HW_POWER_BRAKE ==
                   (unsigned long long)nvmlClocksThrottleReasonHwPowerBrakeSlowdown,
               "");
/* the enums gl_nvml.c passes as int are int-sized */
_Static_assert(sizeof(nvmlReturn_t) == sizeof(int) && sizeof(nvmlEnableState_t) == sizeof(int) &&
                   sizeof(nvmlMemoryErrorType_t) == sizeof(int) &&
                   sizeof(nvmlEccCounterType_t) == sizeof(int) &&
                   sizeof(nvmlTemperatureSensors_t) == sizeof(int),
               "enum sizes");

/* Each looked-up function: nvml.h declares it, under the versioned name
 * fns[] looks up for that field, with the parameters gl_nvml.c passes (a
 * wrong version suffix or argument list fails to compile or to run here). */
#define FUNCTIONS(X)                                                                               \
    X(init, nvmlInit_v2, nvmlReturn_t (*)(void))                                                   \
    X(count, nvmlDeviceGetCount_v2, nvmlReturn_t (*)(unsigned int *))                              \
    X(by_index, nvmlDeviceGetHandleByIndex_v2, nvmlReturn_t (*)(unsigned int, nvmlDevice_t *))     \
    X(uuid, nvmlDeviceGetUUID, nvmlReturn_t (*)(nvmlDevice_t, char *, unsigned int))               \
    X(pci, nvmlDeviceGetPciInfo_v3, nvmlReturn_t (*)(nvmlDevice_t, nvmlPciInfo_t *))               \
    X(errstr, nvmlErrorString, const char *(*)(nvmlReturn_t))                                      \
    X(by_uuid, nvmlDeviceGetHandleByUUID, nvmlReturn_t (*)(const char *, nvmlDevice_t *))          \
    X(index, nvmlDeviceGetIndex, nvmlReturn_t (*)(nvmlDevice_t, unsigned int *))                   \
    X(retired_pending, nvmlDeviceGetRetiredPagesPendingStatus,                                     \
      nvmlReturn_t (*)(nvmlDevice_t, nvmlEnableState_t *))                                         \
    X(remapped, nvmlDeviceGetRemappedRows,                                                         \
      nvmlReturn_t (*)(nvmlDevice_t, unsigned int *, unsigned int *, unsigned int *,               \
                       unsigned int *))                                                            \
    X(ecc, nvmlDeviceGetTotalEccErrors,                                                            \
      nvmlReturn_t (*)(nvmlDevice_t, nvmlMemoryErrorType_t, nvmlEccCounterType_t,                  \
                       unsigned long long *))                                                      \
    X(nvlink, nvmlDeviceGetNvLinkState,                                                            \
      nvmlReturn_t (*)(nvmlDevice_t, unsigned int, nvmlEnableState_t *))                           \
    X(reasons, nvmlDeviceGetCurrentClocksEventReasons,                                             \
      nvmlReturn_t (*)(nvmlDevice_t, unsigned long long *))                                        \
    X(reasons_old, nvmlDeviceGetCurrentClocksThrottleReasons,                                      \
      nvmlReturn_t (*)(nvmlDevice_t, unsigned long long *))                                        \
    X(mig_mode, nvmlDeviceGetMigMode,                                                              \
      nvmlReturn_t (*)(nvmlDevice_t, unsigned int *, unsigned int *))                              \
    X(mig_max, nvmlDeviceGetMaxMigDeviceCount, nvmlReturn_t (*)(nvmlDevice_t, unsigned int *))     \
    X(mig_by_index, nvmlDeviceGetMigDeviceHandleByIndex,                                           \
      nvmlReturn_t (*)(nvmlDevice_t, unsigned int, nvmlDevice_t *))                                \
    X(mig_parent, nvmlDeviceGetDeviceHandleFromMigDeviceHandle,                                    \
      nvmlReturn_t (*)(nvmlDevice_t, nvmlDevice_t *))                                              \
    X(gi_id, nvmlDeviceGetGpuInstanceId, nvmlReturn_t (*)(nvmlDevice_t, unsigned int *))           \
    X(ci_id, nvmlDeviceGetComputeInstanceId, nvmlReturn_t (*)(nvmlDevice_t, unsigned int *))       \
    X(util, nvmlDeviceGetUtilizationRates, nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t *))    \
    X(mem, nvmlDeviceGetMemoryInfo, nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t *))                \
    X(temp, nvmlDeviceGetTemperature,                                                              \
      nvmlReturn_t (*)(nvmlDevice_t, nvmlTemperatureSensors_t, unsigned int *))                    \
    X(power, nvmlDeviceGetPowerUsage, nvmlReturn_t (*)(nvmlDevice_t, unsigned int *))              \
    X(ev_create, nvmlEventSetCreate, nvmlReturn_t (*)(nvmlEventSet_t *))                           \
    X(ev_register, nvmlDeviceRegisterEvents,                                                       \
      nvmlReturn_t (*)(nvmlDevice_t, unsigned long long, nvmlEventSet_t))                          \
    X(ev_wait, nvmlEventSetWait_v2,                                                                \
      nvmlReturn_t (*)(nvmlEventSet_t, nvmlEventData_t *, unsigned int))

#define PROTO(field, fn, ...)                                                                      \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&fn), __VA_ARGS__), #fn);
FUNCTIONS(PROTO)

int main(void) {
    static const struct {
        const char *sym;
        size_t off;
    } want[] = {
#define ROW(field, fn, ...) {#fn, offsetof(gl_nvml_fns, field)},
        FUNCTIONS(ROW)};
    int bad = sizeof want / sizeof want[0] != sizeof fns / sizeof fns[0];
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        size_t k = 0;
        while (k < sizeof want / sizeof want[0] && want[k].off != fns[i].off)
            k++;
        if (k == sizeof want / sizeof want[0] || strcmp(want[k].sym, fns[i].sym) != 0) {
            fprintf(stderr, "nvml_abi_check: gl_nvml.c looks up %s, not checked against nvml.h\n",
                    fns[i].sym);
            bad = 1;
        }
    }
    if (!bad)
        printf("nvml_abi_check: gl_nvml.c's NVML ABI matches nvml.h (%zu functions)\n",
               sizeof fns / sizeof fns[0]);
    return bad;
}
