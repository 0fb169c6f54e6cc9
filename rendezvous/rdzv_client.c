/* The asynchronous rendezvous client, on the launcher's libuv loop:
 * handshake, join, heartbeats, pushed messages, the client's API, and after a
 * server restart a join that re-registers the running round. Connecting and
 * reconnecting with backoff: rdzv_client_connect.c; moving the round to a
 * new connection when this one stalls: rdzv_client_move.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb_log.h"
#include "gb_time.h"
#include "gpulaunch/rdzv.h"
#include "rdzv_auth.h"
#include "rdzv_codec.h"
#include "rdzv_client_int.h"
#include "rdzv_client_priv.h"
#include "rdzv_peer.h"

#define GB_COMPONENT "rdzv-client"

#define RDZV_CLIENT_WAIT_EVERY_MS 250 /* a wait that goes on is said again this often */

void rdzv__client_unref(rdzv_client *c) {
    if (--c->handles == 0) {
        rdzv_buf_free(&c->in);
        rdzv_buf_free(&c->mv_in);
        rdzv_buf_free(&c->drain_in);
        free(c->token);
        free(c);
    }
}

static void on_handle_closed(uv_handle_t *h) {
    rdzv_client *c = h->data;
    if (h != (uv_handle_t *)&c->retry && h != (uv_handle_t *)&c->hb &&
        h != (uv_handle_t *)&c->notice)
        free(h);
    rdzv__client_unref(c);
}

void rdzv__client_fatal(rdzv_client *c, gpl_result_t code, const char *msg) {
    if (c->failed || c->closing)
        return;
    c->failed = 1;
    if (c->cb.on_error == NULL) /* the owner says it otherwise */
        GB_ERROR("%s", msg);
    if (c->cb.on_error)
        c->cb.on_error(c, code, msg);
}

void rdzv__client_close_tcp(rdzv_client *c, uv_tcp_t **t) {
    if (*t) {
        c->handles++;
        uv_close((uv_handle_t *)*t, on_handle_closed);
        *t = NULL;
    }
}

typedef struct wr {
    uv_write_t req;
    uint8_t *data;
} wr;

static void on_written(uv_write_t *req, int status) {
    wr *w = (wr *)req;
    free(w->data);
    free(w);
}

void rdzv__client_send_on(rdzv_client *c, uv_tcp_t *t, rdzv_msg *m) {
    if (t == NULL || c->frozen)
        return;
    rdzv_buf b;
    rdzv_buf_init(&b, RDZV_MAX_FRAME + 4);
    if (rdzv_encode(m, &b) != GPL_OK) {
        rdzv_buf_free(&b);
        return;
    }
    if (t == c->tcp)
        c->tcp_sent += b.len;
    else if (t == c->mv)
        c->mv_sent += b.len;
    uv_buf_t ub = uv_buf_init((char *)b.data, (unsigned)b.len);
    int n = uv_try_write((uv_stream_t *)t, &ub, 1);
    if (n == (int)b.len) {
        rdzv_buf_free(&b);
        return;
    }
    if (n < 0)
        n = 0;
    /* Rare: the socket buffer is full. Queue the rest. */
    wr *w = malloc(sizeof *w);
    if (w == NULL) {
        rdzv_buf_free(&b);
        return;
    }
    w->data = b.data;
    w->req.data = w;
    ub = uv_buf_init((char *)b.data + n, (unsigned)(b.len - (size_t)n));
    if (uv_write(&w->req, (uv_stream_t *)t, &ub, 1, on_written) != 0) {
        free(w->data);
        free(w);
    }
}

static void send_msg(rdzv_client *c, rdzv_msg *m) {
    if (c->state >= CS_HANDSHAKE)
        rdzv__client_send_on(c, c->tcp, m);
}

/* The JOIN of this node: a RESUME of its round while it holds one. */
void rdzv__client_fill_join(rdzv_client *c, rdzv_msg *mp) {
    rdzv_msg m = {.type = RDZV_JOIN, .req_id = ++c->next_req};
    snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "%s", c->run_id);
    snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "%s", c->hostname);
    snprintf(m.u.join.addr, sizeof m.u.join.addr, "%s", c->addr);
    snprintf(m.u.join.instance, sizeof m.u.join.instance, "%s", c->instance);
    m.u.join.master_port = c->jp.master_port;
    m.u.join.nproc = c->jp.nproc;
    m.u.join.ngpus = c->jp.ngpus;
    m.u.join.static_rank = c->jp.static_rank;
    m.u.join.min_nodes = c->jp.min_nodes;
    m.u.join.max_nodes = c->jp.max_nodes;
    m.u.join.last_call_ms = c->jp.last_call_ms;
    m.u.join.join_timeout_ms = c->jp.join_timeout_ms;
    m.u.join.heartbeat_timeout_ms = c->jp.heartbeat_timeout_ms;
    if (c->assigned) {
        m.flags = RDZV_JOIN_RESUME;
        m.u.join.round = c->a.round;
        m.u.join.node_rank = c->a.node_rank;
        m.u.join.base_rank = c->a.base_rank;
        m.u.join.world_size = c->a.world_size;
        m.u.join.nnodes = c->a.nnodes;
    } else if (c->jp.warm && c->server_warm)
        m.flags = RDZV_JOIN_WARM;
    if (c->server_probe)
        m.flags |= RDZV_JOIN_PROBE;
    if (c->peer) {
        m.flags |= RDZV_JOIN_PEER;
        m.u.join.peer_port = rdzv__peer_port(c->peer);
        if (c->server_kernel && rdzv__peer_kernel(c->peer))
            m.flags |= RDZV_JOIN_KERNEL;
    }
    *mp = m;
}

static void send_join(rdzv_client *c) {
    rdzv_msg m;
    rdzv__client_fill_join(c, &m);
    if (c->pending && !c->assigned) /* its JOIN on a connection since given up was not answered */
        m.flags |= RDZV_JOIN_AGAIN;
    c->join_req = m.req_id;
    c->want_join = 0;
    c->pending = !c->assigned;
    send_msg(c, &m);
    if (c->node_flags && c->server_warm) { /* a new connection's member knows nothing yet */
        rdzv_msg n = {.type = RDZV_NODE, .flags = c->node_flags, .req_id = ++c->next_req};
        send_msg(c, &n);
    }
}

/* A peer probe the server asked for ended: its answer. */
static void on_peer_done(void *data, uint32_t id, int ok, uint32_t rtt_ms) {
    rdzv_client *c = data;
    if (c->state != CS_READY || c->frozen)
        return;
    rdzv_msg a = {.type = RDZV_PROBE_ACK, .req_id = id};
    a.u.probe_ack.ok = (uint8_t)ok;
    a.u.probe_ack.rtt_ms = rtt_ms;
    send_msg(c, &a);
}

static void open_peer(rdzv_client *c) {
    char err[160];
    if (rdzv__peer_open(c->loop, on_peer_done, c, &c->peer, err, sizeof err) != GPL_OK) {
        c->peer_failed = 1;
        GB_WARN("%s: this node answers the rendezvous's probes, but no other node's (a link "
                "bad between the rendezvous and this node alone can then end a round early)",
                err);
    }
}

/* HELLO and AUTH on t; 0 when there is no token to answer with (fatal). */
int rdzv__client_answer_challenge(rdzv_client *c, uv_tcp_t *t, const rdzv_msg *m) {
    rdzv_msg h = {.type = RDZV_HELLO, .req_id = ++c->next_req};
    h.u.hello.magic = RDZV_MAGIC;
    h.u.hello.version = RDZV_VERSION;
    rdzv__client_send_on(c, t, &h);
    rdzv_msg a = {.type = RDZV_AUTH, .req_id = ++c->next_req};
    if (m->u.challenge.auth_required) {
        if (c->token == NULL) {
            char msg[300];
            snprintf(msg, sizeof msg,
                     "the rendezvous at %s:%d requires a token; set --rdzv-token-file or "
                     "GPULAUNCH_RDZV_TOKEN",
                     c->host, c->o.port);
            rdzv__client_fatal(c, GPL_ERR_AUTH, msg);
            return 0;
        }
        rdzv_auth_mac(c->token, c->o.token_len, m->u.challenge.nonce, a.u.auth.mac);
    }
    rdzv__client_send_on(c, t, &a);
    return 1;
}

uint32_t rdzv__client_hb_timeout_ms(const rdzv_client *c) {
    return c->jp.heartbeat_timeout_ms ? c->jp.heartbeat_timeout_ms
                                      : RDZV_DEFAULT_HEARTBEAT_TIMEOUT_MS;
}

/* The node gains or loses its round: the connection's bound on
 * unacknowledged data follows (RDZV_PENDING_KEEP_MS). */
static void holds_round(rdzv_client *c, int yes) {
    if (c->assigned == yes)
        return;
    c->assigned = yes;
    if (c->tcp)
        rdzv__client_tune(c, c->tcp);
}

static void handle(rdzv_client *c, const rdzv_msg *m) {
    switch (m->type) {
    case RDZV_CHALLENGE:
        c->server_health = (m->flags & RDZV_CHALLENGE_HEALTH) != 0;
        c->server_warm = (m->flags & RDZV_CHALLENGE_WARM) != 0;
        c->server_probe = (m->flags & RDZV_CHALLENGE_PROBE) != 0;
        c->server_kernel = (m->flags & RDZV_CHALLENGE_KERNEL) != 0;
        c->server_story = (m->flags & RDZV_CHALLENGE_STORY) != 0;
        c->server_story_more = (m->flags & RDZV_CHALLENGE_STORY_MORE) != 0;
        c->server_move = (m->flags & RDZV_CHALLENGE_MOVE) != 0;
        if ((m->flags & RDZV_CHALLENGE_PEER) && c->peer == NULL && !c->peer_failed)
            open_peer(c);
        rdzv__client_answer_challenge(c, c->tcp, m);
        return;
    case RDZV_WELCOME:
        c->state = CS_READY;
        if (c->noticed)
            GB_WARN("rendezvous %s:%d reached after %.1f s", c->host, c->o.port,
                    (double)(gb_now_ms() - c->down_since_ms) / 1000.0);
        c->down_since_ms = 0;
        c->noticed = 0;
        uv_timer_stop(&c->notice);
        if (c->want_join || c->assigned || c->pending)
            send_join(c);
        return;
    case RDZV_ASSIGNED:
        holds_round(c, 1);
        c->pending = 0;
        c->a.round = m->u.assigned.round;
        c->a.node_rank = m->u.assigned.node_rank;
        c->a.nnodes = m->u.assigned.nnodes;
        c->a.base_rank = m->u.assigned.base_rank;
        c->a.world_size = m->u.assigned.world_size;
        if (m->u.assigned.master_addr[0]) { /* a resume echo carries no master */
            c->a.master_port = m->u.assigned.master_port;
            snprintf(c->a.master_addr, sizeof c->a.master_addr, "%s", m->u.assigned.master_addr);
            if (c->cb.on_assigned)
                c->cb.on_assigned(c, &c->a);
        } else if (m->req_id == c->mv_req && c->move_pending) {
            rdzv__client_move_confirmed(c);
        } else if (m->req_id > c->mv_req) { /* below: an earlier move's, on a drained one */
            GB_INFO("re-registered round %u with the restarted rendezvous", c->a.round);
        }
        return;
    case RDZV_ROUND_OVER:
        if (!c->assigned || m->u.round_over.round != c->a.round) {
            /* the end of a round this node already left (it failed locally and
             * re-joined before the server's notice arrived): not news */
            GB_DEBUG("ignoring the end of round %u: this node is past it", m->u.round_over.round);
            return;
        }
        holds_round(c, 0);
        if (c->cb.on_round_over)
            c->cb.on_round_over(c, m->u.round_over.round, m->u.round_over.reason,
                                m->u.round_over.node_rank, m->u.round_over.hostname,
                                m->u.round_over.message);
        return;
    case RDZV_WAITING:
        if (m->flags & RDZV_WAITING_WARM) {
            if (c->cb.on_warm)
                c->cb.on_warm(c, m->u.waiting.waiting, m->u.waiting.members);
            return;
        }
        if (c->cb.on_waiting)
            c->cb.on_waiting(c, m->u.waiting.waiting, m->u.waiting.members);
        return;
    case RDZV_PROGRESS:
        if (c->cb.on_progress)
            c->cb.on_progress(c, m->u.progress.joined, m->u.progress.expected,
                              m->u.progress.waited_ms, m->u.progress.missing);
        return;
    case RDZV_EVENT:
        if (c->cb.on_event)
            c->cb.on_event(c, m->u.event.kind, m->u.event.deadline_unix_ms, m->u.event.node,
                           m->u.event.reason);
        return;
    case RDZV_JOB_DONE:
        if (c->cb.on_job_done)
            c->cb.on_job_done(c);
        return;
    case RDZV_PING: { /* answered at once: the server probes whether this node lives */
        rdzv_msg p = {.type = RDZV_PONG, .req_id = m->req_id};
        send_msg(c, &p);
        return;
    }
    case RDZV_PROBE_REQ: /* the server asks this node to probe a peer it suspects */
        if (c->peer)
            rdzv__peer_probe(c->peer, m->req_id, m->u.probe_req.addr, m->u.probe_req.port,
                             m->u.probe_req.deadline_ms, m->flags);
        else
            on_peer_done(c, m->req_id, m->flags ? RDZV_PROBE_OK_UNABLE : RDZV_PROBE_OK_NONE, 0);
        return;
    case RDZV_ERROR:
        if (m->u.error.code == GPL_ERR_ROUND_OVER && m->req_id == c->join_req && c->assigned) {
            /* The restarted server could not resume our round (or a move came after its end):
             * it is over. */
            holds_round(c, 0);
            if (c->move_pending)
                rdzv__client_move_confirmed(c);
            if (c->cb.on_round_over)
                c->cb.on_round_over(c, c->a.round, RDZV_REASON_DISCONNECT, UINT32_MAX, "",
                                    m->u.error.message);
            return;
        }
        if (m->req_id == c->join_req || c->state != CS_READY) {
            rdzv__client_fatal(c, (gpl_result_t)m->u.error.code, m->u.error.message);
            return;
        }
        GB_WARN("rendezvous: %s", m->u.error.message);
        return;
    default:
        return;
    }
}

void rdzv__client_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    static char slab[65536];
    buf->base = slab;
    buf->len = sizeof slab;
}

/* st's input: the connection's, the one being moved to, or the one moved
 * from; NULL when st is none of them any more. */
static rdzv_buf *input_of(rdzv_client *c, uv_stream_t *st) {
    if (st == (uv_stream_t *)c->tcp)
        return &c->in;
    if (st == (uv_stream_t *)c->mv)
        return &c->mv_in;
    if (st == (uv_stream_t *)c->drain)
        return &c->drain_in;
    return NULL;
}

/* st failed or ended: the connection reconnects; a move is given up; the one
 * moved from is done (the server closed it). */
static void link_failed(rdzv_client *c, uv_stream_t *st, const char *why) {
    if (st == (uv_stream_t *)c->tcp)
        rdzv__client_schedule_retry(c, why);
    else if (st == (uv_stream_t *)c->mv) {
        GB_INFO("rendezvous %s:%d: the new connection to move to failed (%s); the old one stays",
                c->host, c->o.port, why);
        rdzv__client_drop_move(c);
    } else if (st == (uv_stream_t *)c->drain)
        rdzv__client_drop_drain(c);
}

void rdzv__client_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    rdzv_client *c = st->data;
    if (nread < 0) {
        link_failed(c, st,
                    nread == UV_EOF ? "connection closed by the server" : uv_strerror((int)nread));
        return;
    }
    rdzv_buf *in = input_of(c, st);
    if (nread == 0 || in == NULL)
        return;
    if (rdzv_buf_append(in, buf->base, (size_t)nread) != GPL_OK) {
        link_failed(c, st, "reply over the frame limit");
        return;
    }
    size_t off = 0;
    /* a frame may make the connection being moved to the connection: its
     * input moves with it, the offset stays */
    while ((in = input_of(c, st)) != NULL) {
        size_t flen;
        gpl_result_t rc = rdzv_frame_peek(in->data + off, in->len - off, &flen);
        if (rc == GPL_ERR_STATE)
            break;
        rdzv_msg m;
        char why[128] = "bad frame length";
        if (rc != GPL_OK || rdzv_decode(in->data + off, flen, &m, why, sizeof why) != GPL_OK) {
            link_failed(c, st, why);
            return;
        }
        off += flen;
        if (st == (uv_stream_t *)c->mv)
            rdzv__client_handle_move(c, &m);
        else
            handle(c, &m);
        if (c->failed || c->closing)
            return;
    }
    if (in)
        rdzv_buf_consume(in, off);
}

static void send_heartbeat(rdzv_client *c) {
    if (c->state != CS_READY)
        return;
    rdzv_msg m = {.type = RDZV_HEARTBEAT};
    if (c->server_probe) {
        m.flags = RDZV_HEARTBEAT_WAIT;
        m.u.heartbeat.wait_ms = c->wait_ms;
        c->wait_said_ms = gb_now_ms();
    }
    send_msg(c, &m);
}

static void on_heartbeat(uv_timer_t *t) {
    rdzv__client_check_stall(t->data);
    send_heartbeat(t->data);
}

gpl_result_t rdzv_client_start(uv_loop_t *loop, const rdzv_client_options *o,
                               const rdzv_join_params *jp, const rdzv_client_callbacks *cb,
                               rdzv_client **out, char *err, size_t errlen) {
    *out = NULL;
    rdzv_client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return GPL_ERR_NOMEM;
    }
    c->loop = loop;
    c->o = *o;
    snprintf(c->host, sizeof c->host, "%s", o->host);
    if (o->token && o->token_len) {
        c->token = malloc(o->token_len);
        if (c->token == NULL) {
            free(c);
            snprintf(err, errlen, "out of memory");
            return GPL_ERR_NOMEM;
        }
        memcpy(c->token, o->token, o->token_len);
    }
    c->jp = *jp;
    snprintf(c->run_id, sizeof c->run_id, "%s", jp->run_id ? jp->run_id : "");
    snprintf(c->hostname, sizeof c->hostname, "%s", jp->hostname ? jp->hostname : "");
    snprintf(c->addr, sizeof c->addr, "%s", jp->addr ? jp->addr : "");
    snprintf(c->instance, sizeof c->instance, "%s", jp->instance ? jp->instance : "");
    c->cb = *cb;
    rdzv_buf_init(&c->in, RDZV_MAX_FRAME + 4 + 65536);
    rdzv_buf_init(&c->mv_in, RDZV_MAX_FRAME + 4 + 65536);
    rdzv_buf_init(&c->drain_in, RDZV_MAX_FRAME + 4 + 65536);
    uv_timer_init(loop, &c->retry);
    uv_timer_init(loop, &c->hb);
    uv_timer_init(loop, &c->notice);
    c->retry.data = c->hb.data = c->notice.data = c;
    c->handles = 3;
    c->want_join = 1;
    uint32_t hb =
        jp->heartbeat_interval_ms ? jp->heartbeat_interval_ms : RDZV_DEFAULT_HEARTBEAT_INTERVAL_MS;
    uv_timer_start(&c->hb, on_heartbeat, hb, hb);
    rdzv__client_outage_begins(c,
                               gb_now_ms()); /* not connected yet: said after 2 s like any outage */
    rdzv__client_start_connect(c);
    *out = c;
    return GPL_OK;
}

void *rdzv_client_data(rdzv_client *c) { return c->cb.data; }

void rdzv_client_rejoin(rdzv_client *c) {
    holds_round(c, 0);
    /* a JOIN already waiting for the next round stands: that round is the one
     * asked for (a launcher whose re-formation failed after it had joined
     * restarts its workers into it); a second JOIN would be refused */
    if (c->pending && c->state == CS_READY)
        return;
    c->want_join = 1;
    if (c->state == CS_READY)
        send_join(c);
}

void rdzv_client_set_master_port(rdzv_client *c, uint16_t port) { c->jp.master_port = port; }

int rdzv_client_connected(const rdzv_client *c) { return c->state == CS_READY; }

void rdzv_client_waiting(rdzv_client *c, uint32_t wait_ms) {
    int changed = (wait_ms != 0) != (c->wait_ms != 0);
    c->wait_ms = wait_ms;
    if (!c->server_probe)
        return; /* a server that predates waits: nothing to say */
    /* a wait that begins or ends is said at once, one that goes on every
     * RDZV_CLIENT_WAIT_EVERY_MS: the server probes again a node that
     * answered the last probe and may have gone since */
    if (changed || (wait_ms && gb_now_ms() - c->wait_said_ms >= RDZV_CLIENT_WAIT_EVERY_MS))
        send_heartbeat(c);
}

void rdzv_client_fail(rdzv_client *c, const char *message) {
    rdzv_msg m = {.type = RDZV_FAIL, .req_id = ++c->next_req};
    snprintf(m.u.fail.message, sizeof m.u.fail.message, "%s", message);
    send_msg(c, &m);
}

void rdzv_client_node(rdzv_client *c, uint16_t flags) {
    if (flags == c->node_flags)
        return;
    c->node_flags = flags;
    if (c->state != CS_READY || !c->server_warm)
        return; /* said on the next JOIN's connection, or never to an older server */
    rdzv_msg m = {.type = RDZV_NODE, .flags = flags, .req_id = ++c->next_req};
    send_msg(c, &m);
}

int rdzv_client_warm(const rdzv_client *c) { return c->jp.warm && c->server_warm; }

void rdzv_client_hang(rdzv_client *c, uint32_t rank, const char *message) {
    rdzv_msg m = {.type = RDZV_FAIL, .req_id = ++c->next_req};
    snprintf(m.u.fail.message, sizeof m.u.fail.message, "%s", message);
    if (c->server_health) {
        m.flags = RDZV_FAIL_HANG;
        m.u.fail.rank = rank;
    }
    send_msg(c, &m);
}

void rdzv_client_stats(rdzv_client *c, uint32_t window_ms, const rdzv_rank_stats *ranks,
                       uint32_t n) {
    if (c->state != CS_READY || !c->assigned)
        return;
    if (!c->server_health) {
        if (!c->stats_warned)
            GB_INFO("the rendezvous at %s:%d predates per-rank statistics: not sending them "
                    "(stragglers are not named)",
                    c->host, c->o.port);
        c->stats_warned = 1;
        return;
    }
    if (n > RDZV_MAX_STATS_RANKS)
        n = RDZV_MAX_STATS_RANKS;
    rdzv_buf list;
    rdzv_buf_init(&list, RDZV_MAX_FRAME);
    uint32_t count = 0;
    for (uint32_t i = 0; i < n; i++) {
        rdzv_rank_stats r = ranks[i];
        r.gpu[sizeof r.gpu - 1] = '\0';
        if (rdzv_stats_add(&list, &r) == GPL_OK)
            count++;
    }
    rdzv_msg m = {.type = RDZV_STATS}; /* no reply: a heartbeat with content */
    m.u.stats.window_ms = window_ms;
    m.u.stats.count = count;
    m.u.stats.ranks = (rdzv_bytes){list.data, (uint32_t)list.len};
    send_msg(c, &m);
    rdzv_buf_free(&list);
}

void rdzv_client_story(rdzv_client *c, const rdzv_story *story) {
    if (c->state != CS_READY || !c->server_story)
        return;
    rdzv_msg m = {.type = RDZV_STORY}; /* no reply */
    m.u.story.round = story->round;
    m.u.story.kind = story->kind;
    m.u.story.pause_ms = story->pause_ms;
    m.u.story.redone = story->redone;
    m.u.story.nproc = story->nproc;
    snprintf(m.u.story.why, sizeof m.u.story.why, "%s", story->why ? story->why : "");
    m.u.story.source = story->source;
    m.u.story.state_step = story->state_step;
    m.u.story.state_bytes = story->state_bytes;
    m.u.story.state_ms = story->state_ms;
    if (c->server_story_more) {
        m.flags |= RDZV_STORY_MORE;
        m.u.story.cause = story->cause;
        m.u.story.state_root = story->state_root;
    }
    send_msg(c, &m);
}

void rdzv_client_done(rdzv_client *c) {
    rdzv_msg m = {.type = RDZV_DONE, .req_id = ++c->next_req};
    send_msg(c, &m);
}

void rdzv_client_event(rdzv_client *c, uint32_t kind, uint64_t deadline_unix_ms,
                       const char *reason) {
    rdzv_msg m = {.type = RDZV_EVENT, .req_id = ++c->next_req};
    m.u.event.kind = kind;
    m.u.event.deadline_unix_ms = deadline_unix_ms;
    snprintf(m.u.event.reason, sizeof m.u.event.reason, "%s", reason);
    send_msg(c, &m);
}

void rdzv_client_freeze(rdzv_client *c) {
    if (c == NULL || c->closing)
        return;
    rdzv__peer_mute(c->peer);
    rdzv_client_freeze_link(c);
}

void rdzv_client_stop_peer(rdzv_client *c, int stopped) {
    if (c != NULL && !c->closing)
        rdzv__peer_stop(c->peer, stopped);
}

void rdzv_client_freeze_link(rdzv_client *c) {
    if (c == NULL || c->closing)
        return;
    c->frozen = 1;
    uv_timer_stop(&c->retry);
    uv_timer_stop(&c->hb);
    uv_timer_stop(&c->notice);
    if (c->tcp)
        uv_read_stop((uv_stream_t *)c->tcp);
    if (c->mv)
        uv_read_stop((uv_stream_t *)c->mv);
    if (c->drain)
        uv_read_stop((uv_stream_t *)c->drain);
}

void rdzv_client_close(rdzv_client *c) {
    if (c == NULL || c->closing)
        return;
    c->closing = 1;
    rdzv__client_drop_conn(c);
    rdzv__peer_close(c->peer);
    c->peer = NULL;
    uv_timer_stop(&c->retry);
    uv_timer_stop(&c->hb);
    uv_timer_stop(&c->notice);
    uv_close((uv_handle_t *)&c->retry, on_handle_closed);
    uv_close((uv_handle_t *)&c->hb, on_handle_closed);
    uv_close((uv_handle_t *)&c->notice, on_handle_closed);
}
