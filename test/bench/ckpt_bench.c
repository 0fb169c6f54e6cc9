/* ckpt_bench: what a checkpoint costs a training job (docs/performance.md).
 * Run under gpulaunch, e.g. 2 workers on one node:
 *
 *   gpulaunch --standalone --nproc-per-node 2 ckpt_bench --state-mib 1024 \
 *       --mode async --every 20 --steps 100 --step-ms 50 --dir /nvme/ck
 *
 * Each rank holds --state-mib MiB of state (as a model's parameters and
 * optimizer state are) and runs --steps steps of --step-ms each (a sleep: the
 * GPU's share of a step, during which the CPU is free) that change the state;
 * every --every steps it checkpoints the whole state:
 *   async   gpulaunch's asynchronous save (the stall: the copy into the staging buffer)
 *   sync    gpulaunch's save, waited for until written (fsync'd, hashed)
 *   none    no checkpoint: the throughput to compare with
 * --durable DIR|s3://... drains the checkpoints there too.
 * Before the run each rank times a memcpy of the same bytes into a warm
 * buffer: the floor of any save that copies the state.
 *
 * Rank 0 prints one line (the worst rank's figures, from all-reduces):
 *   ckpt_bench mode=async state_mib=1024 saves=5 first_stall_s=... stall_s=...
 *   stall_max_s=... memcpy_s=... stall_over_memcpy=... steps_per_s=...
 * stall_s: the median over the saves after the first (whose staging buffer
 * is new: page faults); steps_per_s over the whole run. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpulaunch/gpulaunch.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct state {
    uint8_t *p;
    size_t n;
} state;

static gpl_result_t save(gpl_ckpt_t ck, int64_t step, double left, void *user) {
    state *s = user;
    return gpl_ckpt_write(ck, "state", s->p, s->n);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    long mib = 64, steps = 50, every = 10, step_ms = 20;
    const char *mode = "async", *dir = "/tmp/ckpt_bench", *durable = NULL;
    int known = 1; /* --state-size-known 0: no state_bytes at setup */
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (strcmp(a, "--state-mib") == 0)
            mib = strtol(v, NULL, 10);
        else if (strcmp(a, "--steps") == 0)
            steps = strtol(v, NULL, 10);
        else if (strcmp(a, "--every") == 0)
            every = strtol(v, NULL, 10);
        else if (strcmp(a, "--step-ms") == 0)
            step_ms = strtol(v, NULL, 10);
        else if (strcmp(a, "--mode") == 0)
            mode = v;
        else if (strcmp(a, "--dir") == 0)
            dir = v;
        else if (strcmp(a, "--durable") == 0)
            durable = v;
        else if (strcmp(a, "--state-size-known") == 0)
            known = strcmp(v, "0") != 0;
        else {
            fprintf(stderr, "ckpt_bench: unknown option %s\n", a);
            return 2;
        }
    }
    int async = strcmp(mode, "async") == 0, sync = strcmp(mode, "sync") == 0;
    if (!async && !sync && strcmp(mode, "none") != 0) {
        fprintf(stderr, "ckpt_bench: --mode async, sync or none\n");
        return 2;
    }
    gpl_comm_t c = NULL;
    if (gpl_init(NULL, &c) != GPL_OK) {
        fprintf(stderr, "ckpt_bench: %s\n", gpl_last_error(c));
        return 1;
    }
    state s = {NULL, (size_t)mib << 20};
    s.p = malloc(s.n);
    uint8_t *floor_buf = malloc(s.n);
    if (s.p == NULL || floor_buf == NULL) {
        fprintf(stderr, "ckpt_bench: no memory for %ld MiB twice\n", mib);
        return 1;
    }
    for (size_t i = 0; i < s.n; i++)
        s.p[i] = (uint8_t)(i * 131 + (size_t)gpl_rank(c));
    memcpy(floor_buf, s.p, s.n); /* faults the floor's pages in */
    __asm__ volatile("" : : "r"(floor_buf) : "memory");
    double t = now_s();
    memcpy(floor_buf, s.p, s.n);
    __asm__ volatile("" : : "r"(floor_buf) : "memory"); /* the copy is not optimised away */
    double memcpy_s = now_s() - t;
    free(floor_buf);

    if (async || sync) {
        gpl_ckpt_options o = GPL_CKPT_OPTIONS_INIT;
        o.dir = dir;
        o.durable = durable;
        o.every_steps = every;
        o.async_save = async;
        o.keep = 2;
        o.state_bytes = known ? s.n : 0;
        if (gpl_ckpt_setup(c, &o, save, NULL, &s) != GPL_OK) {
            fprintf(stderr, "ckpt_bench: %s\n", gpl_last_error(c));
            return 1;
        }
    }
    double *stalls = calloc((size_t)(steps / (every > 0 ? every : 1) + 2), sizeof *stalls);
    int nsaves = 0;
    gpl_barrier(c);
    double t0 = now_s();
    for (long step = 0; step < steps; step++) {
        struct timespec ts = {step_ms / 1000, (step_ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
        for (size_t i = (size_t)step * 4096 % 65536; i < s.n; i += 65536)
            s.p[i]++; /* the update: the state changes every step */
        double a = now_s();
        gpl_result_t rc = async || sync ? gpl_step_end(c, step + 1) : GPL_OK;
        double b = now_s() - a;
        if (rc != GPL_OK) {
            fprintf(stderr, "ckpt_bench: %s\n", gpl_last_error(c));
            return 1;
        }
        if ((async || sync) && every > 0 && (step + 1) % every == 0)
            stalls[nsaves++] = b;
    }
    double run_s = now_s() - t0;
    if (async || sync)
        gpl_ckpt_wait(c); /* not timed: the run's last save, made complete */
    double first = nsaves ? stalls[0] : 0, med = 0, mx = 0;
    if (nsaves > 1) {
        qsort(stalls + 1, (size_t)nsaves - 1, sizeof *stalls, cmp_double);
        med = stalls[1 + (nsaves - 1) / 2];
        mx = stalls[nsaves - 1];
    } else {
        med = mx = first;
    }
    double v[5] = {first, med, mx, memcpy_s, run_s};
    gpl_allreduce(c, v, v, 5, GPL_FLOAT64, GPL_MAX, NULL);
    if (gpl_rank(c) == 0)
        printf("ckpt_bench mode=%s state_mib=%ld ranks=%d saves=%d first_stall_s=%.4f "
               "stall_s=%.4f stall_max_s=%.4f memcpy_s=%.4f stall_over_memcpy=%.2f "
               "steps_per_s=%.3f\n",
               mode, mib, gpl_world_size(c), nsaves, v[0], v[1], v[2], v[3],
               v[3] > 0 ? v[1] / v[3] : 0, (double)steps / v[4]);
    free(stalls);
    free(s.p);
    gpl_finalize(c);
    return 0;
}
