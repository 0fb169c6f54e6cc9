/* Preemption end to end with real processes: SIGTERM to one of two
 * launchers -> every rank saves the same step -> both launchers exit 143 ->
 * the next start resumes there and ends bitwise equal to an uninterrupted
 * run. Torn and partial checkpoints are skipped on restore. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define GL GPL_BUILD_DIR "/launcher/gpulaunch"
#define DP GPL_BUILD_DIR "/examples/dp_train"

static char dir[64];

static void setup(void) {
    tmpdir_make(dir, sizeof dir, "gpl-preempt");
    cr_assert(dir[0]);
}

static void teardown(void) { tmpdir_remove(dir); }

TestSuite(preempt, .init = setup, .fini = teardown, .timeout = 120);

/* Starts node `rank` of a 2 x 2 job training the example for `steps` into
 * ckdir; src and endpoint choose the node's preemption source. */
static void start_node(proc *p, int rank, int port, const char *ckdir, const char *steps,
                       const char *sleep_ms, const char *src, const char *endpoint) {
    char r[8], po[16];
    snprintf(r, sizeof r, "%d", rank);
    snprintf(po, sizeof po, "%d", port);
    char *argv[] = {GL,
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "2",
                    "--node-rank",
                    r,
                    "--master-addr",
                    "127.0.0.1",
                    "--master-port",
                    po,
                    "--shutdown-timeout",
                    "20",
                    "--preemption-source",
                    (char *)src,
                    "--preemption-endpoint",
                    (char *)endpoint,
                    "--preemption-poll",
                    "0.2",
                    DP,
                    "--steps",
                    (char *)steps,
                    "--global-batch",
                    "32",
                    "--print-every",
                    "100000",
                    "--checkpoint-dir",
                    (char *)ckdir,
                    "--checkpoint-every",
                    "100",
                    "--step-sleep-ms",
                    (char *)sleep_ms,
                    NULL};
    cr_assert_eq(proc_start(p, argv, NULL), 0);
}

/* An uninterrupted 2 x 2 run (resuming from ckdir if it holds a checkpoint). */
static void run_pair(const char *ckdir, const char *steps, char sha[][65], int expect_resume) {
    proc a, b;
    int port = free_tcp_port();
    start_node(&b, 1, port, ckdir, steps, "0", "none", "");
    start_node(&a, 0, port, ckdir, steps, "0", "none", "");
    int sa = proc_wait(&a, 60000), sb = proc_wait(&b, 60000);
    cr_assert(WIFEXITED(sa) && WEXITSTATUS(sa) == 0, "node 0: %d %s", sa, a.out);
    cr_assert(WIFEXITED(sb) && WEXITSTATUS(sb) == 0, "node 1: %d %s", sb, b.out);
    if (expect_resume)
        cr_expect(strstr(a.out, "resumed from the checkpoint of step") != NULL, "%s", a.out);
    int found = params_sha_lines(a.out, b.out, sha, 4);
    cr_assert_eq(found, 4, "%s\n%s", a.out, b.out);
}

/* Both launchers exited 143 after every rank saved the same step: that step. */
static long preempted_step(proc *a, proc *b, int sa, int sb, long steps) {
    cr_expect(WIFEXITED(sa) && WEXITSTATUS(sa) == 143, "node 0 status %d: %s", sa, a->out);
    cr_expect(WIFEXITED(sb) && WEXITSTATUS(sb) == 143, "node 1 status %d: %s", sb, b->out);
    long step[4];
    for (int r = 0; r < 4; r++) {
        step[r] = preempted_step_line(a->out, b->out, r);
        cr_assert_geq(step[r], 0, "rank %d did not checkpoint:\n%s\n%s", r, a->out, b->out);
        cr_expect_eq(step[r], step[0], "rank %d saved step %ld, rank 0 %ld", r, step[r], step[0]);
    }
    cr_expect(step[0] > 0 && step[0] < steps, "step %ld of %ld", step[0], steps);
    return step[0];
}

/* The run resumed from ck ends bitwise where an uninterrupted run (in ref) ends. */
static void resume_matches_uninterrupted(const char *ck, const char *ref, const char *steps) {
    char got[4][65], want[4][65];
    run_pair(ck, steps, got, 1);
    run_pair(ref, steps, want, 0);
    for (int r = 0; r < 4; r++)
        cr_expect_str_eq(got[r], want[r], "rank %d: resumed %s, uninterrupted %s", r, got[r],
                         want[r]);
}

Test(preempt, sigterm_to_one_node_checkpoints_every_rank_and_resumes_bitwise) {
    char ck[128], ref[128];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(ref, sizeof ref, "%s/ref", dir);
    /* 1. interrupted run: SIGTERM to node 1's launcher mid-training */
    proc a, b;
    int port = free_tcp_port();
    start_node(&b, 1, port, ck, "300", "4", "none", "");
    start_node(&a, 0, port, ck, "300", "4", "none", "");
    cr_assert(proc_expect(&b, "workers (", 10000), "%s", b.out);
    usleep(600000);
    uint64_t t0 = now_ms();
    kill(b.pid, SIGTERM);
    int sa = proc_wait(&a, 30000), sb = proc_wait(&b, 30000);
    cr_log_info("notice to both launchers gone: %llu ms", (unsigned long long)(now_ms() - t0));
    long step = preempted_step(&a, &b, sa, sb, 300);
    char complete[256];
    snprintf(complete, sizeof complete, "%s/step-%012ld/COMPLETE", ck, step);
    cr_expect(access(complete, F_OK) == 0, "no %s", complete);
    /* 2. the restart resumes there and ends where an uninterrupted run ends */
    resume_matches_uninterrupted(ck, ref, "300");
}

Test(preempt, torn_and_partial_checkpoints_are_skipped) {
    char ck[128];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    char sha[4][65];
    run_pair(ck, "300", sha, 0); /* complete checkpoints at steps 100, 200, 300 */
    char cmd[1024];
    /* a torn newer step: COMPLETE claims it, but the data is cut short */
    snprintf(cmd, sizeof cmd,
             "cp -r %s/step-000000000300 %s/step-000000000400 && "
             "printf 'gpulaunch-checkpoint 1\\nstep 400\\nworld 2\\n' "
             ">%s/step-000000000400/COMPLETE && "
             "truncate -s 100 %s/step-000000000400/r0-params && "
             "cp -r %s/step-000000000300 %s/step-000000000500 && "
             "rm %s/step-000000000500/COMPLETE",
             ck, ck, ck, ck, ck, ck, ck);
    cr_assert_eq(system(cmd), 0);
    proc p;
    char *argv[] = {GL,
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    DP,
                    "--steps",
                    "310",
                    "--global-batch",
                    "32",
                    "--checkpoint-dir",
                    ck,
                    NULL};
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    int st = proc_wait(&p, 30000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "step-000000000500: no COMPLETE marker") != NULL, "%s", p.out);
    cr_expect(strstr(p.out, "step-000000000400: r0-params is missing or has the wrong size"), "%s",
              p.out);
    cr_expect(strstr(p.out, "resumed from the checkpoint of step 300") != NULL, "%s", p.out);
}

Test(preempt, kill_9_while_writing_leaves_the_previous_checkpoint_loadable) {
    char ck[128];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    /* checkpoint every step, kill a worker at some point in the middle */
    proc p;
    char *argv[] = {GL,
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    DP,
                    "--steps",
                    "100000",
                    "--global-batch",
                    "32",
                    "--checkpoint-dir",
                    ck,
                    "--checkpoint-every",
                    "1",
                    "--print-every",
                    "1000000",
                    NULL};
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    usleep(700000);
    char kill_cmd[256];
    /* [n]: the shell running pkill must not match its own pattern */
    snprintf(kill_cmd, sizeof kill_cmd, "pkill -9 -f 'dp_trai[n] --steps 100000'");
    cr_assert_eq(system(kill_cmd), 0);
    proc_wait(&p, 30000);
    /* the restart finds a complete checkpoint and goes on from it */
    char *again[] = {GL,
                     "--standalone",
                     "--nproc-per-node",
                     "2",
                     DP,
                     "--steps",
                     "1",
                     "--global-batch",
                     "32",
                     "--checkpoint-dir",
                     ck,
                     NULL};
    cr_assert_eq(proc_start(&p, again, NULL), 0);
    int st = proc_wait(&p, 30000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "resumed from the checkpoint of step ") != NULL, "%s", p.out);
}

/* ---- cloud notices from a real HTTP server answering as the cloud does ---- */

static int start_fake(proc *p, const char *cloud, const char *after) {
    char *argv[] = {"/usr/bin/env", "python3",     GPL_SOURCE_DIR "/test/fake_metadata.py",
                    "--cloud",      (char *)cloud, "--notice-after",
                    (char *)after,  NULL};
    cr_assert_eq(proc_start(p, argv, NULL), 0);
    cr_assert(proc_expect(p, "listening on 127.0.0.1:", 10000), "fake metadata: %s", p->out);
    return (int)strtol(strstr(p->out, "127.0.0.1:") + 10, NULL, 10);
}

static void cloud_notice_case(const char *cloud) {
    proc fake, a, b;
    int fport = start_fake(&fake, cloud, "1.5");
    char ep[64], ck[128], ref[128];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", fport);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(ref, sizeof ref, "%s/ref", dir);
    int port = free_tcp_port();
    /* only node 1 sees the notice */
    start_node(&b, 1, port, ck, "3000", "4", cloud, ep);
    start_node(&a, 0, port, ck, "3000", "4", "none", "");
    int sa = proc_wait(&a, 60000), sb = proc_wait(&b, 60000);
    proc_kill(&fake, SIGTERM);
    proc_wait(&fake, 5000);
    preempted_step(&a, &b, sa, sb, 3000);
    resume_matches_uninterrupted(ck, ref, "3000");
}

Test(preempt, aws_notice_on_one_node, .timeout = 240) { cloud_notice_case("aws"); }
Test(preempt, gcp_notice_on_one_node, .timeout = 240) { cloud_notice_case("gcp"); }
Test(preempt, azure_notice_on_one_node, .timeout = 240) { cloud_notice_case("azure"); }

/* A metadata endpoint that hangs, refuses or talks nonsense: training goes on. */
static void bad_endpoint_case(const char *mode, const char *source) {
    proc fake, p;
    int fport = start_fake(&fake, mode, "0");
    char ep[64], ck[128];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", fport);
    snprintf(ck, sizeof ck, "%s/ck-%s", dir, mode);
    char *argv[] = {GL,
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    "--preemption-source",
                    (char *)source,
                    "--preemption-endpoint",
                    ep,
                    "--preemption-poll",
                    "0.2",
                    DP,
                    "--steps",
                    "900",
                    "--global-batch",
                    "32",
                    "--step-sleep-ms",
                    "5",
                    "--checkpoint-dir",
                    ck,
                    NULL};
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    int st = proc_wait(&p, 60000);
    proc_kill(&fake, SIGTERM);
    proc_wait(&fake, 5000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: status %d: %s", mode, st, p.out);
    const char *first = strstr(p.out, "preemption notices:");
    if (strcmp(source, "auto") != 0) {
        cr_expect_not_null(first, "%s: the trouble was not logged: %s", mode, p.out);
        if (first)
            cr_expect_null(strstr(first + 1, "preemption notices:"), "%s: logged more than once",
                           mode);
    }
}

Test(preempt, metadata_endpoint_that_hangs, .timeout = 120) { bad_endpoint_case("hang", "aws"); }
Test(preempt, metadata_endpoint_that_refuses, .timeout = 120) {
    bad_endpoint_case("refuse", "gcp");
}
Test(preempt, metadata_endpoint_with_garbage, .timeout = 120) {
    bad_endpoint_case("garbage", "azure");
}
Test(preempt, no_cloud_is_quiet_under_auto, .timeout = 120) { bad_endpoint_case("refuse", "auto"); }

Test(preempt, periodic_by_time_and_reload_at_another_world_size, .timeout = 120) {
    char ck[128];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    /* 4 ranks, a checkpoint every 0.4 s of rank 0's clock, about 2 s of training */
    proc p;
    char *a[] = {GL,
                 "--standalone",
                 "--nproc-per-node",
                 "4",
                 DP,
                 "--steps",
                 "400",
                 "--global-batch",
                 "32",
                 "--checkpoint-dir",
                 ck,
                 "--checkpoint-every-s",
                 "0.4",
                 "--step-sleep-ms",
                 "5",
                 NULL};
    cr_assert_eq(proc_start(&p, a, NULL), 0);
    int st = proc_wait(&p, 60000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "test $(ls %s/step-*/COMPLETE | wc -l) -ge 2", ck);
    cr_expect_eq(system(cmd), 0, "fewer than 2 time-based checkpoints");
    snprintf(cmd, sizeof cmd, "test $(ls -d %s/step-* | wc -l) -le 3", ck);
    cr_expect_eq(system(cmd), 0, "more than the 3 kept checkpoints");
    /* the replicated parameters reload with 2 ranks */
    char *b[] = {GL,
                 "--standalone",
                 "--nproc-per-node",
                 "2",
                 DP,
                 "--steps",
                 "500",
                 "--global-batch",
                 "32",
                 "--checkpoint-dir",
                 ck,
                 NULL};
    cr_assert_eq(proc_start(&p, b, NULL), 0);
    st = proc_wait(&p, 60000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "resumed from the checkpoint of step ") != NULL, "%s", p.out);
    cr_expect(strstr(p.out, "rank 1 params_sha256 ") != NULL, "%s", p.out);
}

/* A notice that comes while the workers are still starting (a framework's
 * import takes seconds): a SIGTERM then would end them without a
 * checkpoint. The launchers hold the stop until every worker can save
 * (their runtime's SIGTERM handler is in place), then all save one step. */
Test(preempt, a_notice_during_start_up_waits_until_workers_can_checkpoint, .timeout = 120) {
    proc fake, n[2];
    int fport = start_fake(&fake, "aws", "0.3");
    char ep[64], ck[128];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", fport);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    int port = free_tcp_port();
    char po[16];
    snprintf(po, sizeof po, "%d", port);
    for (int node = 1; node >= 0; node--) {
        char *argv[] = {GL,
                        "--nnodes",
                        "2",
                        "--nproc-per-node",
                        "2",
                        "--node-rank",
                        node ? "1" : "0",
                        "--master-addr",
                        "127.0.0.1",
                        "--master-port",
                        po,
                        "--preemption-source",
                        node ? "aws" : "none", /* only node 1 sees the notice */
                        "--preemption-endpoint",
                        node ? ep : "",
                        "--preemption-poll",
                        "0.2",
                        DP,
                        "--steps",
                        "3000",
                        "--global-batch",
                        "32",
                        "--print-every",
                        "100000",
                        "--checkpoint-dir",
                        ck,
                        "--step-sleep-ms",
                        "4",
                        "--start-delay-ms",
                        "3000",
                        NULL};
        cr_assert_eq(proc_start(&n[node], argv, NULL), 0);
    }
    uint64_t t0 = now_ms();
    int s0 = proc_wait(&n[0], 60000), s1 = proc_wait(&n[1], 60000);
    uint64_t took = now_ms() - t0;
    proc_kill(&fake, SIGTERM);
    proc_wait(&fake, 5000);
    for (int node = 0; node < 2; node++) {
        cr_expect(strstr(n[node].out, "workers cannot checkpoint yet (started ") != NULL,
                  "node %d did not hold the stop: %s", node, n[node].out);
        /* how the hold ends: the workers became ready and were stopped, or
         * the other node stopped its own first and the checkpoint reached
         * these through the job's agreement between two ticks */
        cr_expect(strstr(n[node].out, "every worker can checkpoint now") != NULL ||
                      strstr(n[node].out, "every worker ended by itself while its stop was held"),
                  "node %d: %s", node, n[node].out);
    }
    cr_expect(strstr(n[0].out, "every worker can checkpoint now") ||
                  strstr(n[1].out, "every worker can checkpoint now"),
              "no node stopped its workers once they were ready");
    long step = preempted_step(&n[0], &n[1], s0, s1, 3000);
    cr_log_info("a notice 1.2 s after the start, workers ready after 3 s: every rank saved step "
                "%ld; both launchers gone %llu ms after the start",
                step, (unsigned long long)took);
}

/* Node `rank` of a 2 x 2 job with its own local disk (ckdir) draining to a
 * shared durable tier; durable "" for none. */
static void start_tiered(proc *p, int rank, int port, const char *ckdir, const char *durable,
                         const char *steps, const char *sleep_ms, int via_launcher) {
    char r[8], po[16];
    snprintf(r, sizeof r, "%d", rank);
    snprintf(po, sizeof po, "%d", port);
    char *argv[32];
    int n = 0;
    const char *pre[] = {GL,          "--nnodes",      "2", "--nproc-per-node",
                         "2",         "--node-rank",   r,   "--master-addr",
                         "127.0.0.1", "--master-port", po,  "--shutdown-timeout",
                         "20"};
    for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++)
        argv[n++] = (char *)pre[i];
    /* the durable tier as the launcher's option (passed to the workers in
     * GPULAUNCH_CKPT_DURABLE) or as the program's own */
    if (via_launcher) {
        argv[n++] = "--checkpoint-durable";
        argv[n++] = (char *)durable;
    }
    const char *prog[] = {
        DP,       "--steps",          steps, "--global-batch",     "32",  "--print-every",
        "100000", "--checkpoint-dir", ckdir, "--checkpoint-every", "100", "--step-sleep-ms",
        sleep_ms};
    for (size_t i = 0; i < sizeof prog / sizeof prog[0]; i++)
        argv[n++] = (char *)prog[i];
    if (!via_launcher) {
        argv[n++] = "--checkpoint-durable";
        argv[n++] = (char *)durable;
    }
    argv[n] = NULL;
    cr_assert_eq(proc_start(p, argv, NULL), 0);
}

Test(preempt, a_preemption_drains_to_the_durable_tier_and_a_job_without_its_disks_resumes_from_it,
     .timeout = 240) {
    char ck0[128], ck1[128], pvc[128], ref[128], cmd[512];
    snprintf(ck0, sizeof ck0, "%s/node0-nvme", dir);
    snprintf(ck1, sizeof ck1, "%s/node1-nvme", dir);
    snprintf(pvc, sizeof pvc, "%s/pvc", dir);
    snprintf(ref, sizeof ref, "%s/ref", dir);
    proc a, b;
    int port = free_tcp_port();
    start_tiered(&b, 1, port, ck1, pvc, "300", "4", 1);
    start_tiered(&a, 0, port, ck0, pvc, "300", "4", 1);
    cr_assert(proc_expect(&b, "workers (", 10000), "%s", b.out);
    usleep(600000);
    kill(b.pid, SIGTERM);
    int sa = proc_wait(&a, 60000), sb = proc_wait(&b, 60000);
    long step = preempted_step(&a, &b, sa, sb, 300);
    /* each launcher says its node's files of that step are durable */
    char durable[128];
    snprintf(durable, sizeof durable, "checkpoint: step %ld is durable", step);
    cr_expect(strstr(a.out, durable) != NULL, "%s", a.out);
    cr_expect(strstr(b.out, durable) != NULL, "%s", b.out);
    char complete[256];
    snprintf(complete, sizeof complete, "%s/step-%012ld/COMPLETE", pvc, step);
    cr_expect(access(complete, F_OK) == 0, "no %s", complete);
    /* node 1 is replaced by one with an empty disk: its ranks fetch from the durable tier */
    snprintf(cmd, sizeof cmd, "rm -rf %s", ck1);
    cr_assert_eq(system(cmd), 0);
    port = free_tcp_port();
    start_tiered(&b, 1, port, ck1, pvc, "300", "0", 0);
    start_tiered(&a, 0, port, ck0, pvc, "300", "0", 0);
    sa = proc_wait(&a, 60000);
    sb = proc_wait(&b, 60000);
    cr_assert(WIFEXITED(sa) && WEXITSTATUS(sa) == 0, "node 0: %d %s", sa, a.out);
    cr_assert(WIFEXITED(sb) && WEXITSTATUS(sb) == 0, "node 1: %d %s", sb, b.out);
    char resumed[128];
    snprintf(resumed, sizeof resumed, "resumed from the checkpoint of step %ld", step);
    cr_expect(strstr(a.out, resumed) != NULL, "%s", a.out);
    cr_expect(strstr(b.out, "fetched from the durable tier") != NULL, "%s", b.out);
    cr_expect(strstr(a.out, "fetched from the durable tier") == NULL, "node 0 kept its disk: %s",
              a.out);
    char got[4][65], want[4][65];
    cr_assert_eq(params_sha_lines(a.out, b.out, got, 4), 4);
    /* every local disk gone: the whole job restores from the durable tier alone */
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", ck0, ck1);
    cr_assert_eq(system(cmd), 0);
    port = free_tcp_port();
    start_tiered(&b, 1, port, ck1, pvc, "300", "0", 0);
    start_tiered(&a, 0, port, ck0, pvc, "300", "0", 0);
    sa = proc_wait(&a, 60000);
    sb = proc_wait(&b, 60000);
    cr_assert(WIFEXITED(sa) && WEXITSTATUS(sa) == 0, "node 0: %d %s", sa, a.out);
    cr_expect(strstr(a.out, "resumed from the checkpoint of step 300") != NULL,
              "the finished run's last step, made durable by gpl_ckpt_wait: %s", a.out);
    /* the resumed run ends bitwise where an uninterrupted one ends */
    run_pair(ref, "300", want, 0);
    for (int r = 0; r < 4; r++)
        cr_expect_str_eq(got[r], want[r], "rank %d: resumed %s, uninterrupted %s", r, got[r],
                         want[r]);
}
