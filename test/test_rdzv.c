/* The rendezvous server, as a real process, against real sockets: rounds,
 * ranks, timeouts, liveness, the key-value store, auth, bad input, jobs. */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rdzv_fanout.h"

static proc srv;
static int port;
static peer *P;

static void start(const char *const *extra) {
    P = calloc(8, sizeof *P);
    cr_assert_eq(rdzv_start(&srv, &port, extra), 0, "server did not start: %s", srv.out);
}

static void stop(void) {
    int st = rdzv_stop_with_peers(&srv, P, 8);
    free(P);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "server exit status %d: %s", st, srv.out);
}

static void setup(void) { start(NULL); }

TestSuite(rdzv, .init = setup, .fini = stop, .timeout = 60);

Test(rdzv, static_round_heterogeneous_nproc) {
    uint32_t nproc[3] = {2, 4, 1};
    const char *hosts[3] = {"n0", "n1", "n2"};
    /* join in reverse order: ranks come from --node-rank, not arrival */
    for (int i = 2; i >= 0; i--) {
        cr_assert_eq(peer_open(&P[i], port, NULL), 0);
        cr_assert_eq(peer_join(&P[i], "job", hosts[i], i, nproc[i], 3, 3, 0), 0);
    }
    uint32_t base = 0;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(peer_recv_type(&P[i], RDZV_ASSIGNED, 3000), 0, "node %d not assigned", i);
        const rdzv_msg *m = &P[i].last;
        cr_expect_eq(m->u.assigned.node_rank, (uint32_t)i);
        cr_expect_eq(m->u.assigned.base_rank, base);
        cr_expect_eq(m->u.assigned.world_size, 7);
        cr_expect_eq(m->u.assigned.nnodes, 3);
        cr_expect_eq(m->u.assigned.round, 1);
        cr_expect_str_eq(m->u.assigned.master_addr, "10.0.0.10");
        cr_expect_eq(m->u.assigned.master_port, 30000);
        cr_expect_eq(m->req_id, 77, "the assignment answers the JOIN");
        base += nproc[i];
    }
}

/* A client that goes away while the server writes to it must not kill the
 * server: libuv writes with write(2), so SIGPIPE has to be ignored. */
Test(rdzv, server_survives_writes_to_vanished_clients) {
    cr_expect_eq(proc_ignores(srv.pid, SIGPIPE), 1, "gpulaunch-rdzv does not ignore SIGPIPE");
}

Test(rdzv, static_duplicate_rank_names_both_nodes) {
    cr_assert_eq(peer_open(&P[0], port, NULL), 0);
    cr_assert_eq(peer_open(&P[1], port, NULL), 0);
    peer_join(&P[0], "dup", "alpha", 0, 1, 2, 2, 0);
    usleep(50000);
    peer_join(&P[1], "dup", "beta", 0, 1, 2, 2, 0);
    cr_assert_eq(peer_recv_type(&P[1], RDZV_ERROR, 3000), 0);
    const char *msg = P[1].last.u.error.message;
    cr_expect_eq(P[1].last.u.error.code, GPL_ERR_EXISTS);
    cr_expect(strstr(msg, "alpha") && strstr(msg, "beta") && strstr(msg, "node rank 0"), "%s", msg);
}

Test(rdzv, elastic_round_completes_after_last_call) {
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(peer_open(&P[i], port, NULL), 0);
        char h[8];
        snprintf(h, sizeof h, "e%d", i);
        peer_join(&P[i], "el", h, -1, 2, 2, 4, 400);
    }
    uint64_t t0 = now_ms();
    for (int i = 0; i < 2; i++)
        cr_assert_eq(peer_recv_type(&P[i], RDZV_ASSIGNED, 3000), 0);
    uint64_t waited = now_ms() - t0;
    cr_expect_geq(waited, 300, "the last-call window was not waited (%llu ms)",
                  (unsigned long long)waited);
    cr_expect_eq(P[0].last.u.assigned.nnodes, 2);
    cr_expect_eq(P[0].last.u.assigned.world_size, 4);
    uint32_t rank1[2];
    for (int i = 0; i < 2; i++)
        rank1[i] = P[i].last.u.assigned.node_rank;
    /* a third node arriving while the round runs waits, and members hear of it */
    cr_assert_eq(peer_open(&P[2], port, NULL), 0);
    peer_join(&P[2], "el", "e2", -1, 2, 2, 4, 400);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_WAITING, 3000), 0);
    cr_expect_eq(P[0].last.u.waiting.waiting, 1);
    /* 2 of 4 nodes: room to grow, so the round ends and the next takes it in */
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(peer_recv_type(&P[i], RDZV_ROUND_OVER, 3000), 0);
        cr_expect_eq(P[i].last.u.round_over.reason, RDZV_REASON_SCALE_UP);
        cr_expect(strstr(P[i].last.u.round_over.message, "e2") != NULL, "%s",
                  P[i].last.u.round_over.message);
    }
    for (int i = 0; i < 2; i++) {
        char h[8];
        snprintf(h, sizeof h, "e%d", i);
        peer_join(&P[i], "el", h, -1, 2, 2, 4, 400);
    }
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(peer_recv_type(&P[i], RDZV_ASSIGNED, 3000), 0);
        cr_expect_eq(P[i].last.u.assigned.round, 2);
        cr_expect_eq(P[i].last.u.assigned.nnodes, 3);
        cr_expect_eq(P[i].last.u.assigned.node_rank, i < 2 ? rank1[i] : 2u,
                     "node %d: members keep their ranks, the newcomer takes the next", i);
    }
}

Test(rdzv, full_round_keeps_running_and_a_waiting_node_hears_job_done) {
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(peer_open(&P[i], port, NULL), 0);
        char h[8];
        snprintf(h, sizeof h, "f%d", i);
        peer_join(&P[i], "full", h, -1, 1, 1, 2, 400);
    }
    for (int i = 0; i < 2; i++)
        cr_assert_eq(peer_recv_type(&P[i], RDZV_ASSIGNED, 3000), 0);
    cr_assert_eq(peer_open(&P[2], port, NULL), 0);
    peer_join(&P[2], "full", "f2", -1, 1, 1, 2, 400);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_WAITING, 3000), 0);
    /* no room (2 of 2): nobody is interrupted */
    cr_expect_neq(peer_recv_type(&P[0], RDZV_ROUND_OVER, 500), 0, "a full round was ended");
    for (int i = 0; i < 2; i++) {
        rdzv_msg d = {.type = RDZV_DONE, .req_id = 50};
        cr_assert_eq(peer_send(&P[i], &d), 0);
    }
    cr_assert_eq(peer_recv_type(&P[2], RDZV_JOB_DONE, 3000), 0, "the waiting node was not told");
}

Test(rdzv, join_timeout_says_who_is_missing) {
    cr_assert_eq(peer_open(&P[0], port, NULL), 0);
    rdzv_msg m = {.type = RDZV_JOIN, .req_id = 5};
    snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "lonely");
    snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "n0");
    m.u.join.nproc = 1;
    m.u.join.static_rank = 0;
    m.u.join.min_nodes = m.u.join.max_nodes = 3;
    m.u.join.join_timeout_ms = 2600;
    peer_send(&P[0], &m);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_PROGRESS, 3000), 0, "progress is pushed");
    cr_expect_geq(P[0].last.u.progress.waited_ms, 2000, "the first progress comes after 2 s");
    cr_expect_eq(P[0].last.u.progress.joined, 1);
    cr_expect_eq(P[0].last.u.progress.expected, 3);
    cr_expect(strstr(P[0].last.u.progress.missing, "1, 2") != NULL, "%s",
              P[0].last.u.progress.missing);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_ERROR, 3000), 0);
    const char *msg = P[0].last.u.error.message;
    cr_expect_eq(P[0].last.u.error.code, GPL_ERR_TIMEOUT);
    cr_expect(strstr(msg, "1 of 3 nodes") && strstr(msg, "node ranks 1, 2") &&
                  strstr(msg, "timed out after 2."),
              "%s", msg);
}

static void run_round(const char *job, int n) {
    for (int i = 0; i < n; i++) {
        cr_assert_eq(peer_open(&P[i], port, NULL), 0);
        char h[16];
        snprintf(h, sizeof h, "%s-%d", job, i);
        rdzv_msg m = {.type = RDZV_JOIN, .req_id = 9};
        snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "%s", job);
        snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "%s", h);
        m.u.join.nproc = 1;
        m.u.join.static_rank = i;
        m.u.join.min_nodes = m.u.join.max_nodes = (uint32_t)n;
        m.u.join.heartbeat_timeout_ms = 600;
        peer_send(&P[i], &m);
    }
    for (int i = 0; i < n; i++)
        cr_assert_eq(peer_recv_type(&P[i], RDZV_ASSIGNED, 3000), 0);
}

Test(rdzv, node_drop_tells_every_survivor) {
    run_round("drop", 3);
    uint64_t t0 = now_ms();
    peer_close(&P[1]);
    for (int i = 0; i < 3; i += 2) {
        cr_assert_eq(peer_recv_type(&P[i], RDZV_ROUND_OVER, 2000), 0);
        cr_expect_eq(P[i].last.u.round_over.reason, RDZV_REASON_DISCONNECT);
        cr_expect_eq(P[i].last.u.round_over.node_rank, 1);
        cr_expect_str_eq(P[i].last.u.round_over.hostname, "drop-1");
    }
    cr_expect_lt(now_ms() - t0, 500, "survivors told in %llu ms",
                 (unsigned long long)(now_ms() - t0));
}

/* A node reduced to its socket, for rounds of hundreds (peer's buffer is 2 MiB). */
static int read_exact(int fd, uint8_t *p, size_t n, uint64_t deadline) {
    size_t got = 0;
    while (got < n) {
        uint64_t now = now_ms();
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (now >= deadline || poll(&pfd, 1, (int)(deadline - now)) <= 0)
            return -1;
        ssize_t r = recv(fd, p + got, n - got, 0);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

static int small_recv_type(int fd, uint16_t type, rdzv_msg *m, int timeout_ms) {
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    static uint8_t buf[RDZV_MAX_FRAME + 4];
    for (;;) {
        if (read_exact(fd, buf, 4, deadline) != 0)
            return -1;
        size_t len = (size_t)buf[0] << 24 | (size_t)buf[1] << 16 | (size_t)buf[2] << 8 | buf[3];
        if (len > RDZV_MAX_FRAME || read_exact(fd, buf + 4, len, deadline) != 0 ||
            rdzv_decode(buf, len + 4, m, NULL, 0) != GPL_OK)
            return -1;
        if (m->type == type)
            return 0;
    }
}

/* Past RDZV_FANOUT_PARALLEL_MIN members the assignments and the round-over
 * notice are written by the fan-out's helper threads: every node still gets
 * exactly its own frame, at once. */
Test(rdzv, a_round_of_600_nodes_is_pushed_to_every_node, .timeout = 60) {
    enum { N = 600, DROP = 311 };
    static rdzv_bclient *bc[N];
    static uint32_t nproc[N];
    char err[256];
    for (int i = 0; i < N; i++) {
        cr_assert_eq(
            rdzv_bclient_connect("127.0.0.1", port, NULL, 0, 5000, &bc[i], err, sizeof err), GPL_OK,
            "node %d: %s", i, err);
        nproc[i] = 1 + (uint32_t)(i % 3);
        rdzv_msg m = {.type = RDZV_JOIN, .req_id = 1000 + (uint32_t)i};
        snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "big");
        snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "big-%d", i);
        snprintf(m.u.join.addr, sizeof m.u.join.addr, "10.1.%d.%d", i / 250, i % 250);
        m.u.join.nproc = nproc[i];
        m.u.join.static_rank = N - 1 - i; /* ranks in the reverse of join order */
        m.u.join.min_nodes = m.u.join.max_nodes = N;
        m.u.join.master_port = 31000;
        m.u.join.heartbeat_timeout_ms = 60000;
        rdzv_buf b;
        rdzv_buf_init(&b, 4096);
        cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
        cr_assert_eq(send(rdzv_bclient_fd(bc[i]), b.data, b.len, MSG_NOSIGNAL), (ssize_t)b.len);
        rdzv_buf_free(&b);
    }
    /* node rank r is the node that joined as N-1-r: base ranks are its prefix sums */
    uint32_t base[N + 1], world = 0;
    for (int r = 0; r < N; r++) {
        base[r] = world;
        world += nproc[N - 1 - r];
    }
    int wrong = 0;
    for (int i = 0; i < N; i++) {
        rdzv_msg m;
        cr_assert_eq(small_recv_type(rdzv_bclient_fd(bc[i]), RDZV_ASSIGNED, &m, 10000), 0,
                     "node %d was not assigned", i);
        uint32_t r = (uint32_t)(N - 1 - i);
        wrong += m.req_id != 1000 + (uint32_t)i || m.u.assigned.node_rank != r ||
                 m.u.assigned.base_rank != base[r] || m.u.assigned.world_size != world ||
                 m.u.assigned.nnodes != N || m.u.assigned.master_port != 31000 ||
                 strcmp(m.u.assigned.master_addr, "10.1.2.99") != 0;
    }
    cr_assert_eq(wrong, 0, "%d of %d nodes got someone else's assignment", wrong, N);
    uint64_t t0 = now_ms();
    rdzv_bclient_close(bc[DROP]);
    for (int i = 0; i < N; i++) {
        if (i == DROP)
            continue;
        rdzv_msg m;
        cr_assert_eq(small_recv_type(rdzv_bclient_fd(bc[i]), RDZV_ROUND_OVER, &m, 10000), 0,
                     "node %d was not told", i);
        wrong += m.u.round_over.node_rank != (uint32_t)(N - 1 - DROP) ||
                 strcmp(m.u.round_over.hostname, "big-311") != 0;
    }
    cr_expect_eq(wrong, 0, "%d survivors were told of another node", wrong);
    cr_expect_lt(now_ms() - t0, 2000, "%d survivors told in %llu ms", N - 1,
                 (unsigned long long)(now_ms() - t0));
    for (int i = 0; i < N; i++)
        if (i != DROP)
            rdzv_bclient_close(bc[i]);
}

/* The fan-out on its own, over socket pairs. */
Test(fanout, each_socket_gets_its_own_frame_and_what_it_did_not_take_is_reported) {
    enum { N = 300, SKIP = 7, CLOSED = 11 };
    static int sv[N][2];
    static rdzv_fan_item items[N];
    static uint8_t data[N * 32];
    size_t off = 0;
    for (int i = 0; i < N; i++) {
        cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]), 0);
        int len = snprintf((char *)data + off, 32, "frame %d for socket %d|", i, i);
        items[i] = (rdzv_fan_item){.fd = sv[i][0], .off = (uint32_t)off, .len = (uint32_t)len};
        off += (size_t)len;
    }
    items[SKIP].fd = -1;
    close(sv[CLOSED][1]); /* the peer is gone: EPIPE, and no SIGPIPE */
    rdzv_fanout *f = rdzv_fanout_new();
    cr_assert_not_null(f);
    rdzv_fanout_run(f, items, 10, data); /* below the threshold: no helper starts */
    cr_expect_eq(rdzv_fanout_helpers(f), 0);
    for (int round = 0; round < 3; round++) { /* the helpers serve run after run */
        rdzv_fanout_run(f, items, N, data);
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        int want = cpus - 1 < RDZV_FANOUT_MAX_HELPERS ? (int)cpus - 1 : RDZV_FANOUT_MAX_HELPERS;
        cr_expect_eq(rdzv_fanout_helpers(f), want);
        cr_expect_eq(items[SKIP].sent, 0);
        cr_expect_eq(items[CLOSED].sent, 0);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            if (i == SKIP || i == CLOSED)
                continue;
            char got[32];
            if (items[i].sent != items[i].len ||
                read_exact(sv[i][1], (uint8_t *)got, items[i].len, now_ms() + 2000) != 0 ||
                memcmp(got, data + items[i].off, items[i].len) != 0)
                bad++;
            if (round == 0 && i < 10) /* the run under the threshold sent these once */
                read_exact(sv[i][1], (uint8_t *)got, items[i].len, now_ms() + 2000);
        }
        cr_expect_eq(bad, 0, "%d sockets did not get exactly their frame (run %d)", bad, round);
    }
    rdzv_fanout_free(f);
    for (int i = 0; i < N; i++) {
        close(sv[i][0]);
        if (i != CLOSED)
            close(sv[i][1]);
    }
}

Test(rdzv, heartbeat_timeout_ends_the_round) {
    run_round("hb", 2);
    uint64_t t0 = now_ms();
    rdzv_msg hb = {.type = RDZV_HEARTBEAT};
    /* node 0 keeps beating, node 1 goes silent */
    int told = 0;
    while (now_ms() - t0 < 3000 && !told) {
        peer_send(&P[0], &hb);
        if (peer_recv(&P[0], 100) == 0 && P[0].last.type == RDZV_ROUND_OVER)
            told = 1;
    }
    cr_assert(told, "no ROUND_OVER after a heartbeat timeout");
    cr_expect_eq(P[0].last.u.round_over.reason, RDZV_REASON_HEARTBEAT);
    cr_expect_eq(P[0].last.u.round_over.node_rank, 1);
    cr_expect(strstr(P[0].last.u.round_over.message, "no heartbeat") != NULL, "%s",
              P[0].last.u.round_over.message);
    uint64_t took = now_ms() - t0;
    cr_expect(took >= 550 && took < 1500, "told after %llu ms (timeout 600)",
              (unsigned long long)took);
}

Test(rdzv, rejoin_after_failure_keeps_ranks_and_starts_round_two) {
    run_round("rj", 2);
    rdzv_msg f = {.type = RDZV_FAIL, .req_id = 3};
    snprintf(f.u.fail.message, sizeof f.u.fail.message, "rank 1 exited with code 3");
    peer_send(&P[1], &f);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_ROUND_OVER, 2000), 0);
    cr_expect_eq(P[0].last.u.round_over.reason, RDZV_REASON_FAILED);
    cr_expect(strstr(P[0].last.u.round_over.message, "exited with code 3") != NULL);
    for (int i = 0; i < 2; i++) {
        rdzv_msg m = {.type = RDZV_JOIN, .req_id = 10};
        snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "rj");
        snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "rj-%d", i);
        m.u.join.nproc = 1;
        m.u.join.static_rank = i;
        m.u.join.min_nodes = m.u.join.max_nodes = 2;
        peer_send(&P[i], &m);
    }
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(peer_recv_type(&P[i], RDZV_ASSIGNED, 3000), 0);
        cr_expect_eq(P[i].last.u.assigned.round, 2);
        cr_expect_eq(P[i].last.u.assigned.node_rank, (uint32_t)i);
    }
}

Test(rdzv, job_done_when_every_node_reports_done) {
    run_round("dn", 2);
    rdzv_msg d = {.type = RDZV_DONE, .req_id = 4};
    peer_send(&P[0], &d);
    peer_send(&P[1], &d);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_JOB_DONE, 2000), 0);
    cr_assert_eq(peer_recv_type(&P[1], RDZV_JOB_DONE, 2000), 0);
}

Test(rdzv, events_reach_every_node_and_attached_worker) {
    run_round("ev", 2);
    peer *w = &P[5];
    cr_assert_eq(peer_open(w, port, NULL), 0);
    cr_assert_eq(rdzv_bclient_attach(w->bc, "ev", 1), GPL_OK, "%s", rdzv_bclient_error(w->bc));
    rdzv_msg e = {.type = RDZV_EVENT, .req_id = 8};
    e.u.event.kind = RDZV_EVENT_CHECKPOINT;
    e.u.event.deadline_unix_ms = 123456;
    snprintf(e.u.event.reason, sizeof e.u.event.reason, "aws spot terminate");
    peer_send(&P[1], &e);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(peer_recv_type(&P[i], RDZV_EVENT, 2000), 0);
        cr_expect_str_eq(P[i].last.u.event.node, "ev-1");
        cr_expect_eq(P[i].last.u.event.deadline_unix_ms, 123456);
    }
    cr_assert_eq(rdzv_bclient_poll(w->bc, 1000), GPL_OK);
    cr_expect(rdzv_bclient_pushes(w->bc)->checkpoint_requested);
    /* and a worker hears when the round ends */
    peer_close(&P[0]);
    uint64_t t0 = now_ms();
    while (!rdzv_bclient_pushes(w->bc)->round_over && now_ms() - t0 < 2000)
        rdzv_bclient_poll(w->bc, 50);
    cr_expect(rdzv_bclient_pushes(w->bc)->round_over);
    cr_expect_eq(rdzv_bclient_set(w->bc, "k", "v", 1), GPL_ERR_ROUND_OVER,
                 "KV of an ended round is refused");
}

Test(rdzv, key_value_store) {
    run_round("kv", 1);
    rdzv_bclient *a, *b;
    char err[256];
    cr_assert_eq(rdzv_bclient_connect("127.0.0.1", port, NULL, 0, 2000, &a, err, sizeof err),
                 GPL_OK);
    cr_assert_eq(rdzv_bclient_connect("127.0.0.1", port, NULL, 0, 2000, &b, err, sizeof err),
                 GPL_OK);
    cr_assert_eq(rdzv_bclient_attach(a, "kv", 1), GPL_OK);
    cr_assert_eq(rdzv_bclient_attach(b, "kv", 1), GPL_OK);
    void *v;
    size_t n;
    cr_expect_eq(rdzv_bclient_get(a, "nccl/uid", &v, &n), GPL_ERR_NOT_FOUND);
    uint8_t uid[128];
    for (int i = 0; i < 128; i++)
        uid[i] = (uint8_t)(i * 7);
    cr_assert_eq(rdzv_bclient_set(a, "nccl/uid", uid, sizeof uid), GPL_OK);
    cr_assert_eq(rdzv_bclient_get(b, "nccl/uid", &v, &n), GPL_OK);
    cr_expect_eq(n, 128);
    cr_expect_eq(memcmp(v, uid, 128), 0);
    free(v);
    int64_t x;
    cr_expect_eq(rdzv_bclient_add(a, "ctr", 5, &x), GPL_OK);
    cr_expect_eq(x, 5);
    cr_expect_eq(rdzv_bclient_add(b, "ctr", -2, &x), GPL_OK);
    cr_expect_eq(x, 3);
    int sw;
    cr_expect_eq(rdzv_bclient_cas(a, "lead", NULL, 0, "a", 1, &sw), GPL_OK);
    cr_expect_eq(sw, 1);
    cr_expect_eq(rdzv_bclient_cas(b, "lead", NULL, 0, "b", 1, &sw), GPL_OK);
    cr_expect_eq(sw, 0, "set-if-absent loses the second time");
    cr_expect_eq(rdzv_bclient_cas(b, "lead", "a", 1, "b", 1, &sw), GPL_OK);
    cr_expect_eq(sw, 1);
    const char *keys[3] = {"lead", "nope", "ctr"};
    void *vals[3];
    size_t lens[3];
    cr_assert_eq(rdzv_bclient_mget(a, keys, 3, vals, lens), GPL_OK);
    cr_expect(vals[0] && lens[0] == 1 && memcmp(vals[0], "b", 1) == 0);
    cr_expect_null(vals[1]);
    cr_expect(vals[2] && lens[2] == 1 && memcmp(vals[2], "3", 1) == 0);
    for (int i = 0; i < 3; i++)
        free(vals[i]);
    cr_expect_eq(rdzv_bclient_del(a, "lead"), GPL_OK);
    cr_expect_eq(rdzv_bclient_get(a, "lead", &v, &n), GPL_ERR_NOT_FOUND);
    /* wait times out naming the missing key, and wakes when the key is set */
    const char *wk[2] = {"ctr", "later"};
    uint64_t t0 = now_ms();
    cr_expect_eq(rdzv_bclient_wait(a, wk, 2, 300), GPL_ERR_TIMEOUT);
    cr_expect_geq(now_ms() - t0, 250);
    cr_expect(strstr(rdzv_bclient_error(a), "later") != NULL, "%s", rdzv_bclient_error(a));
    pid_t pid = fork();
    if (pid == 0) {
        usleep(200000);
        rdzv_bclient *c;
        if (rdzv_bclient_connect("127.0.0.1", port, NULL, 0, 2000, &c, err, sizeof err) ||
            rdzv_bclient_attach(c, "kv", 1) || rdzv_bclient_set(c, "later", "x", 1))
            _exit(1);
        _exit(0);
    }
    t0 = now_ms();
    cr_expect_eq(rdzv_bclient_wait(a, wk, 2, 5000), GPL_OK, "%s", rdzv_bclient_error(a));
    cr_expect_lt(now_ms() - t0, 2000);
    int st;
    waitpid(pid, &st, 0);
    /* limits: an over-long key is refused locally, a key list over the max too */
    char longkey[RDZV_MAX_KEY + 2];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = 0;
    cr_expect_eq(rdzv_bclient_set(a, longkey, "v", 1), GPL_ERR_LIMIT);
    rdzv_bclient_close(a);
    rdzv_bclient_close(b);
}

Test(rdzv, two_jobs_are_isolated) {
    rdzv_bclient *a, *b;
    char err[256];
    cr_assert_eq(peer_open(&P[0], port, NULL), 0);
    cr_assert_eq(peer_open(&P[1], port, NULL), 0);
    peer_join(&P[0], "jobA", "a0", 0, 1, 1, 1, 0);
    peer_join(&P[1], "jobB", "b0", 0, 1, 1, 1, 0);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_ASSIGNED, 2000), 0);
    cr_assert_eq(peer_recv_type(&P[1], RDZV_ASSIGNED, 2000), 0);
    cr_assert_eq(rdzv_bclient_connect("127.0.0.1", port, NULL, 0, 2000, &a, err, sizeof err), 0);
    cr_assert_eq(rdzv_bclient_connect("127.0.0.1", port, NULL, 0, 2000, &b, err, sizeof err), 0);
    cr_assert_eq(rdzv_bclient_attach(a, "jobA", 1), GPL_OK);
    cr_assert_eq(rdzv_bclient_attach(b, "jobB", 1), GPL_OK);
    rdzv_bclient_set(a, "secret", "A", 1);
    void *v;
    size_t n;
    cr_expect_eq(rdzv_bclient_get(b, "secret", &v, &n), GPL_ERR_NOT_FOUND);
    /* a node failure in one job does not touch the other */
    peer_close(&P[0]);
    usleep(200000);
    cr_expect_eq(rdzv_bclient_set(b, "still", "ok", 2), GPL_OK);
    cr_expect_eq(rdzv_bclient_attach(a, "nojob", 1), GPL_ERR_NOT_FOUND);
    rdzv_bclient_close(a);
    rdzv_bclient_close(b);
}

Test(rdzv, resume_after_server_restart) {
    /* nodes re-register round 4 with a server that never saw the job */
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(peer_open(&P[i], port, NULL), 0);
        rdzv_msg m = {.type = RDZV_JOIN, .req_id = 21, .flags = RDZV_JOIN_RESUME};
        snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "res");
        snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "r%d", i);
        m.u.join.nproc = 2;
        m.u.join.static_rank = i;
        m.u.join.min_nodes = m.u.join.max_nodes = 2;
        m.u.join.round = 4;
        m.u.join.node_rank = (uint32_t)i;
        m.u.join.base_rank = (uint32_t)(2 * i);
        m.u.join.world_size = 4;
        m.u.join.nnodes = 2;
        peer_send(&P[i], &m);
        cr_assert_eq(peer_recv_type(&P[i], RDZV_ASSIGNED, 2000), 0);
        cr_expect_eq(P[i].last.u.assigned.round, 4);
    }
    rdzv_bclient *w;
    char err[256];
    cr_assert_eq(rdzv_bclient_connect("127.0.0.1", port, NULL, 0, 2000, &w, err, sizeof err), 0);
    cr_expect_eq(rdzv_bclient_attach(w, "res", 4), GPL_OK, "%s", rdzv_bclient_error(w));
    rdzv_bclient_close(w);
}

static size_t sink(char *p, size_t s, size_t n, void *ud) {
    char *buf = ud;
    size_t have = strlen(buf), add = s * n;
    if (have + add >= 8191)
        add = 8191 - have;
    memcpy(buf + have, p, add);
    buf[have + add] = 0;
    return s * n;
}

static long http_get(int hport, const char *path, char *out) {
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", hport, path);
    out[0] = 0;
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 3000L);
    long code = 0;
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    return code;
}

Test(rdzv_http, metrics_status_healthz, .timeout = 30) {
    P = calloc(8, sizeof *P);
    const char *extra[] = {"--http", "127.0.0.1:0", NULL};
    cr_assert_eq(rdzv_start(&srv, &port, extra), 0);
    cr_assert(proc_expect(&srv, " http 127.0.0.1:", 2000));
    int hport = (int)strtol(strstr(srv.out, " http 127.0.0.1:") + 16, NULL, 10);
    run_round("web", 2);
    static char body[8192];
    cr_expect_eq(http_get(hport, "/healthz", body), 200);
    cr_expect_str_eq(body, "ok\n");
    cr_expect_eq(http_get(hport, "/metrics", body), 200);
    cr_expect(strstr(body, "gpulaunch_rdzv_rounds_total 1\n") != NULL, "%s", body);
    cr_expect(strstr(body, "gpulaunch_rdzv_nodes 2\n") != NULL, "%s", body);
    static char all[1 << 18]; /* the whole text: every family clean and in the docs */
    cr_assert_eq(http_get_local(hport, "/metrics", all, sizeof all), 200);
    char why[1024];
    cr_expect_eq(prom_check(all, why, sizeof why), 0, "/metrics is not promtool-clean: %s", why);
    cr_expect_eq(prom_documented(all, why, sizeof why), 0, "not in docs/*.md: %s", why);
    cr_expect_eq(http_get(hport, "/status", body), 200);
    cr_expect(strstr(body, "\"run_id\":\"web\"") && strstr(body, "\"hostname\":\"web-1\"") &&
                  strstr(body, "\"last_heartbeat_age_s\":"),
              "%s", body);
    cr_expect_eq(http_get(hport, "/nope", body), 404);
    stop();
}

/* The HTTP side's memory goes only once libuv is done with both its handles:
 * with malloc's per-thread cache off and freed memory overwritten (glibc's
 * MALLOC_PERTURB_), a server that freed it at the first close callback read
 * a handle from freed memory at its exit and aborted in libuv. */
Test(rdzv_http, shutdown_frees_the_http_side_after_its_last_handle, .timeout = 30) {
    P = calloc(8, sizeof *P);
    setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0", 1);
    setenv("MALLOC_PERTURB_", "165", 1);
    const char *extra[] = {"--http", "127.0.0.1:0", NULL};
    int started = rdzv_start(&srv, &port, extra);
    unsetenv("GLIBC_TUNABLES");
    unsetenv("MALLOC_PERTURB_");
    cr_assert_eq(started, 0);
    cr_assert(proc_expect(&srv, " http 127.0.0.1:", 2000));
    int hport = (int)strtol(strstr(srv.out, " http 127.0.0.1:") + 16, NULL, 10);
    static char body[8192];
    cr_expect_eq(http_get(hport, "/metrics", body), 200);
    stop(); /* exit 0 expected, not libuv's assertion */
}

Test(rdzv_auth, token_required_and_checked, .timeout = 30) {
    P = calloc(8, sizeof *P);
    char path[] = "/tmp/gpl-token-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(write(fd, "s3cret\n", 7) == 7);
    close(fd);
    const char *extra[] = {"--token-file", path, NULL};
    cr_assert_eq(rdzv_start(&srv, &port, extra), 0);
    rdzv_bclient *c = NULL;
    char err[512];
    cr_expect_eq(rdzv_bclient_connect("127.0.0.1", port, NULL, 0, 1000, &c, err, sizeof err),
                 GPL_ERR_AUTH, "no token: %s", err);
    cr_expect(strstr(err, "requires a token") != NULL, "%s", err);
    cr_expect_eq(rdzv_bclient_connect("127.0.0.1", port, "wrong", 5, 1000, &c, err, sizeof err),
                 GPL_ERR_AUTH);
    cr_expect(strstr(err, "wrong or missing rendezvous token") != NULL, "%s", err);
    cr_assert(proc_expect(&srv, "refused 127.0.0.1:", 2000), "refusal logged with the peer");
    cr_expect_eq(rdzv_bclient_connect("127.0.0.1", port, "s3cret", 6, 1000, &c, err, sizeof err),
                 GPL_OK, "%s", err);
    rdzv_bclient_close(c);
    unlink(path);
    stop();
}
