/* The soak's hostile connections: soak_hostile.h says what. */
#include "soak_hostile.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "rdzv_codec.h"

typedef struct hostile {
    uv_tcp_t tcp;
    uv_connect_t creq;
    uv_write_t wreq;
    int kind, closed_by_server, in_use;
    uint64_t started;
    char buf[512];
} hostile;

static struct {
    uv_loop_t *loop;
    int port;
    uint32_t handshake_ms, answer_ms;
    soak_rnd_fn rnd;
    soak_violation_fn violation;
    int open;
    uint64_t done;
    hostile hos[SOAK_HOSTILE_MAX];
} H;

void soak_hostile_init(uv_loop_t *loop, int port, uint32_t handshake_ms, uint32_t answer_ms,
                       soak_rnd_fn rnd, soak_violation_fn violation) {
    H.loop = loop;
    H.port = port;
    H.handshake_ms = handshake_ms;
    H.answer_ms = answer_ms;
    H.rnd = rnd;
    H.violation = violation;
}

static void hostile_closed(uv_handle_t *h) {
    hostile *c = h->data;
    c->in_use = 0;
    H.open--;
}

static void hostile_alloc(uv_handle_t *h, size_t sz, uv_buf_t *b) {
    hostile *c = h->data;
    (void)sz;
    *b = uv_buf_init(c->buf, sizeof c->buf);
}

static void hostile_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
    hostile *c = st->data;
    (void)b;
    if (n < 0) { /* the server closed it: as it must */
        c->closed_by_server = 1;
        H.done++;
        uv_close((uv_handle_t *)&c->tcp, hostile_closed);
    }
}

static void hostile_written(uv_write_t *w, int status) { (void)w, (void)status; }

static void hostile_connected(uv_connect_t *req, int status) {
    hostile *c = req->data;
    if (status == UV_ECANCELED) /* closed by soak_hostile_close_all */
        return;
    if (status < 0) {
        char t[160];
        snprintf(t, sizeof t, "a hostile connection could not connect: %s", uv_strerror(status));
        H.violation(t);
        uv_close((uv_handle_t *)&c->tcp, hostile_closed);
        return;
    }
    uv_read_start((uv_stream_t *)&c->tcp, hostile_alloc, hostile_read);
    size_t len = 0;
    switch (c->kind) {
    case 0: /* garbage */
        for (len = 0; len < 64; len++)
            c->buf[len] = (char)H.rnd();
        break;
    case 1: { /* a frame longer than any the server takes */
        uint32_t big = htonl(0x7fffffffu);
        memcpy(c->buf, &big, 4);
        len = 4;
        break;
    }
    case 2: { /* a hello and a wrong token */
        rdzv_buf b;
        rdzv_buf_init(&b, 4096);
        rdzv_msg h = {.type = RDZV_HELLO, .req_id = 1};
        h.u.hello.magic = RDZV_MAGIC;
        h.u.hello.version = RDZV_VERSION;
        rdzv_msg a = {.type = RDZV_AUTH, .req_id = 2};
        memset(a.u.auth.mac, 0x5a, sizeof a.u.auth.mac);
        if (rdzv_encode(&h, &b) == GPL_OK && rdzv_encode(&a, &b) == GPL_OK &&
            b.len <= sizeof c->buf) {
            memcpy(c->buf, b.data, b.len);
            len = b.len;
        }
        rdzv_buf_free(&b);
        break;
    }
    default: /* says nothing: the handshake timeout closes it */
        return;
    }
    uv_buf_t ub = uv_buf_init(c->buf, (unsigned)len);
    uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &ub, 1, hostile_written);
}

void soak_hostile_start(uint64_t now) {
    hostile *c = NULL;
    for (int i = 0; i < SOAK_HOSTILE_MAX && c == NULL; i++)
        if (!H.hos[i].in_use)
            c = &H.hos[i];
    if (c == NULL)
        return;
    memset(c, 0, sizeof *c);
    c->in_use = 1;
    c->kind = (int)(H.rnd() % 4);
    c->started = now;
    c->tcp.data = c->creq.data = c;
    uv_tcp_init(H.loop, &c->tcp);
    c->tcp.data = c;
    H.open++;
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", H.port, &a);
    uv_tcp_connect(&c->creq, &c->tcp, (struct sockaddr *)&a, hostile_connected);
}

void soak_hostile_check(uint64_t now) {
    for (int i = 0; i < SOAK_HOSTILE_MAX; i++) {
        hostile *c = &H.hos[i];
        if (c->in_use && !c->closed_by_server && !uv_is_closing((uv_handle_t *)&c->tcp) &&
            now - c->started > H.handshake_ms + H.answer_ms) {
            char t[160];
            snprintf(t, sizeof t, "a hostile connection (kind %d) still open after %.1f s", c->kind,
                     (double)(now - c->started) / 1000.0);
            H.violation(t);
            uv_close((uv_handle_t *)&c->tcp, hostile_closed);
        }
    }
}

void soak_hostile_close_all(void) {
    for (int i = 0; i < SOAK_HOSTILE_MAX; i++)
        if (H.hos[i].in_use && !uv_is_closing((uv_handle_t *)&H.hos[i].tcp))
            uv_close((uv_handle_t *)&H.hos[i].tcp, hostile_closed);
}

int soak_hostile_open(void) { return H.open; }

uint64_t soak_hostile_closed(void) { return H.done; }
