/* Internal state of the rendezvous server, shared by its parts:
 * rdzv_server.c (the transport: connections, frames, the handshake, output
 * and pushes, the sweep timer), rdzv_job.c (jobs: requests carried to round
 * formation, rdzv_round.c, and to the key-value store, rdzv_kv.c; their
 * decisions carried to connections; liveness) and rdzv_http.c
 * (observability, read only). */
#ifndef GPULAUNCH_RDZV_SERVER_INT_H
#define GPULAUNCH_RDZV_SERVER_INT_H

#include <stddef.h>
#include <sys/queue.h>

#include "gpulaunch/rdzv.h"
#include "rdzv_codec.h"
#include "rdzv_fanout.h"
#include "rdzv_health.h"
#include "rdzv_kv.h"
#include "rdzv_probe.h"
#include "rdzv_round.h"

typedef struct conn conn;
typedef struct job job;
typedef struct member member;

enum conn_state { C_HELLO = 0, C_AUTH = 1, C_READY = 2 };

/* A connection; m is the node it carries (m->c == c), or a node that moved
 * from it to a newer connection (m->was == c: frames on it still count as
 * the node's, requests on it are the node's). */
struct conn {
    uv_tcp_t tcp;
    rdzv_server *s;
    LIST_ENTRY(conn) link, alink, dlink;
    TAILQ_ENTRY(conn) hlink; /* s->handshaking, in accept order, while state != C_READY */
    uint64_t push_mark;      /* the last push that listed it */
    int state, closing;
    const char *doomed; /* to close once the current event is handled: why */
    uint8_t nonce[RDZV_NONCE_LEN];
    rdzv_buf in;
    size_t outq;
    uint64_t accepted_ms, last_rx_ms;
    char peer[64];
    member *m;
    job *aj; /* attached job (worker connections) */
    uint32_t around;
    /* a connection a node moved to that has carried nothing since the
     * move's answer: no frame in (its client has not taken it up) and none
     * out but pings and probe requests (nothing the node must hear). Only
     * such a one, closed by the node, sends it back (rdzv__job_conn_fallback). */
    int move_fresh;
    const char *move_spoiled; /* what ended move_fresh first (for the log) */
    LIST_HEAD(, rdzv_waiter) waiters;
};

/* c carried what (a frame in, or out): no longer a fresh move target. */
static inline void rdzv__conn_spoil(conn *c, const char *what) {
    if (c->move_fresh) {
        c->move_fresh = 0;
        c->move_spoiled = what;
    }
}

/* A node of a job: its round membership and its connection. */
struct member {
    rdzv_rmember rm; /* first: a round's rdzv_rmember pointer is its member */
    conn *c;         /* its connection */
    conn *was;    /* the connection it moved from (RDZV_CHALLENGE_MOVE), open while the node drains
                     it: what still comes on it is the node's (its c->m is this member); NULL none */
    rdzv_probe p; /* suspicion and probes (rdzv_probe.c) */
    LIST_ENTRY(member) plink;
};

static inline member *member_of(rdzv_rmember *rm) { return (member *)(void *)rm; }

struct job {
    LIST_ENTRY(job) link;
    rdzv_server *s;
    rdzv_round r; /* round formation: job_of(&j->r) == j */
    rdzv_kv kv;   /* the current round's key-value store */
    LIST_HEAD(, conn) attached;
    rdzv_health *health; /* stats, stragglers, timeline (rdzv_health.c); NULL: no memory */
};

static inline job *job_of(rdzv_round *r) { return (job *)(void *)((char *)r - offsetof(job, r)); }

typedef struct rdzv_metrics {
    uint64_t connections_total, connections_open, joins, rounds, kv_ops, auth_refused,
        protocol_errors, jobs_done;
    /* suspicions' probes: sent = answered + unanswered + moot (the round ended, the node
     * went) + in flight */
    uint64_t probes_sent, probes_answered, probes_unanswered, probes_moot;
    /* peers asked to probe a suspect (PROBE_REQ), and what they said */
    uint64_t relays_sent, relays_reached, relays_unreached, relays_machine, relays_unable;
    /* machine checks (a peer connects to a node's kernel-probe port), by what they found */
    uint64_t checks_reached, checks_unreached, checks_unable, checks_no_answer;
    uint64_t frames_in, frames_out; /* every frame decoded and every frame sent */
    uint64_t moves;                 /* nodes that moved to a new connection in a running round */
    uint64_t moves_back;  /* ... and back to the old one, the new one closed by the node */
    uint64_t failures[7]; /* by rdzv_reason */
} rdzv_metrics;

struct rdzv_server {
    uv_loop_t *loop;
    rdzv_server_options o;
    char *token;
    uv_tcp_t listener;
    uv_timer_t sweep;
    int port;
    uint64_t epoch;
    LIST_HEAD(, conn) conns;
    LIST_HEAD(, conn) doomed;       /* closed once the current event is handled */
    TAILQ_HEAD(, conn) handshaking; /* accept order: the handshake deadline sweep */
    rdzv_buf scratch;               /* send_msg's encoding, reused */
    rdzv_buf kv_scratch;            /* a multi-get's values */
    struct rdzv_fanout *fan;        /* pushes to many connections */
    uint64_t push_mark;             /* push_send's generation */
    LIST_HEAD(, job) jobs;
    uint32_t njobs;
    uint64_t last_hb_scan_ms;
    LIST_HEAD(, member) probing; /* members with a probe in flight (rdzv_probe.c) */
    uint32_t probe_id;
    uint64_t member_serial; /* the last rdzv_probe.serial given */
    rdzv_metrics m;
    uint8_t readbuf[64 * 1024];
    int readbuf_busy;
    int closing, open_handles;
    struct rdzv_http *http;
    void (*http_close)(rdzv_server *s); /* set by rdzv_server_serve_http */
};

/* ---- the transport (rdzv_server.c), for rdzv_job.c ---- */

/* One push to many connections: frames laid out in data, written by
 * rdzv_fanout, the rest through each connection's queue. */
typedef struct rdzv_push {
    rdzv_fan_item *items;
    conn **conns;
    const char **why; /* a connection to close once every frame is out */
    size_t n, cap;
    rdzv_buf data;
} rdzv_push;

int rdzv__push_init(rdzv_push *p, size_t cap);
/* Adds c with the frame at [off, off + len) of p->data (frames may be shared). */
void rdzv__push_add(rdzv_push *p, conn *c, size_t off, size_t len);
/* Writes every frame and frees p. */
void rdzv__push_send(rdzv_server *s, rdzv_push *p);
void rdzv__send_msg(conn *c, const rdzv_msg *m);
void rdzv__send_error(conn *c, uint32_t req, gpl_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void rdzv__send_simple(conn *c, uint16_t type, uint32_t req);
/* Closes c once the current event is handled (a close can end a round, and
 * the round's decisions are carried out first). */
void rdzv__conn_drop(conn *c, const char *why);
const char *rdzv__peer_of(conn *c);

/* ---- jobs (rdzv_job.c), for the transport ---- */

/* JOIN, ATTACH, KV_*, EVENT, FAIL, STATS and DONE of a connection past its handshake. */
void rdzv__job_request(conn *c, const rdzv_msg *msg);
/* The peer closed c, a node's connection that has carried nothing since the
 * node moved to it (c->move_fresh), while the one the node moved from still
 * stands: the node goes back to that one (its client gave up on c, a spare
 * whose move was answered too late, and kept the old one) and 1 is
 * returned; else 0. */
int rdzv__job_conn_fallback(conn *c, const char *why);
/* c is closing: its waiters, its attachment and its node go. */
void rdzv__job_conn_gone(conn *c, const char *why);
/* The sweep: round deadlines, key waits and, with hb, heartbeats. */
void rdzv__jobs_sweep(rdzv_server *s, uint64_t now, int hb);
/* m answered no probe while its peers waited for it (rdzv_probe.c): its
 * round ends, evidence in the message, and its connection goes. */
void rdzv__job_unresponsive(member *m, const char *evidence, uint64_t now);
/* Survivors of a failed round whose heartbeats stopped are dropped. */
void rdzv__jobs_sweep_survivors(rdzv_server *s, uint64_t now);
void rdzv__jobs_free(rdzv_server *s);

/* Observability (rdzv_http.c, a library of its own so that the launcher's
 * embedded server does not load an HTTP stack). */
/* Renders /metrics and /status into malloc'ed strings (for the HTTP side and tests). */
char *rdzv_render_metrics(rdzv_server *s);
char *rdzv_render_status(rdzv_server *s);
/* only non-NULL: that job alone in "jobs", and a "job_list" line for every job. */
char *rdzv_render_status_of(rdzv_server *s, const char *only);
uint64_t rdzv_member_last_rx_ms(const rdzv_rmember *m);

#endif
