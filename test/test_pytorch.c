/* PyTorch end to end: examples/train_ddp.py (DistributedDataParallel on
 * Gloo, checkpointed through the gpulaunch Python package) on 2 launchers x
 * 2 workers. A preemption seen by one node (a cloud notice, a SIGTERM) makes
 * every rank save the same step, both launchers exit 143, and the restart
 * resumes there and ends with parameters bitwise equal to an uninterrupted
 * run. Skips visibly where the interpreter has no torch. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define GL GPL_BUILD_DIR "/launcher/gpulaunch"
/* Debian's python3-torch (scripts/deps.sh; the python3 first on PATH may be
 * another interpreter without torch), or GPL_TORCH_PYTHON: today's torch from
 * PyPI, in the environment scripts/torch2.sh makes */
static const char *torch_python(void) {
    const char *e = getenv("GPL_TORCH_PYTHON");
    return e && *e ? e : "/usr/bin/python3";
}
#define TORCH_PYTHON ((char *)torch_python())
#define TRAIN GPL_SOURCE_DIR "/examples/train_ddp.py"
#define STEPS 150     /* per run: a few seconds of training on 2 cores */
#define CK_EVERY "20" /* periodic checkpoints before the preemption */
#define NOTICE_AT 25  /* the preemption comes once rank 0 printed this step */

static char dir[64];

static void teardown(void) { tmpdir_remove(dir); }

static void setup(void) {
    tmpdir_make(dir, sizeof dir, "gpl-pytorch");
    cr_assert(dir[0]);
    skip_cleanup(teardown);
    /* the workers find the package in the source tree and the library in the
     * build tree (the launcher passes its environment on) */
    setenv("PYTHONPATH", GPL_SOURCE_DIR "/python", 1);
    setenv("GPULAUNCH_LIBRARY", GPL_BUILD_DIR "/runtime/libgpulaunch.so.0", 1);
}

TestSuite(pytorch, .init = setup, .fini = teardown, .timeout = 150);

/* Skips the test (visibly) unless the interpreter imports torch. */
static void require_torch(void) {
    if (access(TORCH_PYTHON, X_OK) != 0)
        skip_test("no %s: install python3-torch (scripts/deps.sh) to run the PyTorch tests",
                  TORCH_PYTHON);
    proc p;
    char *argv[] = {TORCH_PYTHON, "-c", "import torch", NULL};
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    int st = proc_wait(&p, 60000);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        /* the traceback's last line says why */
        size_t n = strlen(p.out);
        while (n > 0 && p.out[n - 1] == '\n')
            p.out[--n] = '\0';
        const char *why = strrchr(p.out, '\n');
        skip_test("%s cannot import torch (install python3-torch, scripts/deps.sh): %s",
                  TORCH_PYTHON, why ? why + 1 : p.out);
    }
}

/* Starts node `rank` of a 2 x 2 job training train_ddp.py for `steps` into
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
                    "--no-python",
                    TORCH_PYTHON,
                    TRAIN,
                    "--steps",
                    (char *)steps,
                    "--seed",
                    "11",
                    "--print-every",
                    "1",
                    "--checkpoint-dir",
                    (char *)ckdir,
                    "--checkpoint-every",
                    CK_EVERY,
                    "--step-sleep-ms",
                    (char *)sleep_ms,
                    NULL};
    cr_assert_eq(proc_start(p, argv, NULL), 0);
}

/* An uninterrupted 2 x 2 run; with resume_step >= 0 it must resume from the
 * checkpoint of that step (ckdir's newest), else from nothing. */
static void run_pair(const char *ckdir, const char *steps, char sha[][65], long resume_step) {
    proc a, b;
    int port = free_tcp_port();
    start_node(&b, 1, port, ckdir, steps, "0", "none", "");
    start_node(&a, 0, port, ckdir, steps, "0", "none", "");
    int sa = proc_wait(&a, 90000), sb = proc_wait(&b, 90000);
    cr_assert(WIFEXITED(sa) && WEXITSTATUS(sa) == 0, "node 0: status %d: %s", sa, a.out);
    cr_assert(WIFEXITED(sb) && WEXITSTATUS(sb) == 0, "node 1: status %d: %s", sb, b.out);
    if (resume_step >= 0) {
        char want[80];
        snprintf(want, sizeof want, "resumed from the checkpoint of step %ld\n", resume_step);
        cr_expect(strstr(a.out, want) != NULL, "wanted '%s': %s", want, a.out);
    } else {
        cr_expect(strstr(a.out, "resumed from") == NULL, "a fresh run resumed: %s", a.out);
    }
    int found = params_sha_lines(a.out, b.out, sha, 4);
    cr_assert_eq(found, 4, "not every rank printed its parameters:\n%s\n%s", a.out, b.out);
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
    cr_expect(step[0] > NOTICE_AT && step[0] < steps, "preempted after step %ld of %ld", step[0],
              steps);
    return step[0];
}

/* The interrupted job: node 1 sees the preemption (a cloud notice when
 * aws, else a SIGTERM to its launcher) once training runs; then the restart
 * resumes and ends bitwise where an uninterrupted run ends. */
static void preemption_case(int aws) {
    require_torch();
    char ck[128], ref[128], steps[16];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(ref, sizeof ref, "%s/ref", dir);
    snprintf(steps, sizeof steps, "%d", STEPS);
    proc fake = {0}, a, b;
    char ep[64] = "";
    if (aws) { /* no notice until the test sends SIGUSR1 */
        char *fargv[] = {"/usr/bin/env", "python3", GPL_SOURCE_DIR "/test/fake_metadata.py",
                         "--cloud",      "aws",     "--notice-after",
                         "100000",       NULL};
        cr_assert_eq(proc_start(&fake, fargv, NULL), 0);
        cr_assert(proc_expect(&fake, "listening on 127.0.0.1:", 10000), "fake metadata: %s",
                  fake.out);
        snprintf(ep, sizeof ep, "http://127.0.0.1:%d",
                 (int)strtol(strstr(fake.out, "127.0.0.1:") + 10, NULL, 10));
    }
    int port = free_tcp_port();
    uint64_t t_start = now_ms();
    start_node(&b, 1, port, ck, steps, "20", aws ? "aws" : "none", ep);
    start_node(&a, 0, port, ck, steps, "20", "none", "");
    /* past the first periodic checkpoint: every rank is in its training loop */
    char running[32];
    snprintf(running, sizeof running, "step %d loss", NOTICE_AT);
    cr_assert(proc_expect(&a, running, 90000), "training did not get going: %s", a.out);
    uint64_t t0 = now_ms();
    cr_log_info("%s: 4 ranks of train_ddp.py at step %d %llu ms after the launchers started",
                aws ? "aws" : "sigterm", NOTICE_AT, (unsigned long long)(t0 - t_start));
    if (aws)
        kill(fake.pid, SIGUSR1);
    else
        kill(b.pid, SIGTERM);
    int sa = proc_wait(&a, 60000), sb = proc_wait(&b, 60000);
    uint64_t stopped = now_ms() - t0;
    if (aws) {
        proc_kill(&fake, SIGTERM);
        proc_wait(&fake, 5000);
    }
    long step = preempted_step(&a, &b, sa, sb, STEPS);
    cr_log_info("%s: every rank saved step %ld; both launchers exited 143 %llu ms after the %s",
                aws ? "aws" : "sigterm", step, (unsigned long long)stopped,
                aws ? "notice was due" : "SIGTERM");
    cr_expect(strstr(b.out, aws ? "gpulaunch: preemption (" : "SIGTERM on ") != NULL,
              "node 1 did not log the preemption: %s", b.out);
    char complete[256];
    snprintf(complete, sizeof complete, "%s/step-%012ld/COMPLETE", ck, step);
    cr_expect(access(complete, F_OK) == 0, "no %s", complete);
    /* the restart resumes from that step and ends where an uninterrupted run ends */
    char got[4][65], want[4][65];
    uint64_t t1 = now_ms();
    run_pair(ck, steps, got, step);
    uint64_t t2 = now_ms();
    run_pair(ref, steps, want, -1);
    for (int r = 0; r < 4; r++)
        cr_expect_str_eq(got[r], want[r], "rank %d: resumed %s, uninterrupted %s", r, got[r],
                         want[r]);
    cr_log_info("%s: the restart ran %d steps in %llu ms, the uninterrupted run %d in %llu ms; "
                "parameters bitwise equal on all 4 ranks",
                aws ? "aws" : "sigterm", STEPS - (int)step, (unsigned long long)(t2 - t1), STEPS,
                (unsigned long long)(now_ms() - t2));
}

Test(pytorch, aws_notice_on_one_node_same_step_and_bitwise_resume) { preemption_case(1); }

Test(pytorch, sigterm_to_one_launcher_same_step_and_bitwise_resume) { preemption_case(0); }

/* A spot notice while the workers still import torch (here held 3 s longer,
 * as a slow import on a loaded node is): no Checkpointer exists yet, and a
 * SIGTERM would end them with nothing saved. The launchers hold the stop
 * until every worker's Checkpointer is in place, then every rank saves the
 * same step and both launchers exit 143. */
Test(pytorch, a_notice_during_the_import_waits_for_the_checkpointer, .timeout = 300) {
    require_torch();
    char ck[128];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    char *fargv[] = {"/usr/bin/env",
                     "python3",
                     GPL_SOURCE_DIR "/test/fake_metadata.py",
                     "--cloud",
                     "aws",
                     "--notice-after",
                     "0",
                     NULL};
    proc fake, n[2];
    cr_assert_eq(proc_start(&fake, fargv, NULL), 0);
    cr_assert(proc_expect(&fake, "listening on 127.0.0.1:", 10000), "fake metadata: %s", fake.out);
    char ep[64], po[16];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d",
             (int)strtol(strstr(fake.out, "127.0.0.1:") + 10, NULL, 10));
    snprintf(po, sizeof po, "%d", free_tcp_port());
    /* python -c CODE TRAIN ARGS: sleep, then run TRAIN as its own __main__ */
    char *slow = "import runpy, sys, time; time.sleep(3); sys.argv = sys.argv[1:]; "
                 "runpy.run_path(sys.argv[0], run_name='__main__')";
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
                        node ? "aws" : "none", /* node 1 sees the notice, node 0 is told */
                        "--preemption-endpoint",
                        node ? ep : "",
                        "--preemption-poll",
                        "0.2",
                        "--no-python",
                        TORCH_PYTHON,
                        "-c",
                        slow,
                        TRAIN,
                        "--steps",
                        "400",
                        "--seed",
                        "11",
                        "--print-every",
                        "1",
                        "--checkpoint-dir",
                        ck,
                        "--step-sleep-ms",
                        "20",
                        NULL};
        cr_assert_eq(proc_start(&n[node], argv, NULL), 0);
    }
    uint64_t t0 = now_ms();
    int s0 = proc_wait(&n[0], 120000), s1 = proc_wait(&n[1], 120000);
    uint64_t took = now_ms() - t0;
    proc_kill(&fake, SIGTERM);
    proc_wait(&fake, 5000);
    cr_expect(WIFEXITED(s0) && WEXITSTATUS(s0) == 143, "node 0 status %d: %s", s0, n[0].out);
    cr_expect(WIFEXITED(s1) && WEXITSTATUS(s1) == 143, "node 1 status %d: %s", s1, n[1].out);
    for (int node = 0; node < 2; node++)
        cr_expect(strstr(n[node].out, "workers cannot checkpoint yet") &&
                      strstr(n[node].out, "every worker can checkpoint now"),
                  "node %d did not hold the stop: %s", node, n[node].out);
    long step[4];
    for (int r = 0; r < 4; r++) {
        step[r] = preempted_step_line(n[0].out, n[1].out, r);
        cr_assert_geq(step[r], 0, "rank %d did not checkpoint:\n%s\n%s", r, n[0].out, n[1].out);
        cr_expect_eq(step[r], step[0], "rank %d saved step %ld, rank 0 %ld", r, step[r], step[0]);
    }
    char complete[256];
    snprintf(complete, sizeof complete, "%s/step-%012ld/COMPLETE", ck, step[0]);
    cr_expect(access(complete, F_OK) == 0, "no %s", complete);
    cr_log_info("notice before the import: every rank saved step %ld once its Checkpointer "
                "existed; both launchers exited 143 %llu ms after the start",
                step[0], (unsigned long long)took);
}
