/* The restart arm: replay.h says what. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "replay.h"

int replay_pytorch;

/* A job of nhosts dp_train nodes, fixed size, into ckdir (the restart arm). */
void run_fixed(int nhosts, const char *steps, const char *ck_every, const char *ckdir,
               const char *state_mib) {
    static const int hosts[NODES] = {1, 2, 3, 4};
    char nn[8];
    snprintf(nn, sizeof nn, "%d", nhosts);
    job_args ja = {.nnodes = nn,
                   .steps = steps,
                   .ck_every = ck_every,
                   .ckdir = ckdir,
                   .state_mib = state_mib,
                   .pytorch = replay_pytorch};
    for (int i = 1; i <= nhosts; i++)
        start_node(i, &ja);
    expect_exit(hosts, nhosts, 0, 60000);
}

/* The logs of a restart-arm run of nhosts nodes, under <tag>-host<i>. */
void save_run_logs(const char *tag, int nhosts) {
    char name[96];
    for (int i = 1; i <= nhosts; i++) {
        snprintf(name, sizeof name, "%s-host%d", tag, i);
        netbed_save_log(&bed, name, &nodes[i]);
    }
}

/* dp_train's rank 0 (whichever process holds it) appends its parameters'
 * hash after every step to <dir>/trace-<name> (DP_TRAIN_TRACE). */
void trace_to(const char *name) {
    char path[160];
    snprintf(path, sizeof path, "%s/trace-%s", dir, name);
    setenv("DP_TRAIN_TRACE", path, 1);
    setenv("TRAIN_DDP_TRACE", path, 1); /* train_ddp.py's, the same lines */
}

/* A trace's hash and world after each step; a step redone (a rank set back
 * by a re-formation) keeps its last line. */
static void read_trace(const char *name, char hash[][17], int *world) {
    char path[160], line[160];
    snprintf(path, sizeof path, "%s/trace-%s", dir, name);
    FILE *f = fopen(path, "r");
    for (long st; f && fgets(line, sizeof line, f);) {
        int w;
        char h[17];
        if (sscanf(line, "step %ld world %d loss %*s params %16s", &st, &w, h) == 3 && st > 0 &&
            st < TRACE_STEPS) {
            world[st] = w;
            memcpy(hash[st], h, sizeof h);
        }
    }
    if (f)
        fclose(f);
}

/* The first step after which the live run's and the restart arm's
 * parameters differ, and the worlds each ran it in; 0 when none does. */
static long first_parting(int *live_world, int *restart_world) {
    static char lh[TRACE_STEPS][17], rh[TRACE_STEPS][17];
    static int lw[TRACE_STEPS], rw[TRACE_STEPS];
    memset(lh, 0, sizeof lh);
    memset(rh, 0, sizeof rh);
    read_trace("live", lh, lw);
    read_trace("restart", rh, rw);
    for (long st = 1; st < TRACE_STEPS; st++)
        if (strcmp(lh[st], rh[st]) != 0) {
            *live_world = lh[st][0] ? lw[st] : 0;
            *restart_world = rh[st][0] ? rw[st] : 0;
            return st;
        }
    return 0;
}

/* The step rank 0 of the first nhosts nodes resumed from, -1 when none did. */
long resumed_step(int nhosts) {
    const char *key = "resumed from the checkpoint of step ";
    for (int i = 1; i <= nhosts; i++) {
        const char *s = strstr(nodes[i].out, key);
        if (s)
            return strtol(s + strlen(key), NULL, 10);
    }
    return -1;
}

/* The job's re-formations in round order, as the ranks that kept their
 * state report them (all of a round's agree): the world each went on in and
 * the step it went on after. */
int reformations(int world[MAX_SEGS], long after[MAX_SEGS]) {
    int round[MAX_SEGS], n = 0;
    for (int h = 1; h <= NODES; h++)
        for (const char *s = nodes[h].out; (s = strstr(s, " (was ")) != NULL; s++) {
            int r, w;
            long a;
            if (sscanf(s,
                       " (was %*d): round %d re-formed in place, world %d, going on after "
                       "step %ld",
                       &r, &w, &a) != 3)
                continue;
            int k = 0;
            while (k < n && round[k] < r)
                k++;
            if (k < n && round[k] == r) {
                cr_expect(world[k] == w && after[k] == a,
                          "round %d: one rank went on after step %ld in a world of %d, another "
                          "after %ld in %d",
                          r, after[k], world[k], a, w);
                continue;
            }
            if (n == MAX_SEGS)
                continue;
            for (int j = n++; j > k; j--)
                round[j] = round[j - 1], world[j] = world[j - 1], after[j] = after[j - 1];
            round[k] = r, world[k] = w, after[k] = a;
        }
    return n;
}

/* The restart arm: the same job restarted from a checkpoint at every step the
 * live one re-formed after, into the world it re-formed into (2 ranks a
 * node), from a start in a world of world0 to `steps`: its final parameters
 * must equal the live run's `live`, bit for bit. */
void replay_agrees(const char *tag, int world0, const char *steps, const char *state_mib,
                   const char *live, int n, const int *world, const long *after) {
    /* every link up, and a fresh rendezvous: the live job's may still wait
     * for a vanished node */
    for (int h = 1; h <= NODES; h++)
        netbed_restore(&bed, h);
    netbed_save_log(&bed, "live-rdzv", &server);
    proc_kill(&server, SIGKILL);
    proc_wait(&server, 5000);
    start_server(0);
    char ck[128], at[24];
    snprintf(ck, sizeof ck, "%s/ck-restart-%s", dir, tag);
    int w = world0;
    long prev = 0;
    trace_to("restart");
    char path[300], seg[64];
    for (int i = 0; i < n; i++) {
        if (after[i] > prev) { /* a world that trained: to the next one's step, checkpointed */
            snprintf(at, sizeof at, "%ld", after[i]);
            run_fixed(w / 2, at, at, ck, state_mib);
            snprintf(seg, sizeof seg, "%s-%d-world%d-to%ld", tag, i + 1, w, after[i]);
            save_run_logs(seg, w / 2);
            cr_expect_eq(resumed_step(w / 2), prev > 0 ? prev : -1,
                         "%s: the world of %d from step %ld resumed from another step", tag, w,
                         prev);
            snprintf(path, sizeof path, "%s/step-%012ld/COMPLETE", ck, after[i]);
            cr_assert_eq(access(path, F_OK), 0,
                         "%s: the restart arm wrote no checkpoint of "
                         "step %ld",
                         tag, after[i]);
            prev = after[i];
        }
        w = world[i];
    }
    static const int hosts[NODES] = {1, 2, 3, 4};
    run_fixed(w / 2, steps, "100000", ck, state_mib);
    snprintf(seg, sizeof seg, "%s-last-world%d", tag, w);
    save_run_logs(seg, w / 2);
    snprintf(seg, sizeof seg, "%s-rdzv", tag);
    netbed_save_log(&bed, seg, &server);
    expect_resumed(hosts, w / 2);
    cr_expect_eq(resumed_step(w / 2), prev, "%s: the last world resumed from another step", tag);
    char restarted[65];
    expect_same_params(hosts, w / 2, w, restarted);
    int lw = 0, rw = 0;
    long part = strcmp(live, restarted) != 0 ? first_parting(&lw, &rw) : 0;
    cr_expect_str_eq(live, restarted,
                     "%s: live re-formation and restarts from checkpoints of the same steps "
                     "into the same worlds differ: first after step %ld (live in a world of %d, "
                     "the restart in %d; 0: not traced)",
                     tag, part, lw, rw);
}

void expect_restart_agrees(const char *tag, int world0, const char *steps, const char *state_mib,
                           const char *live) {
    static int world[MAX_SEGS];
    static long after[MAX_SEGS];
    int n = reformations(world, after);
    cr_assert_geq(n, 1, "%s: no rank said it re-formed in place", tag);
    replay_agrees(tag, world0, steps, state_mib, live, n, world, after);
}
