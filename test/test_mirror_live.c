/* Sharded state through a lost node on the network-namespace bed
 * (faultbed.h): 4 nodes x 2 workers of shard_train --reform --mirror-every
 * 10, whose parameters and momentum are split over the ranks (no second
 * copy but the mirror's: gpl_mirror). A node killed or vanished: the
 * survivors keep their processes and go back to the copies' step (at most 10
 * steps lost), each taking its new slices from the copies; a node and its
 * buddy lost together: no step is whole, said, and the launchers restart the
 * job; a node joining: its ranks take their slices from the copies. The
 * example's result does not depend on the world size, so every scenario ends
 * with the parameters of one uninterrupted run, bit for bit. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "faultbed.h"

ReportHook(POST_ALL)(struct criterion_global_stats *stats) {
    (void)stats;
    netbed_reap_stale();
}

TestSuite(mirror_live, .fini = teardown, .timeout = 150);

#define STEPS "600"
#define EVERY "10"
#define EVERY_N 10

/* The parameters of an uninterrupted run (2 ranks, one launcher). */
static void reference(const char *steps, char out[65]) {
    char cmd[1024], line[512];
    snprintf(cmd, sizeof cmd,
             GL " --standalone --nproc-per-node 2 " SHARD
                " --params 262144 --steps %s --print-every 100000 2>&1",
             steps);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    out[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        const char *s = strstr(line, "rank 0 params_sha256 ");
        if (s)
            snprintf(out, 65, "%.64s", s + strlen("rank 0 params_sha256 "));
    }
    cr_assert_eq(pclose(f), 0, "the reference run failed");
    cr_assert_eq(strlen(out), 64, "the reference run printed no parameters");
}

/* Every listed node re-formed in place from the copies: its launcher kept
 * its workers, each rank went back at most one interval. Returns the step. */
static long expect_from_copies(const int *hosts, int n) {
    long after = -1;
    int lines = 0;
    for (int i = 0; i < n; i++) {
        const char *out = nodes[hosts[i]].out;
        cr_expect(strstr(out, "workers re-formed in place") != NULL,
                  "host%d's launcher did not re-form in place: %s", hosts[i], out);
        cr_expect(strstr(out, "restarting workers") == NULL, "host%d restarted its workers: %s",
                  hosts[i], out);
        for (const char *s = out; (s = strstr(s, "going on after step ")) != NULL; s++) {
            char *end;
            long st = strtol(s + strlen("going on after step "), &end, 10);
            long lost = strncmp(end, " (", 2) == 0 ? strtol(end + 2, NULL, 10) : -1;
            cr_expect(lost >= 0 && lost <= EVERY_N, "host%d lost %ld steps: %.120s", hosts[i], lost,
                      s);
            cr_expect(strstr(s, "shards from the copies in peers' memory") != NULL,
                      "host%d: %.120s", hosts[i], s);
            cr_expect_eq(st % EVERY_N, 0, "host%d went back to step %ld", hosts[i], st);
            after = st;
            lines++;
        }
    }
    cr_expect_eq(lines, 2 * n, "not every survivor's rank re-formed from the copies");
    return after;
}

static void start_sharded(const char *nnodes) {
    job_args ja = {
        .nnodes = nnodes, .steps = STEPS, .sleep_ms = "10", .reform = 1, .mirror = EVERY};
    start_job(&ja);
    usleep(1500000);
}

/* The three survivors re-formed from the copies after t_fault, ended, and
 * hold an uninterrupted run's parameters; *worst: the last one's re-formation
 * (ms after t_fault). Returns the step they went back to. */
static long survivors_match_a_run_without_faults(const int surv[NODES - 1], uint64_t t_fault,
                                                 uint64_t *worst) {
    uint64_t back[NODES - 1];
    cr_assert_eq(expect_all(surv, NODES - 1, "workers re-formed in place", t_fault, 20000, back),
                 NODES - 1, "not every survivor re-formed: %s", nodes[surv[0]].out);
    expect_exit(surv, NODES - 1, 0, 60000);
    save_logs("live");
    long after = expect_from_copies(surv, NODES - 1);
    char live[65], ref[65];
    expect_same_params(surv, NODES - 1, 6, live);
    reference(STEPS, ref);
    cr_expect_str_eq(live, ref, "the re-formed job and an uninterrupted run differ");
    *worst = max_ms(back, NODES - 1);
    return after;
}

/* M1. kill -9 of a node: the survivors go back to the copies in place. */
Test(mirror_live, node_killed_survivors_go_back_to_the_copies_in_place) {
    setup_bed("M1-mirror-node-killed", NODES + 1, 0, 0);
    start_server(0);
    start_sharded("3:4");
    static const int surv[NODES - 1] = {1, 2, 3};
    uint64_t t_fault = now_ms(), worst;
    cr_assert(netbed_kill_host(&bed, 4) >= 3, "host4 had no launcher and workers");
    proc_wait(&nodes[4], 5000);
    long after = survivors_match_a_run_without_faults(surv, t_fault, &worst);
    cr_log_info("M1 (node killed, copies in peers' memory): every survivor in the 3-node round "
                "%llu ms after the kill, going back to step %ld; equal to an uninterrupted run",
                (unsigned long long)worst, after);
}

/* M2. A node vanishes (link cut, then everything on it killed): the
 * survivors learn it from the heartbeats and go back to the copies. */
Test(mirror_live, node_vanishes_survivors_go_back_to_the_copies_in_place) {
    setup_bed("M2-mirror-node-vanishes", NODES + 1, 0, 0);
    start_server(0);
    start_sharded("3:4");
    int surv[NODES - 1];
    uint64_t t_fault, told = node_dies(4, surv, &t_fault), worst;
    long after = survivors_match_a_run_without_faults(surv, t_fault, &worst);
    cr_log_info("M2 (node vanishes, copies): told after %llu ms, every survivor in the new round "
                "%llu ms after being told, going back to step %ld",
                (unsigned long long)told, (unsigned long long)(worst - told), after);
}

/* The host whose launcher holds node rank r in round 1. */
static int host_of_node_rank(int r) {
    char want[32];
    snprintf(want, sizeof want, "node rank %d of ", r);
    for (int h = 1; h <= NODES; h++)
        if (strstr(nodes[h].out, want))
            return h;
    return -1;
}

/* M3. A node and its buddy node (the next node rank) killed together: their
 * ranks' copies went with them, no step is whole; the survivors say so and
 * their launchers restart the workers (from step 0: this example keeps no
 * checkpoint), which still end with an uninterrupted run's parameters. */
Test(mirror_live, a_node_and_its_buddy_lost_together_restart_and_say_why) {
    setup_bed("M3-mirror-node-and-buddy", NODES + 1, 0, 0);
    start_server(0);
    start_sharded("2:4");
    drain_all();
    int a = host_of_node_rank(1), b = host_of_node_rank(2);
    cr_assert(a > 0 && b > 0, "node ranks 1 and 2 not found: %s", nodes[1].out);
    int surv[2], k = 0;
    for (int h = 1; h <= NODES; h++)
        if (h != a && h != b)
            surv[k++] = h;
    uint64_t t_fault = now_ms(), back[2];
    cr_assert(netbed_kill_host(&bed, a) >= 3 && netbed_kill_host(&bed, b) >= 3);
    proc_wait(&nodes[a], 5000);
    proc_wait(&nodes[b], 5000);
    cr_assert_eq(expect_all(surv, 2, "restarting", t_fault, 30000, back), 2,
                 "the survivors did not restart: %s", nodes[surv[0]].out);
    expect_exit(surv, 2, 0, 90000);
    save_logs("live");
    int said = 0;
    for (int i = 0; i < 2; i++)
        said += strstr(nodes[surv[i]].out, "lacks rank(s) ") != NULL &&
                strstr(nodes[surv[i]].out, "a rank and its buddy both lost") != NULL;
    cr_expect_geq(said, 1, "no survivor said which copies were gone: %s", nodes[surv[0]].out);
    char live[65], ref[65];
    expect_same_params(surv, 2, 4, live);
    reference(STEPS, ref);
    cr_expect_str_eq(live, ref, "the restarted job and an uninterrupted run differ");
    cr_log_info("M3 (node ranks 1 and 2 killed together): the survivors restarted %llu ms after "
                "the kill, naming the lost copies",
                (unsigned long long)max_ms(back, 2));
}

/* M4. A node joins a 3-node job: every rank takes its slices of the 4-node
 * layout from the copies (the new node's ranks from the others'). */
Test(mirror_live, a_joining_nodes_ranks_take_their_slices_from_the_copies) {
    setup_bed("M4-mirror-node-joins", NODES + 1, 0, 0);
    start_server(0);
    job_args ja = {.nnodes = "3:4", .steps = STEPS, .sleep_ms = "10", .reform = 1, .mirror = EVERY};
    static const int three[3] = {1, 2, 3}, newcomer[1] = {4};
    for (int h = 1; h <= 3; h++)
        start_node(h, &ja);
    uint64_t ms[3];
    cr_assert_eq(expect_all(three, 3, "round 1: node rank", now_ms(), 30000, ms), 3,
                 "round 1 did not form: %s", nodes[1].out);
    usleep(1500000);
    uint64_t t_join = now_ms(), got[1];
    start_node(4, &ja);
    cr_assert_eq(expect_all(newcomer, 1, "slices taken from the copies in peers' memory", t_join,
                            30000, got),
                 1, "the new node's ranks did not take their slices: %s", nodes[4].out);
    expect_exit(all_nodes, NODES, 0, 60000);
    save_logs("live");
    expect_from_copies(three, 3);
    char live[65], ref[65];
    expect_same_params(all_nodes, NODES, 8, live);
    reference(STEPS, ref);
    cr_expect_str_eq(live, ref, "the grown job and an uninterrupted run differ");
    cr_log_info("M4 (a node joined): its ranks had their slices %llu ms after it started",
                (unsigned long long)got[0]);
}
