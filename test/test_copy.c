/* The state copy of a re-formed round (gpl_copy_state) with real processes
 * and sockets: a new node's ranks get the root's state through the chain,
 * (the second reading the first's memory, or through a socket where it
 * cannot), a rank one step ahead on the root's own node is set back, nothing moves
 * when no rank needs it, sizes that differ are refused, and a round that
 * ends mid-copy fails it with GPL_ERR_ROUND_OVER on every rank in the chain. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rt_harness.h"

#define NBUF 4

/* The state of a rank with state: bytes that depend on the rank, so the
 * needers can tell whose they got. */
static uint8_t val(int rank, int buf, size_t i) {
    return (uint8_t)(i * 31 + (size_t)buf * 7 + (size_t)rank * 101 + 1);
}

typedef struct copy_arg {
    size_t bytes[NBUF];
    int64_t step[16]; /* each rank's step for gpl_reform_agree */
    int bad_rank;     /* this rank's last buffer is one byte longer (-1: none) */
} copy_arg;

static int copy_rank(gpl_comm_t c, void *arg, char *msg, size_t len) {
    copy_arg *a = arg;
    int rank = gpl_rank(c);
    size_t bytes[NBUF];
    void *bufs[NBUF];
    memcpy(bytes, a->bytes, sizeof bytes);
    if (rank == a->bad_rank)
        bytes[NBUF - 1]++;
    for (int b = 0; b < NBUF; b++) {
        bufs[b] = bytes[b] ? malloc(bytes[b]) : NULL;
        for (size_t i = 0; i < bytes[b]; i++)
            ((uint8_t *)bufs[b])[i] = a->step[rank] >= 0 ? val(rank, b, i) : 0xee;
    }
    gpl_reform_info ri;
    gpl_result_t rc = gpl_reform_agree(c, a->step[rank], &ri);
    if (rc == GPL_OK)
        rc = gpl_copy_state(c, bufs, bytes, NBUF, &ri);
    int bad = 0;
    if (rc != GPL_OK)
        snprintf(msg, len, "rc %d: %s", (int)rc, gpl_last_error(c));
    else
        snprintf(msg, len, "ok root %d copy %d mine %d", ri.root, ri.copy, ri.mine);
    /* a needer holds the root's bytes; every other rank its own */
    int from = ri.mine ? ri.root : rank;
    for (int b = 0; rc == GPL_OK && b < NBUF && !bad; b++)
        for (size_t i = 0; i < bytes[b] && !bad; i++)
            if (((uint8_t *)bufs[b])[i] != val(from, b, i)) {
                snprintf(msg, len, "buffer %d byte %zu: %u, not rank %d's %u", b, i,
                         ((uint8_t *)bufs[b])[i], from, val(from, b, i));
                bad = 1;
            }
    for (int b = 0; b < NBUF; b++)
        free(bufs[b]);
    return rc == GPL_OK && !bad ? 0 : rc == GPL_OK ? 1 : 10 + (int)rc;
}

static void expect_ok(int n, rt_result *res, int rc) {
    for (int r = 0; r < n; r++)
        cr_expect(WIFEXITED(res->status[r]) && WEXITSTATUS(res->status[r]) == 0,
                  "rank %d status %d: %s", r, res->status[r], res->msg[r]);
    cr_expect_eq(rc, 0);
}

Test(copy, a_new_nodes_ranks_get_the_roots_state, .timeout = 60) {
    /* 3 nodes x 2; node 2 is new: the chain is 0 -> 4 -> 5 */
    copy_arg a = {{(24u << 20) + 3, 0, 1, 1000}, {7, 7, 7, 7, -1, -1}, -1};
    rt_result res;
    expect_ok(6, &res, rt_run(3, 2, copy_rank, &a, NULL, &res, 50000));
    for (int r = 4; r < 6; r++)
        cr_expect(strstr(res.msg[r], "ok root 0 copy 1 mine 1") != NULL, "rank %d: %s", r,
                  res.msg[r]);
    cr_expect(strstr(res.msg[1], "ok root 0 copy 1 mine 0") != NULL, "rank 1: %s", res.msg[1]);
}

Test(copy, through_sockets_only_when_ranks_cannot_read_each_other, .timeout = 60) {
    /* 4 -> 5 on one node through loopback instead of process_vm_readv */
    copy_arg a = {{(24u << 20) + 3, 0, 1, 1000}, {7, 7, 7, 7, -1, -1}, -1};
    const char *env[] = {"GPULAUNCH_NO_CMA=1", NULL};
    rt_result res;
    expect_ok(6, &res, rt_run(3, 2, copy_rank, &a, env, &res, 50000));
}

Test(copy, a_rank_ahead_on_the_roots_node_is_set_back, .timeout = 60) {
    /* rank 1's last all-reduce completed where the others' failed */
    copy_arg a = {{4096, 3, 0, 5u << 20}, {7, 8, 7, 7}, -1};
    rt_result res;
    expect_ok(4, &res, rt_run(2, 2, copy_rank, &a, NULL, &res, 50000));
    cr_expect(strstr(res.msg[1], "ok root 0 copy 1 mine 1") != NULL, "rank 1: %s", res.msg[1]);
}

Test(copy, nothing_moves_when_every_rank_has_the_state, .timeout = 60) {
    copy_arg a = {{4096, 3, 0, 1000}, {7, 7, 7, 7}, -1};
    rt_result res;
    expect_ok(4, &res, rt_run(2, 2, copy_rank, &a, NULL, &res, 50000));
    for (int r = 0; r < 4; r++)
        cr_expect(strstr(res.msg[r], "copy 0") != NULL, "rank %d: %s", r, res.msg[r]);
}

Test(copy, sizes_that_differ_are_refused, .timeout = 60) {
    /* one node: the chain runs over the node's own loopback */
    copy_arg a = {{4096, 3, 0, 1000}, {7, -1, 7}, 1};
    rt_result res;
    rt_run(1, 3, copy_rank, &a, NULL, &res, 50000);
    cr_expect(strstr(res.msg[1], "every rank must pass the same buffers and sizes") != NULL,
              "rank 1: %s", res.msg[1]);
    /* the root hears that its receiver did not take the state */
    cr_expect(strstr(res.msg[0], "rank 1 did not take the whole state") != NULL, "rank 0: %s",
              res.msg[0]);
    /* rank 2, outside the chain, waited for its end and hears it failed */
    cr_expect(strstr(res.msg[2], "the state copy failed on a rank of its chain") != NULL,
              "rank 2: %s", res.msg[2]);
}

/* Rank 1, the chain's middle (0 -> 1 -> 3), stops itself once half of the
 * state is there, and goes on 2.5 s later; node 1's agent drops meanwhile.
 * The thread that sees the half runs at a real-time priority where it may
 * (root): under load, a normal one was scheduled only after the whole copy
 * had ended, and the copy then finished before the drop. */
#define HALTED_BYTES (64u << 20)
typedef struct watch {
    volatile uint8_t *mid;
    volatile int done;
} watch;

static void *halt_at_half(void *arg) {
    watch *w = arg;
    while (!w->done && *w->mid == 0xee)
        usleep(100);
    if (w->done)
        return NULL;
    pid_t me = getpid();
    if (fork() == 0) {
        usleep(2500000);
        kill(me, SIGCONT);
        _exit(0);
    }
    kill(me, SIGSTOP);
    return NULL;
}

static int halted_rank(gpl_comm_t c, void *arg, char *msg, size_t len) {
    int rank = gpl_rank(c), need = rank == 1 || rank == 3;
    uint8_t *buf = malloc(HALTED_BYTES);
    size_t bytes = HALTED_BYTES;
    memset(buf, need ? 0xee : 0x11, HALTED_BYTES);
    watch w = {buf + HALTED_BYTES / 2, 0};
    pthread_t t;
    int watching = 0;
    if (rank == 1) {
        pthread_attr_t at;
        struct sched_param sp = {.sched_priority = 10};
        pthread_attr_init(&at);
        pthread_attr_setinheritsched(&at, PTHREAD_EXPLICIT_SCHED);
        pthread_attr_setschedpolicy(&at, SCHED_FIFO);
        pthread_attr_setschedparam(&at, &sp);
        watching = pthread_create(&t, &at, halt_at_half, &w) == 0 ||
                   pthread_create(&t, NULL, halt_at_half, &w) == 0; /* not allowed: a normal one */
        pthread_attr_destroy(&at);
    }
    gpl_reform_info ri;
    gpl_result_t rc = gpl_reform_agree(c, need ? -1 : 7, &ri);
    if (rc == GPL_OK)
        rc = gpl_copy_state(c, (void *const *)&buf, &bytes, 1, &ri);
    w.done = 1;
    if (watching)
        pthread_join(t, NULL);
    snprintf(msg, len, "rc %d: %s", (int)rc, rc == GPL_OK ? "ok" : gpl_last_error(c));
    free(buf);
    /* every rank fails with the round's end: the chain's, and rank 2, which
     * is not in it and waits for its end */
    return rc != GPL_ERR_ROUND_OVER;
}

Test(copy, a_round_that_ends_mid_copy_fails_it_with_round_over, .timeout = 60) {
    rt_result res;
    rt_drop_node_after(1, 1500);
    expect_ok(4, &res, rt_run(2, 2, halted_rank, NULL, NULL, &res, 30000));
    for (int r = 0; r < 4; r++) {
        cr_expect(strstr(res.msg[r], "lost its connection") != NULL, "rank %d: %s", r, res.msg[r]);
        cr_log_info("rank %d: %s", r, res.msg[r]);
    }
}
