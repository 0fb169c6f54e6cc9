/* probe_load: what suspicion and probes cost the rendezvous server at scale
 * (docs/reliability.md, "Finding a vanished node"). A real gpulaunch-rdzv
 * process and --nodes simulated nodes, each a real client of the client
 * library on its own connection with its own UDP port for peer probes (and
 * the TCP port of its number for kernel probes: a machine check each)
 * (--procs processes share them: a process's descriptors are limited), in
 * static jobs of --job-nodes nodes, heartbeats at the default 1 s. Once every
 * node is assigned, for --seconds:
 *   - in --straggling % of the jobs every node but one says its workers wait
 *     in a collective (as a launcher does, every 250 ms while it lasts): the
 *     one they wait for is probed, and answers, every 250 ms;
 *   - in --cut % of the jobs one node's link to the server alone goes silent
 *     (its UDP port still answers): it is probed, answers no PING and is
 *     probed through 3 peers, which reach it (the window is then cut to 3 s,
 *     before its heartbeat timeout);
 *   - the other jobs heartbeat.
 * The same run twice: the server with --probes off (heartbeats alone: the
 * clients send no waits), then on. Printed for each: the server's CPU (share
 * of one core, and per frame), frames in and out per second, probes answered,
 * peers' probes that reached; and the difference. Exit status 0 when both
 * runs formed every job, no round ended, and with probes on the waited-for
 * nodes were probed (--straggling) and the cut ones reached by peers (--cut).
 *
 *   probe_load [--nodes N] [--job-nodes J] [--procs P] [--seconds S]
 *              [--straggling PCT] [--cut PCT] */
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "gb_time.h"
#include "gpulaunch/rdzv.h"
#include "harness.h"
#include "rdzv_client_int.h"
#include "soak_server.h"

#define LOAD_TOKEN "probe-load-token"
#define LOAD_WAIT_EVERY_MS 50 /* a waiting node's launcher looks this often */

static struct {
    int nodes, job_nodes, procs, seconds, straggling, cut;
    int port, http_port;
} O = {16384, 32, 4, 10, 10, 0, 0, 0};

typedef struct node {
    rdzv_client *c;
    int assigned, over;
    int role; /* 0 heartbeats, 1 waits for another, 2 is waited for, 3 link cut */
} node;

static uv_loop_t loop;
static node *nodes;
static int nmine, over_total;

static void on_assigned(rdzv_client *c, const rdzv_assignment *a) {
    node *n = rdzv_client_data(c);
    (void)a;
    n->assigned = 1;
}

static void on_round_over(rdzv_client *c, uint32_t round, uint32_t reason, uint32_t node_rank,
                          const char *hostname, const char *message) {
    node *n = rdzv_client_data(c);
    (void)round, (void)reason, (void)node_rank, (void)hostname, (void)message;
    n->assigned = 0;
    n->over++;
    over_total++;
}

static void on_error(rdzv_client *c, gpl_result_t code, const char *message) {
    (void)c;
    fprintf(stderr, "probe_load: client error %d: %s\n", code, message);
}

/* Every simulated node holds a connection to the server and a TCP listener
 * for kernel probes: at 16,384 nodes on one host that is more than the
 * default ephemeral range (32768-60999) gives. As root the bench takes a
 * network namespace of its own (the server, its child, too), its loopback
 * up and the range wide; else it runs where it is, and says so. */
static void own_netns(void) {
    if (geteuid() != 0 || unshare(CLONE_NEWNET) != 0) {
        fprintf(stderr, "probe_load: not root (or no network namespace): the host's port range "
                        "bounds the nodes\n");
        return;
    }
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    if (fd < 0 || ioctl(fd, SIOCGIFFLAGS, &ifr) != 0 ||
        (ifr.ifr_flags |= IFF_UP, ioctl(fd, SIOCSIFFLAGS, &ifr) != 0))
        fprintf(stderr, "probe_load: loopback not up in the new namespace: %s\n", strerror(errno));
    if (fd >= 0)
        close(fd);
    int r = open("/proc/sys/net/ipv4/ip_local_port_range", O_WRONLY | O_CLOEXEC);
    if (r < 0 || write(r, "1024 65535", 10) != 10)
        fprintf(stderr, "probe_load: the port range stays: %s\n", strerror(errno));
    if (r >= 0)
        close(r);
}

static void raise_nofile(void) {
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0) {
        r.rlim_cur = r.rlim_max;
        setrlimit(RLIMIT_NOFILE, &r);
    }
}

/* One process's share: jobs [first, first + njobs). Says "R" on out when
 * every node is assigned, waits for a byte on in, runs the window, writes
 * its count of rounds ended and exits. */
static void child(int first, int njobs, int in, int out, int probes) {
    raise_nofile();
    uv_loop_init(&loop);
    nmine = njobs * O.job_nodes;
    nodes = calloc((size_t)nmine, sizeof *nodes);
    for (int j = 0; j < njobs; j++) {
        int job = first + j;
        /* which jobs straggle and which have a cut link: spread evenly */
        int straggle =
            O.straggling && (job * O.straggling) / 100 != ((job + 1) * O.straggling) / 100;
        int cut = !straggle && O.cut &&
                  (job * O.cut + 50) / 100 != ((job + 1) * O.cut + 50) / 100; /* other jobs */
        for (int i = 0; i < O.job_nodes; i++) {
            node *n = &nodes[j * O.job_nodes + i];
            n->role = straggle ? (i == 0 ? 2 : 1) : cut ? (i == 0 ? 3 : 1) : 0;
            char run[32], host[48], inst[48];
            snprintf(run, sizeof run, "load-%d", job);
            snprintf(host, sizeof host, "load-%d-%d", job, i);
            snprintf(inst, sizeof inst, "i-%d-%d", job, i);
            rdzv_join_params jp = {.run_id = run,
                                   .hostname = host,
                                   .addr = "127.0.0.1",
                                   .instance = inst,
                                   .master_port = 29500,
                                   .nproc = 1,
                                   .static_rank = i,
                                   .min_nodes = (uint32_t)O.job_nodes,
                                   .max_nodes = (uint32_t)O.job_nodes,
                                   .join_timeout_ms = 120000,
                                   .heartbeat_timeout_ms = 5000};
            rdzv_client_options o = {.host = "127.0.0.1",
                                     .port = O.port,
                                     .token = LOAD_TOKEN,
                                     .token_len = strlen(LOAD_TOKEN),
                                     .connect_timeout_ms = 60000};
            rdzv_client_callbacks cb = {.data = n,
                                        .on_assigned = on_assigned,
                                        .on_round_over = on_round_over,
                                        .on_error = on_error};
            char err[256];
            if (rdzv_client_start(&loop, &o, &jp, &cb, &n->c, err, sizeof err) != GPL_OK) {
                fprintf(stderr, "probe_load: %s\n", err);
                _exit(1);
            }
            if ((j * O.job_nodes + i) % 64 == 63)
                uv_run(&loop, UV_RUN_NOWAIT); /* the connections open as they are made */
        }
    }
    uint64_t until = gb_now_ms() + 120000;
    for (int ready = 0; !ready && gb_now_ms() < until;) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(1000);
        ready = 1;
        for (int i = 0; i < nmine && ready; i++)
            ready = nodes[i].assigned;
    }
    char c = 'R';
    for (int i = 0; i < nmine; i++)
        if (!nodes[i].assigned)
            c = 'N';
    if (write(out, &c, 1) != 1 || c != 'R')
        _exit(1);
    for (;;) { /* the joins' calibration pings answered while the parent waits for all */
        uv_run(&loop, UV_RUN_NOWAIT);
        char go;
        ssize_t r = read(in, &go, 1);
        if (r == 1)
            break;
        if (r == 0 || (r < 0 && errno != EAGAIN))
            _exit(1);
        usleep(1000);
    }
    uint64_t t0 = gb_now_ms(), end = t0 + (uint64_t)O.seconds * 1000, said = 0;
    for (int i = 0; i < nmine; i++)
        if (nodes[i].role == 3)
            rdzv_client_freeze_link(nodes[i].c);
    while (gb_now_ms() < end) {
        uv_run(&loop, UV_RUN_NOWAIT);
        uint64_t now = gb_now_ms();
        if (probes && now - said >= LOAD_WAIT_EVERY_MS) {
            for (int i = 0; i < nmine; i++)
                if (nodes[i].role == 1 && nodes[i].assigned)
                    rdzv_client_waiting(nodes[i].c, (uint32_t)(now - t0) + 300);
            said = now;
        }
        usleep(500);
    }
    int n = over_total;
    if (write(out, &n, sizeof n) != (ssize_t)sizeof n)
        _exit(1);
    /* alive (heartbeating) until the parent has read the server's figures:
     * a node that goes ends its round, and that is not the load measured */
    for (char x; read(in, &x, 1) != 0; usleep(1000))
        uv_run(&loop, UV_RUN_NOWAIT);
    _exit(0);
}

typedef struct figures {
    double cpu_share, us_per_frame, in_per_s, out_per_s, answered, reached, checked;
    int overs;
} figures;

static int run(const char *probes, figures *f) {
    memset(f, 0, sizeof *f);
    O.port = free_tcp_port();
    O.http_port = free_tcp_port();
    pid_t srv = soak_server_start(GPL_RDZV_BIN, O.port, O.http_port, LOAD_TOKEN, 30000, probes);
    if (srv < 0)
        return -1;
    int jobs = O.nodes / O.job_nodes, per = (jobs + O.procs - 1) / O.procs, rc = 0;
    pid_t kids[64];
    int to[64], from[64], nk = 0;
    for (int p = 0; p < O.procs && p * per < jobs; p++) {
        int a[2], b[2];
        if (pipe(a) != 0 || pipe(b) != 0)
            return -1;
        pid_t pid = fork();
        if (pid == 0) {
            close(a[1]);
            close(b[0]);
            fcntl(a[0], F_SETFL, fcntl(a[0], F_GETFL) | O_NONBLOCK);
            child(p * per, per < jobs - p * per ? per : jobs - p * per, a[0], b[1],
                  strcmp(probes, "on") == 0);
        }
        close(a[0]);
        close(b[1]);
        kids[nk] = pid, to[nk] = a[1], from[nk] = b[0], nk++;
    }
    uint64_t t_form = gb_now_ms();
    for (int k = 0; k < nk; k++) {
        char c = 0;
        if (read(from[k], &c, 1) != 1 || c != 'R') {
            fprintf(stderr, "probe_load: process %d's nodes were not all assigned\n", k);
            rc = -1;
        }
    }
    double formed_s = (double)(gb_now_ms() - t_form) / 1000.0;
    usleep(5000000); /* settled: every join answered, calibrated and heartbeating */
    double in0 = soak_server_metric(O.http_port, "gpulaunch_rdzv_frames_total{direction=\"in\"}");
    double out0 = soak_server_metric(O.http_port, "gpulaunch_rdzv_frames_total{direction=\"out\"}");
    double ans0 =
        soak_server_metric(O.http_port, "gpulaunch_rdzv_probes_total{result=\"answered\"}");
    double cpu0 = soak_proc_cpu_s(srv);
    uint64_t t0 = gb_now_ms();
    for (int k = 0; k < nk; k++)
        if (write(to[k], "g", 1) != 1)
            rc = -1;
    for (int k = 0; k < nk; k++) {
        int n = 0;
        if (read(from[k], &n, sizeof n) != (ssize_t)sizeof n)
            rc = -1;
        f->overs += n;
    }
    double secs = (double)(gb_now_ms() - t0) / 1000.0;
    double cpu = soak_proc_cpu_s(srv) - cpu0;
    double in =
        soak_server_metric(O.http_port, "gpulaunch_rdzv_frames_total{direction=\"in\"}") - in0;
    double out =
        soak_server_metric(O.http_port, "gpulaunch_rdzv_frames_total{direction=\"out\"}") - out0;
    f->answered =
        soak_server_metric(O.http_port, "gpulaunch_rdzv_probes_total{result=\"answered\"}") - ans0;
    f->reached =
        soak_server_metric(O.http_port, "gpulaunch_rdzv_probe_relays_total{result=\"reached\"}");
    f->checked =
        soak_server_metric(O.http_port, "gpulaunch_rdzv_machine_checks_total{result=\"reached\"}");
    f->cpu_share = cpu / secs;
    f->in_per_s = in / secs;
    f->out_per_s = out / secs;
    f->us_per_frame = in + out > 0 ? cpu * 1e6 / (in + out) : 0;
    /* every pipe closed before any wait: a later child holds copies of an
     * earlier one's, and that one sees its end only when they all go */
    for (int k = 0; k < nk; k++) {
        close(to[k]);
        close(from[k]);
    }
    for (int k = 0; k < nk; k++)
        waitpid(kids[k], NULL, 0);
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
    printf("probe_load: probes %-3s %d nodes in %d jobs formed in %.1f s; over %.1f s: server "
           "cpu %.1f %% of a core (%.2f us a frame), frames in %.0f/s, out %.0f/s; probes "
           "answered %.0f, peers reached a suspect %.0f times; rounds ended %d; kernel-probe "
           "ports checked %.0f (before the window)\n",
           probes, O.nodes, jobs, formed_s, secs, f->cpu_share * 100, f->us_per_frame, f->in_per_s,
           f->out_per_s, f->answered, f->reached, f->overs, f->checked);
    fflush(stdout);
    return rc;
}

static int arg(const char *name, const char *v, int lo, int hi) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (v == NULL || *end || x < lo || x > hi) {
        fprintf(stderr, "probe_load: %s takes %d to %d\n", name, lo, hi);
        exit(2);
    }
    return (int)x;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--nodes") == 0)
            O.nodes = arg(a, v, 2, 1 << 20), i++;
        else if (strcmp(a, "--job-nodes") == 0)
            O.job_nodes = arg(a, v, 2, 4096), i++;
        else if (strcmp(a, "--procs") == 0)
            O.procs = arg(a, v, 1, 64), i++;
        else if (strcmp(a, "--seconds") == 0)
            O.seconds = arg(a, v, 1, 3600), i++;
        else if (strcmp(a, "--straggling") == 0)
            O.straggling = arg(a, v, 0, 100), i++;
        else if (strcmp(a, "--cut") == 0)
            O.cut = arg(a, v, 0, 100), i++;
        else {
            fprintf(stderr, "usage: probe_load [--nodes N] [--job-nodes J] [--procs P] "
                            "[--seconds S] [--straggling PCT] [--cut PCT]\n");
            return 2;
        }
    }
    if (O.cut && O.seconds > 3)
        O.seconds = 3; /* a cut link's node is lost at its heartbeat timeout (5 s) */
    signal(SIGPIPE, SIG_IGN);
    own_netns();
    raise_nofile();
    figures off, on;
    int rc = run("off", &off) | run("on", &on);
    printf("probe_load: probes cost the server %+.1f %% of a core and %+.0f frames/s (in and "
           "out) at %d nodes, %d %% of jobs waiting on a slow node, %d %% with a node's link to "
           "the server cut\n",
           (on.cpu_share - off.cpu_share) * 100,
           on.in_per_s + on.out_per_s - off.in_per_s - off.out_per_s, O.nodes, O.straggling, O.cut);
    if (on.overs || off.overs)
        rc = 1;
    /* the load measured is the load described: waited-for nodes were probed
     * and answered, cut ones were reached by peers; nothing without probes */
    const char *bad = O.straggling && on.answered < 1 ? "no waited-for node was probed"
                      : O.cut && on.reached < 1       ? "no peer reached a node whose link was cut"
                      : off.answered > 0              ? "probes were answered with --probes off"
                      : on.checked < O.nodes * 0.99
                          ? "fewer than 99 % of the nodes' kernel-probe ports were checked"
                          : NULL;
    if (bad) {
        fprintf(stderr, "probe_load: %s\n", bad);
        rc = 1;
    }
    return rc ? 1 : 0;
}
