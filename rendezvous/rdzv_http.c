/* Observability over HTTP: /metrics (Prometheus text), /status (JSON),
 * /healthz. libmicrohttpd parses HTTP; its epoll fd is driven from the
 * server's libuv loop, so no thread touches the server state. */
#include <microhttpd.h>
#include <stdarg.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb_log.h"
#include "gb_time.h"
#include "rdzv_health_render.h"
#include "rdzv_sbuf.h"
#include "rdzv_server_int.h"

#define GB_COMPONENT "rdzv-http"

struct rdzv_http {
    struct MHD_Daemon *d;
    uv_poll_t poll;
    uv_timer_t timer;
    int port;
    int handles; /* of poll and timer, not closed yet: h goes with the last */
};

char *rdzv_render_metrics(rdzv_server *s) {
    sbuf b = {0};
    uint64_t nodes = 0;
    job *j;
    LIST_FOREACH(j, &s->jobs, link)
    nodes += j->r.nactive + j->r.npending;
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_jobs Jobs held by the server.\n"
              "# TYPE gpulaunch_rdzv_jobs gauge\ngpulaunch_rdzv_jobs %u\n",
              s->njobs);
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_nodes Nodes in a round or waiting for one.\n"
              "# TYPE gpulaunch_rdzv_nodes gauge\ngpulaunch_rdzv_nodes %llu\n",
              (unsigned long long)nodes);
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_connections Open client connections.\n"
              "# TYPE gpulaunch_rdzv_connections gauge\ngpulaunch_rdzv_connections %llu\n",
              (unsigned long long)s->m.connections_open);
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_connections_total Accepted connections.\n"
              "# TYPE gpulaunch_rdzv_connections_total counter\n"
              "gpulaunch_rdzv_connections_total %llu\n",
              (unsigned long long)s->m.connections_total);
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_rounds_total Rounds assigned.\n"
              "# TYPE gpulaunch_rdzv_rounds_total counter\ngpulaunch_rdzv_rounds_total %llu\n",
              (unsigned long long)s->m.rounds);
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_joins_total JOIN requests accepted.\n"
              "# TYPE gpulaunch_rdzv_joins_total counter\ngpulaunch_rdzv_joins_total %llu\n",
              (unsigned long long)s->m.joins);
    sb_printf(&b, "# HELP gpulaunch_rdzv_failures_total Rounds ended by a node, by reason.\n"
                  "# TYPE gpulaunch_rdzv_failures_total counter\n");
    static const uint32_t reasons[] = {RDZV_REASON_DISCONNECT, RDZV_REASON_HEARTBEAT,
                                       RDZV_REASON_FAILED, RDZV_REASON_LEFT, RDZV_REASON_HUNG};
    static const char *const names[] = {"disconnect", "heartbeat", "worker_failed", "left", "hung"};
    for (size_t i = 0; i < 5; i++)
        sb_printf(&b, "gpulaunch_rdzv_failures_total{reason=\"%s\"} %llu\n", names[i],
                  (unsigned long long)s->m.failures[reasons[i]]);
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_kv_ops_total Key-value operations.\n"
              "# TYPE gpulaunch_rdzv_kv_ops_total counter\ngpulaunch_rdzv_kv_ops_total %llu\n",
              (unsigned long long)s->m.kv_ops);
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_auth_refused_total Connections refused for their token.\n"
              "# TYPE gpulaunch_rdzv_auth_refused_total counter\n"
              "gpulaunch_rdzv_auth_refused_total %llu\n",
              (unsigned long long)s->m.auth_refused);
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_protocol_errors_total Connections closed for bad input.\n"
              "# TYPE gpulaunch_rdzv_protocol_errors_total counter\n"
              "gpulaunch_rdzv_protocol_errors_total %llu\n",
              (unsigned long long)s->m.protocol_errors);
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_probes_total Nodes probed because their peers waited for "
              "them in a collective or they went silent, by outcome.\n"
              "# TYPE gpulaunch_rdzv_probes_total counter\n"
              "gpulaunch_rdzv_probes_total{result=\"answered\"} %llu\n"
              "gpulaunch_rdzv_probes_total{result=\"unanswered\"} %llu\n"
              "gpulaunch_rdzv_probes_total{result=\"moot\"} %llu\n",
              (unsigned long long)s->m.probes_answered, (unsigned long long)s->m.probes_unanswered,
              (unsigned long long)s->m.probes_moot);
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_frames_total Protocol frames the server decoded (in) and "
              "sent (out).\n"
              "# TYPE gpulaunch_rdzv_frames_total counter\n"
              "gpulaunch_rdzv_frames_total{direction=\"in\"} %llu\n"
              "gpulaunch_rdzv_frames_total{direction=\"out\"} %llu\n",
              (unsigned long long)s->m.frames_in, (unsigned long long)s->m.frames_out);
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_probe_relays_total Peer nodes asked to probe a suspect that "
              "did not answer the server, by what they said (no_answer: nothing, or only after it "
              "was settled).\n"
              "# TYPE gpulaunch_rdzv_probe_relays_total counter\n"
              "gpulaunch_rdzv_probe_relays_total{result=\"reached\"} %llu\n"
              "gpulaunch_rdzv_probe_relays_total{result=\"unreached\"} %llu\n"
              "gpulaunch_rdzv_probe_relays_total{result=\"machine\"} %llu\n"
              "gpulaunch_rdzv_probe_relays_total{result=\"unable\"} %llu\n"
              "gpulaunch_rdzv_probe_relays_total{result=\"no_answer\"} %llu\n",
              (unsigned long long)s->m.relays_reached, (unsigned long long)s->m.relays_unreached,
              (unsigned long long)s->m.relays_machine, (unsigned long long)s->m.relays_unable,
              (unsigned long long)(s->m.relays_sent - s->m.relays_reached - s->m.relays_unreached -
                                   s->m.relays_machine - s->m.relays_unable));
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_machine_checks_total Checks that a node's kernel-probe port "
              "(TCP, its UDP peer port's number) is reached from a peer, by result (unreached: "
              "kernel probes of that node are off, said in the log; unable: the peer could not "
              "try; no_answer: the peer said nothing in time).\n"
              "# TYPE gpulaunch_rdzv_machine_checks_total counter\n"
              "gpulaunch_rdzv_machine_checks_total{result=\"reached\"} %llu\n"
              "gpulaunch_rdzv_machine_checks_total{result=\"unreached\"} %llu\n"
              "gpulaunch_rdzv_machine_checks_total{result=\"unable\"} %llu\n"
              "gpulaunch_rdzv_machine_checks_total{result=\"no_answer\"} %llu\n",
              (unsigned long long)s->m.checks_reached, (unsigned long long)s->m.checks_unreached,
              (unsigned long long)s->m.checks_unable, (unsigned long long)s->m.checks_no_answer);
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_moves_total Nodes that moved their running round to a new "
              "connection because the old one stalled.\n"
              "# TYPE gpulaunch_rdzv_moves_total counter\ngpulaunch_rdzv_moves_total %llu\n"
              "# HELP gpulaunch_rdzv_moves_back_total Nodes that went back to the connection they "
              "moved from when their launcher closed the new one.\n"
              "# TYPE gpulaunch_rdzv_moves_back_total counter\n"
              "gpulaunch_rdzv_moves_back_total %llu\n",
              (unsigned long long)s->m.moves, (unsigned long long)s->m.moves_back);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    /* what the server holds from malloc, not what the allocator keeps free:
     * back where it started once every job is gone (test/bench/rdzv_soak) */
    struct mallinfo2 mi = mallinfo2();
    sb_printf(&b,
              "# HELP gpulaunch_rdzv_heap_bytes Bytes the server holds from malloc.\n"
              "# TYPE gpulaunch_rdzv_heap_bytes gauge\ngpulaunch_rdzv_heap_bytes %zu\n",
              mi.uordblks + mi.hblkhd);
#endif
    rdzv_health_render_metrics(s, &b);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

static const char *state_name(int st) { return rdzv_round_state_name(st); }

char *rdzv_render_status(rdzv_server *s) { return rdzv_render_status_of(s, NULL); }

char *rdzv_render_status_of(rdzv_server *s, const char *only) {
    sbuf b = {0};
    uint64_t now = gb_now_ms();
    sb_printf(&b, "{\"server_unix_ms\":%.0f,\"jobs\":[", gb_wall_s() * 1000.0);
    job *j;
    int first = 1;
    LIST_FOREACH(j, &s->jobs, link) {
        if (only && strcmp(only, j->r.run_id) != 0)
            continue;
        sb_printf(&b, "%s{\"run_id\":", first ? "" : ",");
        first = 0;
        sb_json_str(&b, j->r.run_id);
        sb_printf(&b,
                  ",\"state\":\"%s\",\"round\":%u,\"min_nodes\":%u,\"max_nodes\":%u,"
                  "\"waiting\":%u,\"members\":[",
                  state_name(j->r.state), j->r.round, j->r.min_nodes, j->r.max_nodes,
                  j->r.npending);
        int firstm = 1;
        for (uint32_t i = 0; i < j->r.nranks; i++) {
            rdzv_rmember *m = j->r.ranks[i];
            if (m == NULL)
                continue;
            sb_printf(&b, "%s{\"node_rank\":%u,\"hostname\":", firstm ? "" : ",", i);
            firstm = 0;
            sb_json_str(&b, m->hostname);
            sb_printf(&b, ",\"addr\":");
            sb_json_str(&b, m->addr);
            sb_printf(&b, ",\"nproc\":%u,\"last_heartbeat_age_s\":%.3f,\"state\":\"%s\"", m->nproc,
                      (double)(now - rdzv_member_last_rx_ms(m)) / 1000.0,
                      m->done ? "done" : "running");
            rdzv_health_render_member(j, m, &b);
            sb_printf(&b, "}");
        }
        sb_printf(&b, "]");
        rdzv_health_render_job(j, &b, now);
        sb_printf(&b, "}");
    }
    sb_printf(&b, "]");
    if (only) {
        /* ?job=: that job in full, and a line for every job (the page's list) */
        sb_printf(&b, ",\"job_list\":[");
        first = 1;
        LIST_FOREACH(j, &s->jobs, link) {
            sb_printf(&b, "%s", first ? "" : ",");
            first = 0;
            rdzv_health_render_job_line(j, &b);
        }
        sb_printf(&b, "]");
    }
    sb_printf(&b, "}\n");
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *hc, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **ctx) {
    rdzv_server *s = cls;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        static char msg[] = "only GET\n";
        struct MHD_Response *r =
            MHD_create_response_from_buffer(sizeof msg - 1, msg, MHD_RESPMEM_PERSISTENT);
        enum MHD_Result rc = MHD_queue_response(hc, MHD_HTTP_METHOD_NOT_ALLOWED, r);
        MHD_destroy_response(r);
        return rc;
    }
    char *body = NULL;
    const char *type = "text/plain; version=0.0.4";
    unsigned code = MHD_HTTP_OK;
    if (strcmp(url, "/metrics") == 0) {
        body = rdzv_render_metrics(s);
    } else if (strcmp(url, "/status") == 0) {
        /* ?job=RUN_ID: that job only, plus the list of all (what the page reads) */
        const char *only = MHD_lookup_connection_value(hc, MHD_GET_ARGUMENT_KIND, "job");
        body = only ? rdzv_render_status_of(s, only) : rdzv_render_status(s);
        type = "application/json";
    } else if (strcmp(url, "/") == 0 || strcmp(url, "/index.html") == 0) {
        /* the job page (rdzv_page.html, embedded at build time): it reads /status */
        struct MHD_Response *r = MHD_create_response_from_buffer(
            rdzv_page_html_len, (void *)rdzv_page_html, MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result rc = MHD_queue_response(hc, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        return rc;
    } else if (strcmp(url, "/healthz") == 0) {
        body = strdup("ok\n");
        type = "text/plain";
    } else {
        body = strdup("not found: try /, /metrics, /status or /healthz\n");
        type = "text/plain";
        code = MHD_HTTP_NOT_FOUND;
    }
    if (body == NULL)
        return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result rc = MHD_queue_response(hc, code, r);
    MHD_destroy_response(r);
    return rc;
}

static void on_http_timer(uv_timer_t *t);

static void http_rearm(struct rdzv_http *h) {
    MHD_UNSIGNED_LONG_LONG to;
    if (MHD_get_timeout(h->d, &to) == MHD_YES)
        uv_timer_start(&h->timer, on_http_timer, to, 0);
}

static void on_http_timer(uv_timer_t *t) {
    struct rdzv_http *h = t->data;
    MHD_run(h->d);
    http_rearm(h);
}

static void on_http_poll(uv_poll_t *p, int status, int events) {
    struct rdzv_http *h = p->data;
    MHD_run(h->d);
    http_rearm(h);
}

static void http_close(rdzv_server *s);

gpl_result_t rdzv_server_serve_http(rdzv_server *s, const char *addr, int port, char *err,
                                    size_t errlen) {
    struct rdzv_http *h = calloc(1, sizeof *h);
    if (h == NULL) {
        snprintf(err, errlen, "out of memory");
        return GPL_ERR_NOMEM;
    }
    struct sockaddr_storage sa;
    int r = strchr(addr, ':') ? uv_ip6_addr(addr, port, (struct sockaddr_in6 *)&sa)
                              : uv_ip4_addr(addr, port, (struct sockaddr_in *)&sa);
    if (r != 0) {
        snprintf(err, errlen, "HTTP address '%s' is not an IP address", addr);
        free(h);
        return GPL_ERR_INVALID_ARG;
    }
    h->d = MHD_start_daemon(MHD_USE_EPOLL | (strchr(addr, ':') ? MHD_USE_IPv6 : 0), (uint16_t)port,
                            NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)256,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    if (h->d == NULL) {
        snprintf(err, errlen, "cannot serve HTTP on %s:%d (port in use?)", addr, port);
        free(h);
        return GPL_ERR_SYSTEM;
    }
    const union MHD_DaemonInfo *li = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = li ? li->port : port;
    const union MHD_DaemonInfo *ei = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_EPOLL_FD);
    uv_poll_init(s->loop, &h->poll, ei->epoll_fd);
    uv_timer_init(s->loop, &h->timer);
    h->poll.data = h;
    h->timer.data = h;
    uv_poll_start(&h->poll, UV_READABLE, on_http_poll);
    s->http = h;
    s->http_close = http_close;
    GB_INFO("HTTP observability on %s:%d (/ /metrics /status /healthz)", addr, h->port);
    return GPL_OK;
}

int rdzv_server_http_port(const rdzv_server *s) { return s->http ? s->http->port : -1; }

/* libuv runs close callbacks newest first: h lives until both have run (the
 * poll's after the timer's would read freed memory). */
static void on_http_closed(uv_handle_t *hd) {
    struct rdzv_http *h = hd->data;
    if (--h->handles == 0)
        free(h);
}

static void http_close(rdzv_server *s) {
    struct rdzv_http *h = s->http;
    s->http = NULL;
    h->handles = 2;
    uv_close((uv_handle_t *)&h->poll, on_http_closed);
    uv_close((uv_handle_t *)&h->timer, on_http_closed);
    MHD_stop_daemon(h->d);
}
