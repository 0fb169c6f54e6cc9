/* dp_train: data-parallel training of a small MLP on a synthetic regression
 * data set, with libgpulaunch's gradient sync. Every rank starts from the
 * same parameters (drawn from --seed), takes its shard of each global batch,
 * and after the averaged gradient step all ranks hold the same parameters.
 *
 *   gpulaunch --standalone --nproc-per-node 4 dp_train --steps 100
 *
 * With --device (built with CUDA) the same program averages its gradients on
 * the GPU through the NCCL backend; with one rank its parameters are bitwise
 * those of the CPU run.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpulaunch/gpulaunch.h"

#ifdef GPL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define IN 16

static gpl_comm_t ckpt_comm;
#define SAMPLES 4096

typedef struct model {
    int hidden;
    float *w1, *b1, *w2, *b2;     /* w1: hidden x IN, w2: hidden */
    float *gw1, *gb1, *gw2, *gb2; /* gradients, back to back in one allocation */
    size_t n_w1, n_b1, n_w2, n_b2;
    float *extra; /* --state-mib: state beside the parameters (as an optimizer's) */
    size_t n_extra;
} model;

static uint64_t ckpt_bytes_read; /* what this rank read from the checkpoint */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(splitmix(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* The data set: x uniform, y = a fixed nonlinear function of x plus noise. */
static void make_data(uint64_t seed, float *x, float *y) {
    uint64_t s = seed * 7919 + 1;
    float teacher[IN];
    for (int j = 0; j < IN; j++)
        teacher[j] = uniform(&s) * 2.0f;
    for (int i = 0; i < SAMPLES; i++) {
        float acc = 0;
        for (int j = 0; j < IN; j++) {
            x[i * IN + j] = uniform(&s);
            acc += sinf(teacher[j] * x[i * IN + j]);
        }
        y[i] = acc / 4.0f + 0.01f * uniform(&s);
    }
}

static int model_init(model *m, int hidden, uint64_t seed) {
    m->hidden = hidden;
    m->n_w1 = (size_t)hidden * IN;
    m->n_b1 = (size_t)hidden;
    m->n_w2 = (size_t)hidden;
    m->n_b2 = 1;
    float **p[4] = {&m->w1, &m->b1, &m->w2, &m->b2};
    size_t n[4] = {m->n_w1, m->n_b1, m->n_w2, m->n_b2};
    for (int i = 0; i < 4; i++) {
        *p[i] = calloc(n[i], sizeof(float));
        if (*p[i] == NULL)
            return -1;
    }
    /* One allocation for every gradient: gpl_dp then reduces them where they
     * are, with no copies through its buckets. */
    m->gw1 = calloc(n[0] + n[1] + n[2] + n[3], sizeof(float));
    if (m->gw1 == NULL)
        return -1;
    m->gb1 = m->gw1 + n[0];
    m->gw2 = m->gb1 + n[1];
    m->gb2 = m->gw2 + n[2];
    uint64_t s = seed * 104729 + 3;
    float scale1 = 1.0f / sqrtf((float)IN), scale2 = 1.0f / sqrtf((float)hidden);
    for (size_t i = 0; i < m->n_w1; i++)
        m->w1[i] = uniform(&s) * scale1;
    for (size_t i = 0; i < m->n_w2; i++)
        m->w2[i] = uniform(&s) * scale2;
    return 0;
}

static void model_free(model *m) {
    float *p[6] = {m->w1, m->b1, m->w2, m->b2, m->gw1, m->extra};
    for (int i = 0; i < 6; i++)
        free(p[i]);
}

/* --state-mib: the same start on every rank, then each step changes one
 * value by the (all-reduced) loss, so that the state moves with the steps. */
static int extra_init(model *m, long mib) {
    m->n_extra = (size_t)mib * (1u << 20) / sizeof(float);
    if (m->n_extra == 0)
        return 0;
    if ((m->extra = malloc(m->n_extra * sizeof(float))) == NULL)
        return -1;
    for (size_t i = 0; i < m->n_extra; i++)
        m->extra[i] = (float)(i % 1024) * 1e-3f;
    return 0;
}

static void extra_step(model *m, long step, float loss) {
    if (m->n_extra)
        m->extra[((size_t)step * 7919u) % m->n_extra] += loss;
}

/* Forward and backward over samples [lo, hi) of x; gradients are the mean
 * over those samples. Returns the mean squared error. */
static float forward_backward(model *m, const float *x, const float *y, const int *idx, int n) {
    int H = m->hidden;
    memset(m->gw1, 0, m->n_w1 * sizeof(float));
    memset(m->gb1, 0, m->n_b1 * sizeof(float));
    memset(m->gw2, 0, m->n_w2 * sizeof(float));
    m->gb2[0] = 0;
    float h[1024], loss = 0;
    for (int k = 0; k < n; k++) {
        const float *xi = x + (size_t)idx[k] * IN;
        float out = m->b2[0];
        for (int j = 0; j < H; j++) {
            float a = m->b1[j];
            for (int i = 0; i < IN; i++)
                a += m->w1[j * IN + i] * xi[i];
            h[j] = tanhf(a);
            out += m->w2[j] * h[j];
        }
        float d = out - y[idx[k]];
        loss += d * d;
        float dout = 2.0f * d / (float)n;
        m->gb2[0] += dout;
        for (int j = 0; j < H; j++) {
            m->gw2[j] += dout * h[j];
            float dh = dout * m->w2[j] * (1.0f - h[j] * h[j]);
            m->gb1[j] += dh;
            for (int i = 0; i < IN; i++)
                m->gw1[j * IN + i] += dh * xi[i];
        }
    }
    return loss / (float)n;
}

static void sgd(float *p, const float *g, size_t n, float lr) {
    for (size_t i = 0; i < n; i++)
        p[i] -= lr * g[i];
}

static void params_sha256(const model *m, char hex[65]) {
    unsigned char md[32];
    unsigned int len = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    EVP_DigestUpdate(ctx, m->w1, m->n_w1 * sizeof(float));
    EVP_DigestUpdate(ctx, m->b1, m->n_b1 * sizeof(float));
    EVP_DigestUpdate(ctx, m->w2, m->n_w2 * sizeof(float));
    EVP_DigestUpdate(ctx, m->b2, m->n_b2 * sizeof(float));
    if (m->n_extra)
        EVP_DigestUpdate(ctx, m->extra, m->n_extra * sizeof(float));
    EVP_DigestFinal_ex(ctx, md, &len);
    EVP_MD_CTX_free(ctx);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

/* Checkpoints: rank 0 writes the replicated parameters; every rank reads them
 * back, whatever the world size. */
static gpl_result_t save_cb(gpl_ckpt_t ck, int64_t step, double left, void *user) {
    model *m = user;
    if (gpl_rank(ckpt_comm) != 0)
        return GPL_OK;
    size_t n = m->n_w1 + m->n_b1 + m->n_w2 + m->n_b2;
    float *all = malloc(n * sizeof(float));
    if (all == NULL)
        return GPL_ERR_NOMEM;
    float *p = all;
    memcpy(p, m->w1, m->n_w1 * sizeof(float));
    p += m->n_w1;
    memcpy(p, m->b1, m->n_b1 * sizeof(float));
    p += m->n_b1;
    memcpy(p, m->w2, m->n_w2 * sizeof(float));
    p += m->n_w2;
    memcpy(p, m->b2, m->n_b2 * sizeof(float));
    gpl_result_t rc = gpl_ckpt_write(ck, "params", all, n * sizeof(float));
    free(all);
    if (rc == GPL_OK && m->n_extra)
        rc = gpl_ckpt_write(ck, "state", m->extra, m->n_extra * sizeof(float));
    return rc;
}

static gpl_result_t load_cb(gpl_ckpt_t ck, int64_t step, void *user) {
    model *m = user;
    size_t n = m->n_w1 + m->n_b1 + m->n_w2 + m->n_b2;
    float *all = malloc(n * sizeof(float));
    if (all == NULL)
        return GPL_ERR_NOMEM;
    gpl_result_t rc = gpl_ckpt_read(ck, "params", all, n * sizeof(float));
    if (rc == GPL_OK) {
        const float *p = all;
        memcpy(m->w1, p, m->n_w1 * sizeof(float));
        p += m->n_w1;
        memcpy(m->b1, p, m->n_b1 * sizeof(float));
        p += m->n_b1;
        memcpy(m->w2, p, m->n_w2 * sizeof(float));
        p += m->n_w2;
        memcpy(m->b2, p, m->n_b2 * sizeof(float));
        ckpt_bytes_read += n * sizeof(float);
    }
    free(all);
    if (rc == GPL_OK && m->n_extra) {
        rc = gpl_ckpt_read(ck, "state", m->extra, m->n_extra * sizeof(float));
        ckpt_bytes_read += rc == GPL_OK ? m->n_extra * sizeof(float) : 0;
    }
    return rc;
}

/* --device: n floats to the GPU (to_device) or back; nothing without a
 * device buffer. */
static int device_copy(float *dst, const float *src, size_t n, int to_device) {
    if (to_device ? dst == NULL : src == NULL)
        return 0;
#ifdef GPL_HAVE_CUDA
    cudaError_t e = cudaMemcpy(dst, src, n * sizeof(float),
                               to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        fprintf(stderr, "dp_train: copying the gradients %s the GPU: %s\n",
                to_device ? "to" : "from", cudaGetErrorString(e));
        return -1;
    }
#endif
    return 0;
}

static long arg_long(const char *name, const char *v, long lo, long hi) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) {
        fprintf(stderr, "dp_train: %s takes an integer from %ld to %ld, not '%s'\n", name, lo, hi,
                v);
        exit(2);
    }
    return x;
}

/* --slow-rank: this rank's compute part of the step (forward and backward,
 * plus --step-sleep-ms, which stands for the rest of a real step's compute)
 * takes factor times as long, plus extra_ms, before the gradient all-reduce,
 * as on a throttled GPU: the other ranks wait for it there. */
static void slow_down(const struct timespec *t0, long sleep_ms, double factor, long extra_ms) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double compute_ns = (double)(t1.tv_sec - t0->tv_sec) * 1e9 + (double)(t1.tv_nsec - t0->tv_nsec);
    double ns = (factor - 1.0) * (compute_ns + (double)sleep_ms * 1e6) + (double)extra_ms * 1e6;
    if (ns <= 0)
        return;
    struct timespec ts = {(time_t)(ns / 1e9), (long)(ns - (double)(time_t)(ns / 1e9) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static double ms_since(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e6;
}

#define DP_REFORM_TIMEOUT_MS 300000

static double copy_ms; /* how long this rank's last state copy took */

/* Where this rank's state came from, for its launcher (docs/health.md, the
 * progress channel: "state peer|checkpoint STEP BYTES MS ROOT" on
 * GPULAUNCH_PROGRESS_FD); nothing outside gpulaunch. */
static void say_state(const char *source, long long step, size_t bytes, double ms, int root) {
    const char *fd = getenv("GPULAUNCH_PROGRESS_FD");
    if (fd == NULL || *fd == '\0')
        return;
    char *end;
    long n = strtol(fd, &end, 10);
    if (*end != '\0' || n < 0 || n > INT_MAX)
        return;
    dprintf((int)n, "state %s %lld %zu %.0f %d\n", source, step, bytes, ms, root);
}

/* The parameters and --state-mib's state from ri->root to the ranks that
 * lack them; the other ranks are not held up. A rank that lacks them says so
 * before the copy begins (the fault matrix fails the copy's root then). */
static gpl_result_t copy_state(gpl_comm_t comm, float *const params[5], const size_t counts[5],
                               const gpl_reform_info *ri) {
    size_t bytes[5];
    for (int i = 0; i < 5; i++)
        bytes[i] = counts[i] * sizeof(float);
    if (ri->copy && ri->mine) {
        printf("rank %d: copying the state of step %lld from rank %d in round %d\n", gpl_rank(comm),
               (long long)ri->step, ri->root, gpl_round(comm));
        fflush(stdout);
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    gpl_result_t rc = gpl_copy_state(comm, (void *const *)params, bytes, 5, ri);
    copy_ms = ms_since(&t0);
    return rc;
}

/* --reform: waits for the next round and re-makes the communicator in it;
 * every rank then agrees on the step the job goes on from, and ranks whose
 * parameters are not that step's (a new node's, or one further on) get them
 * from a rank that has them. done: the last step this rank completed, -1 for
 * none (a new node's rank whose first copy failed). 0 with *ri saying where
 * the job goes on from, or -1 when this process cannot go on (its launcher
 * restarts it). */
static int reform_in_place(gpl_comm_t comm, float *const params[5], const size_t counts[5],
                           long done, gpl_reform_info *ri) {
    int old_rank = gpl_rank(comm);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const char *ex = getenv("DP_TRAIN_EXIT_IN_REFORM"); /* tests: ranks that cannot re-form */
    if (ex && strcmp(ex, "1") == 0) {
        fprintf(stderr,
                "dp_train rank %d: exiting instead of re-forming (DP_TRAIN_EXIT_IN_REFORM)\n",
                old_rank);
        return -1;
    }
    for (;;) {
        /* a round that ends again during the agreement or the copy (a second
         * node lost, the copy's root among them, or the new one) is re-formed
         * again */
        if (gpl_reform(comm, DP_REFORM_TIMEOUT_MS) != GPL_OK) {
            fprintf(stderr, "dp_train rank %d: %s\n", old_rank, gpl_last_error(comm));
            return -1;
        }
        gpl_result_t rc = gpl_reform_agree(comm, done, ri);
        if (rc == GPL_OK && ri->step < 0) {
            /* every rank that held the state lost it (a copy cut short after
             * its root's node went away): the checkpoint has it */
            fprintf(stderr,
                    "dp_train rank %d: no rank of round %d holds the state any more; exiting "
                    "so that the launcher restarts from the checkpoint\n",
                    gpl_rank(comm), gpl_round(comm));
            return -1;
        }
        if (rc == GPL_OK)
            rc = copy_state(comm, params, counts, ri);
        if (rc == GPL_OK)
            break;
        fprintf(stderr, "dp_train rank %d: re-forming round %d: %s\n", gpl_rank(comm),
                gpl_round(comm), gpl_last_error(comm));
        if (ri->copy && ri->mine)
            done = -1; /* a half-copied state is no state */
    }
    /* ri->step is the last step every rank completed: none of those is lost;
     * a rank whose last collective completed where another's failed redoes
     * one */
    printf("rank %d (was %d): round %d re-formed in place, world %d, going on after step %lld "
           "(0 lost, %lld redone here)%s in %.1f ms\n",
           gpl_rank(comm), old_rank, gpl_round(comm), gpl_world_size(comm), (long long)ri->step,
           (long long)(done < 0 ? 0 : done - ri->step), ri->copy ? ", parameters copied" : "",
           ms_since(&t0));
    fflush(stdout);
    return 0;
}

/* reform_in_place, then this rank's share of the global batch in the new
 * world. */
static int go_on_in_next_round(gpl_comm_t comm, float *const params[5], const size_t counts[5],
                               long batch, long done, gpl_reform_info *ri, int *local, int **idx) {
    if (reform_in_place(comm, params, counts, done, ri) != 0)
        return -1;
    int world = gpl_world_size(comm);
    if (batch % world != 0) {
        fprintf(stderr,
                "dp_train rank %d: --global-batch %ld is not a multiple of the %d ranks of "
                "round %d\n",
                gpl_rank(comm), batch, world, gpl_round(comm));
        return -1;
    }
    *local = (int)(batch / world);
    free(*idx);
    if ((*idx = malloc(sizeof(int) * (size_t)*local)) == NULL)
        return -1;
    return 0;
}

/* DP_TRAIN_TRACE=FILE: rank 0 appends "step N world W loss L params H" to
 * FILE after every step (N steps done; H: the first 16 hex digits of
 * params_sha256), to find where two runs part. */
static void trace_step(const char *file, const model *m, long done, int world, float loss) {
    char hex[65];
    params_sha256(m, hex);
    FILE *f = fopen(file, "a");
    if (f == NULL)
        return;
    fprintf(f, "step %ld world %d loss %.9g params %.16s\n", done, world, (double)loss, hex);
    fclose(f);
}

static const char usage[] =
    "usage: dp_train [--steps N] [--global-batch B] [--seed S] [--lr LR] [--hidden H]\n"
    "                [--print-every K] [--dump-params FILE]\n"
    "                [--checkpoint-dir DIR] [--checkpoint-every N] [--checkpoint-every-s S]\n"
    "                [--checkpoint-durable DIR|s3://BUCKET/PREFIX] [--checkpoint-sync]\n"
    "                [--step-sleep-ms MS] [--start-delay-ms MS] [--device] [--reform]\n"
    "                [--state-mib N]\n"
    "                [--slow-rank R [--slow-factor F] [--slow-ms MS] [--slow-from-step N]]\n"
    "--device (a build with CUDA): the gradients are averaged on the GPU, through NCCL.\n"
    "--reform: when its round ends (a node lost or added) this rank is not restarted: it\n"
    "re-forms in place, redoes the step that failed, and a new node's ranks get the\n"
    "parameters from a survivor instead of the checkpoint (docs/reliability.md).\n"
    "--slow-rank R: from step N on (default 0), rank R's compute part of each step (forward,\n"
    "backward and --step-sleep-ms) takes F times as long (default 1.5), plus MS, before the\n"
    "gradient all-reduce: a straggler, as a throttled GPU would make one.\n"
    "--state-mib N: N MiB of state beside the parameters (as an optimizer's), the same on\n"
    "every rank, changed every step, checkpointed, copied to a new node's ranks.\n"
    "--start-delay-ms MS: sleep that long before anything else, as a program importing a\n"
    "framework does (until then a SIGTERM ends it: it cannot checkpoint yet).\n"
    "DP_TRAIN_TRACE=FILE: rank 0 appends its parameters' hash to FILE after every step.\n"
    "A preemption (SIGTERM, or a notice on any node) saves the current step on every\n"
    "rank and exits 143; the next start with the same --checkpoint-dir resumes there.\n"
    "Checkpoints stall a step only for the copy into host memory (--checkpoint-sync: until\n"
    "written); --checkpoint-durable drains them to a shared directory or S3 in the background,\n"
    "and a start whose --checkpoint-dir lost them restores from there (docs/checkpoints.md).\n"
    "Run it under gpulaunch: gpulaunch --standalone --nproc-per-node 4 dp_train\n";

int main(int argc, char **argv) {
    long steps = 100, batch = 64, seed = 1, hidden = 32, every = 10, ckpt_every = 0, sleep_ms = 0;
    long slow_rank = -1, slow_ms = 0, slow_from = 0, start_delay_ms = 0, state_mib = 0;
    double slow_factor = 1.5;
    int device = 0, reform = 0;
    const char *trace = getenv("DP_TRAIN_TRACE");
    double ckpt_every_s = 0;
    const char *ckpt_dir = NULL, *ckpt_durable = NULL;
    int ckpt_sync = 0;
    float lr = 0.05f;
    const char *dump = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(a, "--device") == 0) {
            device = 1;
            continue;
        }
        if (strcmp(a, "--reform") == 0) {
            reform = 1;
            continue;
        }
        if (strcmp(a, "--checkpoint-sync") == 0) {
            ckpt_sync = 1;
            continue;
        }
        if (v == NULL) {
            fprintf(stderr, "dp_train: unknown option or missing value: %s\n%s", a, usage);
            return 2;
        }
        if (strcmp(a, "--steps") == 0)
            steps = arg_long(a, v, 0, 10000000);
        else if (strcmp(a, "--global-batch") == 0)
            batch = arg_long(a, v, 1, SAMPLES);
        else if (strcmp(a, "--seed") == 0)
            seed = arg_long(a, v, 0, 1L << 40);
        else if (strcmp(a, "--hidden") == 0)
            hidden = arg_long(a, v, 1, 1024);
        else if (strcmp(a, "--print-every") == 0)
            every = arg_long(a, v, 1, 1L << 30);
        else if (strcmp(a, "--lr") == 0)
            lr = strtof(v, NULL);
        else if (strcmp(a, "--dump-params") == 0)
            dump = v;
        else if (strcmp(a, "--checkpoint-dir") == 0)
            ckpt_dir = v;
        else if (strcmp(a, "--checkpoint-durable") == 0)
            ckpt_durable = v;
        else if (strcmp(a, "--checkpoint-every") == 0)
            ckpt_every = arg_long(a, v, 0, 1L << 40);
        else if (strcmp(a, "--checkpoint-every-s") == 0)
            ckpt_every_s = strtod(v, NULL);
        else if (strcmp(a, "--step-sleep-ms") == 0)
            sleep_ms = arg_long(a, v, 0, 60000);
        else if (strcmp(a, "--state-mib") == 0)
            state_mib = arg_long(a, v, 0, 65536);
        else if (strcmp(a, "--start-delay-ms") == 0)
            start_delay_ms = arg_long(a, v, 0, 600000);
        else if (strcmp(a, "--slow-rank") == 0)
            slow_rank = arg_long(a, v, 0, 1L << 30);
        else if (strcmp(a, "--slow-ms") == 0)
            slow_ms = arg_long(a, v, 0, 600000);
        else if (strcmp(a, "--slow-from-step") == 0)
            slow_from = arg_long(a, v, 0, 1L << 40);
        else if (strcmp(a, "--slow-factor") == 0) {
            char *end;
            slow_factor = strtod(v, &end);
            if (*end || end == v || !(slow_factor >= 1.0 && slow_factor <= 100.0)) {
                fprintf(stderr, "dp_train: --slow-factor takes a number from 1 to 100, not '%s'\n",
                        v);
                return 2;
            }
        } else {
            fprintf(stderr, "dp_train: unknown option %s\n%s", a, usage);
            return 2;
        }
        i++;
    }
    gpl_comm_t comm = NULL;
    gpl_dp_t dp = NULL;
    model m = {0};
    float *x = NULL, *y = NULL, *dgrads = NULL;
    int *idx = NULL;
    int rc = 1;
#ifndef GPL_HAVE_CUDA
    if (device) {
        fprintf(stderr, "dp_train: --device needs a build with CUDA (this one has none)\n");
        return 2;
    }
#endif
    if (start_delay_ms > 0) {
        struct timespec ts = {start_delay_ms / 1000, (start_delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
    /* the model, its state and the data before the communicator: a worker
     * started before its round (a warm join) waits for it in gpl_init, and
     * whatever it did before costs the ranks already training nothing */
    x = malloc(sizeof(float) * SAMPLES * IN);
    y = malloc(sizeof(float) * SAMPLES);
    if (!x || !y || model_init(&m, (int)hidden, (uint64_t)seed) != 0 ||
        extra_init(&m, state_mib) != 0) {
        fprintf(stderr, "dp_train: out of memory\n");
        goto out;
    }
    make_data((uint64_t)seed, x, y);
    if (gpl_init(NULL, &comm) != GPL_OK) {
        fprintf(stderr, "dp_train: %s\n", gpl_last_error(comm));
        goto out;
    }
    if (reform && gpl_reform_enable() != GPL_OK)
        fprintf(stderr,
                "dp_train rank %d: --reform: this launcher cannot hand rounds over (not "
                "gpulaunch, or its progress channel is off): restarted instead\n",
                gpl_rank(comm));
    int rank = gpl_rank(comm), world = gpl_world_size(comm);
    if (batch % world != 0) {
        if (rank == 0)
            fprintf(stderr, "dp_train: --global-batch %ld is not a multiple of the %d ranks\n",
                    batch, world);
        rc = 2;
        goto out;
    }
    int local = (int)(batch / world);
    idx = malloc(sizeof(int) * (size_t)local);
    if (!idx) {
        fprintf(stderr, "dp_train: out of memory\n");
        goto out;
    }
    /* the parameters, and --state-mib's state: what a new rank gets */
    float *params[5] = {m.w1, m.b1, m.w2, m.b2, m.extra};
    float *grads[4] = {m.gw1, m.gb1, m.gw2, m.gb2};
    size_t counts[5] = {m.n_w1, m.n_b1, m.n_w2, m.n_b2, m.n_extra};
    /* --reform: a rank started into a round whose other ranks kept their
     * state (a new node's) copies it from them instead of reading the
     * checkpoint; when every rank is new, the job starts as without */
    gpl_reform_info ri = {.step = -1};
    gpl_result_t jrc = reform ? gpl_reform_agree(comm, -1, &ri) : GPL_OK;
    if (jrc == GPL_OK && ri.copy)
        jrc = copy_state(comm, params, counts, &ri);
    if (jrc != GPL_OK) {
        fprintf(stderr, "dp_train rank %d: %s\n", rank, gpl_last_error(comm));
        /* the round ended during the agreement or the copy (the copy's root,
         * or a rank of its chain, lost): this rank re-forms in place as a
         * survivor does, without state, and copies it from a survivor of the
         * next round (or exits when none holds it any more) */
        if (go_on_in_next_round(comm, params, counts, batch, -1, &ri, &local, &idx) != 0)
            goto out;
        rank = gpl_rank(comm);
    }
    /* the same start everywhere, whatever the seed handling of each rank */
    for (int i = 0; !ri.copy && i < 4; i++)
        if (counts[i] &&
            gpl_broadcast(comm, params[i], counts[i], GPL_FLOAT32, 0, NULL) != GPL_OK) {
            fprintf(stderr, "dp_train rank %d: %s\n", rank, gpl_last_error(comm));
            goto out;
        }
    if (ri.copy) {
        size_t bytes = 0;
        for (int i = 0; i < 5; i++)
            bytes += counts[i] * sizeof(float);
        printf("rank %d: joined round %d with %d ranks that kept their state: parameters of "
               "step %lld copied from rank %d, nothing read from the checkpoint (%zu bytes in "
               "%.1f ms: %.0f MB/s)\n",
               rank, gpl_round(comm), ri.survivors, (long long)ri.step, ri.root, bytes, copy_ms,
               copy_ms > 0 ? (double)bytes / copy_ms / 1e3 : 0.0);
        fflush(stdout);
        say_state("peer", ri.step, bytes, copy_ms, ri.root);
    }
    if (gpl_dp_create(comm, NULL, &dp) != GPL_OK) {
        fprintf(stderr, "dp_train rank %d: %s\n", rank, gpl_last_error(comm));
        goto out;
    }
    /* --device: the forward and backward stay on the CPU; the gradient
     * arena is copied to the GPU, averaged there (NCCL), and copied back */
    size_t gtotal = counts[0] + counts[1] + counts[2] + counts[3];
#ifdef GPL_HAVE_CUDA
    if (device && gpl_backend(comm) != GPL_BACKEND_NCCL) {
        fprintf(stderr,
                "dp_train rank %d: --device needs the NCCL backend, and this rank has "
                "the CPU one (no GPU, or GPULAUNCH_BACKEND=cpu)\n",
                rank);
        rc = 2;
        goto out;
    }
    cudaError_t ce = device ? cudaMalloc((void **)&dgrads, gtotal * sizeof(float)) : cudaSuccess;
    if (ce != cudaSuccess) {
        fprintf(stderr,
                "dp_train rank %d: --device: cannot allocate %zu gradients on the GPU: %s\n", rank,
                gtotal, cudaGetErrorString(ce));
        goto out;
    }
#endif
    int gi[4];
    for (int i = 0; i < 4; i++)
        gpl_dp_register(dp, dgrads ? dgrads + (grads[i] - m.gw1) : grads[i], counts[i], GPL_FLOAT32,
                        &gi[i]);
    int64_t start = 0;
    ckpt_comm = comm;
    if (ckpt_dir) {
        gpl_ckpt_options co = GPL_CKPT_OPTIONS_INIT;
        co.dir = ckpt_dir;
        co.durable = ckpt_durable;
        co.async_save = !ckpt_sync;
        co.every_steps = ckpt_every;
        co.every_seconds = ckpt_every_s;
        if (rank == 0) /* rank 0 saves the replicated state */
            co.state_bytes = (m.n_w1 + m.n_b1 + m.n_w2 + m.n_b2 + m.n_extra) * sizeof(float);
        int64_t got = ri.copy ? ri.step : -1;
        struct timespec t_read;
        clock_gettime(CLOCK_MONOTONIC, &t_read);
        if (gpl_ckpt_setup(comm, &co, save_cb, load_cb, &m) != GPL_OK ||
            (!ri.copy && gpl_ckpt_restore(comm, &got) != GPL_OK)) {
            fprintf(stderr, "dp_train rank %d: %s\n", rank, gpl_last_error(comm));
            goto out;
        }
        if (got >= 0 && ri.copy)
            start = got;
        else if (got >= 0) {
            start = got;
            if (rank == 0)
                printf("resumed from the checkpoint of step %lld\n", (long long)got);
            printf("rank %d: read %llu bytes from the checkpoint\n", rank,
                   (unsigned long long)ckpt_bytes_read);
            fflush(stdout);
            say_state("checkpoint", got, (size_t)ckpt_bytes_read, ms_since(&t_read), -1);
        }
    }
    if (ri.copy && !ckpt_dir)
        start = ri.step;
    long done = start;      /* the steps this rank completed */
    int first_in_world = 1; /* the next step is the first in this world */
    for (long step = start; step < steps; step++) {
        done = step;
        for (int k = 0; k < local; k++)
            idx[k] = (int)((step * batch + rank * local + k) % SAMPLES);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        float loss = forward_backward(&m, x, y, idx, local);
        if (rank == slow_rank && step >= slow_from)
            slow_down(&t0, sleep_ms, slow_factor, slow_ms);
        if (device_copy(dgrads, m.gw1, gtotal, 1) != 0)
            goto out;
        /* backward produced the last layer first */
        for (int i = 3; i >= 0; i--)
            gpl_dp_ready(dp, gi[i]);
        if (gpl_dp_wait(dp) != GPL_OK ||
            gpl_allreduce(comm, &loss, &loss, 1, GPL_FLOAT32, GPL_AVG, NULL) != GPL_OK) {
            fprintf(stderr, "dp_train rank %d: step %ld: %s\n", rank, step, gpl_last_error(comm));
            if (!reform ||
                go_on_in_next_round(comm, params, counts, batch, done, &ri, &local, &idx) != 0)
                goto out;
            step = (long)ri.step - 1; /* the loop's increment: the agreed next step */
            rank = gpl_rank(comm);
            first_in_world = 1;
            continue;
        }
        if (device_copy(m.gw1, dgrads, gtotal, 0) != 0)
            goto out;
        for (int i = 0; i < 4; i++)
            sgd(params[i], grads[i], counts[i], lr);
        extra_step(&m, step, loss);
        done = step + 1;
        if (rank == 0 && first_in_world) {
            printf("first step in a world of %d: step %ld\n", gpl_world_size(comm), step + 1);
            fflush(stdout);
        }
        first_in_world = 0;
        if (trace && rank == 0)
            trace_step(trace, &m, step + 1, gpl_world_size(comm), loss);
        if (rank == 0 && (step % every == 0 || step == steps - 1)) {
            printf("step %ld loss %.6f\n", step, loss);
            fflush(stdout); /* a node killed next must not take its last lines along */
        }
        if (sleep_ms) {
            struct timespec ts = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000};
            nanosleep(&ts, NULL);
        }
        if (!ckpt_dir)
            gpl_progress(step + 1); /* gpl_step_end reports it when checkpointing */
        if (ckpt_dir) {
            gpl_result_t rc2 = gpl_step_end(comm, step + 1);
            if (rc2 == GPL_ERR_PREEMPTED) {
                printf("rank %d preempted after step %ld\n", rank, step + 1);
                fprintf(stderr, "dp_train: %s\n", gpl_last_error(comm));
                fflush(stdout);
                rc = GPL_EXIT_PREEMPTED;
                goto out;
            }
            if (rc2 != GPL_OK) {
                fprintf(stderr, "dp_train rank %d: %s\n", rank, gpl_last_error(comm));
                if (!reform ||
                    go_on_in_next_round(comm, params, counts, batch, done, &ri, &local, &idx) != 0)
                    goto out;
                step = (long)ri.step - 1;
                rank = gpl_rank(comm);
                first_in_world = 1;
                continue;
            }
        }
    }
    /* the last checkpoint written, drained and marked COMPLETE in every tier */
    if (ckpt_dir && gpl_ckpt_wait(comm) != GPL_OK) {
        fprintf(stderr, "dp_train rank %d: %s\n", rank, gpl_last_error(comm));
        goto out;
    }
    char hex[65];
    params_sha256(&m, hex);
    printf("rank %d params_sha256 %s\n", rank, hex);
    fflush(stdout);
    if (dump && rank == 0) {
        FILE *f = fopen(dump, "wb");
        if (f == NULL) {
            fprintf(stderr, "dp_train: cannot write %s: %s\n", dump, strerror(errno));
            goto out;
        }
        for (int i = 0; i < 4; i++)
            fwrite(params[i], sizeof(float), counts[i], f);
        fclose(f);
    }
    rc = 0;
out:
    gpl_dp_destroy(dp);
#ifdef GPL_HAVE_CUDA
    cudaFree(dgrads);
#endif
    gpl_finalize(comm);
    model_free(&m);
    free(x);
    free(y);
    free(idx);
    return rc;
}
