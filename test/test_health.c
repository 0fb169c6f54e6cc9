/* Job health on a real gpulaunch-rdzv: launcher clients (rdzv_client, on a
 * libuv loop in this process) send per-rank statistics over real sockets; a
 * rank slowed by 50 % is named within 3 windows and no other rank is, it
 * recovers, a hang ends the round and is recorded, /status and /metrics say
 * so within their bounds, the job page shows it in headless Chromium, and the
 * server's CPU cost of statistics from 1,024 nodes x 8 ranks is measured. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <curl/curl.h>
#include <jansson.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "browser.h"
#include "harness.h"

static proc srv;
static int port, hport;
static uv_loop_t loop;

typedef struct node {
    rdzv_client *c;
    int assigned, over, errors, stragglers, recovered;
    rdzv_assignment a;
    uint32_t over_reason;
    char over_msg[1025], event[1025], event_node[256];
} node;

static void on_assigned(rdzv_client *c, const rdzv_assignment *a) {
    node *n = rdzv_client_data(c);
    n->assigned = 1;
    n->a = *a;
}

static void on_round_over(rdzv_client *c, uint32_t round, uint32_t reason, uint32_t node_rank,
                          const char *hostname, const char *message) {
    node *n = rdzv_client_data(c);
    n->assigned = 0;
    n->over++;
    n->over_reason = reason;
    snprintf(n->over_msg, sizeof n->over_msg, "%s", message);
}

static void on_event(rdzv_client *c, uint32_t kind, uint64_t deadline, const char *nodename,
                     const char *reason) {
    node *n = rdzv_client_data(c);
    if (kind != RDZV_EVENT_STRAGGLER)
        return;
    if (strstr(reason, "recovered"))
        n->recovered++;
    else
        n->stragglers++;
    snprintf(n->event, sizeof n->event, "%s", reason);
    snprintf(n->event_node, sizeof n->event_node, "%s", nodename);
}

static void on_error(rdzv_client *c, gpl_result_t code, const char *message) {
    node *n = rdzv_client_data(c);
    n->errors++;
    cr_log_error("client error %d: %s", code, message);
}

static void start_server(const char *const *more) {
    const char *extra[16] = {"--http", "127.0.0.1:0"};
    int k = 2;
    for (int i = 0; more && more[i] && k < 15; i++)
        extra[k++] = more[i];
    extra[k] = NULL;
    cr_assert_eq(rdzv_start(&srv, &port, extra), 0, "server did not start: %s", srv.out);
    cr_assert(proc_expect(&srv, " http 127.0.0.1:", 2000));
    hport = (int)strtol(strstr(srv.out, " http 127.0.0.1:") + 16, NULL, 10);
    uv_loop_init(&loop);
}

static void stop_server(void) {
    proc_kill(&srv, SIGTERM);
    int st = proc_wait(&srv, 5000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "server exit status %d: %s", st, srv.out);
}

/* Runs the loop for ms, draining the server's output (it must never block on it). */
static void pump(int ms) {
    uint64_t end = now_ms() + (uint64_t)ms;
    do {
        uv_run(&loop, UV_RUN_NOWAIT);
        proc_expect(&srv, "\x01never\x01", 0);
        usleep(1000);
    } while (now_ms() < end);
}

static void start_client(node *nodes, const char *run, uint32_t i, uint32_t n, uint32_t nproc) {
    {
        char host[64], addr[64], inst[64];
        snprintf(host, sizeof host, "%s-node-%u", run, i);
        snprintf(addr, sizeof addr, "10.0.%u.%u", i / 250, i % 250 + 1);
        snprintf(inst, sizeof inst, "i-%s-%u", run, i);
        rdzv_join_params jp = {.run_id = run,
                               .hostname = host,
                               .addr = addr,
                               .instance = inst,
                               .master_port = 29500,
                               .nproc = nproc,
                               .ngpus = nproc,
                               .static_rank = (int32_t)i,
                               .min_nodes = n,
                               .max_nodes = n,
                               .join_timeout_ms = 60000,
                               .heartbeat_interval_ms = 1000,
                               .heartbeat_timeout_ms = 30000};
        rdzv_client_options o = {.host = "127.0.0.1", .port = port, .connect_timeout_ms = 10000};
        rdzv_client_callbacks cb = {.data = &nodes[i],
                                    .on_assigned = on_assigned,
                                    .on_round_over = on_round_over,
                                    .on_event = on_event,
                                    .on_error = on_error};
        char err[256];
        cr_assert_eq(rdzv_client_start(&loop, &o, &jp, &cb, &nodes[i].c, err, sizeof err), GPL_OK,
                     "%s", err);
    }
}

static node *start_nodes(const char *run, uint32_t n, uint32_t nproc) {
    node *nodes = calloc(n, sizeof *nodes);
    for (uint32_t i = 0; i < n; i++)
        start_client(nodes, run, i, n, nproc);
    uint64_t deadline = now_ms() + 20000;
    uint32_t ready = 0;
    while (now_ms() < deadline) {
        pump(5);
        ready = 0;
        for (uint32_t i = 0; i < n; i++)
            ready += nodes[i].assigned;
        if (ready == n)
            break;
    }
    cr_assert_eq(ready, n, "only %u of %u nodes were assigned", ready, n);
    return nodes;
}

static void close_nodes(node *nodes, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        rdzv_client_close(nodes[i].c);
    pump(20);
    free(nodes);
}

/* Synchronous data parallelism, modelled: each rank computes for its own
 * time (20 ms with +-5 % noise, times its slowdown), then the all-reduce
 * (2 ms) starts when the last rank arrives; every rank's step time is the
 * slowest rank's, and the others wait the difference. */
#define BASE_US 20000.0
#define COMM_US 2000.0
#define WINDOW_MS 200

static double compute_us(uint32_t rank, uint32_t w, uint32_t slow_rank, double slow) {
    double noise = (double)((int)((rank * 7 + w * 13) % 11) - 5) / 100.0;
    return BASE_US * (1.0 + noise) * (rank == slow_rank ? slow : 1.0);
}

/* Nodes (bit i: nodes[i]) whose launcher reports checkpoints: rank r wrote
 * step 200 locally (rank 1: 190), step 100 is durable (rank 3 knows of 90),
 * its last save stalled 10 + r ms and (r + 1) MB still drain. The others
 * send entries without the checkpoint group, byte for byte an older
 * launcher's. */
static uint32_t ckpt_nodes;

/* One window of every node; slow: the slowdown of slow_rank over it. The
 * rank `steady` is 12 % slower throughout (a noise-level difference). */
static void send_window(node *nodes, uint32_t n, uint32_t nproc, uint32_t w, uint32_t slow_rank,
                        double slow, uint32_t steady) {
    uint32_t world = n * nproc;
    double step = 0;
    for (uint32_t r = 0; r < world; r++) {
        double c = compute_us(r, w, slow_rank, slow) * (r == steady ? 1.12 : 1.0);
        if (c > step)
            step = c;
    }
    step += COMM_US;
    rdzv_rank_stats *st = calloc(nproc, sizeof *st);
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t l = 0; l < nproc; l++) {
            uint32_t r = nodes[i].a.base_rank + l;
            double c = compute_us(r, w, slow_rank, slow) * (r == steady ? 1.12 : 1.0);
            st[l] = (rdzv_rank_stats){.rank = r,
                                      .local_rank = l,
                                      .step = (uint64_t)(w + 1) * 9,
                                      .steps = (uint32_t)(WINDOW_MS * 1000.0 / step),
                                      .step_time_us = (uint32_t)step,
                                      .wait_us = (uint32_t)(step - COMM_US - c),
                                      .since_progress_ms = 15};
            snprintf(st[l].gpu, sizeof st[l].gpu, "%u", l);
            st[l].ckpt_local_step = st[l].ckpt_durable_step = -1;
            if (i < 32 && (ckpt_nodes >> i) & 1u) {
                st[l].ckpt_local_step = r == 1 ? 190 : 200;
                st[l].ckpt_durable_step = r == 3 ? 90 : 100;
                st[l].ckpt_stall_ms = 10 + r;
                st[l].ckpt_drain_left = 1000000ull * (r + 1);
            }
        }
        rdzv_client_stats(nodes[i].c, WINDOW_MS, st, nproc);
    }
    free(st);
}

typedef struct sbuf_t {
    char *p;
    size_t len, cap;
} sbuf_t;

static size_t sink(char *p, size_t s, size_t n, void *ud) {
    sbuf_t *b = ud;
    size_t add = s * n;
    if (b->len + add + 1 > b->cap) {
        size_t cap = (b->len + add + 1) * 2;
        char *q = realloc(b->p, cap);
        if (q == NULL)
            return 0;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, add);
    b->len += add;
    b->p[b->len] = 0;
    return add;
}

static char *http_get(const char *path) {
    sbuf_t b = {0};
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", hport, path);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
    long code = 0;
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    cr_assert_eq(code, 200, "GET %s: %ld", path, code);
    return b.p ? b.p : strdup("");
}

/* Lines of text that start with prefix and contain every needle (NULL-ended). */
static int count_lines(const char *text, const char *prefix, const char *const *needles) {
    int n = 0;
    for (const char *l = text; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), l);
        if (strncmp(line, prefix, strlen(prefix)) == 0) {
            int all = 1;
            for (int i = 0; needles && needles[i]; i++)
                all &= strstr(line, needles[i]) != NULL;
            n += all;
        }
        l = e ? e + 1 : NULL;
    }
    return n;
}

static int total(node *nodes, uint32_t n, size_t off) {
    int t = 0;
    for (uint32_t i = 0; i < n; i++)
        t += *(int *)((char *)&nodes[i] + off);
    return t;
}

TestSuite(health, .timeout = 60);

/* 3 nodes x 4 ranks. Windows 0-2 as usual (rank 2 steadily 12 % slower: not
 * named); in window 3 rank 6 slows by 50 % from mid-window (1.25x over the
 * window), then 1.5x: it must be named by the end of window 5, and no other
 * rank ever. From window 9 it is back to normal and recovers. */
Test(health, slowed_rank_named_within_3_windows_then_recovers) {
    start_server(NULL);
    const uint32_t n = 3, nproc = 4, slow_rank = 6, steady = 2, w0 = 3, fix = 9;
    node *nodes = start_nodes("slow", n, nproc);
    int named_at = -1, recovered_at = -1;
    for (uint32_t w = 0; w < 14; w++) {
        double slow = w < w0 ? 1.0 : w == w0 ? 1.25 : w < fix ? 1.5 : w == fix ? 1.25 : 1.0;
        send_window(nodes, n, nproc, w, slow_rank, slow, steady);
        pump(WINDOW_MS);
        if (named_at < 0 && total(nodes, n, offsetof(node, stragglers)) == (int)n)
            named_at = (int)w;
        if (recovered_at < 0 && total(nodes, n, offsetof(node, recovered)) == (int)n)
            recovered_at = (int)w;
        if (w == fix - 1) {
            char *st = http_get("/status");
            cr_expect(strstr(st, "\"stragglers\":[6]") != NULL, "%s", st);
            cr_expect(strstr(st,
                             "\"rank\":6,\"local_rank\":2,\"node_rank\":1,\"node\":\"slow-node-1\""
                             ",\"gpu\":\"2\"") != NULL,
                      "%s", st);
            cr_expect(strstr(st, "\"kind\":\"straggler\"") != NULL, "%s", st);
            cr_expect(strstr(st, "\"gpus\":[\"0\",\"1\",\"2\",\"3\"]") != NULL, "%s", st);
            free(st);
            char *m = http_get("/metrics");
            const char *named[] = {"rank=\"6\"", "node=\"slow-node-1\"", "job=\"slow\"", "} 1",
                                   NULL};
            cr_expect_eq(count_lines(m, "gpulaunch_rank_straggler{", named), 1, "%s", m);
            const char *one[] = {"} 1", NULL};
            cr_expect_eq(count_lines(m, "gpulaunch_rank_straggler{", one), 1,
                         "exactly one rank is named: %s", m);
            cr_expect(strstr(m, "gpulaunch_job_stragglers{job=\"slow\"} 1\n") != NULL, "%s", m);
            const char *st6[] = {"rank=\"6\"", NULL};
            cr_expect_eq(count_lines(m, "gpulaunch_rank_step_time_seconds{", st6), 1, "%s", m);
            cr_expect_eq(count_lines(m, "gpulaunch_rank_wait_seconds{", st6), 1, "%s", m);
            free(m);
        }
    }
    cr_log_info("straggler named in window %d (slowdown from mid-window %u), recovered in "
                "window %d (back to normal from mid-window %u)",
                named_at, w0, recovered_at, fix);
    cr_expect(named_at >= (int)w0 && named_at <= (int)w0 + 2,
              "rank 6 named in window %d; the slowdown started in window %u", named_at, w0);
    cr_expect_eq(total(nodes, n, offsetof(node, stragglers)), (int)n,
                 "one straggler event per node, for rank 6 only");
    cr_expect(strstr(nodes[0].event, "rank 6 (node slow-node-1, local rank 2, GPU 2)") != NULL,
              "%s", nodes[0].event);
    cr_expect_str_eq(nodes[2].event_node, "slow-node-1");
    cr_expect(recovered_at >= (int)fix && recovered_at <= (int)fix + 3, "recovered in window %d",
              recovered_at);
    cr_expect(proc_expect(&srv, "straggler: rank 6 (node slow-node-1", 1000), "the server's log");
    char *st = http_get("/status");
    cr_expect(strstr(st, "\"stragglers\":[]") != NULL, "%s", st);
    cr_expect(strstr(st, "\"kind\":\"recovered\"") != NULL, "%s", st);
    cr_expect(strstr(st, "\"rate\":[[") != NULL, "step rate samples: %s", st);
    free(st);
    close_nodes(nodes, n);
    stop_server();
}

/* The threshold and window count are the server's options. */
Test(health, options_set_threshold_and_windows) {
    const char *more[] = {"--straggler-threshold", "1.1", "--straggler-windows", "4", NULL};
    start_server(more);
    node *nodes = start_nodes("opt", 2, 4);
    int named_at = -1;
    for (uint32_t w = 0; w < 8 && named_at < 0; w++) {
        send_window(nodes, 2, 4, w, 5, 1.25, 99); /* rank 5: 25 % slower, over 1.1x */
        pump(WINDOW_MS);
        if (total(nodes, 2, offsetof(node, stragglers)) == 2)
            named_at = (int)w;
    }
    cr_expect_eq(named_at, 3, "named after 4 windows over 1.1x, at window %d", named_at);
    cr_expect(strstr(nodes[0].event, "rank 5 ") != NULL, "%s", nodes[0].event);
    char *st = http_get("/status");
    cr_expect(strstr(st, "\"threshold\":1.100,\"windows\":4") != NULL, "%s", st);
    free(st);
    close_nodes(nodes, 2);
    stop_server();
    const char *bad[] = {"--straggler-threshold", "0.9", NULL};
    proc p;
    cr_expect_neq(rdzv_start(&p, &port, bad), 0, "a threshold under 1 is refused");
    cr_expect(strstr(p.out, "--straggler-threshold takes a number over 1") != NULL, "%s", p.out);
    proc_wait(&p, 2000);
}

/* A hang report ends the round like a failure, names the rank to every node
 * and stays on the job's record (/status, /metrics, the timeline). */
Test(health, hang_ends_the_round_and_is_recorded) {
    start_server(NULL);
    node *nodes = start_nodes("hang", 2, 2);
    send_window(nodes, 2, 2, 0, 99, 1.0, 99);
    pump(50);
    rdzv_client_hang(nodes[1].c, 3,
                     "rank 3 (pid 4242) made no progress for 12.0 s (timeout 10 s); last step 340");
    uint64_t deadline = now_ms() + 5000;
    while (now_ms() < deadline && (nodes[0].over == 0 || nodes[1].over == 0))
        pump(5);
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(nodes[i].over, 1, "node %d told the round is over", i);
        cr_expect_eq(nodes[i].over_reason, RDZV_REASON_HUNG);
        cr_expect(strstr(nodes[i].over_msg, "rank 3 hung: rank 3 (pid 4242)") != NULL, "%s",
                  nodes[i].over_msg);
    }
    char *st = http_get("/status");
    cr_expect(strstr(st, "\"hang\":{\"unix_ms\":") != NULL, "%s", st);
    cr_expect(
        strstr(st,
               "\"kind\":\"hang\",\"round\":1,\"count\":1,\"rank\":3,\"node\":\"hang-node-1\"") !=
            NULL,
        "%s", st);
    cr_expect(strstr(st, "\"kind\":\"round_over\"") != NULL, "%s", st);
    cr_expect(strstr(st, "\"hangs_total\":1") != NULL, "%s", st);
    free(st);
    char *m = http_get("/metrics");
    cr_expect(strstr(m, "gpulaunch_job_hangs_total{job=\"hang\"} 1\n") != NULL, "%s", m);
    cr_expect(strstr(m, "gpulaunch_rdzv_failures_total{reason=\"hung\"} 1\n") != NULL, "%s", m);
    free(m);
    cr_expect(proc_expect(&srv, "rank 3 on node hang-node-1 (node rank 1) hung", 1000));
    /* the next round forms from both survivors, and the hang stays on the record */
    for (int i = 0; i < 2; i++)
        rdzv_client_rejoin(nodes[i].c);
    deadline = now_ms() + 5000;
    while (now_ms() < deadline && !(nodes[0].assigned && nodes[1].assigned))
        pump(5);
    cr_expect(nodes[0].assigned && nodes[1].assigned && nodes[0].a.round == 2);
    st = http_get("/status");
    cr_expect(strstr(st, "\"hang\":{") != NULL && strstr(st, "\"round\":2,\"nnodes\":2") != NULL,
              "%s", st);
    free(st);
    close_nodes(nodes, 2);
    stop_server();
}

/* Per-rank output is bounded: 2 nodes x 300 ranks give at most
 * RDZV_METRICS_RANKS (16) series per metric and job, and 512 ranks in
 * /status; the straggler is among them either way. */
Test(health, per_rank_output_is_bounded) {
    start_server(NULL);
    const uint32_t n = 2, nproc = 300, slow_rank = 417;
    node *nodes = start_nodes("wide", n, nproc);
    for (uint32_t w = 0; w < 4; w++) {
        send_window(nodes, n, nproc, w, slow_rank, 1.5, 99999);
        pump(WINDOW_MS);
    }
    cr_expect_eq(total(nodes, n, offsetof(node, stragglers)), (int)n);
    char *m = http_get("/metrics");
    const char *job[] = {"job=\"wide\"", NULL};
    cr_expect_eq(count_lines(m, "gpulaunch_rank_step_time_seconds{", job), 16, "%s", m);
    cr_expect_eq(count_lines(m, "gpulaunch_rank_straggler{", job), 16);
    const char *named[] = {"rank=\"417\"", "} 1", NULL};
    cr_expect_eq(count_lines(m, "gpulaunch_rank_straggler{", named), 1);
    free(m);
    char *st = http_get("/status");
    cr_expect(strstr(st, "\"world\":600,\"reported\":600") != NULL, "%s", st);
    cr_expect(strstr(st, "\"ranks_shown\":512,") != NULL);
    cr_expect(strstr(st, "{\"rank\":417,") != NULL, "the straggler is shown");
    free(st);
    close_nodes(nodes, n);
    stop_server();
}

/* The job object of run in a /status document. */
static json_t *status_job(json_t *doc, const char *run) {
    json_t *jobs = json_object_get(doc, "jobs"), *j;
    size_t i;
    json_array_foreach(jobs, i, j) {
        if (strcmp(json_string_value(json_object_get(j, "run_id")), run) == 0)
            return j;
    }
    return NULL;
}

/* The checkpoint object of rank r in the job's health.ranks (json null
 * when the rank has none, NULL when the rank is not listed). */
static json_t *rank_ckpt(json_t *job, uint32_t r) {
    json_t *ranks = json_object_get(json_object_get(job, "health"), "ranks"), *x;
    size_t i;
    json_array_foreach(ranks, i, x) {
        if (json_integer_value(json_object_get(x, "rank")) == (json_int_t)r)
            return json_object_get(x, "checkpoint");
    }
    return NULL;
}

/* A step figure of a checkpoint object: -1 for null, -2 when missing. */
static long long ck(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return v == NULL ? -2 : json_is_null(v) ? -1 : (long long)json_integer_value(v);
}

/* Checkpoint figures in STATS reach /status (per rank and the job's: min of
 * the steps, max of the stalls, sum of the drains) and /metrics; an older
 * launcher's entries (no checkpoint group) still count and leave the job's
 * steps unknown; a job without checkpoints has none and no series. */
Test(health, checkpoint_figures_in_status_and_metrics) {
    char why[1100];
    /* the checker refuses what promtool does */
    static const char *const bad[] = {
        "x 1\n",                                           /* no TYPE */
        "# TYPE x gauge\nx{a=\"1\"} 1\nx{a=\"1\"} 2\n",    /* a series twice */
        "# TYPE x gauge\n# TYPE y gauge\nx 1\ny 1\nx 2\n", /* a family apart */
        "# TYPE x gauge\nx{a=1} 1\n",                      /* an unquoted label */
        "# TYPE x gauge\nx 1.2.3\n",                       /* not a number */
        "# TYPE x gauge\n# TYPE x counter\nx 1\n",         /* TYPE twice */
        "# TYPE x gauge\nx_bucket{le=\"1\"} 1\n",          /* a gauge has no buckets */
        "# TYPE x summary\nx_bucket{le=\"1\"} 1\n",        /* nor has a summary */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(prom_check(bad[i], why, sizeof why), -1, "%s", bad[i]);
    cr_assert_eq(
        prom_check("# HELP x X.\n# TYPE x gauge\nx{a=\"q\\\"\"} -1\nx 2.5e+06\n", why, sizeof why),
        0, "%s", why);
    cr_assert_eq(prom_check("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\n"
                            "h_sum 3.5\nh_count 2\n",
                            why, sizeof why),
                 0, "a histogram: %s", why);
    /* and the docs check names what no doc has */
    cr_assert_eq(prom_documented("# HELP gpulaunch_rdzv_jobs J.\n# HELP gpulaunch_no_such_x X.\n"
                                 "# HELP gpulaunch_rank_straggler S.\n",
                                 why, sizeof why),
                 -1);
    cr_assert_str_eq(why, "gpulaunch_no_such_x");
    start_server(NULL);
    node *nodes = start_nodes("ckpt", 2, 4);
    /* no launcher reports checkpoints */
    ckpt_nodes = 0;
    for (uint32_t w = 0; w < 2; w++) {
        send_window(nodes, 2, 4, w, 99, 1.0, 99);
        pump(WINDOW_MS);
    }
    char *st = http_get("/status");
    json_error_t jerr;
    json_t *doc = json_loads(st, 0, &jerr);
    cr_assert(doc != NULL, "/status is not JSON (%s): %s", jerr.text, st);
    json_t *job = status_job(doc, "ckpt");
    cr_assert(job != NULL);
    cr_expect(json_is_null(json_object_get(job, "checkpoint")), "no checkpoints: %s", st);
    cr_expect(json_is_null(rank_ckpt(job, 5)), "%s", st);
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(job, "health"), "reported")), 8,
                 "entries without checkpoints are taken: %s", st);
    json_decref(doc);
    free(st);
    char *m = http_get("/metrics");
    cr_expect_eq(prom_check(m, why, sizeof why), 0, "%s\n%s", why, m);
    cr_expect(strstr(m, "# TYPE gpulaunch_job_checkpoint_local_step gauge\n") != NULL, "%s", m);
    cr_expect_eq(count_lines(m, "gpulaunch_job_checkpoint_", NULL), 0, "no series: %s", m);
    free(m);

    /* node 0's launcher reports them, node 1's is older */
    ckpt_nodes = 1;
    send_window(nodes, 2, 4, 2, 99, 1.0, 99);
    pump(WINDOW_MS);
    st = http_get("/status");
    doc = json_loads(st, 0, &jerr);
    cr_assert(doc != NULL, "%s: %s", jerr.text, st);
    job = status_job(doc, "ckpt");
    json_t *c = json_object_get(job, "checkpoint");
    cr_expect(json_is_object(c), "%s", st);
    cr_expect_eq(json_integer_value(json_object_get(c, "ranks")), 4);
    cr_expect_eq(ck(c, "local_step"), -1, "ranks 4-7 say nothing: no step every rank wrote");
    cr_expect_eq(ck(c, "durable_step"), -1);
    cr_expect_eq(json_integer_value(json_object_get(c, "stall_ms")), 13);
    cr_expect_eq(json_integer_value(json_object_get(c, "drain_bytes")), 10000000);
    json_t *r1 = rank_ckpt(job, 1);
    cr_expect(ck(r1, "local_step") == 190 && ck(r1, "durable_step") == 100 &&
                  json_integer_value(json_object_get(r1, "stall_ms")) == 11 &&
                  json_integer_value(json_object_get(r1, "drain_bytes")) == 2000000,
              "rank 1: %s", st);
    cr_expect(json_is_null(rank_ckpt(job, 6)), "an older launcher's rank: %s", st);
    json_decref(doc);
    free(st);
    m = http_get("/metrics");
    cr_expect_eq(prom_check(m, why, sizeof why), 0, "%s\n%s", why, m);
    cr_expect(strstr(m, "gpulaunch_job_checkpoint_local_step{job=\"ckpt\"} -1\n") &&
                  strstr(m, "gpulaunch_job_checkpoint_durable_step{job=\"ckpt\"} -1\n") &&
                  strstr(m, "gpulaunch_job_checkpoint_stall_seconds{job=\"ckpt\"} 0.013\n") &&
                  strstr(m, "gpulaunch_job_checkpoint_drain_bytes{job=\"ckpt\"} 10000000\n"),
              "%s", m);
    free(m);

    /* both report them */
    ckpt_nodes = 3;
    send_window(nodes, 2, 4, 3, 99, 1.0, 99);
    pump(WINDOW_MS);
    st = http_get("/status");
    doc = json_loads(st, 0, &jerr);
    cr_assert(doc != NULL, "%s: %s", jerr.text, st);
    job = status_job(doc, "ckpt");
    c = json_object_get(job, "checkpoint");
    cr_expect(json_integer_value(json_object_get(c, "ranks")) == 8 && ck(c, "local_step") == 190 &&
                  ck(c, "durable_step") == 90 &&
                  json_integer_value(json_object_get(c, "stall_ms")) == 17 &&
                  json_integer_value(json_object_get(c, "drain_bytes")) == 36000000,
              "the job's: min, min, max, sum: %s", st);
    cr_expect_eq(ck(rank_ckpt(job, 6), "local_step"), 200, "%s", st);
    json_decref(doc);
    free(st);
    m = http_get("/metrics");
    cr_expect_eq(prom_check(m, why, sizeof why), 0, "%s\n%s", why, m);
    cr_expect(strstr(m, "gpulaunch_job_checkpoint_local_step{job=\"ckpt\"} 190\n") &&
                  strstr(m, "gpulaunch_job_checkpoint_durable_step{job=\"ckpt\"} 90\n") &&
                  strstr(m, "gpulaunch_job_checkpoint_stall_seconds{job=\"ckpt\"} 0.017\n") &&
                  strstr(m, "gpulaunch_job_checkpoint_drain_bytes{job=\"ckpt\"} 36000000\n"),
              "%s", m);
    free(m);
    ckpt_nodes = 0;
    close_nodes(nodes, 2);
    stop_server();
}

static int count_of(const char *hay, const char *needle);

/* /status?job=RUN_ID (what the page reads): that job in full and one line
 * per job; /status alone: every job in full. */
Test(health, status_of_one_job) {
    start_server(NULL);
    node *a = start_nodes("alpha", 1, 2);
    node *b = start_nodes("beta", 1, 2);
    send_window(b, 1, 2, 0, 1, 1.0, 99);
    rdzv_client_event(b[0].c, RDZV_EVENT_CHECKPOINT, 0, "spot instance reclaimed in 120 s");
    rdzv_client_event(b[0].c, RDZV_EVENT_GPU, 0, "XID 79 on GPU 3, held by rank 3");
    pump(100);
    char *st = http_get("/status?job=beta");
    cr_expect(strstr(st, "\"kind\":\"gpu\"") &&
                  strstr(st, "\"text\":\"beta-node-0: XID 79 on GPU 3, held by rank 3\""),
              "the GPU notice is on the timeline: %s", st);
    cr_expect(strstr(st, "\"kind\":\"preemption\",\"round\":1,\"count\":1,\"rank\":null,"
                         "\"node\":\"beta-node-0\",\"text\":\"checkpoint from beta-node-0: spot "
                         "instance reclaimed in 120 s\"") != NULL,
              "the preemption is on the timeline: %s", st);
    cr_expect(strstr(st, "\"jobs\":[{\"run_id\":\"beta\",\"state\":\"running\"") != NULL, "%s", st);
    cr_expect(strstr(st, "\"run_id\":\"alpha\",\"state\":\"running\",\"round\":1,\"min") == NULL,
              "alpha is not in full: %s", st);
    cr_expect(strstr(st, "\"job_list\":[") &&
                  strstr(st, "{\"run_id\":\"alpha\",\"state\":\"running\","
                             "\"round\":1,\"nodes\":1,\"world\":2,"
                             "\"stragglers\":0,\"hang\":false}"),
              "%s", st);
    free(st);
    st = http_get("/status?job=nope");
    cr_expect(strstr(st, "\"jobs\":[],\"job_list\":[{") != NULL, "%s", st);
    free(st);
    st = http_get("/status");
    cr_expect(strstr(st, "\"run_id\":\"alpha\",\"state\":\"running\",\"round\":1,\"min") &&
                  strstr(st, "\"run_id\":\"beta\",\"state\":\"running\",\"round\":1,\"min") &&
                  !strstr(st, "job_list"),
              "%s", st);
    free(st);
    char *page = http_get("/");
    cr_expect(strstr(page, "<title>gpulaunch rendezvous</title>") && strstr(page, "/status?job="),
              "the page is served at /");
    cr_expect(count_of(page, "http://") == count_of(page, "http://www.w3.org/2000/svg") &&
                  !strstr(page, "https://") && !strstr(page, " src=") && !strstr(page, "<link"),
              "the page loads nothing from elsewhere");
    free(page);
    close_nodes(a, 1);
    close_nodes(b, 1);
    stop_server();
}

static void pump_20(void) { pump(20); }

/* Runs cmd while this process's clients keep answering (the page's server
 * needs their heartbeats meanwhile). */
static int run_pumping(const char *cmd, int timeout_ms) {
    return browser_run_idle(cmd, timeout_ms, pump_20);
}

static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* The page at / in a real browser: a job with a straggler and a second one
 * with a hang; the DOM after the page's scripts ran shows the jobs, the
 * members, the straggler highlighted, both plots with points; a screenshot
 * is written for the docs. */
Test(health, job_page_in_chromium, .timeout = 90) {
    const char *browser = browser_path();
    if (browser == NULL)
        skip_test("chromium is not installed (Debian package chromium, scripts/deps.sh): the "
                  "job page is not checked in a browser");
    start_server(NULL);
    node *hung = start_nodes("eval", 1, 2);
    /* as long as real reasons get (a probe's verdict names its evidence): the
     * rounds table must wrap it, not scroll */
    rdzv_client_hang(hung[0].c, 1,
                     "rank 1 (pid 5151) made no progress for 31.0 s (timeout 30 s); its last "
                     "step 1207 ended 31.0 s ago, it waits in all_reduce #4411 since 30.9 s "
                     "while ranks 0 and 2-7 finished it; its stacks are in the worker's log "
                     "(py-spy dump --pid 5151 for more), see docs/health.md, hung ranks");
    node *nodes = start_nodes("train", 2, 4);
    ckpt_nodes = 3; /* train's launchers report checkpoints, eval's do not */
    for (uint32_t w = 0; w < 20; w++) {
        send_window(nodes, 2, 4, w, 5, w < 8 ? 1.0 : 1.5, 99);
        pump(WINDOW_MS);
    }
    ckpt_nodes = 0;
    cr_assert_eq(total(nodes, 2, offsetof(node, stragglers)), 2, "rank 5 named");
    char dir[256];
    tmpdir_make(dir, sizeof dir, "gpl-page");
    char cmd[2048];
    const char *flags = BROWSER_FLAGS;
    snprintf(cmd, sizeof cmd,
             "timeout 60 %s %s --user-data-dir=%s/profile --dump-dom "
             "'http://127.0.0.1:%d/#job=train' >%s/train.html 2>%s/chromium.log",
             browser, flags, dir, hport, dir, dir);
    int st = run_pumping(cmd, 70000);
    char path[512];
    snprintf(path, sizeof path, "%s/train.html", dir);
    char *dom = browser_slurp(path);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0 && strlen(dom) > 1000,
              "chromium failed (status %d); its DOM: %.2000s", st, dom);
    /* every job listed, the selected one shown with its members */
    cr_expect(strstr(dom, "data-run-id=\"train\"") != NULL, "%s", dom);
    cr_expect(strstr(dom, "data-run-id=\"eval\"") != NULL, "%s", dom);
    cr_expect(strstr(dom, "job train: running, round 1") != NULL, "%s", dom);
    cr_expect(strstr(dom, "<td>train-node-0</td>") && strstr(dom, "<td>train-node-1</td>") &&
                  strstr(dom, "<td>10.0.0.2</td>") && strstr(dom, "<td>4-7</td>") &&
                  strstr(dom, "<td>0 1 2 3</td>"),
              "members with address, ranks and GPUs: %s", dom);
    /* the straggler highlighted: banner, bar, table row */
    cr_expect(strstr(dom, "id=\"straggler-5\"") != NULL, "%s", dom);
    cr_expect(strstr(dom, "Straggler: rank 5 on train-node-1 (local rank 1, GPU 1)") != NULL, "%s",
              dom);
    cr_expect_eq(count_of(dom, "class=\"bar straggler\""), 1, "one straggler bar");
    cr_expect_eq(count_of(dom, "<tr class=\"straggler\">"), 1, "one straggler row");
    /* both plots have their points: 8 rank bars, step-rate points */
    cr_expect_eq(count_of(dom, "<g class=\"rank\""), 8, "%s", dom);
    cr_expect_geq(count_of(dom, "<circle class=\"pt\""), 2, "step-rate points: %s", dom);
    cr_expect(strstr(dom, "class=\"k-straggler\"") != NULL, "the timeline names it");
    /* the checkpoints panel: every rank wrote 190, 90 is durable, the worst
     * stall 17 ms, 36 MB draining; each rank's steps in its row */
    cr_expect(strstr(dom, "<b id=\"ckpt-local\">190</b>") &&
                  strstr(dom, "<b id=\"ckpt-durable\">90</b>") &&
                  strstr(dom, "<b id=\"ckpt-stall\">0.017 s</b>") &&
                  strstr(dom, "<b id=\"ckpt-drain\" class=\"draining\">36.0 MB left</b>") &&
                  strstr(dom, "<b id=\"ckpt-ranks\">8</b>"),
              "the checkpoints panel: %s", dom);
    cr_expect_eq(count_of(dom, "<td class=\"num\">200</td><td class=\"num\">100</td>"), 6,
                 "ranks' written and durable steps: %s", dom);
    free(dom);

    /* the other job: its hung rank highlighted */
    snprintf(cmd, sizeof cmd,
             "timeout 60 %s %s --user-data-dir=%s/profile --dump-dom "
             "'http://127.0.0.1:%d/#job=eval' >%s/eval.html 2>>%s/chromium.log",
             browser, flags, dir, hport, dir, dir);
    st = run_pumping(cmd, 70000);
    snprintf(path, sizeof path, "%s/eval.html", dir);
    dom = browser_slurp(path);
    cr_expect(strstr(dom, "id=\"hang\"") != NULL &&
                  strstr(dom, "Hung: rank 1 on eval-node-0 in round 1") != NULL,
              "%s", dom);
    cr_expect(strstr(dom, "class=\"k-hang\"") != NULL, "%s", dom);
    cr_expect(strstr(dom, "<span class=\"empty\" id=\"ckpt-none\">none reported</span>") != NULL,
              "a job without checkpoints: %s", dom);
    free(dom);

    /* 1280 px wide, no horizontal scrolling (browser.c draws the page in a
     * 1280 px frame): both jobs; eval's round ended with a long reason */
    static const char *const shown[2][2] = {{"train", "ckpt-local"}, {"eval", "hang"}};
    for (int k = 0; k < 2; k++) {
        unsigned sw = 0, cw = 0;
        int drawn = 0;
        char why[2100];
        int rc = browser_width_1280(dir, hport, shown[k][0], shown[k][1], run_pumping, &sw, &cw,
                                    &drawn, why, sizeof why);
        cr_expect(rc == 0 && cw > 1200 && sw <= cw && drawn,
                  "job %s: the page scrolls sideways at 1280 px (%u px of content in %u, drawn "
                  "%d): %s",
                  shown[k][0], sw, cw, drawn, rc ? why : "");
        cr_log_info("the job page of %s at 1280 px: %u px of content in %u", shown[k][0], sw, cw);
    }

    /* the screenshot for docs/health.md */
    const char *shot = getenv("GPL_PAGE_SCREENSHOT");
    char out[512];
    snprintf(out, sizeof out, "%s", shot ? shot : GPL_BUILD_DIR "/job-page.png");
    snprintf(cmd, sizeof cmd,
             "timeout 60 %s %s --user-data-dir=%s/profile --hide-scrollbars "
             "--window-size=1280,900 --screenshot=%s 'http://127.0.0.1:%d/#job=train' "
             ">>%s/chromium.log 2>&1",
             browser, flags, dir, out, hport, dir);
    st = run_pumping(cmd, 70000);
    struct stat sb;
    cr_expect(stat(out, &sb) == 0 && sb.st_size > 10000, "screenshot %s", out);
    tmpdir_remove(dir);
    close_nodes(nodes, 2);
    close_nodes(hung, 1);
    stop_server();
}

/* The server's CPU time for statistics: 1,024 nodes x 8 ranks each send one
 * STATS per window, 10 windows. Measured from /proc/PID/schedstat (the
 * server's CPU time over the windows, heartbeats included). */
Test(health, stats_cost_1024_nodes_x_8_ranks, .timeout = 120) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < 4096) {
        rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < 1200)
        skip_test("the open-file limit (%llu) is under 1,200: 1,024 nodes do not fit",
                  (unsigned long long)rl.rlim_cur);
    start_server(NULL);
    const uint32_t n = 1024, nproc = 8;
    node *nodes = start_nodes("big", n, nproc);
    pump(300);
    /* the server's CPU time in ns: the first field of /proc/PID/schedstat */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/schedstat", (int)srv.pid);
    unsigned long long t0 = 0, t1 = 0;
    FILE *f = fopen(path, "r");
    cr_assert(f != NULL && fscanf(f, "%llu", &t0) == 1);
    fclose(f);
    for (uint32_t w = 0; w < 10; w++) {
        send_window(nodes, n, nproc, w, 77, w < 3 ? 1.0 : 1.5, 99999);
        pump(WINDOW_MS);
    }
    f = fopen(path, "r");
    cr_assert(f != NULL && fscanf(f, "%llu", &t1) == 1);
    fclose(f);
    double cpu_s = (double)(t1 - t0) / 1e9;
    double msgs = 10.0 * n;
    cr_log_info("server CPU for 10 windows of 1,024 nodes x 8 ranks (10,240 STATS, 81,920 rank "
                "entries) and the heartbeats meanwhile: %.3f s, %.1f us per message, %.2f us per "
                "rank entry; at one window per 5 s: %.2f %% of one core",
                cpu_s, cpu_s * 1e6 / msgs, cpu_s * 1e6 / (msgs * nproc),
                cpu_s / 10.0 / 5.0 * 100.0);
    cr_expect_lt(cpu_s * 1e6 / msgs, 500.0, "under 0.5 ms of server CPU per STATS message");
    cr_expect_eq(total(nodes, n, offsetof(node, stragglers)), (int)n, "rank 77 named to all");
    char *st = http_get("/status");
    cr_expect(strstr(st, "\"world\":8192,\"reported\":8192") != NULL, "%.500s", st);
    cr_expect(strstr(st, "\"stragglers\":[77]") != NULL);
    free(st);
    close_nodes(nodes, n);
    stop_server();
}

/* End to end: gpulaunch-rdzv and 2 launchers x 2 workers of dp_train, whose
 * rank 3 computes 50 % longer from step 60 on (--slow-rank): the launchers'
 * summaries (--stats-interval 0.5) make the server name rank 3 within 3
 * windows of the slowdown, and no other rank; the launchers print it. */
Test(health, dp_train_slowed_rank_named_end_to_end, .timeout = 90) {
    start_server(NULL);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%d", port);
    proc l[2];
    for (int i = 0; i < 2; i++) {
        char *argv[] = {GPL_BUILD_DIR "/launcher/gpulaunch",
                        "--nnodes",
                        "2",
                        "--nproc-per-node",
                        "2",
                        "--rdzv-backend",
                        "c10d",
                        "--rdzv-endpoint",
                        ep,
                        "--rdzv-id",
                        "e2e",
                        "--stats-interval",
                        "0.5",
                        "--no-python",
                        GPL_BUILD_DIR "/examples/dp_train",
                        "--steps",
                        "500",
                        "--step-sleep-ms",
                        "8",
                        "--print-every",
                        "100000",
                        "--slow-rank",
                        "3",
                        "--slow-factor",
                        "1.5",
                        "--slow-from-step",
                        "60",
                        NULL};
        cr_assert_eq(proc_start(&l[i], argv, NULL), 0);
    }
    /* the slowdown starts when a rank reports step 60; the straggler is named when /status says so
     */
    uint64_t t_slow = 0, t_named = 0, deadline = now_ms() + 30000;
    char *st = NULL;
    while (now_ms() < deadline && t_named == 0) {
        for (int i = 0; i < 2; i++)
            proc_expect(&l[i], "\x01never\x01", 0);
        pump(100);
        free(st);
        st = http_get("/status");
        const char *p = strstr(st, "\"run_id\":\"e2e\"");
        if (p == NULL)
            continue;
        if (t_slow == 0) {
            for (const char *q = strstr(p, "\"step\":"); q; q = strstr(q + 1, "\"step\":"))
                if (strtol(q + 7, NULL, 10) >= 60) {
                    t_slow = now_ms();
                    break;
                }
        }
        if (strstr(p, "\"stragglers\":[3]"))
            t_named = now_ms();
        cr_assert(strstr(p, "\"stragglers\":[]") || strstr(p, "\"stragglers\":[3]") ||
                      !strstr(p, "\"stragglers\":["),
                  "only rank 3 may be named: %s", p);
    }
    cr_assert(t_named, "rank 3 was never named: %s\n%s\n%s", st, l[0].out, l[1].out);
    free(st);
    cr_log_info("dp_train rank 3 slowed 1.5x from step 60: named %.2f s after a rank reported step "
                "60 (windows of 0.5 s)",
                t_slow ? (double)(t_named - t_slow) / 1000.0 : -1.0);
    cr_expect(t_slow && t_named - t_slow <= 3 * 500 + 500,
              "named %llu ms after the slowdown was seen (3 windows: 1500 ms, + 1 window of "
              "reporting lag)",
              (unsigned long long)(t_named - t_slow));
    cr_expect(proc_expect(&srv, "straggler: rank 3 (node ", 2000), "the server's log");
    int told = 0;
    for (int i = 0; i < 2; i++)
        told += proc_expect(&l[i], "rank 3 (node ", 5000);
    cr_expect_eq(told, 2, "both launchers print it: %s\n%s", l[0].out, l[1].out);
    char *m = http_get("/metrics");
    const char *one[] = {"} 1", NULL};
    cr_expect_eq(count_lines(m, "gpulaunch_rank_straggler{", one), 1, "%s", m);
    const char *r3[] = {"job=\"e2e\"", "rank=\"3\"", "} 1", NULL};
    cr_expect_eq(count_lines(m, "gpulaunch_rank_straggler{", r3), 1, "%s", m);
    free(m);
    for (int i = 0; i < 2; i++) {
        int ws = proc_wait(&l[i], 30000);
        cr_expect(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "launcher %d: status %d: %s", i, ws,
                  l[i].out);
    }
    stop_server();
}

/* End to end: 2 launchers x 2 workers of dp_train saving every 40 steps to
 * their own local directory and draining to a shared durable one; the
 * launchers' summaries carry what the runtime reports in the progress slots,
 * and the server shows the job's newest step written and made durable by
 * every rank in /status and /metrics. */
Test(health, dp_train_checkpoints_reach_the_server, .timeout = 90) {
    start_server(NULL);
    char dir[256], cdir[2][300], durable[300], ep[64];
    tmpdir_make(dir, sizeof dir, "gpl-hckpt");
    snprintf(durable, sizeof durable, "%s/durable", dir);
    snprintf(ep, sizeof ep, "127.0.0.1:%d", port);
    proc l[2];
    for (int i = 0; i < 2; i++) {
        snprintf(cdir[i], sizeof cdir[i], "%s/node%d", dir, i);
        char *argv[] = {GPL_BUILD_DIR "/launcher/gpulaunch",
                        "--nnodes",
                        "2",
                        "--nproc-per-node",
                        "2",
                        "--rdzv-backend",
                        "c10d",
                        "--rdzv-endpoint",
                        ep,
                        "--rdzv-id",
                        "ck2e",
                        "--stats-interval",
                        "0.3",
                        "--no-python",
                        GPL_BUILD_DIR "/examples/dp_train",
                        "--steps",
                        "400",
                        "--step-sleep-ms",
                        "10",
                        "--print-every",
                        "100000",
                        "--checkpoint-dir",
                        cdir[i],
                        "--checkpoint-every",
                        "40",
                        "--checkpoint-durable",
                        durable,
                        NULL};
        cr_assert_eq(proc_start(&l[i], argv, NULL), 0);
    }
    long long local = -1, dur = -1, ranks = 0;
    char *st = NULL;
    uint64_t deadline = now_ms() + 40000;
    while (now_ms() < deadline && !(local >= 80 && dur >= 40 && ranks == 4)) {
        for (int i = 0; i < 2; i++)
            proc_expect(&l[i], "\x01never\x01", 0);
        pump(100);
        free(st);
        st = http_get("/status?job=ck2e");
        json_t *doc = json_loads(st, 0, NULL);
        json_t *c = json_object_get(status_job(doc, "ck2e"), "checkpoint");
        if (json_is_object(c)) {
            local = ck(c, "local_step");
            dur = ck(c, "durable_step");
            ranks = (long long)json_integer_value(json_object_get(c, "ranks"));
            cr_assert(dur <= local || local < 0, "durable %lld after written %lld: %s", dur, local,
                      st);
        }
        json_decref(doc);
    }
    cr_expect(local >= 80 && dur >= 40 && ranks == 4,
              "the job's checkpoints (written %lld, durable %lld, %lld ranks): %s\n%s\n%s", local,
              dur, ranks, st, l[0].out, l[1].out);
    cr_log_info("dp_train's checkpoints on the server: step %lld written by all 4 ranks, step "
                "%lld durable",
                local, dur);
    cr_expect_eq(local % 40, 0, "a step saved every 40: %lld", local);
    free(st);
    char *m = http_get("/metrics");
    char why[1100];
    cr_expect_eq(prom_check(m, why, sizeof why), 0, "%s\n%s", why, m);
    const char *job[] = {"job=\"ck2e\"", NULL};
    cr_expect_eq(count_lines(m, "gpulaunch_job_checkpoint_local_step{", job), 1, "%s", m);
    cr_expect_eq(count_lines(m, "gpulaunch_job_checkpoint_durable_step{", job), 1, "%s", m);
    free(m);
    for (int i = 0; i < 2; i++) {
        int ws = proc_wait(&l[i], 60000);
        cr_expect(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "launcher %d: status %d: %s", i, ws,
                  l[i].out);
    }
    tmpdir_remove(dir);
    stop_server();
}

/* A launcher whose re-formation failed after it had joined the next round
 * restarts its workers and asks for a round again: the JOIN waiting stands,
 * no second one is refused ("already joined"), and the round forms. */
Test(health, a_rejoin_while_the_join_waits_keeps_it) {
    start_server(NULL);
    node *nodes = calloc(2, sizeof *nodes);
    start_client(nodes, "pending", 0, 2, 1);
    pump(300); /* node 0 joined; the round waits for node 1 */
    cr_assert(!nodes[0].assigned);
    rdzv_client_rejoin(nodes[0].c);
    pump(300);
    start_client(nodes, "pending", 1, 2, 1);
    uint64_t deadline = now_ms() + 10000;
    while (now_ms() < deadline && !(nodes[0].assigned && nodes[1].assigned))
        pump(5);
    cr_expect(nodes[0].assigned && nodes[1].assigned, "the round did not form");
    cr_expect_eq(nodes[0].errors, 0, "the rejoin was refused");
    close_nodes(nodes, 2);
    stop_server();
}
