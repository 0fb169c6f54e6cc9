/* The CUDA side of the runtime: device discovery. Compiled in every build;
 * without CUDA it reports no devices. */
#include "gpulaunch/gpulaunch.h"

#ifdef GPL_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

int gpl_have_nccl(void) {
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess && v > 0;
}

int gpl_cuda_device_count(void) {
    int n = 0;
    /* No driver (cudaErrorInsufficientDriver) or no device means zero GPUs. */
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}
#else
int gpl_have_nccl(void) { return 0; }
int gpl_cuda_device_count(void) { return 0; }
#endif
