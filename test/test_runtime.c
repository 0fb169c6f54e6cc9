/* The runtime's collectives on the CPU backend, with real processes, shared
 * memory and TCP: every dtype x op x size x world size against a reference
 * in double precision, bitwise agreement across ranks, gradient buckets,
 * timeouts and dead peers. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpl_int.h"
#include "rt_harness.h"

static double in_val(int rank, size_t i, gpl_dtype_t t) {
    long k = (long)((i * 7 + (size_t)rank * 13) % 17) - 8;
    if (t == GPL_INT32 || t == GPL_INT64)
        return (double)(k % 4);
    return (double)k / 4.0; /* exact in every float type */
}

static void put(void *b, size_t i, gpl_dtype_t t, double v) {
    switch (t) {
    case GPL_FLOAT32:
        ((float *)b)[i] = (float)v;
        break;
    case GPL_FLOAT64:
        ((double *)b)[i] = v;
        break;
    case GPL_INT32:
        ((int32_t *)b)[i] = (int32_t)v;
        break;
    case GPL_INT64:
        ((int64_t *)b)[i] = (int64_t)v;
        break;
    case GPL_FLOAT16: { /* values are k/4 with |k| <= 8: build the half directly */
        float f = (float)v;
        uint32_t x;
        memcpy(&x, &f, 4);
        uint16_t h =
            (uint16_t)(((x >> 16) & 0x8000) |
                       (f == 0 ? 0 : ((((x >> 23) & 0xff) - 112) << 10) | ((x >> 13) & 0x3ff)));
        ((uint16_t *)b)[i] = h;
        break;
    }
    case GPL_BFLOAT16: {
        float f = (float)v;
        uint32_t x;
        memcpy(&x, &f, 4);
        ((uint16_t *)b)[i] = (uint16_t)(x >> 16);
        break;
    }
    default:
        break;
    }
}

static double get(const void *b, size_t i, gpl_dtype_t t) {
    switch (t) {
    case GPL_FLOAT32:
        return ((const float *)b)[i];
    case GPL_FLOAT64:
        return ((const double *)b)[i];
    case GPL_INT32:
        return ((const int32_t *)b)[i];
    case GPL_INT64:
        return (double)((const int64_t *)b)[i];
    case GPL_FLOAT16: {
        uint16_t h = ((const uint16_t *)b)[i];
        int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
        return (h & 0x8000) ? -v : v;
    }
    case GPL_BFLOAT16: {
        uint32_t x = (uint32_t)((const uint16_t *)b)[i] << 16;
        float f;
        memcpy(&f, &x, 4);
        return f;
    }
    default:
        return 0;
    }
}

static double expect_val(int world, size_t i, gpl_dtype_t t, gpl_op_t op) {
    double acc = in_val(0, i, t);
    for (int r = 1; r < world; r++) {
        double v = in_val(r, i, t);
        acc = op == GPL_PROD  ? acc * v
              : op == GPL_MIN ? (v < acc ? v : acc)
              : op == GPL_MAX ? (v > acc ? v : acc)
                              : acc + v;
    }
    if (op == GPL_AVG) {
        if (t == GPL_INT32 || t == GPL_INT64)
            return (double)((long long)acc / world);
        return acc / world;
    }
    return acc;
}

static uint64_t fnv(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

typedef struct sweep_arg {
    size_t big;
} sweep_arg;

/* Every dtype x op x size: checks against the reference and across ranks. */
static int sweep(gpl_comm_t c, void *argp, char *msg, size_t len) {
    sweep_arg *a = argp;
    int rank = gpl_rank(c), world = gpl_world_size(c);
    size_t sizes[4] = {0, 1, 1023, 0};
    for (int t = 0; t < GPL_DTYPE_COUNT; t++) {
        size_t es = gpl_dtype_size((gpl_dtype_t)t);
        sizes[3] = a->big / es;
        for (int op = 0; op < GPL_OP_COUNT; op++) {
            for (int si = 0; si < 4; si++) {
                if (si == 3 && !(op == GPL_SUM || op == GPL_AVG || t == GPL_FLOAT32))
                    continue; /* the big size: every dtype with sum/avg, every op on float32 */
                size_t n = sizes[si];
                uint8_t *s = malloc(n * es + 1), *r = malloc(n * es + 1);
                for (size_t i = 0; i < n; i++)
                    put(s, i, (gpl_dtype_t)t, in_val(rank, i, (gpl_dtype_t)t));
                int inplace = (si + t) % 2; /* both forms at every size, over the dtypes */
                if (inplace)
                    memcpy(r, s, n * es);
                gpl_result_t rc =
                    gpl_allreduce(c, inplace ? r : s, r, n, (gpl_dtype_t)t, (gpl_op_t)op, NULL);
                if (rc != GPL_OK) {
                    snprintf(msg, len, "dtype %d op %d n %zu: %s", t, op, n, gpl_last_error(c));
                    return 1;
                }
                double tol = t == GPL_FLOAT16 || t == GPL_BFLOAT16 ? 1e-2 : 1e-6;
                for (size_t i = 0; i < n; i++) {
                    double want = expect_val(world, i, (gpl_dtype_t)t, (gpl_op_t)op);
                    double got = get(r, i, (gpl_dtype_t)t);
                    if (fabs(got - want) > tol * (fabs(want) + 1)) {
                        snprintf(msg, len, "dtype %d op %d n %zu: [%zu] = %g, want %g", t, op, n, i,
                                 got, want);
                        return 2;
                    }
                }
                /* bitwise identical on every rank */
                uint64_t h = fnv(r, n * es), *all = malloc((size_t)world * sizeof *all);
                if (gpl_allgather(c, &h, all, 1, GPL_INT64, NULL) != GPL_OK) {
                    snprintf(msg, len, "allgather: %s", gpl_last_error(c));
                    return 3;
                }
                for (int k = 0; k < world; k++)
                    if (all[k] != h) {
                        snprintf(msg, len, "dtype %d op %d n %zu: rank %d differs from rank %d", t,
                                 op, n, k, rank);
                        return 4;
                    }
                free(all);
                free(s);
                free(r);
            }
        }
    }
    return 0;
}

static void check_all(int nodes, int per, rt_result *res, int rc) {
    for (int r = 0; r < nodes * per; r++)
        cr_expect(WIFEXITED(res->status[r]) && WEXITSTATUS(res->status[r]) == 0,
                  "rank %d status %d: %s", r, res->status[r], res->msg[r]);
    cr_expect_eq(rc, 0);
}

#define SWEEP_TEST(name, nodes, per, big)                                                          \
    Test(collectives, name, .timeout = 240) {                                                      \
        rt_result res;                                                                             \
        sweep_arg a = {big};                                                                       \
        int rc = rt_run(nodes, per, sweep, &a, NULL, &res, 200000);                                \
        check_all(nodes, per, &res, rc);                                                           \
    }

SWEEP_TEST(world1, 1, 1, 64u << 20)
SWEEP_TEST(world2, 1, 2, 64u << 20)
SWEEP_TEST(world3, 1, 3, 64u << 20)
SWEEP_TEST(world4, 1, 4, 64u << 20)
SWEEP_TEST(two_nodes_x2, 2, 2, 8u << 20)

/* nodes of different sizes (1 rank and 2 ranks), a buffer over the chunk
 * size: the lone rank's node must make the same ring calls as the other */
Test(collectives, nodes_of_different_sizes, .timeout = 240) {
    rt_result res;
    sweep_arg a = {2u << 20};
    const int per[2] = {1, 2};
    const char *env[] = {"GPULAUNCH_TIMEOUT_MS=20000", NULL}; /* a mismatch hangs: fail fast */
    int rc = rt_run_nodes(2, per, sweep, &a, env, &res, 200000);
    for (int r = 0; r < 3; r++)
        cr_expect(WIFEXITED(res.status[r]) && WEXITSTATUS(res.status[r]) == 0,
                  "rank %d status %d: %s", r, res.status[r], res.msg[r]);
    cr_expect_eq(rc, 0);
}

/* the staged shared-memory path, where ranks may not read each other's memory */
Test(collectives, world3_staged_without_cma, .timeout = 240) {
    rt_result res;
    sweep_arg a = {16u << 20};
    const char *env[] = {"GPULAUNCH_NO_CMA=1", NULL};
    int rc = rt_run(1, 3, sweep, &a, env, &res, 200000);
    check_all(1, 3, &res, rc);
}
SWEEP_TEST(three_nodes_x1, 3, 1, 8u << 20)

static int bcast_gather(gpl_comm_t c, void *arg, char *msg, size_t len) {
    int rank = gpl_rank(c), world = gpl_world_size(c);
    for (int root = 0; root < world; root++) {
        size_t n = 3u << 20; /* spans several staging chunks */
        int32_t *b = malloc(n * 4);
        for (size_t i = 0; i < n; i++)
            b[i] = rank == root ? (int32_t)(i * 3 + (size_t)root) : -1;
        if (gpl_broadcast(c, b, n, GPL_INT32, root, NULL) != GPL_OK) {
            snprintf(msg, len, "broadcast: %s", gpl_last_error(c));
            return 1;
        }
        for (size_t i = 0; i < n; i++)
            if (b[i] != (int32_t)(i * 3 + (size_t)root)) {
                snprintf(msg, len, "broadcast root %d: [%zu] = %d", root, i, b[i]);
                return 2;
            }
        free(b);
    }
    size_t n = 100001;
    double *s = malloc(n * 8), *r = malloc(n * 8 * (size_t)world);
    for (size_t i = 0; i < n; i++)
        s[i] = rank * 1e6 + (double)i;
    if (gpl_allgather(c, s, r, n, GPL_FLOAT64, NULL) != GPL_OK) {
        snprintf(msg, len, "allgather: %s", gpl_last_error(c));
        return 3;
    }
    for (int q = 0; q < world; q++)
        for (size_t i = 0; i < n; i++)
            if (r[(size_t)q * n + i] != q * 1e6 + (double)i) {
                snprintf(msg, len, "allgather: rank %d's [%zu] wrong", q, i);
                return 4;
            }
    free(s);
    free(r);
    for (int i = 0; i < 50; i++)
        if (gpl_barrier(c) != GPL_OK) {
            snprintf(msg, len, "barrier: %s", gpl_last_error(c));
            return 5;
        }
    return 0;
}

Test(collectives, broadcast_allgather_barrier_one_node, .timeout = 60) {
    rt_result res;
    check_all(1, 4, &res, rt_run(1, 4, bcast_gather, NULL, NULL, &res, 50000));
}

Test(collectives, broadcast_allgather_barrier_two_nodes, .timeout = 60) {
    rt_result res;
    check_all(2, 2, &res, rt_run(2, 2, bcast_gather, NULL, NULL, &res, 50000));
}

/* Gradient sync: buckets and ready-order permutations give the unbucketed
 * result, with the gradients in allocations of their own (copied through the
 * buckets), back to back in one allocation (every bucket reduced in place),
 * or in one allocation with a gap (the bucket across the gap is copied). */
enum { LAYOUT_SEPARATE, LAYOUT_ONE_ALLOCATION, LAYOUT_GAP };

static int dp_check(gpl_comm_t c, void *arg, char *msg, size_t len) {
    int rank = gpl_rank(c), layout = arg ? *(int *)arg : LAYOUT_SEPARATE;
    enum { NG = 23, GAP_AFTER = 11 };
    size_t counts[NG], total = 0;
    float *g[NG], *ref[NG], *arena = NULL;
    for (int i = 0; i < NG; i++) {
        counts[i] = (size_t)(1 + (i * 7919) % 40000);
        total += counts[i] + (i == GAP_AFTER);
    }
    if (layout != LAYOUT_SEPARATE)
        arena = malloc(total * 4);
    for (int i = 0, off = 0; i < NG; i++) {
        g[i] = arena ? arena + off : malloc(counts[i] * 4);
        off += (int)counts[i] + (layout == LAYOUT_GAP && i == GAP_AFTER);
        ref[i] = malloc(counts[i] * 4);
    }
    gpl_dp_options o = GPL_DP_OPTIONS_INIT;
    o.bucket_cap_bytes = 100000; /* many buckets */
    o.first_bucket_bytes = 20000;
    gpl_dp_t dp;
    if (gpl_dp_create(c, &o, &dp) != GPL_OK)
        return 1;
    int idx[NG];
    for (int i = 0; i < NG; i++)
        gpl_dp_register(dp, g[i], counts[i], GPL_FLOAT32, &idx[i]);
    int nb = 0, in_place = 0;
    gpl_dp_info(dp, &nb, &in_place);
    if (nb < 4 || (layout == LAYOUT_ONE_ALLOCATION && in_place != nb) ||
        (layout == LAYOUT_GAP && (in_place == 0 || in_place != nb - 1))) {
        snprintf(msg, len, "layout %d: %d of %d buckets in place", layout, in_place, nb);
        return 7;
    }
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < NG; i++)
            for (size_t k = 0; k < counts[i]; k++) {
                g[i][k] = (float)((rank + 1) * (i + 1)) * 0.5f + (float)k * 0.001f * (float)step;
                ref[i][k] = g[i][k];
            }
        for (int i = 0; i < NG; i++)
            if (gpl_allreduce(c, ref[i], ref[i], counts[i], GPL_FLOAT32, GPL_AVG, NULL)) {
                snprintf(msg, len, "ref allreduce: %s", gpl_last_error(c));
                return 2;
            }
        /* a different ready order on every rank and step */
        int order[NG];
        for (int i = 0; i < NG; i++)
            order[i] = i;
        srand((unsigned)(rank * 100 + step));
        for (int i = NG - 1; i > 0; i--) {
            int j = rand() % (i + 1), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int i = 0; i < NG; i++)
            if (gpl_dp_ready(dp, idx[order[i]]) != GPL_OK) {
                snprintf(msg, len, "ready: %s", gpl_last_error(c));
                return 3;
            }
        if (gpl_dp_wait(dp) != GPL_OK) {
            snprintf(msg, len, "wait: %s", gpl_last_error(c));
            return 4;
        }
        for (int i = 0; i < NG; i++)
            for (size_t k = 0; k < counts[i]; k++)
                if (fabsf(g[i][k] - ref[i][k]) > 1e-6f * (fabsf(ref[i][k]) + 1)) {
                    snprintf(msg, len, "step %d grad %d[%zu] = %g, unbucketed %g", step, i, k,
                             g[i][k], ref[i][k]);
                    return 5;
                }
    }
    /* a gradient never marked is reported, not waited for forever */
    gpl_dp_ready(dp, idx[0]);
    if (gpl_dp_wait(dp) != GPL_ERR_STATE || !strstr(gpl_last_error(c), "never marked ready")) {
        snprintf(msg, len, "unmarked gradient not reported: %s", gpl_last_error(c));
        return 6;
    }
    gpl_dp_destroy(dp);
    for (int i = 0; i < NG; i++) {
        if (arena == NULL)
            free(g[i]);
        free(ref[i]);
    }
    free(arena);
    return 0;
}

Test(gradsync, buckets_and_ready_orders_match_unbucketed, .timeout = 60) {
    rt_result res;
    check_all(1, 3, &res, rt_run(1, 3, dp_check, NULL, NULL, &res, 50000));
}

Test(gradsync, one_allocation_is_reduced_in_place_with_the_same_result, .timeout = 60) {
    static int layout = LAYOUT_ONE_ALLOCATION;
    rt_result res;
    check_all(2, 2, &res, rt_run(2, 2, dp_check, &layout, NULL, &res, 50000));
}

Test(gradsync, a_gap_in_the_allocation_copies_only_its_bucket, .timeout = 60) {
    static int layout = LAYOUT_GAP;
    rt_result res;
    check_all(1, 3, &res, rt_run(1, 3, dp_check, &layout, NULL, &res, 50000));
}

/* Rank 1 never arrives: the others time out naming it. */
static int late_rank(gpl_comm_t c, void *arg, char *msg, size_t len) {
    if (gpl_rank(c) == 1) {
        sleep(3);
        return 0;
    }
    float x = 1;
    gpl_result_t rc = gpl_allreduce(c, &x, &x, 1, GPL_FLOAT32, GPL_SUM, NULL);
    snprintf(msg, len, "%s", gpl_last_error(c));
    return rc == GPL_ERR_TIMEOUT ? 0 : 1;
}

Test(failures, timeout_names_the_missing_rank, .timeout = 30) {
    rt_result res;
    const char *env[] = {"GPULAUNCH_TIMEOUT_MS=800", NULL};
    rt_run(1, 3, late_rank, NULL, env, &res, 20000);
    for (int r = 0; r < 3; r += 2) {
        cr_expect(WIFEXITED(res.status[r]) && WEXITSTATUS(res.status[r]) == 0, "rank %d: %s", r,
                  res.msg[r]);
        cr_expect(strstr(res.msg[r], "rank 1 (node node0, local rank 1)") &&
                      strstr(res.msg[r], "allreduce #1"),
                  "rank %d: %s", r, res.msg[r]);
    }
}

/* A peer dies mid-run: the others get an error naming it, quickly. */
static int dying_rank(gpl_comm_t c, void *arg, char *msg, size_t len) {
    float x[1000] = {0};
    for (int i = 0; i < 5; i++)
        gpl_allreduce(c, x, x, 1000, GPL_FLOAT32, GPL_SUM, NULL);
    if (gpl_rank(c) == 2)
        raise(SIGKILL);
    uint64_t t0 = now_ms();
    gpl_result_t rc = gpl_allreduce(c, x, x, 1000, GPL_FLOAT32, GPL_SUM, NULL);
    snprintf(msg, len, "%llu ms: %s", (unsigned long long)(now_ms() - t0), gpl_last_error(c));
    return rc == GPL_ERR_PEER_FAILED && now_ms() - t0 < 1000 ? 0 : 1;
}

Test(failures, dead_peer_is_an_error_not_a_hang, .timeout = 30) {
    rt_result res;
    rt_run(1, 3, dying_rank, NULL, NULL, &res, 20000);
    for (int r = 0; r < 2; r++) {
        cr_expect(WIFEXITED(res.status[r]) && WEXITSTATUS(res.status[r]) == 0, "rank %d: %s", r,
                  res.msg[r]);
        cr_expect(strstr(res.msg[r], "rank 2 (node node0, local rank 2") != NULL, "rank %d: %s", r,
                  res.msg[r]);
    }
}

/* The rendezvous ends the round (a node dropped): collectives stop within 1 s. */
static int round_ends(gpl_comm_t c, void *arg, char *msg, size_t len) {
    float x[4] = {0};
    if (gpl_rank(c) >= 2) { /* node 1 stops taking part */
        sleep(3);
        return 0;
    }
    uint64_t t0 = now_ms();
    gpl_result_t rc = gpl_allreduce(c, x, x, 4, GPL_FLOAT32, GPL_SUM, NULL);
    snprintf(msg, len, "%llu ms: %s", (unsigned long long)(now_ms() - t0), gpl_last_error(c));
    return rc == GPL_ERR_ROUND_OVER ? 0 : 1;
}

Test(failures, round_over_stops_a_waiting_collective, .timeout = 30) {
    rt_result res;
    rt_drop_node_after(1, 1000);
    rt_run(2, 2, round_ends, NULL, NULL, &res, 20000);
    for (int r = 0; r < 2; r++) {
        cr_expect(WIFEXITED(res.status[r]) && WEXITSTATUS(res.status[r]) == 0, "rank %d: %s", r,
                  res.msg[r]);
        cr_expect(strstr(res.msg[r], "lost its connection") != NULL, "rank %d: %s", r, res.msg[r]);
    }
}

static void write_seg(const char *path, pid_t creator) {
    gpl_shm_hdr h;
    memset(&h, 0, sizeof h);
    h.ready = GPL_SHM_MAGIC;
    h.nlocal = 2;
    h.pid[0] = creator;
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fwrite(&h, 1, sizeof h, f);
    fclose(f);
}

Test(shm, stale_segments_of_dead_jobs_are_removed) {
    pid_t p = fork(); /* a creator that is dead by now */
    if (p == 0)
        _exit(0);
    waitpid(p, NULL, 0);
    char stale[128], live[128];
    snprintf(stale, sizeof stale, "/dev/shm/gpulaunch-stale-test-%d", (int)getpid());
    snprintf(live, sizeof live, "/dev/shm/gpulaunch-live-test-%d", (int)getpid());
    write_seg(live, getpid());
    char rep[512] = "";
    /* a test beside this one (ctest -j2) sweeps too, in its gpl_init, and may
     * remove the segment first: the report is judged when this sweep did */
    int named = 0;
    for (int tries = 0; tries < 5 && !named; tries++) {
        write_seg(stale, p);
        int n = gpl_shm_clean_stale(rep, sizeof rep);
        cr_expect(access(stale, F_OK) != 0, "stale segment still there");
        named = n >= 1 && strstr(rep, "gpulaunch-stale-test-") != NULL;
    }
    cr_expect(named, "no sweep of 5 reported the stale segment: %s", rep);
    cr_expect(access(live, F_OK) == 0, "a live job's segment was removed");
    unlink(live);
}

/* A segment as a creator killed between creating it and writing its header
 * leaves it: sized, all zeros. No Criterion assertions: ranks call it too.
 * Returns 0 or an errno. */
static int blank_seg(const char *path, time_t age_s) {
    static const char zeros[sizeof(gpl_shm_hdr)];
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return errno;
    size_t n = fwrite(zeros, 1, sizeof zeros, f);
    if (fclose(f) != 0 || n != sizeof zeros)
        return EIO;
    if (age_s > 0) {
        struct timespec ts[2] = {{time(NULL) - age_s, 0}, {time(NULL) - age_s, 0}};
        if (utimensat(AT_FDCWD, path, ts, 0) != 0)
            return errno;
    }
    return 0;
}

static void write_blank_seg(const char *path, time_t age_s) {
    int e = blank_seg(path, age_s);
    cr_assert_eq(e, 0, "%s: %s", path, strerror(e));
}

Test(shm, segments_whose_creator_died_before_writing_the_header_are_removed) {
    pid_t p = fork();
    if (p == 0)
        _exit(0);
    waitpid(p, NULL, 0);
    int me = (int)getpid();
    char dead[160], alive[160], old_young[160], old_aged[160];
    /* named as gpl_init names them: the creator's pid before the random part */
    snprintf(dead, sizeof dead, "/dev/shm/gpulaunch-blank%d-r1-n0-p%d-0000abcd", me, (int)p);
    snprintf(alive, sizeof alive, "/dev/shm/gpulaunch-blank%d-r1-n1-p%d-0000abce", me, me);
    /* an older version's names carry no pid: judged by their age */
    snprintf(old_young, sizeof old_young, "/dev/shm/gpulaunch-blank%d-r1-n2-0000abcf", me);
    snprintf(old_aged, sizeof old_aged, "/dev/shm/gpulaunch-blank%d-r1-n3-0000abd0", me);
    write_blank_seg(dead, 0);
    write_blank_seg(alive, 0);
    write_blank_seg(old_young, 0);
    write_blank_seg(old_aged, GPL_SHM_UNINIT_STALE_S + 60);
    char rep[1024]; /* no count: another test's gpl_init may sweep the blank ones first */
    gpl_shm_clean_stale(rep, sizeof rep);
    cr_expect(access(dead, F_OK) != 0, "a dead creator's blank segment is still there (%s)", rep);
    cr_expect(access(old_aged, F_OK) != 0, "an old blank segment is still there (%s)", rep);
    cr_expect(access(alive, F_OK) == 0, "a live creator's segment being set up was removed");
    cr_expect(access(old_young, F_OK) == 0, "a young blank segment was removed");
    unlink(alive);
    unlink(old_young);
}

/* The names gpl_init gives: local rank 0 leaves a blank segment named as its
 * own (as if killed before the header), which stays while it runs and goes
 * once it has exited. */
static int leave_blank_seg(gpl_comm_t c, void *arg, char *msg, size_t len) {
    char *path = arg;
    if (c->local_rank != 0)
        return 0;
    /* another random part: gpl_finalize removes the segment's own name */
    snprintf(path, 192, "/dev/shm%.*sffffffff", (int)strlen(c->shm_name) - 8, c->shm_name);
    int e = blank_seg(path, 0);
    if (e != 0) {
        snprintf(msg, len, "%s: %s", path, strerror(e));
        return 1;
    }
    gpl_shm_clean_stale(NULL, 0);
    int kept = access(path, F_OK) == 0;
    snprintf(msg, len, "%s %s while its creator runs", c->shm_name, kept ? "kept" : "removed");
    return !kept;
}

Test(shm, a_blank_segment_under_gpl_inits_name_is_judged_by_its_creator) {
    char *path = mmap(NULL, 192, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(path != MAP_FAILED);
    path[0] = '\0';
    rt_result res;
    cr_assert_eq(rt_run(1, 2, leave_blank_seg, path, NULL, &res, 20000), 0, "%s", res.msg[0]);
    cr_assert(path[0] != '\0');
    /* any sweep may remove it now (another test's gpl_init too): gone is right */
    char rep[512];
    gpl_shm_clean_stale(rep, sizeof rep);
    cr_expect(access(path, F_OK) != 0, "%s left after its creator exited (%s)", path, rep);
    unlink(path);
    munmap(path, 192);
}
