/* The launcher's Prometheus endpoint (see gl_metrics.h). */
#include <http_parser.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "gb_procstat.h"
#include "gl_metrics.h"
#include "gl_progress.h"
#include "gpulaunch/rdzv.h"

typedef struct mconn {
    uv_tcp_t tcp;
    uv_write_t wr;
    http_parser parser;
    char url[256];
    size_t url_len, seen;
    int done;     /* a whole request was parsed */
    int too_long; /* its URL did not fit: not ours */
    char *resp;
} mconn;

static struct {
    uv_loop_t *loop;
    uv_tcp_t server;
    gl_metrics_render_fn render;
    int conns;
    http_parser_settings settings;
} X;

static void on_closed(uv_handle_t *h) {
    mconn *c = h->data;
    free(c->resp);
    free(c);
    X.conns--;
}

static void on_written(uv_write_t *req, int status) {
    (void)status;
    uv_close((uv_handle_t *)req->handle, on_closed);
}

static void respond(mconn *c, int code, const char *status, const char *type, const char *body,
                    size_t len) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    size_t cap = len + 256;
    c->resp = malloc(cap);
    if (c->resp == NULL) {
        uv_close((uv_handle_t *)&c->tcp, on_closed);
        return;
    }
    int h = snprintf(c->resp, cap,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     code, status, type, len);
    memcpy(c->resp + h, body, len);
    uv_buf_t buf = uv_buf_init(c->resp, (unsigned)((size_t)h + len));
    if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &buf, 1, on_written) != 0)
        uv_close((uv_handle_t *)&c->tcp, on_closed);
}

static void answer(mconn *c) {
    static const char text[] = "text/plain; version=0.0.4; charset=utf-8";
    struct http_parser_url u;
    http_parser_url_init(&u);
    char path[256] = "";
    if (!c->too_long && http_parser_parse_url(c->url, c->url_len, 0, &u) == 0 &&
        (u.field_set & (1 << UF_PATH)))
        snprintf(path, sizeof path, "%.*s", (int)u.field_data[UF_PATH].len,
                 c->url + u.field_data[UF_PATH].off);
    if (c->parser.method != HTTP_GET && c->parser.method != HTTP_HEAD) {
        static const char m[] = "only GET: the launcher serves /metrics\n";
        respond(c, 405, "Method Not Allowed", text, m, sizeof m - 1);
        return;
    }
    if (strcmp(path, "/metrics") != 0 && strcmp(path, "/") != 0) {
        static const char m[] = "not found: the launcher serves /metrics\n";
        respond(c, 404, "Not Found", text, m, sizeof m - 1);
        return;
    }
    char *body = malloc(GL_METRICS_BODY_MAX);
    if (body == NULL) {
        uv_close((uv_handle_t *)&c->tcp, on_closed);
        return;
    }
    size_t len = X.render(body, GL_METRICS_BODY_MAX);
    respond(c, 200, "OK", text, body, c->parser.method == HTTP_HEAD ? 0 : len);
    free(body);
}

static int on_url(http_parser *p, const char *at, size_t len) {
    mconn *c = p->data;
    if (c->url_len + len >= sizeof c->url) {
        c->too_long = 1;
        return 0;
    }
    memcpy(c->url + c->url_len, at, len);
    c->url_len += len;
    c->url[c->url_len] = '\0';
    return 0;
}

static int on_complete(http_parser *p) {
    mconn *c = p->data;
    c->done = 1;
    return 1; /* one request per connection: stop here */
}

static void on_alloc(uv_handle_t *h, size_t want, uv_buf_t *buf) {
    (void)h;
    (void)want;
    static char chunk[4096]; /* parsed at once, never kept */
    *buf = uv_buf_init(chunk, sizeof chunk);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
    mconn *c = s->data;
    if (c->done || c->resp)
        return;
    if (n < 0) {
        uv_close((uv_handle_t *)s, on_closed);
        return;
    }
    c->seen += (size_t)n;
    http_parser_execute(&c->parser, &X.settings, buf->base, (size_t)n);
    if (c->done) {
        answer(c);
        return;
    }
    if (HTTP_PARSER_ERRNO(&c->parser) != HPE_OK || c->seen > GL_METRICS_REQUEST_MAX) {
        static const char m[] = "bad request\n";
        respond(c, 400, "Bad Request", "text/plain", m, sizeof m - 1);
    }
}

static void on_connection(uv_stream_t *server, int status) {
    if (status != 0)
        return;
    mconn *c = calloc(1, sizeof *c);
    if (c == NULL)
        return;
    uv_tcp_init(X.loop, &c->tcp);
    c->tcp.data = c;
    X.conns++;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 || X.conns > GL_METRICS_CONN_MAX) {
        uv_close((uv_handle_t *)&c->tcp, on_closed);
        return;
    }
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

/* ---- the launcher's own figures ---- */

void gl_pb_printf(gl_pbuf *b, const char *fmt, ...) {
    if (b->full || b->cap == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= b->cap - b->len) {
        b->p[b->len] = '\0'; /* over GL_METRICS_BODY_MAX: cut at the last whole line */
        b->full = 1;
        return;
    }
    b->len += (size_t)n;
}

static void pb_family(gl_pbuf *b, const char *name, const char *type, const char *help) {
    gl_pb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void on_walk(uv_handle_t *h, void *arg) {
    long *by_type = arg;
    if (h->type > UV_UNKNOWN_HANDLE && h->type < UV_HANDLE_TYPE_MAX)
        by_type[h->type]++;
}

size_t gl_metrics_process(char *buf, size_t cap, uv_loop_t *loop, int workers) {
    gl_pbuf b = {.p = buf, .cap = cap};
    gb_procstat ps;
    gb_procstat_read(0, &ps);
    struct rlimit rl;
    /* Prometheus' standard process figures, as its client libraries name them */
    if (ps.cpu_s >= 0) {
        pb_family(&b, "process_cpu_seconds_total", "counter",
                  "Total user and system CPU time spent in seconds.");
        gl_pb_printf(&b, "process_cpu_seconds_total %.17g\n", ps.cpu_s);
    }
    if (ps.fds >= 0) {
        pb_family(&b, "process_open_fds", "gauge", "Number of open file descriptors.");
        gl_pb_printf(&b, "process_open_fds %ld\n", ps.fds);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        pb_family(&b, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
        gl_pb_printf(&b, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
    }
    if (ps.rss_bytes >= 0) {
        pb_family(&b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
        gl_pb_printf(&b, "process_resident_memory_bytes %lld\n", ps.rss_bytes);
    }
    if (ps.vm_bytes >= 0) {
        pb_family(&b, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
        gl_pb_printf(&b, "process_virtual_memory_bytes %lld\n", ps.vm_bytes);
    }
    if (ps.start_unix_s >= 0) {
        pb_family(&b, "process_start_time_seconds", "gauge",
                  "Start time of the process since unix epoch in seconds.");
        gl_pb_printf(&b, "process_start_time_seconds %.2f\n", ps.start_unix_s);
    }
    /* what the launcher holds */
    if (ps.threads >= 0) {
        pb_family(&b, "gpulaunch_threads", "gauge", "threads of the launcher");
        gl_pb_printf(&b, "gpulaunch_threads %ld\n", ps.threads);
    }
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    /* what malloc has handed out and not had back: a leak grows it byte by byte */
    struct mallinfo2 mi = mallinfo2();
    pb_family(&b, "gpulaunch_heap_bytes", "gauge", "bytes allocated with malloc and not freed");
    gl_pb_printf(&b, "gpulaunch_heap_bytes %zu\n", mi.uordblks + mi.hblkhd);
#endif
    long kids = gb_procstat_children(0);
    if (kids >= 0) {
        pb_family(&b, "gpulaunch_child_processes", "gauge",
                  "processes whose parent is the launcher, zombies included");
        gl_pb_printf(&b, "gpulaunch_child_processes %ld\n", kids);
    }
    pb_family(&b, "gpulaunch_workers", "gauge", "local workers started and not yet reaped");
    gl_pb_printf(&b, "gpulaunch_workers %d\n", workers);
    long by_type[UV_HANDLE_TYPE_MAX] = {0};
    uv_walk(loop, on_walk, by_type);
    pb_family(&b, "gpulaunch_loop_handles", "gauge",
              "libuv handles on the launcher's loop by type, closing ones and this scrape's "
              "connection included");
    for (int t = UV_UNKNOWN_HANDLE + 1; t < UV_HANDLE_TYPE_MAX; t++)
        if (by_type[t] > 0)
            gl_pb_printf(&b, "gpulaunch_loop_handles{type=\"%s\"} %ld\n",
                         uv_handle_type_name((uv_handle_type)t), by_type[t]);
    int regions, pipes;
    long long bytes;
    gl_progress_held(&regions, &bytes, &pipes);
    pb_family(&b, "gpulaunch_progress_regions", "gauge",
              "progress channel regions mapped (a memfd, made once)");
    gl_pb_printf(&b, "gpulaunch_progress_regions %d\n", regions);
    pb_family(&b, "gpulaunch_progress_region_bytes", "gauge", "bytes of those regions");
    gl_pb_printf(&b, "gpulaunch_progress_region_bytes %lld\n", bytes);
    pb_family(&b, "gpulaunch_progress_pipes", "gauge", "progress channel pipe ends held");
    gl_pb_printf(&b, "gpulaunch_progress_pipes %d\n", pipes);
    return b.len;
}

/* ---- the endpoint ---- */

int gl_metrics_listen(uv_loop_t *loop, const char *spec, gl_metrics_render_fn render, char *err,
                      size_t errlen) {
    char host[256], full[300];
    int port;
    X.loop = loop;
    X.render = render;
    http_parser_settings_init(&X.settings);
    X.settings.on_url = on_url;
    X.settings.on_message_complete = on_complete;
    /* ":9402" as dcgm-exporter's ":9400": every interface */
    snprintf(full, sizeof full, "%s%s", spec[0] == ':' ? "0.0.0.0" : "", spec);
    if (rdzv_parse_endpoint(full, 0, host, sizeof host, &port) != GPL_OK || port <= 0) {
        snprintf(err, errlen, "--metrics '%s': expected HOST:PORT, e.g. 0.0.0.0:9402", spec);
        return 2;
    }
    struct sockaddr_storage sa;
    if (strcmp(host, "localhost") == 0)
        snprintf(host, sizeof host, "127.0.0.1");
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&sa) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa) != 0) {
        snprintf(err, errlen,
                 "--metrics %s: '%s' is not an IP address; give one (0.0.0.0: every "
                 "interface)",
                 spec, host);
        return 2;
    }
    uv_tcp_init(loop, &X.server);
    int r = uv_tcp_bind(&X.server, (struct sockaddr *)&sa, 0);
    if (r == 0)
        r = uv_listen((uv_stream_t *)&X.server, 64, on_connection);
    if (r != 0) {
        snprintf(err, errlen, "--metrics %s: cannot listen: %s; choose another port", spec,
                 uv_strerror(r));
        uv_close((uv_handle_t *)&X.server, NULL);
        return 2;
    }
    uv_unref((uv_handle_t *)&X.server);
    return 0;
}
