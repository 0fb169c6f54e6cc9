/* The rendezvous server's transport: the listener, connections, frames and
 * the handshake, each connection's bounded output queue, pushes of one frame
 * to many connections, the dispatch of requests to the jobs (rdzv_job.c),
 * the sweep timer and the server's lifecycle, on one libuv loop. Every
 * message is O(1) work except the ones that complete or end a round, which
 * are O(N) once per round. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "gb_log.h"
#include "gb_time.h"
#include "rdzv_auth.h"
#include "rdzv_server_int.h"

#define GB_COMPONENT "rdzv"

#define SWEEP_MS 100   /* timer granularity of deadlines */
#define HB_SCAN_MS 250 /* how often heartbeats are checked */
#define CONN_IN_MAX (RDZV_MAX_FRAME + 4 + sizeof(((rdzv_server *)0)->readbuf))

typedef struct wreq {
    uv_write_t req;
    conn *c;
    size_t len;
    uint8_t *data;
} wreq;

static void conn_close(conn *c, const char *why);

/* The peer's address, looked up the first time a message needs it (one
 * syscall fewer per connection on the hot path). */
const char *rdzv__peer_of(conn *c) {
    if (c->peer[0])
        return c->peer;
    struct sockaddr_storage ss;
    int len = sizeof ss;
    snprintf(c->peer, sizeof c->peer, "?");
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
        char ip[48] = "";
        int port = 0;
        if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        } else {
            uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        }
        snprintf(c->peer, sizeof c->peer, "%s:%d", ip, port);
    }
    return c->peer;
}

/* ---- output ---- */

static void on_written(uv_write_t *req, int status) {
    wreq *w = (wreq *)req;
    w->c->outq -= w->len;
    free(w->data);
    free(w);
}

/* Sends one encoded frame: written at once when the socket takes it,
 * otherwise the rest is copied into the connection's bounded output queue.
 * Returns NULL, or why the connection must be closed (the caller drops it:
 * closing can end a round, which pushes to other connections). */
static const char *deliver(conn *c, const uint8_t *data, size_t len) {
    if (c->closing || c->doomed)
        return NULL;
    size_t off = 0;
    if (c->outq == 0) {
        uv_buf_t ub = uv_buf_init((char *)data, (unsigned)len);
        int n = uv_try_write((uv_stream_t *)&c->tcp, &ub, 1);
        if (n > 0)
            off = (size_t)n;
    }
    if (off == len)
        return NULL;
    size_t left = len - off;
    if (c->outq + left > c->s->o.max_outq_bytes)
        return "output queue over its limit: the client does not read its replies";
    wreq *w = malloc(sizeof *w);
    uint8_t *copy = malloc(left);
    if (w == NULL || copy == NULL) {
        free(w);
        free(copy);
        return "out of memory";
    }
    memcpy(copy, data + off, left);
    w->c = c;
    w->len = left;
    w->data = copy;
    uv_buf_t ub = uv_buf_init((char *)copy, (unsigned)left);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &ub, 1, on_written) != 0) {
        free(copy);
        free(w);
        return "write failed";
    }
    c->outq += left;
    return NULL;
}

static void send_frame(conn *c, const uint8_t *data, size_t len) {
    const char *why = deliver(c, data, len);
    if (why)
        rdzv__conn_drop(c, why);
}

/* Encodes into the server's one scratch buffer (no allocation per message);
 * send_frame does not read it after anything that could send again. */
void rdzv__send_msg(conn *c, const rdzv_msg *m) {
    if (c->closing || c->doomed)
        return;
    rdzv_buf *b = &c->s->scratch;
    b->len = 0;
    if (rdzv_encode(m, b) != GPL_OK) {
        GB_ERROR("cannot encode %s for %s", rdzv_type_name(m->type), rdzv__peer_of(c));
        return;
    }
    c->s->m.frames_out++;
    if (m->type != RDZV_PING && m->type != RDZV_PROBE_REQ)
        rdzv__conn_spoil(c, rdzv_type_name(m->type)); /* the node must hear this: c is its */
    send_frame(c, b->data, b->len);
}

void rdzv__send_error(conn *c, uint32_t req, gpl_result_t code, const char *fmt, ...) {
    rdzv_msg m = {.type = RDZV_ERROR, .req_id = req};
    m.u.error.code = (uint32_t)code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.u.error.message, sizeof m.u.error.message, fmt, ap);
    va_end(ap);
    rdzv__send_msg(c, &m);
}

void rdzv__send_simple(conn *c, uint16_t type, uint32_t req) {
    rdzv_msg m = {.type = type, .req_id = req};
    rdzv__send_msg(c, &m);
}

/* One push to many connections: the frames are laid out in one buffer and
 * written by rdzv_fanout (with helper threads past RDZV_FANOUT_PARALLEL_MIN);
 * what a socket does not take at once, and connections that already have
 * queued output, go through send_frame's queue afterwards, on this thread. */
int rdzv__push_init(rdzv_push *p, size_t cap) {
    memset(p, 0, sizeof *p);
    rdzv_buf_init(&p->data, SIZE_MAX);
    p->cap = cap ? cap : 1;
    p->items = malloc(p->cap * sizeof *p->items);
    p->conns = malloc(p->cap * sizeof *p->conns);
    p->why = calloc(p->cap, sizeof *p->why);
    if (p->items == NULL || p->conns == NULL || p->why == NULL) {
        free(p->items);
        free(p->conns);
        free(p->why);
        return -1;
    }
    return 0;
}

void rdzv__push_add(rdzv_push *p, conn *c, size_t off, size_t len) {
    if (p->n == p->cap || c == NULL || c->closing || c->doomed)
        return;
    p->items[p->n] = (rdzv_fan_item){.fd = -1, .off = (uint32_t)off, .len = (uint32_t)len};
    p->conns[p->n++] = c;
    rdzv__conn_spoil(c, "a push"); /* news the node must hear */
}

void rdzv__push_send(rdzv_server *s, rdzv_push *p) {
    /* A connection that is in the push twice (a node's own connection can
     * also attach) is written directly once only: two threads must never
     * write one socket, and its second frame follows the first in order. */
    uint64_t mark = ++s->push_mark;
    s->m.frames_out += p->n;
    for (size_t i = 0; i < p->n; i++) {
        conn *c = p->conns[i];
        uv_os_fd_t fd;
        if (!c->closing && !c->doomed && c->outq == 0 && c->push_mark != mark &&
            uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
            p->items[i].fd = fd;
        c->push_mark = mark;
    }
    rdzv_fanout_run(s->fan, p->items, p->n, p->data.data);
    /* Every frame is whole in its socket or its queue before any connection
     * is closed: a close can end the round and push again, and that push must
     * not land in the middle of a frame of this one. */
    for (size_t i = 0; i < p->n; i++) {
        rdzv_fan_item *it = &p->items[i];
        if (it->sent < it->len)
            p->why[i] = deliver(p->conns[i], p->data.data + it->off + it->sent, it->len - it->sent);
    }
    for (size_t i = 0; i < p->n; i++)
        if (p->why[i])
            rdzv__conn_drop(p->conns[i], p->why[i]);
    free(p->items);
    free(p->conns);
    free(p->why);
    rdzv_buf_free(&p->data);
}

/* A request past the handshake: heartbeats only count as traffic
 * (last_rx_ms); the rest is the jobs'. */
static void handle_ready(conn *c, const rdzv_msg *msg) {
    switch (msg->type) {
    case RDZV_HEARTBEAT:
        /* on the connection a node moved from, older than what its new one says: traffic only */
        if ((msg->flags & RDZV_HEARTBEAT_WAIT) && (c->m == NULL || c->m->c == c))
            rdzv__probe_heartbeat(c, msg);
        return;
    case RDZV_PONG:
        rdzv__probe_pong(c, msg);
        return;
    case RDZV_PROBE_ACK:
        rdzv__probe_ack(c, msg);
        return;
    case RDZV_JOIN:
    case RDZV_ATTACH:
    case RDZV_KV_SET:
    case RDZV_KV_GET:
    case RDZV_KV_WAIT:
    case RDZV_KV_ADD:
    case RDZV_KV_CAS:
    case RDZV_KV_DEL:
    case RDZV_KV_MGET:
    case RDZV_EVENT:
    case RDZV_FAIL:
    case RDZV_STATS:
    case RDZV_STORY:
    case RDZV_DONE:
    case RDZV_NODE:
        rdzv__job_request(c, msg);
        return;
    default:
        c->s->m.protocol_errors++;
        rdzv__send_error(c, msg->req_id, GPL_ERR_PROTOCOL, "message %s is not a request",
                         rdzv_type_name(msg->type));
        conn_close(c, "unexpected message type");
        return;
    }
}

/* Connections that have not finished the handshake are kept in accept order,
 * so the sweep looks only at the ones whose deadline has passed. Called once:
 * when the handshake completes, or when a connection still in it closes. */
static void handshake_done(conn *c) { TAILQ_REMOVE(&c->s->handshaking, c, hlink); }

static void handle_frame(conn *c, const uint8_t *p, size_t n) {
    rdzv_server *s = c->s;
    rdzv_msg msg;
    char why[160];
    if (rdzv_decode(p, n, &msg, why, sizeof why) != GPL_OK) {
        s->m.protocol_errors++;
        rdzv__send_error(c, 0, GPL_ERR_PROTOCOL, "malformed frame: %s", why);
        conn_close(c, why);
        return;
    }
    s->m.frames_in++;
    rdzv__conn_spoil(c, "a frame from the node"); /* its client speaks on it */
    switch (c->state) {
    case C_HELLO:
        if (msg.type != RDZV_HELLO || msg.u.hello.magic != RDZV_MAGIC) {
            s->m.protocol_errors++;
            rdzv__send_error(
                c, msg.req_id, GPL_ERR_PROTOCOL,
                "expected HELLO with the gpulaunch magic; is this a gpulaunch client?");
            conn_close(c, "bad hello");
            return;
        }
        if (msg.u.hello.version != RDZV_VERSION) {
            s->m.protocol_errors++;
            rdzv__send_error(c, msg.req_id, GPL_ERR_PROTOCOL,
                             "protocol version %u is not supported; this server speaks version %u",
                             msg.u.hello.version, RDZV_VERSION);
            conn_close(c, "wrong version");
            return;
        }
        c->state = C_AUTH;
        return;
    case C_AUTH:
        if (msg.type != RDZV_AUTH) {
            s->m.protocol_errors++;
            rdzv__send_error(c, msg.req_id, GPL_ERR_PROTOCOL, "expected AUTH");
            conn_close(c, "bad auth message");
            return;
        }
        if (s->token && !rdzv_auth_check(s->token, s->o.token_len, c->nonce, msg.u.auth.mac)) {
            s->m.auth_refused++;
            GB_WARN("refused %s: wrong or missing rendezvous token", rdzv__peer_of(c));
            rdzv__send_error(c, msg.req_id, GPL_ERR_AUTH,
                             "wrong or missing rendezvous token; give every node the same "
                             "--rdzv-token-file or GPULAUNCH_RDZV_TOKEN");
            conn_close(c, "auth refused");
            return;
        }
        handshake_done(c);
        c->state = C_READY;
        if (!(msg.flags & RDZV_AUTH_QUIET)) {
            rdzv_msg w = {.type = RDZV_WELCOME, .req_id = msg.req_id};
            w.u.welcome.server_epoch = s->epoch;
            rdzv__send_msg(c, &w);
        }
        return;
    default:
        handle_ready(c, &msg);
        return;
    }
}

/* ---- connections ---- */

static void server_unref(rdzv_server *s) {
    if (--s->open_handles == 0) {
        rdzv_buf_free(&s->scratch);
        rdzv_buf_free(&s->kv_scratch);
        rdzv_fanout_free(s->fan);
        free(s->token);
        free(s);
    }
}

static void on_conn_closed(uv_handle_t *h) {
    conn *c = h->data;
    rdzv_server *s = c->s;
    rdzv_buf_free(&c->in);
    free(c);
    server_unref(s);
}

static void conn_close(conn *c, const char *why) {
    if (c->closing)
        return;
    c->closing = 1;
    rdzv_server *s = c->s;
    GB_DEBUG("closing %s: %s", rdzv__peer_of(c), why);
    if (c->doomed) {
        LIST_REMOVE(c, dlink);
        c->doomed = NULL;
    }
    if (c->state != C_READY)
        handshake_done(c);
    rdzv__job_conn_gone(c, why);
    LIST_REMOVE(c, link);
    s->m.connections_open--;
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

void rdzv__conn_drop(conn *c, const char *why) {
    if (c->closing || c->doomed)
        return;
    c->doomed = why;
    LIST_INSERT_HEAD(&c->s->doomed, c, dlink);
}

/* Closes the dropped connections; their closes may drop more. Called where
 * an event from the loop has been handled. */
static void close_doomed(rdzv_server *s) {
    conn *c;
    while ((c = LIST_FIRST(&s->doomed)) != NULL)
        conn_close(c, c->doomed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    conn *c = h->data;
    rdzv_server *s = c->s;
    if (s->readbuf_busy) {
        buf->base = NULL;
        buf->len = 0;
        return;
    }
    s->readbuf_busy = 1;
    buf->base = (char *)s->readbuf;
    buf->len = sizeof s->readbuf;
}

/* Parses the whole frames at p; returns the bytes consumed. */
static size_t parse_frames(conn *c, const uint8_t *p, size_t n) {
    size_t off = 0;
    while (!c->closing && !c->doomed) {
        size_t flen;
        gpl_result_t rc = rdzv_frame_peek(p + off, n - off, &flen);
        if (rc == GPL_ERR_STATE)
            break;
        if (rc != GPL_OK) {
            c->s->m.protocol_errors++;
            rdzv__send_error(c, 0, rc,
                             rc == GPL_ERR_LIMIT ? "frame over the %u-byte limit"
                                                 : "frame shorter than its header (limit %u)",
                             (unsigned)RDZV_MAX_FRAME);
            conn_close(c, "bad frame length");
            break;
        }
        handle_frame(c, p + off, flen);
        off += flen;
    }
    return off;
}

static void read_frames(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    conn *c = st->data;
    rdzv_server *s = c->s;
    if (buf->base == (char *)s->readbuf)
        s->readbuf_busy = 0;
    if (nread < 0) {
        const char *why = nread == UV_EOF ? "peer closed the connection" : uv_strerror((int)nread);
        (void)rdzv__job_conn_fallback(c, why); /* a spare given up on: the node stays */
        conn_close(c, why);
        return;
    }
    if (nread == 0 || c->closing)
        return;
    uint64_t now = gb_now_ms();
    if (c->m) { /* the node's, on its connection or on the one it moved from */
        rdzv__probe_rx(c->m, now - c->m->c->last_rx_ms);
        c->m->c->last_rx_ms = now;
    }
    c->last_rx_ms = now;
    const uint8_t *p = (const uint8_t *)buf->base;
    size_t n = (size_t)nread;
    if (c->in.len == 0) {
        size_t used = parse_frames(c, p, n);
        if (used < n && !c->closing && rdzv_buf_append(&c->in, p + used, n - used) != GPL_OK)
            conn_close(c, "input buffer over its limit");
        return;
    }
    if (rdzv_buf_append(&c->in, p, n) != GPL_OK) {
        conn_close(c, "input buffer over its limit");
        return;
    }
    size_t used = parse_frames(c, c->in.data, c->in.len);
    if (!c->closing) {
        rdzv_buf_consume(&c->in, used);
        if (c->in.len == 0) {
            /* Give back the memory of a large frame once it is handled. */
            rdzv_buf_free(&c->in);
            rdzv_buf_init(&c->in, CONN_IN_MAX);
        }
    }
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    rdzv_server *s = ((conn *)st->data)->s;
    read_frames(st, nread, buf);
    close_doomed(s);
}

static void accept_one(uv_stream_t *ls, int status) {
    rdzv_server *s = ls->data;
    if (status < 0) {
        GB_WARN("accept failed: %s", uv_strerror(status));
        return;
    }
    conn *c = calloc(1, sizeof *c);
    if (c == NULL)
        return;
    c->s = s;
    uv_tcp_init(s->loop, &c->tcp);
    c->tcp.data = c;
    s->open_handles++;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) != 0) {
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
        return;
    }
    rdzv_buf_init(&c->in, CONN_IN_MAX);
    LIST_INIT(&c->waiters);
    c->accepted_ms = c->last_rx_ms = gb_now_ms();
    LIST_INSERT_HEAD(&s->conns, c, link);
    TAILQ_INSERT_TAIL(&s->handshaking, c, hlink);
    s->m.connections_total++;
    s->m.connections_open++;
    if (s->m.connections_open > s->o.max_connections || s->closing) {
        rdzv__send_error(c, 0, GPL_ERR_LIMIT, "the server holds its maximum of %u connections",
                         s->o.max_connections);
        conn_close(c, "connection limit");
        return;
    }
    /* TCP_NODELAY is inherited from the listener (set at start) */
    if (rdzv_auth_nonce(c->nonce) != 0) {
        conn_close(c, "no random bytes for the challenge");
        return;
    }
    /* The challenge goes out at once: the client answers with HELLO and AUTH
     * (and may add its JOIN) in one write, 1.5 round trips in all. */
    rdzv_msg ch = {.type = RDZV_CHALLENGE};
    memcpy(ch.u.challenge.nonce, c->nonce, RDZV_NONCE_LEN);
    ch.u.challenge.auth_required = s->token != NULL;
    ch.u.challenge.version = RDZV_VERSION;
    ch.flags = RDZV_CHALLENGE_HEALTH | RDZV_CHALLENGE_WARM | RDZV_CHALLENGE_STORY |
               RDZV_CHALLENGE_STORY_MORE | RDZV_CHALLENGE_MOVE |
               (s->o.probes ? RDZV_CHALLENGE_PROBE | RDZV_CHALLENGE_PEER : 0) |
               (s->o.probes == RDZV_PROBES_ON ? RDZV_CHALLENGE_KERNEL : 0);
    rdzv__send_msg(c, &ch);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static void on_connection(uv_stream_t *ls, int status) {
    accept_one(ls, status);
    close_doomed(ls->data);
}

static void on_sweep(uv_timer_t *t) {
    rdzv_server *s = t->data;
    uint64_t now = gb_now_ms();
    int hb = now - s->last_hb_scan_ms >= HB_SCAN_MS;
    if (hb)
        s->last_hb_scan_ms = now;
    conn *c;
    while ((c = TAILQ_FIRST(&s->handshaking)) != NULL &&
           now - c->accepted_ms > s->o.handshake_timeout_ms) {
        GB_INFO("closing %s: no handshake within %u ms", rdzv__peer_of(c),
                s->o.handshake_timeout_ms);
        conn_close(c, "handshake timeout");
    }
    if (hb) {
        rdzv__jobs_sweep_survivors(s, now);
        close_doomed(s);
    }
    rdzv__jobs_sweep(s, now, hb);
    rdzv__probe_sweep(s, now);
    close_doomed(s);
}

/* ---- lifecycle ---- */

static void on_handle_closed(uv_handle_t *h) { server_unref(h->data); }

gpl_result_t rdzv_server_start(uv_loop_t *loop, const rdzv_server_options *opts, rdzv_server **out,
                               char *err, size_t errlen) {
    *out = NULL;
    if (opts == NULL || opts->version < 1 || opts->version > RDZV_SERVER_OPTIONS_VERSION) {
        snprintf(err, errlen,
                 "rdzv_server_options.version must be 1 to %d (use "
                 "RDZV_SERVER_OPTIONS_INIT)",
                 RDZV_SERVER_OPTIONS_VERSION);
        return GPL_ERR_INVALID_ARG;
    }
    if (opts->version >= 2 && (opts->probes < RDZV_PROBES_OFF || opts->probes > RDZV_PROBES_UDP)) {
        snprintf(err, errlen,
                 "rdzv_server_options.probes is %d: RDZV_PROBES_OFF (0), RDZV_PROBES_ON (1) or "
                 "RDZV_PROBES_UDP (2)",
                 opts->probes);
        return GPL_ERR_INVALID_ARG;
    }
    rdzv_server *s = calloc(1, sizeof *s);
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return GPL_ERR_NOMEM;
    }
    s->loop = loop;
    static const rdzv_server_options defaults = RDZV_SERVER_OPTIONS_INIT;
    s->o = defaults; /* a version-1 struct ends before probes */
    memcpy(&s->o, opts, opts->version == 1 ? offsetof(rdzv_server_options, probes) : sizeof *opts);
    s->o.version = RDZV_SERVER_OPTIONS_VERSION;
    LIST_INIT(&s->conns);
    LIST_INIT(&s->doomed);
    TAILQ_INIT(&s->handshaking);
    LIST_INIT(&s->jobs);
    LIST_INIT(&s->probing);
    rdzv_buf_init(&s->scratch, RDZV_MAX_FRAME + 4);
    rdzv_buf_init(&s->kv_scratch, RDZV_MAX_FRAME - 64);
    if (opts->token && opts->token_len) {
        s->token = malloc(opts->token_len);
        if (s->token == NULL) {
            free(s);
            snprintf(err, errlen, "out of memory");
            return GPL_ERR_NOMEM;
        }
        memcpy(s->token, opts->token, opts->token_len);
    } else if (opts->listen_addr == NULL || (strncmp(opts->listen_addr, "127.", 4) != 0 &&
                                             strcmp(opts->listen_addr, "::1") != 0)) {
        GB_WARN("no rendezvous token: any client that reaches this port can join jobs; "
                "set --token-file or GPULAUNCH_RDZV_TOKEN");
    }
    uint8_t e[RDZV_NONCE_LEN];
    rdzv_auth_nonce(e);
    memcpy(&s->epoch, e, sizeof s->epoch);

    const char *addr = opts->listen_addr ? opts->listen_addr : "0.0.0.0";
    struct sockaddr_storage sa;
    int r = strchr(addr, ':') ? uv_ip6_addr(addr, opts->listen_port, (struct sockaddr_in6 *)&sa)
                              : uv_ip4_addr(addr, opts->listen_port, (struct sockaddr_in *)&sa);
    if (r != 0) {
        snprintf(err, errlen, "listen address '%s' is not an IP address: %s", addr, uv_strerror(r));
        free(s->token);
        free(s);
        return GPL_ERR_INVALID_ARG;
    }
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    s->open_handles = 1;
    r = uv_tcp_bind(&s->listener, (struct sockaddr *)&sa, 0);
    if (r == 0)
        uv_tcp_nodelay(&s->listener, 1); /* accepted connections inherit it */
    if (r == 0)
        r = uv_listen((uv_stream_t *)&s->listener, 4096, on_connection);
    if (r != 0) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s%s", addr, opts->listen_port,
                 uv_strerror(r),
                 r == UV_EADDRINUSE ? " (another process holds this port; pick another with "
                                      "--listen or stop it)"
                                    : "");
        s->closing = 1;
        uv_close((uv_handle_t *)&s->listener, on_handle_closed);
        return r == UV_EADDRINUSE ? GPL_ERR_EXISTS : GPL_ERR_SYSTEM;
    }
    struct sockaddr_storage bound;
    int blen = sizeof bound;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &blen);
    s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    s->fan = rdzv_fanout_new(); /* NULL: every push from this thread */
    uv_timer_init(loop, &s->sweep);
    s->sweep.data = s;
    s->open_handles++;
    uv_timer_start(&s->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
    GB_INFO("rendezvous listening on %s:%d", addr, s->port);
    *out = s;
    return GPL_OK;
}

int rdzv_server_port(const rdzv_server *s) { return s->port; }

void rdzv_server_close(rdzv_server *s) {
    if (s == NULL)
        return;
    s->closing = 1;
    conn *c;
    while ((c = LIST_FIRST(&s->conns)) != NULL)
        conn_close(c, "server shutting down");
    rdzv__jobs_free(s);
    if (s->http_close)
        s->http_close(s);
    uv_timer_stop(&s->sweep);
    uv_close((uv_handle_t *)&s->sweep, on_handle_closed);
    uv_close((uv_handle_t *)&s->listener, on_handle_closed);
}
