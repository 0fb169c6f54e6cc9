/* Internal state of the rendezvous server, shared by rdzv_server.c (the
 * protocol and the job state machine) and rdzv_http.c (observability). */
#ifndef GPULAUNCH_RDZV_SERVER_INT_H
#define GPULAUNCH_RDZV_SERVER_INT_H

#include <sys/queue.h>

#include "gpulaunch/rdzv.h"
#include "rdzv_codec.h"
#include "rdzv_health.h"

typedef struct conn conn;
typedef struct job job;
typedef struct member member;
typedef struct waiter waiter;
typedef struct kv_entry kv_entry;

enum job_state { JOB_GATHERING = 0, JOB_RUNNING = 1, JOB_DONE = 2 };

struct member {
    job *j;
    conn *c;
    LIST_ENTRY(member) plink; /* job->pending */
    char hostname[RDZV_MAX_STR + 1], addr[RDZV_MAX_STR + 1], instance[RDZV_MAX_STR + 1];
    uint16_t master_port;
    uint32_t nproc, ngpus;
    int32_t static_rank;
    uint32_t join_req;
    uint64_t joined_ms, next_progress_ms;
    uint64_t join_seq; /* arrival order (joined_ms ties within a millisecond) */
    int pending, active, done;
    uint32_t node_rank;
    uint32_t base_rank;     /* its first global rank in the current round */
    int64_t prev_rank;      /* rank in the last round this member was in, -1 none */
    uint32_t awaited_round; /* a survivor of this failed round, not re-joined yet (0: none) */
};

struct kv_entry {
    kv_entry *next;
    uint32_t hash, klen, vlen;
    uint8_t data[]; /* key, then value */
};

struct waiter {
    LIST_ENTRY(waiter) jlink, clink;
    conn *c;
    uint32_t req;
    uint64_t deadline_ms;
    uint32_t nkeys;
    size_t len;
    uint8_t keys[]; /* the request's key list */
};

struct job {
    LIST_ENTRY(job) link;
    struct rdzv_server *s;
    char run_id[RDZV_MAX_STR + 1];
    int state;
    uint32_t round;
    uint32_t min_nodes, max_nodes, last_call_ms, join_timeout_ms, hb_timeout_ms;
    int is_static;
    char first_host[RDZV_MAX_STR + 1];
    /* gathering */
    LIST_HEAD(, member) pending;
    uint32_t npending;
    member **static_slots; /* max_nodes entries in static mode */
    uint64_t min_reached_ms;
    uint64_t pending_due_ms; /* no waiting node is due before this (sweep skips them) */
    /* re-forming after a failure: the round starts once every survivor of
     * round reform_round has re-joined (no last call), or at reform_deadline_ms */
    int reforming;
    uint32_t reform_round, reform_left;
    uint64_t reform_deadline_ms;
    char reform_why[RDZV_MAX_STR + 1]; /* the node whose failure ended that round */
    /* running */
    member **ranks;
    uint32_t nranks, nactive, ndone;
    uint64_t resume_deadline_ms;
    /* key-value store of the current round */
    kv_entry **kv;
    uint32_t kv_buckets, kv_count;
    uint64_t kv_bytes;
    LIST_HEAD(, waiter) waiters;
    LIST_HEAD(, conn) attached;
    uint32_t nmembers_total; /* member structs pointing here */
    rdzv_health *health;     /* stats, stragglers, timeline (rdzv_health.c); NULL: no memory */
};

typedef struct rdzv_metrics {
    uint64_t connections_total, connections_open, joins, rounds, kv_ops, auth_refused,
        protocol_errors, jobs_done;
    uint64_t failures[7]; /* by rdzv_reason */
} rdzv_metrics;

struct rdzv_server {
    uv_loop_t *loop;
    uint64_t join_seq; /* JOINs seen: orders members by arrival */
    rdzv_server_options o;
    char *token;
    uv_tcp_t listener;
    uv_timer_t sweep;
    int port;
    uint64_t epoch;
    LIST_HEAD(, conn) conns;
    TAILQ_HEAD(, conn) handshaking; /* accept order: the handshake deadline sweep */
    rdzv_buf scratch;               /* send_msg's encoding, reused */
    struct rdzv_fanout *fan;        /* pushes to many connections */
    uint64_t push_mark;             /* push_send's generation */
    LIST_HEAD(, job) jobs;
    uint32_t njobs;
    uint64_t last_hb_scan_ms;
    rdzv_metrics m;
    uint8_t readbuf[64 * 1024];
    int readbuf_busy;
    int closing, open_handles;
    struct rdzv_http *http;
    void (*http_close)(rdzv_server *s); /* set by rdzv_server_serve_http */
};

/* Observability (rdzv_http.c, a library of its own so that the launcher's
 * embedded server does not load an HTTP stack). */
/* Renders /metrics and /status into malloc'ed strings (for the HTTP side and tests). */
char *rdzv_render_metrics(rdzv_server *s);
char *rdzv_render_status(rdzv_server *s);
/* only non-NULL: that job alone in "jobs", and a "job_list" line for every job. */
char *rdzv_render_status_of(rdzv_server *s, const char *only);
uint64_t rdzv_member_last_rx_ms(const member *m);

#endif
