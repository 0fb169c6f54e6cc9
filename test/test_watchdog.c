/* The hang watchdog (--progress-timeout) on real launchers and workers: a
 * rank stopped with SIGSTOP, one in an endless loop, one blocked in a
 * collective because its peer on another node was stopped, a shell script
 * that reports through the pipe, the auto timeout, and programs that never
 * report. Each is named within the timeout + 1 s and the job restarts. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define GL GPL_BUILD_DIR "/launcher/gpulaunch"
#define DP GPL_BUILD_DIR "/examples/dp_train"
#define PY "/usr/bin/python3"

static char dir[64];

static void teardown(void) { tmpdir_remove(dir); }

static void setup(void) {
    tmpdir_make(dir, sizeof dir, "gpl-watchdog");
    cr_assert(dir[0]);
    skip_cleanup(teardown);
}

TestSuite(watchdog, .init = setup, .fini = teardown, .timeout = 120);

static pid_t wait_worker(pid_t parent, int rank) {
    for (int i = 0; i < 200; i++) {
        char want[32];
        snprintf(want, sizeof want, "RANK=%d", rank);
        pid_t p = proc_find(parent, want, NULL);
        if (p)
            return p;
        usleep(20000);
    }
    return 0;
}

static double since_s(uint64_t t0) { return (double)(now_ms() - t0) / 1000.0; }

Test(watchdog, stopped_rank_named_and_job_restarts) {
    proc p;
    char ck[128];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    char *argv[] = {GL,
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    "--progress-timeout",
                    "2",
                    "--max-restarts",
                    "1",
                    DP,
                    "--steps",
                    "600",
                    "--step-sleep-ms",
                    "10",
                    "--print-every",
                    "50",
                    "--checkpoint-dir",
                    ck,
                    "--checkpoint-every",
                    "50",
                    NULL};
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    cr_assert(proc_expect(&p, "round 1", 20000), "%s", p.out);
    usleep(1000000); /* training (its stdout is a pipe: block-buffered, not seen yet) */
    pid_t w = wait_worker(p.pid, 1);
    cr_assert(w > 0, "worker of rank 1 not found: %s", p.out);
    kill(w, SIGSTOP);
    uint64_t t0 = now_ms();
    int named = proc_expect(&p, "hung: no progress", 10000);
    double took = since_s(t0);
    cr_assert(named, "the stopped rank was not named: %s", p.out);
    cr_expect(took <= 2.0 + 1.0, "named %.2f s after SIGSTOP (timeout 2 s)", took);
    cr_expect(strstr(p.out, "rank 1 (node") != NULL, "the wrong rank was named: %s", p.out);
    char pidstr[32];
    snprintf(pidstr, sizeof pidstr, "pid %d)", (int)w);
    cr_expect(strstr(p.out, pidstr) != NULL, "its pid is not named: %s", p.out);
    int st = proc_wait(&p, 60000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "round 2") != NULL, "no restart: %s", p.out);
    cr_log_info("stopped rank named %.2f s after SIGSTOP (timeout 2 s)", took);
}

/* A Python rank in an endless loop: named, its stack printed (faulthandler
 * on the launcher's signal), killed; the restarted job finishes. */
Test(watchdog, python_endless_loop_named_with_its_stack) {
#ifdef GPL_SANITIZED
    skip_test("a sanitized libgpulaunch cannot be loaded into %s (the plain build runs this)", PY);
#endif
    if (access(PY, X_OK) != 0)
        skip_test("%s is missing", PY);
    char prog[128];
    snprintf(prog, sizeof prog, "%s/loop.py", dir);
    FILE *f = fopen(prog, "w");
    cr_assert_not_null(f);
    fputs("import os, time\n"
          "import gpulaunch\n"
          "def spin_forever():\n"
          "    x = 0\n"
          "    while True:\n"
          "        x += 1\n"
          "first = os.environ['TORCHELASTIC_RESTART_COUNT'] == '0'\n"
          "for step in range(1, 41):\n"
          "    gpulaunch.progress(step)\n"
          "    time.sleep(0.02)\n"
          "    if first and step == 20 and os.environ['RANK'] == '0':\n"
          "        print('spinning', flush=True)\n"
          "        spin_forever()\n"
          "print('rank', os.environ['RANK'], 'finished', flush=True)\n",
          f);
    fclose(f);
    char pp[256];
    snprintf(pp, sizeof pp, "PYTHONPATH=%s/python", GPL_SOURCE_DIR);
    char lib[256];
    snprintf(lib, sizeof lib, "GPULAUNCH_LIBRARY=%s/runtime/libgpulaunch.so.0", GPL_BUILD_DIR);
    char *env[] = {pp,  lib, "PATH=/usr/bin:/bin", "PET_SHM_MIN=16m", "PET_PREEMPTION_SOURCE=none",
                   NULL};
    char *argv[] = {GL,
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    "--progress-timeout",
                    "1.5",
                    "--max-restarts",
                    "1",
                    "--no-python",
                    PY,
                    prog,
                    NULL};
    proc p;
    cr_assert_eq(proc_start(&p, argv, env), 0);
    cr_assert(proc_expect(&p, "spinning", 30000), "%s", p.out);
    uint64_t t0 = now_ms();
    int named = proc_expect(&p, "hung: no progress", 10000);
    double took = since_s(t0);
    cr_assert(named, "%s", p.out);
    cr_expect(took <= 1.5 + 1.0 + 0.5, "named %.2f s after the loop began (timeout 1.5 s)", took);
    cr_expect(proc_expect(&p, "in spin_forever", 5000), "no stack: %s", p.out);
    int st = proc_wait(&p, 60000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "rank 0 finished") && strstr(p.out, "rank 1 finished"), "%s", p.out);
    cr_log_info("endless loop named %.2f s after it began (timeout 1.5 s)", took);
}

/* Two nodes, one worker each: rank 1 stopped, rank 0 blocked in the
 * all-reduce waiting for it. Node 1 names rank 1; node 0 does not blame its
 * own rank; both restart and finish. */
Test(watchdog, rank_blocked_in_collective_is_not_blamed) {
    int port = free_tcp_port();
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    proc n[2];
    for (int i = 0; i < 2; i++) {
        char *argv[] = {GL,
                        "--nnodes",
                        "2",
                        "--node-rank",
                        i ? "1" : "0",
                        "--master-addr",
                        "127.0.0.1",
                        "--master-port",
                        ps,
                        "--nproc-per-node",
                        "1",
                        "--progress-timeout",
                        "2",
                        "--max-restarts",
                        "1",
                        DP,
                        "--steps",
                        "600",
                        "--step-sleep-ms",
                        "10",
                        "--print-every",
                        "50",
                        NULL};
        cr_assert_eq(proc_start(&n[i], argv, NULL), 0);
    }
    cr_assert(proc_expect(&n[0], "round 1", 30000), "%s", n[0].out);
    usleep(1000000);
    pid_t w = wait_worker(n[1].pid, 1);
    cr_assert(w > 0);
    kill(w, SIGSTOP);
    uint64_t t0 = now_ms();
    int named = proc_expect(&n[1], "hung: no progress", 10000);
    double took = since_s(t0);
    cr_assert(named, "node 1: %s\nnode 0: %s", n[1].out, n[0].out);
    cr_expect(took <= 3.0, "named %.2f s after SIGSTOP (timeout 2 s)", took);
    cr_expect(strstr(n[1].out, "rank 1 (node") != NULL, "%s", n[1].out);
    int st0 = proc_wait(&n[0], 60000), st1 = proc_wait(&n[1], 60000);
    cr_expect(WIFEXITED(st0) && WEXITSTATUS(st0) == 0, "node 0 status %d: %s", st0, n[0].out);
    cr_expect(WIFEXITED(st1) && WEXITSTATUS(st1) == 0, "node 1 status %d: %s", st1, n[1].out);
    cr_expect(strstr(n[0].out, "rank 0 (node") == NULL, "node 0 blamed its own rank: %s", n[0].out);
    cr_expect(strstr(n[0].out, "rank 1 hung") != NULL, "node 0 was not told why: %s", n[0].out);
    cr_log_info("rank stopped on node 1 named %.2f s after SIGSTOP; node 0 told", took);
}

/* Any program: a shell script reports through the pipe; with no restarts
 * left the launcher exits with the hang's own code and failure.json says so. */
Test(watchdog, shell_script_reports_through_the_pipe) {
    char prog[128], logs[128];
    snprintf(prog, sizeof prog, "%s/rep.sh", dir);
    snprintf(logs, sizeof logs, "%s/logs", dir);
    FILE *f = fopen(prog, "w");
    cr_assert_not_null(f);
    fputs("#!/bin/sh\n"
          "for i in $(seq 1 20); do echo $i > /proc/self/fd/$GPULAUNCH_PROGRESS_FD; sleep 0.05; "
          "done\n"
          "[ \"$RANK\" = 1 ] && exec sleep 100\n"
          "echo finished $RANK\n",
          f);
    fclose(f);
    chmod(prog, 0755);
    char *argv[] = {GL,
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    "--progress-timeout",
                    "1",
                    "--log-dir",
                    logs,
                    prog,
                    NULL};
    proc p;
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    uint64_t t0 = now_ms();
    int st = proc_wait(&p, 30000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 201, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "rank 1 (node") && strstr(p.out, "last step 20"), "%s", p.out);
    /* 20 steps of 50 ms, then the timeout, then the stop */
    cr_expect(since_s(t0) < 1.0 + 1.0 + 1.0 + 1.5, "took %.2f s", since_s(t0));
    char path[256], buf[512] = "";
    snprintf(path, sizeof path, "%s/failure.json", logs);
    f = fopen(path, "r");
    cr_assert_not_null(f, "no failure.json");
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    cr_expect(strstr(buf, "\"hung\":true") && strstr(buf, "\"rank\":1"), "%s", buf);
}

/* auto learns the step time, says so, and then catches a stopped rank
 * within its floor (here 1 s) + 1 s. */
Test(watchdog, auto_learns_the_step_time) {
    proc p;
    char *argv[] = {GL,
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    "--progress-timeout",
                    "auto:1",
                    "--max-restarts",
                    "1",
                    DP,
                    "--steps",
                    "600",
                    "--step-sleep-ms",
                    "10",
                    "--print-every",
                    "50",
                    NULL};
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    cr_assert(proc_expect(&p, "steps take up to", 20000), "auto said nothing: %s", p.out);
    pid_t w = wait_worker(p.pid, 0);
    cr_assert(w > 0);
    kill(w, SIGSTOP);
    uint64_t t0 = now_ms();
    int named = proc_expect(&p, "hung: no progress", 10000);
    double took = since_s(t0);
    cr_assert(named, "%s", p.out);
    cr_expect(took <= 2.0, "named %.2f s after SIGSTOP (auto, floor 1 s)", took);
    int st = proc_wait(&p, 60000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
}

/* A program that never reports is never judged, and a quiet time before a
 * rank's first sign of life is not a hang. */
Test(watchdog, programs_that_never_report_are_not_judged) {
    char *argv[] = {GL,    "--standalone", "--nproc-per-node", "2",  "--progress-timeout",
                    "0.5", "--no-python",  "/bin/sh",          "-c", "sleep 1.5; echo quiet-done",
                    NULL};
    proc p;
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    int st = proc_wait(&p, 20000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "hung") == NULL, "%s", p.out);
}

/* SIGTERM to the launcher (a preemption) while a worker is stopped and no
 * watchdog runs: the worker is continued so that it gets the SIGTERM, and
 * the launcher does not wait for the --shutdown-timeout kill. */
Test(watchdog, stopped_worker_gets_sigterm_on_preemption) {
    proc p;
    char *argv[] = {GL,
                    "--standalone",
                    "--nproc-per-node",
                    "1",
                    "--progress-timeout",
                    "0",
                    "--shutdown-timeout",
                    "20",
                    "/bin/sleep",
                    "60",
                    NULL};
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    cr_assert(proc_expect(&p, "round 1", 20000), "%s", p.out);
    pid_t w = wait_worker(p.pid, 0);
    cr_assert(w > 0, "worker of rank 0 not found: %s", p.out);
    kill(w, SIGSTOP);
    usleep(100000);
    uint64_t t0 = now_ms();
    kill(p.pid, SIGTERM);
    int st = proc_wait(&p, 30000);
    double took = since_s(t0);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 143, "status %d: %s", st, p.out);
    cr_expect(took < 5.0, "the launcher exited %.1f s after SIGTERM (--shutdown-timeout 20): %s",
              took, p.out);
}

/* auto: a beat older than the last one seen (two threads of a worker store
 * it, each with its own clock read) is no step interval: it must not be
 * learned as a step of 584 years, which turns the watchdog off. The worker
 * writes its slot itself (the documented layout), then goes quiet. */
Test(watchdog, auto_ignores_a_beat_that_goes_back) {
    char prog[128];
    snprintf(prog, sizeof prog, "%s/back.py", dir);
    FILE *f = fopen(prog, "w");
    cr_assert_not_null(f);
    fputs("import mmap, os, struct, time\n"
          "fd, slot = map(int, os.environ['GPULAUNCH_PROGRESS_SHM'].split(':'))\n"
          "m = mmap.mmap(fd, 128 * (slot + 2))\n"
          "base = 128 * (slot + 1)\n"
          "def put(off, v):\n"
          "    struct.pack_into('<Q', m, base + off, v)\n"
          "put(8, time.monotonic_ns())\n"
          "put(0, time.monotonic_ns())\n"
          "for step in range(1, 21):\n"
          "    t = time.monotonic_ns()\n"
          "    put(24, step); put(32, step); put(16, t); put(8, t)\n"
          "    time.sleep(0.3 if step == 10 else 0.02)\n"
          "    if step == 10:\n"
          "        put(8, t - 1000)\n"
          "        time.sleep(0.3)\n"
          "print('quiet', flush=True)\n"
          "time.sleep(8)\n",
          f);
    fclose(f);
    char *argv[] = {GL,
                    "--standalone",
                    "--nproc-per-node",
                    "1",
                    "--progress-timeout",
                    "auto:1",
                    "--max-restarts",
                    "0",
                    "--no-python",
                    PY,
                    prog,
                    NULL};
    proc p;
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    uint64_t t0 = now_ms();
    int st = proc_wait(&p, 30000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 201, "status %d after %.1f s: %s", st,
              since_s(t0), p.out);
    cr_expect(strstr(p.out, "steps take up to 0.") != NULL, "%s", p.out);
}

/* Checkpoint I/O has 10x the timeout: a save that never ends is a hang too
 * (named after 10 x 0.3 s), while the ranks waiting for it are not blamed. */
Test(watchdog, save_that_never_ends_is_named_after_ten_timeouts) {
#ifdef GPL_SANITIZED
    skip_test("a sanitized libgpulaunch cannot be loaded into %s (the plain build runs this)", PY);
#endif
    if (access(PY, X_OK) != 0)
        skip_test("%s is missing", PY);
    char prog[128], ck[128];
    snprintf(prog, sizeof prog, "%s/stuck_save.py", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    FILE *f = fopen(prog, "w");
    cr_assert_not_null(f);
    fputs("import os, sys, time\n"
          "import gpulaunch\n"
          "ck = gpulaunch.Checkpointer(sys.argv[1], every_steps=20)\n"
          "def save(w):\n"
          "    if os.environ['RANK'] == '1':\n"
          "        time.sleep(600)  # storage that never answers\n"
          "    with open(w.path('x'), 'w') as f:\n"
          "        f.write('x')\n"
          "for step in range(1, 41):\n"
          "    time.sleep(0.01)\n"
          "    ck.step_end(step, save)\n",
          f);
    fclose(f);
    char pp[256], lib[256];
    snprintf(pp, sizeof pp, "PYTHONPATH=%s/python", GPL_SOURCE_DIR);
    snprintf(lib, sizeof lib, "GPULAUNCH_LIBRARY=%s/runtime/libgpulaunch.so.0", GPL_BUILD_DIR);
    char *env[] = {pp,
                   lib,
                   "PATH=/usr/bin:/bin",
                   "PET_SHM_MIN=16m",
                   "PET_PREEMPTION_SOURCE=none",
                   "PET_SLURM=off",
                   NULL};
    char *argv[] = {GL,
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    "--progress-timeout",
                    "0.3",
                    "--no-python",
                    PY,
                    prog,
                    ck,
                    NULL};
    proc p;
    cr_assert_eq(proc_start(&p, argv, env), 0);
    uint64_t t0 = now_ms();
    int st = proc_wait(&p, 30000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 201, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "rank 1 (node") && strstr(p.out, "inside checkpoint I/O"), "%s", p.out);
    cr_expect(strstr(p.out, "rank 0 (node") == NULL, "the waiting rank was blamed: %s", p.out);
    cr_expect(since_s(t0) < 0.2 * 20 + 3.0 + 3.0, "took %.1f s", since_s(t0));
}
