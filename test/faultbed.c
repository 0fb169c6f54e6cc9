/* The fault matrix's bed (see faultbed.h). */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "faultbed.h"
/* Debian's python3-torch (scripts/deps.sh; the python3 first on PATH may be
 * another interpreter without torch), or GPL_TORCH_PYTHON: today's torch from
 * PyPI, in the environment scripts/torch2.sh makes */
const char *torch_python(void) {
    const char *e = getenv("GPL_TORCH_PYTHON");
    return e && *e ? e : "/usr/bin/python3";
}

netbed bed;
char dir[64], logdir[256], token_file[128], endpoint[64];
proc server, nodes[NODES + 1];

void setup_bed(const char *name, int nhosts, int delay_ms, int loss_pct) {
    char why[256];
    if (!netbed_available(why, sizeof why))
        skip_test("%s", why);
    if ((delay_ms > 0 || loss_pct > 0) && access("/dev/net/tun", R_OK | W_OK) != 0)
        skip_test("no /dev/net/tun here: the slow, lossy fabric needs TUN devices");
    tmpdir_make(dir, sizeof dir, "gpl-faults");
    skip_cleanup(teardown);
    snprintf(logdir, sizeof logdir, GPL_BUILD_DIR "/test/fault-logs/%s", name);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", logdir, logdir);
    cr_assert_eq(system(cmd), 0);
    snprintf(token_file, sizeof token_file, "%s/token", dir);
    FILE *f = fopen(token_file, "w");
    cr_assert_not_null(f);
    fputs("fault-matrix-token\n", f);
    fclose(f);
    cr_assert_eq(netbed_up(&bed, nhosts, delay_ms, loss_pct, logdir), 0, "the test bed failed");
    char a[32];
    netbed_addr(RDZV_HOST, a, sizeof a);
    snprintf(endpoint, sizeof endpoint, "%s:%s", a, RDZV_PORT);
}

const char *server_probes;
const char *server_http;

void start_server(int verbose) {
    char listen[64];
    snprintf(listen, sizeof listen, "%s", endpoint);
    char *argv[] = {RDZV,
                    "--listen",
                    listen,
                    "--token-file",
                    token_file,
                    server_probes ? "--probes" : NULL,
                    (char *)server_probes,
                    NULL,
                    NULL,
                    NULL};
    if (server_http) { /* after --probes, or in its place */
        int k = server_probes ? 7 : 5;
        argv[k] = "--http";
        argv[k + 1] = (char *)server_http;
    }
    if (verbose) /* the server's log then names every join and resume */
        setenv("GPULAUNCH_LOG_LEVEL", "info", 1);
    cr_assert_eq(netbed_spawn(&bed, RDZV_HOST, &server, argv), 0);
    unsetenv("GPULAUNCH_LOG_LEVEL");
    cr_assert(proc_expect(&server, "listening on", 5000), "server: %s", server.out);
}

static proc spin[2];
static int nspin;

void start_spinners(int n) {
    char *busy[] = {"/bin/sh", "-c", "while :; do :; done", NULL};
    for (; nspin < n && nspin < 2; nspin++)
        cr_assert_eq(proc_start(&spin[nspin], busy, NULL), 0);
}

void stop_spinners(void) {
    for (; nspin > 0; nspin--) {
        proc_kill(&spin[nspin - 1], SIGKILL);
        proc_wait(&spin[nspin - 1], 5000);
    }
}

void teardown(void) {
    stop_spinners();
    netbed_down(&bed);
    if (dir[0] && !getenv("GPL_KEEP_DIR")) /* GPL_KEEP_DIR=1: kept, to look at its checkpoints */
        tmpdir_remove(dir);
}

void start_node(int host, const job_args *ja) {
    char ck[128];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    char *argv[64];
    int n = 0;
    argv[n++] = GL;
    argv[n++] = "--nnodes";
    argv[n++] = (char *)ja->nnodes;
    argv[n++] = "--nproc-per-node";
    argv[n++] = "2";
    argv[n++] = "--rdzv-backend";
    argv[n++] = "c10d";
    argv[n++] = "--rdzv-endpoint";
    argv[n++] = endpoint;
    argv[n++] = "--rdzv-id";
    argv[n++] = "matrix";
    argv[n++] = "--rdzv-token-file";
    argv[n++] = token_file;
    if (!ja->default_last_call) {
        argv[n++] = "--rdzv-conf";
        argv[n++] = "last_call_timeout=1";
    }
    argv[n++] = "--max-restarts";
    argv[n++] = "3";
    argv[n++] = "--shutdown-timeout";
    argv[n++] = "5";
    if (ja->metrics) {
        argv[n++] = "--metrics";
        argv[n++] = (char *)ja->metrics;
    }
    if (ja->progress) {
        argv[n++] = "--progress-timeout";
        argv[n++] = (char *)ja->progress;
    }
    if (ja->preempt_ep) {
        argv[n++] = "--preemption-source";
        argv[n++] = "aws";
        argv[n++] = "--preemption-endpoint";
        argv[n++] = (char *)ja->preempt_ep;
        argv[n++] = "--preemption-poll";
        argv[n++] = "0.2";
    }
    if (ja->mirror) {
        /* sharded state, copies in a peer's memory: its own few options */
        argv[n++] = SHARD;
        argv[n++] = "--params";
        argv[n++] = "262144";
        argv[n++] = "--mirror-every";
        argv[n++] = (char *)ja->mirror;
        argv[n++] = "--steps";
        argv[n++] = (char *)ja->steps;
        argv[n++] = "--step-sleep-ms";
        argv[n++] = ja->sleep_ms ? (char *)ja->sleep_ms : "0";
        argv[n++] = "--print-every";
        argv[n++] = "100000";
        if (ja->reform)
            argv[n++] = "--reform";
        argv[n] = NULL;
        cr_assert_eq(netbed_spawn(&bed, host, &nodes[host], argv), 0);
        return;
    }
    if (ja->pytorch) {
        argv[n++] = "--no-python";
        argv[n++] = TORCH_PYTHON;
        argv[n++] = TRAIN_DDP;
    } else {
        argv[n++] = DP;
        argv[n++] = "--global-batch";
        argv[n++] = "48";
    }
    argv[n++] = "--steps";
    argv[n++] = (char *)ja->steps;
    argv[n++] = "--seed";
    argv[n++] = "7";
    argv[n++] = "--print-every";
    argv[n++] = ja->print_every ? (char *)ja->print_every : "100000";
    argv[n++] = "--checkpoint-dir";
    argv[n++] = ja->ckdir ? (char *)ja->ckdir : ck;
    argv[n++] = "--checkpoint-every";
    argv[n++] = ja->ck_every ? (char *)ja->ck_every : "25";
    argv[n++] = "--step-sleep-ms";
    argv[n++] = ja->sleep_ms ? (char *)ja->sleep_ms : "0";
    if (ja->dump) {
        argv[n++] = "--dump-params";
        argv[n++] = (char *)ja->dump;
    }
    if (ja->reform)
        argv[n++] = "--reform";
    if (ja->state_mib) {
        argv[n++] = "--state-mib";
        argv[n++] = (char *)ja->state_mib;
    }
    argv[n] = NULL;
    cr_assert_eq(netbed_spawn(&bed, host, &nodes[host], argv), 0);
}

void save_logs(const char *tag) {
    char name[64];
    for (int i = 1; i <= NODES; i++) {
        snprintf(name, sizeof name, "%s-host%d", tag, i);
        netbed_save_log(&bed, name, &nodes[i]);
    }
    snprintf(name, sizeof name, "%s-rdzv", tag);
    netbed_save_log(&bed, name, &server);
}

uint64_t max_ms(const uint64_t *v, int n) {
    uint64_t m = 0;
    for (int i = 0; i < n; i++)
        m = v[i] > m ? v[i] : m;
    return m;
}

/* Waits until each listed node's output shows needle; ms[i] is when, after t0. */
int expect_all(const int *hosts, int n, const char *needle, uint64_t t0, int timeout_ms,
               uint64_t *ms) {
    int seen = 0, done[NODES + 1] = {0};
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    while (seen < n && now_ms() < deadline) {
        if (server.pid > 0)
            proc_expect(&server, "\x01never\x01", 1);
        for (int i = 0; i < n; i++) {
            if (done[i])
                continue;
            if (proc_expect(&nodes[hosts[i]], needle, 10)) {
                done[i] = 1;
                ms[i] = now_ms() - t0;
                seen++;
            }
        }
    }
    return seen;
}

/* Reads what every process of the bed has written so far: nobody blocks on a
 * full pipe while the test waits for someone else. */
void drain_all(void) {
    if (server.pid > 0)
        proc_expect(&server, "\x01never\x01", 1);
    for (int i = 1; i <= NODES; i++)
        if (nodes[i].pid > 0)
            proc_expect(&nodes[i], "\x01never\x01", 1);
}

/* Waits for the listed nodes to exit; fails the test unless each exits with code. */
void expect_exit(const int *hosts, int n, int code, int timeout_ms) {
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    int left = n, st[NODES + 1], done[NODES + 1] = {0};
    while (left > 0 && now_ms() < deadline) {
        drain_all();
        for (int i = 0; i < n; i++) {
            proc *p = &nodes[hosts[i]];
            if (!done[i] && waitpid(p->pid, &st[i], WNOHANG) == p->pid) {
                proc_expect(p, "\x01never\x01", 50);
                close(p->out_fd);
                p->pid = 0;
                done[i] = 1;
                left--;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        const proc *p = &nodes[hosts[i]];
        if (!done[i]) {
            st[i] = proc_wait(&nodes[hosts[i]], 0); /* kills it */
        }
        cr_expect(done[i] && WIFEXITED(st[i]) && WEXITSTATUS(st[i]) == code,
                  "host%d: status %d, wanted exit %d; its output ends:\n%s", hosts[i],
                  done[i] ? st[i] : -1, code,
                  p->out_len > 3000 ? p->out + p->out_len - 3000 : p->out);
    }
}

/* The final parameter hashes of ranks 0..world-1: all present and equal. */
void expect_same_params(const int *hosts, int n, int world, char out[65]) {
    char sha[16][65];
    for (int r = 0; r < world; r++) {
        char pat[64];
        snprintf(pat, sizeof pat, "rank %d params_sha256 ", r);
        const char *s = NULL;
        for (int i = 0; i < n && s == NULL; i++)
            s = strstr(nodes[hosts[i]].out, pat);
        cr_assert_not_null(s, "no final parameters from rank %d", r);
        snprintf(sha[r], 65, "%.64s", s + strlen(pat));
        cr_expect_str_eq(sha[r], sha[0], "rank %d's parameters differ from rank 0's", r);
    }
    if (out)
        snprintf(out, 65, "%s", sha[0]);
}

const int all_nodes[NODES] = {1, 2, 3, 4};

/* The example's rank 0 (on whichever node holds it) resumed from a checkpoint. */
void expect_resumed(const int *hosts, int n) {
    int resumed = 0;
    for (int i = 0; i < n; i++)
        resumed += strstr(nodes[hosts[i]].out, "resumed from the checkpoint of step") != NULL;
    cr_expect_geq(resumed, 1, "the new round did not resume from a checkpoint: %s",
                  nodes[hosts[0]].out);
}

/* Starts the four nodes and waits for round 1 everywhere. */
void start_job(const job_args *ja) {
    for (int i = 1; i <= NODES; i++)
        start_node(i, ja);
    uint64_t ms[NODES];
    int formed = expect_all(all_nodes, NODES, "round 1: node rank", now_ms(), 30000, ms);
    if (formed != NODES)
        save_logs("round-1-not-formed"); /* every node's side, the server's too */
    cr_assert_eq(formed, NODES, "round 1 did not form: %s", nodes[1].out);
}

void await_workers(int host) {
    uint64_t until = now_ms() + 30000;
    while (netbed_host_procs(&bed, host) < 3) { /* the launcher and its 2 workers */
        cr_assert(now_ms() < until, "host%d: no launcher and workers after 30 s: %s", host,
                  nodes[host].out);
        usleep(20000);
    }
}

/* A node vanishes: its link goes first (nothing it held says goodbye), then
 * every process on it is SIGKILLed. Survivors learn it from the heartbeats. */
uint64_t node_dies(int host, int survivors[NODES - 1], uint64_t *t_fault) {
    await_workers(host);
    int k = 0;
    for (int i = 1; i <= NODES; i++)
        if (i != host)
            survivors[k++] = i;
    *t_fault = now_ms();
    cr_assert_eq(netbed_cut(&bed, host), 0);
    cr_assert(netbed_kill_host(&bed, host) >= 3, "host%d had no launcher and workers", host);
    proc_wait(&nodes[host], 5000);
    uint64_t told[NODES - 1], worst = 0;
    int seen = expect_all(survivors, NODES - 1, "round 1 is over", *t_fault,
                          (HB_TIMEOUT_S + 5) * 1000, told);
    cr_assert_eq(seen, NODES - 1, "not every survivor was told: %s", nodes[survivors[0]].out);
    worst = max_ms(told, NODES - 1);
    cr_expect_leq(worst, (HB_TIMEOUT_S + 1) * 1000ull,
                  "the last survivor was told %llu ms after the node died",
                  (unsigned long long)worst);
    return worst;
}

/* Skips the test (visibly) unless the interpreter imports torch; points the
 * workers at the package in the source tree and the library in the build tree
 * (the launchers pass their environment on). */
uint64_t require_torch(void) {
    proc p;
    char *argv[] = {TORCH_PYTHON, "-c", "import torch", NULL};
    uint64_t t0 = now_ms();
    int st = access(TORCH_PYTHON, X_OK) == 0 && proc_start(&p, argv, NULL) == 0
                 ? proc_wait(&p, 60000)
                 : -1;
    uint64_t took = now_ms() - t0;
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        skip_test("%s cannot import torch: install python3-torch (scripts/deps.sh)", TORCH_PYTHON);
    setenv("PYTHONPATH", GPL_SOURCE_DIR "/python", 1);
    setenv("GPULAUNCH_LIBRARY", GPL_BUILD_DIR "/runtime/libgpulaunch.so.0", 1);
    return took;
}
