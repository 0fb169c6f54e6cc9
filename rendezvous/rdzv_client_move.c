/* Moving a running round to a second connection when the first stalls in
 * TCP's exponential backoff (RDZV_CHALLENGE_MOVE, docs/protocol.md "Moving to
 * a new connection"): trouble and the stall seen in TCP_INFO, a spare
 * connection kept ready while there is trouble, the JOIN on it (or pipelined
 * behind its AUTH when it is not ready yet), the old one drained until the
 * server closes it. */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>

#include "gb_log.h"
#include "gb_time.h"
#include "rdzv_client_priv.h"

#define GB_COMPONENT "rdzv-client"

void rdzv__client_drop_move(rdzv_client *c) {
    rdzv__client_close_tcp(c, &c->mv);
    c->mv_in.len = 0;
    c->mv_ready = c->mv_go = 0;
}

void rdzv__client_drop_drain(rdzv_client *c) {
    rdzv__client_close_tcp(c, &c->drain);
    c->drain_in.len = 0;
}

static void on_shutdown(uv_shutdown_t *req, int status) {
    (void)status;
    free(req);
}

/* The new connection is the node's: what the client sends goes there, the
 * old one is read until the server closes it. It is left open until the
 * server says the node moved (rdzv__client_move_confirmed): its close
 * reaching the server first would end the round. */
static void promote_move(rdzv_client *c) {
    rdzv__client_drop_drain(c); /* moved again before the first drained: enough of it */
    rdzv_buf spare = c->drain_in;
    c->drain = c->tcp;
    c->drain_in = c->in;
    c->drain_since_ms = gb_now_ms();
    c->tcp = c->mv;
    c->tcp_sent = c->mv_sent;
    c->join_end = c->mv_join_end;
    c->acked_seen = 0;
    c->progress_ms = gb_now_ms();
    c->in = c->mv_in;
    c->mv = NULL;
    c->mv_in = spare;
    c->mv_in.len = 0;
    c->mv_ready = c->mv_go = 0;
    c->moves++;
    c->move_pending = 1;
    c->respare = 1;
    c->stall_since_ms = 0;
    GB_WARN("rendezvous %s:%d: round %u moved to a new connection: the old one's frames had "
            "waited %.1f s unacknowledged (%s; the link to the rendezvous is slow or lossy); "
            "move %u",
            c->host, c->o.port, c->a.round, (double)c->mv_stall_ms / 1000.0, c->mv_tcp, c->moves);
}

void rdzv__client_move_confirmed(rdzv_client *c) {
    c->move_pending = 0;
    if (c->drain == NULL)
        return;
    /* its sending side shut down: the server reads what is still queued on it, then closes it */
    uv_shutdown_t *sd = malloc(sizeof *sd);
    if (sd && uv_shutdown(sd, (uv_stream_t *)c->drain, on_shutdown) != 0)
        free(sd);
}

/* The move's JOIN on the spare; the spare is the connection once it is
 * ready (its WELCOME came): frames sent from then on follow the JOIN. */
static void send_move_join(rdzv_client *c) {
    rdzv_msg j;
    rdzv__client_fill_join(c, &j);
    c->mv_req = c->join_req = j.req_id;
    rdzv__client_send_on(c, c->mv, &j);
    c->mv_join_end = c->mv_sent;
}

/* The bytes the server's kernel acknowledged on the connection (fd): those
 * sent less those still queued, in libuv and in the kernel unacknowledged;
 * *queued those. -1 when not known. */
static int64_t acked_bytes(rdzv_client *c, int fd, uint64_t *queued) {
    int outq = 0;
    if (ioctl(fd, TIOCOUTQ, &outq) != 0 || outq < 0)
        return -1;
    *queued = uv_stream_get_write_queue_size((uv_stream_t *)c->tcp) + (uint64_t)outq;
    return c->tcp_sent >= *queued ? (int64_t)(c->tcp_sent - *queued) : -1;
}

/* Whether the server has the last move's JOIN: answered, or its bytes
 * acknowledged by the server's kernel (acked, from acked_bytes). */
static int move_joined(const rdzv_client *c, int64_t acked) {
    return !c->move_pending || (c->join_end && acked >= 0 && (uint64_t)acked >= c->join_end);
}

/* How long frames have waited on the connection with no byte of them
 * acknowledged (0: none waits), from acked and queued (acked_bytes): seen at
 * each heartbeat, so up to one interval short. */
static uint64_t unacked_for(rdzv_client *c, int64_t acked, uint64_t queued, uint64_t now) {
    if (acked < 0 || queued == 0 || (uint64_t)acked != c->acked_seen) {
        c->acked_seen = acked < 0 ? 0 : (uint64_t)acked;
        c->progress_ms = now;
        return 0;
    }
    return now - c->progress_ms;
}

/* What comes on the spare before it is the connection. Asked to move before
 * it is ready, its JOIN goes with HELLO and AUTH (one write): the server
 * moves the node at once, a round trip before the WELCOME makes it the
 * connection. */
void rdzv__client_handle_move(rdzv_client *c, const rdzv_msg *m) {
    switch (m->type) {
    case RDZV_CHALLENGE:
        if (!(m->flags & RDZV_CHALLENGE_MOVE)) {
            rdzv__client_drop_move(c); /* another server now: nothing to move to */
            return;
        }
        if (!rdzv__client_answer_challenge(c, c->mv, m))
            return;
        if (c->mv_go && c->assigned)
            send_move_join(c);
        return;
    case RDZV_WELCOME:
        c->mv_ready = 1;
        if (c->mv_go && c->mv_join_end && c->assigned)
            promote_move(c); /* its JOIN went with its AUTH */
        else if (c->mv_go && c->assigned) {
            send_move_join(c);
            promote_move(c);
        }
        return;
    case RDZV_ERROR:
        GB_WARN("rendezvous %s:%d: a spare connection to move to was refused: %s", c->host,
                c->o.port, m->u.error.message);
        rdzv__client_drop_move(c);
        return;
    default:
        return;
    }
}

static void on_move_connect(uv_connect_t *req, int status) {
    rdzv_client *c = req->data;
    uv_stream_t *h = req->handle;
    free(req);
    if (c->closing || h != (uv_stream_t *)c->mv)
        return; /* given up meanwhile */
    if (status < 0) {
        GB_INFO("rendezvous %s:%d: a new connection to move to failed (%s); the old one stays",
                c->host, c->o.port, uv_strerror(status));
        rdzv__client_drop_move(c);
        return;
    }
    rdzv__client_tune(c, c->mv);
    uv_read_start(h, rdzv__client_on_alloc, rdzv__client_on_read); /* the server speaks first */
}

/* A second connection to the server's address: the spare (why: the log's reason). */
static void open_spare(rdzv_client *c, const char *why) {
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getpeername(c->tcp, (struct sockaddr *)&ss, &len) != 0)
        return;
    uv_tcp_t *t = malloc(sizeof *t);
    uv_connect_t *req = malloc(sizeof *req);
    if (t == NULL || req == NULL) {
        free(t);
        free(req);
        return;
    }
    uv_tcp_init(c->loop, t);
    t->data = c;
    req->data = c;
    c->mv = t;
    c->mv_in.len = 0;
    c->mv_since_ms = gb_now_ms();
    c->mv_ready = c->mv_go = 0;
    c->mv_sent = c->mv_join_end = 0; /* mv_req stays the last move's until it is answered */
    GB_INFO("rendezvous %s:%d: %s: opening a spare one to move to if it stalls", c->host, c->o.port,
            why);
    if (uv_tcp_connect(req, t, (struct sockaddr *)&ss, on_move_connect) != 0) {
        free(req);
        rdzv__client_drop_move(c);
    }
}

/* The move asked: at once on a ready spare, else when the spare is. */
static void move(rdzv_client *c, uint32_t stall_ms, const struct tcp_info *ti) {
    if (c->mv == NULL)
        open_spare(c, "the connection stalls");
    if (c->mv == NULL)
        return;
    c->mv_go = 1;
    c->mv_stall_ms = stall_ms;
    snprintf(c->mv_tcp, sizeof c->mv_tcp,
             "TCP: retransmission timeout %.1f s, %u backoff(s), smoothed round trip %.2f s",
             ti->tcpi_rto / 1e6, (unsigned)ti->tcpi_backoff, ti->tcpi_rtt / 1e6);
    GB_INFO("rendezvous %s:%d: frames on the connection wait unacknowledged for %.1f s (%s): "
            "moving round %u to %s",
            c->host, c->o.port, (double)stall_ms / 1000.0, c->mv_tcp, c->a.round,
            c->mv_ready ? "the spare connection" : "a new connection once it is ready");
    if (c->mv_ready) {
        send_move_join(c);
        promote_move(c);
    }
}

/* On every heartbeat: trouble (a retransmission timeout) keeps a spare open,
 * a stall moves the round (RDZV_MOVE_STALL_*); a spare not ready in time, an
 * idle one, or a drain past the server's bound goes. */
void rdzv__client_check_stall(rdzv_client *c) {
    uint64_t now = gb_now_ms(), bound = (uint64_t)RDZV_KEEP_FACTOR * rdzv__client_hb_timeout_ms(c);
    if (c->drain && now - c->drain_since_ms >= bound) {
        rdzv__client_drop_drain(c);
        c->move_pending = 0; /* unanswered as long as the server bears: the next may try */
    }
    /* a spare that carried the move's JOIN is not given up here: the server may have moved
     * the node to it already (its answer on the way over a slow link), and closing it would end
     * the node there; only its own failure (TCP_USER_TIMEOUT, a reset) ends it */
    if (c->mv && !c->mv_ready && c->mv_join_end == 0 && now - c->mv_since_ms >= bound) {
        GB_INFO("rendezvous %s:%d: no spare connection within %.1f s; the old one stays", c->host,
                c->o.port, (double)bound / 1000.0);
        rdzv__client_drop_move(c);
    }
    if (c->mv && c->mv_ready && !c->mv_go && c->trouble_ms &&
        now - c->trouble_ms >= RDZV_SPARE_IDLE_MS)
        rdzv__client_drop_move(c); /* the link has been good for a while */
    if (!c->server_move || c->state != CS_READY || !c->assigned || c->frozen ||
        c->instance[0] == '\0' || (c->mv && c->mv_go))
        return; /* one move at a time: the last one is under way */
    /* after a move, a new spare at once: the connection moved to crosses
     * the same link and may stall in its turn */
    if (c->mv == NULL && c->respare) {
        c->respare = 0;
        open_spare(c, "the connection was moved to just now");
    }
    uv_os_fd_t fd;
    struct tcp_info ti;
    socklen_t tlen = sizeof ti;
    uint64_t queued = 0;
    if (uv_fileno((uv_handle_t *)c->tcp, &fd) != 0 ||
        getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tlen) != 0)
        return;
    int64_t acked = acked_bytes(c, fd, &queued);
    uint32_t stall = rdzv__client_hb_timeout_ms(c) / RDZV_MOVE_STALL_DIV;
    if (stall < RDZV_MOVE_STALL_MIN_MS)
        stall = RDZV_MOVE_STALL_MIN_MS;
    /* two signs: frames through a retransmission timeout (the backoff), or
     * frames with nothing acknowledged for the stall + the smoothed round
     * trip (a loss waiting out a retransmission timeout that slow round
     * trips made long: no backoff yet); trouble from half of that */
    uint64_t quiet = unacked_for(c, acked, queued, now), srtt = ti.tcpi_rtt / 1000;
    int backoff = ti.tcpi_unacked != 0 && ti.tcpi_backoff != 0;
    if (!backoff)
        c->stall_since_ms = 0; /* nothing outstanding, or acknowledged since its last timeout */
    if (!backoff && quiet < stall)
        return;
    c->trouble_ms = now;
    if (!move_joined(c, acked)) {
        if (c->mv == NULL)
            open_spare(c, "the connection had a retransmission timeout");
        return; /* the last move's JOIN may still reach the server: it would land after this */
    }
    uint64_t waited = quiet >= stall + srtt ? quiet : 0;
    if (backoff) {
        if (c->stall_since_ms == 0) {
            /* first seen backing off: its oldest frame has waited at least the timeouts so far
             * (the RTO doubles with each: rto - rto / 2^backoff of them) */
            uint64_t rto = ti.tcpi_rto / 1000, w = rto - (rto >> (ti.tcpi_backoff & 31));
            c->stall_since_ms = now > w ? now - w : 1;
        }
        if (now - c->stall_since_ms >= stall && now - c->stall_since_ms > waited)
            waited = now - c->stall_since_ms;
    }
    if (waited)
        move(c, (uint32_t)waited, &ti);
    else if (c->mv == NULL)
        open_spare(c, backoff ? "the connection had a retransmission timeout"
                              : "frames on the connection wait unacknowledged");
}
