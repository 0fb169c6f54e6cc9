/* NS1: the launcher soak on the network-namespace bed (docs/reliability.md,
 * "The launcher soak on the bed"). 4 nodes x 2 dp_train --reform workers
 * against a gpulaunch-rdzv on a host of its own; hosts 1 and 2 stay for the
 * whole run, hosts 3 and 4 go and come back in turn, one change after
 * another: killed (kill -9 of everything on it), vanished (its link cut,
 * then kill -9; the link back), preempted (SIGTERM to its launcher: the same
 * step saved everywhere, exit 143), each followed by a new launcher on that
 * host joining the running job. Every change is two rounds for the kept
 * nodes, which re-form in place each time. After a warm-up (one change of
 * each kind on each churned host) and at the end, in the same state (4
 * nodes training), the kept launchers are counted from outside and from
 * their --metrics (proc_count.h: descriptors by kind, threads, children,
 * libuv handles by type, progress regions and pipes, workers, heap in use),
 * and the rendezvous from outside: every count must be equal (the heap in
 * use within NS_HEAP_NOISE above: what is in flight when it is counted, a
 * send or a scrape, differs by a few KiB on this bed), the launchers' RSS
 * within NS_RSS_GROWTH_KIB. GPL_NETSOAK_CHANGES changes
 * (NS_CHANGES in CI) after the warm-up. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <criterion/logging.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "faultbed.h"
#include "proc_count.h"

#define NS_CHANGES 6             /* after the warm-up, in CI */
#define NS_MPORT 9461            /* each launcher's --metrics, inside its host */
#define NS_STEP_MS 20000         /* a change's rounds are trained in by then */
#define NS_SETTLE_MS 1500        /* quiet before counting: the last round's timers */
#define NS_RSS_GROWTH_KIB 512    /* a kept launcher's RSS from the warm-up to the end */
#define NS_HEAP_NOISE 8192       /* its heap in use may differ by what is in flight at a count */
#define NS_METRICS_MAX (1 << 18) /* a launcher's /metrics text */

ReportHook(POST_ALL)(struct criterion_global_stats *stats) {
    (void)stats;
    netbed_reap_stale();
}

TestSuite(netsoak, .fini = teardown, .timeout = 7200);

enum { K_KILL, K_VANISH, K_NOTICE, K_KINDS };
static const char *const kind_name[K_KINDS] = {"kill", "vanish", "notice"};
static const int kept[2] = {1, 2};

/* The newest round the node's launcher said it began ("round N began: "). */
static long began(const proc *p) {
    long newest = 0;
    for (const char *s = p->out; (s = strstr(s, "gpulaunch: round ")) != NULL; s++) {
        unsigned r;
        char w[8];
        if (sscanf(s, "gpulaunch: round %u %7s", &r, w) == 2 && strcmp(w, "began:") == 0 &&
            (long)r > newest)
            newest = (long)r;
    }
    return newest;
}

/* Both kept nodes began a round after `after` (their workers stepped in
 * it); the newest such round. */
static long kept_began_after(long after, const char *what) {
    uint64_t until = now_ms() + NS_STEP_MS;
    for (;;) {
        drain_all();
        long a = began(&nodes[kept[0]]), b = began(&nodes[kept[1]]);
        if (a > after && b > after)
            return a < b ? a : b;
        if (now_ms() > until) {
            save_logs("netsoak-stuck");
            cr_assert_fail("%s: the kept nodes began no round after %ld within %d s (%ld, %ld)",
                           what, after, NS_STEP_MS / 1000, a, b);
        }
        usleep(20000);
    }
}

typedef struct counts {
    long launcher[2][PC_N], rss[2];
    long server[PC_N], server_rss;
} counts;

static void count_all(counts *c) {
    uint64_t until = now_ms() + NS_SETTLE_MS;
    while (now_ms() < until) {
        drain_all();
        usleep(20000);
    }
    static char body[NS_METRICS_MAX];
    for (int i = 0; i < 2; i++) {
        proc *p = &nodes[kept[i]];
        /* the launcher: the process netbed_spawn's shell exec'd into */
        cr_assert_eq(proc_count(p->pid, c->launcher[i], &c->rss[i]), 0, "host%d's launcher gone",
                     kept[i]);
        cr_assert_eq(netbed_http_get(&bed, kept[i], NS_MPORT, "/metrics", body, sizeof body), 200,
                     "host%d's --metrics", kept[i]);
        cr_assert_eq(proc_count_metrics(body, c->launcher[i]), 0, "host%d's /metrics: %.300s",
                     kept[i], body);
    }
    cr_assert_eq(proc_count(server.pid, c->server, &c->server_rss), 0, "the rendezvous is gone");
}

/* One change of kind on host h: the loss, the kept nodes re-formed; a new
 * launcher on h, the kept nodes re-formed again with it. */
static long change(int kind, int h, long round, const job_args *ja) {
    char tag[64];
    snprintf(tag, sizeof tag, "%s host%d", kind_name[kind], h);
    if (kind == K_NOTICE) {
        proc_kill(&nodes[h], SIGTERM);
        int st = proc_wait(&nodes[h], 30000);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 143, "%s: status %d: %s", tag, st,
                  nodes[h].out);
    } else {
        await_workers(h); /* (the first change may come right after round 1 formed) */
        if (kind == K_VANISH)
            cr_assert_eq(netbed_cut(&bed, h), 0);
        cr_assert(netbed_kill_host(&bed, h) >= 3, "%s: no launcher and workers", tag);
        proc_wait(&nodes[h], 5000);
    }
    round = kept_began_after(round, tag);
    if (kind == K_VANISH)
        cr_assert_eq(netbed_restore(&bed, h), 0);
    start_node(h, ja);
    return kept_began_after(round, tag);
}

static int differ(const char *who, const long *a, const long *b) {
    int n = 0;
    for (int i = 0; i < PC_N; i++)
        if (i == PC_M_HEAP ? b[i] > a[i] + NS_HEAP_NOISE : a[i] != b[i]) {
            cr_log_error("%s: %s %ld after the warm-up, %ld at the end", who, proc_count_name[i],
                         a[i], b[i]);
            n++;
        }
    return n;
}

Test(netsoak, kept_launchers_and_the_rendezvous_hold_nothing_more_after_many_changes) {
    const char *e = getenv("GPL_NETSOAK_CHANGES");
    long changes = e ? strtol(e, NULL, 10) : NS_CHANGES;
    cr_assert(changes >= 1, "GPL_NETSOAK_CHANGES: at least 1");
    setup_bed("NS1-launcher-soak", NODES + 1, 0, 0);
    /* malloc's per-thread cache off: the launchers' heap in use is exact */
    setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0", 1);
    start_server(0);
    char mport[32];
    snprintf(mport, sizeof mport, "127.0.0.1:%d", NS_MPORT);
    job_args ja = {.nnodes = "2:4",
                   .steps = "10000000",
                   .sleep_ms = "5",
                   .ck_every = "100000000",
                   .reform = 1,
                   .metrics = mport};
    start_job(&ja);
    long round = 1; /* formed (start_job); a first round has no "began" line */
    uint64_t t0 = now_ms();
    /* the warm-up: one change of each kind on each churned host */
    for (int k = 0; k < K_KINDS; k++)
        for (int h = 3; h <= 4; h++)
            round = change(k, h, round, &ja);
    static counts warm, end;
    count_all(&warm);
    uint64_t t1 = now_ms();
    long done[K_KINDS] = {0};
    for (long i = 0; i < changes; i++) {
        int k = (int)(i % K_KINDS), h = 3 + (int)((i / K_KINDS) % 2);
        round = change(k, h, round, &ja);
        done[k]++;
        if ((i + 1) % 100 == 0)
            cr_log_info("NS1: %ld changes, round %ld, %.0f s", i + 1, round,
                        (double)(now_ms() - t1) / 1000.0);
    }
    double took = (double)(now_ms() - t1) / 1000.0;
    count_all(&end);
    save_logs("netsoak");
    int n = 0;
    for (int i = 0; i < 2; i++) {
        char who[32];
        snprintf(who, sizeof who, "host%d's launcher", kept[i]);
        n += differ(who, warm.launcher[i], end.launcher[i]);
        cr_expect_leq(end.rss[i] - warm.rss[i], NS_RSS_GROWTH_KIB,
                      "%s: RSS %ld KiB after the warm-up, %ld at the end", who, warm.rss[i],
                      end.rss[i]);
    }
    /* the server keeps bounded histories (rounds, events) that fill as it
     * runs: its descriptors and threads are compared, its RSS said */
    for (int i = PC_FDS; i <= PC_CHILDREN; i++)
        if (warm.server[i] != end.server[i]) {
            cr_log_error("the rendezvous: %s %ld after the warm-up, %ld at the end",
                         proc_count_name[i], warm.server[i], end.server[i]);
            n++;
        }
    cr_expect_eq(n, 0, "%d count(s) differ between the warm-up and the end", n);
    for (int i = 0; i < 2; i++)
        cr_log_info("NS1: host%d's launcher: %ld descriptors (%ld sockets, %ld pipes), %ld "
                    "threads, %ld children, %ld libuv handles (%ld timers), %ld progress "
                    "region(s), heap %ld bytes; RSS %ld -> %ld KiB",
                    kept[i], end.launcher[i][PC_FDS], end.launcher[i][PC_FD_SOCKET],
                    end.launcher[i][PC_FD_PIPE], end.launcher[i][PC_THREADS],
                    end.launcher[i][PC_CHILDREN], end.launcher[i][PC_HANDLES],
                    end.launcher[i][PC_H_TIMER], end.launcher[i][PC_M_REGIONS],
                    end.launcher[i][PC_M_HEAP], warm.rss[i], end.rss[i]);
    cr_log_info("NS1: %ld changes (kill %ld, vanish %ld, notice %ld) in %.0f s after a %.0f s "
                "warm-up, to round %ld; the rendezvous: %ld descriptors, %ld threads, RSS %ld -> "
                "%ld KiB",
                changes, done[K_KILL], done[K_VANISH], done[K_NOTICE], took,
                (double)(t1 - t0) / 1000.0, round, end.server[PC_FDS], end.server[PC_THREADS],
                warm.server_rss, end.server_rss);
}
