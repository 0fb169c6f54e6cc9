/* reform_bench: live re-formation against today's restart from a checkpoint,
 * side by side on the fault matrix's test bed (test/netbed.h).
 *
 *   reform_bench [--state-mib N] [--skip-small] (as root)
 *
 * Hosts 1-3 run one gpulaunch each, 2 workers of examples/dp_train per host,
 * --nnodes 2:3, against a gpulaunch-rdzv on host 0, checkpointing every 20
 * steps into a directory the hosts share. For each state size (the small
 * model alone, then the model with --state-mib N beside it; default 1024 MiB
 * per rank) and each way (live: dp_train --reform; restart: without), three
 * faults, each on a fresh bed:
 *   kill    once the 6-rank world trains and rank 0 is 10 steps past the
 *           checkpoint of step 20, every process on host 3 is SIGKILLed (its
 *           sockets close);
 *   vanish  the same, but host 3's link is cut first (nothing closes: the
 *           survivors learn it from the heartbeats, 5 s by default);
 *   join    hosts 1-2 train in a 4-rank world; host 3's launcher starts.
 * Measured: from the survivors being told (`round 1 is over`; join: from host
 * 3's start) to rank 0's first step in the new world; the steps lost (restart:
 * the last step rank 0 completed before the fault minus the checkpoint step it
 * resumed from; live: the steps a rank redid); the bytes every rank read from
 * the checkpoint; for a live join the state copy's rate, against one loopback
 * TCP stream measured in the same run. Per-run logs in <build>/test/reform-logs/. */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "netbed.h"

#define GL GPL_BUILD_DIR "/launcher/gpulaunch"
#define RDZV GPL_BUILD_DIR "/rendezvous/gpulaunch-rdzv"
#define DP GPL_BUILD_DIR "/examples/dp_train"
#define LOGDIR GPL_BUILD_DIR "/test/reform-logs"
#define NODES 3
#define PORT "29400"
#define SETUP_MS 180000
#define HEAL_MS 120000

enum fault { F_KILL, F_VANISH, F_JOIN };
static const char *fault_name[] = {"kill", "vanish", "join"};

typedef struct result {
    int ok;
    double told_s, first_s; /* from the fault; join: told = host 3's start */
    long lost;              /* steps */
    double read_mb;         /* from the checkpoint, every rank */
    double copy_mbs;        /* a live join's copy rate */
    char why[160];
} result;

static netbed bed;
static proc server, nodes[NODES + 1];
static char dir[64];
static long state_mib = 1024;

static void drain(void) {
    if (server.pid > 0)
        proc_expect(&server, "\x01never\x01", 1);
    for (int i = 1; i <= NODES; i++)
        if (nodes[i].pid > 0)
            proc_expect(&nodes[i], "\x01never\x01", 1);
}

/* The host whose output after mark[i] holds needle, or 0. */
static int host_with(const char *needle, const size_t *mark) {
    for (int i = 1; i <= NODES; i++)
        if (strstr(nodes[i].out + (mark ? mark[i] : 0), needle) != NULL)
            return i;
    return 0;
}

static int spawn_node(int host, int live, long mib, const char *ckdir) {
    char ep[64], mibs[24];
    netbed_addr(0, ep, sizeof ep);
    size_t l = strlen(ep);
    snprintf(ep + l, sizeof ep - l, ":%s", PORT);
    snprintf(mibs, sizeof mibs, "%ld", mib);
    char *argv[64];
    int n = 0;
    char *a[] = {GL,
                 "--nnodes",
                 "2:3",
                 "--nproc-per-node",
                 "2",
                 "--rdzv-backend",
                 "c10d",
                 "--rdzv-endpoint",
                 ep,
                 "--rdzv-id",
                 "reform",
                 "--rdzv-conf",
                 "last_call_timeout=1",
                 "--max-restarts",
                 "3",
                 DP,
                 "--steps",
                 "1000000",
                 "--global-batch",
                 "48",
                 "--print-every",
                 "1",
                 "--checkpoint-dir",
                 (char *)ckdir,
                 "--checkpoint-every",
                 "20",
                 "--step-sleep-ms",
                 "20",
                 "--state-mib",
                 mibs,
                 NULL};
    for (int i = 0; a[i]; i++)
        argv[n++] = a[i];
    if (live)
        argv[n++] = "--reform";
    argv[n] = NULL;
    return netbed_spawn(&bed, host, &nodes[host], argv);
}

/* The last "step N loss" rank 0 printed before mark (N is 0-based: N + 1 done). */
static long last_step_before(const size_t *mark) {
    long best = -1;
    for (int i = 1; i <= NODES; i++) {
        const char *s = nodes[i].out;
        while ((s = strstr(s, "step ")) != NULL && (size_t)(s - nodes[i].out) < mark[i]) {
            char *end;
            long v = strtol(s + 5, &end, 10);
            if (end != s + 5 && strncmp(end, " loss", 5) == 0 && v + 1 > best)
                best = v + 1;
            s += 5;
        }
    }
    return best;
}

static double sum_after(const char *pre, const char *post, const size_t *mark) {
    double t = 0;
    for (int i = 1; i <= NODES; i++)
        for (const char *s = nodes[i].out + mark[i]; (s = strstr(s, pre)) != NULL; s++) {
            const char *v = s + strlen(pre);
            char *end;
            double x = strtod(v, &end);
            if (end != v && strncmp(end, post, strlen(post)) == 0)
                t += x;
        }
    return t;
}

static void run_one(result *r, int live, long mib, enum fault f) {
    memset(r, 0, sizeof *r);
    memset(&server, 0, sizeof server);
    memset(nodes, 0, sizeof nodes);
    char ckdir[128], name[64];
    snprintf(ckdir, sizeof ckdir, "%s/ck-%d-%ld-%d", dir, live, mib, (int)f);
    snprintf(name, sizeof name, "%s-%s-%ldMiB", live ? "live" : "restart", fault_name[f], mib);
    if (netbed_up(&bed, NODES + 1, 0, 0, LOGDIR) != 0) {
        snprintf(r->why, sizeof r->why, "the test bed could not be built");
        return;
    }
    char listen[64];
    netbed_addr(0, listen, sizeof listen);
    size_t l = strlen(listen);
    snprintf(listen + l, sizeof listen - l, ":%s", PORT);
    char *sargv[] = {RDZV, "--listen", listen, NULL};
    size_t mark[NODES + 1] = {0};
    int first = f == F_JOIN ? 2 : NODES, world = 2 * (f == F_JOIN ? NODES : NODES - 1);
    char ck1[192], in_start[40], in_new[40];
    snprintf(ck1, sizeof ck1, "%s/step-%012d/COMPLETE", ckdir, 20);
    snprintf(in_start, sizeof in_start, "first step in a world of %d", 2 * first);
    snprintf(in_new, sizeof in_new, "first step in a world of %d", world);
    if (netbed_spawn(&bed, 0, &server, sargv) != 0 || !proc_expect(&server, "listening on", 5000)) {
        snprintf(r->why, sizeof r->why, "gpulaunch-rdzv did not start");
        goto out;
    }
    for (int i = 1; i <= first; i++)
        if (spawn_node(i, live, mib, ckdir) != 0) {
            snprintf(r->why, sizeof r->why, "host%d's launcher did not start", i);
            goto out;
        }
    uint64_t t0 = now_ms();
    while ((access(ck1, F_OK) != 0 || !host_with(in_start, NULL)) && now_ms() - t0 < SETUP_MS)
        drain();
    if (access(ck1, F_OK) != 0 || !host_with(in_start, NULL)) {
        snprintf(r->why, sizeof r->why, "no checkpoint of step 20 in the %d-rank world in %d s",
                 2 * first, SETUP_MS / 1000);
        goto out;
    }
    /* the fault half-way between two checkpoints: a restart loses 10 steps
     * on average */
    for (int i = 1; i <= NODES; i++)
        mark[i] = sizeof nodes[i].out;
    while (last_step_before(mark) < 30 && now_ms() - t0 < SETUP_MS)
        drain();
    for (int i = 1; i <= NODES; i++)
        mark[i] = nodes[i].out_len;
    long before = last_step_before(mark);
    uint64_t t_fault = now_ms(), t_told = 0;
    if (f == F_JOIN) {
        t_told = t_fault;
        if (spawn_node(3, live, mib, ckdir) != 0) {
            snprintf(r->why, sizeof r->why, "host3's launcher did not start");
            goto out;
        }
    } else {
        if ((f == F_VANISH && netbed_cut(&bed, 3) != 0) || netbed_kill_host(&bed, 3) < 3) {
            snprintf(r->why, sizeof r->why, "host3 could not be cut and killed");
            goto out;
        }
        proc_wait(&nodes[3], 5000);
    }
    while (now_ms() - t_fault < HEAL_MS) {
        drain();
        if (!t_told && strstr(nodes[1].out + mark[1], "round 1 is over") &&
            strstr(nodes[2].out + mark[2], "round 1 is over"))
            t_told = now_ms();
        if (host_with(in_new, mark))
            break;
    }
    if (!host_with(in_new, mark)) {
        snprintf(r->why, sizeof r->why, "no step in the %d-rank world within %d s", world,
                 HEAL_MS / 1000);
        goto out;
    }
    uint64_t t_first = now_ms();
    usleep(300000);
    drain();
    r->ok = 1;
    r->told_s = t_told ? (double)(t_told - t_fault) / 1e3 : -1;
    r->first_s = t_told ? (double)(t_first - t_told) / 1e3 : -1;
    r->read_mb = sum_after("read ", " bytes from the checkpoint", mark) / 1e6;
    if (live) {
        r->lost = 0; /* the agreed step is the last every rank completed */
        double mbs = 0;
        int n = 0;
        for (int i = 1; i <= NODES; i++)
            for (const char *s = nodes[i].out + mark[i]; (s = strstr(s, " ms: ")) != NULL; s++) {
                mbs += strtod(s + 5, NULL);
                n++;
            }
        r->copy_mbs = n ? mbs / n : 0;
    } else {
        int h = host_with("resumed from the checkpoint of step ", mark);
        long resumed = -1;
        if (h) {
            const char *s = strstr(nodes[h].out + mark[h], "resumed from the checkpoint of step ");
            resumed = strtol(s + strlen("resumed from the checkpoint of step "), NULL, 10);
        }
        r->lost = f == F_JOIN ? before - resumed : before - resumed;
        if (resumed < 0)
            r->lost = -1;
    }
out:
    drain();
    for (int i = 1; i <= NODES; i++) {
        char nm[96];
        snprintf(nm, sizeof nm, "%s-host%d", name, i);
        char path[256];
        snprintf(path, sizeof path, "%s/%s.log", LOGDIR, nm);
        unlink(path);
        netbed_save_log(&bed, nm, &nodes[i]);
    }
    netbed_down(&bed);
    for (int i = 1; i <= NODES; i++)
        if (nodes[i].pid > 0)
            proc_wait(&nodes[i], 5000);
    if (server.pid > 0)
        proc_wait(&server, 5000);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", ckdir);
    if (system(cmd) != 0)
        fprintf(stderr, "reform_bench: cannot remove %s\n", ckdir);
}

/* ---- one loopback TCP stream, the copy's yardstick ---- */

#define STREAM_BYTES (1ull << 30)
#define STREAM_CHUNK (4u << 20)

static void *stream_sink(void *arg) {
    int fd = accept(*(int *)arg, NULL, NULL);
    char *buf = malloc(STREAM_CHUNK);
    uint64_t got = 0;
    ssize_t n;
    while (fd >= 0 && buf && got < STREAM_BYTES && (n = read(fd, buf, STREAM_CHUNK)) > 0)
        got += (uint64_t)n;
    free(buf);
    if (fd >= 0)
        close(fd);
    return NULL;
}

static double loopback_mbs(void) {
    int ls = socket(AF_INET, SOCK_STREAM, 0), fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    pthread_t t;
    char *buf = calloc(1, STREAM_CHUNK);
    double mbs = 0;
    if (ls < 0 || fd < 0 || buf == NULL || bind(ls, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(ls, 1) != 0 || getsockname(ls, (struct sockaddr *)&a, &al) != 0 ||
        pthread_create(&t, NULL, stream_sink, &ls) != 0)
        goto out;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        uint64_t t0 = now_ms(), sent = 0;
        while (sent < STREAM_BYTES) {
            ssize_t n = write(fd, buf, STREAM_CHUNK);
            if (n <= 0)
                break;
            sent += (uint64_t)n;
        }
        close(fd);
        fd = -1;
        pthread_join(t, NULL);
        uint64_t ms = now_ms() - t0;
        mbs = ms ? (double)sent / (double)ms / 1e3 : 0;
    } else {
        pthread_cancel(t);
        pthread_join(t, NULL);
    }
out:
    free(buf);
    if (fd >= 0)
        close(fd);
    if (ls >= 0)
        close(ls);
    return mbs;
}

int main(int argc, char **argv) {
    int skip_small = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--skip-small") == 0)
            skip_small = 1;
        else if (strcmp(argv[i], "--state-mib") == 0 && i + 1 < argc) {
            char *end;
            state_mib = strtol(argv[++i], &end, 10);
            if (*end || state_mib < 1 || state_mib > 8192) {
                fprintf(stderr, "reform_bench: --state-mib takes 1 to 8192, not '%s'\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: reform_bench [--state-mib N] [--skip-small] (as root)\n");
            return 2;
        }
    }
    char why[256];
    if (!netbed_available(why, sizeof why)) {
        fprintf(stderr, "reform_bench: %s\n", why);
        return 2;
    }
    setenv("PET_PREEMPTION_SOURCE", "none", 0);
    setenv("PET_SHM_MIN", "16m", 0);
    if (mkdir(LOGDIR, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "reform_bench: cannot create %s: %s\n", LOGDIR, strerror(errno));
        return 1;
    }
    tmpdir_make(dir, sizeof dir, "gpl-reform");
    double lo = loopback_mbs();
    printf("reform_bench: 3 nodes x 2 workers of dp_train, --nnodes 2:3, checkpoint every 20 "
           "steps, 20 ms a step;\none loopback TCP stream here: %.0f MB/s\n\n",
           lo);
    printf("%-8s %-7s %-9s %-10s %-12s %-6s %-12s %s\n", "way", "fault", "state", "told",
           "first step", "lost", "read (MB)", "copy (MB/s)");
    fflush(stdout);
    int rc = 0;
    long sizes[2] = {0, state_mib};
    for (int s = skip_small; s < 2; s++)
        for (int f = F_KILL; f <= F_JOIN; f++)
            for (int live = 1; live >= 0; live--) {
                result r;
                run_one(&r, live, sizes[s], (enum fault)f);
                char st[24], told[24], fs[24], lost[24], cp[48];
                snprintf(st, sizeof st, sizes[s] ? "%ld MiB" : "model", sizes[s]);
                snprintf(told, sizeof told, r.told_s >= 0 ? "%.2f s" : "-", r.told_s);
                snprintf(fs, sizeof fs, r.ok && r.first_s >= 0 ? "%.2f s" : "-", r.first_s);
                snprintf(lost, sizeof lost, r.ok && r.lost >= 0 ? "%ld" : "-", r.lost);
                if (live && f == F_JOIN && r.copy_mbs > 0)
                    snprintf(cp, sizeof cp, "%.0f (%.0f%% of the stream)", r.copy_mbs,
                             lo > 0 ? 100.0 * r.copy_mbs / lo : 0.0);
                else
                    snprintf(cp, sizeof cp, "-");
                printf("%-8s %-7s %-9s %-10s %-12s %-6s %-12.1f %s\n", live ? "live" : "restart",
                       fault_name[f], st, told, fs, lost, r.read_mb, cp);
                if (!r.ok) {
                    printf("         (%s; logs in %s)\n", r.why, LOGDIR);
                    rc = 1;
                }
                fflush(stdout);
            }
    printf("\ntold: the survivors' `round 1 is over` after the fault (join: host 3's start); "
           "first step: rank 0's first step in the new world after that\n");
    tmpdir_remove(dir);
    return rc;
}
