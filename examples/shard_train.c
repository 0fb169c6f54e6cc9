/* shard_train: sharded state kept alive through a lost node with copies in
 * a peer's memory (gpl_mirror), in C.
 *
 * The state is --params floats of parameters and as many of momentum, split
 * in contiguous slices over the ranks (as FSDP shards them): rank r of W owns
 * [r*c, min((r+1)*c, N)) with c = ceil(N/W). A step updates each element
 * from its own value and the step alone (momentum SGD towards a target that
 * moves with the step), and all-reduces the loss: the result does not depend
 * on the world size, so a run that loses and gains nodes ends with the
 * parameters of one that never did, bit for bit.
 *
 * Every --mirror-every K steps (and at step 0) each rank copies its slices
 * into its snapshot and gpl_mirror_push sends them in the background to the
 * same local rank on the next node. With --reform, when a node is lost the
 * survivors keep their processes: gpl_reform, then gpl_mirror_agree on the
 * newest step every old rank has a copy of, then each rank fetches the old
 * slices that overlap its new one (gpl_mirror_fetch: from itself, or from
 * the rank holding them) and goes on from that step (at most K lost). When
 * no step is whole (a node and the next one lost together) it exits and its
 * launcher restarts the job from step 0 (this example keeps no checkpoint).
 *
 *   gpulaunch --nnodes 2:3 --nproc-per-node 2 ... shard_train --steps 400 \
 *       --mirror-every 10 --reform
 */
#include <math.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpulaunch/gpulaunch.h"

#define SHARD_REFORM_TIMEOUT_MS 600000u

static const char usage[] =
    "usage: shard_train [--params N] [--steps S] [--mirror-every K] [--step-sleep-ms MS]\n"
    "                   [--print-every P] [--reform]\n"
    "Momentum SGD on N floats (default 1048576) sharded over the ranks. --mirror-every K:\n"
    "every K steps each rank's slices are copied to a rank on the next node (gpl_mirror);\n"
    "with --reform a lost node's survivors go back to those copies in place (at most K\n"
    "steps lost) instead of restarting. Prints \"rank R params_sha256 H\" at the end.\n";

typedef struct shard {
    long n;         /* parameters in all */
    long lo, hi;    /* this rank's slice */
    float *p, *v;   /* its parameters and momentum */
    float *sp, *sv; /* the snapshot registered with the mirror */
    gpl_mirror_t m;
} shard;

static double ms_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

static void slice(long n, int world, int rank, long *lo, long *hi) {
    long c = (n + world - 1) / world;
    *lo = (long)rank * c < n ? (long)rank * c : n;
    *hi = *lo + c < n ? *lo + c : n;
}

static float target(long i, long step) {
    return (float)((uint64_t)(i * 2654435761L + step * 40503L) % 1000u) / 1000.0f;
}

/* Slices for this world, filled from init (fresh) or left for the caller. */
static int shard_alloc(shard *s, int world, int rank) {
    slice(s->n, world, rank, &s->lo, &s->hi);
    size_t k = (size_t)(s->hi - s->lo) + 1;
    s->p = calloc(k, sizeof(float));
    s->v = calloc(k, sizeof(float));
    s->sp = calloc(k, sizeof(float));
    s->sv = calloc(k, sizeof(float));
    return s->p && s->v && s->sp && s->sv ? 0 : -1;
}

static void shard_free(shard *s) {
    free(s->p);
    free(s->v);
    free(s->sp);
    free(s->sv);
    s->p = s->v = s->sp = s->sv = NULL;
}

/* A mirror for this world with the snapshot registered (collective). */
static gpl_result_t mirror_make(gpl_comm_t comm, shard *s) {
    size_t bytes = (size_t)(s->hi - s->lo) * sizeof(float);
    gpl_result_t rc = gpl_mirror_create(comm, NULL, &s->m);
    if (rc == GPL_OK)
        rc = gpl_mirror_register(s->m, s->sp, bytes);
    if (rc == GPL_OK)
        rc = gpl_mirror_register(s->m, s->sv, bytes);
    return rc;
}

/* Copies the slices into the snapshot and sends it to the buddy. */
static void mirror_push(shard *s, long done) {
    size_t bytes = (size_t)(s->hi - s->lo) * sizeof(float);
    if (gpl_mirror_stage(s->m) != GPL_OK)
        return;
    memcpy(s->sp, s->p, bytes);
    memcpy(s->sv, s->v, bytes);
    if (gpl_mirror_push(s->m, done) != GPL_OK)
        fprintf(stderr, "shard_train: %s\n", gpl_mirror_last_error(s->m));
}

/* One step on this rank's slice; the loss all-reduced. */
static gpl_result_t step(gpl_comm_t comm, shard *s, long st, double *loss) {
    double sum = 0;
    for (long i = s->lo; i < s->hi; i++) {
        float *p = &s->p[i - s->lo], *v = &s->v[i - s->lo];
        float g = *p - target(i, st);
        *v = 0.9f * *v + g;
        *p -= 0.05f * *v;
        sum += (double)g * g;
    }
    gpl_result_t rc = gpl_allreduce(comm, &sum, loss, 1, GPL_FLOAT64, GPL_SUM, NULL);
    gpl_progress(st + 1);
    return rc;
}

/* The old world's slices at the plan's step, into new slices of this
 * world (what overlaps each comes from its copy: this rank's memory, or the
 * rank holding it), then a mirror for this world. Returns the step, -1 on a
 * failure (*fetched: the bytes this rank took). */
static long adopt(gpl_comm_t comm, shard *s, gpl_mirror_plan_t plan, long *fetched) {
    int64_t at = -1;
    int old_world = 0;
    gpl_mirror_plan_info(plan, &at, &old_world, NULL);
    shard ns = {.n = s->n};
    int ok = shard_alloc(&ns, gpl_world_size(comm), gpl_rank(comm)) == 0;
    *fetched = 0;
    for (int o = 0; o < old_world && ok; o++) {
        long olo, ohi;
        slice(s->n, old_world, o, &olo, &ohi);
        long a = olo > ns.lo ? olo : ns.lo, b = ohi < ns.hi ? ohi : ns.hi;
        if (a >= b)
            continue;
        size_t bytes = (size_t)(ohi - olo) * sizeof(float);
        float *tp = malloc(bytes + 1), *tv = malloc(bytes + 1);
        void *bufs[2] = {tp, tv};
        size_t sizes[2] = {bytes, bytes};
        ok = tp && tv && gpl_mirror_fetch(plan, o, bufs, sizes, 2) == GPL_OK;
        if (ok) {
            memcpy(ns.p + (a - ns.lo), tp + (a - olo), (size_t)(b - a) * sizeof(float));
            memcpy(ns.v + (a - ns.lo), tv + (a - olo), (size_t)(b - a) * sizeof(float));
            *fetched += (long)bytes * 2;
        } else
            fprintf(stderr, "shard_train rank %d: old rank %d's slices: %s\n", gpl_rank(comm), o,
                    gpl_last_error(comm));
        free(tp);
        free(tv);
    }
    gpl_result_t rc = gpl_barrier(comm); /* every fetch served before the copies go */
    gpl_mirror_destroy(s->m);
    s->m = NULL;
    shard_free(s);
    *s = ns;
    if (!ok || rc != GPL_OK || mirror_make(comm, s) != GPL_OK) {
        fprintf(stderr, "shard_train rank %d: re-forming from the copies failed: %s\n",
                gpl_rank(comm), gpl_last_error(comm));
        return -1;
    }
    return (long)at;
}

/* After the round ended: the next one, the agreement on the copies' step and
 * this rank's new slices from them. Returns the step the job goes on after,
 * -1 when it cannot go on in place (the launcher restarts it). */
static long reform(gpl_comm_t comm, shard *s, long done) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int was = gpl_rank(comm);
    gpl_mirror_plan_t plan = NULL;
    for (;;) {
        if (gpl_reform(comm, SHARD_REFORM_TIMEOUT_MS) != GPL_OK) {
            fprintf(stderr, "shard_train rank %d: %s\n", was, gpl_last_error(comm));
            return -1;
        }
        gpl_result_t rc = gpl_mirror_agree(comm, s->m, &plan);
        if (rc == GPL_ERR_STATE) {
            fprintf(stderr, "shard_train rank %d: %s; exiting for the launcher's restart\n",
                    gpl_rank(comm), gpl_last_error(comm));
            return -1;
        }
        if (rc == GPL_OK)
            break;
        fprintf(stderr, "shard_train rank %d: round %d: %s; waiting for the next one\n",
                gpl_rank(comm), gpl_round(comm), gpl_last_error(comm));
    }
    long fetched = 0, at = adopt(comm, s, plan, &fetched);
    gpl_mirror_plan_free(plan);
    if (at < 0)
        return -1;
    printf("rank %d (was %d): round %d re-formed in place, world %d, going on after step %ld "
           "(%ld lost), shards from the copies in peers' memory (%ld bytes fetched) in %.1f ms\n",
           gpl_rank(comm), was, gpl_round(comm), gpl_world_size(comm), at, done - at, fetched,
           ms_since(&t0));
    fflush(stdout);
    return at;
}

/* Every rank's slices gathered; rank r prints the SHA-256 of all N floats. */
static int print_hash(gpl_comm_t comm, const shard *s) {
    int world = gpl_world_size(comm);
    long c = (s->n + world - 1) / world;
    float *mine = calloc((size_t)c, sizeof(float)),
          *all = malloc((size_t)c * world * sizeof(float));
    if (!mine || !all)
        return -1;
    memcpy(mine, s->p, (size_t)(s->hi - s->lo) * sizeof(float));
    gpl_result_t rc = gpl_allgather(comm, mine, all, (size_t)c, GPL_FLOAT32, NULL);
    if (rc == GPL_OK) {
        unsigned char md[32];
        unsigned int ml = 0;
        EVP_Digest(all, (size_t)s->n * sizeof(float), md, &ml, EVP_sha256(), NULL);
        printf("rank %d params_sha256 ", gpl_rank(comm));
        for (int i = 0; i < 32; i++)
            printf("%02x", md[i]);
        printf("\n");
        fflush(stdout);
    }
    free(mine);
    free(all);
    return rc == GPL_OK ? 0 : -1;
}

int main(int argc, char **argv) {
    long n = 1L << 20, steps = 100, every = 0, sleep_ms = 0, print_every = 50;
    int reform_on = 0, code = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(a, "--reform") == 0) {
            reform_on = 1;
            continue;
        }
        if (!v) {
            fputs(usage, stderr);
            return 2;
        }
        long x = strtol(v, NULL, 10);
        if (strcmp(a, "--params") == 0)
            n = x;
        else if (strcmp(a, "--steps") == 0)
            steps = x;
        else if (strcmp(a, "--mirror-every") == 0)
            every = x;
        else if (strcmp(a, "--step-sleep-ms") == 0)
            sleep_ms = x;
        else if (strcmp(a, "--print-every") == 0)
            print_every = x;
        else {
            fprintf(stderr, "shard_train: unknown option %s\n%s", a, usage);
            return 2;
        }
        i++;
    }
    if (n < 1 || steps < 0 || every < 0 || print_every < 1) {
        fputs(usage, stderr);
        return 2;
    }
    gpl_comm_t comm = NULL;
    shard s = {.n = n};
    if (gpl_init(NULL, &comm) != GPL_OK) {
        fprintf(stderr, "shard_train: %s\n", gpl_last_error(comm));
        goto out;
    }
    if (reform_on && gpl_reform_enable() != GPL_OK)
        fprintf(stderr, "shard_train: --reform: this launcher cannot hand rounds over: restarted "
                        "instead\n");
    if (shard_alloc(&s, gpl_world_size(comm), gpl_rank(comm)) != 0) {
        fprintf(stderr, "shard_train: out of memory\n");
        goto out;
    }
    long done = 0;
    int first = 1;
    gpl_mirror_plan_t plan = NULL;
    /* a rank of a round whose other ranks kept their state (a new node's)
     * takes its slices from their copies: every rank of a new round agrees
     * once (at a fresh start nobody holds copies: GPL_ERR_STATE) */
    gpl_result_t arc = reform_on && every > 0 ? gpl_mirror_agree(comm, NULL, &plan) : GPL_ERR_STATE;
    if (arc == GPL_OK) {
        long fetched = 0;
        done = adopt(comm, &s, plan, &fetched);
        gpl_mirror_plan_free(plan);
        if (done < 0)
            goto out;
        printf("rank %d: joined round %d: step %ld's slices taken from the copies in peers' memory "
               "(%ld bytes)\n",
               gpl_rank(comm), gpl_round(comm), done, fetched);
    } else if (arc != GPL_ERR_STATE) {
        fprintf(stderr, "shard_train: %s\n", gpl_last_error(comm));
        goto out;
    } else {
        for (long i = s.lo; i < s.hi; i++)
            s.p[i - s.lo] = 0.5f;
        if (every > 0 && mirror_make(comm, &s) != GPL_OK) {
            fprintf(stderr, "shard_train: %s\n", gpl_last_error(comm));
            goto out;
        }
        if (s.m)
            mirror_push(&s, 0);
    }
    while (done < steps) {
        double loss = 0;
        gpl_result_t rc = step(comm, &s, done, &loss);
        if (rc == GPL_OK) {
            done++;
            if (first && gpl_rank(comm) == 0)
                printf("first step in a world of %d: step %ld\n", gpl_world_size(comm), done - 1);
            first = 0;
            if (gpl_rank(comm) == 0 && done % print_every == 0)
                printf("step %ld loss %.6f\n", done, loss / (double)n);
            fflush(stdout);
            if (s.m && done % every == 0)
                mirror_push(&s, done);
            if (sleep_ms > 0)
                usleep((useconds_t)sleep_ms * 1000);
            continue;
        }
        if (!reform_on || !s.m ||
            (rc != GPL_ERR_ROUND_OVER && rc != GPL_ERR_PEER_FAILED && rc != GPL_ERR_TIMEOUT)) {
            fprintf(stderr, "shard_train rank %d: step %ld: %s\n", gpl_rank(comm), done,
                    gpl_last_error(comm));
            goto out;
        }
        long at = reform(comm, &s, done);
        if (at < 0)
            goto out;
        done = at;
        first = 1;
    }
    if (s.m)
        gpl_mirror_wait(s.m);
    if (print_hash(comm, &s) != 0)
        goto out;
    code = 0;
out:
    gpl_mirror_destroy(s.m);
    shard_free(&s);
    gpl_finalize(comm);
    return code;
}
