/* Peer probes (rendezvous/rdzv_peer.h, docs/protocol.md "Suspicion and
 * probes") on a real gpulaunch-rdzv with real launcher clients (rdzv_client,
 * on a libuv loop in this process) and their UDP ports: a node whose link to
 * the rendezvous alone went silent is reached by its peers' probes and not
 * lost; a node that answers nobody is lost within a second, the peers that
 * could not reach it named. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rdzv_client_int.h"
#include "rdzv_codec.h"
#include "rdzv_peer.h"

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

/* Node i of job run (NODES nodes, heartbeats every interval_ms) on loop l. */
static gpl_result_t start_client(uv_loop_t *l, const char *run, uint32_t i, uint32_t interval_ms,
                                 const rdzv_client_callbacks *cb, rdzv_client **out, char *err,
                                 size_t errlen) {
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
    return rdzv_client_start(l, &o, &jp, cb, out, err, errlen);
}

/* Nodes 0..n-1 of job run as clients in this process, all assigned (the
 * others of its NODES elsewhere). */
static void start_nodes(const char *run, uint32_t interval_ms, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        rdzv_client_callbacks cb = {.data = &nodes[i],
                                    .on_assigned = on_assigned,
                                    .on_round_over = on_round_over,
                                    .on_error = on_error};
        char err[256];
        cr_assert_eq(start_client(&loop, run, i, interval_ms, &cb, &nodes[i].c, err, sizeof err),
                     GPL_OK, "%s", err);
    }
    uint64_t until = now_ms() + 5000;
    int all = 0;
    while (now_ms() < until && !all) {
        pump(20, 0);
        all = 1;
        for (uint32_t i = 0; i < n; i++)
            all &= nodes[i].assigned;
    }
    for (uint32_t i = 0; i < n; i++)
        cr_assert(nodes[i].assigned, "node %u not assigned: %s", i, srv.out);
}

/* NODES launcher clients of one static job, heartbeats every interval_ms, all assigned. */
static void start_job(const char *run, uint32_t interval_ms) {
    start_nodes(run, interval_ms, NODES);
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

/* The server restarted with --probes `probes` (the test's clients are not
 * started yet). */
static void restart_server(const char *probes) {
    proc_kill(&srv, SIGTERM);
    proc_wait(&srv, 5000);
    const char *extra[] = {"--http",   "127.0.0.1:0", "--log-level", "debug",
                           "--probes", probes,        NULL};
    cr_assert_eq(rdzv_start(&srv, &port, extra), 0, "server did not start: %s", srv.out);
    cr_assert(proc_expect(&srv, " http 127.0.0.1:", 2000), "%s", srv.out);
    hport = (int)strtol(strstr(srv.out, " http 127.0.0.1:") + 16, NULL, 10);
}

/* A silence of the link and a launcher's stop together (the adverse hour's
 * 20th try): node 2's frames stop reaching the server (a loss waiting out a
 * long retransmission timeout), and as the silence rule's ping goes out and
 * its peers are asked, its launcher stops for 1.2 s. Their window covers a
 * launcher's stall (1.5 s + 3 x their round trips): they reach it when it runs
 * again and it is kept. The old window (what was left of the ping's 250 ms)
 * ended the round 3 s into the silence. UDP probes alone (--probes udp):
 * kernel probes would have reached it early, before the stop. */
Test(peerprobe, a_launcher_stopped_as_its_peers_are_asked_is_reached_when_it_runs_again) {
    restart_server("udp");
    start_job("stall", 500);
    pump(1500, 0); /* its gaps known: 0.5 s, the silence threshold 2.5 s */
    rdzv_client_freeze_link(nodes[2].c);
    uint64_t t0 = now_ms();
    /* no collective waits: the silence rule pings it (its peers asked 100 ms later) */
    int probed = 0;
    while (!probed && now_ms() < t0 + 4000) {
        pump(2, 0);
        probed = proc_expect(&srv, "stall-2 sent nothing for", 2);
    }
    cr_assert(probed, "not probed: %s", srv.out);
    rdzv_client_stop_peer(nodes[2].c, 1);
    pump(1200, 0);
    rdzv_client_stop_peer(nodes[2].c, 0);
    pump(600, 0); /* before the heartbeat timeout's own verdict */
    for (int i = 0; i < NODES; i++)
        cr_expect_eq(nodes[i].over, 0, "node %d: the round ended %llu ms into the silence: %s", i,
                     (unsigned long long)(now_ms() - t0), nodes[i].over_msg);
    cr_expect(proc_expect(&srv, "suspected (silent), answered node stall-", 500),
              "no peer reached it when its launcher ran again: %s", srv.out);
    cr_expect_geq(metric("gpulaunch_rdzv_probe_relays_total{result=\"reached\"}"), 1);
}

/* Heartbeats every 2 s: the silence threshold (the worst gap + 1.5 s) comes
 * within 2 s of the timeout, so a node gone silent, with no collective to
 * point at it and no kernel probes (--probes udp: with them it is found at
 * its worst gap + 0.25 s: the kernel-probe tests below), is left to the timeout; its peers
 * are asked before it, and it is lost at the timeout with what they found. */
Test(peerprobe, a_node_left_to_the_timeout_is_lost_at_it_when_no_peer_reaches_it) {
    restart_server("udp");
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

/* ---- kernel probes (rendezvous/rdzv_kprobe.h, docs/protocol.md rule 8) ---- */

static uint64_t ready_at;

/* Starts the job with heartbeats every 500 ms and runs it until the machine
 * checks are done and every node's gaps are known. */
static void start_kernel_job(const char *run) {
    start_job(run, 500);
    pump(2500, 0);
    cr_assert_eq(metric("gpulaunch_rdzv_machine_checks_total{result=\"reached\"}"), NODES,
                 "the nodes' TCP ports were not all checked: %s", srv.out);
    ready_at = now_ms();
}

Test(peerprobe, a_vanished_node_is_found_by_kernel_probes_in_under_two_seconds) {
    start_kernel_job("vanish");
    rdzv_client_freeze(nodes[2].c); /* the host vanished: no UDP answer, no TCP port */
    uint64_t t0 = now_ms();
    while (nodes[0].over == 0 && now_ms() < t0 + 4000)
        pump(10, 0);
    uint64_t took = now_ms() - t0;
    cr_assert_eq(nodes[0].over, 1, "node 0 was not told: %s", srv.out);
    /* its last heartbeat up to 0.5 s before the freeze; 1.25 s of silence, the probes' 250 ms */
    cr_expect(took >= 750 && took < 2100, "told %llu ms after the freeze",
              (unsigned long long)took);
    const char *want[] = {"node vanish-2 (127.0.0.1, node rank 2) sent nothing for ",
                          "answered no ping within 250 ms; 2 of the 2 peer node(s) asked (",
                          "reached neither it nor its machine within 250 ms (UDP and TCP probes)"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_expect(strstr(nodes[0].over_msg, want[i]) != NULL, "'%s' not in: %s", want[i],
                  nodes[0].over_msg);
    pump(200, 0);
    cr_expect_eq(metric("gpulaunch_rdzv_probe_relays_total{result=\"unreached\"}"), 2);
    cr_expect_eq(metric("gpulaunch_rdzv_probe_relays_total{result=\"machine\"}"), 0);
    cr_log_info("vanished node, no collective: told %llu ms after the freeze with kernel probes",
                (unsigned long long)took);
}

static void child_quiet(rdzv_client *c, const rdzv_assignment *a) { (void)c, (void)a; }

/* Node 2 of job run in a process of its own (its launcher to be stopped):
 * forked before this process's clients open their sockets. */
static pid_t child_node(const char *run) {
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    uv_loop_t l;
    uv_loop_init(&l);
    rdzv_client_callbacks cb = {.on_assigned = child_quiet};
    rdzv_client *c;
    char err[256];
    if (start_client(&l, run, NODES - 1, 500, &cb, &c, err, sizeof err) != GPL_OK)
        _exit(3);
    uv_run(&l, UV_RUN_DEFAULT);
    _exit(0);
}

/* A launcher stopped (SIGSTOP) for 2.2 s, past the early threshold: its
 * kernel completes the peers' connections, so it is left to the heartbeat
 * rules and kept; stopped for good, it is lost by them (its worst gap is
 * 2.2 s now, so its silence threshold comes near the timeout: the timeout
 * judges, its peers asked first). */
Test(peerprobe,
     a_stopped_launcher_is_kept_past_the_early_threshold_and_lost_by_the_heartbeat_rules) {
    pid_t pid = child_node("stopped");
    cr_assert_gt(pid, 0);
    start_nodes("stopped", 500, NODES - 1);
    pump(2500, 0);
    cr_assert_eq(metric("gpulaunch_rdzv_machine_checks_total{result=\"reached\"}"), NODES, "%s",
                 srv.out);
    kill(pid, SIGSTOP);
    pump(2200, 0);
    kill(pid, SIGCONT);
    pump(1000, 0);
    for (int i = 0; i < NODES - 1; i++)
        cr_expect_eq(nodes[i].over, 0, "node %d: a stopped launcher's round ended: %s", i,
                     nodes[i].over_msg);
    cr_expect_geq(metric("gpulaunch_rdzv_probe_relays_total{result=\"machine\"}"), 2,
                  "its machine was not probed: %s", srv.out);
    kill(pid, SIGSTOP);
    uint64_t t0 = now_ms();
    while (nodes[0].over == 0 && now_ms() < t0 + 8000)
        pump(10, 0);
    uint64_t took = now_ms() - t0;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    cr_assert_eq(nodes[0].over, 1, "node 0 was not told: %s", srv.out);
    /* the timeout (5 s) after its last frame, up to 0.5 s before the stop */
    cr_expect(took >= 4000 && took < 6500, "told %llu ms after the stop", (unsigned long long)took);
    cr_expect(strstr(nodes[0].over_msg, "sent no heartbeat for ") != NULL &&
                  strstr(nodes[0].over_msg, "nor did it answer the UDP probes of 2 peer node(s)") !=
                      NULL &&
                  strstr(nodes[0].over_msg, "reached neither") == NULL,
              "%s\n%s", nodes[0].over_msg, srv.out);
    cr_log_info("a stopped launcher: kept through 2.2 s; stopped for good, told after %llu ms",
                (unsigned long long)took);
}

static int probe_ok;
static uint64_t probe_end;
static void on_probe(void *data, uint32_t id, int ok, uint32_t rtt_ms) {
    (void)data, (void)id, (void)rtt_ms;
    probe_ok = ok;
    probe_end = now_ms();
}

/* Probes 127.0.0.1:port from a with flags; what it said and after how long. */
static int probe_of(rdzv_peer *a, uint16_t to, uint32_t deadline_ms, uint16_t flags,
                    uint64_t *took) {
    probe_ok = -1;
    uint64_t t0 = now_ms();
    rdzv__peer_probe(a, 1, "127.0.0.1", to, deadline_ms, flags);
    while (probe_ok < 0 && now_ms() < t0 + deadline_ms + 1000)
        pump(5, 0);
    *took = probe_end - t0;
    return probe_ok;
}

Test(peerprobe, a_kernel_probe_tells_a_machine_a_closed_port_and_a_prober_out_of_descriptors) {
    rdzv_peer *a, *b;
    char err[160];
    cr_assert_eq(rdzv__peer_open(&loop, on_probe, NULL, &a, err, sizeof err), GPL_OK, "%s", err);
    cr_assert_eq(rdzv__peer_open(&loop, on_probe, NULL, &b, err, sizeof err), GPL_OK, "%s", err);
    cr_assert(rdzv__peer_kernel(a) && rdzv__peer_kernel(b), "no TCP port of the same number");
    uint64_t took;
    cr_expect_eq(probe_of(a, rdzv__peer_port(b), 1000, RDZV_PROBE_MACHINE, &took),
                 RDZV_PROBE_OK_MACHINE);
    cr_expect(took < 200, "a machine check took %llu ms", (unsigned long long)took);
    cr_expect_eq(probe_of(a, rdzv__peer_port(b), 1000, RDZV_PROBE_KERNEL, &took),
                 RDZV_PROBE_OK_NODE, "the node itself answers UDP");
    /* muted: no UDP answer and its TCP port closed (a refusal is no machine's word) */
    rdzv__peer_mute(b);
    pump(50, 0);
    cr_expect_eq(probe_of(a, rdzv__peer_port(b), 300, RDZV_PROBE_KERNEL, &took),
                 RDZV_PROBE_OK_NONE);
    cr_expect(took >= 300 && took < 450, "ended %llu ms in (deadline 300 ms)",
              (unsigned long long)took);
    /* out of descriptors: this prober cannot say */
    struct rlimit was, low;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &was), 0);
    int next = dup(0);
    cr_assert_geq(next, 0);
    close(next);
    low = was;
    low.rlim_cur = (rlim_t)next;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    int ok = probe_of(a, rdzv__peer_port(b), 300, RDZV_PROBE_MACHINE, &took);
    setrlimit(RLIMIT_NOFILE, &was);
    cr_expect_eq(ok, RDZV_PROBE_OK_UNABLE, "out of descriptors, it said %d", ok);
    rdzv__peer_close(a);
    rdzv__peer_close(b);
    pump(50, 0);
}

/* A listener whose queue is full drops the SYN (as a lost one is): the
 * probe's later attempts (every deadline / 4) reach it once there is room,
 * where the first SYN's own retransmission (1 s) would come too late. */
Test(peerprobe, a_kernel_probe_tries_again_when_its_first_syn_is_dropped) {
    rdzv_peer *a;
    char err[160];
    cr_assert_eq(rdzv__peer_open(&loop, on_probe, NULL, &a, err, sizeof err), GPL_OK, "%s", err);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(l, 0), 0);
    cr_assert_eq(getsockname(l, (struct sockaddr *)&sa, &len), 0);
    int fill[3];
    for (int i = 0; i < 3; i++) { /* the queue (1 with backlog 0) full, the rest dropped */
        fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        (void)connect(fill[i], (struct sockaddr *)&sa, sizeof sa);
    }
    usleep(50000);
    probe_ok = -1;
    uint64_t t0 = now_ms();
    rdzv__peer_probe(a, 1, "127.0.0.1", ntohs(sa.sin_port), 800, RDZV_PROBE_MACHINE);
    pump(100, 0);
    cr_expect_eq(probe_ok, -1, "the full queue took the first attempt");
    int c = accept(l, NULL, NULL); /* room for one */
    cr_assert_geq(c, 0);
    while (probe_ok < 0 && now_ms() < t0 + 1800)
        pump(5, 0);
    uint64_t took = probe_end - t0;
    cr_expect_eq(probe_ok, RDZV_PROBE_OK_MACHINE, "said %d", probe_ok);
    cr_expect(took < 800, "reached %llu ms in (deadline 800 ms)", (unsigned long long)took);
    close(c);
    for (int i = 0; i < 3; i++)
        close(fill[i]);
    close(l);
    rdzv__peer_close(a);
    pump(50, 0);
}
