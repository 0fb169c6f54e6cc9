/* gpulaunch rendezvous: the embeddable server and the client library.
 * Prefix rdzv_. The protocol is in docs/protocol.md. */
#ifndef GPULAUNCH_RDZV_H
#define GPULAUNCH_RDZV_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "gpulaunch/gpl_error.h"

#define RDZV_DEFAULT_PORT 29400
#define RDZV_DEFAULT_HEARTBEAT_INTERVAL_MS 1000
#define RDZV_DEFAULT_HEARTBEAT_TIMEOUT_MS 5000
#define RDZV_DEFAULT_LAST_CALL_MS 30000
#define RDZV_DEFAULT_JOIN_TIMEOUT_MS 600000

/* Why a round ended (the reason of a round-over callback). */
enum rdzv_reason {
    RDZV_REASON_DISCONNECT = 1, /* the node's connection dropped */
    RDZV_REASON_HEARTBEAT = 2,  /* the node's heartbeats stopped */
    RDZV_REASON_FAILED = 3,     /* the node reported a failed worker */
    RDZV_REASON_LEFT = 4,       /* the node left */
    RDZV_REASON_SCALE_UP = 5,   /* nodes waiting and room to grow: re-rendezvous */
    RDZV_REASON_HUNG = 6,       /* the node's hang watchdog found a rank hung */
};

/* Job events broadcast to every node and attached worker. */
enum rdzv_event_kind {
    RDZV_EVENT_CHECKPOINT = 1, /* checkpoint now: a node is being preempted */
    RDZV_EVENT_SHUTDOWN = 2,
    /* the server named a straggler, or one recovered (reason: who and why); nodes only */
    RDZV_EVENT_STRAGGLER = 3,
    /* a node's GPU notice (idle alert, XID, lost GPU; docs/gpu-health.md): kept on
     * the job's timeline, nobody is told */
    RDZV_EVENT_GPU = 4
};

/* ---- server ---- */

typedef struct rdzv_server rdzv_server;

#define RDZV_SERVER_OPTIONS_VERSION 2 /* 2: probes; a version-1 struct is taken with probes on */
typedef struct rdzv_server_options {
    uint32_t version;        /* RDZV_SERVER_OPTIONS_VERSION */
    const char *listen_addr; /* default "0.0.0.0" */
    int listen_port;         /* 0: a free port (see rdzv_server_port) */
    const char *token;       /* NULL: no authentication (warned once) */
    size_t token_len;
    uint32_t max_connections;  /* open connections */
    uint32_t max_jobs;         /* jobs held at once */
    uint32_t max_nodes;        /* nodes in one job */
    uint64_t max_job_kv_bytes; /* keys + values of one job */
    uint32_t max_outq_bytes;   /* unsent bytes to one client before it is dropped */
    uint32_t handshake_timeout_ms;
    uint32_t heartbeat_timeout_ms; /* used when a JOIN does not set one */
    /* Stragglers (docs/health.md): a rank whose busy time per step is over
     * threshold x the job's median for `windows` consecutive windows is named.
     * 0: the defaults below. */
    double straggler_threshold;
    uint32_t straggler_windows;
    /* RDZV_PROBES_ON: a vanished or frozen node is probed and found before the
     * heartbeat timeout when its peers wait for it or it falls silent, through
     * its peers too, over UDP and TCP (docs/protocol.md, suspicion and probes);
     * RDZV_PROBES_UDP: the same without kernel probes (TCP); RDZV_PROBES_OFF:
     * the heartbeat timeout alone (version 2) */
    int probes;
} rdzv_server_options;

enum { RDZV_PROBES_OFF = 0, RDZV_PROBES_ON = 1, RDZV_PROBES_UDP = 2 };

#define RDZV_DEFAULT_STRAGGLER_THRESHOLD 1.3
#define RDZV_DEFAULT_STRAGGLER_WINDOWS 2

#define RDZV_SERVER_OPTIONS_INIT                                                                   \
    {                                                                                              \
        RDZV_SERVER_OPTIONS_VERSION, "0.0.0.0", RDZV_DEFAULT_PORT, NULL, 0, 65536, 1024, 65536,    \
            256ull << 20, 8u << 20, 5000, RDZV_DEFAULT_HEARTBEAT_TIMEOUT_MS,                       \
            RDZV_DEFAULT_STRAGGLER_THRESHOLD, RDZV_DEFAULT_STRAGGLER_WINDOWS, 1                    \
    }

/* Starts a server on loop. On failure *out is NULL and err (errlen bytes)
 * says what failed. The process must ignore SIGPIPE (libuv writes with
 * write(2)): a client that went away is then an error, not a crash. */
gpl_result_t rdzv_server_start(uv_loop_t *loop, const rdzv_server_options *opts, rdzv_server **out,
                               char *err, size_t errlen);
int rdzv_server_port(const rdzv_server *s);
/* Serves /metrics, /status and /healthz on addr:port (0: a free port) from
 * the server's loop; closed with the server. In gpulaunch_rdzv_http. */
gpl_result_t rdzv_server_serve_http(rdzv_server *s, const char *addr, int port, char *err,
                                    size_t errlen);
int rdzv_server_http_port(const rdzv_server *s);
/* Closes every handle; the server is freed once the loop has run the close
 * callbacks (run the loop after this). */
void rdzv_server_close(rdzv_server *s);

/* ---- client (async, on a libuv loop) ---- */

typedef struct rdzv_client rdzv_client;

typedef struct rdzv_assignment {
    uint32_t round, node_rank, nnodes, base_rank, world_size;
    uint16_t master_port;
    char master_addr[256];
} rdzv_assignment;

typedef struct rdzv_join_params {
    const char *run_id;
    const char *hostname;
    const char *addr;     /* advertised address of this node */
    const char *instance; /* unique per process start */
    uint16_t master_port; /* port reserved on this node for rank 0's store */
    uint32_t nproc, ngpus;
    int32_t static_rank; /* -1 in elastic mode */
    uint32_t min_nodes, max_nodes;
    uint32_t last_call_ms, join_timeout_ms, heartbeat_interval_ms, heartbeat_timeout_ms;
    int warm; /* this node can start its workers before a running round takes it in (they
                 wait for their first round): joins say so (docs/protocol.md, warm join) */
} rdzv_join_params;

typedef struct rdzv_client_callbacks {
    void *data;
    void (*on_assigned)(rdzv_client *c, const rdzv_assignment *a);
    /* The round ended: node_rank/hostname name the node that caused it. */
    void (*on_round_over)(rdzv_client *c, uint32_t round, uint32_t reason, uint32_t node_rank,
                          const char *hostname, const char *message);
    void (*on_waiting)(rdzv_client *c, uint32_t waiting, uint32_t members);
    void (*on_progress)(rdzv_client *c, uint32_t joined, uint32_t expected, uint32_t waited_ms,
                        const char *missing);
    void (*on_event)(rdzv_client *c, uint32_t kind, uint64_t deadline_unix_ms, const char *node,
                     const char *reason);
    void (*on_job_done)(rdzv_client *c);
    /* A fatal error (join refused or timed out, auth refused, server gone
     * past the retry budget). The client stays usable only for close. */
    void (*on_error)(rdzv_client *c, gpl_result_t code, const char *message);
    /* A warm join is held: every node of the running round re-forms in
     * place. Start the workers (they wait for their first round), then say
     * rdzv_client_node(RDZV_NODE_READY): the round ends to take this node in. */
    void (*on_warm)(rdzv_client *c, uint32_t waiting, uint32_t members);
} rdzv_client_callbacks;

typedef struct rdzv_client_options {
    const char *host;
    int port;
    const char *token;
    size_t token_len;
    uint32_t connect_timeout_ms; /* total retry budget for (re)connecting */
} rdzv_client_options;

gpl_result_t rdzv_client_start(uv_loop_t *loop, const rdzv_client_options *o,
                               const rdzv_join_params *jp, const rdzv_client_callbacks *cb,
                               rdzv_client **out, char *err, size_t errlen);
void *rdzv_client_data(rdzv_client *c);
/* Joins the next round (after on_round_over, or to restart); a JOIN already
 * waiting for the next round stands (no second one is sent). */
void rdzv_client_rejoin(rdzv_client *c);
/* The port this node offers for rank 0's store from its next JOIN on (a
 * re-formed round's store must not take the port of the last one, which its
 * process may still hold). */
void rdzv_client_set_master_port(rdzv_client *c, uint16_t port);
/* Tells the server a local worker failed: the round ends for everyone. */
void rdzv_client_fail(rdzv_client *c, const char *message);
/* Tells the server every local worker finished. */
void rdzv_client_done(rdzv_client *c);
/* Broadcasts a job event to every node of the job. */
void rdzv_client_event(rdzv_client *c, uint32_t kind, uint64_t deadline_unix_ms,
                       const char *reason);

/* One local rank's progress over the last window (docs/health.md). */
typedef struct rdzv_rank_stats {
    uint32_t rank, local_rank;
    uint64_t step;              /* last step reported; 0: none yet */
    uint32_t steps;             /* steps completed in this window */
    uint32_t step_time_us;      /* mean step time over the window; 0: no step completed */
    uint32_t wait_us;           /* mean time per step this rank waited in collectives for the
                                   last rank to arrive; UINT32_MAX: not known */
    uint32_t since_progress_ms; /* since this rank's last report */
    char gpu[64];               /* its GPU binding (CUDA_VISIBLE_DEVICES), "" without */
    /* its checkpoints (docs/checkpoints.md), optional on the wire: an older
     * launcher's entry, or a rank without checkpoints, reads -1, -1, 0, 0 */
    int64_t ckpt_local_step;   /* newest step of its files in its local tier; -1: none */
    int64_t ckpt_durable_step; /* newest step every rank's files are durable; -1: none */
    uint32_t ckpt_stall_ms;    /* what its last save stopped training for */
    uint64_t ckpt_drain_left;  /* bytes of its drain to the durable tier still in flight */
} rdzv_rank_stats;
/* An entry that says nothing yet: wait unknown, no checkpoint. */
#define RDZV_RANK_STATS_INIT                                                                       \
    { .wait_us = UINT32_MAX, .ckpt_local_step = -1, .ckpt_durable_step = -1 }
#define RDZV_MAX_STATS_RANKS 4096 /* ranks in one STATS message */
/* This node's per-rank summaries of the last window_ms (a launcher sends one
 * every few seconds while its workers run). Dropped (no error) when the
 * server predates STATS or the node holds no round; n over
 * RDZV_MAX_STATS_RANKS is cut to it. */
void rdzv_client_stats(rdzv_client *c, uint32_t window_ms, const rdzv_rank_stats *ranks,
                       uint32_t n);
/* How this node's workers began a round (a launcher says it once they took
 * their first step in it) and what it cost them; the server keeps it with
 * the round (its job page, /status, /metrics). Dropped (no error) when the
 * server predates it. */
enum rdzv_story_kind {
    RDZV_STORY_FIRST = 0,    /* started for the node's first round */
    RDZV_STORY_IN_PLACE = 1, /* kept through the round's change (live re-formation) */
    RDZV_STORY_RESTART = 2,  /* stopped and started again (why says why) */
    RDZV_STORY_WARM = 3,     /* started before the round, then took it (a warm join) */
    RDZV_STORY_KINDS = 4
};
#define RDZV_STORY_UNKNOWN UINT32_MAX /* pause_ms: no step was seen */
enum rdzv_state_source {
    RDZV_STATE_NONE = 0,      /* not said (kept in memory, or a program that does not say) */
    RDZV_STATE_PEER = 1,      /* copied from a peer rank's memory */
    RDZV_STATE_CHECKPOINT = 2 /* read from a checkpoint */
};
/* Why a round began with a restart instead of in place (a fallback). */
enum rdzv_restart_cause {
    RDZV_CAUSE_NONE = 0,          /* not a restart, or not said (an older launcher) */
    RDZV_CAUSE_WORKER_FAILED = 1, /* a local worker exited with an error or was killed */
    RDZV_CAUSE_HANG = 2,          /* the watchdog found a local rank hung */
    RDZV_CAUSE_REFORM_FAILED = 3, /* a re-formation in place began and could not finish */
    RDZV_CAUSE_NOT_LIVE = 4,      /* the workers do not re-form in place (the program) */
    RDZV_CAUSE_STOPPING = 5,      /* the round ended while the workers were stopping or one had
                                     exited (a stop, a preemption, a failure just before) */
    RDZV_CAUSES = 6
};
/* "worker_failed", "hang", "reform_failed", "not_live", "stopping";
 * "unknown" for RDZV_CAUSE_NONE (not said) and anything else. */
const char *rdzv_restart_cause_name(uint32_t cause);
typedef struct rdzv_story {
    uint32_t round, kind;
    uint32_t pause_ms;    /* from the last round's end to the first step in this one
                             (first round, warm join: from the round's start) */
    uint32_t redone;      /* steps done again */
    uint32_t nproc;       /* the node's workers (the pause costs each of them) */
    const char *why;      /* a restart's reason, or NULL */
    uint32_t source;      /* where its new ranks' state came from: enum rdzv_state_source */
    int64_t state_step;   /* the step of that state (-1: none) */
    uint64_t state_bytes; /* bytes copied or read, the node's workers summed */
    uint32_t state_ms;    /* the longest a worker took */
    uint32_t cause;       /* a restart's enum rdzv_restart_cause (sent to servers that take it) */
    int32_t state_root;   /* source RDZV_STATE_PEER: the rank it was copied from (-1: not said) */
} rdzv_story;
/* Nothing said: no step seen, no state, no cause, no peer. */
#define RDZV_STORY_INIT                                                                            \
    { .pause_ms = RDZV_STORY_UNKNOWN, .state_step = -1, .state_root = -1 }
void rdzv_client_story(rdzv_client *c, const rdzv_story *story);
/* A local rank hung: ends the round as rdzv_client_fail does, recorded as a
 * hang of that rank (a server that predates hangs gets a plain FAIL). */
void rdzv_client_hang(rdzv_client *c, uint32_t rank, const char *message);
/* What this node's workers can do now, RDZV_NODE_LIVE (its running workers
 * re-form in place) and RDZV_NODE_READY (a held warm joiner's workers wait
 * for their round): sent when it changes, and again after a reconnect;
 * never to a server that predates it. */
#define RDZV_NODE_LIVE 1u
#define RDZV_NODE_READY 2u
void rdzv_client_node(rdzv_client *c, uint16_t flags);
/* This node's running workers have all waited inside one collective for
 * wait_ms (0: they do not wait now). A wait that begins or ends is sent at
 * once, one that goes on every 250 ms (call this as often), and every
 * heartbeat carries the latest: the server suspects the
 * nodes its peers wait for and probes them (docs/protocol.md, suspicion and
 * probes). Not sent to a server that predates it. */
void rdzv_client_waiting(rdzv_client *c, uint32_t wait_ms);
/* Whether this node's joins are warm (asked for, and the server takes them). */
int rdzv_client_warm(const rdzv_client *c);
/* Whether the client holds a connection to the server now (not reconnecting). */
int rdzv_client_connected(const rdzv_client *c);
void rdzv_client_close(rdzv_client *c);

/* ---- blocking client (runtime, tools, tests) ---- */

typedef struct rdzv_bclient rdzv_bclient;

/* Connects with retry (exponential backoff with jitter) until timeout_ms. */
gpl_result_t rdzv_bclient_connect(const char *host, int port, const char *token, size_t token_len,
                                  uint32_t timeout_ms, rdzv_bclient **out, char *err,
                                  size_t errlen);
void rdzv_bclient_close(rdzv_bclient *c);
const char *rdzv_bclient_error(const rdzv_bclient *c);
int rdzv_bclient_fd(const rdzv_bclient *c);

/* Scopes the key-value operations to (run_id, round) and subscribes the
 * connection to that round's pushes. */
gpl_result_t rdzv_bclient_attach(rdzv_bclient *c, const char *run_id, uint32_t round);
gpl_result_t rdzv_bclient_set(rdzv_bclient *c, const char *key, const void *v, size_t n);
/* *out is malloc'ed (free it); GPL_ERR_NOT_FOUND when the key is absent. */
gpl_result_t rdzv_bclient_get(rdzv_bclient *c, const char *key, void **out, size_t *n);
gpl_result_t rdzv_bclient_wait(rdzv_bclient *c, const char *const *keys, size_t nkeys,
                               uint32_t timeout_ms);
gpl_result_t rdzv_bclient_add(rdzv_bclient *c, const char *key, int64_t delta, int64_t *out);
/* expected NULL: set only when absent. *swapped tells whether it was set. */
gpl_result_t rdzv_bclient_cas(rdzv_bclient *c, const char *key, const void *expected, size_t en,
                              const void *desired, size_t dn, int *swapped);
gpl_result_t rdzv_bclient_del(rdzv_bclient *c, const char *key);
/* vals[i]/lens[i] malloc'ed, NULL when absent. */
gpl_result_t rdzv_bclient_mget(rdzv_bclient *c, const char *const *keys, size_t nkeys, void **vals,
                               size_t *lens);

/* Pushed state seen on this connection so far (read by rdzv_bclient_poll
 * and while waiting for replies). */
typedef struct rdzv_push_state {
    int round_over;
    uint32_t round, reason, node_rank;
    char hostname[256];
    char message[1025];
    int checkpoint_requested;
    uint32_t checkpoint_seq; /* checkpoint events seen: one more each */
    uint64_t checkpoint_deadline_unix_ms;
    char checkpoint_reason[1025];
    int shutdown;
} rdzv_push_state;
/* Reads pushed messages for up to timeout_ms (0: only what is there). */
gpl_result_t rdzv_bclient_poll(rdzv_bclient *c, uint32_t timeout_ms);
const rdzv_push_state *rdzv_bclient_pushes(const rdzv_bclient *c);

#define RDZV_MAX_TOKEN 4096 /* bytes of a token file */

/* Loads the shared token from file (trailing newlines dropped) or, when file
 * is NULL, from GPULAUNCH_RDZV_TOKEN. *tok is malloc'ed, NULL when there is
 * none. */
gpl_result_t rdzv_load_token(const char *file, char **tok, size_t *len, char *err, size_t errlen);

/* Parses "host:port", "[v6]:port" or "host" (default_port). Port 0 is
 * accepted (a free port, for listeners). */
gpl_result_t rdzv_parse_endpoint(const char *s, int default_port, char *host, size_t hostlen,
                                 int *port);

#endif
