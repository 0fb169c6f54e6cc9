/* The fault matrix's live re-formation scenarios (faultbed.h): 4 nodes x 2
 * workers of dp_train --reform. A node lost, preempted or added re-forms the
 * job in place: the survivors keep their processes and their state, lose no
 * step, and a new node's ranks copy the state from a survivor. Each scenario
 * checks the parameters bitwise equal on every rank, and equal to those of
 * the same job restarted from checkpoints of the steps it re-formed after,
 * into the same worlds (live and restart agree). A re-formation that cannot
 * finish falls back to restarting. docs/reliability.md has the table. */
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

TestSuite(reform_live, .fini = teardown, .timeout = 150);

#define STEPS "400"

/* Every listed node re-formed in place: its launcher kept its workers (no
 * restart) and each of its ranks lost no step. Returns the step the job went
 * on after (the last one, after several re-formations). */
static long expect_in_place(const int *hosts, int n) {
    long after = -1;
    for (int i = 0; i < n; i++) {
        const char *out = nodes[hosts[i]].out;
        cr_expect(strstr(out, "workers re-formed in place") != NULL,
                  "host%d's launcher did not re-form in place: %s", hosts[i], out);
        cr_expect(strstr(out, "restarting workers") == NULL, "host%d restarted its workers: %s",
                  hosts[i], out);
        cr_expect(strstr(out, "resumed from the checkpoint") == NULL,
                  "host%d read the checkpoint: %s", hosts[i], out);
        for (const char *s = out; (s = strstr(s, "going on after step ")) != NULL; s++) {
            char *end;
            long st = strtol(s + strlen("going on after step "), &end, 10);
            long redone = strncmp(end, " (0 lost, ", 10) == 0 ? strtol(end + 10, NULL, 10) : -1;
            /* a rank whose last all-reduce completed where another's failed
             * is one step ahead: it is set back and redoes that one */
            cr_expect(redone == 0 || redone == 1, "host%d: %.100s", hosts[i], s);
            after = st;
        }
    }
    cr_expect_geq(after, 0, "no rank said where it went on from");
    return after;
}

/* The three survivors re-form in place after t_fault and finish the job:
 * each in the new round within 20 s, in place (no restart, no step lost),
 * equal parameters on the 6 ranks (into live; logs saved as tag). Returns
 * when the last one took the new round, in ms after t_fault; *after is the
 * step the job went on after. */
static uint64_t survivors_go_on(const int surv[NODES - 1], uint64_t t_fault, const char *tag,
                                long *after, char live[65]) {
    uint64_t back[NODES - 1];
    int seen = expect_all(surv, NODES - 1, "workers re-formed in place", t_fault, 20000, back);
    cr_assert_eq(seen, NODES - 1, "not every survivor re-formed: %s", nodes[surv[0]].out);
    expect_exit(surv, NODES - 1, 0, 60000);
    save_logs(tag);
    *after = expect_in_place(surv, NODES - 1);
    expect_same_params(surv, NODES - 1, 6, live);
    return max_ms(back, NODES - 1);
}

/* Waits until `want` of the listed nodes wrote needle after mark[i], their
 * output's length before the event (earlier rounds said the same; NULL:
 * from the start); ms[i] is when, after t0 (0: not seen). Returns how many
 * did. */
static int wait_after(const int *hosts, int n, const size_t *mark, const char *needle, int want,
                      uint64_t t0, int timeout_ms, uint64_t *ms) {
    int seen = 0;
    for (int i = 0; i < n; i++)
        ms[i] = 0;
    while (seen < want && now_ms() - t0 < (uint64_t)timeout_ms) {
        drain_all();
        for (int i = 0; i < n; i++)
            if (ms[i] == 0 && strstr(nodes[hosts[i]].out + (mark ? mark[i] : 0), needle)) {
                ms[i] = now_ms() - t0;
                seen++;
            }
    }
    return seen;
}

/* L1. kill -9 of a node (its sockets close): the three others re-form in
 * place within a second, lose no step, and end as a run restarted from a
 * checkpoint of that step into the same 3-node world does: bit for bit. */
Test(reform_live, node_killed_survivors_re_form_in_place_and_match_a_restart) {
    setup_bed("L1-reform-node-killed", NODES + 1, 0, 0);
    trace_to("live");
    start_server(0);
    job_args ja = {.nnodes = "3:4", .steps = STEPS, .sleep_ms = "10", .reform = 1};
    start_job(&ja);
    usleep(1500000);
    static const int surv[NODES - 1] = {1, 2, 3};
    uint64_t t_fault = now_ms();
    cr_assert(netbed_kill_host(&bed, 4) >= 3, "host4 had no launcher and workers");
    proc_wait(&nodes[4], 5000);
    long after;
    char live[65];
    uint64_t worst = survivors_go_on(surv, t_fault, "live", &after, live);
    cr_expect_leq(worst, 1000, "the survivors took the new round %llu ms after the kill",
                  (unsigned long long)worst);
    expect_restart_agrees("restart", 8, STEPS, NULL, live);
    cr_log_info("L1 (node killed, live): every survivor in the 3-node round %llu ms after the "
                "kill, going on after step %ld with 0 lost; equal to the restart from step %ld",
                (unsigned long long)worst, after, after);
}

/* L2. A node vanishes (link cut: nothing closes): the survivors learn it from
 * the heartbeats and re-form in place. */
Test(reform_live, node_vanishes_survivors_re_form_in_place) {
    setup_bed("L2-reform-node-vanishes", NODES + 1, 0, 0);
    trace_to("live");
    start_server(0);
    job_args ja = {.nnodes = "3:4", .steps = "600", .sleep_ms = "10", .reform = 1};
    start_job(&ja);
    usleep(1500000);
    int surv[NODES - 1];
    uint64_t t_fault, told = node_dies(4, surv, &t_fault);
    long after;
    char live[65];
    uint64_t worst = survivors_go_on(surv, t_fault, "run", &after, live);
    expect_restart_agrees("restart", 8, "600", NULL, live);
    cr_expect_leq(worst - told, 1000, "re-formed %llu ms after the survivors were told",
                  (unsigned long long)(worst - told));
    cr_log_info("L2 (node vanishes, live): told after %llu ms, every survivor in the new round "
                "%llu ms after being told",
                (unsigned long long)told, (unsigned long long)(worst - told));
}

/* L3. Two nodes killed 200 ms apart, then a replacement node joins: the two
 * survivors re-form (once or twice), and re-form again to take the newcomer
 * in, which copies the state (16 MiB beside the parameters) from them. Every
 * re-formation's world and step is then replayed as restarts from
 * checkpoints: the same parameters. */
Test(reform_live, two_failures_then_a_new_node_copies_the_state) {
    setup_bed("L3-reform-two-failures-and-join", NODES + 1, 0, 0);
    trace_to("live");
    start_server(0);
    job_args ja = {
        .nnodes = "2:4", .steps = "1200", .sleep_ms = "10", .reform = 1, .state_mib = "16"};
    start_job(&ja);
    usleep(1500000);
    static const int surv[2] = {1, 2};
    uint64_t t_fault = now_ms();
    cr_assert(netbed_kill_host(&bed, 4) >= 3, "host4 had no launcher and workers");
    usleep(200000);
    cr_assert(netbed_kill_host(&bed, 3) >= 3, "host3 had no launcher and workers");
    proc_wait(&nodes[4], 5000);
    proc_wait(&nodes[3], 5000);
    uint64_t ms[3]; /* rank 0 says it, on either survivor */
    cr_assert_geq(wait_after(surv, 2, NULL, "first step in a world of 4", 1, t_fault, 20000, ms), 1,
                  "the two survivors did not train on: %s", nodes[1].out);
    uint64_t in4 = max_ms(ms, 2);
    /* the replacement: host 3 again, a fresh launcher */
    netbed_save_log(&bed, "run-host3-killed", &nodes[3]);
    /* the 6-rank world may have trained between the two kills: only what
     * comes after the newcomer counts */
    size_t mark[3] = {nodes[1].out_len, nodes[2].out_len, 0};
    uint64_t t_join = now_ms();
    start_node(3, &ja);
    static const int three[3] = {1, 2, 3};
    cr_assert_geq(wait_after(three, 3, mark, "first step in a world of 6", 1, t_join, 30000, ms), 1,
                  "no step in the 6-rank world: %s", nodes[1].out);
    uint64_t in6 = max_ms(ms, 3);
    expect_exit(three, 3, 0, 90000);
    save_logs("run");
    expect_in_place(surv, 2);
    cr_expect(strstr(nodes[3].out, "nothing read from the checkpoint") != NULL,
              "the new node did not copy the state from a survivor: %s", nodes[3].out);
    char live[65];
    expect_same_params(three, 3, 6, live);
    expect_restart_agrees("restart", 8, "1200", "16", live);
    cr_log_info("L3 (two nodes killed 200 ms apart, then one joins): first step in the 4-rank "
                "world %llu ms after the first kill; the new node's first step with the others "
                "%llu ms after its launcher started",
                (unsigned long long)in4, (unsigned long long)in6);
}

/* L4. Kept workers die while their round re-forms (DP_TRAIN_EXIT_IN_REFORM on
 * host 2): its launcher falls back to restarting its workers, the
 * round it joined ends for everyone, and the next one takes the restarted
 * workers in as new ranks that copy the state. The job finishes, never worse
 * than a restart. */
Test(reform_live, a_failure_during_re_formation_falls_back_to_restart) {
    setup_bed("L4-reform-fails-falls-back", NODES + 1, 0, 0);
    trace_to("live");
    start_server(0);
    job_args ja = {.nnodes = "3:4", .steps = STEPS, .sleep_ms = "10", .reform = 1};
    for (int i = 1; i <= NODES; i++) {
        if (i == 2)
            setenv("DP_TRAIN_EXIT_IN_REFORM", "1", 1);
        start_node(i, &ja);
        unsetenv("DP_TRAIN_EXIT_IN_REFORM");
    }
    uint64_t ms[NODES];
    cr_assert_eq(expect_all(all_nodes, NODES, "round 1: node rank", now_ms(), 30000, ms), NODES,
                 "round 1 did not form: %s", nodes[1].out);
    usleep(1500000);
    static const int surv[NODES - 1] = {1, 2, 3};
    uint64_t t_fault = now_ms();
    cr_assert(netbed_kill_host(&bed, 4) >= 3, "host4 had no launcher and workers");
    proc_wait(&nodes[4], 5000);
    uint64_t fb[1];
    static const int two[1] = {2};
    /* its launcher says "re-forming in place failed" when told of the round's
     * end before its workers exit; when they exit first (their ring broke
     * before the rendezvous told the launcher), it restarts them as after any
     * worker's failure: a fallback to restarting either way */
    cr_assert_eq(expect_all(two, 1, "restarting workers", t_fault, 20000, fb), 1,
                 "host2 did not fall back: %s", nodes[2].out);
    expect_exit(surv, NODES - 1, 0, 90000);
    save_logs("run");
    /* each launcher's log says how its rounds began: host2's restart as such */
    const char *r2 = strstr(nodes[2].out, " began: restarted the workers (");
    cr_expect(r2 != NULL, "host2 did not say its restart: %s", nodes[2].out);
    cr_expect(strstr(nodes[1].out, " began: re-formed in place") != NULL,
              "host1 did not say its re-formation: %s", nodes[1].out);
    if (r2)
        cr_log_info("host2's log: round%.*s", (int)strcspn(r2, "\n"), r2);
    char live[65];
    expect_same_params(surv, NODES - 1, 6, live);
    expect_restart_agrees("restart", 8, STEPS, NULL, live);
    cr_log_info("L4 (a worker dies while re-forming): host2 fell back to a restart %llu ms after "
                "the kill; the job finished on 3 nodes",
                (unsigned long long)fb[0]);
}

/* The step of the first "checkpoint of step N written" in out, -1 without. */
static long saved_step(const char *out) {
    const char *s = strstr(out, "checkpoint of step ");
    return s ? strtol(s + strlen("checkpoint of step "), NULL, 10) : -1;
}

/* L5. A preemption (SIGTERM to host 4's launcher: a pod deleted, a spot
 * notice turned into SIGTERM): every rank saves the same step, host 4's
 * workers stop (exit 143), and the survivors go on: they keep their
 * processes, re-form in place when host 4 has left and lose no step. */
Test(reform_live, preemption_saves_the_same_step_and_the_survivors_go_on) {
    setup_bed("L5-reform-preemption", NODES + 1, 0, 0);
    trace_to("live");
    start_server(0);
    job_args ja = {
        .nnodes = "3:4", .steps = STEPS, .sleep_ms = "10", .ck_every = "100000", .reform = 1};
    start_job(&ja);
    usleep(1500000);
    static const int surv[NODES - 1] = {1, 2, 3};
    static const int gone[1] = {4};
    uint64_t t_fault = now_ms();
    proc_kill(&nodes[4], SIGTERM);
    expect_exit(gone, 1, 143, 30000);
    long after;
    char live[65];
    uint64_t worst = survivors_go_on(surv, t_fault, "run", &after, live);
    /* the same step saved by every rank, host 4's included, and complete */
    long step = saved_step(nodes[4].out);
    cr_assert_geq(step, 1, "host4 saved nothing: %s", nodes[4].out);
    for (int i = 0; i < NODES - 1; i++) {
        const char *out = nodes[surv[i]].out;
        cr_expect(strstr(out, "preemption of another node") != NULL, "host%d: %s", surv[i], out);
        int n = 0;
        for (const char *s = out; (s = strstr(s, "for a preemption")) != NULL; s++)
            n++;
        cr_expect_eq(n, 2, "host%d: %d ranks said they saved and went on: %s", surv[i], n, out);
        cr_expect_eq(saved_step(out), step, "host%d saved another step: %s", surv[i], out);
    }
    char path[256], done[128] = "";
    snprintf(path, sizeof path, "%s/ck/step-%012ld/COMPLETE", dir, step);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no complete checkpoint of step %ld", step);
    size_t len = fread(done, 1, sizeof done - 1, f);
    fclose(f);
    done[len] = '\0';
    cr_expect(strstr(done, "world 8") != NULL, "%s: %s", path, done);
    cr_expect_geq(after, step, "the survivors went on after step %ld, before the save (%ld)", after,
                  step);
    expect_restart_agrees("restart", 8, STEPS, NULL, live);
    cr_log_info("L5 (preemption, live): every rank saved step %ld; host4 exited 143; every "
                "survivor in the 3-node round %llu ms after the SIGTERM, going on after step %ld",
                step, (unsigned long long)worst, after);
}

/* Runs a tc command line on host; its output. */
static const char *tc_on(int host, const char *cmd) {
    char *argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
    static proc p;
    cr_assert_eq(netbed_spawn(&bed, host, &p, argv), 0);
    int st = proc_wait(&p, 5000);
    cr_assert(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "host%d: %s: %s", host, cmd,
              p.out);
    return p.out;
}

/* host's egress through a token bucket of rate ("20mbit"), or back to the
 * default queue (NULL): a state copy from that host then lasts seconds,
 * while the training's small all-reduces stay below the rate. */
static void shape(int host, const char *rate) {
    char cmd[160];
    if (rate)
        snprintf(cmd, sizeof cmd,
                 "tc qdisc replace dev eth0 root tbf rate %s burst 32kb latency 20ms", rate);
    else
        snprintf(cmd, sizeof cmd, "tc qdisc del dev eth0 root");
    tc_on(host, cmd);
}

/* The bytes host sent since shape() slowed its link: what a state copy from
 * it has sent so far, beside the training's few KiB. */
static long long shaped_bytes(int host) {
    const char *out = tc_on(host, "tc -s qdisc show dev eth0");
    const char *s = strstr(out, "Sent ");
    long long n = -1;
    cr_assert(s && sscanf(s, "Sent %lld bytes", &n) == 1, "host%d: %s", host, out);
    return n;
}

/* A slow link needs tc (iproute2) and the kernel's tbf queue. */
static void require_tc(void) {
    if (system("command -v tc >/dev/null 2>&1") != 0)
        skip_test("no tc here: the scenario slows a link with it (iproute2)");
}

/* A new node's rank says the copy began: the step, the root and the round
 * (the first such line). Then the host whose ranks hold the root in that
 * round, from the launchers' "round N: node rank K of M, ranks A-B" lines. */
static int copy_began(int newcomer, const int *hosts, int n, long *step, int *root, int *round) {
    const char *s = strstr(nodes[newcomer].out, "copying the state of step ");
    cr_assert_not_null(s, "host%d's ranks copied nothing: %s", newcomer, nodes[newcomer].out);
    cr_assert_eq(
        sscanf(s, "copying the state of step %ld from rank %d in round %d", step, root, round), 3,
        "%.120s", s);
    char pat[48];
    snprintf(pat, sizeof pat, "round %d: node rank ", *round);
    uint64_t t0 = now_ms();
    while (now_ms() - t0 < 5000) {
        drain_all();
        for (int i = 0; i < n; i++) {
            const char *a = strstr(nodes[hosts[i]].out, pat);
            int lo, hi;
            if (a && sscanf(a + strlen(pat), "%*u of %*u, ranks %d-%d", &lo, &hi) == 2 &&
                lo <= *root && *root <= hi)
                return hosts[i];
        }
    }
    cr_assert_fail("no launcher of round %d holds rank %d", *round, *root);
    return 0;
}

/* L6. A failure during the state copy: three nodes train (16 MiB of state
 * beside the parameters: two connections a link of the chain; their links
 * slowed to 20 Mbit/s so that a copy lasts seconds), a fourth joins, and the node holding the
 * copy's root is killed while the copy is in flight. The two other survivors re-form again in
 * place; the newcomer's ranks, their copy cut short, re-form with them and copy the state from one
 * of them. 0 steps lost, and the same parameters as restarts from checkpoints into the same worlds.
 */
Test(reform_live, a_failure_during_the_state_copy_re_forms_again) {
    require_tc();
    setup_bed("L6-reform-failure-during-copy", NODES + 1, 0, 0);
    trace_to("live");
    start_server(0);
    job_args ja = {.nnodes = "3:4",
                   .steps = "250", /* rank 0 hashes 16 MiB a step (the trace) */
                   .sleep_ms = "10",
                   .ck_every = "100000",
                   .reform = 1,
                   .state_mib = "16"};
    static const int first3[3] = {1, 2, 3};
    for (int i = 0; i < 3; i++)
        start_node(first3[i], &ja);
    uint64_t ms[3];
    cr_assert_eq(expect_all(first3, 3, "round 1: node rank", now_ms(), 30000, ms), 3,
                 "round 1 did not form: %s", nodes[1].out);
    usleep(500000);
    for (int i = 0; i < 3; i++) /* from now on, what they send is mostly the copy */
        shape(first3[i], "20mbit");
    static const int newcomer[1] = {4};
    start_node(4, &ja);
    cr_assert_eq(expect_all(newcomer, 1, "copying the state of step ", now_ms(), 20000, ms), 1,
                 "the new node did not start a copy: %s", nodes[4].out);
    long step;
    int root, round;
    int victim = copy_began(4, first3, 3, &step, &root, &round);
    int three[3], k = 0;
    for (int i = 0; i < 3; i++)
        if (first3[i] != victim) {
            three[k++] = first3[i];
            shape(first3[i], NULL); /* the next copy at full speed */
        }
    three[2] = 4;
    usleep(300000); /* well inside the copy: 16 MiB take 6.7 s at 20 Mbit/s */
    long long sent = shaped_bytes(victim);
    size_t mark[3] = {nodes[three[0]].out_len, nodes[three[1]].out_len, nodes[4].out_len};
    uint64_t t_fault = now_ms();
    /* the kernel still sends what a killed process's sockets hold (most of
     * the state, here): the victim's link stays slow until the end, or the
     * rest of the copy could arrive before the round's end is known */
    cr_assert(netbed_kill_host(&bed, victim) >= 3, "host%d had no launcher and workers", victim);
    proc_wait(&nodes[victim], 5000);
    uint64_t back[3], copied[1], first[3];
    cr_assert_eq(wait_after(three, 3, mark, "workers re-formed in place", 3, t_fault, 20000, back),
                 3, "not every node re-formed after the copy's root was lost: %s", nodes[4].out);
    cr_assert_eq(wait_after(newcomer, 1, &mark[2], "nothing read from the checkpoint", 1, t_fault,
                            20000, copied),
                 1, "the new node did not copy the state again: %s", nodes[4].out);
    cr_assert_geq(
        wait_after(three, 3, mark, "first step in a world of 6", 1, t_fault, 20000, first), 1,
        "no step in the new 6-rank world: %s", nodes[three[0]].out);
    cr_expect_leq(max_ms(back, 2), 1000, "the survivors took the new round %llu ms after the kill",
                  (unsigned long long)max_ms(back, 2));
    long after;
    char live[65];
    survivors_go_on(three, t_fault, "live", &after, live);
    /* the copy was cut: the newcomer's ranks said why and joined a later round */
    int joined = 0;
    const char *j = strstr(nodes[4].out, "joined round ");
    cr_assert(j && sscanf(j, "joined round %d", &joined) == 1, "%s", nodes[4].out);
    cr_expect_gt(joined, round, "the new node joined round %d, the one whose copy was cut", joined);
    cr_expect_eq(after, step, "the job went on after step %ld, not after the cut copy's %ld", after,
                 step);
    cr_expect(sent >= 256 * 1024 && sent < 16 << 20,
              "host%d had sent %lld bytes when it was killed: the copy was not in flight", victim,
              sent);
    shape(victim, NULL);
    expect_restart_agrees("restart", 6, "250", "16", live);
    cr_log_info(
        "L6 (the copy's root killed mid-copy, host%d): the survivors in the new round "
        "%llu ms after the kill (%.1f MiB of the copy sent), the newcomer's copy done after "
        "%llu ms, first step in the 6-rank world after %llu ms; going on after step %ld, "
        "0 lost",
        victim, (unsigned long long)max_ms(back, 2), (double)sent / (1 << 20),
        (unsigned long long)copied[0], (unsigned long long)max_ms(first, 3), after);
}

/* L6b. The copy's root was the only holder of the state: one node trains
 * (1:4, its link slowed), a second joins, and the first is killed while the
 * copy is in flight. In the next round no rank holds the state any more: the
 * newcomer's ranks exit, its launcher restarts them, and they resume from the
 * last checkpoint (the steps since it are redone: never worse than a
 * restart). The parameters are those of a restart from that checkpoint into
 * the same world. */
Test(reform_live, the_copys_only_holder_lost_falls_back_to_the_checkpoint) {
    require_tc();
    setup_bed("L6b-reform-copy-holder-lost", NODES + 1, 0, 0);
    start_server(0);
    job_args ja = {.nnodes = "1:4",
                   .steps = "300",
                   .sleep_ms = "10",
                   .ck_every = "20",
                   .reform = 1,
                   .state_mib = "8"};
    static const int one[1] = {1}, newcomer[1] = {2};
    start_node(1, &ja);
    uint64_t ms[1];
    cr_assert_eq(expect_all(one, 1, "round 1: node rank", now_ms(), 30000, ms), 1,
                 "round 1 did not form: %s", nodes[1].out);
    char path[160];
    snprintf(path, sizeof path, "%s/ck/step-%012d/COMPLETE", dir, 20);
    for (uint64_t t0 = now_ms(); access(path, F_OK) != 0 && now_ms() - t0 < 20000;)
        drain_all();
    cr_assert_eq(access(path, F_OK), 0, "no checkpoint of step 20: %s", nodes[1].out);
    shape(1, "20mbit");
    start_node(2, &ja);
    cr_assert_eq(expect_all(newcomer, 1, "copying the state of step ", now_ms(), 20000, ms), 1,
                 "the new node did not start a copy: %s", nodes[2].out);
    long step;
    int root, round;
    cr_assert_eq(copy_began(2, one, 1, &step, &root, &round), 1);
    usleep(300000); /* inside the copy, as in L6 */
    long long sent = shaped_bytes(1);
    uint64_t t_fault = now_ms();
    /* host1's link stays slow: what its sockets hold must not arrive (L6) */
    cr_assert(netbed_kill_host(&bed, 1) >= 3, "host1 had no launcher and workers");
    proc_wait(&nodes[1], 5000);
    uint64_t back[1];
    cr_assert_eq(
        expect_all(newcomer, 1, "resumed from the checkpoint of step ", t_fault, 30000, back), 1,
        "host2 did not resume from the checkpoint: %s", nodes[2].out);
    expect_exit(newcomer, 1, 0, 60000);
    save_run_logs("live", 2);
    const char *out = nodes[2].out;
    cr_expect(strstr(out, "holds the state any more") != NULL, "host2: %s", out);
    cr_expect(strstr(out, "restarting") != NULL, "host2 did not restart its workers: %s", out);
    long from = resumed_step(2);
    cr_expect(from >= 20 && from <= step, "resumed from step %ld; the cut copy was of step %ld",
              from, step);
    cr_expect(sent >= 256 * 1024 && sent < 8 << 20,
              "host1 had sent %lld bytes when it was killed: the copy was not in flight", sent);
    char live[65];
    expect_same_params(newcomer, 1, 2, live);
    /* the replay: one node to the checkpoint's step, then from it to the end */
    shape(1, NULL);
    netbed_save_log(&bed, "live-rdzv", &server);
    proc_kill(&server, SIGKILL);
    proc_wait(&server, 5000);
    start_server(0);
    char ck[128], at[24];
    snprintf(ck, sizeof ck, "%s/ck-restart", dir);
    snprintf(at, sizeof at, "%ld", from);
    run_fixed(1, at, at, ck, "8");
    save_run_logs("restart-1-world2", 1);
    run_fixed(1, "300", "100000", ck, "8");
    save_run_logs("restart-last-world2", 1);
    cr_expect_eq(resumed_step(1), from, "the restart resumed from another step");
    char restarted[65];
    expect_same_params(one, 1, 2, restarted);
    cr_expect_str_eq(live, restarted, "the fallback and a restart from step %ld differ", from);
    cr_log_info("L6b (the only holder killed mid-copy, %.1f MiB sent): host2 resumed from the "
                "checkpoint of step %ld %llu ms after the kill; %ld steps redone (the copy was of "
                "step %ld)",
                (double)sent / (1 << 20), from, (unsigned long long)back[0], step - from, step);
}
