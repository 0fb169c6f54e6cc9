/* Suspicion and probes (rendezvous/rdzv_probe.h) on a real gpulaunch-rdzv,
 * with raw protocol peers: a node the others wait for in a collective is
 * pinged, found lost within a second when it does not answer (the evidence
 * in the round's end) and left alone when it does; nobody is probed without
 * enough waiting nodes, nor a node whose launcher did not say it answers. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rdzv_codec.h"

static proc srv;
static int port, hport;
static peer *P;
static int pong_delay_ms[4]; /* a node's calibration pong this late (await_assigned) */

static void setup(void) {
    P = calloc(4, sizeof *P);
    const char *extra[] = {"--http", "127.0.0.1:0", NULL};
    cr_assert_eq(rdzv_start(&srv, &port, extra), 0, "server did not start: %s", srv.out);
    cr_assert(proc_expect(&srv, " http 127.0.0.1:", 2000), "%s", srv.out);
    hport = (int)strtol(strstr(srv.out, " http 127.0.0.1:") + 16, NULL, 10);
}

/* gpulaunch_rdzv_probes_total{result="<result>"} now. */
static double probes(const char *result) {
    static char body[65536];
    char name[96];
    cr_assert_eq(http_get_local(hport, "/metrics", body, sizeof body), 200);
    snprintf(name, sizeof name, "gpulaunch_rdzv_probes_total{result=\"%s\"}", result);
    return prom_value(body, name);
}

static void teardown(void) {
    memset(pong_delay_ms, 0, sizeof pong_delay_ms);
    for (int i = 0; i < 4; i++)
        peer_close(&P[i]);
    free(P);
    proc_kill(&srv, SIGTERM);
    int st = proc_wait(&srv, 5000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "server exit status %d: %s", st, srv.out);
}

TestSuite(probe, .init = setup, .fini = teardown, .timeout = 60);

/* Node i is assigned, and the join's calibration ping answered (after
 * pong_delay_ms[i]: a node far from the server) when it says it answers
 * probes (none is sent when it does not). */
static void answer_probe(int i, const rdzv_msg *m);

static void await_assigned(int i, int answers) {
    int assigned = 0, pinged = 0;
    uint64_t until = now_ms() + 3000;
    while ((!assigned || (answers && !pinged)) && now_ms() < until) {
        if (peer_recv(&P[i], 100) != 0)
            continue;
        if (P[i].last.type == RDZV_ASSIGNED)
            assigned = 1;
        if (P[i].last.type == RDZV_PING) {
            pinged = 1;
            if (pong_delay_ms[i])
                usleep((useconds_t)pong_delay_ms[i] * 1000u);
            rdzv_msg pong = {.type = RDZV_PONG, .req_id = P[i].last.req_id};
            peer_send(&P[i], &pong);
        }
        if (P[i].last.type == RDZV_PROBE_REQ) /* a machine check, once the round runs */
            answer_probe(i, &P[i].last);
    }
    cr_assert(assigned, "node %d not assigned", i);
    cr_assert_eq(pinged, answers, "node %d: calibration ping %s", i,
                 pinged ? "sent to a node that does not answer" : "missing");
}

/* n nodes of one static job, each saying it answers probes (or not), all
 * assigned; the join's calibration pings are answered. */
static void round_of(const char *job, int n, int answers) {
    for (int i = 0; i < n; i++) {
        cr_assert_eq(peer_open(&P[i], port, NULL), 0);
        rdzv_msg m = {.type = RDZV_JOIN, .req_id = 9, .flags = answers ? RDZV_JOIN_PROBE : 0};
        snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "%s", job);
        snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "%s-%d", job, i);
        snprintf(m.u.join.addr, sizeof m.u.join.addr, "10.0.0.%d", i + 1);
        m.u.join.nproc = 1;
        m.u.join.static_rank = i;
        m.u.join.min_nodes = m.u.join.max_nodes = (uint32_t)n;
        peer_send(&P[i], &m);
    }
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
                 (proc_expect(&srv, "\x01", 10), srv.out));
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

/* ---- kernel probes (docs/protocol.md, rule 8) ---- */

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

/* n nodes of one static job that make and answer kernel probes (a peer
 * port each, 40000 + i; raw nodes listen on none: what they say is set in
 * R); the nodes whose calibration pong is delayed (pong_delay_ms) are
 * awaited last, so that the others' round trips stay short. */
static void kernel_round_of(const char *job, int n) {
    memset(R, 0, sizeof R);
    for (int i = 0; i < n; i++) {
        R[i].check_ok = RDZV_PROBE_OK_MACHINE;
        cr_assert_eq(peer_open(&P[i], port, NULL), 0);
        rdzv_msg m = {.type = RDZV_JOIN,
                      .req_id = 9,
                      .flags = RDZV_JOIN_PROBE | RDZV_JOIN_PEER | RDZV_JOIN_KERNEL};
        snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "%s", job);
        snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "%s-%d", job, i);
        snprintf(m.u.join.addr, sizeof m.u.join.addr, "10.0.0.%d", i + 1);
        m.u.join.nproc = 1;
        m.u.join.static_rank = i;
        m.u.join.min_nodes = m.u.join.max_nodes = (uint32_t)n;
        m.u.join.peer_port = (uint16_t)(40000 + i);
        peer_send(&P[i], &m);
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

static double metric_of(const char *name) {
    static char body[65536];
    cr_assert_eq(http_get_local(hport, "/metrics", body, sizeof body), 200);
    return prom_value(body, name);
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

Test(probe, a_silent_node_whose_machine_no_peer_reaches_is_lost_at_the_early_threshold) {
    kernel_round_of("early", 3);
    uint64_t took = silence_of_node_2();
    cr_assert(took, "a vanished node was not lost in 4.5 s: %s",
              (proc_expect(&srv, "\x01", 10), srv.out));
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
Test(probe, a_silent_node_whose_machine_answers_is_left_to_the_silence_rules) {
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
Test(probe, peers_that_could_not_probe_end_nothing_early) {
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
Test(probe, a_node_whose_port_no_peer_reaches_is_said_and_not_probed_early) {
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
    cr_expect(proc_expect(&srv, "--probes udp to say that it cannot be", 1000), "%s", srv.out);
    cr_expect(strstr(srv.out,
                     "node walled-2's TCP port 40002 (the number of its UDP peer port) was not "
                     "reached from node walled-") != NULL,
              "%s", srv.out);
}

/* The server again, with --probes udp (no machine checks, no kernel probes). */
static void restart_with_probes_udp(void) {
    proc_kill(&srv, SIGTERM);
    proc_wait(&srv, 5000);
    const char *extra[] = {"--http", "127.0.0.1:0", "--probes", "udp", NULL};
    cr_assert_eq(rdzv_start(&srv, &port, extra), 0, "server did not start: %s", srv.out);
    cr_assert(proc_expect(&srv, " http 127.0.0.1:", 2000), "%s", srv.out);
    hport = (int)strtol(strstr(srv.out, " http 127.0.0.1:") + 16, NULL, 10);
}

/* --probes udp: no machine check, no kernel probe, even of nodes that say
 * they can. */
Test(probe, with_probes_udp_no_kernel_probe_is_asked) {
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
Test(probe, a_peer_that_never_reached_a_port_is_not_asked_for_a_kernel_probe) {
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
    cr_expect(!proc_expect(&srv, "was not reached from node egress-1", 500),
              "a port said unreached on the word of a peer that cannot connect out: %s", srv.out);
    cr_expect_eq(metric_of("gpulaunch_rdzv_machine_checks_total{result=\"unreached\"}"),
                 R[1].checks, "only node 1's checks found nothing");
}

/* The early verdict needs the word of the peer that reached the node's port
 * before (its checker): the other peers' 0 alone may be a path of theirs
 * that never worked. Four nodes, node 3 falls silent; its checker could not
 * probe (ok 3), the two others reached neither: no early verdict. */
Test(probe, an_early_verdict_needs_the_peer_that_reached_the_node_before) {
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
Test(probe, an_early_verdict_with_its_checkers_word_comes_at_the_threshold) {
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
Test(probe, a_port_reached_is_checked_again_a_minute_later, .timeout = 100) {
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
Test(probe, a_node_whose_checker_left_is_checked_again_at_once, .timeout = 30) {
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
Test(probe, the_peers_at_the_timeout_are_given_a_stall_and_their_round_trips) {
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
Test(probe, a_verdict_past_the_timeout_names_the_ping_and_the_peers_asked) {
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
Test(probe, an_early_probes_peer_deadline_covers_the_peers_round_trips) {
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
