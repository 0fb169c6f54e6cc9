/* The launcher's Prometheus endpoint (--metrics HOST:PORT): GET /metrics on
 * the launcher's own libuv loop, requests parsed by http-parser (the C parser
 * libuv servers use; linked statically where Debian ships the archive). One
 * port per node, as dcgm-exporter's (docs/gpu-health.md says why). */
#ifndef GPULAUNCH_GL_METRICS_H
#define GPULAUNCH_GL_METRICS_H

#include <stddef.h>
#include <uv.h>

#define GL_METRICS_CONN_MAX 16      /* scrapes served at once; more are closed */
#define GL_METRICS_REQUEST_MAX 8192 /* bytes of one request (head and body) */
#define GL_METRICS_BODY_MAX 262144  /* bytes of one /metrics answer */

/* Writes the exposition text into buf (cap bytes, NUL-terminated), returns its length. */
typedef size_t (*gl_metrics_render_fn)(char *buf, size_t cap);

/* The launcher's own figures after the GPUs': Prometheus' standard process_*
 * (CPU, descriptors, memory, start), and what it holds that could leak: its
 * threads, its heap in use (glibc's malloc), its child processes (zombies
 * included) against the `workers` it has not reaped, the handles on loop by
 * type (uv_walk: timers, pipes, the scrape's own connection ...), the
 * progress channel's region and pipes. Appended to buf (cap bytes left,
 * NUL-terminated); returns the bytes added, whole lines only. */
size_t gl_metrics_process(char *buf, size_t cap, uv_loop_t *loop, int workers);

/* Listens on spec ("HOST:PORT", ":PORT" for every interface). 0, or 2 with
 * a message naming --metrics in err. The listener does not keep the loop alive. */
int gl_metrics_listen(uv_loop_t *loop, const char *spec, gl_metrics_render_fn render, char *err,
                      size_t errlen);

/* A bounded text buffer for the exposition: a line that does not fit is cut
 * at the last whole line and nothing more is written (GL_METRICS_BODY_MAX). */
typedef struct gl_pbuf {
    char *p;
    size_t len, cap;
    int full;
} gl_pbuf;
void gl_pb_printf(gl_pbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
