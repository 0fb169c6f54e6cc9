/* A node's round moved to a new connection (RDZV_JOIN_RESUME on a running
 * round, what a launcher does when its connection stalls), against the real
 * server process: the round goes on, the old connection's words are still
 * the node's, and a new connection its launcher gave up on sends the node
 * back to the old one unless it carried news. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "harness.h"

#define PEERS 4
static proc srv;
static int port;
static peer P[PEERS];

static void setup(void) {
    cr_assert_eq(rdzv_start(&srv, &port, NULL), 0, "server did not start: %s", srv.out);
}

static void teardown(void) {
    int st = rdzv_stop_with_peers(&srv, P, PEERS);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "server exit status %d: %s", st, srv.out);
}

TestSuite(rdzv_move, .init = setup, .fini = teardown, .timeout = 60);

static void join_as(peer *p, const char *host, const char *instance, int rank, int resume) {
    rdzv_msg m = {.type = RDZV_JOIN, .req_id = resume ? 77u : 9u};
    snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "mv");
    snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "%s", host);
    snprintf(m.u.join.instance, sizeof m.u.join.instance, "%s", instance);
    m.u.join.nproc = 1;
    m.u.join.static_rank = rank;
    m.u.join.min_nodes = m.u.join.max_nodes = 2;
    m.u.join.heartbeat_timeout_ms = 600;
    if (resume) {
        m.flags = RDZV_JOIN_RESUME;
        m.u.join.round = 1;
        m.u.join.node_rank = (uint32_t)rank;
        m.u.join.base_rank = (uint32_t)rank;
        m.u.join.world_size = 2;
        m.u.join.nnodes = 2;
    }
    peer_send(p, &m);
}

/* Job "mv": nodes mv-0 and mv-1 (instances mv-N-1234) on P[0], P[1], in round 1. */
static void run_moving_pair(void) {
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(peer_open(&P[i], port, NULL), 0);
        char h[16], inst[16];
        snprintf(h, sizeof h, "mv-%d", i);
        snprintf(inst, sizeof inst, "mv-%d-1234", i);
        join_as(&P[i], h, inst, i, 0);
    }
    for (int i = 0; i < 2; i++)
        cr_assert_eq(peer_recv_type(&P[i], RDZV_ASSIGNED, 3000), 0);
}

/* Heartbeats on P[0..n-1] for three of join_as's timeouts (1.8 s); 1 when
 * P[0] heard the round end meanwhile. */
static int beat_for_three_timeouts(int n) {
    rdzv_msg hb = {.type = RDZV_HEARTBEAT};
    for (uint64_t t0 = now_ms(); now_ms() - t0 < 1800;) {
        for (int i = 0; i < n; i++)
            peer_send(&P[i], &hb);
        if (peer_recv(&P[0], 100) == 0 && P[0].last.type == RDZV_ROUND_OVER)
            return 1;
    }
    return 0;
}

/* Node 1 of run_moving_pair's job moves to a new connection, P[2]. */
static void move_node_1_to_P2(void) {
    cr_assert_eq(peer_open(&P[2], port, NULL), 0);
    join_as(&P[2], "mv-1", "mv-1-1234", 1, 1);
    cr_assert_eq(peer_recv_type(&P[2], RDZV_ASSIGNED, 2000), 0, "the node did not move");
}

/* Closing p, node 1's connection, ends the round at once: node 0 hears it. */
static void expect_round_over_at_close_of(peer *p) {
    uint64_t t0 = now_ms();
    peer_close(p);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_ROUND_OVER, 2000), 0);
    cr_expect_eq(P[0].last.u.round_over.reason, RDZV_REASON_DISCONNECT, "%s",
                 P[0].last.u.round_over.message);
    cr_expect_eq(P[0].last.u.round_over.node_rank, 1, "%s", P[0].last.u.round_over.message);
    cr_expect_lt(now_ms() - t0, 500);
}

/* A node whose connection stalls moves its running round to a second one
 * (RDZV_CHALLENGE_MOVE): the round goes on, what still comes on the old
 * connection is the node's, the old one silent past twice the timeout is
 * closed and ends nothing, the new one's close does; a different launcher
 * (instance) cannot take the node's place. */
Test(rdzv_move, a_node_moves_its_running_round_to_a_new_connection) {
    run_moving_pair();
    /* another launcher claiming node rank 1 is refused */
    cr_assert_eq(peer_open(&P[3], port, NULL), 0);
    join_as(&P[3], "mv-1", "mv-1-9999", 1, 1);
    cr_assert_eq(peer_recv_type(&P[3], RDZV_ERROR, 2000), 0);
    cr_expect_eq(P[3].last.u.error.code, GPL_ERR_ROUND_OVER, "%s", P[3].last.u.error.message);
    /* node 1 moves to P[2] */
    cr_assert_eq(peer_open(&P[2], port, NULL), 0);
    join_as(&P[2], "mv-1", "mv-1-1234", 1, 1);
    cr_assert_eq(peer_recv_type(&P[2], RDZV_ASSIGNED, 2000), 0);
    cr_expect_eq(P[2].last.req_id, 77);
    cr_expect_eq(P[2].last.u.assigned.round, 1);
    cr_expect_eq(P[2].last.u.assigned.node_rank, 1);
    /* heartbeats on the new connection keep it: three timeouts pass; the old one still
     * speaks (a client drains it) */
    rdzv_msg hb = {.type = RDZV_HEARTBEAT};
    uint64_t t0;
    int over = beat_for_three_timeouts(3);
    cr_assert(!over, "the round ended after the move: %s", P[0].last.u.round_over.message);
    /* a request on the old connection is still the node's: its event reaches node 0 */
    rdzv_msg ev = {.type = RDZV_EVENT, .req_id = 5};
    ev.u.event.kind = RDZV_EVENT_CHECKPOINT;
    snprintf(ev.u.event.reason, sizeof ev.u.event.reason, "said on the old connection");
    peer_send(&P[1], &ev);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_EVENT, 2000), 0);
    cr_expect_str_eq(P[0].last.u.event.node, "mv-1");
    /* the old connection, silent past twice the timeout, is closed by the server; nothing ends */
    t0 = now_ms();
    int closed = 0;
    while (now_ms() - t0 < 3000 && !over && !closed) {
        peer_send(&P[0], &hb);
        peer_send(&P[2], &hb);
        over = peer_recv(&P[0], 100) == 0 && P[0].last.type == RDZV_ROUND_OVER;
        closed = fd_closed_within(P[1].fd, 50, NULL);
    }
    cr_assert(!over, "the round ended with the old connection: %s", P[0].last.u.round_over.message);
    cr_expect(closed, "the server kept the silent old connection for %llu ms",
              (unsigned long long)(now_ms() - t0));
    cr_expect_geq(now_ms() - t0, 1000, "the old connection was closed after %llu ms",
                  (unsigned long long)(now_ms() - t0));
    for (int k = 0; k < 5 && !over; k++) {
        peer_send(&P[0], &hb);
        peer_send(&P[2], &hb);
        over = peer_recv(&P[0], 100) == 0 && P[0].last.type == RDZV_ROUND_OVER;
    }
    cr_assert(!over, "the round ended: %s", P[0].last.u.round_over.message);
    /* the new one's does, at once */
    expect_round_over_at_close_of(&P[2]);
}

/* A spare given up on: node 1's move JOIN reached the server on a new
 * connection (the node moved) but its answer did not reach the launcher in
 * time, which closes the spare and goes on on the old connection. The node
 * goes back to the old one: the close ends nothing, the old one's
 * heartbeats keep it past three timeouts, and its close then ends the round. */
Test(rdzv_move, a_node_whose_new_connection_its_launcher_closed_goes_back_to_the_old_one) {
    run_moving_pair();
    move_node_1_to_P2();
    peer_close(&P[2]); /* given up on by the launcher */
    cr_assert(!beat_for_three_timeouts(2), "the round ended when the new connection closed: %s",
              P[0].last.u.round_over.message);
    /* the old one is the node's again: its close ends the round, at once */
    expect_round_over_at_close_of(&P[1]);
}

/* But not a node that was told something on the new connection (here an
 * event of node 0's, pushed to every node): its launcher never read it
 * there, so the close ends the round as before, at once. */
Test(rdzv_move, a_node_told_news_on_its_new_connection_does_not_go_back) {
    run_moving_pair();
    move_node_1_to_P2();
    rdzv_msg ev = {.type = RDZV_EVENT, .req_id = 5};
    ev.u.event.kind = RDZV_EVENT_CHECKPOINT;
    snprintf(ev.u.event.reason, sizeof ev.u.event.reason, "news");
    peer_send(&P[0], &ev);
    cr_assert_eq(peer_recv_type(&P[2], RDZV_EVENT, 2000), 0, "the event did not reach node 1");
    expect_round_over_at_close_of(&P[2]);
}
