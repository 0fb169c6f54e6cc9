/* Worker output lines: line buffers, the rank prefix, the console and the
 * --log-dir files (--redirects, --tee, --local-ranks-filter), and the last
 * stderr lines kept for the failure report. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "gl_output.h"

static void write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

static void emit_line(worker *w, int is_err, const char *line, size_t n) {
    char out[GL_LINE_MAX + 64];
    int h = snprintf(out, sizeof out, "[%s%d]:", L.cfg.val[GL_ROLE], w->local_rank);
    if (n > sizeof out - (size_t)h - 1)
        n = sizeof out - (size_t)h - 1;
    memcpy(out + h, line, n);
    out[h + (int)n] = '\n';
    int bit = is_err ? 2 : 1;
    /* one write per line: lines of different ranks never mix */
    if (w->show && !(w->redirect & bit))
        write_all(is_err ? 2 : 1, out, (size_t)h + n + 1);
    if (w->log_fd >= 0 && ((w->redirect | w->tee) & bit))
        write_all(w->log_fd, out + h, n + 1);
    if (is_err) {
        size_t k = n < 255 ? n : 255;
        memcpy(w->tail[w->tail_n % GL_ERR_TAIL_LINES], line, k);
        w->tail[w->tail_n % GL_ERR_TAIL_LINES][k] = '\0';
        w->tail_n++;
    }
}

static void feed(worker *w, int is_err, const char *p, size_t n) {
    linebuf *lb = is_err ? &w->lerr : &w->lout;
    while (n) {
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        if (lb->len + take > sizeof lb->buf) {
            size_t room = sizeof lb->buf - lb->len;
            memcpy(lb->buf + lb->len, p, room);
            emit_line(w, is_err, lb->buf, sizeof lb->buf);
            lb->len = 0;
            p += room;
            n -= room;
            continue;
        }
        memcpy(lb->buf + lb->len, p, take);
        lb->len += take;
        if (!nl)
            return;
        emit_line(w, is_err, lb->buf, lb->len);
        lb->len = 0;
        p += take + 1;
        n -= take + 1;
    }
}

static void on_alloc(uv_handle_t *h, size_t s, uv_buf_t *b) {
    static char slab[65536];
    b->base = slab;
    b->len = sizeof slab;
}

static void on_pipe_closed(uv_handle_t *h) {
    worker *w = h->data;
    if (--w->pipes_open == 0 && w->log_fd >= 0) {
        close(w->log_fd);
        w->log_fd = -1;
    }
    gl_maybe_finish_round();
}

static void on_out(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
    worker *w = s->data;
    int is_err = s == (uv_stream_t *)&w->err;
    if (n > 0) {
        feed(w, is_err, b->base, (size_t)n);
        return;
    }
    if (n < 0) {
        linebuf *lb = is_err ? &w->lerr : &w->lout;
        if (lb->len) {
            emit_line(w, is_err, lb->buf, lb->len);
            lb->len = 0;
        }
        uv_close((uv_handle_t *)s, on_pipe_closed);
    }
}

/* "3" for every rank or "0:1,1:2" per local rank -> the stream bits of lr. */
static int stream_bits(const char *spec, int lr) {
    if (strchr(spec, ':') == NULL)
        return (int)strtol(spec, NULL, 10) & 3;
    for (const char *p = spec; *p;) {
        char *end;
        long r = strtol(p, &end, 10);
        if (*end != ':')
            return 0;
        long b = strtol(end + 1, &end, 10);
        if (r == lr)
            return (int)b & 3;
        p = *end == ',' ? end + 1 : end;
        if (*end == '\0')
            break;
    }
    return 0;
}

static int rank_shown(int lr) {
    const char *f = L.cfg.val[GL_LOCAL_RANKS_FILTER];
    if (*f == '\0')
        return 1;
    for (const char *p = f; *p;) {
        char *end;
        long r = strtol(p, &end, 10);
        if (end == p)
            return 0;
        if (r == lr)
            return 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

static void mkdirs(const char *path) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (char *q = p + 1; *q; q++)
        if (*q == '/') {
            *q = '\0';
            mkdir(p, 0755);
            *q = '/';
        }
    mkdir(p, 0755);
}

void gl_output_open(worker *w) {
    int i = w->local_rank;
    w->redirect = stream_bits(L.cfg.val[GL_REDIRECTS], i);
    w->tee = stream_bits(L.cfg.val[GL_TEE], i);
    w->show = rank_shown(i);
    if (L.cfg.val[GL_LOG_DIR][0] && (w->redirect | w->tee)) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s/attempt_%d/%d", L.cfg.val[GL_LOG_DIR], L.run_id,
                 L.restarts, i);
        mkdirs(path);
        snprintf(path + strlen(path), sizeof path - strlen(path), "/output.log");
        w->log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (w->log_fd < 0)
            fprintf(stderr, "gpulaunch: cannot write %s: %s\n", path, strerror(errno));
    }
}

void gl_output_start(worker *w) {
    uv_read_start((uv_stream_t *)&w->out, on_alloc, on_out);
    uv_read_start((uv_stream_t *)&w->err, on_alloc, on_out);
}

void gl_output_close(worker *w) {
    uv_close((uv_handle_t *)&w->out, on_pipe_closed);
    uv_close((uv_handle_t *)&w->err, on_pipe_closed);
}

void gl_output_tail(const worker *w, char *out, size_t len) {
    size_t off = 0;
    int start = w->tail_n > GL_ERR_TAIL_LINES ? w->tail_n - GL_ERR_TAIL_LINES : 0;
    for (int i = start; i < w->tail_n && off < len; i++) {
        int k = snprintf(out + off, len - off, "    %s\n", w->tail[i % GL_ERR_TAIL_LINES]);
        if (k > 0)
            off += (size_t)k;
    }
}
