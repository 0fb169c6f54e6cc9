/* The GPUs this node exposes to the launcher: CUDA_VISIBLE_DEVICES or
 * NVIDIA_VISIBLE_DEVICES (indices, GPU or MIG UUIDs) when set, else the GPUs
 * the NVIDIA driver lists. A MIG instance or a time-sliced replica handed to
 * the container counts as one. The launcher does not load the CUDA runtime:
 * it would cost every start tens of milliseconds. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "gl_options.h"

static int count_list(const char *s) {
    if (strcmp(s, "none") == 0 || strcmp(s, "void") == 0 || *s == '\0')
        return 0;
    int n = 1;
    for (; *s; s++)
        if (*s == ',')
            n++;
    return n;
}

/* /proc/driver/nvidia/gpus/<bus id>, one per GPU; else /dev/nvidia<N>. */
static int driver_gpus(void) {
    int n = 0;
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    struct dirent *e;
    if (d) {
        while ((e = readdir(d)) != NULL)
            if (e->d_name[0] != '.')
                n++;
        closedir(d);
        return n;
    }
    d = opendir("/dev");
    if (d == NULL)
        return 0;
    while ((e = readdir(d)) != NULL) {
        const char *s = e->d_name;
        if (strncmp(s, "nvidia", 6) == 0 && s[6] >= '0' && s[6] <= '9' &&
            strspn(s + 6, "0123456789") == strlen(s + 6))
            n++;
    }
    closedir(d);
    return n;
}

int gpl_visible_gpu_count(void) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v)
        return count_list(v);
    v = getenv("NVIDIA_VISIBLE_DEVICES");
    if (v && strcmp(v, "all") != 0)
        return count_list(v);
    return driver_gpus();
}
