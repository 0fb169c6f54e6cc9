/* The blocking rendezvous client (the runtime, tools and tests): plain
 * sockets and poll(2), the shared codec, reconnect with backoff and jitter. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gb_time.h"
#include "gpulaunch/rdzv.h"
#include "rdzv_auth.h"
#include "rdzv_codec.h"

#define BCLIENT_OP_TIMEOUT_MS 60000u /* a reply that takes longer means the server is gone */

struct rdzv_bclient {
    int fd;
    char host[256];
    int port;
    char *token;
    size_t token_len;
    uint32_t connect_timeout_ms;
    uint32_t next_req;
    rdzv_buf in;
    rdzv_push_state push;
    char run_id[RDZV_MAX_STR + 1];
    uint32_t round;
    int attached;
    char err[512];
};

static gpl_result_t seterr(rdzv_bclient *c, gpl_result_t rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static gpl_result_t seterr(rdzv_bclient *c, gpl_result_t rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return rc;
}

gpl_result_t rdzv_parse_endpoint(const char *s, int default_port, char *host, size_t hostlen,
                                 int *port) {
    const char *colon;
    size_t hl;
    if (s == NULL || *s == '\0')
        return GPL_ERR_INVALID_ARG;
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        if (end == NULL)
            return GPL_ERR_INVALID_ARG;
        hl = (size_t)(end - s - 1);
        if (hl == 0 || hl >= hostlen)
            return GPL_ERR_INVALID_ARG;
        memcpy(host, s + 1, hl);
        host[hl] = '\0';
        colon = end[1] == ':' ? end + 1 : NULL;
        if (end[1] && !colon)
            return GPL_ERR_INVALID_ARG;
    } else {
        colon = strrchr(s, ':');
        if (colon && strchr(s, ':') != colon)
            colon = NULL; /* a bare IPv6 address */
        hl = colon ? (size_t)(colon - s) : strlen(s);
        if (hl == 0 || hl >= hostlen)
            return GPL_ERR_INVALID_ARG;
        memcpy(host, s, hl);
        host[hl] = '\0';
    }
    if (colon == NULL) {
        *port = default_port;
        return GPL_OK;
    }
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno || *end || end == colon + 1 || p < 0 || p > 65535)
        return GPL_ERR_INVALID_ARG;
    *port = (int)p;
    return GPL_OK;
}

/* Writes all of b, waiting at most timeout_ms. */
static gpl_result_t send_all(rdzv_bclient *c, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return seterr(c, GPL_ERR_CLOSED, "send to rendezvous %s:%d failed: %s", c->host,
                          c->port, strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    return GPL_OK;
}

static gpl_result_t send_msg(rdzv_bclient *c, const rdzv_msg *m) {
    rdzv_buf b;
    rdzv_buf_init(&b, RDZV_MAX_FRAME + 4);
    gpl_result_t rc = rdzv_encode(m, &b);
    if (rc == GPL_OK)
        rc = send_all(c, b.data, b.len);
    else
        seterr(c, rc, "request over the protocol limits (keys <= %d bytes, values <= %d bytes)",
               RDZV_MAX_KEY, RDZV_MAX_VALUE);
    rdzv_buf_free(&b);
    return rc;
}

static void note_push(rdzv_bclient *c, const rdzv_msg *m) {
    rdzv_push_state *p = &c->push;
    switch (m->type) {
    case RDZV_ROUND_OVER:
        p->round_over = 1;
        p->round = m->u.round_over.round;
        p->reason = m->u.round_over.reason;
        p->node_rank = m->u.round_over.node_rank;
        snprintf(p->hostname, sizeof p->hostname, "%s", m->u.round_over.hostname);
        snprintf(p->message, sizeof p->message, "%s", m->u.round_over.message);
        break;
    case RDZV_EVENT:
        if (m->u.event.kind == RDZV_EVENT_CHECKPOINT) {
            p->checkpoint_requested = 1;
            p->checkpoint_seq++;
            p->checkpoint_deadline_unix_ms = m->u.event.deadline_unix_ms;
            snprintf(p->checkpoint_reason, sizeof p->checkpoint_reason, "%s (node %s)",
                     m->u.event.reason, m->u.event.node);
        } else if (m->u.event.kind == RDZV_EVENT_SHUTDOWN) {
            p->shutdown = 1;
        }
        break;
    default:
        break;
    }
}

/* Reads one frame into *m (its byte strings point into c->in until the
 * next read). GPL_ERR_TIMEOUT when nothing whole arrived within timeout_ms. */
static gpl_result_t read_frame(rdzv_bclient *c, rdzv_msg *m, uint64_t deadline_ms,
                               size_t *consumed) {
    for (;;) {
        size_t flen;
        gpl_result_t rc = rdzv_frame_peek(c->in.data, c->in.len, &flen);
        if (rc == GPL_OK) {
            char why[128];
            rc = rdzv_decode(c->in.data, flen, m, why, sizeof why);
            if (rc != GPL_OK)
                return seterr(c, rc, "malformed frame from the rendezvous: %s", why);
            *consumed = flen;
            return GPL_OK;
        }
        if (rc != GPL_ERR_STATE)
            return seterr(c, GPL_ERR_PROTOCOL, "bad frame length from the rendezvous");
        uint64_t now = gb_now_ms();
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        int pr = poll(&pfd, 1, deadline_ms > now ? (int)(deadline_ms - now) : 0);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr == 0)
            return GPL_ERR_TIMEOUT;
        uint8_t tmp[65536];
        ssize_t r = recv(c->fd, tmp, sizeof tmp, 0);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r <= 0)
            return seterr(c, GPL_ERR_CLOSED, "the rendezvous at %s:%d closed the connection",
                          c->host, c->port);
        if (rdzv_buf_append(&c->in, tmp, (size_t)r) != GPL_OK)
            return seterr(c, GPL_ERR_LIMIT, "reply over the frame limit");
    }
}

/* Reads frames until the reply to req arrives; pushes on the way are noted.
 * The reply stays in c->in until the next call (consumed is returned). */
static gpl_result_t wait_reply(rdzv_bclient *c, uint32_t req, uint32_t timeout_ms, rdzv_msg *m,
                               size_t *consumed) {
    uint64_t deadline = gb_now_ms() + timeout_ms;
    for (;;) {
        size_t used;
        gpl_result_t rc = read_frame(c, m, deadline, &used);
        if (rc == GPL_ERR_TIMEOUT)
            return seterr(c, rc, "no reply from the rendezvous at %s:%d within %u ms", c->host,
                          c->port, timeout_ms);
        if (rc != GPL_OK)
            return rc;
        if (m->req_id == req && m->type != RDZV_EVENT && m->type != RDZV_ROUND_OVER) {
            *consumed = used;
            if (m->type == RDZV_ERROR) {
                seterr(c, (gpl_result_t)m->u.error.code, "%s", m->u.error.message);
                return (gpl_result_t)m->u.error.code;
            }
            return GPL_OK;
        }
        note_push(c, m);
        rdzv_buf_consume(&c->in, used);
    }
}

static gpl_result_t handshake(rdzv_bclient *c) {
    /* The server speaks first: CHALLENGE. */
    rdzv_msg r;
    size_t used;
    gpl_result_t rc = read_frame(c, &r, gb_now_ms() + 10000, &used);
    if (rc == GPL_ERR_TIMEOUT)
        return seterr(c, rc, "no challenge from %s:%d within 10 s: is it a gpulaunch rendezvous?",
                      c->host, c->port);
    if (rc != GPL_OK)
        return rc;
    if (r.type == RDZV_ERROR) {
        seterr(c, (gpl_result_t)r.u.error.code, "%s", r.u.error.message);
        return (gpl_result_t)r.u.error.code;
    }
    if (r.type != RDZV_CHALLENGE)
        return seterr(c, GPL_ERR_PROTOCOL, "expected CHALLENGE, got %s", rdzv_type_name(r.type));
    rdzv_msg h = {.type = RDZV_HELLO, .req_id = ++c->next_req};
    h.u.hello.magic = RDZV_MAGIC;
    h.u.hello.version = RDZV_VERSION;
    rdzv_msg a = {.type = RDZV_AUTH, .req_id = ++c->next_req};
    if (r.u.challenge.auth_required) {
        if (c->token == NULL)
            return seterr(c, GPL_ERR_AUTH,
                          "the rendezvous at %s:%d requires a token; set --rdzv-token-file or "
                          "GPULAUNCH_RDZV_TOKEN",
                          c->host, c->port);
        rdzv_auth_mac(c->token, c->token_len, r.u.challenge.nonce, a.u.auth.mac);
    }
    rdzv_buf_consume(&c->in, used);
    rc = send_msg(c, &h);
    if (rc == GPL_OK)
        rc = send_msg(c, &a);
    if (rc == GPL_OK)
        rc = wait_reply(c, a.req_id, 10000, &r, &used);
    if (rc != GPL_OK)
        return rc;
    rdzv_buf_consume(&c->in, used);
    return r.type == RDZV_WELCOME
               ? GPL_OK
               : seterr(c, GPL_ERR_PROTOCOL, "expected WELCOME, got %s", rdzv_type_name(r.type));
}

static int dial(const char *host, int port, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) {
        snprintf(err, errlen, "cannot resolve %s: %s", host, gai_strerror(g));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0)
            continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        snprintf(err, errlen, "cannot connect to %s:%d: %s", host, port, strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

/* (Re)connects with exponential backoff and jitter until the budget is spent. */
static gpl_result_t reconnect(rdzv_bclient *c) {
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->in.len = 0;
    uint64_t deadline = gb_now_ms() + c->connect_timeout_ms;
    uint32_t backoff = 50;
    char err[256] = "";
    for (;;) {
        c->fd = dial(c->host, c->port, err, sizeof err);
        if (c->fd >= 0) {
            gpl_result_t rc = handshake(c);
            if (rc == GPL_OK)
                return GPL_OK;
            if (rc == GPL_ERR_AUTH || rc == GPL_ERR_PROTOCOL)
                return rc;
            snprintf(err, sizeof err, "%s", c->err);
            close(c->fd);
            c->fd = -1;
            c->in.len = 0;
        }
        uint64_t now = gb_now_ms();
        if (now >= deadline)
            return seterr(c, GPL_ERR_TIMEOUT,
                          "could not reach the rendezvous at %s:%d within %u ms: %s", c->host,
                          c->port, c->connect_timeout_ms, err);
        uint32_t sleep_ms = backoff / 2 + (uint32_t)(rand() % (int)(backoff / 2 + 1));
        if (now + sleep_ms > deadline)
            sleep_ms = (uint32_t)(deadline - now);
        usleep(sleep_ms * 1000u);
        if (backoff < 2000)
            backoff *= 2;
    }
}

gpl_result_t rdzv_bclient_connect(const char *host, int port, const char *token, size_t token_len,
                                  uint32_t timeout_ms, rdzv_bclient **out, char *err,
                                  size_t errlen) {
    *out = NULL;
    rdzv_bclient *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return GPL_ERR_NOMEM;
    }
    c->fd = -1;
    snprintf(c->host, sizeof c->host, "%s", host);
    c->port = port;
    c->connect_timeout_ms = timeout_ms;
    rdzv_buf_init(&c->in, RDZV_MAX_FRAME + 4 + 65536);
    if (token && token_len) {
        c->token = malloc(token_len);
        if (c->token == NULL) {
            free(c);
            snprintf(err, errlen, "out of memory");
            return GPL_ERR_NOMEM;
        }
        memcpy(c->token, token, token_len);
        c->token_len = token_len;
    }
    gpl_result_t rc = reconnect(c);
    if (rc != GPL_OK) {
        snprintf(err, errlen, "%s", c->err);
        rdzv_bclient_close(c);
        return rc;
    }
    *out = c;
    return GPL_OK;
}

void rdzv_bclient_close(rdzv_bclient *c) {
    if (c == NULL)
        return;
    if (c->fd >= 0)
        close(c->fd);
    rdzv_buf_free(&c->in);
    free(c->token);
    free(c);
}

const char *rdzv_bclient_error(const rdzv_bclient *c) { return c->err; }
int rdzv_bclient_fd(const rdzv_bclient *c) { return c->fd; }
const rdzv_push_state *rdzv_bclient_pushes(const rdzv_bclient *c) { return &c->push; }

/* One request/reply exchange. retry: reconnect (and re-attach) once if the
 * connection broke, for requests that are safe to send twice. */
static gpl_result_t call(rdzv_bclient *c, rdzv_msg *m, uint32_t timeout_ms, int retry, rdzv_msg *r,
                         size_t *used) {
    for (int attempt = 0;; attempt++) {
        m->req_id = ++c->next_req;
        gpl_result_t rc = c->fd >= 0 ? send_msg(c, m) : GPL_ERR_CLOSED;
        if (rc == GPL_OK)
            rc = wait_reply(c, m->req_id, timeout_ms, r, used);
        if (rc != GPL_ERR_CLOSED || !retry || attempt > 0)
            return rc;
        rc = reconnect(c);
        if (rc == GPL_OK && c->attached) {
            c->attached = 0;
            rc = rdzv_bclient_attach(c, c->run_id, c->round);
        }
        if (rc != GPL_OK)
            return rc;
    }
}

gpl_result_t rdzv_bclient_attach(rdzv_bclient *c, const char *run_id, uint32_t round) {
    rdzv_msg m = {.type = RDZV_ATTACH}, r;
    snprintf(m.u.attach.run_id, sizeof m.u.attach.run_id, "%s", run_id);
    m.u.attach.round = round;
    size_t used;
    gpl_result_t rc = call(c, &m, BCLIENT_OP_TIMEOUT_MS, 0, &r, &used);
    if (rc != GPL_OK)
        return rc;
    rdzv_buf_consume(&c->in, used);
    if (run_id != c->run_id) /* a re-attach passes the stored id itself */
        snprintf(c->run_id, sizeof c->run_id, "%s", run_id);
    c->round = round;
    c->attached = 1;
    return GPL_OK;
}

static rdzv_bytes key_bytes(const char *k) {
    return (rdzv_bytes){(const uint8_t *)k, (uint32_t)strlen(k)};
}

gpl_result_t rdzv_bclient_set(rdzv_bclient *c, const char *key, const void *v, size_t n) {
    if (n > RDZV_MAX_VALUE || strlen(key) > RDZV_MAX_KEY)
        return seterr(c, GPL_ERR_LIMIT,
                      "key '%.64s' or its %zu-byte value is over the limits "
                      "(keys <= %d bytes, values <= %d bytes)",
                      key, n, RDZV_MAX_KEY, RDZV_MAX_VALUE);
    rdzv_msg m = {.type = RDZV_KV_SET}, r;
    m.u.kv_set.key = key_bytes(key);
    m.u.kv_set.value = (rdzv_bytes){v, (uint32_t)n};
    size_t used;
    gpl_result_t rc = call(c, &m, BCLIENT_OP_TIMEOUT_MS, 1, &r, &used);
    if (rc == GPL_OK)
        rdzv_buf_consume(&c->in, used);
    return rc;
}

gpl_result_t rdzv_bclient_get(rdzv_bclient *c, const char *key, void **out, size_t *n) {
    *out = NULL;
    *n = 0;
    rdzv_msg m = {.type = RDZV_KV_GET}, r;
    m.u.kv_key.key = key_bytes(key);
    size_t used;
    gpl_result_t rc = call(c, &m, BCLIENT_OP_TIMEOUT_MS, 1, &r, &used);
    if (rc != GPL_OK)
        return rc;
    if (!r.u.value.found) {
        rdzv_buf_consume(&c->in, used);
        return seterr(c, GPL_ERR_NOT_FOUND, "key '%.200s' is not set", key);
    }
    *out = malloc(r.u.value.value.len ? r.u.value.value.len : 1);
    if (*out == NULL)
        rc = GPL_ERR_NOMEM;
    else {
        memcpy(*out, r.u.value.value.p, r.u.value.value.len);
        *n = r.u.value.value.len;
    }
    rdzv_buf_consume(&c->in, used);
    return rc;
}

static gpl_result_t build_keys(rdzv_bclient *c, const char *const *keys, size_t nkeys,
                               rdzv_buf *list) {
    if (nkeys > RDZV_MAX_KEYS)
        return seterr(c, GPL_ERR_LIMIT, "%zu keys in one request; the limit is %d", nkeys,
                      RDZV_MAX_KEYS);
    rdzv_buf_init(list, RDZV_MAX_FRAME - 64);
    for (size_t i = 0; i < nkeys; i++) {
        size_t kl = strlen(keys[i]);
        if (kl > RDZV_MAX_KEY || rdzv_list_add(list, keys[i], (uint32_t)kl) != GPL_OK) {
            rdzv_buf_free(list);
            return seterr(c, GPL_ERR_LIMIT, "key list over the protocol limits");
        }
    }
    return GPL_OK;
}

gpl_result_t rdzv_bclient_wait(rdzv_bclient *c, const char *const *keys, size_t nkeys,
                               uint32_t timeout_ms) {
    rdzv_buf list;
    gpl_result_t rc = build_keys(c, keys, nkeys, &list);
    if (rc != GPL_OK)
        return rc;
    rdzv_msg m = {.type = RDZV_KV_WAIT}, r;
    m.u.kv_keys.timeout_ms = timeout_ms;
    m.u.kv_keys.nkeys = (uint32_t)nkeys;
    m.u.kv_keys.keys = (rdzv_bytes){list.data, (uint32_t)list.len};
    size_t used;
    rc = call(c, &m, timeout_ms + 10000, 1, &r, &used);
    if (rc == GPL_OK)
        rdzv_buf_consume(&c->in, used);
    rdzv_buf_free(&list);
    return rc;
}

gpl_result_t rdzv_bclient_add(rdzv_bclient *c, const char *key, int64_t delta, int64_t *out) {
    rdzv_msg m = {.type = RDZV_KV_ADD}, r;
    m.u.kv_add.key = key_bytes(key);
    m.u.kv_add.delta = delta;
    size_t used;
    gpl_result_t rc = call(c, &m, BCLIENT_OP_TIMEOUT_MS, 0, &r, &used);
    if (rc != GPL_OK)
        return rc;
    if (out)
        *out = r.u.int_.value;
    rdzv_buf_consume(&c->in, used);
    return GPL_OK;
}

gpl_result_t rdzv_bclient_cas(rdzv_bclient *c, const char *key, const void *expected, size_t en,
                              const void *desired, size_t dn, int *swapped) {
    rdzv_msg m = {.type = RDZV_KV_CAS}, r;
    m.u.kv_cas.key = key_bytes(key);
    m.u.kv_cas.expect_absent = expected == NULL;
    m.u.kv_cas.expected = (rdzv_bytes){expected, (uint32_t)(expected ? en : 0)};
    m.u.kv_cas.desired = (rdzv_bytes){desired, (uint32_t)dn};
    size_t used;
    gpl_result_t rc = call(c, &m, BCLIENT_OP_TIMEOUT_MS, 0, &r, &used);
    if (rc != GPL_OK)
        return rc;
    if (swapped)
        *swapped = r.u.int_.ok;
    rdzv_buf_consume(&c->in, used);
    return GPL_OK;
}

gpl_result_t rdzv_bclient_del(rdzv_bclient *c, const char *key) {
    rdzv_msg m = {.type = RDZV_KV_DEL}, r;
    m.u.kv_key.key = key_bytes(key);
    size_t used;
    gpl_result_t rc = call(c, &m, BCLIENT_OP_TIMEOUT_MS, 1, &r, &used);
    if (rc == GPL_OK)
        rdzv_buf_consume(&c->in, used);
    return rc;
}

gpl_result_t rdzv_bclient_mget(rdzv_bclient *c, const char *const *keys, size_t nkeys, void **vals,
                               size_t *lens) {
    rdzv_buf list;
    gpl_result_t rc = build_keys(c, keys, nkeys, &list);
    if (rc != GPL_OK)
        return rc;
    rdzv_msg m = {.type = RDZV_KV_MGET}, r;
    m.u.kv_keys.nkeys = (uint32_t)nkeys;
    m.u.kv_keys.keys = (rdzv_bytes){list.data, (uint32_t)list.len};
    size_t used;
    rc = call(c, &m, BCLIENT_OP_TIMEOUT_MS, 1, &r, &used);
    rdzv_buf_free(&list);
    if (rc != GPL_OK)
        return rc;
    rdzv_bytes walk = r.u.values.items, v;
    int found;
    size_t i = 0;
    while (i < nkeys && rdzv_values_next(&walk, &found, &v)) {
        vals[i] = NULL;
        lens[i] = 0;
        if (found) {
            vals[i] = malloc(v.len ? v.len : 1);
            if (vals[i] == NULL) {
                rc = GPL_ERR_NOMEM;
                break;
            }
            memcpy(vals[i], v.p, v.len);
            lens[i] = v.len;
        }
        i++;
    }
    for (; i < nkeys; i++) {
        vals[i] = NULL;
        lens[i] = 0;
    }
    rdzv_buf_consume(&c->in, used);
    return rc;
}

gpl_result_t rdzv_bclient_poll(rdzv_bclient *c, uint32_t timeout_ms) {
    if (c->fd < 0)
        return GPL_ERR_CLOSED;
    uint64_t deadline = gb_now_ms() + timeout_ms;
    for (;;) {
        rdzv_msg m;
        size_t used;
        gpl_result_t rc = read_frame(c, &m, deadline, &used);
        if (rc == GPL_ERR_TIMEOUT)
            return GPL_OK;
        if (rc != GPL_OK)
            return rc;
        note_push(c, &m);
        rdzv_buf_consume(&c->in, used);
    }
}
