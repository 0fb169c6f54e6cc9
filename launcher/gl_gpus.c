/* The GPUs this node exposes to the launcher: CUDA_VISIBLE_DEVICES or
 * NVIDIA_VISIBLE_DEVICES (indices, GPU or MIG UUIDs) when set, else what the
 * CUDA driver reports. A MIG instance or a time-sliced replica counts as one. */
#include <stdlib.h>
#include <string.h>

#include "gpulaunch/gpulaunch.h"

int gpl_visible_gpu_count(void);

static int count_list(const char *s) {
    if (strcmp(s, "none") == 0 || strcmp(s, "void") == 0 || *s == '\0')
        return 0;
    int n = 1;
    for (; *s; s++)
        if (*s == ',')
            n++;
    return n;
}

int gpl_visible_gpu_count(void) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v)
        return count_list(v);
    v = getenv("NVIDIA_VISIBLE_DEVICES");
    if (v && strcmp(v, "all") != 0)
        return count_list(v);
    return gpl_cuda_device_count();
}
