/* reform_bench: live re-formation against today's restart from a checkpoint
 * and against torchrun, side by side on the fault matrix's test bed
 * (test/netbed.h), for the C program and for a PyTorch one.
 *
 *   reform_bench [--state-mib N] [--skip-small] [--skip-large] [--skip-c]
 *                [--skip-pytorch] [--ways LIST] [--faults LIST]
 *                [--python PATH] [--pg-timeout-s S]            (as root)
 *
 * Hosts 1-3 run one launcher each, 2 workers per host, --nnodes 2:3,
 * checkpointing every 20 steps (20 ms of sleep a step) into a directory the
 * hosts share. The programs: examples/dp_train (C) and examples/train_ddp.py
 * (PyTorch DDP on Gloo, run by --python, default Debian's /usr/bin/python3).
 * The ways: live (gpulaunch against a gpulaunch-rdzv on host 0, the program
 * with --reform: the survivors keep their processes), restart (the same
 * without --reform: every worker restarts and reads the checkpoint) and,
 * for the PyTorch program, torchrun (that interpreter's torch.distributed.run,
 * its c10d store on host 1; it restarts every worker, which reads the
 * checkpoint). Both launchers have a 1 s last call; the rest is each one's
 * defaults. For each state size (the model alone, then the model with
 * --state-mib N beside it, default 1024 MiB per rank), each way and three
 * faults, each on a fresh bed:
 *   kill    once the 6-rank world trains and rank 0 is 10 steps past the
 *           checkpoint of step 20, every process on host 3 is SIGKILLed (its
 *           sockets close);
 *   vanish  the same, but host 3's link is cut first (nothing closes:
 *           gpulaunch learns it from the heartbeats, 5 s by default, torchrun
 *           from Gloo's timeout, --pg-timeout-s, default 30 s);
 *   join    hosts 1-2 train in a 4-rank world; host 3's launcher starts.
 * Measured: when the survivors were told (gpulaunch: both survivors' `round 1
 * is over`; torchrun: both agents' `failed (exitcode`, a worker ended; join:
 * host 3's start) and from then to rank 0's first step in the new world; the
 * steps lost (a restart: the last step rank 0 completed before the fault
 * minus the checkpoint step it resumed from; live: the most steps a rank
 * redid, the one whose all-reduce completed where another's failed); the
 * bytes every rank read from the checkpoint; for a live join the state
 * copy's rate (from the agreement's end to the copy's return: C's
 * gpl_copy_state, the needers' allgather and connections included; PyTorch's
 * Elastic copy, the pickled optimizer structure and gpl_copy_state; for
 * PyTorch also over the newcomer's whole Elastic.start(), making the process
 * group included), against one loopback
 * TCP stream and one stream from host 1 to host 3 over the bed's links, both
 * measured on that join's bed just before it starts. --ways and --faults take comma lists (live,
 * restart, torchrun; kill, vanish, join). Per-run logs in
 * <build>/test/reform-logs/. */
#include <arpa/inet.h>
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
#define TRAIN_DDP GPL_SOURCE_DIR "/examples/train_ddp.py"
#define TORCH_PYTHON "/usr/bin/python3" /* Debian's python3-torch (scripts/deps.sh) */
#define LOGDIR GPL_BUILD_DIR "/test/reform-logs"
#define NODES 3
#define PORT "29400"
#define SETUP_MS 180000
#define HEAL_MS 120000

enum prog { P_C, P_TORCH };
enum way { W_LIVE, W_RESTART, W_TORCHRUN };
enum fault { F_KILL, F_VANISH, F_JOIN };
static const char *prog_name[] = {"c", "pytorch"};
static const char *way_name[] = {"live", "restart", "torchrun"};
static const char *fault_name[] = {"kill", "vanish", "join"};

typedef struct job {
    enum prog prog;
    enum way way;
    long mib; /* state beside the model, per rank */
    enum fault fault;
} job;

typedef struct result {
    int ok;
    double told_s, first_s; /* from the fault; join: told = host 3's start */
    double paused_s;        /* from the survivors' round end to the first step (a join: what
                               the survivors stopped for; else first_s) */
    double fault_s;         /* the first step, from the fault */
    long lost;              /* steps */
    double read_mb;         /* from the checkpoint, every rank */
    double copy_mbs;        /* a live join's copy rate (the copy alone) */
    double start_mbs;       /* PyTorch: the same over the new rank's whole Elastic.start() */
    double lo_mbs, bed_mbs; /* ... and one loopback stream, one over the bed, before it */
    char why[160];
} result;

static netbed bed;
static proc server, nodes[NODES + 1];
static char dir[64];
static long state_mib = 1024;
static const char *python = TORCH_PYTHON;
static int pg_timeout_s = 30;

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

static int spawn_node(int host, const job *j, const char *ckdir) {
    char ep[64], mibs[24], pgt[24], logdir[160];
    netbed_addr(0, ep, sizeof ep);
    size_t l = strlen(ep);
    snprintf(ep + l, sizeof ep - l, ":%s", PORT);
    snprintf(mibs, sizeof mibs, "%ld", j->mib);
    snprintf(pgt, sizeof pgt, "%d", pg_timeout_s);
    snprintf(logdir, sizeof logdir, "%s/torchrun-logs-host%d", dir, host);
    char *argv[64];
    int n = 0;
    if (j->way == W_TORCHRUN) {
        char *tr[] = {(char *)python, "-m", "torch.distributed.run", "--nnodes", "2:3",
                      "--nproc_per_node", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                      "host1:" PORT, "--rdzv_id", "reform", "--rdzv_conf", "last_call_timeout=1",
                      "--max_restarts", "3",
                      /* torch 1.13's torchrun fails on Python 3.11 without a log dir */
                      "--redirects", "1", "--tee", "1", "--log_dir", logdir, TRAIN_DDP, NULL};
        for (int i = 0; tr[i]; i++)
            argv[n++] = tr[i];
    } else {
        char *gl[] = {GL,
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
                      NULL};
        for (int i = 0; gl[i]; i++)
            argv[n++] = gl[i];
        if (j->prog == P_TORCH) {
            argv[n++] = "--no-python";
            argv[n++] = (char *)python;
            argv[n++] = TRAIN_DDP;
        } else {
            argv[n++] = DP;
        }
    }
    char *common[] = {"--steps",
                      "1000000",
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
    for (int i = 0; common[i]; i++)
        argv[n++] = common[i];
    if (j->prog == P_C) {
        argv[n++] = "--global-batch";
        argv[n++] = "48";
    } else {
        argv[n++] = "--seed";
        argv[n++] = "7";
        argv[n++] = "--pg-timeout-s";
        argv[n++] = pgt;
    }
    if (j->way == W_LIVE)
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

/* Every number printed between pre and post after mark: their sum, or
 * their largest (0 when none). */
static double scan_after(const char *pre, const char *post, const size_t *mark, int largest) {
    double t = 0;
    for (int i = 1; i <= NODES; i++)
        for (const char *s = nodes[i].out + mark[i]; (s = strstr(s, pre)) != NULL; s++) {
            const char *v = s + strlen(pre);
            char *end;
            double x = strtod(v, &end);
            if (end != v && strncmp(end, post, strlen(post)) == 0)
                t = largest ? (x > t ? x : t) : t + x;
        }
    return t;
}

/* A live join's copy rate in MB/s, the mean over the new ranks: the copy
 * alone (whole: PyTorch's whole Elastic.start(), making the group included). */
static double copy_rate(enum prog prog, const size_t *mark, int whole) {
    double mbs = 0;
    int n = 0;
    for (int i = 1; i <= NODES; i++)
        if (prog == P_C) { /* "(B bytes in X ms: R MB/s)" */
            for (const char *s = nodes[i].out + mark[i]; (s = strstr(s, " ms: ")) != NULL; s++) {
                mbs += strtod(s + 5, NULL);
                n++;
            }
        } else { /* "rank R: joined in X ms, B bytes of state copied (via V; the copy C ms)" */
            for (const char *s = nodes[i].out + mark[i]; (s = strstr(s, ": joined in ")) != NULL;
                 s++) {
                char *end;
                double ms = strtod(s + 12, &end);
                if (strncmp(end, " ms, ", 5) != 0 || ms <= 0)
                    continue;
                double bytes = strtod(end + 5, &end);
                const char *c = strstr(end, "; the copy ");
                const char *eol = strchr(end, '\n');
                if (!whole && c && (!eol || c < eol))
                    ms = strtod(c + 11, NULL);
                if (ms <= 0)
                    continue;
                mbs += bytes / ms / 1e3;
                n++;
            }
        }
    return n ? mbs / n : 0;
}

static double loopback_mbs(void);
static double bed_stream_mbs(void);

static void run_one(result *r, const job *j) {
    memset(r, 0, sizeof *r);
    r->told_s = r->first_s = r->fault_s = r->paused_s = -1; /* not seen */
    memset(&server, 0, sizeof server);
    memset(nodes, 0, sizeof nodes);
    enum fault f = j->fault;
    char ckdir[128], name[64];
    snprintf(ckdir, sizeof ckdir, "%s/ck-%d-%d-%ld-%d", dir, (int)j->prog, (int)j->way, j->mib,
             (int)f);
    snprintf(name, sizeof name, "%s-%s-%s-%ldMiB", prog_name[j->prog], way_name[j->way],
             fault_name[f], j->mib);
    if (netbed_up(&bed, NODES + 1, 0, 0, LOGDIR) != 0) {
        snprintf(r->why, sizeof r->why, "the test bed could not be built");
        return;
    }
    if (j->way == W_LIVE && f == F_JOIN) { /* the yardsticks, on the idle bed */
        r->lo_mbs = loopback_mbs();
        r->bed_mbs = bed_stream_mbs();
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
    if (j->way != W_TORCHRUN && (netbed_spawn(&bed, 0, &server, sargv) != 0 ||
                                 !proc_expect(&server, "listening on", 5000))) {
        snprintf(r->why, sizeof r->why, "gpulaunch-rdzv did not start");
        goto out;
    }
    for (int i = 1; i <= first; i++)
        if (spawn_node(i, j, ckdir) != 0) {
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
        if (spawn_node(3, j, ckdir) != 0) {
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
    const char *told = j->way == W_TORCHRUN ? "failed (exitcode" : "round 1 is over";
    uint64_t t_over = 0; /* both survivors' round ended (a join: not at host 3's start) */
    while (now_ms() - t_fault < HEAL_MS) {
        drain();
        if (!t_over && strstr(nodes[1].out + mark[1], told) && strstr(nodes[2].out + mark[2], told))
            t_over = now_ms();
        if (!t_told)
            t_told = t_over;
        if (host_with(in_new, mark))
            break;
    }
    r->told_s = t_told ? (double)(t_told - t_fault) / 1e3 : -1;
    if (!host_with(in_new, mark)) {
        snprintf(r->why, sizeof r->why, "no step in the %d-rank world within %d s", world,
                 HEAL_MS / 1000);
        goto out;
    }
    uint64_t t_first = now_ms();
    /* the new ranks' lines after their first step (a copy's rate) */
    for (uint64_t t = now_ms(); now_ms() - t < 1000;)
        drain();
    r->ok = 1;
    r->first_s = t_told ? (double)(t_first - t_told) / 1e3 : -1;
    r->paused_s = t_over ? (double)(t_first - t_over) / 1e3 : -1;
    r->fault_s = (double)(t_first - t_fault) / 1e3;
    r->read_mb = scan_after("read ", " bytes from the checkpoint", mark, 0) / 1e6;
    int h = host_with("resumed from the checkpoint of step ", mark);
    if (h) {
        /* the old world's last step: its rank 0 may have gone on after the
         * fault (a join) and saved it when stopped (torchrun's SIGTERM) */
        size_t old[NODES + 1];
        for (int i = 1; i <= NODES; i++) {
            const char *s = strstr(nodes[i].out + mark[i], in_new);
            old[i] = s ? (size_t)(s - nodes[i].out) : nodes[i].out_len;
        }
        long last = last_step_before(old);
        const char *s = strstr(nodes[h].out + mark[h], "resumed from the checkpoint of step ");
        r->lost = (last > before ? last : before) -
                  strtol(s + strlen("resumed from the checkpoint of step "), NULL, 10);
    } else if (j->way == W_LIVE) {
        /* the agreed step is the last every rank completed; a rank one
         * further redoes its step (C: "(0 lost, N redone here)", PyTorch:
         * "(N lost)") */
        double c = scan_after(" lost, ", " redone here)", mark, 1);
        double py = scan_after("(", " lost)", mark, 1);
        r->lost = (long)(c > py ? c : py);
    } else {
        r->lost = -1;
    }
    if (j->way == W_LIVE && f == F_JOIN)
        r->copy_mbs = copy_rate(j->prog, mark, 0);
    r->start_mbs = j->prog == P_TORCH ? copy_rate(j->prog, mark, 1) : 0;
out:
    drain();
    for (int i = 0; i <= NODES; i++) {
        char nm[96];
        snprintf(nm, sizeof nm, i ? "%s-host%d" : "%s-rdzv", name, i);
        char path[256];
        snprintf(path, sizeof path, "%s/%s.log", LOGDIR, nm);
        unlink(path);
        if (i || server.out_len)
            netbed_save_log(&bed, nm, i ? &nodes[i] : &server);
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
/* ---- one TCP stream, the copy's yardstick ----
 *
 * The yardstick is one loopback stream (write and read of the same
 * 4 MiB buffer, on an idle machine). The copy crosses the bed's virtual
 * links instead (veth, bridge, veth, MTU 1500), where one stream moves about
 * half of what it moves over loopback here; so a live join also measures one
 * stream from host 1 to host 3 on its fresh bed (this program again, as
 * --stream-sink and --stream-to in the hosts), and the copy is given
 * against both. */

#define STREAM_BYTES (1ull << 30)
#define STREAM_CHUNK (4u << 20)
#define STREAM_PORT 29411

/* Reads one connection of ls to its end; 0 when all STREAM_BYTES came. */
static int stream_take(int ls) {
    int fd = accept(ls, NULL, NULL);
    char *buf = malloc(STREAM_CHUNK);
    uint64_t got = 0;
    ssize_t n;
    while (fd >= 0 && buf && got < STREAM_BYTES && (n = read(fd, buf, STREAM_CHUNK)) > 0)
        got += (uint64_t)n;
    free(buf);
    if (fd >= 0)
        close(fd);
    return got == STREAM_BYTES ? 0 : -1;
}

static void *stream_sink(void *arg) {
    stream_take(*(int *)arg);
    return NULL;
}

/* STREAM_BYTES through the connected fd, until the reader has them all
 * (it closes): MB/s, 0 when the stream broke. */
static double stream_give(int fd) {
    char *buf = calloc(1, STREAM_CHUNK);
    uint64_t t0 = now_ms(), sent = 0;
    while (buf && sent < STREAM_BYTES) {
        ssize_t n = write(fd, buf, STREAM_CHUNK);
        if (n <= 0)
            break;
        sent += (uint64_t)n;
    }
    shutdown(fd, SHUT_WR);
    char c;
    while (read(fd, &c, 1) > 0)
        ;
    uint64_t ms = now_ms() - t0;
    free(buf);
    return sent == STREAM_BYTES && ms ? (double)sent / (double)ms / 1e3 : 0;
}

static double loopback_mbs(void) {
    int ls = socket(AF_INET, SOCK_STREAM, 0), fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    pthread_t t;
    double mbs = 0;
    if (ls < 0 || fd < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &al) != 0 ||
        pthread_create(&t, NULL, stream_sink, &ls) != 0)
        goto out;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        mbs = stream_give(fd);
        close(fd);
        fd = -1;
        pthread_join(t, NULL);
    } else {
        pthread_cancel(t);
        pthread_join(t, NULL);
    }
out:
    if (fd >= 0)
        close(fd);
    if (ls >= 0)
        close(ls);
    return mbs;
}

/* --stream-sink: in a host of the bed, takes one stream on STREAM_PORT. */
static int stream_sink_main(void) {
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(STREAM_PORT)};
    if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 1) != 0) {
        printf("stream sink: %s\n", strerror(errno));
        return 1;
    }
    printf("stream sink ready\n");
    fflush(stdout);
    int rc = stream_take(ls);
    close(ls);
    return rc ? 1 : 0;
}

/* --stream-to ADDR: in a host of the bed, one stream to ADDR's sink. */
static int stream_to_main(const char *addr) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(STREAM_PORT)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || inet_pton(AF_INET, addr, &a.sin_addr) != 1 ||
        connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        printf("stream to %s: %s\n", addr, strerror(errno));
        return 1;
    }
    printf("stream: %.0f MB/s\n", stream_give(fd));
    close(fd);
    return 0;
}

/* One stream from host 1 to host 3 of the bed that is up: MB/s, 0 when it
 * could not be measured. */
static double bed_stream_mbs(void) {
    char self[256], to[32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return 0;
    self[n] = '\0';
    netbed_addr(3, to, sizeof to);
    char *sargv[] = {self, "--stream-sink", NULL}, *cargv[] = {self, "--stream-to", to, NULL};
    proc sink = {0}, src = {0};
    double mbs = 0;
    if (netbed_spawn(&bed, 3, &sink, sargv) == 0 && proc_expect(&sink, "stream sink ready", 5000) &&
        netbed_spawn(&bed, 1, &src, cargv) == 0 && proc_expect(&src, " MB/s", 20000)) {
        const char *s = strstr(src.out, "stream: ");
        mbs = s ? strtod(s + 8, NULL) : 0;
    }
    if (src.pid > 0)
        proc_wait(&src, 5000);
    if (sink.pid > 0)
        proc_wait(&sink, 5000);
    return mbs;
}

/* Whether name is one of list's comma-separated words (all when list is NULL). */
static int in_list(const char *list, const char *name) {
    if (list == NULL)
        return 1;
    size_t n = strlen(name);
    for (const char *s = list; *s;) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == n && strncmp(s, name, n) == 0)
            return 1;
        s += len + (e != NULL);
    }
    return 0;
}

static int list_ok(const char *list, const char *const *names, int count) {
    if (list == NULL)
        return 1;
    for (const char *s = list; *s;) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        int known = 0;
        for (int i = 0; i < count; i++)
            known |= len == strlen(names[i]) && strncmp(s, names[i], len) == 0;
        if (!known)
            return 0;
        s += len + (e != NULL);
    }
    return 1;
}

static void usage(void) {
    fprintf(stderr, "usage: reform_bench [--state-mib N] [--skip-small] [--skip-large] [--skip-c] "
                    "[--skip-pytorch]\n"
                    "                    [--ways live,restart,torchrun] [--faults "
                    "kill,vanish,join] [--python PATH]\n"
                    "                    [--pg-timeout-s S]   (as root)\n");
}

/* One program's table: every size, fault and way asked for. */
static int run_table(enum prog prog, const long *sizes, const int *size_on, const char *ways,
                     const char *faults, double lo) {
    int rc = 0;
    printf("%-9s %-7s %-9s %-8s %-11s %-8s %-11s %-5s %-10s %s\n", "way", "fault", "state", "told",
           "first step", "paused", "from fault", "lost", "read (MB)", "copy (MB/s)");
    fflush(stdout);
    for (int s = 0; s < 2; s++)
        for (int f = F_KILL; f <= F_JOIN && size_on[s]; f++)
            for (int w = W_LIVE; w <= (prog == P_TORCH ? W_TORCHRUN : W_RESTART); w++) {
                if (!in_list(faults, fault_name[f]) || !in_list(ways, way_name[w]))
                    continue;
                job j = {prog, (enum way)w, sizes[s], (enum fault)f};
                result r;
                run_one(&r, &j);
                char st[24], told[24], fs[24], ps[24], ff[24], lost[24], rd[24], cp[160],
                    whole[48] = "";
                snprintf(st, sizeof st, sizes[s] ? "%ld MiB" : "model", sizes[s]);
                snprintf(told, sizeof told, r.told_s >= 0 ? "%.2f s" : "-", r.told_s);
                snprintf(fs, sizeof fs, r.ok && r.first_s >= 0 ? "%.2f s" : "-", r.first_s);
                snprintf(ps, sizeof ps, r.ok && r.paused_s >= 0 ? "%.2f s" : "-", r.paused_s);
                snprintf(ff, sizeof ff, r.fault_s >= 0 ? "%.2f s" : "-", r.fault_s);
                snprintf(lost, sizeof lost, r.ok && r.lost >= 0 ? "%ld" : "-", r.lost);
                if (r.read_mb > 0 && r.read_mb < 0.1)
                    snprintf(rd, sizeof rd, "%.1f kB", r.read_mb * 1e3);
                else
                    snprintf(rd, sizeof rd, "%.1f", r.read_mb);
                if (r.start_mbs > 0)
                    snprintf(whole, sizeof whole, "; over Elastic.start(): %.0f", r.start_mbs);
                if (r.copy_mbs > 0 && r.lo_mbs > 0 && r.bed_mbs > 0)
                    snprintf(cp, sizeof cp,
                             "%.0f (%.0f%% of loopback %.0f, %.0f%% of the bed %.0f%s)", r.copy_mbs,
                             100.0 * r.copy_mbs / r.lo_mbs, r.lo_mbs,
                             100.0 * r.copy_mbs / r.bed_mbs, r.bed_mbs, whole);
                else if (r.copy_mbs > 0)
                    snprintf(cp, sizeof cp, "%.0f (%.0f%% of the first loopback stream)",
                             r.copy_mbs, lo > 0 ? 100.0 * r.copy_mbs / lo : 0.0);
                else
                    snprintf(cp, sizeof cp, "-");
                printf("%-9s %-7s %-9s %-8s %-11s %-8s %-11s %-5s %-10s %s\n", way_name[w],
                       fault_name[f], st, told, fs, ps, ff, lost, rd, cp);
                if (!r.ok) {
                    printf("          (%s; logs in %s)\n", r.why, LOGDIR);
                    rc = 1;
                }
                fflush(stdout);
            }
    return rc;
}

int main(int argc, char **argv) {
    int skip[2] = {0, 0}, skip_prog[2] = {0, 0};
    const char *ways = NULL, *faults = NULL;
    /* this program again, in a host of the bed: one end of a stream */
    if (argc == 2 && strcmp(argv[1], "--stream-sink") == 0)
        return stream_sink_main();
    if (argc == 3 && strcmp(argv[1], "--stream-to") == 0)
        return stream_to_main(argv[2]);
    for (int i = 1; i < argc; i++) {
        char *end;
        if (strcmp(argv[i], "--skip-small") == 0)
            skip[0] = 1;
        else if (strcmp(argv[i], "--skip-large") == 0)
            skip[1] = 1;
        else if (strcmp(argv[i], "--skip-c") == 0)
            skip_prog[P_C] = 1;
        else if (strcmp(argv[i], "--skip-pytorch") == 0)
            skip_prog[P_TORCH] = 1;
        else if (strcmp(argv[i], "--ways") == 0 && i + 1 < argc) {
            ways = argv[++i];
            if (!list_ok(ways, way_name, 3)) {
                fprintf(stderr, "reform_bench: --ways takes live, restart, torchrun, not '%s'\n",
                        ways);
                return 2;
            }
        } else if (strcmp(argv[i], "--faults") == 0 && i + 1 < argc) {
            faults = argv[++i];
            if (!list_ok(faults, fault_name, 3)) {
                fprintf(stderr, "reform_bench: --faults takes kill, vanish, join, not '%s'\n",
                        faults);
                return 2;
            }
        } else if (strcmp(argv[i], "--python") == 0 && i + 1 < argc) {
            python = argv[++i];
            if (python[0] != '/') {
                fprintf(stderr, "reform_bench: --python takes an absolute path, not '%s'\n",
                        python);
                return 2;
            }
        } else if (strcmp(argv[i], "--pg-timeout-s") == 0 && i + 1 < argc) {
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 3600) {
                fprintf(stderr, "reform_bench: --pg-timeout-s takes 1 to 3600, not '%s'\n",
                        argv[i]);
                return 2;
            }
            pg_timeout_s = (int)v;
        } else if (strcmp(argv[i], "--state-mib") == 0 && i + 1 < argc) {
            state_mib = strtol(argv[++i], &end, 10);
            if (*end || state_mib < 1 || state_mib > 8192) {
                fprintf(stderr, "reform_bench: --state-mib takes 1 to 8192, not '%s'\n", argv[i]);
                return 2;
            }
        } else {
            usage();
            return 2;
        }
    }
    char why[256];
    if (!netbed_available(why, sizeof why)) {
        fprintf(stderr, "reform_bench: %s\n", why);
        return 2;
    }
    char torch_version[96] = "";
    if (!skip_prog[P_TORCH]) {
        char cmd[384];
        snprintf(cmd, sizeof cmd,
                 "%s -c 'import sys, torch; print(\"torch\", torch.__version__, \"on Python\", "
                 "sys.version.split()[0])' 2>/dev/null",
                 python);
        FILE *p = popen(cmd, "r");
        if (p == NULL || fgets(torch_version, sizeof torch_version, p) == NULL) {
            if (p != NULL)
                pclose(p);
            fprintf(stderr,
                    "reform_bench: %s cannot import torch: install python3-torch "
                    "(scripts/deps.sh), name another --python, or --skip-pytorch\n",
                    python);
            return 2;
        }
        pclose(p);
        torch_version[strcspn(torch_version, "\n")] = '\0';
    }
    setenv("PET_PREEMPTION_SOURCE", "none", 0);
    setenv("PET_SHM_MIN", "16m", 0);
    /* the workers find the package in the source tree and the library in the
     * build tree; launchers pass their environment on */
    setenv("PYTHONPATH", GPL_SOURCE_DIR "/python", 1);
    setenv("GPULAUNCH_LIBRARY", GPL_BUILD_DIR "/runtime/libgpulaunch.so.0", 1);
    if (mkdir(LOGDIR, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "reform_bench: cannot create %s: %s\n", LOGDIR, strerror(errno));
        return 1;
    }
    tmpdir_make(dir, sizeof dir, "gpl-reform");
    double lo = loopback_mbs();
    printf("reform_bench: 3 nodes x 2 workers, --nnodes 2:3, a 1 s last call, checkpoint every "
           "20 steps, 20 ms of sleep a step;\none loopback TCP stream here: %.0f MB/s\n",
           lo);
    long sizes[2] = {0, state_mib};
    int size_on[2] = {!skip[0], !skip[1]};
    int rc = 0;
    if (!skip_prog[P_C]) {
        printf("\nC: examples/dp_train (live: --reform; restart: without)\n");
        rc |= run_table(P_C, sizes, size_on, ways, faults, lo);
    }
    if (!skip_prog[P_TORCH]) {
        printf("\nPyTorch: examples/train_ddp.py, DDP on Gloo, %s (live: gpulaunch and --reform; "
               "restart: gpulaunch without;\ntorchrun: its c10d store on host 1, the program's "
               "Gloo timeout %d s)\n",
               torch_version, pg_timeout_s);
        rc |= run_table(P_TORCH, sizes, size_on, ways, faults, lo);
    }
    printf("\ntold: both survivors' `round 1 is over` (torchrun: `failed (exitcode`) after the "
           "fault; join: host 3's start;\nfirst step: rank 0's first step in the new world after "
           "being told; paused: from both survivors' round end to that step (for a join, what the\n"
           "survivors stopped for); from fault: the same step, from the fault\n");
    tmpdir_remove(dir);
    return rc;
}
