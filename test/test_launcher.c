/* gpulaunch as a real process: the environment its workers see, static and
 * dynamic multi-node runs on loopback, restarts, exit codes and the failure
 * report, signal escalation, no orphans, whole output lines, PyTorchJob
 * environments, preflight failures, and the training example. */
#include <criterion/criterion.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define GL GPL_BUILD_DIR "/launcher/gpulaunch"
#define DP GPL_BUILD_DIR "/examples/dp_train"

static char dir[64];

static void rm_tmp(void) { tmpdir_remove(dir); }

static void mkdir_tmp(void) {
    tmpdir_make(dir, sizeof dir, "gpl-launch");
    cr_assert(dir[0]);
    skip_cleanup(rm_tmp);
}

TestSuite(launcher, .init = mkdir_tmp, .fini = rm_tmp, .timeout = 60);

static int run(proc *p, const char *const *args, int timeout_ms) {
    char *argv[40];
    int n = 0;
    argv[n++] = GL;
    for (; args[n - 1] && n < 39; n++)
        argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    cr_assert_eq(proc_start(p, argv, NULL), 0);
    return proc_wait(p, timeout_ms);
}

static char *slurp(const char *path) {
    static char buf[1 << 16];
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static const char *envval(const char *env, const char *key) {
    static char v[512];
    char pat[64];
    snprintf(pat, sizeof pat, "\n%s=", key);
    const char *p = strstr(env, pat);
    if (p == NULL)
        return NULL;
    p += strlen(pat);
    size_t n = strcspn(p, "\n");
    snprintf(v, sizeof v, "%.*s", (int)n, p);
    return v;
}

#define ENV_DUMP "echo >\"$D/env.$RANK\"; env >>\"$D/env.$RANK\""

static void check_env(int rank, int local, int world, int lws, int group, int gws) {
    char path[128];
    snprintf(path, sizeof path, "%s/env.%d", dir, rank);
    char *e = slurp(path);
    cr_assert_not_null(e, "rank %d wrote no environment", rank);
    char want[32];
#define EXPECT_INT(k, v)                                                                           \
    snprintf(want, sizeof want, "%d", (v));                                                        \
    cr_expect(envval(e, k) && strcmp(envval(e, k), want) == 0, "rank %d: %s=%s, want %s", rank, k, \
              envval(e, k) ? envval(e, k) : "(unset)", want)
    EXPECT_INT("RANK", rank);
    EXPECT_INT("LOCAL_RANK", local);
    EXPECT_INT("WORLD_SIZE", world);
    EXPECT_INT("LOCAL_WORLD_SIZE", lws);
    EXPECT_INT("GROUP_RANK", group);
    EXPECT_INT("GROUP_WORLD_SIZE", gws);
    EXPECT_INT("ROLE_RANK", rank);
    EXPECT_INT("ROLE_WORLD_SIZE", world);
    EXPECT_INT("TORCHELASTIC_RESTART_COUNT", 0);
    cr_expect_str_eq(envval(e, "ROLE_NAME"), "default");
    cr_expect_str_eq(envval(e, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
    if (lws > 1)
        cr_expect_str_eq(envval(e, "OMP_NUM_THREADS"), "1");
    cr_expect_not_null(envval(e, "MASTER_ADDR"));
    cr_expect_not_null(envval(e, "MASTER_PORT"));
    cr_expect_not_null(envval(e, "TORCHELASTIC_RUN_ID"));
    cr_expect_not_null(envval(e, "TORCHELASTIC_ERROR_FILE"));
    cr_expect_not_null(envval(e, "GPULAUNCH_RDZV_ENDPOINT"));
    cr_expect_str_eq(envval(e, "NCCL_DEBUG"), "INFO", "the user's NCCL_* are untouched");
}

Test(launcher, environment_1x4_standalone) {
    setenv("D", dir, 1);
    setenv("NCCL_DEBUG", "INFO", 1);
    proc p;
    const char *a[] = {"--standalone", "--nproc-per-node", "4", "--no-python", "/bin/sh",
                       "-c",           ENV_DUMP,           NULL};
    int st = run(&p, a, 20000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    for (int r = 0; r < 4; r++)
        check_env(r, r, 4, 4, 0, 1);
    /* every rank sees the same master */
    char path[128];
    snprintf(path, sizeof path, "%s/env.0", dir);
    char *e0 = strdup(slurp(path));
    char m0[64];
    snprintf(m0, sizeof m0, "%s", envval(e0, "MASTER_PORT"));
    snprintf(path, sizeof path, "%s/env.3", dir);
    char *e3 = slurp(path);
    cr_expect_str_eq(envval(e3, "MASTER_PORT"), m0);
    free(e0);
}

static void two_nodes(const char *const *a0, const char *const *a1) {
    proc p0, p1;
    char *argv0[40], *argv1[40];
    int n = 0;
    argv0[n++] = GL;
    for (int i = 0; a0[i]; i++)
        argv0[n++] = (char *)a0[i];
    argv0[n] = NULL;
    n = 0;
    argv1[n++] = GL;
    for (int i = 0; a1[i]; i++)
        argv1[n++] = (char *)a1[i];
    argv1[n] = NULL;
    cr_assert_eq(proc_start(&p1, argv1, NULL), 0); /* the non-master first: it must wait */
    usleep(200000);
    cr_assert_eq(proc_start(&p0, argv0, NULL), 0);
    int s0 = proc_wait(&p0, 30000), s1 = proc_wait(&p1, 30000);
    cr_expect(WIFEXITED(s0) && WEXITSTATUS(s0) == 0, "node 0 status %d: %s", s0, p0.out);
    cr_expect(WIFEXITED(s1) && WEXITSTATUS(s1) == 0, "node 1 status %d: %s", s1, p1.out);
}

Test(launcher, environment_2x2_static) {
    setenv("D", dir, 1);
    setenv("NCCL_DEBUG", "INFO", 1);
    char port[16];
    snprintf(port, sizeof port, "%d", free_tcp_port());
    const char *a0[] = {"--nnodes",
                        "2",
                        "--nproc_per_node",
                        "2",
                        "--node_rank",
                        "0",
                        "--master_addr",
                        "127.0.0.1",
                        "--master_port",
                        port,
                        "--no-python",
                        "/bin/sh",
                        "-c",
                        ENV_DUMP,
                        NULL};
    const char *a1[] = {"--nnodes",
                        "2",
                        "--nproc_per_node",
                        "2",
                        "--node_rank",
                        "1",
                        "--master_addr",
                        "127.0.0.1",
                        "--master_port",
                        port,
                        "--no-python",
                        "/bin/sh",
                        "-c",
                        ENV_DUMP,
                        NULL};
    two_nodes(a0, a1);
    for (int r = 0; r < 4; r++)
        check_env(r, r % 2, 4, 2, r / 2, 2);
    char path[128];
    snprintf(path, sizeof path, "%s/env.2", dir);
    char *e = slurp(path);
    cr_expect_str_neq(envval(e, "MASTER_PORT"), port,
                      "the workers' MASTER_PORT is not the rendezvous port");
}

Test(launcher, environment_2x2_dynamic) {
    setenv("D", dir, 1);
    setenv("NCCL_DEBUG", "INFO", 1);
    proc srv;
    int port;
    cr_assert_eq(rdzv_start(&srv, &port, NULL), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%d", port);
    const char *a[] = {"--nnodes",
                       "1:2",
                       "--nproc-per-node",
                       "2",
                       "--rdzv-backend",
                       "c10d",
                       "--rdzv-endpoint",
                       ep,
                       "--rdzv-id",
                       "dyn",
                       "--rdzv-conf",
                       "last_call_timeout=5",
                       "--no-python",
                       "/bin/sh",
                       "-c",
                       ENV_DUMP,
                       NULL};
    two_nodes(a, a);
    for (int r = 0; r < 4; r++)
        check_env(r, r % 2, 4, 2, r / 2, 2);
    proc_kill(&srv, SIGTERM);
    proc_wait(&srv, 5000);
}

Test(launcher, crash_restart_success) {
    setenv("D", dir, 1);
    proc p;
    const char *a[] = {"--standalone",
                       "--nproc-per-node",
                       "2",
                       "--max-restarts",
                       "2",
                       "--no-python",
                       "/bin/sh",
                       "-c",
                       "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ]; then "
                       "sleep 0.5; echo boom >&2; exit 3; fi; sleep 0.2; "
                       "echo ok-$TORCHELASTIC_RESTART_COUNT",
                       NULL};
    int st = run(&p, a, 20000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "restarting workers (1/2)") && strstr(p.out, "[default0]:ok-1") &&
                  strstr(p.out, "[default1]:ok-1"),
              "%s", p.out);
    /* the banner's time is the rendezvous of that round in every round, not
     * the time since the launcher started (round 2 came after a 0.5 s run) */
    const char *r2 = strstr(p.out, " round 2: ");
    const char *ms = r2 ? strstr(r2, "workers (rendezvous ") : NULL;
    cr_assert_not_null(ms, "%s", p.out);
    double t = strtod(ms + strlen("workers (rendezvous "), NULL);
    cr_expect(t >= 0 && t < 150, "round 2's rendezvous took %.1f ms: %s", t, p.out);
}

Test(launcher, restarts_exhausted_exit_code_and_report) {
    char logdir[128];
    snprintf(logdir, sizeof logdir, "%s/logs", dir);
    mkdir(logdir, 0755);
    proc p;
    const char *a[] = {"--standalone",
                       "--nproc-per-node",
                       "2",
                       "--max-restarts",
                       "1",
                       "--log-dir",
                       logdir,
                       "--no-python",
                       "/bin/sh",
                       "-c",
                       "if [ \"$RANK\" = 1 ]; then echo 'CUDA error: out of memory' >&2; exit 7; "
                       "fi; sleep 5",
                       NULL};
    uint64_t t0 = now_ms();
    int st = run(&p, a, 20000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 7, "status %d: %s", st, p.out);
    cr_expect_lt(now_ms() - t0, 4000, "the sibling was not stopped promptly");
    cr_expect(strstr(p.out, "first failure (root cause)") && strstr(p.out, "rank       : 1") &&
                  strstr(p.out, "exit code 7") && strstr(p.out, "CUDA error: out of memory"),
              "%s", p.out);
    const char *first = strstr(p.out, "job failed");
    cr_expect(first && strstr(first + 1, "job failed") == NULL, "report printed once");
    char path[256];
    snprintf(path, sizeof path, "%s/failure.json", logdir);
    char *j = slurp(path);
    cr_assert_not_null(j, "no failure.json");
    cr_expect(strstr(j, "\"rank\":1") && strstr(j, "\"exit_code\":7"), "%s", j);
}

/* How many workers could not start in each round of out ("cannot start"
 * lines after each round's banner) into per[], returning the rounds. */
static int failed_starts(const char *out, int *per, int max) {
    int n = 0;
    char line[512];
    for (const char *l = out; *l;) {
        size_t len = strcspn(l, "\n");
        snprintf(line, sizeof line, "%.*s", (int)len, l);
        l += len + (l[len] == '\n');
        if (strstr(line, ": node rank ") && n < max)
            per[n++] = 0;
        else if (n > 0 && strncmp(line, "gpulaunch: cannot start ", 24) == 0)
            per[n - 1]++;
    }
    return n;
}

/* A worker that cannot start (no descriptor left for its pipes) keeps none
 * of the launcher's descriptors: every restart fails to start as many
 * workers as the first round, not more each time (each failed start kept a
 * pipe's read end, docs/reliability.md "Launcher soak"). The descriptor limit
 * is lowered until some but not all of 8 workers start. */
Test(launcher, a_worker_that_cannot_start_keeps_no_descriptor) {
    int found = 0;
    for (int lim = 20; lim <= 80 && !found; lim += 2) {
        char sh[64];
        snprintf(sh, sizeof sh, "ulimit -n %d && exec \"$0\" \"$@\"", lim);
        char *argv[] = {"/bin/sh",
                        "-c",
                        sh,
                        GL,
                        "--standalone",
                        "--nproc-per-node",
                        "8",
                        "--max-restarts",
                        "3",
                        "--no-python",
                        "/bin/sleep",
                        "5",
                        NULL};
        proc p;
        cr_assert_eq(proc_start(&p, argv, NULL), 0);
        int st = proc_wait(&p, 30000);
        int per[8], rounds = failed_starts(p.out, per, 8);
        if (rounds == 0 || per[0] == 0 || per[0] == 8)
            continue; /* every worker started, or none did: another limit */
        found = 1;
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) != 0, "status %d: %s", st, p.out);
        cr_assert_eq(rounds, 4, "%d rounds: %s", rounds, p.out);
        for (int r = 1; r < rounds; r++)
            cr_expect_eq(per[r], per[0],
                         "ulimit -n %d: %d workers could not start in round 1, %d in round %d: "
                         "failed starts kept descriptors\n%s",
                         lim, per[0], per[r], r + 1, p.out);
        cr_log_info("ulimit -n %d: %d of 8 workers could not start in each of %d rounds", lim,
                    per[0], rounds);
    }
    cr_assert(found, "no descriptor limit from 20 to 80 let some but not all workers start");
}

Test(launcher, worker_killed_by_signal_gives_128_plus_n) {
    proc p;
    const char *a[] = {"--standalone", "--nproc-per-node", "1", "--no-python", "/bin/sh",
                       "-c",           "kill -SEGV $$",    NULL};
    int st = run(&p, a, 20000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGSEGV, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "signal 11 (SIGSEGV)") != NULL, "%s", p.out);
}

Test(launcher, sigterm_ignoring_worker_is_killed_after_timeout) {
    proc p;
    const char *a[] = {"--standalone",
                       "--nproc-per-node",
                       "2",
                       "--shutdown-timeout",
                       "1",
                       "--no-python",
                       "/bin/sh",
                       "-c",
                       "if [ \"$RANK\" = 0 ]; then sleep 0.3; exit 1; fi; trap '' TERM; "
                       "while :; do sleep 0.1; done",
                       NULL};
    uint64_t t0 = now_ms();
    int st = run(&p, a, 20000);
    uint64_t took = now_ms() - t0;
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d: %s", st, p.out);
    cr_expect(took >= 1200 && took < 4000, "took %llu ms (shutdown timeout 1 s)",
              (unsigned long long)took);
}

Test(launcher, sigterm_to_gpulaunch_is_forwarded_and_exits_143) {
    setenv("D", dir, 1);
    proc p;
    char *argv[] = {GL,
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    "--no-python",
                    "/bin/sh",
                    "-c",
                    "trap 'echo got-term; exit 0' TERM; echo up; while :; do sleep 0.05; done",
                    NULL};
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    cr_assert(proc_expect(&p, "[default1]:up", 5000), "%s", p.out);
    cr_assert(proc_expect(&p, "[default0]:up", 5000), "%s", p.out);
    kill(p.pid, SIGTERM);
    int st = proc_wait(&p, 10000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 143, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "[default0]:got-term") && strstr(p.out, "[default1]:got-term"), "%s",
              p.out);
}

/* Running, not a zombie waiting for init to reap it. */
static int alive(pid_t pid) {
    if (kill(pid, 0) != 0)
        return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    char *st = slurp(path);
    const char *rp = st ? strrchr(st, ')') : NULL;
    return !(rp && (rp[2] == 'Z' || rp[2] == 'X'));
}

Test(launcher, hosts_the_rendezvous_without_dying_of_sigpipe) {
    proc p;
    char *argv[] = {GL,        "--standalone", "--nproc-per-node", "1", "--no-python",
                    "/bin/sh", "-c",           "echo up; sleep 5", NULL};
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    cr_assert(proc_expect(&p, "[default0]:up", 5000), "%s", p.out);
    cr_expect_eq(proc_ignores(p.pid, SIGPIPE), 1, "gpulaunch does not ignore SIGPIPE");
    kill(p.pid, SIGINT);
    proc_wait(&p, 10000);
}

Test(launcher, kill_9_of_gpulaunch_leaves_no_worker) {
    setenv("D", dir, 1);
    proc p;
    char *argv[] = {GL,
                    "--standalone",
                    "--nproc-per-node",
                    "3",
                    "--no-python",
                    "/bin/sh",
                    "-c",
                    "echo $$ > \"$D/pid.$RANK\"; echo up; exec sleep 100",
                    NULL};
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    for (int r = 0; r < 3; r++) {
        char want[32];
        snprintf(want, sizeof want, "[default%d]:up", r);
        cr_assert(proc_expect(&p, want, 5000), "%s", p.out);
    }
    pid_t pids[3];
    for (int r = 0; r < 3; r++) {
        char path[128];
        snprintf(path, sizeof path, "%s/pid.%d", dir, r);
        pids[r] = (pid_t)strtol(slurp(path), NULL, 10);
        cr_assert_gt(pids[r], 0);
    }
    kill(p.pid, SIGKILL);
    proc_wait(&p, 5000);
    usleep(500000);
    for (int r = 0; r < 3; r++)
        cr_expect(!alive(pids[r]), "worker %d (pid %d) outlived gpulaunch", r, pids[r]);
}

Test(launcher, fast_output_never_mixes_half_lines) {
    proc p;
    const char *a[] = {"--standalone",
                       "--nproc-per-node",
                       "4",
                       "--no-python",
                       "/bin/sh",
                       "-c",
                       "i=0; while [ $i -lt 3000 ]; do "
                       "echo \"R$RANK-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-$i\"; "
                       "i=$((i+1)); done",
                       NULL};
    char *argv[16];
    int n = 0;
    argv[n++] = GL;
    for (int i = 0; a[i]; i++)
        argv[n++] = (char *)a[i];
    argv[n] = NULL;
    /* read everything: the harness buffer keeps only a tail, so count as we go */
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    char line[512];
    size_t ll = 0;
    int lines = 0, bad = 0;
    for (;;) {
        char buf[65536];
        ssize_t r = read(p.out_fd, buf, sizeof buf);
        if (r <= 0)
            break;
        for (ssize_t i = 0; i < r; i++) {
            if (buf[i] != '\n') {
                if (ll < sizeof line - 1)
                    line[ll++] = buf[i];
                continue;
            }
            line[ll] = 0;
            ll = 0;
            int lr, rr, k;
            char tail[128];
            if (sscanf(line, "[default%d]:R%d-%127[a]-%d", &lr, &rr, tail, &k) == 4) {
                lines++;
                if (lr != rr || strlen(tail) != 53)
                    bad++;
            } else if (strncmp(line, "gpulaunch:", 10) != 0) {
                bad++;
            }
        }
    }
    int st = proc_wait(&p, 30000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    cr_expect_eq(lines, 12000);
    cr_expect_eq(bad, 0, "%d mixed or broken lines", bad);
}

Test(launcher, pytorchjob_environment_without_arguments) {
    setenv("D", dir, 1);
    setenv("NCCL_DEBUG", "INFO", 1);
    char port[16];
    snprintf(port, sizeof port, "%d", free_tcp_port());
    setenv("PET_NNODES", "1", 1);
    setenv("PET_NPROC_PER_NODE", "2", 1);
    setenv("PET_NODE_RANK", "0", 1);
    setenv("PET_MASTER_ADDR", "127.0.0.1", 1);
    setenv("PET_MASTER_PORT", port, 1);
    setenv("PET_NO_PYTHON", "1", 1);
    proc p;
    const char *a[] = {"/bin/sh", "-c", ENV_DUMP, NULL};
    int st = run(&p, a, 20000);
    unsetenv("PET_NNODES");
    unsetenv("PET_NPROC_PER_NODE");
    unsetenv("PET_NODE_RANK");
    unsetenv("PET_MASTER_ADDR");
    unsetenv("PET_MASTER_PORT");
    unsetenv("PET_NO_PYTHON");
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    check_env(0, 0, 2, 2, 0, 1);
    check_env(1, 1, 2, 2, 0, 1);
}

Test(launcher, preflight_fail_spawns_nothing) {
    setenv("D", dir, 1);
    proc p;
    const char *a[] = {"--standalone",         "--shm-min", "1t", "--no-python", "/bin/sh", "-c",
                       "touch \"$D/spawned\"", NULL};
    int st = run(&p, a, 20000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 3, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "FAIL /dev/shm") && strstr(p.out, "emptyDir"), "%s", p.out);
    char path[128];
    snprintf(path, sizeof path, "%s/spawned", dir);
    cr_expect(access(path, F_OK) != 0, "a worker was spawned");
    const char *b[] = {"--check", NULL};
    st = run(&p, b, 20000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "ok   /dev/shm") != NULL, "%s", p.out);
}

Test(launcher, usage_errors_exit_2) {
    proc p;
    const char *a[] = {"--nnodes", "x", "prog", NULL};
    int st = run(&p, a, 5000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d", st);
    cr_expect(strstr(p.out, "--nnodes: 'x' is not valid") != NULL, "%s", p.out);
    const char *h[] = {"--help", NULL};
    st = run(&p, h, 5000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    cr_expect(strstr(p.out, "Exit codes:") != NULL, "%s", p.out);
}

static void sha_lines(const char *out, int world, char sha[][65]) {
    for (int r = 0; r < world; r++) {
        char pat[64];
        snprintf(pat, sizeof pat, "rank %d params_sha256 ", r);
        const char *p = strstr(out, pat);
        cr_assert_not_null(p, "no hash line for rank %d: %s", r, out);
        snprintf(sha[r], 65, "%.64s", p + strlen(pat));
    }
}

Test(example, dp_train_4_ranks_matches_1_rank) {
    char f1[128], f4[128];
    snprintf(f1, sizeof f1, "%s/p1", dir);
    snprintf(f4, sizeof f4, "%s/p4", dir);
    proc p;
    const char *a4[] = {"--standalone",
                        "--nproc-per-node",
                        "4",
                        DP,
                        "--steps",
                        "60",
                        "--global-batch",
                        "32",
                        "--seed",
                        "7",
                        "--dump-params",
                        f4,
                        NULL};
    int st = run(&p, a4, 60000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "[default0]:step 59 loss ") != NULL, "%s", p.out);
    char sha[4][65];
    sha_lines(p.out, 4, sha);
    for (int r = 1; r < 4; r++)
        cr_expect_str_eq(sha[r], sha[0], "rank %d's parameters differ from rank 0's", r);
    const char *a1[] = {"--standalone",
                        "--nproc-per-node",
                        "1",
                        DP,
                        "--steps",
                        "60",
                        "--global-batch",
                        "32",
                        "--seed",
                        "7",
                        "--dump-params",
                        f1,
                        NULL};
    st = run(&p, a1, 60000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    int n;
    double worst = params_worst_rel_diff(f1, f4, &n);
    cr_assert(worst >= 0, "the parameter dumps differ in size or are missing (%d values)", n);
    cr_expect_leq(worst, 1e-5, "4 ranks differ from 1 rank by %g relative", worst);
}

Test(launcher, progress_line_then_join_timeout_names_the_missing_node) {
    char port[16];
    snprintf(port, sizeof port, "%d", free_tcp_port());
    proc p;
    const char *a[] = {"--nnodes",
                       "2",
                       "--node-rank",
                       "0",
                       "--master-addr",
                       "127.0.0.1",
                       "--master-port",
                       port,
                       "--rdzv-conf",
                       "join_timeout=4",
                       "--no-python",
                       "/bin/true",
                       NULL};
    int st = run(&p, a, 20000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 200, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "waiting for the rendezvous (2 s): 1 of 2 nodes joined; missing "
                            "node ranks 1"),
              "%s", p.out);
    cr_expect(strstr(p.out, "timed out after 4.") && strstr(p.out, "1 of 2 nodes joined"), "%s",
              p.out);
}

Test(launcher, tee_redirects_and_rank_filter) {
    char logdir[128];
    snprintf(logdir, sizeof logdir, "%s/logs", dir);
    proc p;
    const char *a[] = {"--standalone",
                       "--nproc-per-node",
                       "2",
                       "--log-dir",
                       logdir,
                       "--tee",
                       "3",
                       "--redirects",
                       "0:1",
                       "--local-ranks-filter",
                       "1",
                       "--no-python",
                       "/bin/sh",
                       "-c",
                       "echo out-$LOCAL_RANK; echo err-$LOCAL_RANK >&2",
                       NULL};
    int st = run(&p, a, 20000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    /* the console shows only local rank 1 */
    cr_expect(strstr(p.out, "[default1]:out-1") && strstr(p.out, "[default1]:err-1"), "%s", p.out);
    cr_expect(strstr(p.out, "out-0") == NULL && strstr(p.out, "err-0") == NULL, "%s", p.out);
    /* both ranks' streams are in their files */
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "cat %s/*/attempt_0/0/output.log | grep -qx out-0 && "
             "cat %s/*/attempt_0/0/output.log | grep -qx err-0 && "
             "cat %s/*/attempt_0/1/output.log | grep -qx out-1",
             logdir, logdir, logdir);
    cr_expect_eq(system(cmd), 0, "per-rank log files are missing lines");
}

static void start_rdzv_at(proc *p, const char *listen) {
    char *argv[] = {GPL_BUILD_DIR "/rendezvous/gpulaunch-rdzv", "--listen", (char *)listen, NULL};
    cr_assert_eq(proc_start(p, argv, NULL), 0);
    cr_assert(proc_expect(p, "listening on", 5000), "server: %s", p->out);
}

Test(launcher, rendezvous_server_restart_does_not_stop_training, .timeout = 90) {
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", free_tcp_port());
    proc srv, n0, n1;
    start_rdzv_at(&srv, listen);
    char *argv[] = {GL,
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "2",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    listen,
                    "--rdzv-id",
                    "restart",
                    "--rdzv-conf",
                    "last_call_timeout=10",
                    DP,
                    "--steps",
                    "500",
                    "--global-batch",
                    "32",
                    "--print-every",
                    "100000",
                    "--step-sleep-ms",
                    "6",
                    NULL};
    cr_assert_eq(proc_start(&n0, argv, NULL), 0);
    cr_assert_eq(proc_start(&n1, argv, NULL), 0);
    cr_assert(proc_expect(&n0, "workers (", 10000), "%s", n0.out);
    cr_assert(proc_expect(&n1, "workers (", 10000), "%s", n1.out);
    usleep(500000);
    kill(srv.pid, SIGKILL); /* the server dies mid-training ... */
    proc_wait(&srv, 5000);
    usleep(300000);
    start_rdzv_at(&srv, listen); /* ... and comes back on the same address */
    int s0 = proc_wait(&n0, 60000), s1 = proc_wait(&n1, 60000);
    proc_kill(&srv, SIGTERM);
    proc_wait(&srv, 5000);
    cr_expect(WIFEXITED(s0) && WEXITSTATUS(s0) == 0, "node 0 status %d: %s", s0, n0.out);
    cr_expect(WIFEXITED(s1) && WEXITSTATUS(s1) == 0, "node 1 status %d: %s", s1, n1.out);
    cr_expect(strstr(n0.out, "round 1 is over") == NULL &&
                  strstr(n1.out, "round 1 is over") == NULL,
              "the restart ended the round: %s %s", n0.out, n1.out);
    char sha[4][65];
    int found = 0;
    for (int r = 0; r < 4; r++) {
        char pat[64];
        snprintf(pat, sizeof pat, "rank %d params_sha256 ", r);
        const char *s = strstr(n0.out, pat);
        if (s == NULL)
            s = strstr(n1.out, pat);
        if (s) {
            snprintf(sha[r], 65, "%.64s", s + strlen(pat));
            found++;
        }
    }
    cr_assert_eq(found, 4, "%s %s", n0.out, n1.out);
    for (int r = 1; r < 4; r++)
        cr_expect_str_eq(sha[r], sha[0]);
}

Test(launcher, check_tries_the_rendezvous_this_node_would_join) {
    proc p;
    const char *a[] = {"--check",
                       "--nnodes",
                       "2",
                       "--node-rank",
                       "1",
                       "--master-addr",
                       "no-such-host.invalid",
                       "--rdzv-conf",
                       "join_timeout=1",
                       NULL};
    int st = run(&p, a, 20000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 3, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "FAIL the rendezvous host no-such-host.invalid does not resolve"), "%s",
              p.out);
    proc srv;
    int port;
    cr_assert_eq(rdzv_start(&srv, &port, NULL), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%d", port);
    const char *b[] = {"--check", "--nnodes",        "1:2", "--rdzv-backend",
                       "c10d",    "--rdzv-endpoint", ep,    NULL};
    st = run(&p, b, 20000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "resolves and answers") != NULL, "%s", p.out);
    proc_kill(&srv, SIGTERM);
    proc_wait(&srv, 5000);
}

/* A dynamic node of job `id` with --nnodes nn and no restarts to spend. */
static void start_elastic(proc *p, const char *ep, const char *id, const char *nn,
                          const char *steps) {
    char ck[128];
    snprintf(ck, sizeof ck, "%s/ck-%s", dir, id);
    char *argv[] = {GL,
                    "--nnodes",
                    (char *)nn,
                    "--nproc-per-node",
                    "1",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    (char *)ep,
                    "--rdzv-id",
                    (char *)id,
                    "--rdzv-conf",
                    "last_call_timeout=1",
                    "--max-restarts",
                    "0",
                    DP,
                    "--steps",
                    (char *)steps,
                    "--global-batch",
                    "32",
                    "--print-every",
                    "100000",
                    "--step-sleep-ms",
                    "5",
                    "--checkpoint-dir",
                    ck,
                    "--checkpoint-every",
                    "50",
                    NULL};
    cr_assert_eq(proc_start(p, argv, NULL), 0);
}

Test(launcher, scale_up_spends_no_restart_and_a_node_left_waiting_exits_0, .timeout = 90) {
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%d", free_tcp_port());
    proc srv, a, b;
    start_rdzv_at(&srv, ep);
    /* 1:2 nodes: a trains alone, b arrives, the round ends to take it in */
    start_elastic(&a, ep, "grow", "1:2", "800");
    cr_assert(proc_expect(&a, "round 1: node rank 0 of 1", 10000), "%s", a.out);
    start_elastic(&b, ep, "grow", "1:2", "800");
    int sa = proc_wait(&a, 60000), sb = proc_wait(&b, 60000);
    cr_expect(WIFEXITED(sa) && WEXITSTATUS(sa) == 0, "a: status %d: %s", sa, a.out);
    cr_expect(WIFEXITED(sb) && WEXITSTATUS(sb) == 0, "b: status %d: %s", sb, b.out);
    cr_expect(strstr(a.out, "not counted as a restart") != NULL, "%s", a.out);
    cr_expect(strstr(a.out, "round 2: node rank") != NULL && strstr(a.out, "of 2, ranks"), "%s",
              a.out);
    /* 1:1 node: the round is full, so a newcomer waits, and is told when the job is done */
    start_elastic(&a, ep, "full", "1:1", "300");
    cr_assert(proc_expect(&a, "round 1: node rank 0 of 1", 10000), "%s", a.out);
    start_elastic(&b, ep, "full", "1:1", "300");
    sa = proc_wait(&a, 60000);
    sb = proc_wait(&b, 10000);
    cr_expect(WIFEXITED(sa) && WEXITSTATUS(sa) == 0, "a: status %d: %s", sa, a.out);
    cr_expect(strstr(a.out, "round 1 is over") == NULL, "a full round was ended: %s", a.out);
    cr_expect(WIFEXITED(sb) && WEXITSTATUS(sb) == 0, "b: status %d: %s", sb, b.out);
    cr_expect(strstr(b.out, "finished while this node waited") != NULL, "%s", b.out);
    proc_kill(&srv, SIGTERM);
    proc_wait(&srv, 5000);
}

/* dp_train --device refuses, with exit 2 and a reason, a rank that cannot
 * average on the GPU (the CPU backend here, or a build without CUDA). */
Test(launcher, example_device_without_nccl_is_refused) {
    proc p;
    char *argv[] = {DP, "--steps", "1", "--device", NULL};
    char *envp[] = {"GPULAUNCH_BACKEND=cpu", "PATH=/usr/bin:/bin", NULL};
    cr_assert_eq(proc_start(&p, argv, envp), 0);
    int st = proc_wait(&p, 30000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "--device needs") != NULL, "%s", p.out);
}

/* ---- torchrun 2.4+ behaviour (docs/torchrun.md) ---- */

/* The variables torchrun's agent sets that gpulaunch added, the
 * ${local_rank} macro in the program's arguments, and --virtual-local-rank. */
Test(launcher, torchrun_worker_environment_and_virtual_local_rank) {
    setenv("D", dir, 1);
    setenv("NCCL_DEBUG", "INFO", 1);
    unsetenv("OMP_NUM_THREADS");
    unsetenv("CUDA_VISIBLE_DEVICES");
    proc p;
    const char *a[] = {"--standalone",
                       "--nproc-per-node",
                       "2",
                       "--no-python",
                       "/bin/sh",
                       "-c",
                       ENV_DUMP "; echo \"arg=$1\" >>\"$D/env.$RANK\"",
                       "sh",
                       "rank${local_rank}/$local_rank/$$",
                       NULL};
    int st = run(&p, a, 20000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    for (int r = 0; r < 2; r++) {
        check_env(r, r, 2, 2, 0, 1);
        char path[128], want[64];
        snprintf(path, sizeof path, "%s/env.%d", dir, r);
        char *e = slurp(path);
        cr_expect_str_eq(envval(e, "TORCHELASTIC_USE_AGENT_STORE"), "False");
        cr_expect_str_eq(envval(e, "TORCHELASTIC_SIGNALS_TO_HANDLE"),
                         "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2");
        snprintf(want, sizeof want, "%d", r);
        cr_expect_str_eq(envval(e, "GPULAUNCH_LOCAL_RANK"), want);
        cr_expect_null(envval(e, "CUDA_VISIBLE_DEVICES"));
        snprintf(want, sizeof want, "rank%d/%d/$$", r, r);
        cr_expect_str_eq(envval(e, "arg"), want, "${local_rank} and $local_rank expand, $$ stays");
    }
    /* every worker is local rank 0 of its own GPU */
    setenv("CUDA_VISIBLE_DEVICES", "5,GPU-7f3a", 1);
    const char *b[] = {"--standalone",
                       "--nproc-per-node",
                       "2",
                       "--virtual-local-rank",
                       "--signals-to-handle",
                       "SIGTERM,SIGUSR2",
                       "--no-python",
                       "/bin/sh",
                       "-c",
                       ENV_DUMP,
                       NULL};
    st = run(&p, b, 20000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    const char *dev[] = {"5", "GPU-7f3a"};
    for (int r = 0; r < 2; r++) {
        char path[128], want[16];
        snprintf(path, sizeof path, "%s/env.%d", dir, r);
        char *e = slurp(path);
        snprintf(want, sizeof want, "%d", r);
        cr_expect_str_eq(envval(e, "LOCAL_RANK"), "0");
        cr_expect_str_eq(envval(e, "RANK"), want);
        cr_expect_str_eq(envval(e, "GPULAUNCH_LOCAL_RANK"), want);
        cr_expect_str_eq(envval(e, "LOCAL_WORLD_SIZE"), "2");
        cr_expect_str_eq(envval(e, "CUDA_VISIBLE_DEVICES"), dev[r]);
        cr_expect_str_eq(envval(e, "TORCHELASTIC_SIGNALS_TO_HANDLE"), "SIGTERM,SIGUSR2");
    }
}

/* SIGUSR1 (Slurm's --signal=USR1@90) reaches every worker through the
 * launcher, which exits 128+10 once they are gone; with a list that leaves
 * it out, SIGUSR2 is forwarded and exits 128+12. */
Test(launcher, sigusr1_and_sigusr2_are_forwarded_to_workers) {
    unsetenv("SLURM_JOB_ID");
    const char *sh = "trap 'echo got-usr1; exit 0' USR1; trap 'echo got-usr2; exit 0' USR2; "
                     "echo up; while :; do sleep 0.05; done";
    struct {
        const char *list;
        int sig, code;
        const char *seen;
    } c[] = {{NULL, SIGUSR1, 138, "got-usr1"}, {"SIGTERM,SIGUSR2", SIGUSR2, 140, "got-usr2"}};
    for (int i = 0; i < 2; i++) {
        proc p;
        char *argv[12];
        int n = 0;
        argv[n++] = GL;
        argv[n++] = "--standalone";
        argv[n++] = "--nproc-per-node";
        argv[n++] = "2";
        if (c[i].list) {
            argv[n++] = "--signals-to-handle";
            argv[n++] = (char *)c[i].list;
        }
        argv[n++] = "--no-python";
        argv[n++] = "/bin/sh";
        argv[n++] = "-c";
        argv[n++] = (char *)sh;
        argv[n] = NULL;
        cr_assert_eq(proc_start(&p, argv, NULL), 0);
        cr_assert(proc_expect(&p, "[default1]:up", 5000), "%s", p.out);
        cr_assert(proc_expect(&p, "[default0]:up", 5000), "%s", p.out);
        kill(p.pid, c[i].sig); /* the launcher only: the workers hear it from it */
        int st = proc_wait(&p, 10000);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == c[i].code, "status %d: %s", st, p.out);
        char w0[32], w1[32];
        snprintf(w0, sizeof w0, "[default0]:%s", c[i].seen);
        snprintf(w1, sizeof w1, "[default1]:%s", c[i].seen);
        cr_expect(strstr(p.out, w0) && strstr(p.out, w1), "%s", p.out);
    }
}

/* --log-line-prefix-template and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, and
 * --duplicate-stdout-filters copying matching --tee'd lines to one file. */
Test(launcher, log_prefix_template_and_duplicate_filters) {
    char host[256];
    gethostname(host, sizeof host);
    char logdir[128];
    snprintf(logdir, sizeof logdir, "%s/logs", dir);
    proc p;
    const char *a[] = {"--standalone",
                       "--nproc-per-node",
                       "2",
                       "--role",
                       "trainer",
                       "--log_line_prefix_template",
                       "<${hostname}|${role_name}|${rank}|${local_rank}|${pid}|$$>",
                       "--log-dir",
                       logdir,
                       "--tee",
                       "1",
                       "--duplicate-stdout-filters",
                       "apple,or,,ange",
                       "--no-python",
                       "/bin/sh",
                       "-c",
                       "echo pid=$$; echo apple-$LOCAL_RANK; echo banana; echo or,ange; "
                       "echo apple-err >&2",
                       NULL};
    int st = run(&p, a, 20000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    for (int r = 0; r < 2; r++) {
        /* the shell's own pid is the worker's: exec'd directly */
        char want[512], pidline[300];
        snprintf(want, sizeof want, "<%s|trainer|%d|%d|", host, r, r);
        const char *at = strstr(p.out, want);
        cr_assert_not_null(at, "no '%s' in: %s", want, p.out);
        int pid = 0;
        cr_assert_eq(sscanf(at + strlen(want), "%d|$>", &pid), 1, "%s", at);
        snprintf(pidline, sizeof pidline, "%s%d|$>pid=%d", want, pid, pid);
        cr_expect(strstr(p.out, pidline), "'%s' not in: %s", pidline, p.out);
    }
    char cmd[768];
    snprintf(cmd, sizeof cmd,
             "f=$(ls %s/*/attempt_0/filtered_stdout.log) && test $(wc -l <$f) -eq 4 && "
             "grep -q 'trainer|0|0|.*apple-0$' $f && grep -q 'trainer|1|1|.*apple-1$' $f && "
             "test $(grep -c 'or,ange$' $f) -eq 2 && ! grep -q 'banana\\|apple-err' $f && "
             "test ! -e %s/*/attempt_0/filtered_stderr.log",
             logdir, logdir);
    cr_expect_eq(system(cmd), 0, "filtered_stdout.log has not exactly the matching lines");
    /* torchrun's variable, when no option is given */
    setenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${role_name}@${local_rank}> ", 1);
    const char *b[] = {"--standalone", "--no-python", "/bin/echo", "hello", NULL};
    st = run(&p, b, 20000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "default@0> hello"), "%s", p.out);
}

/* --numa-binding node: the workers' real CPU affinity and memory policy,
 * on a fake two-node topology (GPULAUNCH_SYSFS_ROOT) and on this machine's. */
#define MPOL_PY                                                                                    \
    "import ctypes, platform\n"                                                                    \
    "libc = ctypes.CDLL(None, use_errno=True)\n"                                                   \
    "nr = {'x86_64': 239, 'aarch64': 236}[platform.machine()]\n"                                   \
    "mode = ctypes.c_int(-1)\n"                                                                    \
    "mask = (ctypes.c_ulong * 16)()\n"                                                             \
    "libc.syscall(nr, ctypes.byref(mode), mask, ctypes.c_ulong(1024), ctypes.c_ulong(0), "         \
    "ctypes.c_ulong(0))\n"                                                                         \
    "print('mempolicy=%d:%d' % (mode.value, mask[0]))\n"

static const char *numa_line(int rank, const char *key) {
    char path[128];
    snprintf(path, sizeof path, "%s/numa.%d", dir, rank);
    char *e = slurp(path);
    cr_assert_not_null(e, "rank %d wrote nothing", rank);
    static char tmp[8192];
    snprintf(tmp, sizeof tmp, "\n%s", e);
    const char *v = envval(tmp, key);
    return v ? v : "(none)";
}

Test(launcher, numa_binding_sets_real_affinity_and_memory_policy) {
    cpu_set_t s;
    CPU_ZERO(&s);
    if (sched_getaffinity(0, sizeof s, &s) != 0 || !CPU_ISSET(0, &s) || !CPU_ISSET(1, &s))
        skip_test("needs CPUs 0 and 1");
    char py[160];
    snprintf(py, sizeof py, "%s/mpol.py", dir);
    FILE *f = fopen(py, "w");
    cr_assert_not_null(f);
    fputs(MPOL_PY, f);
    fclose(f);
    setenv("D", dir, 1);
    setenv("PY", py, 1);
    const char *worker = "sed -n 's/^Cpus_allowed_list:[[:space:]]*/cpus=/p' /proc/self/status "
                         ">\"$D/numa.$RANK\"; /usr/bin/python3 \"$PY\" >>\"$D/numa.$RANK\"";
    /* two GPUs on two NUMA nodes: node 0 has CPU 0, node 1 CPU 1 */
    char root[128], cmd[1024];
    snprintf(root, sizeof root, "%s/sysfs", dir);
    snprintf(cmd, sizeof cmd,
             "set -e; r=%s; for g in 0000:17:00.0=0 0000:b3:00.0=1; do b=${g%%=*}; "
             "mkdir -p $r/proc/driver/nvidia/gpus/$b $r/sys/bus/pci/devices/$b; "
             "echo ${g#*=} >$r/sys/bus/pci/devices/$b/numa_node; done; for n in 0 1; do "
             "mkdir -p $r/sys/devices/system/node/node$n; "
             "echo $n >$r/sys/devices/system/node/node$n/cpulist; done",
             root);
    cr_assert_eq(system(cmd), 0);
    setenv("GPULAUNCH_SYSFS_ROOT", root, 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("NVIDIA_VISIBLE_DEVICES");
    proc p;
    const char *a[] = {"--standalone", "--nproc-per-node", "2",  "--numa-binding", "node",
                       "--no-python",  "/bin/sh",          "-c", worker,           NULL};
    int st = run(&p, a, 20000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect_str_eq(numa_line(0, "cpus"), "0");
    cr_expect_str_eq(numa_line(1, "cpus"), "1");
    /* MPOL_PREFERRED (1) on node 0; node 1 does not exist on this machine, so
     * the kernel refuses that preference and rank 1 keeps the default */
    cr_expect_str_eq(numa_line(0, "mempolicy"), "1:1");
    cr_expect_str_eq(numa_line(1, "mempolicy"), "0:0");
    /* this machine's own sysfs: no GPU, one node; both ranks on its CPUs */
    unsetenv("GPULAUNCH_SYSFS_ROOT");
    char mine[64] = "";
    FILE *st_f = fopen("/proc/self/status", "r");
    char line[256];
    while (st_f && fgets(line, sizeof line, st_f))
        if (sscanf(line, "Cpus_allowed_list: %63s", mine) == 1)
            break;
    if (st_f)
        fclose(st_f);
    const char *c[] = {"--standalone", "--nproc-per-node", "2",  "--numa-binding", "exclusive",
                       "--no-python",  "/bin/sh",          "-c", worker,           NULL};
    st = run(&p, c, 20000);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 2 && strstr(p.out, "physical core(s)")) {
        cr_log_info("exclusive refused here (hyperthreads of one core): %s", p.out);
        return;
    }
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    char c0[64];
    snprintf(c0, sizeof c0, "%s", numa_line(0, "cpus"));
    cr_expect_str_neq(c0, numa_line(1, "cpus"), "exclusive cores");
    cr_expect_str_eq(numa_line(0, "mempolicy"), "1:1");
    cr_expect_str_eq(numa_line(1, "mempolicy"), "1:1");
    const char *d[] = {"--standalone", "--nproc-per-node", "2",  "--numa-binding", "node",
                       "--no-python",  "/bin/sh",          "-c", worker,           NULL};
    st = run(&p, d, 20000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect_str_eq(numa_line(0, "cpus"), mine);
    cr_expect_str_eq(numa_line(1, "cpus"), mine);
}

/* --bind-gpus inside a container: NVIDIA_VISIBLE_DEVICES given as host
 * indices names devices the runtime renumbered from 0, so worker i gets
 * device i; given as UUIDs, worker i gets the i-th UUID. */
Test(launcher, bind_gpus_under_the_container_runtime) {
    static const struct {
        const char *nvd, *want0, *want1;
    } c[] = {{"NVIDIA_VISIBLE_DEVICES=2,3", "CVD=0", "CVD=1"},
             {"NVIDIA_VISIBLE_DEVICES=GPU-aa,GPU-bb", "CVD=GPU-aa", "CVD=GPU-bb"}};
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        char *envp[] = {(char *)c[k].nvd,  "PATH=/usr/bin:/bin",
                        "PET_SHM_MIN=16m", "PET_PREEMPTION_SOURCE=none",
                        "PET_SLURM=off",   NULL};
        char *argv[] = {GL,
                        "--standalone",
                        "--nproc-per-node",
                        "2",
                        "--bind-gpus",
                        "--gpu-health",
                        "off",
                        "--no-python",
                        "/bin/sh",
                        "-c",
                        "echo CVD=$CUDA_VISIBLE_DEVICES",
                        NULL};
        proc p;
        cr_assert_eq(proc_start(&p, argv, envp), 0);
        int st = proc_wait(&p, 20000);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: status %d: %s", c[k].nvd, st, p.out);
        char w0[64], w1[64];
        snprintf(w0, sizeof w0, "[default0]:%s\n", c[k].want0);
        snprintf(w1, sizeof w1, "[default1]:%s\n", c[k].want1);
        cr_expect(strstr(p.out, w0) && strstr(p.out, w1), "%s: %s", c[k].nvd, p.out);
    }
}

/* ---- the c10d endpoint hosted by a launcher, as torchrun's agents do ---- */

/* A dp_train node of a 2-node (or nn) job at endpoint ep, checkpointing into
 * dir/ck-ID, with a step long enough for the job to last a few seconds. */
static void start_c10d(proc *p, const char *ep, const char *id, const char *nn, const char *steps) {
    char ck[128];
    snprintf(ck, sizeof ck, "%s/ck-%s", dir, id);
    char *argv[] = {GL,
                    "--nnodes",
                    (char *)nn,
                    "--nproc-per-node",
                    "2",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    (char *)ep,
                    "--rdzv-id",
                    (char *)id,
                    "--rdzv-conf",
                    "last_call_timeout=1,heartbeat_timeout=2",
                    "--max-restarts",
                    "3",
                    DP,
                    "--steps",
                    (char *)steps,
                    "--global-batch",
                    "32",
                    "--print-every",
                    "100000",
                    "--step-sleep-ms",
                    "5",
                    "--checkpoint-dir",
                    ck,
                    "--checkpoint-every",
                    "50",
                    NULL};
    cr_assert_eq(proc_start(p, argv, NULL), 0);
}

/* Every rank's params_sha256 in a and b equal (world ranks). */
static void same_params(const proc *a, const proc *b, int world) {
    char sha[8][65];
    int found = params_sha_lines(a->out, b ? b->out : NULL, sha, world);
    cr_assert_eq(found, world, "%s\n%s", a->out, b ? b->out : "");
    for (int r = 1; r < world; r++)
        cr_expect_str_eq(sha[r], sha[0], "rank %d", r);
}

Test(launcher, torchrun_c10d_line_hosts_its_own_rendezvous) {
    /* torchrun's tutorial line with only the word changed: nothing listens at
     * the endpoint, which names this machine, so the launcher hosts it */
    char ep[64];
    snprintf(ep, sizeof ep, "localhost:%d", free_tcp_port());
    proc p;
    uint64_t t0 = now_ms();
    const char *a[] = {"--nnodes",
                       "1",
                       "--nproc-per-node",
                       "2",
                       "--rdzv-backend",
                       "c10d",
                       "--rdzv-endpoint",
                       ep,
                       DP,
                       "--steps",
                       "50",
                       NULL};
    int st = run(&p, a, 30000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "hosting the rendezvous") != NULL, "%s", p.out);
    cr_log_info("torchrun's c10d line: done in %llu ms", (unsigned long long)(now_ms() - t0));
    same_params(&p, NULL, 2);
}

Test(launcher, two_launchers_on_one_host_one_hosts_the_other_joins, .timeout = 90) {
    char ep[64];
    snprintf(ep, sizeof ep, "localhost:%d", free_tcp_port());
    proc a, b;
    start_c10d(&a, ep, "pair", "2", "200");
    cr_assert(proc_expect(&a, "hosting the rendezvous", 10000), "%s", a.out);
    start_c10d(&b, ep, "pair", "2", "200");
    int sa = proc_wait(&a, 60000), sb = proc_wait(&b, 60000);
    cr_expect(WIFEXITED(sa) && WEXITSTATUS(sa) == 0, "host status %d: %s", sa, a.out);
    cr_expect(WIFEXITED(sb) && WEXITSTATUS(sb) == 0, "joiner status %d: %s", sb, b.out);
    cr_expect(strstr(b.out, "the port is taken on this machine; joining whoever holds it"), "%s",
              b.out);
    same_params(&a, &b, 4);
}

Test(launcher, the_hosting_launcher_killed_and_back_the_job_trains_on, .timeout = 120) {
    /* the host's pod dies (its launcher and workers killed) and its
     * replacement starts with the same command: it hosts again, the survivor
     * re-attaches, the job resumes from its checkpoint and finishes */
    char ep[64];
    snprintf(ep, sizeof ep, "localhost:%d", free_tcp_port());
    proc a, b, a2;
    start_c10d(&a, ep, "phoenix", "2", "1500");
    cr_assert(proc_expect(&a, "hosting the rendezvous", 10000), "%s", a.out);
    start_c10d(&b, ep, "phoenix", "2", "1500");
    cr_assert(proc_expect(&b, "workers (", 15000), "%s", b.out);
    usleep(1500000);
    kill(a.pid, SIGKILL); /* its workers follow (PDEATHSIG) */
    proc_wait(&a, 5000);
    uint64_t t_kill = now_ms();
    usleep(1000000); /* the replacement pod is scheduled */
    start_c10d(&a2, ep, "phoenix", "2", "1500");
    cr_assert(proc_expect(&a2, "hosting the rendezvous", 10000), "%s", a2.out);
    cr_assert(proc_expect(&a2, "workers (", 40000), "no new round: %s\n---\n%s", a2.out, b.out);
    uint64_t back = now_ms() - t_kill;
    int s2 = proc_wait(&a2, 90000), sb = proc_wait(&b, 90000);
    cr_expect(WIFEXITED(s2) && WEXITSTATUS(s2) == 0, "new host status %d: %s", s2, a2.out);
    cr_expect(WIFEXITED(sb) && WEXITSTATUS(sb) == 0, "survivor status %d: %s", sb, b.out);
    same_params(&a2, &b, 4);
    cr_log_info("hosting launcher killed: workers of both nodes training again %llu ms later "
                "(1 s of it the replacement's start)",
                (unsigned long long)back);
}

Test(launcher, an_unreachable_rendezvous_is_said_within_2_s_then_exit_200) {
    int port = free_tcp_port();
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%d", port);
    proc p;
    /* is_host=0: this launcher must not host it, and nothing listens there */
    char *argv[] = {GL,
                    "--nnodes",
                    "2",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    ep,
                    "--rdzv-conf",
                    "is_host=0,join_timeout=5",
                    "/bin/true",
                    NULL};
    uint64_t t0 = now_ms();
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    char want[128];
    snprintf(want, sizeof want, "connect to 127.0.0.1:%d: connection refused", port);
    cr_assert(proc_expect(&p, "not reached for", 2600), "nothing said in 2.6 s: %s", p.out);
    uint64_t said = now_ms() - t0;
    cr_assert(proc_expect(&p, "s (the join timeout", 1000), "%s", p.out);
    cr_expect(strstr(p.out, want) && strstr(p.out, ep), "%s", p.out);
    int st = proc_wait(&p, 15000);
    uint64_t gone = now_ms() - t0;
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 200, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "could not reach the rendezvous") != NULL, "%s", p.out);
    cr_expect(gone >= 4500 && gone < 9000, "exit after %llu ms (join timeout 5 s)",
              (unsigned long long)gone);
    cr_log_info("unreachable rendezvous said after %llu ms, exit 200 after %llu ms",
                (unsigned long long)said, (unsigned long long)gone);
    /* a name that does not resolve is said as well */
    proc q;
    char *bargv[] = {GL,
                     "--nnodes",
                     "2",
                     "--rdzv-backend",
                     "c10d",
                     "--rdzv-endpoint",
                     "no-such-host.invalid:29400",
                     "--rdzv-conf",
                     "join_timeout=3",
                     "/bin/true",
                     NULL};
    cr_assert_eq(proc_start(&q, bargv, NULL), 0);
    cr_assert(proc_expect(&q, "not reached for", 2600), "%s", q.out);
    cr_expect(strstr(q.out, "no-such-host.invalid"), "%s", q.out);
    st = proc_wait(&q, 15000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 200, "status %d: %s", st, q.out);
}

Test(launcher, a_program_that_cannot_run_is_refused_before_any_worker_starts) {
    char noexec[128];
    snprintf(noexec, sizeof noexec, "%s/data.txt", dir);
    FILE *f = fopen(noexec, "w");
    cr_assert(f);
    fputs("not a program\n", f);
    fclose(f);
    char script[128];
    snprintf(script, sizeof script, "%s/missing_train.py", dir);
    struct {
        const char *prog, *want;
    } cases[] = {
        {"/no/such/prog",
         "cannot run the program /no/such/prog: No such file or directory (ENOENT)"},
        {noexec, "Permission denied (EACCES)"},
        {"no-such-command-anywhere", "it is not on PATH"},
        {script, "cannot run the script"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        proc p;
        const char *a[] = {"--standalone", "--nproc-per-node", "2", cases[i].prog, NULL};
        int st = run(&p, a, 10000);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "%s: status %d: %s", cases[i].prog, st,
                  p.out);
        cr_expect(strstr(p.out, cases[i].want) && strstr(p.out, "nothing was started"), "%s: %s",
                  cases[i].prog, p.out);
        cr_expect(strstr(p.out, "workers (") == NULL, "workers started: %s", p.out);
    }
}

Test(launcher, elastic_pytorchjob_environment_worker_0_hosts, .timeout = 90) {
    /* what the training operator gives every pod of an elastic PyTorchJob,
     * with no server: the endpoint is worker-0's name (this host here, so
     * both pods run on it: one hosts, the other finds the port taken) */
    char host[256] = "", ep[300], port[16];
    gethostname(host, sizeof host - 1);
    snprintf(port, sizeof port, "%d", free_tcp_port());
    snprintf(ep, sizeof ep, "%s:%s", host, port);
    setenv("PET_RDZV_BACKEND", "c10d", 1);
    setenv("PET_RDZV_ENDPOINT", ep, 1);
    setenv("PET_NNODES", "1:2", 1);
    setenv("PET_RDZV_ID", "llm-elastic", 1);
    setenv("PET_MAX_RESTARTS", "3", 1);
    setenv("PET_NPROC_PER_NODE", "2", 1);
    setenv("PET_RDZV_CONF", "last_call_timeout=2", 1);
    setenv("PYTHONUNBUFFERED", "1", 1);
    char *argv[] = {GL,
                    DP,
                    "--steps",
                    "300",
                    "--global-batch",
                    "32",
                    "--print-every",
                    "100000",
                    "--step-sleep-ms",
                    "3",
                    NULL};
    proc a, b;
    cr_assert_eq(proc_start(&a, argv, NULL), 0);
    cr_assert(proc_expect(&a, "hosting the rendezvous of job llm-elastic", 10000), "%s", a.out);
    cr_assert_eq(proc_start(&b, argv, NULL), 0);
    int sa = proc_wait(&a, 60000), sb = proc_wait(&b, 60000);
    const char *vars[] = {"PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_NNODES",
                          "PET_RDZV_ID",      "PET_MAX_RESTARTS",  "PET_NPROC_PER_NODE",
                          "PET_RDZV_CONF",    "PYTHONUNBUFFERED"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    cr_expect(WIFEXITED(sa) && WEXITSTATUS(sa) == 0, "worker-0 status %d: %s", sa, a.out);
    cr_expect(WIFEXITED(sb) && WEXITSTATUS(sb) == 0, "worker-1 status %d: %s", sb, b.out);
    cr_expect(strstr(b.out, "the port is taken on this machine"), "%s", b.out);
    /* both nodes in one world of 4 (b joined during round 1's last call, or
     * scaled it up): the final parameters of the last round agree */
    cr_expect(strstr(a.out, "of 4") || strstr(b.out, "of 4"), "%s\n%s", a.out, b.out);
    same_params(&a, &b, 4);
}
