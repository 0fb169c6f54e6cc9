/* heal_bench: how fast a training job heals after a node vanishes, gpulaunch
 * against torchrun, on the fault matrix's test bed (test/netbed.h).
 *
 *   heal_bench [--skip-torchrun] [--skip-gpulaunch] [--timeout S]   (as root)
 *
 * For each launcher: hosts 1-3 run one launcher each, 2 workers of
 * examples/train_ddp.py (DDP on Gloo) per host, --nnodes 2:3, checkpoints every
 * 10 steps into a directory the hosts share; gpulaunch meets at a gpulaunch-rdzv
 * on host 0, torchrun at its c10d store on host 1. Once rank 0 has stepped in
 * the 6-rank world and a checkpoint exists, host 3 vanishes as in the fault
 * matrix: its link goes down, then every process on it is SIGKILLed. Measured
 * from the fault: when the last survivor was told (gpulaunch: `round 1 is
 * over`; torchrun: its agent's `failed (exitcode` line, printed when a worker
 * ended, i.e. when Gloo gave up on the dead peer) and when rank 0 printed
 * `first step in a world of 4`. Each launcher runs with its defaults; the
 * program's Gloo timeout is 60 s (--pg-timeout-s 60). A run that does not heal
 * within --timeout seconds (default 240) is reported as a timeout. Per-host
 * logs: <build>/test/heal-logs/<launcher>-host<i>.log. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "netbed.h"

#define GL GPL_BUILD_DIR "/launcher/gpulaunch"
#define RDZV GPL_BUILD_DIR "/rendezvous/gpulaunch-rdzv"
#define TORCH_PYTHON "/usr/bin/python3" /* Debian's python3-torch (scripts/deps.sh) */
#define TRAIN_DDP GPL_SOURCE_DIR "/examples/train_ddp.py"
#define LOGDIR GPL_BUILD_DIR "/test/heal-logs"
#define NODES 3
#define DEAD 3 /* torchrun's store lives on host 1: it must survive */
#define PORT "29400"
#define SETUP_MS 180000 /* start to a checkpoint and a step in the 6-rank world */

typedef struct result {
    const char *launcher;
    int ran, healed;
    long told_ms;  /* the last survivor told; -1 unknown */
    long first_ms; /* first step in the 4-rank world; -1 none */
    long resumed;  /* the checkpoint step rank 0 resumed from; -1 none */
    char why[160]; /* what went wrong, when it did */
} result;

static netbed bed;
static proc server, nodes[NODES + 1];
static char dir[64], token_file[128];

static void drain(void) {
    if (server.pid > 0)
        proc_expect(&server, "\x01never\x01", 1);
    for (int i = 1; i <= NODES; i++)
        if (nodes[i].pid > 0)
            proc_expect(&nodes[i], "\x01never\x01", 1);
}

/* The host whose output holds needle (survivors only when alive_only), or 0. */
static int host_with(const char *needle, int alive_only) {
    for (int i = 1; i <= NODES; i++)
        if ((!alive_only || i != DEAD) && strstr(nodes[i].out, needle) != NULL)
            return i;
    return 0;
}

static int spawn_node(int host, int torchrun, const char *ckdir) {
    char logdir[160], ep[64];
    snprintf(logdir, sizeof logdir, "%s/torchrun-logs-host%d", dir, host);
    netbed_addr(0, ep, sizeof ep);
    size_t l = strlen(ep);
    snprintf(ep + l, sizeof ep - l, ":%s", PORT);
    char *argv[64];
    int n = 0;
    if (torchrun) {
        char *tr[] = {TORCH_PYTHON, "-m", "torch.distributed.run", "--nnodes", "2:3",
                      "--nproc_per_node", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                      "host1:" PORT, "--rdzv_id", "heal", "--max_restarts", "3",
                      /* torch 1.13's torchrun fails on Python 3.11 without a log dir */
                      "--redirects", "1", "--tee", "1", "--log_dir", logdir, TRAIN_DDP, NULL};
        for (int i = 0; tr[i]; i++)
            argv[n++] = tr[i];
    } else {
        char *gl[] = {GL,           "--nnodes",       "2:3",  "--nproc-per-node",
                      "2",          "--rdzv-backend", "c10d", "--rdzv-endpoint",
                      ep,           "--rdzv-id",      "heal", "--rdzv-token-file",
                      token_file,   "--max-restarts", "3",    "--no-python",
                      TORCH_PYTHON, TRAIN_DDP,        NULL};
        for (int i = 0; gl[i]; i++)
            argv[n++] = gl[i];
    }
    char *prog[] = {"--steps",
                    "1000000",
                    "--seed",
                    "7",
                    "--print-every",
                    "1000000",
                    "--checkpoint-dir",
                    (char *)ckdir,
                    "--checkpoint-every",
                    "10",
                    "--step-sleep-ms",
                    "20",
                    "--pg-timeout-s",
                    "60",
                    NULL};
    for (int i = 0; prog[i]; i++)
        argv[n++] = prog[i];
    argv[n] = NULL;
    return netbed_spawn(&bed, host, &nodes[host], argv);
}

/* netbed_save_log appends: this run's log replaces an earlier run's. */
static void save_log(const char *name, const proc *p) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s.log", LOGDIR, name);
    if (unlink(path) != 0 && errno != ENOENT)
        fprintf(stderr, "heal_bench: cannot replace %s: %s\n", path, strerror(errno));
    netbed_save_log(&bed, name, p);
}

static void save_and_stop(const char *launcher) {
    char name[64];
    for (int i = 1; i <= NODES; i++) {
        drain();
        snprintf(name, sizeof name, "%s-host%d", launcher, i);
        save_log(name, &nodes[i]);
    }
    if (server.pid > 0) {
        snprintf(name, sizeof name, "%s-rdzv", launcher);
        save_log(name, &server);
    }
    netbed_down(&bed);
    for (int i = 1; i <= NODES; i++)
        if (nodes[i].pid > 0)
            proc_wait(&nodes[i], 5000);
    if (server.pid > 0)
        proc_wait(&server, 5000);
}

/* One launcher's run: the bed, the job, the fault, the figures. */
static void run_one(result *r, int torchrun, int timeout_s) {
    memset(&server, 0, sizeof server);
    memset(nodes, 0, sizeof nodes);
    r->launcher = torchrun ? "torchrun" : "gpulaunch";
    r->ran = 1;
    r->told_ms = r->first_ms = r->resumed = -1;
    char ckdir[128], ck10[192];
    snprintf(ckdir, sizeof ckdir, "%s/ck-%s", dir, r->launcher);
    snprintf(ck10, sizeof ck10, "%s/step-%012d/COMPLETE", ckdir, 10);
    if (netbed_up(&bed, NODES + 1, 0, 0, LOGDIR) != 0) {
        snprintf(r->why, sizeof r->why, "the test bed could not be built");
        return;
    }
    if (!torchrun) {
        char listen[64];
        netbed_addr(0, listen, sizeof listen);
        size_t l = strlen(listen);
        snprintf(listen + l, sizeof listen - l, ":%s", PORT);
        char *argv[] = {RDZV, "--listen", listen, "--token-file", token_file, NULL};
        if (netbed_spawn(&bed, 0, &server, argv) != 0 ||
            !proc_expect(&server, "listening on", 5000)) {
            snprintf(r->why, sizeof r->why, "gpulaunch-rdzv did not start: %.100s", server.out);
            goto out;
        }
    }
    for (int i = 1; i <= NODES; i++)
        if (spawn_node(i, torchrun, ckdir) != 0) {
            snprintf(r->why, sizeof r->why, "host%d's launcher did not start", i);
            goto out;
        }
    uint64_t t0 = now_ms();
    while ((access(ck10, F_OK) != 0 || !host_with("first step in a world of 6", 0)) &&
           now_ms() - t0 < SETUP_MS)
        drain();
    if (access(ck10, F_OK) != 0 || !host_with("first step in a world of 6", 0)) {
        snprintf(r->why, sizeof r->why,
                 "no step in the 6-rank world and checkpoint of step 10 within %d s (logs in "
                 "%s)",
                 SETUP_MS / 1000, LOGDIR);
        goto out;
    }
    fprintf(stderr, "heal_bench: %s trains on 3 nodes (%.1f s after the start); host%d vanishes\n",
            r->launcher, (double)(now_ms() - t0) / 1000.0, DEAD);
    uint64_t t_fault = now_ms();
    if (netbed_cut(&bed, DEAD) != 0 || netbed_kill_host(&bed, DEAD) < 3) {
        snprintf(r->why, sizeof r->why, "host%d could not be cut and killed", DEAD);
        goto out;
    }
    proc_wait(&nodes[DEAD], 5000);
    const char *told = torchrun ? "failed (exitcode" : "round 1 is over";
    int told_by[NODES + 1] = {0};
    while (now_ms() - t_fault < (uint64_t)timeout_s * 1000) {
        drain();
        uint64_t t = now_ms() - t_fault;
        for (int i = 1; i <= NODES; i++)
            if (i != DEAD && !told_by[i] && strstr(nodes[i].out, told) != NULL) {
                told_by[i] = 1;
                r->told_ms = (long)t; /* the last survivor's */
            }
        if (host_with("first step in a world of 4", 1)) {
            r->first_ms = (long)t;
            r->healed = 1;
            break;
        }
    }
    if (!r->healed)
        snprintf(r->why, sizeof r->why, "timeout: no step in the 4-rank world within %d s",
                 timeout_s);
    for (int i = 1; i <= NODES; i++)
        if (i != DEAD && !told_by[i])
            r->told_ms = -1; /* not every survivor said so */
    int h = host_with("resumed from the checkpoint of step ", 1);
    if (h) {
        const char *s = strstr(nodes[h].out, "resumed from the checkpoint of step ");
        r->resumed = strtol(s + strlen("resumed from the checkpoint of step "), NULL, 10);
    }
out:
    save_and_stop(r->launcher);
}

static void cell(char *buf, size_t len, long ms) {
    if (ms < 0)
        snprintf(buf, len, "-");
    else
        snprintf(buf, len, "%.1f s", (double)ms / 1000.0);
}

int main(int argc, char **argv) {
    int skip_torchrun = 0, skip_gpulaunch = 0, timeout_s = 240, rc = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--skip-torchrun") == 0)
            skip_torchrun = 1;
        else if (strcmp(argv[i], "--skip-gpulaunch") == 0)
            skip_gpulaunch = 1;
        else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end != '\0' || v < 10 || v > 3600) {
                fprintf(stderr, "heal_bench: --timeout takes seconds, 10 to 3600, not '%s'\n",
                        argv[i]);
                return 2;
            }
            timeout_s = (int)v;
        } else {
            fprintf(stderr, "usage: heal_bench [--skip-torchrun] [--skip-gpulaunch] "
                            "[--timeout S] (as root)\n");
            return 2;
        }
    }
    char why[256];
    if (!netbed_available(why, sizeof why)) {
        fprintf(stderr, "heal_bench: %s\n", why);
        return 2;
    }
    if (system(TORCH_PYTHON " -c 'import torch' 2>/dev/null") != 0) {
        fprintf(stderr,
                "heal_bench: %s cannot import torch: install python3-torch "
                "(scripts/deps.sh)\n",
                TORCH_PYTHON);
        return 2;
    }
    /* the workers find the package in the source tree and the library in the
     * build tree; launchers pass their environment on */
    setenv("PYTHONPATH", GPL_SOURCE_DIR "/python", 1);
    setenv("GPULAUNCH_LIBRARY", GPL_BUILD_DIR "/runtime/libgpulaunch.so.0", 1);
    setenv("PET_PREEMPTION_SOURCE", "none", 0); /* no cloud to poll in the bed */
    if (mkdir(LOGDIR, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "heal_bench: cannot create %s: %s\n", LOGDIR, strerror(errno));
        return 1;
    }
    tmpdir_make(dir, sizeof dir, "gpl-heal");
    snprintf(token_file, sizeof token_file, "%s/token", dir);
    FILE *f = fopen(token_file, "w");
    if (f == NULL) {
        fprintf(stderr, "heal_bench: cannot write %s: %s\n", token_file, strerror(errno));
        goto out;
    }
    fputs("heal-bench-token\n", f);
    fclose(f);

    printf("heal_bench: 3 nodes x 2 workers of train_ddp.py (DDP on Gloo, 20 ms sleep a step, "
           "checkpoint every 10 steps), --nnodes 2:3;\n"
           "host%d vanishes (link cut, then kill -9 of everything on it) once a checkpoint "
           "exists\n",
           DEAD);
    printf("settings: gpulaunch defaults (c10d against gpulaunch-rdzv on host0): heartbeat "
           "every 1 s, timeout 5 s; last call 30 s; --max-restarts 3\n"
           "          torchrun defaults (c10d store on host1): keep-alive every 5 s, dead "
           "after 3 missed; last call 30 s; --max_restarts 3\n"
           "          the program's Gloo timeout 60 s (--pg-timeout-s 60)\n");
    fflush(stdout);
    result res[2];
    memset(res, 0, sizeof res);
    if (!skip_gpulaunch)
        run_one(&res[0], 0, timeout_s);
    if (!skip_torchrun)
        run_one(&res[1], 1, timeout_s);
    printf("\n%-10s  %-8s  %-32s  %s\n", "launcher", "told", "first step in the smaller world",
           "resumed from");
    rc = 0;
    for (int i = 0; i < 2; i++) {
        const result *r = &res[i];
        if (!r->ran)
            continue;
        char t[32], s[32], from[32];
        cell(t, sizeof t, r->told_ms);
        cell(s, sizeof s, r->first_ms);
        if (r->resumed >= 0)
            snprintf(from, sizeof from, "step %ld", r->resumed);
        else
            snprintf(from, sizeof from, "-");
        printf("%-10s  %-8s  %-32s  %s\n", r->launcher, t, r->healed ? s : "timeout", from);
        if (r->why[0]) {
            printf("            (%s)\n", r->why);
            rc = 1;
        }
    }
    printf("\ntold: the last survivor's gpulaunch `round 1 is over`, or torchrun's `failed "
           "(exitcode` (its worker ended when Gloo gave up on the dead peer);\n"
           "times from the fault; per-host logs in %s\n",
           LOGDIR);
out:
    tmpdir_remove(dir);
    return rc;
}
