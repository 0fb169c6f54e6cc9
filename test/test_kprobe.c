/* Machine checks and kernel probes (docs/protocol.md, rule 8) on a real
 * gpulaunch-rdzv, with raw protocol peers saying what their probes found: a
 * silent node whose machine no peer reaches is lost at the early threshold,
 * one whose machine answers is left to the silence rules; the words needed
 * for an early verdict (its checker's), a port no peer reaches said once,
 * peers far away given their round trips, the peers at the timeout given a
 * stall. The waiting job's suspicion and pings: test_probe.c. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "probe_bed.h"

/* How raw node i behaves: silent (sends and reads nothing: vanished), and
 * what it says to a machine check, to a kernel probe and to a UDP-only probe
 * of another node (RDZV_PROBE_OK_*); to a kernel probe of a node whose port
 * it checked, checker_ok when set; what it was asked and heard: checks,
 * the nodes whose ports it checked (a bit each), kernel probes and the
 * deadline of the last one, UDP probes, a round's end; checks_of[j]: how
 * often it was asked to check node j's port. */
typedef struct rawnode {
    int silent, check_ok, kernel_ok, udp_ok, checker_ok_set, checker_ok;
    int checks, checked, checks_of[4], kernels, udps, over;
    uint32_t kernel_deadline_ms;
    uint32_t beat_ms;      /* its heartbeats this often (0: 500 ms) */
    uint32_t udp_delay_ms; /* its word on a UDP probe this late (0: at once) */
    uint32_t udp_deadline_ms;
    rdzv_msg udp_pending; /* a word held back until udp_due */
    uint64_t udp_due;
} rawnode;
static rawnode R[4];

/* Raw node i answers the probe request m as R[i] says, and counts it. */
static void answer_probe(int i, const rdzv_msg *m) {
    rdzv_msg a = {.type = RDZV_PROBE_ACK, .req_id = m->req_id};
    int of = m->u.probe_req.port - 40000;
    if (m->flags & RDZV_PROBE_MACHINE) {
        R[i].checks++;
        R[i].checked |= of >= 0 && of < 4 ? 1 << of : 0;
        R[i].checks_of[of >= 0 && of < 4 ? of : 0] += of >= 0 && of < 4;
        a.u.probe_ack.ok = (uint8_t)R[i].check_ok;
    } else if (m->flags & RDZV_PROBE_KERNEL) {
        R[i].kernels++;
        R[i].kernel_deadline_ms = m->u.probe_req.deadline_ms;
        a.u.probe_ack.ok =
            (uint8_t)(R[i].checker_ok_set && of >= 0 && of < 4 && (R[i].checked & (1 << of))
                          ? R[i].checker_ok
                          : R[i].kernel_ok);
    } else {
        R[i].udps++;
        R[i].udp_deadline_ms = m->u.probe_req.deadline_ms;
        a.u.probe_ack.ok = (uint8_t)R[i].udp_ok;
        if (R[i].udp_delay_ms) {
            R[i].udp_pending = a;
            R[i].udp_due = now_ms() + R[i].udp_delay_ms;
            return;
        }
    }
    peer_send(&P[i], &a);
}

static void setup(void) {
    probe_bed_on_probe = answer_probe;
    probe_bed_start(NULL);
}

TestSuite(kprobe, .init = setup, .fini = probe_bed_stop, .timeout = 60);

/* n nodes of one static job that make and answer kernel probes (a peer
 * port each, 40000 + i; raw nodes listen on none: what they say is set in
 * R); the nodes whose calibration pong is delayed (pong_delay_ms) are
 * awaited last, so that the others' round trips stay short. */
static void kernel_round_of(const char *job, int n) {
    memset(R, 0, sizeof R);
    for (int i = 0; i < n; i++) {
        R[i].check_ok = RDZV_PROBE_OK_MACHINE;
        probe_bed_join(i, job, n, RDZV_JOIN_PROBE | RDZV_JOIN_PEER | RDZV_JOIN_KERNEL,
                       (uint16_t)(40000 + i));
    }
    for (int slow = 0; slow < 2; slow++)
        for (int i = 0; i < n; i++)
            if ((pong_delay_ms[i] != 0) == slow)
                await_assigned(i, 1);
}

/* Runs nodes 0..n-1 for ms: the live ones beat every 500 ms, answer pings
 * and say what R sets to probe requests. Returns early, 1, once node watch
 * hears ROUND_OVER (left in P[watch].last). last_beat: when node `silent`
 * last beat (set while it is not silent). */
static int run_nodes(int n, int ms, int watch, uint64_t *last_beat) {
    uint64_t until = now_ms() + (uint64_t)ms, next[4] = {0};
    while (now_ms() < until) {
        for (int i = 0; i < n; i++) {
            if (R[i].silent)
                continue;
            if (R[i].udp_due && now_ms() >= R[i].udp_due) {
                peer_send(&P[i], &R[i].udp_pending);
                R[i].udp_due = 0;
            }
            if (now_ms() >= next[i]) {
                rdzv_msg hb = {.type = RDZV_HEARTBEAT};
                peer_send(&P[i], &hb);
                next[i] = now_ms() + (R[i].beat_ms ? R[i].beat_ms : 500);
                if (last_beat)
                    last_beat[i] = now_ms();
            }
            while (peer_recv(&P[i], 2) == 0) {
                const rdzv_msg *m = &P[i].last;
                if (m->type == RDZV_PING) {
                    rdzv_msg pong = {.type = RDZV_PONG, .req_id = m->req_id};
                    peer_send(&P[i], &pong);
                } else if (m->type == RDZV_PROBE_REQ) {
                    answer_probe(i, m);
                } else if (m->type == RDZV_ROUND_OVER) {
                    R[i].over = 1;
                    if (i == watch)
                        return 1;
                }
            }
        }
    }
    return 0;
}

/* n nodes beat for 2.5 s (their machine checks answered as R says), then
 * the last one falls silent; runs until node 0 hears ROUND_OVER or 4.5 s of
 * silence. Returns the silence (ms) at which node 0 was told, 0: never. */
static uint64_t silence_of_last(int n) {
    uint64_t beat[4] = {0};
    cr_assert_eq(run_nodes(n, 2500, 0, beat), 0, "a round ended before the silence");
    R[n - 1].silent = 1;
    uint64_t t0 = beat[n - 1];
    if (!run_nodes(n, 4500, 0, beat))
        return 0;
    return now_ms() - t0;
}

static uint64_t silence_of_node_2(void) { return silence_of_last(3); }

Test(kprobe, a_silent_node_whose_machine_no_peer_reaches_is_lost_at_the_early_threshold) {
    kernel_round_of("early", 3);
    uint64_t took = silence_of_node_2();
    cr_assert(took, "a vanished node was not lost in 4.5 s: %s",
              (proc_expect(&bed_srv, "\x01", 10), bed_srv.out));
    /* silent 1.25 s (looked at every 250 ms), the probe's 250 ms, the peers' word */
    cr_expect(took >= 1450 && took < 2100,
              "lost after %llu ms of silence (1.25 s + 0.25 s expected)", (unsigned long long)took);
    const char *msg = P[0].last.u.round_over.message;
    cr_expect(strstr(msg, "node early-2 (10.0.0.3, node rank 2) sent nothing for ") != NULL, "%s",
              msg);
    cr_expect(strstr(msg, "and answered no ping within 250 ms; 2 of the 2 peer node(s) asked "
                          "(") != NULL,
              "%s", msg);
    cr_expect(
        strstr(msg, ") reached neither it nor its machine within 250 ms (UDP and TCP probes)") !=
            NULL,
        "%s", msg);
    cr_expect_eq(R[0].kernels + R[1].kernels, 2, "kernel probes asked: %d, %d", R[0].kernels,
                 R[1].kernels);
    cr_expect_geq(R[0].checks + R[1].checks + R[2].checks, 3, "machine checks: %d",
                  R[0].checks + R[1].checks + R[2].checks);
    cr_expect_eq(metric_of("gpulaunch_rdzv_machine_checks_total{result=\"reached\"}"), 3);
    cr_expect_eq(metric_of("gpulaunch_rdzv_probe_relays_total{result=\"unreached\"}"), 2);
}

/* A stopped or starved launcher: its machine accepts the peers'
 * connections, so the early probe ends nothing; the silence rules judge it
 * (pinged at 2.5 s, lost when it answers that neither). */
Test(kprobe, a_silent_node_whose_machine_answers_is_left_to_the_silence_rules) {
    kernel_round_of("stopped", 3);
    R[0].kernel_ok = R[1].kernel_ok = RDZV_PROBE_OK_MACHINE;
    uint64_t took = silence_of_node_2();
    cr_assert(took, "a silent node was not lost in 4.5 s");
    cr_expect(took >= 2750 && took < 3500,
              "lost after %llu ms of silence (2.5 s + 0.25 s expected)", (unsigned long long)took);
    cr_expect_eq(R[0].kernels + R[1].kernels, 2);
    cr_expect_eq(metric_of("gpulaunch_rdzv_probe_relays_total{result=\"machine\"}"), 2);
    const char *msg = P[0].last.u.round_over.message;
    cr_expect(strstr(msg, "reached neither it nor its machine") == NULL, "%s", msg);
    cr_expect(strstr(msg, "and answered no ping within 250 ms") != NULL, "%s", msg);
}

/* Peers that could not try (out of descriptors) are no word on it. */
Test(kprobe, peers_that_could_not_probe_end_nothing_early) {
    kernel_round_of("unable", 3);
    R[0].kernel_ok = R[1].kernel_ok = RDZV_PROBE_OK_UNABLE;
    uint64_t took = silence_of_node_2();
    cr_assert(took, "a silent node was not lost in 4.5 s");
    cr_expect(took >= 2750 && took < 3500,
              "lost after %llu ms of silence (2.5 s + 0.25 s expected)", (unsigned long long)took);
    cr_expect_eq(metric_of("gpulaunch_rdzv_probe_relays_total{result=\"unable\"}"), 2);
}

/* A node whose kernel-probe port no peer reaches (a firewall that lets UDP
 * alone through) is said once, with the port and the remedy, and is not
 * probed early: a healthy node must not be taken for a lost machine. */
Test(kprobe, a_node_whose_port_no_peer_reaches_is_said_and_not_probed_early) {
    kernel_round_of("walled", 3);
    for (int i = 0; i < 3; i++)
        R[i].check_ok = RDZV_PROBE_OK_NONE;
    uint64_t took = silence_of_node_2();
    cr_assert(took, "a silent node was not lost in 4.5 s");
    cr_expect(took >= 2750 && took < 3500,
              "lost after %llu ms of silence (2.5 s + 0.25 s expected)", (unsigned long long)took);
    cr_expect_eq(R[0].kernels + R[1].kernels, 0, "kernel probes asked of unchecked peers");
    /* two peers' words each: none of them ever reached a port */
    cr_expect_eq(metric_of("gpulaunch_rdzv_machine_checks_total{result=\"unreached\"}"), 6);
    cr_expect(proc_expect(&bed_srv, "--probes udp to say that it cannot be", 1000), "%s",
              bed_srv.out);
    cr_expect(strstr(bed_srv.out,
                     "node walled-2's TCP port 40002 (the number of its UDP peer port) was not "
                     "reached from node walled-") != NULL,
              "%s", bed_srv.out);
}

/* --probes udp: no machine check, no kernel probe, even of nodes that say
 * they can. */
Test(kprobe, with_probes_udp_no_kernel_probe_is_asked) {
    restart_with_probes_udp();
    kernel_round_of("udp", 3);
    uint64_t took = silence_of_node_2();
    cr_assert(took, "a silent node was not lost in 4.5 s");
    cr_expect(took >= 2750 && took < 3500, "lost after %llu ms of silence",
              (unsigned long long)took);
    cr_expect_eq(R[0].checks + R[1].checks + R[2].checks, 0);
    cr_expect_eq(R[0].kernels + R[1].kernels, 0);
}

/* A peer that cannot connect out (its own machine checks of others find
 * nothing) is never asked for a kernel probe, though its own port is
 * reached: its word that it reached neither a node nor its machine says
 * nothing of them. Nor does its word in a machine check turn kernel probes
 * of a node off: another peer checks at once, and reaches it. Four nodes,
 * node 1's TCP does not leave its host, node 3 falls silent: only peers
 * that reached a port probe it, and it is lost at the early threshold. */
Test(kprobe, a_peer_that_never_reached_a_port_is_not_asked_for_a_kernel_probe) {
    kernel_round_of("egress", 4);
    R[1].check_ok = RDZV_PROBE_OK_NONE;
    uint64_t took = silence_of_last(4);
    cr_assert(took, "a silent node was not lost in 4.5 s");
    cr_expect_eq(R[1].kernels, 0, "a peer that reached no port was asked for a kernel probe");
    cr_expect(R[1].checks >= 1, "node 1 checked no port");
    const char *msg = P[0].last.u.round_over.message;
    const char *asked = strstr(msg, "peer node(s) asked (");
    cr_expect(asked == NULL || strstr(asked, "egress-1") == NULL, "%s", msg);
    cr_expect(took >= 1450 && took < 2100, "lost after %llu ms of silence (1.25 s + 0.25 s)",
              (unsigned long long)took);
    cr_expect(!proc_expect(&bed_srv, "was not reached from node egress-1", 500),
              "a port said unreached on the word of a peer that cannot connect out: %s",
              bed_srv.out);
    cr_expect_eq(metric_of("gpulaunch_rdzv_machine_checks_total{result=\"unreached\"}"),
                 R[1].checks, "only node 1's checks found nothing");
}

/* The early verdict needs the word of the peer that reached the node's port
 * before (its checker): the other peers' 0 alone may be a path of theirs
 * that never worked. Four nodes, node 3 falls silent; its checker could not
 * probe (ok 3), the two others reached neither: no early verdict. */
Test(kprobe, an_early_verdict_needs_the_peer_that_reached_the_node_before) {
    kernel_round_of("checker", 4);
    for (int i = 0; i < 3; i++)
        R[i].checker_ok_set = 1, R[i].checker_ok = RDZV_PROBE_OK_UNABLE;
    uint64_t took = silence_of_last(4);
    cr_assert(took, "a silent node was not lost in 4.5 s");
    int checkers = 0, asked = 0;
    for (int i = 0; i < 3; i++) {
        checkers += (R[i].checked & 8) != 0;
        asked += R[i].kernels;
    }
    cr_assert_eq(checkers, 1, "node 3's port checked by %d peers", checkers);
    cr_expect_eq(asked, 3, "kernel probes asked: %d (its checker and 2 more expected)", asked);
    cr_expect(took >= 2750 && took < 3500,
              "lost after %llu ms of silence (the silence rules' 2.5 s + 0.25 s expected)",
              (unsigned long long)took);
    const char *msg = P[0].last.u.round_over.message;
    cr_expect(strstr(msg, "reached neither it nor its machine") == NULL, "%s", msg);
}

/* The same, its checker reaching it no more either: lost at the early
 * threshold, the checker's word among those named. */
Test(kprobe, an_early_verdict_with_its_checkers_word_comes_at_the_threshold) {
    kernel_round_of("checked", 4);
    uint64_t took = silence_of_last(4);
    cr_assert(took, "a vanished node was not lost in 4.5 s");
    cr_expect(took >= 1450 && took < 2100, "lost after %llu ms of silence (1.25 s + 0.25 s)",
              (unsigned long long)took);
    const char *msg = P[0].last.u.round_over.message;
    cr_expect(strstr(msg, "3 of the 3 peer node(s) asked (") != NULL, "%s", msg);
}

/* A port reached is checked again a minute later (RDZV_CHECK_PASSED_MS):
 * the path may have closed since (a firewall rule, a NetworkPolicy). Three
 * nodes on three hosts, each checked once as the round starts and once
 * more after 60 s, by a peer; nothing else asked of them. */
Test(kprobe, a_port_reached_is_checked_again_a_minute_later, .timeout = 100) {
    kernel_round_of("again", 3);
    uint64_t t0 = now_ms();
    cr_assert_eq(run_nodes(3, 58000, 0, NULL), 0, "a round ended");
    for (int j = 0; j < 3; j++)
        cr_expect_eq(R[0].checks_of[j] + R[1].checks_of[j] + R[2].checks_of[j], 1,
                     "node %d's port checked %d times in the first 58 s", j,
                     R[0].checks_of[j] + R[1].checks_of[j] + R[2].checks_of[j]);
    cr_assert_eq(run_nodes(3, 64000 - (int)(now_ms() - t0), 0, NULL), 0, "a round ended");
    for (int j = 0; j < 3; j++)
        cr_expect_eq(R[0].checks_of[j] + R[1].checks_of[j] + R[2].checks_of[j], 2,
                     "node %d's port checked %d times in 64 s", j,
                     R[0].checks_of[j] + R[1].checks_of[j] + R[2].checks_of[j]);
    for (int i = 0; i < 3; i++)
        cr_expect_eq(R[i].checks_of[i], 0, "node %d was asked to check its own port", i);
    cr_expect_eq(metric_of("gpulaunch_rdzv_machine_checks_total{result=\"reached\"}"), 6);
}

/* A node whose checker leaves its round (here: finished, RDZV_DONE) is
 * checked again at once by another peer, not a minute later: until then no
 * early verdict could be had for it (that needs its checker's word). Three
 * nodes; node 0's port checked once as the round starts; its checker says
 * it is done; the third node is asked to check node 0's port within the
 * sweep that sees it. */
Test(kprobe, a_node_whose_checker_left_is_checked_again_at_once, .timeout = 30) {
    kernel_round_of("left", 3);
    cr_assert_eq(run_nodes(3, 3000, 0, NULL), 0, "a round ended");
    int ck = R[1].checks_of[0] ? 1 : 2, other = 3 - ck;
    cr_assert(R[ck].checks_of[0] == 1 && R[other].checks_of[0] == 0,
              "node 0's port checked by node 1 %d and node 2 %d times in 3 s", R[1].checks_of[0],
              R[2].checks_of[0]);
    rdzv_msg done = {.type = RDZV_DONE, .req_id = 4};
    peer_send(&P[ck], &done);
    uint64_t t0 = now_ms();
    while (R[other].checks_of[0] == 0 && now_ms() - t0 < 10000)
        cr_assert_eq(run_nodes(3, 50, 0, NULL), 0, "a round ended");
    uint64_t took = now_ms() - t0;
    cr_expect_eq(R[other].checks_of[0], 1, "node 0's port was not checked again in %llu ms",
                 (unsigned long long)took);
    cr_expect_lt(took, 1500, "node 0's port checked again %llu ms after its checker left",
                 (unsigned long long)took);
    cr_expect_eq(R[ck].checks_of[0], 1, "the node that left was asked again");
    cr_log_info("checked again %llu ms after its checker left", (unsigned long long)took);
}

/* At the heartbeat timeout the peers are given a launcher's stall (1.5 s)
 * + 3 x their round trips to reach the node, and their word is waited for
 * that long + a round trip: a node stopped as they were asked answers when
 * it runs again, over slow links. Node 2 beats every 2 s (left to the
 * timeout), nodes 0 and 1 are 300 ms from the server; node 2 falls silent;
 * the peers' UDP probes reach it 2.8 s after they were asked (a stall and
 * the way there and back, past the timeout): it is kept. */
Test(kprobe, the_peers_at_the_timeout_are_given_a_stall_and_their_round_trips) {
    restart_with_probes_udp();
    pong_delay_ms[0] = pong_delay_ms[1] = 300;
    kernel_round_of("stall", 3);
    R[2].beat_ms = 2000;
    R[0].udp_ok = R[1].udp_ok = RDZV_PROBE_OK_NODE;
    R[0].udp_delay_ms = R[1].udp_delay_ms = 2800;
    uint64_t beat[4] = {0};
    cr_assert_eq(run_nodes(3, 6500, 0, beat), 0, "a round ended before the silence");
    R[2].silent = 1;
    uint64_t t0 = beat[2];
    int over = run_nodes(3, 7000, 0, beat);
    uint32_t d =
        R[0].udp_deadline_ms > R[1].udp_deadline_ms ? R[0].udp_deadline_ms : R[1].udp_deadline_ms;
    cr_expect(R[0].udps + R[1].udps >= 1, "the peers were not asked");
    cr_expect(d >= 2400 && d <= 4000,
              "the peers were given %u ms (1.5 s + 3 x 300 ms or more expected)", d);
    cr_expect(!over || now_ms() - t0 >= 9000, "the round ended after %llu ms of silence: %s",
              (unsigned long long)(now_ms() - t0), P[0].last.u.round_over.message);
    cr_log_info("the peers at the timeout were given %u ms; kept %llu ms", d,
                (unsigned long long)(now_ms() - t0));
}

/* A node suspected by its silence alone, whose peers' word never comes: their
 * window (a stall and 3 of their round trips, 600 ms each here) ends past the
 * 5 s timeout, and the verdict waits for it; it names the unanswered ping
 * and the peers asked. */
Test(kprobe, a_verdict_past_the_timeout_names_the_ping_and_the_peers_asked) {
    restart_with_probes_udp();
    pong_delay_ms[0] = pong_delay_ms[1] = 600;
    kernel_round_of("word", 3);
    R[0].udp_delay_ms = R[1].udp_delay_ms = 60000; /* their word comes after the test */
    uint64_t beat[4] = {0};
    cr_assert_eq(run_nodes(3, 2500, 0, beat), 0, "a round ended before the silence");
    R[2].silent = 1;
    uint64_t t0 = beat[2];
    cr_assert(run_nodes(3, 9000, 0, beat), "a silent node was not lost in 9 s");
    uint64_t took = now_ms() - t0;
    const char *msg = P[0].last.u.round_over.message;
    cr_expect(R[0].udps + R[1].udps >= 2, "the peers were not asked");
    cr_expect(took >= 5000, "lost after %llu ms of silence, before the peers' window ended: %s",
              (unsigned long long)took, msg);
    cr_expect(strstr(msg, "answered no ping within 250 ms") != NULL, "%s", msg);
    cr_expect(strstr(msg, "nor did it answer the UDP probes of 2 peer node(s) (word-") != NULL,
              "%s", msg);
    cr_log_info("lost after %llu ms of silence: %s", (unsigned long long)took, msg);
}

/* Peers far from the server (their round trips long): the peers' deadline
 * of an early probe covers their round trips as well as the node's, not the
 * node's 250 ms alone. Nodes 0 and 1 answer their calibration 120 ms late
 * (node 1 later still: its ping waited for node 0's answer). */
Test(kprobe, an_early_probes_peer_deadline_covers_the_peers_round_trips) {
    pong_delay_ms[0] = pong_delay_ms[1] = 120;
    kernel_round_of("far", 3);
    uint64_t took = silence_of_node_2();
    cr_assert(took, "a vanished node was not lost in 4.5 s");
    uint32_t d = R[0].kernel_deadline_ms > R[1].kernel_deadline_ms ? R[0].kernel_deadline_ms
                                                                   : R[1].kernel_deadline_ms;
    cr_expect_eq(R[0].kernels + R[1].kernels, 2);
    cr_expect(d >= 360 && d <= 2000,
              "the peers were given %u ms (3 x (its round trip + theirs, 120-240 ms) expected)", d);
    const char *msg = P[0].last.u.round_over.message;
    cr_expect(strstr(msg, "and answered no ping within 250 ms; 2 of the 2 peer node(s)") != NULL,
              "%s", msg);
}
