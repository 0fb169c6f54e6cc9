/* The NCCL backend on a real GPU (world size 1: one GPU per machine here).
 * Built when CUDA and NCCL are found; every test skips, saying so, on a
 * machine without a GPU. */
#include <criterion/criterion.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpulaunch/gpulaunch.h"

static gpl_comm_t comm;

static void need_gpu(void) {
    if (gpl_cuda_device_count() == 0)
        cr_skip_test("no GPU on this machine: NCCL tests skipped (run scripts/gpu_check.sh on a "
                     "GPU machine)");
    unsetenv("WORLD_SIZE");
    unsetenv("RANK");
    gpl_options o = GPL_OPTIONS_INIT;
    o.backend = GPL_BACKEND_NCCL;
    cr_assert_eq(gpl_init(&o, &comm), GPL_OK, "%s", gpl_last_error(comm));
    cr_assert_eq(gpl_backend(comm), GPL_BACKEND_NCCL);
}

static void done(void) {
    gpl_finalize(comm);
    comm = NULL;
}

TestSuite(nccl, .init = need_gpu, .fini = done, .timeout = 120);

Test(nccl, allreduce_every_dtype_on_device) {
    static const gpl_dtype_t types[] = {GPL_FLOAT32, GPL_FLOAT64, GPL_INT32, GPL_INT64};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        size_t n = 1000003, es = gpl_dtype_size(types[k]);
        uint8_t *h = malloc(n * es), *back = malloc(n * es);
        for (size_t i = 0; i < n * es; i++)
            h[i] = (uint8_t)(i * 31);
        void *d;
        cr_assert_eq(cudaMalloc(&d, n * es), cudaSuccess);
        cudaMemcpy(d, h, n * es, cudaMemcpyHostToDevice);
        cr_assert_eq(gpl_allreduce(comm, d, d, n, types[k], GPL_SUM, NULL), GPL_OK, "%s",
                     gpl_last_error(comm));
        cudaMemcpy(back, d, n * es, cudaMemcpyDeviceToHost);
        cr_expect_eq(memcmp(h, back, n * es), 0, "a world of one sums to itself (dtype %d)",
                     (int)types[k]);
        cudaFree(d);
        free(h);
        free(back);
    }
}

Test(nccl, gradient_buckets_on_device) {
    gpl_dp_t dp;
    cr_assert_eq(gpl_dp_create(comm, NULL, &dp), GPL_OK);
    float *d[3];
    size_t counts[3] = {1000, 300000, 7};
    int idx[3];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(cudaMalloc((void **)&d[i], counts[i] * 4), cudaSuccess);
        float *h = malloc(counts[i] * 4);
        for (size_t k = 0; k < counts[i]; k++)
            h[k] = (float)(k % 13) * 0.5f;
        cudaMemcpy(d[i], h, counts[i] * 4, cudaMemcpyHostToDevice);
        free(h);
        gpl_dp_register(dp, d[i], counts[i], GPL_FLOAT32, &idx[i]);
    }
    for (int i = 2; i >= 0; i--)
        cr_assert_eq(gpl_dp_ready(dp, idx[i]), GPL_OK, "%s", gpl_last_error(comm));
    cr_assert_eq(gpl_dp_wait(dp), GPL_OK, "%s", gpl_last_error(comm));
    float *h = malloc(counts[1] * 4);
    cudaMemcpy(h, d[1], counts[1] * 4, cudaMemcpyDeviceToHost);
    for (size_t k = 0; k < counts[1]; k++)
        cr_assert_float_eq(h[k], (float)(k % 13) * 0.5f, 1e-6);
    free(h);
    gpl_dp_destroy(dp);
    for (int i = 0; i < 3; i++)
        cudaFree(d[i]);
}

/* Gradients back to back in one device allocation: every bucket is reduced
 * where it is, no device copies. */
Test(nccl, gradients_in_one_device_allocation_are_reduced_in_place) {
    gpl_dp_t dp;
    cr_assert_eq(gpl_dp_create(comm, NULL, &dp), GPL_OK);
    size_t counts[3] = {1000, 300000, 7}, total = 301007;
    float *arena, *h = malloc(total * 4);
    cr_assert_eq(cudaMalloc((void **)&arena, total * 4), cudaSuccess);
    for (size_t k = 0; k < total; k++)
        h[k] = (float)(k % 13) * 0.5f;
    cudaMemcpy(arena, h, total * 4, cudaMemcpyHostToDevice);
    int idx[3];
    for (int i = 0, off = 0; i < 3; off += (int)counts[i], i++)
        gpl_dp_register(dp, arena + off, counts[i], GPL_FLOAT32, &idx[i]);
    int nb = 0, in_place = 0;
    cr_assert_eq(gpl_dp_info(dp, &nb, &in_place), GPL_OK);
    cr_expect_eq(in_place, nb, "%d of %d buckets in place", in_place, nb);
    for (int step = 0; step < 2; step++) {
        for (int i = 2; i >= 0; i--)
            cr_assert_eq(gpl_dp_ready(dp, idx[i]), GPL_OK, "%s", gpl_last_error(comm));
        cr_assert_eq(gpl_dp_wait(dp), GPL_OK, "%s", gpl_last_error(comm));
    }
    cudaMemcpy(h, arena, total * 4, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (size_t k = 0; k < total; k++)
        bad += h[k] != (float)(k % 13) * 0.5f;
    cr_expect_eq(bad, 0, "%d values changed by an average over one rank", bad);
    free(h);
    gpl_dp_destroy(dp);
    cudaFree(arena);
}

/* The example on the NCCL backend: with one rank, averaging on the GPU is
 * the identity, so its parameters are bitwise those of the CPU run. */
static int example_sha(const char *extra_env, const char *extra_arg, char sha[65]) {
    char cmd[1024], line[512];
    snprintf(cmd, sizeof cmd,
             "%s %s/launcher/gpulaunch --standalone --nproc-per-node 1 %s/examples/dp_train "
             "--steps 40 %s 2>&1",
             extra_env, GPL_BUILD_DIR, GPL_BUILD_DIR, extra_arg);
    FILE *f = popen(cmd, "r");
    if (f == NULL)
        return -1;
    sha[0] = 0;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "params_sha256 ");
        if (p)
            snprintf(sha, 65, "%.64s", p + 14);
        else if (strstr(line, "dp_train"))
            cr_log_warn("%s", line);
    }
    return pclose(f);
}

Test(nccl, the_example_on_the_gpu_matches_its_cpu_run, .timeout = 300) {
    char gpu[65], cpu[65];
    cr_assert_eq(example_sha("", "--device", gpu), 0, "dp_train --device failed");
    cr_assert_eq(example_sha("GPULAUNCH_BACKEND=cpu", "", cpu), 0, "dp_train on the CPU failed");
    cr_assert_eq(strlen(gpu), 64);
    cr_expect_str_eq(gpu, cpu);
}

Test(nccl, host_buffers_still_take_the_cpu_path) {
    float x[4] = {1, 2, 3, 4};
    cr_expect_eq(gpl_allreduce(comm, x, x, 4, GPL_FLOAT32, GPL_AVG, NULL), GPL_OK);
    cr_expect_float_eq(x[3], 4.0f, 1e-6);
}
