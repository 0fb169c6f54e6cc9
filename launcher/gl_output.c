/* Worker output lines (see gl_output.h). A gl_output owns the attempt's
 * filtered logs; each worker's line buffers, prefix, log file and stderr tail
 * live in its record, which points back to the router for its lines. */
#include <ctype.h>
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

size_t gl_subst(const char *t, const char *const *names, const char *const *vals, int n,
                int dollar_escape, char *out, size_t len) {
    size_t o = 0;
    while (*t && o + 1 < len) {
        if (*t == '$' && dollar_escape && t[1] == '$') {
            out[o++] = '$';
            t += 2;
            continue;
        }
        if (*t == '$') {
            int braced = t[1] == '{';
            const char *id = t + 1 + braced;
            size_t l = 0;
            while (isalnum((unsigned char)id[l]) || id[l] == '_')
                l++;
            int k = 0;
            while (k < n && (strlen(names[k]) != l || strncmp(names[k], id, l) != 0))
                k++;
            if (l > 0 && k < n && (!braced || id[l] == '}')) {
                for (const char *v = vals[k]; *v && o + 1 < len; v++)
                    out[o++] = *v;
                t = id + l + braced;
                continue;
            }
        }
        out[o++] = *t++;
    }
    out[o] = '\0';
    return o;
}

static int dup_match(const gl_dup_filter *d, const char *line, size_t n) {
    for (int i = 0; i < d->n; i++)
        if (memmem(line, n, d->needle[i], strlen(d->needle[i])) != NULL)
            return 1;
    return 0;
}

static void emit_line(worker *w, int is_err, const char *line, size_t n) {
    char out[GL_LINE_MAX + 300];
    int h = (int)w->prefix_len;
    memcpy(out, w->prefix, w->prefix_len);
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
    const gl_dup_filter *d = &w->router->dup[is_err];
    if (d->fd >= 0 && (w->tee & bit) && dup_match(d, line, n))
        write_all(d->fd, out, (size_t)h + n + 1);
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
    w->router->on_closed(w->router, w);
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

static int rank_shown(const gl_config *cfg, int lr) {
    const char *f = cfg->val[GL_LOCAL_RANKS_FILTER];
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

/* "a,b,,c" -> "a" and "b,c" (a doubled comma is a comma). */
static void dup_parse(gl_dup_filter *d, const char *spec) {
    d->n = 0;
    snprintf(d->text, sizeof d->text, "%s", spec);
    char *w = d->text, *start = d->text;
    for (const char *r = d->text;; r++) {
        if (*r == ',' && r[1] == ',') {
            *w++ = ',';
            r++;
            continue;
        }
        if (*r == ',' || *r == '\0') {
            int end = *r == '\0';
            *w++ = '\0';
            if (d->n < GL_DUP_FILTERS_MAX)
                d->needle[d->n++] = start;
            start = w;
            if (end)
                break;
            continue;
        }
        *w++ = *r;
    }
}

static void dup_open(gl_output *o, int attempt) {
    const gl_config *cfg = o->cfg;
    for (int s = 0; s < 2; s++) {
        gl_dup_filter *d = &o->dup[s];
        if (d->fd >= 0)
            close(d->fd);
        d->fd = -1;
        const char *spec = cfg->val[s ? GL_DUPLICATE_STDERR_FILTERS : GL_DUPLICATE_STDOUT_FILTERS];
        if (*spec == '\0' || cfg->val[GL_LOG_DIR][0] == '\0')
            continue;
        dup_parse(d, spec);
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s/attempt_%d", cfg->val[GL_LOG_DIR], o->run_id, attempt);
        mkdirs(path);
        snprintf(path + strlen(path), sizeof path - strlen(path), "/filtered_%s.log",
                 s ? "stderr" : "stdout");
        d->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
        if (d->fd < 0)
            fprintf(stderr, "gpulaunch: cannot write %s: %s\n", path, strerror(errno));
    }
}

void gl_output_init(gl_output *o, const gl_config *cfg, const char *run_id, const char *hostname,
                    gl_output_closed_cb on_closed) {
    o->cfg = cfg;
    o->run_id = run_id;
    o->hostname = hostname;
    o->on_closed = on_closed;
    o->dup[0].fd = o->dup[1].fd = -1;
}

void gl_output_open(gl_output *o, worker *w, int attempt) {
    const gl_config *cfg = o->cfg;
    int i = w->local_rank;
    w->router = o;
    if (i == 0)
        dup_open(o, attempt);
    w->redirect = stream_bits(cfg->val[GL_REDIRECTS], i);
    w->tee = stream_bits(cfg->val[GL_TEE], i);
    w->show = rank_shown(cfg, i);
    if (cfg->val[GL_LOG_DIR][0] && (w->redirect | w->tee)) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s/attempt_%d/%d", cfg->val[GL_LOG_DIR], o->run_id, attempt,
                 i);
        mkdirs(path);
        snprintf(path + strlen(path), sizeof path - strlen(path), "/output.log");
        w->log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (w->log_fd < 0)
            fprintf(stderr, "gpulaunch: cannot write %s: %s\n", path, strerror(errno));
    }
}

void gl_output_start(worker *w) {
    const gl_config *cfg = w->router->cfg;
    const char *tpl = cfg->val[GL_LOG_LINE_PREFIX_TEMPLATE];
    if (*tpl) {
        char rank[16], lr[16], pid[16];
        snprintf(rank, sizeof rank, "%d", w->rank);
        snprintf(lr, sizeof lr, "%d", w->local_rank);
        snprintf(pid, sizeof pid, "%d", (int)w->pid);
        static const char *const names[] = {"role_name", "rank", "local_rank", "pid", "hostname"};
        const char *vals[] = {cfg->val[GL_ROLE], rank, lr, pid, w->router->hostname};
        w->prefix_len = gl_subst(tpl, names, vals, 5, 1, w->prefix, sizeof w->prefix);
    } else {
        int k = snprintf(w->prefix, sizeof w->prefix, "[%s%d]:", cfg->val[GL_ROLE], w->local_rank);
        w->prefix_len = k > 0 && (size_t)k < sizeof w->prefix ? (size_t)k : strlen(w->prefix);
    }
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
