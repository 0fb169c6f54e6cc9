/* Suspicion and probes (rendezvous/rdzv_probe.h) on a real gpulaunch-rdzv,
 * with raw protocol peers: a node the others wait for in a collective is
 * pinged, found lost within a second when it does not answer (the evidence
 * in the round's end) and left alone when it does; nobody is probed without
 * enough waiting nodes, nor a node whose launcher did not say it answers.
 * Machine checks and kernel probes: test_kprobe.c. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe_bed.h"
#include "rdzv_server_int.h"

static void setup(void) { probe_bed_start(NULL); }

/* gpulaunch_rdzv_probes_total{result="<result>"} now. */
static double probes(const char *result) {
    char name[96];
    snprintf(name, sizeof name, "gpulaunch_rdzv_probes_total{result=\"%s\"}", result);
    return metric_of(name);
}

TestSuite(probe, .init = setup, .fini = probe_bed_stop, .timeout = 60);

/* n nodes of one static job, each saying it answers probes (or not), all
 * assigned; the join's calibration pings are answered. */
static void round_of(const char *run, int n, int answers) {
    for (int i = 0; i < n; i++)
        probe_bed_join(i, run, n, answers ? RDZV_JOIN_PROBE : 0, 0);
    for (int i = 0; i < n; i++)
        await_assigned(i, answers);
}

static void say_wait(int i, uint32_t ms) {
    rdzv_msg hb = {.type = RDZV_HEARTBEAT, .flags = RDZV_HEARTBEAT_WAIT};
    hb.u.heartbeat.wait_ms = ms;
    peer_send(&P[i], &hb);
}

/* Reads what node i was sent for ms: answers pings when `answer`; returns
 * the pings seen; stops at a ROUND_OVER (*over = 1, left in P[i].last). */
static int listen_for(int i, int ms, int answer, int *over) {
    int pings = 0;
    uint64_t until = now_ms() + (uint64_t)ms;
    *over = 0;
    while (now_ms() < until) {
        if (peer_recv(&P[i], 20) != 0)
            continue;
        if (P[i].last.type == RDZV_PING) {
            pings++;
            if (answer) {
                rdzv_msg pong = {.type = RDZV_PONG, .req_id = P[i].last.req_id};
                peer_send(&P[i], &pong);
            }
        } else if (P[i].last.type == RDZV_ROUND_OVER) {
            *over = 1;
            return pings;
        }
    }
    return pings;
}

Test(probe, a_node_the_others_wait_for_that_answers_no_ping_is_lost_within_a_second) {
    round_of("lost", 3, 1);
    uint64_t t0 = now_ms();
    say_wait(0, 300);
    say_wait(1, 320);
    int over = 0;
    int pings = listen_for(2, 400, 0, &over); /* node 2 hears the ping and says nothing */
    cr_expect_eq(pings, 1, "node 2 was pinged %d times", pings);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_ROUND_OVER, 2000), 0, "node 0 was not told: %s",
                 (proc_expect(&bed_srv, "\x01", 10), bed_srv.out));
    uint64_t took = now_ms() - t0;
    const rdzv_msg *m = &P[0].last;
    cr_expect_eq(m->u.round_over.reason, RDZV_REASON_HEARTBEAT);
    cr_expect_eq(m->u.round_over.node_rank, 2);
    cr_expect_str_eq(m->u.round_over.hostname, "lost-2");
    const char *want[] = {"node lost-2 (10.0.0.3, node rank 2) answered no ping within 250 ms",
                          "while 2 of its 2 peer node(s) waited for it inside a collective "
                          "(lost-0, lost-1; the longest 0.",
                          "its last heartbeat came "};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_expect(strstr(m->u.round_over.message, want[i]) != NULL, "'%s' not in: %s", want[i],
                  m->u.round_over.message);
    /* the deadline (250 ms) and the sweep (100 ms) after the waits: far from the 5 s timeout */
    cr_expect(took >= 250 && took < 1000, "told %llu ms after the waits", (unsigned long long)took);
    cr_assert_eq(peer_recv_type(&P[1], RDZV_ROUND_OVER, 1000), 0, "node 1 was not told");
    cr_expect_eq(probes("unanswered"), 1);
    cr_expect_eq(probes("answered"), 0);
}

Test(probe, a_slow_node_that_answers_is_not_lost_and_is_found_once_it_stops) {
    round_of("slow", 2, 1);
    /* node 0 waits for node 1 for 2 s, saying so every 200 ms; node 1 answers */
    int pings = 0, over = 0;
    for (int k = 0; k < 10 && !over; k++) {
        say_wait(0, 200 * (uint32_t)(k + 1));
        pings += listen_for(1, 200, 1, &over);
    }
    cr_expect_eq(over, 0, "a node that answered was lost: %s", P[1].last.u.round_over.message);
    cr_expect(pings >= 4 && pings <= 9,
              "node 1 was pinged %d times in 2 s (once per 250 ms at most)", pings);
    cr_expect_eq(probes("answered"), pings, "every answer counted");
    rdzv_msg hb = {.type = RDZV_HEARTBEAT};
    cr_expect_neq(peer_recv_type(&P[0], RDZV_ROUND_OVER, 100), 0, "node 0 heard a round end");
    peer_send(&P[0], &hb);
    /* node 1 stops answering: found at the next wait */
    uint64_t t0 = now_ms();
    say_wait(0, 2400);
    listen_for(1, 150, 0, &over);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_ROUND_OVER, 2000), 0, "node 0 was not told");
    cr_expect_eq(P[0].last.u.round_over.node_rank, 1);
    cr_expect_lt(now_ms() - t0, 1000);
}

/* Reads what nodes [from, to) are sent for ms, answering their pings;
 * returns the pings seen; *over: a round ended. */
static int listen_all(int from, int to, int ms, int *over) {
    int pings = 0;
    uint64_t until = now_ms() + (uint64_t)ms;
    *over = 0;
    while (now_ms() < until)
        for (int i = from; i < to; i++) {
            if (peer_recv(&P[i], 5) != 0)
                continue;
            if (P[i].last.type == RDZV_PING) {
                pings++;
                rdzv_msg pong = {.type = RDZV_PONG, .req_id = P[i].last.req_id};
                peer_send(&P[i], &pong);
            } else if (P[i].last.type == RDZV_ROUND_OVER) {
                *over = 1;
            }
        }
    return pings;
}

Test(probe, nobody_is_probed_while_fewer_wait_than_do_not) {
    round_of("few", 4, 1);
    say_wait(0, 500); /* one of four waits: the job is not waiting for one node */
    int over = 0;
    int pings = listen_all(1, 4, 300, &over);
    cr_expect_eq(pings, 0, "%d pings with one node of four waiting", pings);
    say_wait(1, 500); /* two of four: the other two are probed, and answer */
    pings = listen_all(2, 4, 300, &over);
    cr_expect_eq(pings, 2, "%d pings with two nodes of four waiting", pings);
    cr_expect_eq(over, 0, "a round ended");
}

Test(probe, a_node_that_did_not_say_it_answers_is_never_probed) {
    round_of("old", 2, 0); /* an older launcher: no RDZV_JOIN_PROBE */
    int over = 0, pings = 0;
    for (int k = 0; k < 4; k++) {
        say_wait(0, 300 * (uint32_t)(k + 1));
        pings += listen_for(1, 250, 0, &over);
    }
    cr_expect_eq(pings, 0, "an older launcher got %d pings", pings);
    cr_expect_eq(over, 0, "its round ended: %s", P[1].last.u.round_over.message);
}

/* Four nodes: two wait, node 2 (a straggler) answers and computes on, node 3
 * answers nothing. While node 2 can still finish the collective, node 3 is
 * not what the job waits for: no round ends. Once node 2 waits too, the job
 * is blocked on node 3 alone: it is lost. */
Test(probe, a_silent_node_is_lost_only_when_the_job_is_blocked_on_it) {
    round_of("blk", 4, 1);
    say_wait(0, 300);
    say_wait(1, 300);
    int over = 0, pings = 0;
    uint64_t until = now_ms() + 800; /* past the deadline and a sweep */
    while (now_ms() < until && !over) {
        pings += listen_all(2, 3, 50, &over);
        int o3 = 0;
        listen_for(3, 10, 0, &o3); /* node 3 reads its pings and says nothing */
        over |= o3;
        say_wait(0, 300);
    }
    cr_expect_eq(over, 0, "a round ended while the straggler could still finish");
    cr_expect_geq(pings, 1, "the straggler was not probed");
    uint64_t t0 = now_ms();
    say_wait(2, 250); /* the straggler reaches the collective: nobody else can finish it */
    say_wait(0, 1200);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_ROUND_OVER, 2000), 0, "node 0 was not told");
    cr_expect_eq(P[0].last.u.round_over.node_rank, 3, "%s", P[0].last.u.round_over.message);
    cr_expect(strstr(P[0].last.u.round_over.message, "3 of its 3 peer node(s) waited") != NULL,
              "%s", P[0].last.u.round_over.message);
    cr_expect_lt(now_ms() - t0, 1000);
}

/* Node 3 vanishes while node 2 computes (answers its pings, never waits):
 * each unanswered ping of node 3 is moot (the job does not wait for it
 * alone), so the heartbeat timeout judges it; its verdict still names the
 * pings it did not answer, not a bare "sent no heartbeat". */
Test(probe, a_node_judged_at_the_timeout_after_moot_pings_names_them) {
    round_of("moot", 4, 1);
    uint64_t t0 = now_ms();
    int over = 0, pings3 = 0;
    while (now_ms() - t0 < 8000 && !over) {
        say_wait(0, 300);
        say_wait(1, 300);
        listen_all(2, 3, 50, &over); /* node 2 answers its pings */
        int o3 = 0;
        pings3 += listen_for(3, 10, 0, &o3); /* node 3 reads them and says nothing */
        over |= o3;
    }
    cr_expect_geq(pings3, 2, "node 3 was pinged %d times", pings3);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_ROUND_OVER, 3000), 0, "node 0 was not told");
    const char *msg = P[0].last.u.round_over.message;
    cr_expect_eq(P[0].last.u.round_over.node_rank, 3, "%s", msg);
    cr_expect(strstr(msg, "answered no ping within 250 ms") != NULL, "%s", msg);
    cr_log_info("%d pings of node 3; %s", pings3, msg);
}

/* The same, the straggler slow to answer: node 2 answers each ping 150 ms
 * late (within its 250 ms deadline), so it is often a suspect whose answer
 * is on its way when node 3's deadline passes. Node 3's verdict waits for
 * that answer, and node 2 can still finish the collective: nothing ends. */
Test(probe, a_straggler_slow_to_answer_is_waited_for_before_another_is_judged) {
    round_of("slow", 4, 1);
    say_wait(0, 300);
    say_wait(1, 300);
    uint32_t due_id[16];
    uint64_t due_at[16];
    int due = 0, answered = 0, over = 0;
    uint64_t until = now_ms() + 1600; /* (node 3's silence stays under its 2.5 s threshold) */
    while (now_ms() < until && !over) {
        if (peer_recv(&P[2], 5) == 0) {
            if (P[2].last.type == RDZV_PING && due < 16) {
                due_id[due] = P[2].last.req_id;
                due_at[due++] = now_ms() + 150;
            }
            over |= P[2].last.type == RDZV_ROUND_OVER;
        }
        for (int k = 0; k < due; k++)
            if (now_ms() >= due_at[k]) {
                rdzv_msg pong = {.type = RDZV_PONG, .req_id = due_id[k]};
                peer_send(&P[2], &pong);
                answered++;
                due_id[k] = due_id[--due];
                due_at[k--] = due_at[due];
            }
        int o3 = 0;
        listen_for(3, 5, 0, &o3); /* node 3 reads its pings and says nothing */
        over |= o3;
        say_wait(0, 300);
    }
    cr_expect_eq(over, 0, "a round ended while the straggler could still finish: %s",
                 P[0].last.u.round_over.message);
    cr_expect_geq(answered, 2, "the straggler was pinged %d times in 1.6 s", answered);
    cr_expect_eq(probes("unanswered"), 0);
}

/* Silence without the job's word: node 1 beats every 500 ms, then sends
 * nothing. It is probed at its worst gap + 1.5 s (at least 2.5 s) of
 * silence: no answer ends the round well before the 5 s timeout; an answer
 * clears it (and that gap raises its threshold). */
static uint64_t beat_then_silence(int answer, int *over, int *pings) {
    rdzv_msg hb = {.type = RDZV_HEARTBEAT};
    uint64_t t0 = 0; /* node 1's last frame */
    for (int k = 0; k < 4; k++) {
        peer_send(&P[1], &hb);
        t0 = now_ms();
        peer_send(&P[0], &hb);
        usleep(500000);
    }
    *over = *pings = 0;
    while (now_ms() - t0 < 4500 && !*over && !(answer && *pings)) {
        peer_send(&P[0], &hb);
        *pings += listen_for(1, 200, answer, over);
    }
    return now_ms() - t0;
}

Test(probe, a_silent_node_is_probed_before_the_timeout_and_lost_unless_it_answers) {
    round_of("gone", 2, 1);
    int over, pings;
    uint64_t took = beat_then_silence(0, &over, &pings);
    cr_assert(over, "a silent node that answered nothing was not lost in 4.5 s");
    cr_expect_eq(pings, 1);
    cr_expect(took >= 2750 && took < 3500,
              "lost after %llu ms of silence (2.5 s + the probe's "
              "250 ms expected; timeout 5 s)",
              (unsigned long long)took);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_ROUND_OVER, 1000), 0);
    cr_expect(strstr(P[0].last.u.round_over.message, "sent nothing for ") != NULL &&
                  strstr(P[0].last.u.round_over.message, "and answered no ping within 250 ms"),
              "%s", P[0].last.u.round_over.message);
    for (int i = 0; i < 2; i++)
        peer_close(&P[i]);
    round_of("here", 2, 1);
    took = beat_then_silence(1, &over, &pings);
    cr_expect_eq(pings, 1, "no ping in 4.5 s of silence");
    cr_expect(took >= 2500 && took <= 3200, "pinged after %llu ms of silence (2.5 s expected)",
              (unsigned long long)took);
    cr_expect_eq(over, 0, "a node that answered was lost");
    over = 0;
    listen_for(1, 1000, 1, &over);
    cr_expect_eq(over, 0, "a node that answered was lost");
}

/* --probes takes on, udp or off; anything else is refused, naming the option. */
Test(probe, a_bad_probes_value_is_refused) {
    proc bad;
    char *argv[] = {GPL_BUILD_DIR "/rendezvous/gpulaunch-rdzv",
                    "--listen",
                    "127.0.0.1:0",
                    "--probes",
                    "maybe",
                    NULL};
    cr_assert_eq(proc_start(&bad, argv, NULL), 0);
    int st = proc_wait(&bad, 5000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "exit status %d", st);
    cr_expect(strstr(bad.out, "--probes takes on, udp or off, not 'maybe'") != NULL, "%s", bad.out);
}

/* The embedding API: a version-1 options struct (before probes) is taken,
 * with probes on; a version from the future is refused, saying which are
 * known, and so is a probes value that is none of RDZV_PROBES_*. */
Test(probe, options_version_1_is_taken_and_a_future_one_refused) {
    uv_loop_t loop;
    uv_loop_init(&loop);
    rdzv_server_options o = RDZV_SERVER_OPTIONS_INIT;
    o.listen_addr = "127.0.0.1";
    o.listen_port = 0;
    o.version = 1;
    o.probes = 0; /* past a version-1 struct's end: must not be read */
    rdzv_server *s = NULL;
    char err[256] = "";
    cr_assert_eq(rdzv_server_start(&loop, &o, &s, err, sizeof err), GPL_OK, "%s", err);
    /* its CHALLENGE says it probes: accepted and sent by the loop, read here */
    int fd = raw_connect(rdzv_server_port(s));
    cr_assert_geq(fd, 0);
    uint8_t hdr[RDZV_HEADER_LEN];
    ssize_t got = 0;
    for (int i = 0; i < 200 && got < (ssize_t)sizeof hdr; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        ssize_t r = recv(fd, hdr + got, sizeof hdr - (size_t)got, MSG_DONTWAIT);
        if (r > 0)
            got += r;
        else
            usleep(5000);
    }
    cr_assert_eq(got, (ssize_t)sizeof hdr, "no CHALLENGE");
    uint16_t type = (uint16_t)(hdr[4] << 8 | hdr[5]), flags = (uint16_t)(hdr[6] << 8 | hdr[7]);
    cr_expect_eq(type, RDZV_CHALLENGE);
    cr_expect(flags & RDZV_CHALLENGE_PROBE, "a version-1 struct's server does not probe (%x)",
              flags);
    close(fd);
    rdzv_server_close(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    o.version = RDZV_SERVER_OPTIONS_VERSION;
    o.probes = 3;
    cr_expect_eq(rdzv_server_start(&loop, &o, &s, err, sizeof err), GPL_ERR_INVALID_ARG);
    cr_expect(strstr(err,
                     "rdzv_server_options.probes is 3: RDZV_PROBES_OFF (0), RDZV_PROBES_ON (1) "
                     "or RDZV_PROBES_UDP (2)") != NULL,
              "%s", err);
    o.version = RDZV_SERVER_OPTIONS_VERSION + 1;
    cr_expect_eq(rdzv_server_start(&loop, &o, &s, err, sizeof err), GPL_ERR_INVALID_ARG);
    cr_expect(strstr(err, "version must be 1 to 2") != NULL, "%s", err);
    uv_loop_close(&loop);
}

/* ---- the verdict's words at the timeout, on a member alone ---- */

/* What rdzv__probe_kept reads of a node silent for silent_ms at `now` (the
 * heartbeat timeout 5 s), its worst round trip 600 ms: a probe's deadline
 * 3 x 600 = 1,800 ms. */
static conn vc;
static member vm;
static rdzv_round vr;
static const uint64_t NOW = 1000000;

static void silent_for(uint64_t silent_ms) {
    memset(&vc, 0, sizeof vc);
    memset(&vm, 0, sizeof vm);
    memset(&vr, 0, sizeof vr);
    vr.hb_timeout_ms = 5000;
    vm.rm.r = &vr;
    vm.c = &vc;
    vc.last_rx_ms = NOW - silent_ms;
    vm.p.rtt_ms = 600;
}

/* Judged at NOW: 1 kept, else 0 and its evidence in out. */
static int judge(char *out, size_t len) { return rdzv__probe_kept(&vm, NOW, out, len); }

TestSuite(verdict, .timeout = 10);

Test(verdict, a_ping_still_inside_its_deadline_is_named_with_its_age) {
    char ev[512];
    silent_for(5100);
    vm.p.sent_ms = NOW - 400; /* the suspicion's ping: 1.4 s of its deadline left */
    vm.p.suspected = RDZV_SUSPECT_SILENT;
    cr_assert_eq(judge(ev, sizeof ev), 0);
    cr_expect_str_eq(ev, " and has not answered a ping of 400 ms ago");
}

Test(verdict, a_ping_past_its_deadline_counts_as_unanswered_once) {
    char ev[512];
    silent_for(5100);
    vm.p.sent_ms = NOW - 1900;
    vm.p.suspected = RDZV_SUSPECT_SILENT;
    cr_assert_eq(judge(ev, sizeof ev), 0);
    cr_expect_str_eq(ev, " and answered no ping within 1800 ms (1 in this silence)");
    /* the sweep counted it already: not twice */
    vm.p.missed_ms = vm.p.sent_ms;
    vm.p.missed_n = 1;
    cr_assert_eq(judge(ev, sizeof ev), 0);
    cr_expect_str_eq(ev, " and answered no ping within 1800 ms (1 in this silence)");
}

Test(verdict, pings_missed_before_are_counted_and_one_in_flight_is_not_yet) {
    char ev[512];
    silent_for(5100);
    vm.p.missed_n = 2;
    vm.p.missed_ms = NOW - 2600;
    vm.p.sent_ms = NOW - 300;
    vm.p.suspected = RDZV_SUSPECT_TIMEOUT;
    cr_assert_eq(judge(ev, sizeof ev), 0);
    cr_expect_str_eq(ev, " and answered no ping within 1800 ms (2 in this silence)");
}

Test(verdict, a_node_never_pinged_has_no_ping_evidence) {
    char ev[512] = "stale";
    silent_for(5100);
    cr_assert_eq(judge(ev, sizeof ev), 0);
    cr_expect_str_eq(ev, "");
}

Test(verdict, the_peers_word_is_waited_for_then_named_when_it_never_came) {
    char ev[512];
    silent_for(5100);
    vm.p.sent_ms = NOW - 1000;
    vm.p.suspected = RDZV_SUSPECT_TIMEOUT;
    vm.p.relayed = 2;
    vm.p.relay_ms = 1500;
    vm.p.relay_at_ms = NOW - 1000;
    vm.p.relay_wait_ms = 1800;
    snprintf(vm.p.relay_names, sizeof vm.p.relay_names, "host1, host3");
    cr_expect_eq(judge(ev, sizeof ev), 1, "kept while its peers' word may still come");
    vm.p.relay_wait_ms = 900; /* their window passed, neither said anything */
    cr_assert_eq(judge(ev, sizeof ev), 0);
    cr_expect_str_eq(ev, " and has not answered a ping of 1000 ms ago; nor did it answer the UDP "
                         "probes of 2 peer node(s) (host1, host3) within 1500 ms");
    /* one of them said it could not reach it: its word is in, the other's is waited for */
    vm.p.relay_wait_ms = 1800;
    vm.p.relay_nacks = 1;
    cr_expect_eq(judge(ev, sizeof ev), 1);
}

Test(verdict, a_node_its_peers_reach_is_kept_for_twice_the_timeout_then_named) {
    char ev[512];
    silent_for(9000);
    vm.p.peer_kept_ms = NOW - 1000;
    cr_expect_eq(judge(ev, sizeof ev), 1, "its peers reached it 1 s ago");
    silent_for((uint64_t)RDZV_PEER_KEEP_FACTOR * 5000 + 100);
    vm.p.peer_kept_ms = NOW - 1000;
    cr_assert_eq(judge(ev, sizeof ev), 0);
    char want[256];
    snprintf(want, sizeof want,
             "; its peers' UDP probes last reached it 1.0 s ago, and the rendezvous has not heard "
             "from it for %u x the timeout",
             (unsigned)RDZV_PEER_KEEP_FACTOR);
    cr_expect_str_eq(ev, want);
}
