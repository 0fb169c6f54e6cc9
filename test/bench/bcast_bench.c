/* bcast_bench: how fast a state reaches the other ranks (gpl_broadcast from
 * rank 0, as a newcomer gets a survivor's state), against the loopback TCP
 * bandwidth measured in the same run (one stream between two threads of rank
 * 0, the best a single connection does here). Run under gpulaunch, e.g. one
 * worker on each of 2 or 3 nodes:
 *
 *   gpulaunch --nnodes 2 --node-rank R --master-addr 127.0.0.1 ... \
 *       bcast_bench -b 1M -e 1G -f 4 -n 3
 *
 * Rank 0 prints one row per size:
 *   size_bytes time_s bcast_GBs loopback_GBs ratio check
 * (time: the slowest rank's, from a common start; GB = 1e9 B).
 *
 * -c N: the state copy of a re-formed round instead (gpl_reform_agree, then
 * gpl_copy_state, timed alone): the last N ranks lack the state, as a new
 * node's do, and get rank 0's; the others only say they have it. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gpulaunch/gpulaunch.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K':
    case 'k':
        v *= 1024;
        break;
    case 'M':
    case 'm':
        v *= 1024 * 1024;
        break;
    case 'G':
    case 'g':
        v *= 1024.0 * 1024 * 1024;
        break;
    default:
        break;
    }
    return (size_t)v;
}

typedef struct sink {
    int fd;
    size_t bytes;
    uint8_t *buf;
} sink;

static void *drain(void *arg) {
    sink *s = arg;
    size_t got = 0;
    while (got < s->bytes) {
        size_t want = s->bytes - got < (8u << 20) ? s->bytes - got : (8u << 20);
        ssize_t r = recv(s->fd, s->buf, want, 0);
        if (r <= 0 && errno != EINTR)
            break;
        if (r > 0)
            got += (size_t)r;
    }
    return NULL;
}

/* One TCP stream over loopback, bytes from one thread to another: GB/s. */
static double loopback_gbs(size_t bytes) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &al) != 0)
        return -1;
    int out = socket(AF_INET, SOCK_STREAM, 0);
    if (out < 0 || connect(out, (struct sockaddr *)&a, sizeof a) != 0)
        return -1;
    int in = accept(ls, NULL, NULL);
    close(ls);
    size_t chunk = 8u << 20;
    uint8_t *src = malloc(chunk), *dst = malloc(chunk);
    if (in < 0 || src == NULL || dst == NULL)
        return -1;
    memset(src, 7, chunk);
    sink s = {in, bytes, dst};
    pthread_t th;
    double t0 = now_s();
    pthread_create(&th, NULL, drain, &s);
    for (size_t sent = 0; sent < bytes;) {
        size_t n = bytes - sent < chunk ? bytes - sent : chunk;
        ssize_t w = send(out, src, n, 0);
        if (w < 0 && errno != EINTR)
            break;
        if (w > 0)
            sent += (size_t)w;
    }
    pthread_join(th, NULL);
    double t = now_s() - t0;
    close(out);
    close(in);
    free(src);
    free(dst);
    return (double)bytes / t / 1e9;
}

int main(int argc, char **argv) {
    size_t b = 1u << 20, e = 1u << 30, f = 4;
    int iters = 3, needers = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-b") == 0)
            b = parse_size(argv[i + 1]);
        else if (strcmp(argv[i], "-e") == 0)
            e = parse_size(argv[i + 1]);
        else if (strcmp(argv[i], "-f") == 0)
            f = (size_t)strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "-n") == 0)
            iters = (int)strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "-c") == 0)
            needers = (int)strtol(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "bcast_bench: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (b < 4 || b % 4 || e < b || f < 2 || iters < 1) {
        fprintf(stderr, "bcast_bench: needs 4 <= -b <= -e (multiples of 4), -f >= 2, -n >= 1\n");
        return 2;
    }
    gpl_comm_t c = NULL;
    if (gpl_init(NULL, &c) != GPL_OK) {
        fprintf(stderr, "bcast_bench: %s\n", gpl_last_error(c));
        return 1;
    }
    int rank = gpl_rank(c), world = gpl_world_size(c);
    if (needers < 0 || needers >= world) {
        fprintf(stderr, "bcast_bench: -c takes 0 to %d (the ranks that lack the state)\n",
                world - 1);
        return 2;
    }
    int need = rank >= world - needers; /* -c: this rank gets the state */
    uint8_t *buf = malloc(e);
    if (buf == NULL) {
        fprintf(stderr, "bcast_bench: rank %d: no memory for %zu bytes\n", rank, e);
        return 1;
    }
    if (rank == 0)
        printf("# world %d, %d local, %s; size_bytes time_s bcast_GBs loopback_GBs ratio "
               "check\n",
               world, gpl_local_world_size(c), needers ? "gpl_copy_state" : "gpl_broadcast");
    int rc = 0;
    for (size_t sz = b; sz <= e; sz *= f) {
        double lo = rank == 0 ? loopback_gbs(sz) : 0;
        double best = 1e30;
        int ok = 1;
        for (int it = 0; it < iters; it++) {
            if (rank == 0 || (needers && !need))
                for (size_t k = 0; k < sz; k += 4096)
                    buf[k] = (uint8_t)(k / 4096 + (size_t)it);
            else
                memset(buf, 0, sz);
            gpl_reform_info ri = {.step = -1};
            if (needers && gpl_reform_agree(c, need ? -1 : it, &ri) != GPL_OK)
                goto fail;
            if (gpl_barrier(c) != GPL_OK)
                goto fail;
            double t0 = now_s();
            if (needers ? gpl_copy_state(c, (void *const *)&buf, &sz, 1, &ri) != GPL_OK
                        : gpl_broadcast(c, buf, sz / 4, GPL_INT32, 0, NULL) != GPL_OK)
                goto fail;
            double t = now_s() - t0;
            for (size_t k = 0; k < sz; k += 4096)
                ok &= buf[k] == (uint8_t)(k / 4096 + (size_t)it);
            double slowest = t;
            if (gpl_allreduce(c, &t, &slowest, 1, GPL_FLOAT64, GPL_MAX, NULL) != GPL_OK)
                goto fail;
            if (slowest < best)
                best = slowest;
        }
        int all_ok = ok;
        if (gpl_allreduce(c, &ok, &all_ok, 1, GPL_INT32, GPL_MIN, NULL) != GPL_OK)
            goto fail;
        double gbs = (double)sz / best / 1e9;
        if (rank == 0)
            printf("%zu %.4f %.3f %.3f %.2f %s\n", sz, best, gbs, lo, lo > 0 ? gbs / lo : 0,
                   all_ok ? "ok" : "WRONG");
        fflush(stdout);
        if (!all_ok)
            rc = 1;
    }
    free(buf);
    gpl_finalize(c);
    return rc;
fail:
    fprintf(stderr, "bcast_bench: rank %d: %s\n", rank, gpl_last_error(c));
    return 1;
}
