/* L7, L7p: a job through many membership changes in a row (kill, vanish,
 * notice, join, at random with a fixed seed) on the bed of faultbed.h,
 * re-forming in place, ends with parameters bitwise equal to a restart
 * replay of the same sequence (replay.h). docs/reliability.md, "A job
 * through many membership changes". */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "replay.h"

ReportHook(POST_ALL)(struct criterion_global_stats *stats) {
    (void)stats;
    netbed_reap_stale();
}

TestSuite(churn, .fini = teardown, .timeout = 7200);

/* ---- churn: many membership changes in a row ---- */

#define CHURN_EVERY 200        /* training steps between two changes */
#define CHURN_DEFAULT 6        /* changes in CI; GPL_CHURN_CHANGES=200 for the long run */
#define CHURN_EVERY_PYTORCH 40 /* the PyTorch program's steps are slower */
#define CHURN_DEFAULT_PYTORCH 4
#define CHURN_SEED 7u         /* GPL_CHURN_SEED: another sequence (7: every kind within 6) */
#define CHURN_SETTLE_MS 30000 /* a change's new world trains by then (a vanish: + the timeout) */

enum { CH_KILL, CH_VANISH, CH_NOTICE, CH_JOIN, CH_KINDS };
static const char *const churn_kind[CH_KINDS] = {"kill", "vanish", "notice", "join"};

/* What rank 0 traced so far: the newest step and its world (read on from *off). */
static void trace_newest(long *off, long *step, int *world) {
    char path[160], line[160];
    snprintf(path, sizeof path, "%s/trace-live", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    fseek(f, *off, SEEK_SET);
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        if (len == 0 || line[len - 1] != '\n') /* a line still being written */
            break;
        *off += (long)len;
        long st;
        int w;
        if (sscanf(line, "step %ld world %d", &st, &w) == 2)
            *step = st, *world = w;
    }
    fclose(f);
}

/* The live run's worlds as its trace says (the last line of a step redone
 * wins): each step after which the world changed, and the world after it.
 * *seen: the changes of world in the order the lines were written, a world
 * whose every step was done again in the next one included (it left nothing
 * in the parameters, and no segment). *hidden: how many such worlds. A hidden
 * world hides one change, or two when the worlds around it have the same size
 * (8, then 6 for one step done again, then 8: one segment of 8 is left). */
static int trace_segments(int world[MAX_SEGS], long after[MAX_SEGS], long *redone, int *seen,
                          int *hidden) {
    char path[160], line[160];
    snprintf(path, sizeof path, "%s/trace-live", dir);
    FILE *f = fopen(path, "r");
    static int w_at[TRACE_STEPS], seg_at[TRACE_STEPS]; /* seg_at: 1 + the world's index */
    memset(w_at, 0, sizeof w_at);
    memset(seg_at, 0, sizeof seg_at);
    long last = 0, prev = 0;
    int prev_w = 0;
    *redone = 0;
    *seen = 0;
    while (f && fgets(line, sizeof line, f)) {
        long st;
        int w;
        if (sscanf(line, "step %ld world %d", &st, &w) != 2 || st <= 0 || st >= TRACE_STEPS)
            continue;
        if (st <= prev)
            *redone += prev - st + 1; /* a step done again (a rank set back) */
        prev = st;
        *seen += prev_w && w != prev_w;
        prev_w = w;
        w_at[st] = w;
        seg_at[st] = 1 + *seen;
        last = st > last ? st : last;
    }
    if (f)
        fclose(f);
    /* a step inside the run that no rank 0 traced ran in the world before
     * it: rank 0's node was killed after the step's all-reduce and before
     * its line (its successor traces from the next step, in the new world) */
    for (long st = 2; st < last; st++)
        if (w_at[st] == 0 && w_at[st - 1])
            w_at[st] = w_at[st - 1], seg_at[st] = seg_at[st - 1];
    int left = 0; /* the worlds some step of which the parameters keep */
    for (long st = 1; st <= last; st++)
        left += seg_at[st] && seg_at[st] != seg_at[st - 1];
    *hidden = *seen + 1 - left;
    int n = 0;
    for (long st = 2; st <= last && n < MAX_SEGS; st++)
        if (w_at[st] && w_at[st - 1] && w_at[st] != w_at[st - 1]) {
            world[n] = w_at[st];
            after[n++] = st - 1;
        }
    return n;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* L7. Churn: GPL_CHURN_CHANGES membership changes in a row (6 here; the
 * long run in docs/reliability.md takes 200), drawn with a fixed seed among
 * a node killed, a node vanished (link cut, then kill -9), a node preempted
 * (SIGTERM to its launcher: the same step saved everywhere, exit 143) and a
 * node (re)joining, between 2 and 4 nodes of dp_train --reform (L7p:
 * train_ddp.py --reform, gpulaunch.Elastic), change i at step i x `every`
 * (or at once when the one before took longer).
 * After each, the new world must train within 30 s (and the heartbeat
 * timeout). At the end: every rank's parameters equal, no worker restarted,
 * no step lost (a rank set back redoes at most its one step), and bitwise
 * equal to the same worlds replayed as restarts from checkpoints of the
 * steps the live run changed world after. */
static void churn(int pytorch, int every, int default_changes) {
    const char *e = getenv("GPL_CHURN_CHANGES");
    int changes = e ? (int)strtol(e, NULL, 10) : default_changes;
    e = getenv("GPL_CHURN_SEED");
    uint64_t seed = e ? strtoull(e, NULL, 10) : CHURN_SEED;
    cr_assert(changes >= 1 && (changes + 2) * every < TRACE_STEPS && changes < MAX_SEGS,
              "GPL_CHURN_CHANGES: 1 to %d", TRACE_STEPS / every - 2);
    setup_bed(pytorch ? "L7p-reform-churn-pytorch" : "L7-reform-churn", NODES + 1, 0, 0);
    replay_pytorch = pytorch;
    trace_to("live");
    start_server(0);
    char steps[24];
    snprintf(steps, sizeof steps, "%d", (changes + 2) * every);
    job_args ja = {.nnodes = "2:4",
                   .steps = steps,
                   .sleep_ms = "10",
                   .ck_every = "100000",
                   .reform = 1,
                   .pytorch = pytorch};
    start_job(&ja);
    int up[NODES + 1] = {0, 1, 1, 1, 1}, cut[NODES + 1] = {0}, nup = NODES;
    int count[CH_KINDS] = {0};
    static uint64_t took[CH_KINDS][MAX_SEGS];
    long off = 0, step = 0, next_at = every;
    int world = 0, fallbacks = 0;
    uint64_t t_start = now_ms();
    for (int i = 0; i < changes; i++) {
        for (uint64_t t0 = now_ms(); step < next_at; usleep(20000)) {
            drain_all();
            trace_newest(&off, &step, &world);
            cr_assert_lt(now_ms() - t0, CHURN_SETTLE_MS, "change %d: no step %ld (at step %ld)",
                         i + 1, next_at, step);
        }
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(seed >> 33);
        int kind = nup == 2 ? CH_JOIN : nup == NODES ? (int)(r % 3) : (int)(r % CH_KINDS);
        int pick = (int)((r >> 8) % (uint32_t)(kind == CH_JOIN ? NODES - nup : nup)), h = 0;
        for (int k = 1; k <= NODES; k++)
            if (up[k] == (kind != CH_JOIN) && pick-- == 0)
                h = k;
        char tag[48];
        snprintf(tag, sizeof tag, "live-%03d-%s-host%d", i + 1, churn_kind[kind], h);
        uint64_t t_fault = now_ms();
        long at = step;
        if (kind == CH_JOIN) {
            if (cut[h])
                cr_assert_eq(netbed_restore(&bed, h), 0);
            cut[h] = 0;
            start_node(h, &ja);
            up[h] = 1, nup++;
        } else {
            if (kind == CH_NOTICE) {
                static int one[1];
                one[0] = h;
                proc_kill(&nodes[h], SIGTERM);
                expect_exit(one, 1, 143, 30000);
            } else {
                if (kind == CH_VANISH)
                    cr_assert_eq(netbed_cut(&bed, h), 0);
                cut[h] = kind == CH_VANISH;
                cr_assert(netbed_kill_host(&bed, h) >= 3, "%s: no launcher and workers", tag);
                proc_wait(&nodes[h], 5000);
            }
            fallbacks += strstr(nodes[h].out, "restarting workers") != NULL;
            netbed_save_log(&bed, tag, &nodes[h]);
            up[h] = 0, nup--;
        }
        /* the new world trains */
        int want = 2 * nup;
        uint64_t limit = CHURN_SETTLE_MS + (kind == CH_VANISH ? HB_TIMEOUT_S * 1000 : 0);
        while (!(world == want && step > at)) {
            usleep(20000);
            drain_all();
            trace_newest(&off, &step, &world);
            if (now_ms() - t_fault > limit) {
                save_logs("live-stuck");
                cr_assert_fail("%s: no step in a world of %d %llu ms after it (at step %ld, world "
                               "%d)",
                               tag, want, (unsigned long long)(now_ms() - t_fault), step, world);
            }
        }
        took[kind][count[kind]++] = now_ms() - t_fault;
        /* the changes keep to their steps: one that took long is followed at once */
        next_at = (long)(i + 2) * every;
    }
    int last[NODES], nlast = 0;
    for (int k = 1; k <= NODES; k++)
        if (up[k])
            last[nlast++] = k;
    expect_exit(last, nlast, 0, 600000);
    save_logs("live");
    uint64_t t_live = now_ms() - t_start;
    for (int k = 0; k < nlast; k++)
        fallbacks += strstr(nodes[last[k]].out, "restarting workers") != NULL;
    cr_expect_eq(fallbacks, 0, "%d node(s) restarted their workers instead of re-forming",
                 fallbacks);
    char live[65];
    expect_same_params(last, nlast, 2 * nlast, live);
    static int seg_world[MAX_SEGS];
    static long seg_after[MAX_SEGS];
    long redone;
    int seen, hidden;
    int n = trace_segments(seg_world, seg_after, &redone, &seen, &hidden);
    cr_expect_eq(seen, changes, "the trace shows %d changes of world, %d were made", seen, changes);
    /* a rank whose last all-reduce completed where another's failed redoes
     * that one step: at most one a change, and no more (no step lost) */
    cr_expect_leq(redone, changes, "%ld steps redone over %d changes", redone, changes);
    /* a world that trained one step before the next change, that step done
     * again in the next world, left no segment: each such needs a step redone */
    cr_expect(n <= changes && hidden <= redone,
              "%d changes of world in the parameters' history, %d changes made, %d world(s) "
              "left no step, %ld steps redone",
              n, changes, hidden, redone);
    if (seen != changes || n > changes || hidden > redone) {
        char cmd[600]; /* the trace, kept with the logs to read what happened */
        snprintf(cmd, sizeof cmd, "cp '%s/trace-live' '%s/trace-live.txt'", dir, logdir);
        if (system(cmd) != 0)
            cr_log_warn("could not keep the trace: %s", cmd);
    }
    uint64_t t_replay = now_ms();
    for (int k = 1; k <= NODES; k++)
        if (cut[k])
            netbed_restore(&bed, k);
    replay_agrees("restart", 2 * NODES, steps, NULL, live, n, seg_world, seg_after);
    char figures[512];
    int len =
        snprintf(figures, sizeof figures, "%d changes in %.0f s, replayed in %.0f s:", changes,
                 (double)t_live / 1000.0, (double)(now_ms() - t_replay) / 1000.0);
    for (int k = 0; k < CH_KINDS; k++) {
        qsort(took[k], (size_t)count[k], sizeof took[k][0], cmp_u64);
        if (count[k] && len < (int)sizeof figures)
            len += snprintf(figures + len, sizeof figures - (size_t)len,
                            " %s %d (new world training after p50 %.2f s, max %.2f s);",
                            churn_kind[k], count[k], (double)took[k][count[k] / 2] / 1000.0,
                            (double)took[k][count[k] - 1] / 1000.0);
    }
    cr_log_info("%s (churn, seed %llu): %s %ld step(s) redone, %d worker restart(s); parameters "
                "equal to the replay",
                pytorch ? "L7p" : "L7",
                (unsigned long long)(e ? strtoull(e, NULL, 10) : CHURN_SEED), figures, redone,
                fallbacks);
}

Test(churn, churn_of_membership_changes_ends_equal_to_its_replay, .timeout = 7200) {
    churn(0, CHURN_EVERY, CHURN_DEFAULT);
}

/* L7p. The same with the PyTorch program (DDP on Gloo, gpulaunch.Elastic):
 * fewer steps between changes, and the first four changes of the seed (one
 * of each kind) in CI. */
Test(churn, churn_of_a_pytorch_job_ends_equal_to_its_replay, .timeout = 7200) {
    require_torch();
    churn(1, CHURN_EVERY_PYTORCH, CHURN_DEFAULT_PYTORCH);
}
