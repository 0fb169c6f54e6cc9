/* gpulaunch runtime: the C library that training code links for
 * data-parallel gradient sync (NCCL on GPUs, a CPU backend everywhere).
 * One prefix (gpl_), opaque handles, versioned options. */
#ifndef GPULAUNCH_GPULAUNCH_H
#define GPULAUNCH_GPULAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include "gpulaunch/gpl_error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GPL_VERSION_MAJOR 0
#define GPL_VERSION_MINOR 1
#define GPL_VERSION_PATCH 0
#define GPL_VERSION_CODE (GPL_VERSION_MAJOR * 10000 + GPL_VERSION_MINOR * 100 + GPL_VERSION_PATCH)

/* The library's version as GPL_VERSION_CODE, for comparing with the header's. */
GPL_API int gpl_version(void);

/* Whether this build has the NCCL backend, and how many CUDA devices the
 * process sees (0 without a driver or a device: that is not an error). */
GPL_API int gpl_have_nccl(void);
GPL_API int gpl_cuda_device_count(void);

#ifdef __cplusplus
}
#endif
#endif
