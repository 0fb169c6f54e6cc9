/* Peer probes (rendezvous/rdzv_peer.h, docs/protocol.md "Suspicion and
 * probes") on a real gpulaunch-rdzv with real launcher clients (rdzv_client,
 * on a libuv loop in this process) and their UDP ports: a node whose link to
 * the rendezvous alone went silent is reached by its peers' probes and not
 * lost; a node that answers nobody is lost within a second, the peers that
 * could not reach it named. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rdzv_client_int.h"

#define NODES 3

static proc srv;
static int port, hport;
static uv_loop_t loop;

typedef struct node {
    rdzv_client *c;
    int assigned, over, errors;
    uint32_t over_reason;
    char over_msg[1025];
} node;

static node nodes[NODES];

static void on_assigned(rdzv_client *c, const rdzv_assignment *a) {
    node *n = rdzv_client_data(c);
    (void)a;
    n->assigned = 1;
}

static void on_round_over(rdzv_client *c, uint32_t round, uint32_t reason, uint32_t node_rank,
                          const char *hostname, const char *message) {
    node *n = rdzv_client_data(c);
    (void)round, (void)node_rank, (void)hostname;
    n->assigned = 0;
    n->over++;
    n->over_reason = reason;
    snprintf(n->over_msg, sizeof n->over_msg, "%s", message);
}

static void on_error(rdzv_client *c, gpl_result_t code, const char *message) {
    node *n = rdzv_client_data(c);
    n->errors++;
    cr_log_error("client error %d: %s", code, message);
}

static void setup(void) {
    const char *extra[] = {"--http", "127.0.0.1:0", "--log-level", "debug", NULL};
    cr_assert_eq(rdzv_start(&srv, &port, extra), 0, "server did not start: %s", srv.out);
    cr_assert(proc_expect(&srv, " http 127.0.0.1:", 2000), "%s", srv.out);
    hport = (int)strtol(strstr(srv.out, " http 127.0.0.1:") + 16, NULL, 10);
    uv_loop_init(&loop);
    memset(nodes, 0, sizeof nodes);
}

/* Runs the loop for ms; nodes 0..NODES-2 say every 50 ms that their workers
 * wait in a collective (as a launcher does), from `since` on. */
static void pump(int ms, uint64_t since) {
    uint64_t end = now_ms() + (uint64_t)ms, said = 0;
    do {
        uv_run(&loop, UV_RUN_NOWAIT);
        proc_expect(&srv, "\x01never\x01", 0);
        uint64_t t = now_ms();
        if (since && t - said >= 50) {
            for (int i = 0; i < NODES - 1; i++)
                if (nodes[i].assigned)
                    rdzv_client_waiting(nodes[i].c, (uint32_t)(t - since));
            said = t;
        }
        usleep(1000);
    } while (now_ms() < end);
}

static void teardown(void) {
    for (int i = 0; i < NODES; i++)
        rdzv_client_close(nodes[i].c);
    pump(100, 0);
    cr_expect_eq(uv_loop_close(&loop), 0, "a handle was left open");
    proc_kill(&srv, SIGTERM);
    int st = proc_wait(&srv, 5000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "server exit status %d: %s", st, srv.out);
}

TestSuite(peerprobe, .init = setup, .fini = teardown, .timeout = 60);

static double metric(const char *name) {
    static char body[65536];
    cr_assert_eq(http_get_local(hport, "/metrics", body, sizeof body), 200);
    return prom_value(body, name);
}

/* NODES launcher clients of one static job, heartbeats every interval_ms, all assigned. */
static void start_job(const char *run, uint32_t interval_ms) {
    for (uint32_t i = 0; i < NODES; i++) {
        char host[64], inst[64];
        snprintf(host, sizeof host, "%s-%u", run, i);
        snprintf(inst, sizeof inst, "i-%s-%u", run, i);
        rdzv_join_params jp = {.run_id = run,
                               .hostname = host,
                               .addr = "127.0.0.1",
                               .instance = inst,
                               .master_port = 29500,
                               .nproc = 1,
                               .static_rank = (int32_t)i,
                               .min_nodes = NODES,
                               .max_nodes = NODES,
                               .join_timeout_ms = 10000,
                               .heartbeat_interval_ms = interval_ms,
                               .heartbeat_timeout_ms = 5000};
        rdzv_client_options o = {.host = "127.0.0.1", .port = port, .connect_timeout_ms = 10000};
        rdzv_client_callbacks cb = {.data = &nodes[i],
                                    .on_assigned = on_assigned,
                                    .on_round_over = on_round_over,
                                    .on_error = on_error};
        char err[256];
        cr_assert_eq(rdzv_client_start(&loop, &o, &jp, &cb, &nodes[i].c, err, sizeof err), GPL_OK,
                     "%s", err);
    }
    uint64_t until = now_ms() + 5000;
    while (now_ms() < until && !(nodes[0].assigned && nodes[1].assigned && nodes[2].assigned))
        pump(20, 0);
    for (int i = 0; i < NODES; i++)
        cr_assert(nodes[i].assigned, "node %d not assigned: %s", i, srv.out);
    pump(300, 0); /* the joins' calibration pings answered */
}

Test(peerprobe, a_node_only_its_link_to_the_rendezvous_lost_is_reached_by_its_peers_and_kept) {
    start_job("link", 1000);
    rdzv_client_freeze_link(nodes[2].c); /* silent to the server; its UDP port still answers */
    uint64_t t0 = now_ms();
    pump(3000, t0); /* the others wait for it for 3 s: well past a probe's deadline */
    for (int i = 0; i < NODES; i++)
        cr_expect_eq(nodes[i].over, 0, "node %d: the round ended: %s", i, nodes[i].over_msg);
    double reached = metric("gpulaunch_rdzv_probe_relays_total{result=\"reached\"}");
    double answered = metric("gpulaunch_rdzv_probes_total{result=\"answered\"}");
    cr_expect_geq(reached, 1, "no peer reached it");
    cr_expect_geq(answered, reached, "answered %g < reached %g", answered, reached);
    cr_expect_eq(metric("gpulaunch_rdzv_probes_total{result=\"unanswered\"}"), 0);
    cr_expect(proc_expect(&srv,
                          "but not the rendezvous's: the link between the rendezvous and "
                          "it is slow or lossy, the node is not lost",
                          1000),
              "the server did not say why it kept the node: %s", srv.out);
    /* past the heartbeat timeout it is kept while its peers reach it (asked
     * again before the timeout and every second after it), up to twice the
     * timeout of silence to the rendezvous: then lost, the evidence said */
    uint64_t until = t0 + 13000;
    while (nodes[0].over == 0 && now_ms() < until)
        pump(50, t0);
    cr_assert_eq(nodes[0].over, 1, "the round did not end at twice the timeout: %s", srv.out);
    uint64_t took = now_ms() - t0;
    cr_expect(took >= 9000 && took < 11500, "ended %llu ms after the link went silent",
              (unsigned long long)took);
    cr_expect(strstr(nodes[0].over_msg, "its peers' UDP probes last reached it") != NULL &&
                  strstr(nodes[0].over_msg, "has not heard from it for 2 x the timeout") != NULL,
              "no evidence: %s", nodes[0].over_msg);
    cr_log_info("a node whose link to the rendezvous alone went silent: kept by its peers, "
                "ended at %llu ms",
                (unsigned long long)took);
}

Test(peerprobe, a_node_that_answers_nobody_is_lost_within_a_second_and_its_probers_named) {
    start_job("gone", 1000);
    rdzv_client_freeze(nodes[2].c); /* the host vanished: nothing answers */
    uint64_t t0 = now_ms();
    while (nodes[0].over == 0 && now_ms() < t0 + 3000)
        pump(10, t0);
    uint64_t took = now_ms() - t0;
    cr_assert_eq(nodes[0].over, 1, "node 0 was not told: %s", srv.out);
    cr_expect_eq(nodes[0].over_reason, RDZV_REASON_HEARTBEAT);
    /* the deadline (250 ms), the peers' probes and the sweep (100 ms): far from the 5 s timeout */
    cr_expect(took < 1000, "told %llu ms after the waits began", (unsigned long long)took);
    const char *want[] = {"answered no ping within 250 ms while 2 of its 2 peer node(s) waited",
                          "nor did it answer the UDP probes of 2 peer node(s) (", "gone-0",
                          "gone-1"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_expect(strstr(nodes[0].over_msg, want[i]) != NULL, "'%s' not in: %s", want[i],
                  nodes[0].over_msg);
    pump(200, 0);
    cr_expect_eq(metric("gpulaunch_rdzv_probe_relays_total{result=\"unreached\"}"), 2);
    cr_expect_eq(metric("gpulaunch_rdzv_probe_relays_total{result=\"reached\"}"), 0);
    cr_expect_eq(metric("gpulaunch_rdzv_probes_total{result=\"unanswered\"}"), 1);
    cr_log_info("vanished node told in %llu ms with peer probes", (unsigned long long)took);
}

/* Heartbeats every 2 s: the silence threshold (the worst gap + 1.5 s) comes
 * within 2 s of the timeout, so a node gone silent, with no collective to
 * point at it, is left to the timeout; its peers are asked before it, and it
 * is lost at the timeout with what they found. */
Test(peerprobe, a_node_left_to_the_timeout_is_lost_at_it_when_no_peer_reaches_it) {
    start_job("late", 2000);
    pump(4500, 0); /* two heartbeats: its gaps are known */
    rdzv_client_freeze(nodes[2].c);
    uint64_t t0 = now_ms();
    while (nodes[0].over == 0 && now_ms() < t0 + 8000)
        pump(20, 0);
    uint64_t took = now_ms() - t0;
    cr_assert_eq(nodes[0].over, 1, "node 0 was not told: %s", srv.out);
    /* its last frame came up to one interval before the freeze */
    cr_expect(took >= 2800 && took < 5600, "told %llu ms after the freeze",
              (unsigned long long)took);
    const char *want[] = {"sent no heartbeat for",
                          "nor did it answer the UDP probes of 2 peer node(s)", "late-0", "late-1"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_expect(strstr(nodes[0].over_msg, want[i]) != NULL, "'%s' not in: %s", want[i],
                  nodes[0].over_msg);
    cr_log_info("left to the timeout: told %llu ms after the freeze", (unsigned long long)took);
}
