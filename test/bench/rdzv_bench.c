/* rdzv_bench: N simulated node agents on N real TCP connections, from one
 * process, against a real gpulaunch-rdzv process (started
 * here with a token, or --server ADDR:PORT). Each agent does the handshake,
 * the HMAC auth and a JOIN, and waits for its assignment. Then one agent
 * drops and the bench times how long until every survivor is told.
 *
 * The agents are shared out over --threads loops (2 by default): one thread
 * alone is slower at making connections than the server is at taking them.
 *
 *   rdzv_bench --agents 16384 [--server HOST:PORT --token-file F] [--threads T] [--kv]
 *
 * Last line: rdzv_bench agents=N join_to_assigned_s=X server_peak_rss_mib=Y */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <uv.h>

#include "gb_procstat.h"
#include "gb_time.h"
#include "gpulaunch/rdzv.h"
#include "rdzv_auth.h"
#include "rdzv_codec.h"

typedef struct worker worker;

typedef struct agent {
    uv_tcp_t tcp;
    worker *w;
    int id;
    int state; /* 1 connecting, 3 joined, 4 assigned, 5 told */
    rdzv_buf in;
} agent;

/* Agents are split over worker threads, each with its own loop (one thread
 * alone cannot make 16k connections as fast as the server takes them on 2
 * cores: the connect system call carries both ends of the TCP handshake). */
struct worker {
    uv_loop_t loop;
    uv_async_t wake; /* stop, from another worker */
    pthread_t th;
    int lo, hi, next_connect, welcomed;
    rdzv_buf out; /* one encode buffer, reused */
    char slab[65536];
};

#define CONNECT_WINDOW 4000 /* connects in flight: past the accept backlog, SYNs are dropped */
#define MAX_THREADS 16      /* --threads at most */

static int nagents, nworkers = 2;
static atomic_int assigned, told, failed, welcomed, stopped;
static agent *agents;
static worker workers[MAX_THREADS];
static const char *token = "bench-token";
static struct sockaddr_in server_addr;
static uint64_t t_start, t_all_welcomed, t_all_assigned, t_drop, t_all_told;
static atomic_int dropped = -1; /* set by one worker, read by all */
static char run_id[64];
static double cpu_at_assigned[2];
static pid_t server_pid;

static double cpu_s(pid_t pid);
static void start_connects(worker *w);

static void bench_stop(void) {
    atomic_store(&stopped, 1);
    for (int i = 0; i < nworkers; i++)
        uv_async_send(&workers[i].wake);
}

static void on_wake(uv_async_t *h) {
    if (atomic_load(&stopped))
        uv_stop(h->loop);
}

static void send_msgs(agent *a, rdzv_msg *m, int n) {
    rdzv_buf *out = &a->w->out;
    out->len = 0;
    for (int i = 0; i < n; i++)
        if (rdzv_encode(&m[i], out) != GPL_OK)
            return;
    uv_buf_t ub = uv_buf_init((char *)out->data, (unsigned)out->len);
    int w = uv_try_write((uv_stream_t *)&a->tcp, &ub, 1);
    if (w != (int)out->len) {
        fprintf(stderr, "agent %d: short write (%d of %zu)\n", a->id, w, out->len);
        atomic_fetch_add(&failed, 1);
    }
}

static void on_alloc(uv_handle_t *h, size_t s, uv_buf_t *b) {
    agent *a = h->data;
    b->base = a->w->slab;
    b->len = sizeof a->w->slab;
}

/* The last agent assigned drops one of its own worker's agents. */
static void drop_one(worker *w) {
    int d = w->lo + (w->hi - w->lo) / 2;
    t_drop = gb_now_ns();
    atomic_store(&dropped, d);
    uv_close((uv_handle_t *)&agents[d].tcp, NULL);
}

static void handle(agent *a, const rdzv_msg *m) {
    switch (m->type) {
    case RDZV_CHALLENGE: {
        /* HELLO, AUTH and JOIN in one write */
        rdzv_msg h = {.type = RDZV_HELLO, .req_id = 1};
        h.u.hello.magic = RDZV_MAGIC;
        h.u.hello.version = RDZV_VERSION;
        rdzv_msg r = {.type = RDZV_AUTH, .req_id = 2, .flags = RDZV_AUTH_QUIET};
        rdzv_auth_mac(token, strlen(token), m->u.challenge.nonce, r.u.auth.mac);
        rdzv_msg j = {.type = RDZV_JOIN, .req_id = 3};
        snprintf(j.u.join.run_id, sizeof j.u.join.run_id, "%s", run_id);
        snprintf(j.u.join.hostname, sizeof j.u.join.hostname, "agent-%d", a->id);
        snprintf(j.u.join.addr, sizeof j.u.join.addr, "10.%d.%d.%d", a->id >> 16,
                 (a->id >> 8) & 255, a->id & 255);
        snprintf(j.u.join.instance, sizeof j.u.join.instance, "bench-%d", a->id);
        j.u.join.master_port = 29500;
        j.u.join.nproc = 8;
        j.u.join.ngpus = 8;
        j.u.join.static_rank = a->id;
        j.u.join.min_nodes = j.u.join.max_nodes = (uint32_t)nagents;
        j.u.join.heartbeat_timeout_ms = 600000;
        j.u.join.join_timeout_ms = 600000;
        rdzv_msg all[3] = {h, r, j};
        send_msgs(a, all, 3);
        a->state = 3;
        a->w->welcomed++;
        if (atomic_fetch_add(&welcomed, 1) + 1 == nagents)
            t_all_welcomed = gb_now_ns();
        start_connects(a->w);
        return;
    }
    case RDZV_ASSIGNED:
        a->state = 4;
        if (m->u.assigned.world_size != (uint32_t)nagents * 8 ||
            m->u.assigned.base_rank != (uint32_t)a->id * 8) {
            fprintf(stderr, "agent %d: wrong assignment\n", a->id);
            atomic_fetch_add(&failed, 1);
        }
        if (atomic_fetch_add(&assigned, 1) + 1 == nagents) {
            t_all_assigned = gb_now_ns();
            cpu_at_assigned[0] = cpu_s(server_pid);
            cpu_at_assigned[1] = cpu_s(getpid());
            drop_one(a->w);
        }
        return;
    case RDZV_ROUND_OVER:
        if (a->state != 5) {
            a->state = 5;
            if (atomic_fetch_add(&told, 1) + 1 == nagents - 1) {
                t_all_told = gb_now_ns();
                bench_stop();
            }
        }
        return;
    case RDZV_ERROR:
        fprintf(stderr, "agent %d: %s\n", a->id, m->u.error.message);
        atomic_fetch_add(&failed, 1);
        bench_stop();
        return;
    default:
        return;
    }
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
    agent *a = s->data;
    if (n < 0) {
        if (a->id != atomic_load(&dropped)) {
            if (atomic_fetch_add(&failed, 1) < 5)
                fprintf(stderr, "agent %d (state %d): connection lost after %.2f s: %s\n", a->id,
                        a->state, (double)(gb_now_ns() - t_start) / 1e9, uv_strerror((int)n));
            bench_stop();
        }
        return;
    }
    /* whole frames are decoded where they were read; only a partial one is kept */
    const uint8_t *p = (const uint8_t *)b->base;
    size_t len = (size_t)n;
    if (a->in.len) {
        rdzv_buf_append(&a->in, b->base, (size_t)n);
        p = a->in.data;
        len = a->in.len;
    }
    size_t off = 0, flen;
    while (rdzv_frame_peek(p + off, len - off, &flen) == GPL_OK) {
        rdzv_msg m;
        if (rdzv_decode(p + off, flen, &m, NULL, 0) == GPL_OK)
            handle(a, &m);
        off += flen;
    }
    if (p == a->in.data)
        rdzv_buf_consume(&a->in, off);
    else if (off < len)
        rdzv_buf_append(&a->in, p + off, len - off);
}

/* CPU seconds a process has run, all its threads (nanosecond counters). */
static double cpu_s(pid_t pid) { return gb_procstat_cpu_exact_s(pid); }

static int atoi_checked(const char *s) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 1 || v > 1 << 20) {
        fprintf(stderr, "rdzv_bench: '%s' is not a count from 1 to 1048576\n", s);
        exit(2);
    }
    return (int)v;
}

static double peak_rss_mib(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    double kib = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0)
            kib = strtod(line + 6, NULL);
    fclose(f);
    return kib / 1024.0;
}

/* ---- key-value throughput: C blocking clients in threads ---- */

typedef struct kv_arg {
    int port, id;
    double seconds;
    long ops;
} kv_arg;

static void *kv_worker(void *p) {
    kv_arg *a = p;
    rdzv_bclient *c;
    char err[256];
    if (rdzv_bclient_connect("127.0.0.1", a->port, token, strlen(token), 5000, &c, err,
                             sizeof err) != GPL_OK ||
        rdzv_bclient_attach(c, run_id, 1) != GPL_OK) {
        fprintf(stderr, "kv client %d: %s\n", a->id, err);
        return NULL;
    }
    char key[32], val[64];
    uint64_t end = gb_now_ns() + (uint64_t)(a->seconds * 1e9);
    while (gb_now_ns() < end) {
        snprintf(key, sizeof key, "k%d-%ld", a->id, a->ops % 1000);
        snprintf(val, sizeof val, "value-%ld", a->ops);
        if (rdzv_bclient_set(c, key, val, strlen(val)) != GPL_OK)
            break;
        void *v;
        size_t n;
        if (rdzv_bclient_get(c, key, &v, &n) != GPL_OK)
            break;
        free(v);
        a->ops += 2;
    }
    rdzv_bclient_close(c);
    return NULL;
}

/* Keeps at most CONNECT_WINDOW agents (shared out over the workers) between
 * connect and their handshake. The connect is the plain non-blocking system
 * call: the server speaks first, so an agent only waits for its socket to
 * become readable (a refused or failed connect shows up there as a read
 * error). */
static void start_connects(worker *w) {
    int window = CONNECT_WINDOW / nworkers;
    while (w->next_connect < w->hi && w->next_connect - w->lo - w->welcomed < window) {
        agent *a = &agents[w->next_connect++];
        uv_os_fd_t fd;
        if (uv_fileno((uv_handle_t *)&a->tcp, &fd) != 0 ||
            (connect(fd, (struct sockaddr *)&server_addr, sizeof server_addr) != 0 &&
             errno != EINPROGRESS)) {
            fprintf(stderr, "agent %d: connect: %s\n", a->id, strerror(errno));
            atomic_fetch_add(&failed, 1);
            bench_stop();
            return;
        }
        uv_read_start((uv_stream_t *)&a->tcp, on_alloc, on_read);
        a->state = 1;
    }
}

static void *worker_main(void *p) {
    worker *w = p;
    start_connects(w);
    uv_run(&w->loop, UV_RUN_DEFAULT);
    return NULL;
}

int main(int argc, char **argv) {
    nagents = 1024;
    const char *server = NULL, *rdzv_bin = NULL, *token_file = NULL;
    int kv = 0, kv_clients = 4;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--agents") == 0 && i + 1 < argc)
            nagents = atoi_checked(argv[++i]);
        else if (strcmp(argv[i], "--server") == 0 && i + 1 < argc)
            server = argv[++i];
        else if (strcmp(argv[i], "--rdzv") == 0 && i + 1 < argc)
            rdzv_bin = argv[++i];
        else if (strcmp(argv[i], "--token-file") == 0 && i + 1 < argc)
            token_file = argv[++i];
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            nworkers = atoi_checked(argv[++i]);
        else if (strcmp(argv[i], "--kv") == 0)
            kv = 1;
        else if (strcmp(argv[i], "--kv-clients") == 0 && i + 1 < argc)
            kv_clients = atoi_checked(argv[++i]);
        else {
            fprintf(stderr, "usage: rdzv_bench --agents N [--server HOST:PORT --token-file F] "
                            "[--rdzv PATH] [--threads T] [--kv [--kv-clients C]]\n");
            return 2;
        }
    }
    if (nworkers > MAX_THREADS) {
        fprintf(stderr, "rdzv_bench: --threads takes 1 to %d\n", MAX_THREADS);
        return 2;
    }
    if (nagents < 2) {
        fprintf(stderr, "rdzv_bench: --agents must be at least 2\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if ((rlim_t)nagents + 64 > rl.rlim_cur) {
        fprintf(stderr, "rdzv_bench: %d agents need %d file descriptors; the limit is %llu\n",
                nagents, nagents + 64, (unsigned long long)rl.rlim_cur);
        return 2;
    }
    char *tok = NULL;
    size_t toklen = 0;
    char err[512];
    if (token_file) {
        if (rdzv_load_token(token_file, &tok, &toklen, err, sizeof err) != GPL_OK) {
            fprintf(stderr, "rdzv_bench: %s\n", err);
            return 2;
        }
        token = tok;
    }
    snprintf(run_id, sizeof run_id, "bench-%d", (int)getpid());
    pid_t spid = 0;
    int port = 0;
    char host[256] = "127.0.0.1";
    if (server) {
        if (rdzv_parse_endpoint(server, RDZV_DEFAULT_PORT, host, sizeof host, &port) != GPL_OK) {
            fprintf(stderr, "rdzv_bench: --server takes HOST:PORT\n");
            return 2;
        }
    } else {
        /* start a real server with a token, on a free port */
        char tf[] = "/tmp/rdzv-bench-token-XXXXXX";
        int fd = mkstemp(tf);
        if (fd < 0 || write(fd, token, strlen(token)) != (ssize_t)strlen(token))
            return 1;
        close(fd);
        int pfd[2];
        if (pipe(pfd) != 0)
            return 1;
        spid = fork();
        if (spid == 0) {
            dup2(pfd[1], 1);
            close(pfd[0]);
            execl(rdzv_bin ? rdzv_bin : GPL_RDZV_BIN, "gpulaunch-rdzv", "--listen", "127.0.0.1:0",
                  "--token-file", tf, "--max-connections", "70000", (char *)NULL);
            _exit(127);
        }
        close(pfd[1]);
        char line[256] = "";
        ssize_t n = read(pfd[0], line, sizeof line - 1);
        unlink(tf);
        line[n > 0 ? n : 0] = 0;
        char *p = strstr(line, "127.0.0.1:");
        if (p == NULL) {
            fprintf(stderr, "rdzv_bench: the server did not start: %s\n", line);
            return 1;
        }
        port = (int)strtol(p + 10, NULL, 10);
    }
    uv_ip4_addr(host, port, &server_addr);
    server_pid = spid;
    double cpu0 = spid ? cpu_s(spid) : 0, self0 = cpu_s(getpid());
    if (nworkers > nagents)
        nworkers = nagents;
    agents = calloc((size_t)nagents, sizeof *agents);
    for (int t = 0; t < nworkers; t++) {
        worker *w = &workers[t];
        uv_loop_init(&w->loop);
        uv_async_init(&w->loop, &w->wake, on_wake);
        rdzv_buf_init(&w->out, RDZV_MAX_FRAME + 4);
        w->lo = (int)((long)nagents * t / nworkers);
        w->hi = (int)((long)nagents * (t + 1) / nworkers);
        w->next_connect = w->lo;
    }
    /* Each simulated node has its socket before the clock starts, as a real
     * node would: creating 16k sockets is the bench's set-up, not the service's
     * work (it takes one core about 0.1 s here). */
    uint64_t t_setup = gb_now_ns();
    for (int i = 0; i < nagents; i++) {
        agent *a = &agents[i];
        int t = 0;
        while (i >= workers[t].hi)
            t++;
        a->w = &workers[t];
        a->id = i;
        rdzv_buf_init(&a->in, RDZV_MAX_FRAME + 65536);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
        if (fd < 0) {
            fprintf(stderr, "rdzv_bench: socket: %s\n", strerror(errno));
            return 1;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        /* Real nodes have their own addresses; spread the agents over 64
         * loopback sources so that the kernel's ephemeral-port search stays
         * short (with one source it grows with every connection). */
        if (strcmp(host, "127.0.0.1") == 0) {
            struct sockaddr_in src;
            char ip[32];
            snprintf(ip, sizeof ip, "127.0.%d.%d", 1 + (i % 64) / 250, 2 + (i % 64) % 250);
            uv_ip4_addr(ip, 0, &src);
            setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
            if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0) {
                fprintf(stderr, "rdzv_bench: bind %s: %s\n", ip, strerror(errno));
                return 1;
            }
        }
        uv_tcp_init(&a->w->loop, &a->tcp);
        uv_tcp_open(&a->tcp, fd);
        a->tcp.data = a;
    }
    fprintf(stderr, "rdzv_bench: %d sockets created in %.3f s (not timed), %d threads\n", nagents,
            (double)(gb_now_ns() - t_setup) / 1e9, nworkers);
    t_start = gb_now_ns();
    for (int t = 0; t < nworkers; t++)
        pthread_create(&workers[t].th, NULL, worker_main, &workers[t]);
    for (int t = 0; t < nworkers; t++)
        pthread_join(workers[t].th, NULL);
    double join_s = (double)(t_all_assigned - t_start) / 1e9;
    double server_cpu = spid ? cpu_at_assigned[0] - cpu0 : -1,
           self_cpu = cpu_at_assigned[1] - self0;
    double told_ms = told == nagents - 1 ? (double)(t_all_told - t_drop) / 1e6 : -1;
    printf("rdzv_bench agents=%d challenged=%d assigned=%d survivors_told=%d of %d in %.1f ms "
           "(all handshakes sent after %.3f s)\n",
           nagents, atomic_load(&welcomed), atomic_load(&assigned), atomic_load(&told), nagents - 1,
           told_ms, (double)(t_all_welcomed - t_start) / 1e9);
    printf(
        "rdzv_bench cpu until assigned: server %.3f s, the simulated agents %.3f s, on %ld cores\n",
        server_cpu, self_cpu, sysconf(_SC_NPROCESSORS_ONLN));
    if (kv && spid) {
        /* a fresh single-node job whose store the clients use */
        snprintf(run_id, sizeof run_id, "bench-kv-%d", (int)getpid());
        rdzv_bclient *node;
        if (rdzv_bclient_connect("127.0.0.1", port, token, strlen(token), 5000, &node, err,
                                 sizeof err) == GPL_OK) {
            /* join through a raw frame: the blocking client has no JOIN call */
            rdzv_msg j = {.type = RDZV_JOIN, .req_id = 99};
            snprintf(j.u.join.run_id, sizeof j.u.join.run_id, "%s", run_id);
            snprintf(j.u.join.hostname, sizeof j.u.join.hostname, "kvnode");
            j.u.join.nproc = 1;
            j.u.join.static_rank = 0;
            j.u.join.min_nodes = j.u.join.max_nodes = 1;
            j.u.join.heartbeat_timeout_ms = 600000;
            rdzv_buf b;
            rdzv_buf_init(&b, 4096);
            rdzv_encode(&j, &b);
            if (write(rdzv_bclient_fd(node), b.data, b.len) != (ssize_t)b.len)
                fprintf(stderr, "rdzv_bench: join write failed\n");
            rdzv_buf_free(&b);
            usleep(200000);
            pthread_t th[64];
            kv_arg ka[64];
            if (kv_clients > 64)
                kv_clients = 64;
            for (int i = 0; i < kv_clients; i++) {
                ka[i] = (kv_arg){.port = port, .id = i, .seconds = 2.0};
                pthread_create(&th[i], NULL, kv_worker, &ka[i]);
            }
            long total = 0;
            for (int i = 0; i < kv_clients; i++) {
                pthread_join(th[i], NULL);
                total += ka[i].ops;
            }
            printf("rdzv_bench kv_clients=%d kv_ops_per_s=%.0f\n", kv_clients, total / 2.0);
            rdzv_bclient_close(node);
        }
    }
    double rss = spid ? peak_rss_mib(spid) : -1;
    /* The agents go first and reset their connections (linger 0), so that no
     * side keeps 16k TIME_WAIT entries that would slow the next run's connects. */
    for (int i = 0; i < nagents; i++) {
        uv_os_fd_t fd;
        struct linger lg = {1, 0};
        if (i == atomic_load(&dropped))
            continue;
        if (uv_fileno((uv_handle_t *)&agents[i].tcp, &fd) == 0)
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        uv_close((uv_handle_t *)&agents[i].tcp, NULL);
    }
    for (int t = 0; t < nworkers; t++) {
        uv_close((uv_handle_t *)&workers[t].wake, NULL);
        uv_run(&workers[t].loop, UV_RUN_DEFAULT);
        uv_loop_close(&workers[t].loop);
    }
    if (spid) {
        kill(spid, SIGTERM);
        waitpid(spid, NULL, 0);
    }
    printf("rdzv_bench agents=%d join_to_assigned_s=%.3f server_peak_rss_mib=%.1f\n", nagents,
           join_s, rss);
    free(tok);
    return atomic_load(&failed) || atomic_load(&assigned) != nagents ? 1 : 0;
}
