/* allreduce_bench: all-reduce bandwidth in the style of nccl-tests, run
 * under gpulaunch:
 *
 *   gpulaunch --standalone --nproc-per-node 2 allreduce_bench -b 4K -e 256M -f 4 \
 *       -n 20 -w 5 -c 1 -d float --backend cpu
 *
 * Rank 0 prints one row per size:
 *   size_bytes count dtype time_us algbw_gbs busbw_gbs check
 * (in place; algbw = bytes / time, busbw = algbw * 2(n-1)/n; GB = 1e9 B).
 * --dp-resnet50 times a gradient sync of a ResNet-50-shaped list (161
 * tensors, 25.6 M floats) against one fused all-reduce of the same bytes.
 * On the NCCL backend every row is followed by a comment line with the same
 * all-reduce through ncclAllReduce directly, on a communicator of the
 * bench's own: launched back to back and synchronized once (as nccl-tests
 * time it), and synchronized after each call (as a blocking call is). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpulaunch/gpulaunch.h"

#ifdef GPL_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

static double now_s(void);

#ifdef GPL_HAVE_CUDA
static ncclComm_t raw_comm;
static cudaStream_t raw_stream;

/* Rank 0's unique id reaches the others through the runtime's broadcast (a
 * host buffer: the CPU path). Returns 0 when the raw communicator is up. */
static int raw_init(gpl_comm_t c) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    int32_t ok = gpl_rank(c) != 0 || ncclGetUniqueId(&id) == ncclSuccess;
    if (gpl_broadcast(c, &ok, 1, GPL_INT32, 0, NULL) != GPL_OK || !ok ||
        gpl_broadcast(c, &id, sizeof id / 4, GPL_INT32, 0, NULL) != GPL_OK)
        return -1;
    if (cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking) != cudaSuccess)
        return -1;
    return ncclCommInitRank(&raw_comm, gpl_world_size(c), id, gpl_rank(c)) == ncclSuccess ? 0 : -1;
}

/* The bench sees only the public API, so it maps dtypes for itself. */
static const ncclDataType_t raw_types[GPL_DTYPE_COUNT] = {
    [GPL_FLOAT32] = ncclFloat32,   [GPL_FLOAT64] = ncclFloat64, [GPL_FLOAT16] = ncclFloat16,
    [GPL_BFLOAT16] = ncclBfloat16, [GPL_INT32] = ncclInt32,     [GPL_INT64] = ncclInt64};

/* Microseconds per ncclAllReduce (in place, sum), -1 on an NCCL error. */
static double raw_time(gpl_comm_t c, void *buf, size_t count, gpl_dtype_t t, int iters, int warmup,
                       int sync_each) {
    for (int i = 0; i < warmup; i++)
        if (ncclAllReduce(buf, buf, count, raw_types[t], ncclSum, raw_comm, raw_stream) !=
                ncclSuccess ||
            cudaStreamSynchronize(raw_stream) != cudaSuccess)
            return -1;
    gpl_barrier(c);
    double t0 = now_s();
    for (int i = 0; i < iters; i++) {
        if (ncclAllReduce(buf, buf, count, raw_types[t], ncclSum, raw_comm, raw_stream) !=
            ncclSuccess)
            return -1;
        if (sync_each)
            cudaStreamSynchronize(raw_stream);
    }
    cudaStreamSynchronize(raw_stream);
    return (now_s() - t0) / iters * 1e6;
}
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long long parse_size(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -1;
    switch (*end) {
    case 'K':
    case 'k':
        v *= 1024;
        end++;
        break;
    case 'M':
    case 'm':
        v *= 1024 * 1024;
        end++;
        break;
    case 'G':
    case 'g':
        v *= 1024.0 * 1024 * 1024;
        end++;
        break;
    default:
        break;
    }
    return *end ? -1 : (long long)v;
}

static const struct {
    const char *name;
    gpl_dtype_t t;
} dtypes[] = {{"float", GPL_FLOAT32},     {"double", GPL_FLOAT64}, {"half", GPL_FLOAT16},
              {"bfloat16", GPL_BFLOAT16}, {"int32", GPL_INT32},    {"int64", GPL_INT64}};

static int on_device;

static void *buf_alloc(size_t bytes) {
#ifdef GPL_HAVE_CUDA
    if (on_device) {
        void *p = NULL;
        return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
    }
#endif
    return calloc(1, bytes ? bytes : 1);
}

static void buf_free(void *p) {
#ifdef GPL_HAVE_CUDA
    if (on_device) {
        cudaFree(p);
        return;
    }
#endif
    free(p);
}

static void buf_put(void *dev, const void *host, size_t bytes) {
#ifdef GPL_HAVE_CUDA
    if (on_device) {
        cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
        return;
    }
#endif
    memcpy(dev, host, bytes);
}

static void buf_get(void *host, const void *dev, size_t bytes) {
#ifdef GPL_HAVE_CUDA
    if (on_device) {
        cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
        return;
    }
#endif
    memcpy(host, dev, bytes);
}

/* Small integers are exact in every dtype: rank r contributes (i % 7) + r. */
static void fill(void *h, size_t count, gpl_dtype_t t, int rank) {
    for (size_t i = 0; i < count; i++) {
        double v = (double)(i % 7) + rank;
        switch (t) {
        case GPL_FLOAT32:
            ((float *)h)[i] = (float)v;
            break;
        case GPL_FLOAT64:
            ((double *)h)[i] = v;
            break;
        case GPL_INT32:
            ((int32_t *)h)[i] = (int32_t)v;
            break;
        case GPL_INT64:
            ((int64_t *)h)[i] = (int64_t)v;
            break;
        case GPL_FLOAT16: { /* small integers: exact halves */
            float f = (float)v;
            uint32_t x;
            memcpy(&x, &f, 4);
            ((uint16_t *)h)[i] =
                f == 0 ? 0 : (uint16_t)(((((x >> 23) & 0xff) - 112) << 10) | ((x >> 13) & 0x3ff));
            break;
        }
        case GPL_BFLOAT16: {
            float f = (float)v;
            uint32_t x;
            memcpy(&x, &f, 4);
            ((uint16_t *)h)[i] = (uint16_t)(x >> 16);
            break;
        }
        default:
            break;
        }
    }
}

static double get(const void *h, size_t i, gpl_dtype_t t) {
    switch (t) {
    case GPL_FLOAT32:
        return ((const float *)h)[i];
    case GPL_FLOAT64:
        return ((const double *)h)[i];
    case GPL_INT32:
        return ((const int32_t *)h)[i];
    case GPL_INT64:
        return (double)((const int64_t *)h)[i];
    case GPL_FLOAT16: {
        uint16_t x = ((const uint16_t *)h)[i];
        int e = (x >> 10) & 0x1f, m = x & 0x3ff;
        return e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    }
    case GPL_BFLOAT16: {
        uint32_t x = (uint32_t)((const uint16_t *)h)[i] << 16;
        float f;
        memcpy(&f, &x, 4);
        return f;
    }
    default:
        return 0;
    }
}

/* One gradient sync of the list per step, best of iters: with each gradient
 * in its own allocation (copied into and out of the buckets) or all of them
 * back to back in one (reduced in place). */
static double dp_time(gpl_comm_t c, float **g, const size_t *counts, int nt, int iters,
                      int *in_place) {
    gpl_dp_t dp;
    int *idx = malloc((size_t)nt * sizeof *idx);
    if (idx == NULL || gpl_dp_create(c, NULL, &dp) != GPL_OK) {
        free(idx);
        return -1;
    }
    for (int i = 0; i < nt; i++)
        gpl_dp_register(dp, g[i], counts[i], GPL_FLOAT32, &idx[i]);
    int nb = 0;
    gpl_dp_info(dp, &nb, in_place);
    double best = 1e9;
    for (int it = 0; it < iters + 2; it++) {
        gpl_barrier(c);
        double t0 = now_s();
        for (int i = nt - 1; i >= 0; i--)
            gpl_dp_ready(dp, idx[i]);
        if (gpl_dp_wait(dp) != GPL_OK) {
            fprintf(stderr, "dp: %s\n", gpl_last_error(c));
            best = -1;
            break;
        }
        double t = now_s() - t0;
        if (it >= 2 && t < best)
            best = t;
    }
    gpl_dp_destroy(dp);
    free(idx);
    return best;
}

static int dp_resnet50(gpl_comm_t c, int iters) {
    /* 161 tensors, 25,557,032 floats: conv weights of growing size, small
     * batch-norm vectors, and the 2048x1000 classifier */
    enum { NT = 161 };
    size_t counts[NT], total = 0;
    for (int i = 0; i < NT; i++) {
        if (i % 3 == 2)
            counts[i] = (size_t)(64 << (i * 3 / NT)); /* batch norm */
        else
            counts[i] = (size_t)(9 * 64 * 64) << (i * 4 / NT);
        total += counts[i];
    }
    counts[NT - 1] = 2048 * 1000 + 1000;
    total = 0;
    for (int i = 0; i < NT; i++)
        total += counts[i];
    /* scale the conv tensors so that the total is ResNet-50's 25.6 M */
    double scale = (25557032.0 - (double)counts[NT - 1]) / (double)(total - counts[NT - 1]);
    total = 0;
    for (int i = 0; i < NT - 1; i++) {
        counts[i] = (size_t)((double)counts[i] * scale) + 1;
        total += counts[i];
    }
    total += counts[NT - 1];
    float *g[NT], *slice[NT];
    for (int i = 0; i < NT; i++)
        g[i] = buf_alloc(counts[i] * 4);
    float *arena = buf_alloc(total * 4);
    size_t off = 0;
    for (int i = 0; i < NT; i++) {
        slice[i] = arena + off;
        off += counts[i];
    }
    int sep_in_place = 0, arena_in_place = 0;
    double t_sep = dp_time(c, g, counts, NT, iters, &sep_in_place);
    double t_arena = dp_time(c, slice, counts, NT, iters, &arena_in_place);
    double best_fused = 1e9;
    for (int it = 0; it < iters + 2 && t_sep > 0 && t_arena > 0; it++) {
        gpl_barrier(c);
        double t0 = now_s();
        if (gpl_allreduce(c, arena, arena, total, GPL_FLOAT32, GPL_AVG, NULL) != GPL_OK)
            return 1;
        double t = now_s() - t0;
        if (it >= 2 && t < best_fused)
            best_fused = t;
    }
    if (t_sep < 0 || t_arena < 0)
        return 1;
    if (gpl_rank(c) == 0) {
        printf("allreduce_bench resnet50_grad_sync tensors=%d floats=%zu ranks=%d "
               "layout=separate buckets_in_place=%d grad_sync_ms=%.2f fused_allreduce_ms=%.2f "
               "overhead_pct=%.1f\n",
               NT, total, gpl_world_size(c), sep_in_place, t_sep * 1e3, best_fused * 1e3,
               (t_sep / best_fused - 1) * 100);
        printf("allreduce_bench resnet50_grad_sync tensors=%d floats=%zu ranks=%d "
               "layout=one_allocation buckets_in_place=%d grad_sync_ms=%.2f "
               "fused_allreduce_ms=%.2f overhead_pct=%.1f\n",
               NT, total, gpl_world_size(c), arena_in_place, t_arena * 1e3, best_fused * 1e3,
               (t_arena / best_fused - 1) * 100);
    }
    for (int i = 0; i < NT; i++)
        buf_free(g[i]);
    buf_free(arena);
    return 0;
}

int main(int argc, char **argv) {
    long long minb = 8, maxb = 64 << 20, factor = 2;
    int iters = 20, warmup = 5, check = 1, resnet = 0;
    gpl_dtype_t dtype = GPL_FLOAT32;
    const char *dname = "float";
    gpl_backend_t backend = GPL_BACKEND_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--dp-resnet50") == 0) {
            resnet = 1;
            continue;
        }
        if (v == NULL)
            goto usage;
        i++;
        if (strcmp(a, "-b") == 0)
            minb = parse_size(v);
        else if (strcmp(a, "-e") == 0)
            maxb = parse_size(v);
        else if (strcmp(a, "-f") == 0)
            factor = parse_size(v);
        else if (strcmp(a, "-n") == 0)
            iters = (int)parse_size(v);
        else if (strcmp(a, "-w") == 0)
            warmup = (int)parse_size(v);
        else if (strcmp(a, "-c") == 0)
            check = (int)parse_size(v);
        else if (strcmp(a, "-d") == 0) {
            int found = 0;
            for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++)
                if (strcmp(v, dtypes[k].name) == 0) {
                    dtype = dtypes[k].t;
                    dname = dtypes[k].name;
                    found = 1;
                }
            if (!found)
                goto usage;
        } else if (strcmp(a, "--backend") == 0) {
            if (strcmp(v, "cpu") == 0)
                backend = GPL_BACKEND_CPU;
            else if (strcmp(v, "nccl") == 0)
                backend = GPL_BACKEND_NCCL;
            else
                goto usage;
        } else
            goto usage;
    }
    if (minb < 0 || maxb < minb || factor < 2 || iters < 1 || warmup < 0)
        goto usage;
    gpl_options o = GPL_OPTIONS_INIT;
    o.backend = backend;
    gpl_comm_t c;
    if (gpl_init(&o, &c) != GPL_OK) {
        fprintf(stderr, "allreduce_bench: %s\n", gpl_last_error(c));
        return 1;
    }
    on_device = gpl_backend(c) == GPL_BACKEND_NCCL;
    int rank = gpl_rank(c), n = gpl_world_size(c);
    if (resnet) {
        int rc = dp_resnet50(c, iters);
        gpl_finalize(c);
        return rc;
    }
    size_t es = gpl_dtype_size(dtype);
    void *buf = buf_alloc((size_t)maxb);
    void *host = malloc((size_t)maxb + 16);
    /* touch every page now, not inside the timed loops */
    memset(host, 0, (size_t)maxb + 16);
    buf_put(buf, host, (size_t)maxb);
    if (rank == 0) {
        printf("# allreduce_bench: %d ranks, backend %s, dtype %s, op sum, in place, %d iters, "
               "%d warm-up\n",
               n, on_device ? "nccl" : "cpu", dname, iters, warmup);
        printf("%12s %12s %8s %12s %10s %10s %6s\n", "size_bytes", "count", "dtype", "time_us",
               "algbw_gbs", "busbw_gbs", "check");
    }
    int bad = 0, raw = 0;
#ifdef GPL_HAVE_CUDA
    raw = on_device && raw_init(c) == 0;
    if (on_device && !raw && rank == 0)
        printf("# no raw NCCL baseline: its communicator did not start\n");
#endif
    for (long long bytes = minb; bytes <= maxb; bytes *= factor) {
        size_t count = (size_t)bytes / es;
        for (int i = 0; i < warmup; i++)
            gpl_allreduce(c, buf, buf, count, dtype, GPL_SUM, NULL);
        gpl_barrier(c);
        double t0 = now_s();
        for (int i = 0; i < iters; i++)
            if (gpl_allreduce(c, buf, buf, count, dtype, GPL_SUM, NULL) != GPL_OK) {
                fprintf(stderr, "allreduce_bench rank %d: %s\n", rank, gpl_last_error(c));
                return 1;
            }
#ifdef GPL_HAVE_CUDA
        if (on_device)
            cudaDeviceSynchronize();
#endif
        double us = (now_s() - t0) / iters * 1e6;
        const char *ok = "-";
        if (check) {
            fill(host, count, dtype, rank);
            buf_put(buf, host, count * es);
            gpl_allreduce(c, buf, buf, count, dtype, GPL_SUM, NULL);
            buf_get(host, buf, count * es);
            ok = "ok";
            for (size_t i = 0; i < count; i++) {
                double want = (double)(i % 7) * n + (double)n * (n - 1) / 2;
                if (get(host, i, dtype) != want) {
                    ok = "FAIL";
                    bad = 1;
                    break;
                }
            }
        }
        double algbw = (double)count * (double)es / (us / 1e6) / 1e9;
        if (rank == 0)
            printf("%12lld %12zu %8s %12.2f %10.3f %10.3f %6s\n", (long long)(count * es), count,
                   dname, us, algbw, algbw * 2.0 * (n - 1) / n, ok);
#ifdef GPL_HAVE_CUDA
        if (raw) {
            double b2b = raw_time(c, buf, count, dtype, iters, warmup, 0);
            double each = raw_time(c, buf, count, dtype, iters, warmup, 1);
            if (rank == 0)
                printf("# raw ncclAllReduce %lld bytes: back to back %.2f us (gpulaunch %+.1f %%), "
                       "synchronized each %.2f us (gpulaunch %+.1f %%)\n",
                       (long long)(count * es), b2b, (us / b2b - 1) * 100, each,
                       (us / each - 1) * 100);
        }
#endif
        fflush(stdout);
    }
    buf_free(buf);
    free(host);
#ifdef GPL_HAVE_CUDA
    if (raw) {
        ncclCommDestroy(raw_comm);
        cudaStreamDestroy(raw_stream);
    }
#endif
    gpl_finalize(c);
    return bad;
usage:
    fprintf(stderr, "usage: allreduce_bench [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] "
                    "[-c 0|1] [-d float|double|half|bfloat16|int32|int64] [--backend cpu|nccl] "
                    "[--dp-resnet50]\n");
    return 2;
}
