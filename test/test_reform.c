/* The round after a failure, end to end against a real gpulaunch-rdzv: it
 * starts as soon as every survivor of the failed round has re-joined, without
 * the last call; a server restarted in between forms a first round; a
 * survivor whose heartbeats stop between rounds is not waited for. Every job
 * here has a long last call, so a round that waited for it is told apart
 * from one that did not. Every other ordering of joins, failures and
 * deadlines is a unit test of the round's state machine (test_round.c). */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

#define NPEERS 6

static proc srv;
static int port;
static peer *P;

static void start(void) {
    P = calloc(NPEERS, sizeof *P);
    cr_assert_eq(rdzv_start(&srv, &port, NULL), 0, "server did not start: %s", srv.out);
}

static void stop(void) {
    for (int i = 0; i < NPEERS; i++)
        peer_close(&P[i]);
    free(P);
    proc_kill(&srv, SIGTERM);
    proc_wait(&srv, 5000);
}

TestSuite(reform, .init = start, .fini = stop, .timeout = 60);

/* Node i joins job run (elastic min:max, last call in ms), on a new
 * connection unless it has one. */
static void join(int i, const char *run, uint32_t min, uint32_t max, uint32_t last_call) {
    if (P[i].bc == NULL)
        cr_assert_eq(peer_open(&P[i], port, NULL), 0);
    char h[16];
    snprintf(h, sizeof h, "n%d", i);
    cr_assert_eq(peer_join(&P[i], run, h, -1, 1, min, max, last_call), 0);
}

/* Waits for node i's assignment; returns the ms it took from t0. */
static uint64_t assigned(int i, uint64_t t0, int timeout_ms) {
    cr_assert_eq(peer_recv_type(&P[i], RDZV_ASSIGNED, timeout_ms), 0, "node %d got no rank", i);
    return now_ms() - t0;
}

/* n nodes form round 1 at once (n = max), then node `dead` drops its
 * connection; the others are told. */
static void round_one_then_drop(const char *run, int n, uint32_t min, uint32_t last_call,
                                int dead) {
    for (int i = 0; i < n; i++)
        join(i, run, min, (uint32_t)n, last_call);
    for (int i = 0; i < n; i++)
        assigned(i, now_ms(), 3000);
    peer_close(&P[dead]);
    for (int i = 0; i < n; i++)
        if (i != dead) {
            cr_assert_eq(peer_recv_type(&P[i], RDZV_ROUND_OVER, 3000), 0, "node %d not told", i);
            cr_expect_eq(P[i].last.u.round_over.reason, RDZV_REASON_DISCONNECT);
        }
}

Test(reform, every_survivor_back_starts_the_round_without_the_last_call) {
    round_one_then_drop("all", 3, 2, 20000, 2);
    uint64_t t0 = now_ms();
    join(0, "all", 2, 3, 20000);
    join(1, "all", 2, 3, 20000);
    for (int i = 0; i < 2; i++) {
        uint64_t took = assigned(i, t0, 3000);
        cr_expect_lt(took, 5000, "round 2 took %llu ms: it waited for the last call",
                     (unsigned long long)took);
        cr_expect_eq(P[i].last.u.assigned.round, 2);
        cr_expect_eq(P[i].last.u.assigned.nnodes, 2);
    }
}

Test(reform, a_server_restarted_in_between_forms_a_first_round) {
    round_one_then_drop("restart", 3, 2, 1500, 2);
    proc_kill(&srv, SIGKILL);
    proc_wait(&srv, 5000);
    char listen[32];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    const char *extra[] = {"--listen", listen, NULL};
    int again = 0;
    cr_assert_eq(rdzv_start(&srv, &again, extra), 0, "restart: %s", srv.out);
    cr_assert_eq(again, port);
    /* the survivors reconnect and join a server that never saw the job */
    for (int i = 0; i < 2; i++) {
        peer_close(&P[i]);
        memset(&P[i], 0, sizeof P[i]);
    }
    uint64_t t0 = now_ms();
    join(0, "restart", 2, 3, 1500);
    join(1, "restart", 2, 3, 1500);
    for (int i = 0; i < 2; i++) {
        uint64_t took = assigned(i, t0, 4000);
        cr_expect(took >= 1300, "node %d: %llu ms (no history: the last call applies)", i,
                  (unsigned long long)took);
        cr_expect_eq(P[i].last.u.assigned.round, 1);
    }
}

/* As join(), with the job's heartbeat timeout. */
static void join_hb(int i, const char *run, uint32_t min, uint32_t max, uint32_t last_call,
                    uint32_t hb_ms) {
    if (P[i].bc == NULL)
        cr_assert_eq(peer_open(&P[i], port, NULL), 0);
    rdzv_msg m = {.type = RDZV_JOIN, .req_id = 78};
    snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "%s", run);
    snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "n%d", i);
    snprintf(m.u.join.addr, sizeof m.u.join.addr, "10.0.1.%d", i + 10);
    snprintf(m.u.join.instance, sizeof m.u.join.instance, "n%d-i", i);
    m.u.join.nproc = 1;
    m.u.join.static_rank = -1;
    m.u.join.min_nodes = min;
    m.u.join.max_nodes = max;
    m.u.join.last_call_ms = last_call;
    m.u.join.join_timeout_ms = 60000;
    m.u.join.heartbeat_timeout_ms = hb_ms;
    cr_assert_eq(peer_send(&P[i], &m), 0);
}

Test(reform, a_survivor_gone_silent_between_rounds_is_not_waited_for) {
    /* heartbeat timeout 1 s, last call 20 s: n3 drops; n2 stays connected but
     * silent (its host went down with no FIN); n0 and n1 re-join */
    for (int i = 0; i < 4; i++)
        join_hb(i, "silent", 2, 4, 20000, 1000);
    for (int i = 0; i < 4; i++)
        assigned(i, now_ms(), 3000);
    peer_close(&P[3]);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(peer_recv_type(&P[i], RDZV_ROUND_OVER, 3000), 0);
    uint64_t t0 = now_ms();
    join_hb(0, "silent", 2, 4, 20000, 1000);
    join_hb(1, "silent", 2, 4, 20000, 1000);
    for (int i = 0; i < 2; i++) {
        uint64_t took = assigned(i, t0, 8000);
        cr_expect_lt(took, 5000, "node %d: round 2 after %llu ms: it waited for the silent n2", i,
                     (unsigned long long)took);
        cr_expect_eq(P[i].last.u.assigned.nnodes, 2);
    }
}
