/* How each round began on a node and what it cost (launcher/gl_story.h,
 * docs/health.md "How each round began"): a restart from a checkpoint says
 * its reason, its pause and the steps done again; a live re-formation says
 * it kept its workers, paused a fraction of a second and redid nothing; the
 * same figures on the launcher's --metrics, which stay promtool-clean. Real
 * launchers, a real rendezvous and dp_train workers. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "browser.h"
#include "harness.h"

#define GL GPL_BUILD_DIR "/launcher/gpulaunch"
#define DP GPL_BUILD_DIR "/examples/dp_train"

static char dir[64];

static void mkdir_tmp(void) {
    tmpdir_make(dir, sizeof dir, "gpl-story");
    cr_assert(dir[0]);
}

static void rm_tmp(void) { tmpdir_remove(dir); }

TestSuite(story, .init = mkdir_tmp, .fini = rm_tmp, .timeout = 90);

static double metric(int port, const char *name) {
    static char body[1 << 18];
    cr_assert_eq(http_get_local(port, "/metrics", body, sizeof body), 200);
    char why[256];
    cr_expect_eq(prom_check(body, why, sizeof why), 0, "--metrics is not promtool-clean: %s", why);
    cr_expect_eq(prom_documented(body, why, sizeof why), 0, "not in docs/*.md: %s", why);
    return prom_value(body, name);
}

/* "round N began: ...; paused P s ..., R step(s) done again": P and R (-1: no such line). */
static const char *began(const char *out, uint32_t round, double *pause, long *redone) {
    char needle[64];
    snprintf(needle, sizeof needle, "round %u began: ", round);
    const char *l = strstr(out, needle), *p = l ? strstr(l, "; paused ") : NULL;
    const char *r = p ? strstr(p, " s from round ") : NULL;
    const char *d = r ? strstr(r, "), ") : NULL;
    *pause = p ? strtod(p + strlen("; paused "), NULL) : -1;
    *redone = d ? strtol(d + 3, NULL, 10) : -1;
    return l;
}

Test(story, a_restart_says_why_its_pause_and_the_steps_done_again) {
    char ck[128], ms[32];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    int mport = free_tcp_port();
    snprintf(ms, sizeof ms, "127.0.0.1:%d", mport);
    char *argv[] = {GL,
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    "--max-restarts",
                    "1",
                    "--metrics",
                    ms,
                    DP,
                    "--steps",
                    "600",
                    "--step-sleep-ms",
                    "10",
                    "--checkpoint-dir",
                    ck,
                    "--checkpoint-every",
                    "50",
                    "--print-every",
                    "100000",
                    NULL};
    proc p;
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    cr_assert(proc_expect(&p, "checkpoint: step 50 written", 20000), "%s", p.out);
    usleep(300000); /* some steps past the checkpoint: they are done again */
    pid_t w = proc_find(p.pid, "LOCAL_RANK=1", NULL);
    cr_assert(w > 0, "no local rank 1");
    kill(w, SIGKILL);
    cr_assert(proc_expect(&p, "round 2 began: ", 20000), "%s", p.out);
    cr_assert(proc_expect(&p, "done again", 5000), "%s", p.out);
    double pause;
    long redone;
    const char *l = began(p.out, 2, &pause, &redone);
    cr_expect(strstr(l, "restarted the workers (rank 1 (local rank 1) killed by SIGKILL)") != NULL,
              "%s", l);
    cr_expect(pause > 0 && pause < 5, "paused %.3f s: %s", pause, l);
    cr_expect(strstr(l, "; state: the checkpoint of step ") != NULL, "no state source: %.400s", l);
    /* from the newest complete checkpoint (every 50 steps; an asynchronous
     * save may still be draining the last one, on a loaded machine more) */
    cr_expect(redone >= 1 && redone <= 200, "%ld steps done again: %s", redone, l);
    /* the same on --metrics, under the job's run id */
    char job[96] = "", name[192];
    const char *j = strstr(p.out, "gpulaunch: job ");
    cr_assert(j && sscanf(j, "gpulaunch: job %95s", job) == 1, "%s", p.out);
    snprintf(name, sizeof name, "gpulaunch_rounds_total{job=\"%s\",kind=\"restart\"}", job);
    cr_expect_eq(metric(mport, name), 1, "%s", name);
    snprintf(name, sizeof name, "gpulaunch_rounds_total{job=\"%s\",kind=\"first\"}", job);
    cr_expect_eq(metric(mport, name), 1, "%s", name);
    snprintf(name, sizeof name, "gpulaunch_steps_redone_total{job=\"%s\"}", job);
    cr_expect_eq(metric(mport, name), (double)redone, "%s", name);
    const char *said = strstr(l, "; state: the checkpoint of step ");
    const char *rd = said ? strstr(said, " read (") : NULL;
    unsigned long long read_bytes = 0;
    cr_expect(rd && sscanf(rd, " read (%llu", &read_bytes) == 1 && read_bytes > 0, "%.400s", l);
    snprintf(name, sizeof name, "gpulaunch_state_bytes_total{job=\"%s\",source=\"checkpoint\"}",
             job);
    cr_expect_eq(metric(mport, name), (double)read_bytes, "%s", name);
    snprintf(name, sizeof name, "gpulaunch_restarts_total{job=\"%s\",reason=\"worker_failed\"}",
             job);
    cr_expect_eq(metric(mport, name), 1, "%s", name);
    snprintf(name, sizeof name, "gpulaunch_restarts_total{job=\"%s\",reason=\"reform_failed\"}",
             job);
    cr_expect_eq(metric(mport, name), 0, "%s", name);
    snprintf(name, sizeof name, "gpulaunch_reform_fallbacks_total{job=\"%s\"}", job);
    cr_expect_eq(metric(mport, name), 0, "%s", name);
    snprintf(name, sizeof name, "gpulaunch_round_pause_seconds_count{job=\"%s\"}", job);
    cr_expect_eq(metric(mport, name), 1, "%s", name);
    snprintf(name, sizeof name, "gpulaunch_round_pause_seconds_sum{job=\"%s\"}", job);
    double sum = metric(mport, name);
    cr_expect(sum > pause - 0.001 && sum < pause + 0.001, "pause sum %g, said %g", sum, pause);
    int st = proc_wait(&p, 60000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_log_info("a restart from a checkpoint: paused %.3f s, %ld steps done again", pause, redone);
}

/* The rendezvous's view of the same story: /status's rounds and the job's
 * cost, /metrics (promtool-clean), and the job page in headless Chromium:
 * the kinds in the rounds table and on the step-rate chart, the summary, no
 * sideways scrolling at 1280 px. Round 2: node a re-formed in place after
 * b was killed; round 3: a again, with c joining. */
static void check_server(int hport, double lost_pause) {
    static char body[1 << 18];
    usleep(300000); /* the last story on its way */
    cr_assert_eq(http_get_local(hport, "/status?job=story", body, sizeof body), 200);
    const char *cost = strstr(body, "\"membership_cost\":{");
    cr_assert_not_null(cost, "%s", body);
    unsigned first = 0, in_place = 0, restart = 9, warm = 0;
    cr_expect_eq(sscanf(cost,
                        "\"membership_cost\":{\"first\":%u,\"in_place\":%u,\"restart\":%u,"
                        "\"warm_join\":%u",
                        &first, &in_place, &restart, &warm),
                 4, "%s", cost);
    unsigned long long peers = 0;
    const char *bp = strstr(cost, "\"bytes_from_peers\":");
    cr_expect(bp && sscanf(bp, "\"bytes_from_peers\":%llu", &peers) == 1 && peers > 0,
              "the newcomer's state copied from a peer: %.300s", cost);
    cr_expect(strstr(cost, "\"restart_reasons\":{}") != NULL, "no restart: %.400s", cost);
    cr_expect(strstr(body, "\"kind\":\"began\"") &&
                  strstr(body, "round 2 began: 1 node(s) in place"),
              "the timeline's entry for round 2: %s", body);
    cr_expect(in_place == 2 && restart == 0 && first + warm == 3,
              "first %u in place %u restart %u warm %u: %.300s", first, in_place, restart, warm,
              cost);
    /* every launcher here has this machine's host name */
    char host[128] = "", want[256];
    gethostname(host, sizeof host - 1);
    snprintf(want, sizeof want, "\"nodes\":[{\"node\":\"%s\",\"kind\":\"in_place\",", host);
    cr_expect(strstr(body, want), "round 2's node story: %s", body);
    cr_expect(strstr(body, "\"round\":2,") &&
                  strstr(body, "\"story\":{\"first\":0,\"in_place\":1,"),
              "round 2's story: %s", body);
    double v = metric(hport, "gpulaunch_job_node_rounds_total{job=\"story\",kind=\"in_place\"}");
    cr_expect_eq(v, 2);
    v = metric(hport, "gpulaunch_job_restarts_total{job=\"story\",reason=\"not_live\"}");
    cr_expect_eq(v, 0);
    v = metric(hport, "gpulaunch_job_round_pause_seconds_count{job=\"story\"}");
    cr_expect_eq(v, 2);
    v = metric(hport, "gpulaunch_job_state_bytes_total{job=\"story\",source=\"peer\"}");
    cr_expect_eq(v, (double)peers);
    v = metric(hport, "gpulaunch_job_paused_rank_seconds_total{job=\"story\"}");
    cr_expect(v >= 2 * lost_pause - 0.01 && v < 8, "rank-seconds paused %g", v);
    if (browser_path() == NULL) {
        cr_log_warn("chromium is not installed (scripts/deps.sh): the job page is not checked");
        return;
    }
    int st = 0;
    char *dom = browser_dom(dir, hport, "story", browser_run_plain, &st);
    cr_expect(strstr(dom, "<b id=\"cost-in-place\">2</b>") != NULL &&
                  strstr(dom, "<b id=\"cost-restart\">0</b>") != NULL &&
                  strstr(dom, "<b id=\"cost-redone\">0</b>") != NULL,
              "the summary of round changes: %s", dom);
    cr_expect(strstr(dom, "round 2: in place") != NULL, "the chart's mark: %s", dom);
    cr_expect(strstr(dom, "<td>in place</td>") != NULL, "the rounds table's kind: %s", dom);
    cr_expect(strstr(dom, "<td>peers (") != NULL, "the rounds table's state source: %s", dom);
    snprintf(want, sizeof want, "<td>%s</td><td>in place</td>", host);
    cr_expect(strstr(dom, want) != NULL && strstr(dom, "<td>kept in memory</td>") != NULL &&
                  strstr(dom, " from rank ") != NULL,
              "the nodes' table (the survivor kept its state, the newcomer copied it): %s", dom);
    free(dom);
    unsigned sw = 0, cw = 0;
    int drawn = 0;
    char why[2100];
    int rc = browser_width_1280(dir, hport, "story", "cost-in-place", browser_run_plain, &sw, &cw,
                                &drawn, why, sizeof why);
    cr_expect(rc == 0 && cw > 1200 && sw <= cw && drawn,
              "the page scrolls sideways at 1280 px (%u px in %u, drawn %d): %s", sw, cw, drawn,
              rc ? why : "");
}

/* A launcher of an elastic job (1:2 nodes) whose dp_train workers re-form
 * in place, on a real rendezvous. */
static void start_node(proc *p, int port, const char *host) {
    char ep[64], ck[128];
    snprintf(ep, sizeof ep, "127.0.0.1:%d", port);
    snprintf(ck, sizeof ck, "%s/ck-%s", dir, host);
    char *argv[] = {GL,
                    "--nnodes",
                    "1:2",
                    "--nproc-per-node",
                    "2",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    ep,
                    "--rdzv-id",
                    "story",
                    "--rdzv-conf",
                    "last_call_timeout=1",
                    "--stats-interval", /* the job page's step rate, round changes marked on it */
                    "0.5",
                    DP,
                    "--steps",
                    "100000",
                    "--step-sleep-ms",
                    "10",
                    "--print-every",
                    "100000",
                    "--checkpoint-dir",
                    ck,
                    "--checkpoint-every",
                    "100",
                    "--reform",
                    NULL};
    cr_assert_eq(proc_start(p, argv, NULL), 0);
}

Test(story, a_live_re_formation_and_a_warm_join_say_their_kind_and_pause, .timeout = 240) {
    proc srv, a, b, c;
    int port, hport = free_tcp_port();
    char http[32];
    snprintf(http, sizeof http, "127.0.0.1:%d", hport);
    const char *extra[] = {"--http", http, NULL};
    cr_assert_eq(rdzv_start(&srv, &port, extra), 0);
    start_node(&a, port, "story-a");
    start_node(&b, port, "story-b");
    cr_assert(proc_expect(&a, "round 1: node rank", 20000), "%s", a.out);
    cr_assert(proc_expect(&b, "round 1: node rank", 20000), "%s", b.out);
    usleep(2000000);      /* training, its step rate reported */
    kill(b.pid, SIGKILL); /* its workers follow (PDEATHSIG) */
    proc_wait(&b, 5000);
    cr_assert(proc_expect(&a, "round 2 began: ", 20000), "%s", a.out);
    cr_assert(proc_expect(&a, "done again", 5000), "%s", a.out);
    double pause;
    long redone;
    const char *l = began(a.out, 2, &pause, &redone);
    cr_expect(strstr(l, "re-formed in place (the workers kept)") != NULL, "%s", l);
    cr_expect(pause > 0 && pause < 2, "paused %.3f s: %s", pause, l);
    cr_expect_eq(redone, 0, "%s", l);
    cr_expect(strstr(l, "; state: kept in memory") != NULL, "%.400s", l);
    double lost_pause = pause;
    /* a new node joins the live job: the survivor re-forms in place again;
     * the new node's workers either start before its round and take it (a
     * warm join, said) or start for it (its first round: the round line) */
    start_node(&c, port, "story-c");
    cr_assert(proc_expect(&a, "round 3 began: ", 30000), "%s", a.out);
    cr_assert(proc_expect(&c, "round 3: node rank", 10000), "%s", c.out);
    cr_assert(proc_expect(&a, "done again", 5000), "%s", a.out);
    l = began(a.out, 3, &pause, &redone);
    cr_expect(strstr(l, "re-formed in place") != NULL && redone == 0 && pause > 0 && pause < 2,
              "%s", l);
    usleep(500000); /* a warm joiner's first step */
    const char *cl = strstr(c.out, "round 3 began: ");
    cr_expect(cl == NULL || strncmp(cl, "round 3 began: joined warm", 26) == 0, "%s", c.out);
    cr_log_info("%.*s", cl ? (int)strcspn(cl, "\n") : 0, cl ? cl : "");
    cr_log_info("%.*s", (int)strcspn(l, "\n"), l);
    check_server(hport, lost_pause);
    for (proc *x = &a; x; x = x == &a ? &c : NULL) {
        proc_kill(x, SIGTERM);
        proc_wait(x, 10000);
    }
    proc_kill(&srv, SIGTERM);
    proc_wait(&srv, 5000);
    cr_log_info("a node lost: the survivor paused %.3f s, re-formed in place; a node joined: "
                "paused %.3f s",
                lost_pause, pause);
}

/* The server's count of restarts by reason, from raw protocol peers: a
 * STORY with its cause (RDZV_STORY_MORE) is counted under it, one without
 * (an older launcher's) as unknown; the round's timeline entry is one,
 * updated by each node's story; /status, /metrics (promtool-clean) agree. */
Test(story, the_server_counts_restarts_by_reason_and_keeps_one_timeline_entry_a_round) {
    proc srv;
    int port, hport = free_tcp_port();
    char http[32];
    snprintf(http, sizeof http, "127.0.0.1:%d", hport);
    const char *extra[] = {"--http", http, NULL};
    cr_assert_eq(rdzv_start(&srv, &port, extra), 0);
    static peer pe[3];
    static const uint32_t causes[3] = {RDZV_CAUSE_WORKER_FAILED, RDZV_CAUSE_HANG, RDZV_CAUSE_NONE};
    for (int i = 0; i < 3; i++) {
        char host[16];
        snprintf(host, sizeof host, "reasons-%d", i);
        cr_assert_eq(peer_open(&pe[i], port, NULL), 0);
        cr_assert_eq(peer_join(&pe[i], "reasons", host, -1, 2, 3, 3, 0), 0);
    }
    for (int i = 0; i < 3; i++)
        cr_assert_eq(peer_recv_type(&pe[i], RDZV_ASSIGNED, 10000), 0, "node %d not assigned", i);
    for (int i = 0; i < 3; i++) {
        rdzv_msg m = {.type = RDZV_STORY};
        m.u.story.round = 1;
        m.u.story.kind = RDZV_STORY_RESTART;
        m.u.story.pause_ms = 100 * (uint32_t)(i + 1);
        m.u.story.nproc = 2;
        m.u.story.state_step = -1;
        if (i == 1) { /* its state copied from rank 4 */
            m.u.story.source = RDZV_STATE_PEER;
            m.u.story.state_step = 77;
            m.u.story.state_bytes = 4616;
            m.u.story.state_ms = 10;
            m.u.story.state_root = 4;
        }
        snprintf(m.u.story.why, sizeof m.u.story.why, "reason %d", i);
        if (causes[i] != RDZV_CAUSE_NONE) {
            m.flags = RDZV_STORY_MORE;
            m.u.story.cause = causes[i];
        }
        cr_assert_eq(peer_send(&pe[i], &m), 0);
    }
    static char body[1 << 18];
    const char *want = "\"restart_reasons\":{\"unknown\":1,\"worker_failed\":1,\"hang\":1}}";
    uint64_t until = now_ms() + 5000;
    do {
        usleep(50000);
        cr_assert_eq(http_get_local(hport, "/status?job=reasons", body, sizeof body), 200);
    } while (strstr(body, want) == NULL && now_ms() < until);
    const char *cost = strstr(body, "\"membership_cost\":");
    cr_expect(cost && strstr(cost, want), "%s", body);
    const char *ev = strstr(body, "\"kind\":\"began\"");
    cr_expect(ev && strstr(ev + 1, "\"kind\":\"began\"") == NULL, "one entry for round 1: %s",
              body);
    cr_expect(ev && strstr(ev, "\"count\":3") &&
                  strstr(ev, "round 1 began: 3 restarted (1 unknown, 1 worker_failed, 1 hang); "
                             "paused up to 0.300 s"),
              "%s", ev ? ev : body);
    /* each node's own story, as told */
    cr_expect(strstr(body, "{\"node\":\"reasons-0\",\"kind\":\"restart\",\"pause_s\":0.100,"
                           "\"steps_redone\":0,\"ranks\":2,\"reason\":\"worker_failed\"}") &&
                  strstr(body, "{\"node\":\"reasons-1\",\"kind\":\"restart\",\"pause_s\":0.200,"
                               "\"steps_redone\":0,\"ranks\":2,\"reason\":\"hang\",\"state\":"
                               "\"peer\",\"state_step\":77,\"state_bytes\":4616,\"state_ms\":10,"
                               "\"state_root\":4}") &&
                  strstr(body, "\"reason\":\"unknown\"}],\"nodes_more\":0"),
              "the nodes' own stories: %s", body);
    static const char *const reasons[] = {"unknown",       "worker_failed", "hang",
                                          "reform_failed", "not_live",      "stopping"};
    for (size_t r = 0; r < sizeof reasons / sizeof reasons[0]; r++) {
        char name[160];
        snprintf(name, sizeof name, "gpulaunch_job_restarts_total{job=\"reasons\",reason=\"%s\"}",
                 reasons[r]);
        cr_expect_eq(metric(hport, name), r < 3 ? 1 : 0, "%s", name);
    }
    for (int i = 0; i < 3; i++)
        peer_close(&pe[i]);
    proc_kill(&srv, SIGTERM);
    proc_wait(&srv, 5000);
}
