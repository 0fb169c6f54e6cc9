/* The runtime library's version and device discovery. */
#include <criterion/criterion.h>

#include "gpulaunch/gpulaunch.h"

Test(runtime_info, version_matches_header) { cr_expect_eq(gpl_version(), GPL_VERSION_CODE); }

Test(runtime_info, no_gpu_is_zero_devices_not_a_crash) {
    int n = gpl_cuda_device_count();
    cr_expect_geq(n, 0);
    if (!gpl_have_nccl())
        cr_expect_eq(n, 0, "a build without NCCL reports no devices");
}
