/* gpulaunch-rdzv: the standalone rendezvous server. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "gb_log.h"
#include "gpulaunch/rdzv.h"

#define GB_COMPONENT "rdzv"

/* files the server needs besides its connections: listeners, the loop's own
 * descriptors, the HTTP port, logs */
#define RDZV_FD_RESERVE 64

/* As redis does for maxclients: raise the open-file limit to what
 * --max-connections needs (up to the hard limit, or past it when privileged),
 * and say so at start when it stays lower, instead of failing accepts later. */
static void fit_nofile(uint32_t max_connections) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t want = (rlim_t)max_connections + RDZV_FD_RESERVE;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        /* the soft limit up to the hard one; past it only when privileged */
        int room = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want;
        struct rlimit both = {want, room ? rl.rlim_max : want};
        struct rlimit soft = {room ? want : rl.rlim_max, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &both) != 0)
            (void)setrlimit(RLIMIT_NOFILE, &soft);
        (void)getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want)
        GB_WARN(
            "the open-file limit is %llu, so at most about %llu connections will be served "
            "(--max-connections %u); raise it (ulimit -n, systemd LimitNOFILE=, the "
            "container's nofile ulimit) or lower --max-connections",
            (unsigned long long)rl.rlim_cur,
            (unsigned long long)(rl.rlim_cur > RDZV_FD_RESERVE ? rl.rlim_cur - RDZV_FD_RESERVE : 0),
            max_connections);
}

static const char usage[] =
    "usage: gpulaunch-rdzv [options]\n"
    "\n"
    "The gpulaunch rendezvous server: gathers the nodes of each job (by run id),\n"
    "assigns ranks, keeps the bootstrap key-value store, watches heartbeats and\n"
    "tells every node at once when a node dies or a job event is raised.\n"
    "\n"
    "  --listen ADDR:PORT          where nodes connect (default 0.0.0.0:29400)\n"
    "  --http ADDR:PORT            the job page at /, /metrics, /status and /healthz\n"
    "                              (default: off)\n"
    "  --token-file FILE           shared token; also GPULAUNCH_RDZV_TOKEN\n"
    "  --max-connections N         open connections (default 65536; the open-file\n"
    "                              limit is raised to fit, with a warning if it cannot be)\n"
    "  --max-jobs N                jobs held at once (default 1024)\n"
    "  --max-nodes N               nodes in one job (default 65536)\n"
    "  --max-job-kv-bytes N        key-value bytes per job (default 268435456)\n"
    "  --max-outq-bytes N          unsent bytes per client before it is dropped (default "
    "8388608)\n"
    "  --handshake-timeout-ms N    time to finish the handshake (default 5000)\n"
    "  --heartbeat-timeout-ms N    default node heartbeat timeout (default 5000)\n"
    "  --straggler-threshold X     name a rank whose busy time per step is over X times\n"
    "                              the job's median (default 1.3; docs/health.md)\n"
    "  --straggler-windows N       ... for N consecutive windows of its reports (default 2)\n"
    "  --probes on|udp|off         probe a node its peers wait for, or that falls silent,\n"
    "                              and find it lost before the heartbeat timeout when it\n"
    "                              answers no ping, directly and through its peers over\n"
    "                              UDP and TCP (default on); udp: no TCP (kernel) probes,\n"
    "                              where a firewall lets only UDP through; off: the\n"
    "                              heartbeat timeout alone (docs/protocol.md)\n"
    "  --log-level LEVEL           error, warn, info or debug (default warn;\n"
    "                              also GPULAUNCH_LOG_LEVEL)\n"
    "  --help                      this text\n"
    "\n"
    "Exit codes: 0 after SIGTERM/SIGINT, 2 bad usage, 3 cannot listen.\n";

static uv_signal_t sigterm, sigint;
static rdzv_server *server;

static void on_signal(uv_signal_t *h, int signum) {
    GB_WARN("signal %d: shutting down", signum);
    rdzv_server_close(server);
    uv_close((uv_handle_t *)&sigterm, NULL);
    uv_close((uv_handle_t *)&sigint, NULL);
}

static int parse_u64(const char *opt, const char *s, uint64_t max, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || end == s || s[0] == '-' || v == 0 || v > max) {
        fprintf(stderr, "gpulaunch-rdzv: %s takes an integer from 1 to %llu, not '%s'\n", opt,
                (unsigned long long)max, s);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv) {
    enum {
        O_LISTEN = 256,
        O_HTTP,
        O_TOKEN,
        O_MAXC,
        O_MAXJ,
        O_MAXN,
        O_KV,
        O_OUTQ,
        O_HS,
        O_HB,
        O_LOG,
        O_STRAG_T,
        O_STRAG_W,
        O_PROBES
    };
    static const struct option longopts[] = {
        {"listen", required_argument, 0, O_LISTEN},
        {"http", required_argument, 0, O_HTTP},
        {"token-file", required_argument, 0, O_TOKEN},
        {"max-connections", required_argument, 0, O_MAXC},
        {"max-jobs", required_argument, 0, O_MAXJ},
        {"max-nodes", required_argument, 0, O_MAXN},
        {"max-job-kv-bytes", required_argument, 0, O_KV},
        {"max-outq-bytes", required_argument, 0, O_OUTQ},
        {"handshake-timeout-ms", required_argument, 0, O_HS},
        {"heartbeat-timeout-ms", required_argument, 0, O_HB},
        {"log-level", required_argument, 0, O_LOG},
        {"straggler-threshold", required_argument, 0, O_STRAG_T},
        {"straggler-windows", required_argument, 0, O_STRAG_W},
        {"probes", required_argument, 0, O_PROBES},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    rdzv_server_options o = RDZV_SERVER_OPTIONS_INIT;
    signal(SIGPIPE, SIG_IGN); /* a client that went away is handled, not fatal */
    char lhost[256] = "0.0.0.0", hhost[256] = "";
    int lport = RDZV_DEFAULT_PORT, hport = 0;
    const char *token_file = NULL;
    uint64_t v;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (ch) {
        case O_LISTEN:
            if (rdzv_parse_endpoint(optarg, RDZV_DEFAULT_PORT, lhost, sizeof lhost, &lport) !=
                GPL_OK) {
                fprintf(stderr,
                        "gpulaunch-rdzv: --listen takes ADDR:PORT (e.g. 0.0.0.0:29400), "
                        "not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case O_HTTP:
            if (rdzv_parse_endpoint(optarg, 0, hhost, sizeof hhost, &hport) != GPL_OK) {
                fprintf(stderr, "gpulaunch-rdzv: --http takes ADDR:PORT, not '%s'\n", optarg);
                return 2;
            }
            break;
        case O_TOKEN:
            token_file = optarg;
            break;
        case O_MAXC:
            if (parse_u64("--max-connections", optarg, 1u << 20, &v))
                return 2;
            o.max_connections = (uint32_t)v;
            break;
        case O_MAXJ:
            if (parse_u64("--max-jobs", optarg, 1u << 20, &v))
                return 2;
            o.max_jobs = (uint32_t)v;
            break;
        case O_MAXN:
            if (parse_u64("--max-nodes", optarg, 1u << 20, &v))
                return 2;
            o.max_nodes = (uint32_t)v;
            break;
        case O_KV:
            if (parse_u64("--max-job-kv-bytes", optarg, 1ull << 40, &v))
                return 2;
            o.max_job_kv_bytes = v;
            break;
        case O_OUTQ:
            if (parse_u64("--max-outq-bytes", optarg, 1u << 30, &v))
                return 2;
            o.max_outq_bytes = (uint32_t)v;
            break;
        case O_HS:
            if (parse_u64("--handshake-timeout-ms", optarg, 3600000, &v))
                return 2;
            o.handshake_timeout_ms = (uint32_t)v;
            break;
        case O_HB:
            if (parse_u64("--heartbeat-timeout-ms", optarg, 3600000, &v))
                return 2;
            o.heartbeat_timeout_ms = (uint32_t)v;
            break;
        case O_STRAG_T: {
            char *end;
            errno = 0;
            double t = strtod(optarg, &end);
            if (errno || *end || end == optarg || !(t > 1.0 && t <= 100.0)) {
                fprintf(stderr,
                        "gpulaunch-rdzv: --straggler-threshold takes a number over 1 and up to "
                        "100 (a multiple of the job's median), not '%s'\n",
                        optarg);
                return 2;
            }
            o.straggler_threshold = t;
            break;
        }
        case O_PROBES:
            if (strcmp(optarg, "on") == 0)
                o.probes = RDZV_PROBES_ON;
            else if (strcmp(optarg, "udp") == 0)
                o.probes = RDZV_PROBES_UDP;
            else if (strcmp(optarg, "off") == 0)
                o.probes = RDZV_PROBES_OFF;
            else {
                fprintf(stderr, "gpulaunch-rdzv: --probes takes on, udp or off, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case O_STRAG_W:
            if (parse_u64("--straggler-windows", optarg, 1000, &v))
                return 2;
            o.straggler_windows = (uint32_t)v;
            break;
        case O_LOG: {
            int l = gb_log_parse_level(optarg);
            if (l < 0) {
                fprintf(stderr,
                        "gpulaunch-rdzv: --log-level takes error, warn, info or debug, "
                        "not '%s'\n",
                        optarg);
                return 2;
            }
            gb_log_set_level(l);
            break;
        }
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            fputs(usage, stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "gpulaunch-rdzv: unexpected argument '%s'\n%s", argv[optind], usage);
        return 2;
    }
    char err[512] = "";
    char *token = NULL;
    size_t token_len = 0;
    if (rdzv_load_token(token_file, &token, &token_len, err, sizeof err) != GPL_OK) {
        fprintf(stderr, "gpulaunch-rdzv: %s\n", err);
        return 2;
    }
    o.listen_addr = lhost;
    o.listen_port = lport;
    o.token = token;
    o.token_len = token_len;
    fit_nofile(o.max_connections);
    uv_loop_t *loop = uv_default_loop();
    if (rdzv_server_start(loop, &o, &server, err, sizeof err) != GPL_OK) {
        fprintf(stderr, "gpulaunch-rdzv: %s\n", err);
        free(token);
        return 3;
    }
    free(token);
    if (hhost[0] && rdzv_server_serve_http(server, hhost, hport, err, sizeof err) != GPL_OK) {
        fprintf(stderr, "gpulaunch-rdzv: %s\n", err);
        rdzv_server_close(server);
        uv_run(loop, UV_RUN_DEFAULT);
        return 3;
    }
    printf("gpulaunch-rdzv listening on %s:%d", lhost, rdzv_server_port(server));
    if (hhost[0])
        printf(" http %s:%d", hhost, rdzv_server_http_port(server));
    printf("\n");
    fflush(stdout);
    uv_signal_init(loop, &sigterm);
    uv_signal_init(loop, &sigint);
    uv_signal_start(&sigterm, on_signal, SIGTERM);
    uv_signal_start(&sigint, on_signal, SIGINT);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    return 0;
}
