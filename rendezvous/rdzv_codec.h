/* The wire codec of the rendezvous protocol (docs/protocol.md): framing and
 * every message. The server and every client encode and decode through this
 * file and nothing else. */
#ifndef GPULAUNCH_RDZV_CODEC_H
#define GPULAUNCH_RDZV_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "gpulaunch/gpl_error.h"
#include "gpulaunch/rdzv.h"

#define RDZV_MAGIC 0x47504c52u       /* "GPLR" */
#define RDZV_VERSION 2               /* 2: the auth label is hashed without a terminating zero */
#define RDZV_HEADER_LEN 12           /* u32 length, u16 type, u16 flags, u32 req id */
#define RDZV_MAX_KEY 1024            /* bytes of one key */
#define RDZV_MAX_VALUE (1024 * 1024) /* bytes of one value */
#define RDZV_MAX_KEYS 1024           /* keys in one wait or multi-get */
#define RDZV_MAX_FRAME (RDZV_MAX_VALUE + 64 * 1024) /* bytes after the length field */
#define RDZV_MAX_STR 255                            /* hostname, address, run id, reason */
#define RDZV_MAX_MSG 1024                           /* bytes of an error or event message */
#define RDZV_NONCE_LEN 32
#define RDZV_MAC_LEN 32

/* X(name, value) — append-only. */
#define RDZV_TYPES(X)                                                                              \
    X(RDZV_HELLO, 1)                                                                               \
    X(RDZV_CHALLENGE, 2)                                                                           \
    X(RDZV_AUTH, 3)                                                                                \
    X(RDZV_WELCOME, 4)                                                                             \
    X(RDZV_JOIN, 5)                                                                                \
    X(RDZV_ASSIGNED, 6)                                                                            \
    X(RDZV_HEARTBEAT, 7)                                                                           \
    X(RDZV_ATTACH, 8)                                                                              \
    X(RDZV_KV_SET, 9)                                                                              \
    X(RDZV_KV_GET, 10)                                                                             \
    X(RDZV_KV_WAIT, 11)                                                                            \
    X(RDZV_KV_ADD, 12)                                                                             \
    X(RDZV_KV_CAS, 13)                                                                             \
    X(RDZV_KV_DEL, 14)                                                                             \
    X(RDZV_KV_MGET, 15)                                                                            \
    X(RDZV_OK, 16)                                                                                 \
    X(RDZV_ERROR, 17)                                                                              \
    X(RDZV_VALUE, 18)                                                                              \
    X(RDZV_VALUES, 19)                                                                             \
    X(RDZV_INT, 20)                                                                                \
    X(RDZV_ROUND_OVER, 21)                                                                         \
    X(RDZV_WAITING, 22)                                                                            \
    X(RDZV_EVENT, 23)                                                                              \
    X(RDZV_DONE, 24)                                                                               \
    X(RDZV_JOB_DONE, 25)                                                                           \
    X(RDZV_FAIL, 26)                                                                               \
    X(RDZV_PROGRESS, 27)                                                                           \
    X(RDZV_STATS, 28)                                                                              \
    X(RDZV_NODE, 29)                                                                               \
    X(RDZV_PING, 30)                                                                               \
    X(RDZV_PONG, 31)                                                                               \
    X(RDZV_PROBE_REQ, 32)                                                                          \
    X(RDZV_PROBE_ACK, 33)                                                                          \
    X(RDZV_STORY, 34)

enum rdzv_type {
#define RDZV_TYPE_ENUM_(n, v) n = v,
    RDZV_TYPES(RDZV_TYPE_ENUM_)
#undef RDZV_TYPE_ENUM_
        RDZV_TYPE_MAX_
};

/* Why a round ended (RDZV_ROUND_OVER.reason): enum rdzv_reason in gpulaunch/rdzv.h. */
const char *rdzv_reason_name(uint32_t reason);

/* Job events (RDZV_EVENT.kind): enum rdzv_event_kind in gpulaunch/rdzv.h. */

/* A byte string inside a frame (not NUL-terminated; valid while the frame is). */
typedef struct rdzv_bytes {
    const uint8_t *p;
    uint32_t len;
} rdzv_bytes;

/* Flags on RDZV_AUTH. */
#define RDZV_AUTH_QUIET 1u /* no WELCOME: the client pipelines its next request */

/* Flags on RDZV_JOIN. */
#define RDZV_JOIN_RESUME 1u /* re-register an existing assignment after a server restart */
#define RDZV_JOIN_WARM                                                                             \
    2u /* a new node that can start its workers before a running round                             \
        * takes it in (they wait for their first round): the round is not                          \
        * ended for it until it says RDZV_NODE_READY, when every node of                           \
        * the round said RDZV_NODE_LIVE; it hears RDZV_WAITING_WARM */
#define RDZV_JOIN_PROBE                                                                            \
    4u /* this node answers PING with PONG (the same req id) at once: the server may probe         \
        * it when its peers wait for it (docs/protocol.md, suspicion and probes) */
#define RDZV_JOIN_PEER                                                                             \
    8u /* a u16 follows: this node's UDP port for peer probes (answers a PING datagram with a      \
        * PONG) and it probes other nodes on PROBE_REQ */
#define RDZV_JOIN_KERNEL                                                                           \
    16u /* with RDZV_JOIN_PEER: the TCP port of the same number listens (its kernel answers a      \
         * connection while the launcher is stopped), and this node makes kernel probes            \
         * (PROBE_REQ with RDZV_PROBE_KERNEL or RDZV_PROBE_MACHINE) */
#define RDZV_JOIN_AGAIN                                                                            \
    32u /* this launcher's earlier JOIN for a new round went unanswered on a connection it has     \
         * since given up: a pending one of its instance there is stale (docs/protocol.md) */

/* Flags on RDZV_CHALLENGE: what this server takes besides version 2's
 * messages (an older server sends 0; its clients never send these). */
#define RDZV_CHALLENGE_HEALTH 1u /* STATS and FAIL with RDZV_FAIL_HANG */
#define RDZV_CHALLENGE_WARM 2u   /* NODE and JOIN with RDZV_JOIN_WARM */
#define RDZV_CHALLENGE_PROBE                                                                       \
    4u /* HEARTBEAT with RDZV_HEARTBEAT_WAIT, PONG, JOIN with RDZV_JOIN_PROBE */
#define RDZV_CHALLENGE_PEER 8u        /* JOIN with RDZV_JOIN_PEER, PROBE_ACK; it sends PROBE_REQ */
#define RDZV_CHALLENGE_STORY 16u      /* STORY */
#define RDZV_CHALLENGE_STORY_MORE 32u /* STORY with RDZV_STORY_MORE */
#define RDZV_CHALLENGE_MOVE                                                                        \
    64u /* a node may re-register its running round (JOIN with RDZV_JOIN_RESUME) on a second       \
         * connection while its first still stands: it moves to the new one, the round goes on     \
         * (docs/protocol.md, "Moving to a new connection") */
#define RDZV_CHALLENGE_KERNEL                                                                      \
    128u /* JOIN with RDZV_JOIN_KERNEL, PROBE_ACK ok 2 and 3; it sends PROBE_REQ with              \
          * RDZV_PROBE_KERNEL and RDZV_PROBE_MACHINE (docs/protocol.md, rule 8) */

/* A node silent to the server but reached by its peers' probes is kept up
 * to this many heartbeat timeouts of silence (rdzv_probe.h); a client's
 * connection bears unacknowledged data as long (TCP_USER_TIMEOUT) before it
 * gives up on the path, so that neither side drops what the other keeps. */
#define RDZV_KEEP_FACTOR 2

/* RDZV_STORY (node to server, unanswered): how the node's workers began a
 * round and what it cost them (enum rdzv_story_kind, rdzv_client_story in
 * gpulaunch/rdzv.h; docs/protocol.md, "How a round began"). */
#define RDZV_STORY_MORE                                                                            \
    1u /* a u32 and an i32 follow the fields: why a restart was one (enum rdzv_restart_cause)      \
        * and the rank the state was copied from (-1: none); only to a server with                 \
        * RDZV_CHALLENGE_STORY_MORE */

/* Flags on RDZV_NODE (a request without a body; answered OK): what a node's
 * workers can do now. */
/* RDZV_NODE_LIVE and RDZV_NODE_READY: gpulaunch/rdzv.h (rdzv_client_node). */

/* Flags on RDZV_WAITING. */
#define RDZV_WAITING_WARM                                                                          \
    1u /* to a warm joiner alone: every node of the running round                                  \
        * re-forms in place; start the workers, then say READY */

/* Flags on RDZV_HEARTBEAT. */
#define RDZV_HEARTBEAT_WAIT                                                                        \
    1u /* a u32 follows: for how many ms every running worker of this node has                     \
        * waited inside one collective (0: they do not wait now) */

/* RDZV_PING (server to node, pushed; req id: the probe's) and RDZV_PONG (the
 * node's answer, same req id) have no body. The same two frames, alone in a
 * UDP datagram, are a peer probe and its answer (req id: the prober's).
 * RDZV_PROBE_REQ (server to node, pushed; req id: the probe's): probe the
 * node at addr:port over UDP until deadline_ms, then say RDZV_PROBE_ACK
 * (same req id): ok 1 with the round trip at the first answer, ok 0 at the
 * deadline without one. With RDZV_PROBE_KERNEL the prober also connects to
 * the node's TCP port of that number: ok 2 when only that connection
 * completed (the machine lives, its launcher did not answer); with
 * RDZV_PROBE_MACHINE it only connects (a machine check: ok 2 at the first
 * connection). ok 3: the prober could not probe (out of descriptors, no
 * route from it): no word on the node. */
#define RDZV_PROBE_KERNEL 1u  /* flag on PROBE_REQ: UDP and a TCP connection */
#define RDZV_PROBE_MACHINE 2u /* flag on PROBE_REQ: a TCP connection only */
enum {
    RDZV_PROBE_OK_NONE = 0,    /* nothing answered by the deadline */
    RDZV_PROBE_OK_NODE = 1,    /* the node's launcher answered (UDP) */
    RDZV_PROBE_OK_MACHINE = 2, /* only its machine did (TCP) */
    RDZV_PROBE_OK_UNABLE = 3   /* the prober could not probe */
};

/* Flags on RDZV_FAIL. */
#define RDZV_FAIL_HANG 1u /* a rank hung: its global rank follows the message */

typedef struct rdzv_msg {
    uint16_t type;
    uint16_t flags;
    uint32_t req_id; /* 0 for pushed messages */
    union {
        struct {
            uint32_t magic;
            uint16_t version;
        } hello;
        struct {
            uint8_t nonce[RDZV_NONCE_LEN];
            uint8_t auth_required;
            uint16_t version;
        } challenge;
        struct {
            uint8_t mac[RDZV_MAC_LEN];
        } auth;
        struct {
            uint64_t server_epoch;
        } welcome;
        struct {
            char run_id[RDZV_MAX_STR + 1];
            char hostname[RDZV_MAX_STR + 1];
            char addr[RDZV_MAX_STR + 1];
            char instance[RDZV_MAX_STR + 1];
            uint16_t master_port; /* port this node reserved for its workers */
            uint32_t nproc, ngpus;
            int32_t static_rank; /* -1: assigned by the server */
            uint32_t min_nodes, max_nodes;
            uint32_t last_call_ms, join_timeout_ms, heartbeat_timeout_ms;
            /* RESUME only: the assignment being re-registered. */
            uint32_t round, node_rank, base_rank, world_size, nnodes;
            uint16_t peer_port; /* with RDZV_JOIN_PEER only */
        } join;
        struct {
            uint32_t round, node_rank, nnodes, base_rank, world_size;
            uint16_t master_port;
            char master_addr[RDZV_MAX_STR + 1];
        } assigned;
        struct {
            char run_id[RDZV_MAX_STR + 1];
            uint32_t round;
        } attach;
        struct {
            rdzv_bytes key, value;
        } kv_set;
        struct {
            rdzv_bytes key;
        } kv_key; /* KV_GET, KV_DEL */
        struct {
            uint32_t timeout_ms;
            uint32_t nkeys;
            rdzv_bytes keys; /* nkeys length-prefixed keys; walk with rdzv_list_next */
        } kv_keys;           /* KV_WAIT, KV_MGET */
        struct {
            rdzv_bytes key;
            int64_t delta;
        } kv_add;
        struct {
            rdzv_bytes key, expected, desired;
            uint8_t expect_absent;
        } kv_cas;
        struct {
            uint32_t code; /* gpl_result_t */
            char message[RDZV_MAX_MSG + 1];
        } error;
        struct {
            uint8_t found;
            rdzv_bytes value;
        } value;
        struct {
            uint32_t count;
            rdzv_bytes items; /* count entries: u8 found, then a length-prefixed value */
        } values;
        struct {
            int64_t value;
            uint8_t ok;
        } int_;
        struct {
            uint32_t round, reason, node_rank;
            char hostname[RDZV_MAX_STR + 1];
            char message[RDZV_MAX_MSG + 1];
        } round_over;
        struct {
            uint32_t waiting, members;
        } waiting;
        struct {
            uint32_t wait_ms; /* with RDZV_HEARTBEAT_WAIT only */
        } heartbeat;
        struct {
            char addr[RDZV_MAX_STR + 1]; /* numeric: IPv4, IPv6 or IPv4-mapped IPv6 */
            uint16_t port;
            uint32_t deadline_ms;
        } probe_req;
        struct {
            uint8_t ok;
            uint32_t rtt_ms; /* ok only */
        } probe_ack;
        struct {
            uint32_t round, kind;       /* enum rdzv_story_kind */
            uint32_t pause_ms;          /* from the last round's end to the first step; or
                                           RDZV_STORY_UNKNOWN */
            uint32_t redone, nproc;     /* steps done again; the node's workers */
            char why[RDZV_MAX_MSG + 1]; /* a restart's reason ("": none) */
            uint32_t source;            /* enum rdzv_state_source */
            int64_t state_step;
            uint64_t state_bytes;
            uint32_t state_ms;
            uint32_t cause;     /* with RDZV_STORY_MORE: enum rdzv_restart_cause */
            int32_t state_root; /* with RDZV_STORY_MORE: the peer rank copied (-1: none) */
        } story;
        struct {
            uint32_t kind;
            uint32_t round;
            uint64_t deadline_unix_ms;
            char node[RDZV_MAX_STR + 1];
            char reason[RDZV_MAX_MSG + 1];
        } event;
        struct {
            char message[RDZV_MAX_MSG + 1];
            uint32_t rank; /* with RDZV_FAIL_HANG only */
        } fail;
        struct {
            uint32_t joined, expected, waited_ms;
            char missing[RDZV_MAX_MSG + 1];
        } progress;
        struct {
            uint32_t window_ms;
            uint32_t count;   /* entries, at most RDZV_MAX_STATS_RANKS */
            rdzv_bytes ranks; /* count length-prefixed entries; walk with rdzv_stats_next */
        } stats;
    } u;
} rdzv_msg;

/* A growable output buffer with a hard maximum. */
typedef struct rdzv_buf {
    uint8_t *data;
    size_t len, cap, max;
} rdzv_buf;

void rdzv_buf_init(rdzv_buf *b, size_t max);
void rdzv_buf_free(rdzv_buf *b);
/* Drops the first n bytes. */
void rdzv_buf_consume(rdzv_buf *b, size_t n);
gpl_result_t rdzv_buf_append(rdzv_buf *b, const void *p, size_t n);

/* Appends one whole frame for m to b. GPL_ERR_LIMIT when it would exceed
 * RDZV_MAX_FRAME or b's maximum; b is unchanged on error. */
gpl_result_t rdzv_encode(const rdzv_msg *m, rdzv_buf *b);

/* Looks at the start of a byte stream: GPL_OK with *frame_len (header and
 * payload, length field included) when a whole frame is there, GPL_ERR_STATE
 * when more bytes are needed, GPL_ERR_LIMIT when the announced length is over
 * RDZV_MAX_FRAME, GPL_ERR_PROTOCOL when it is under the header. */
gpl_result_t rdzv_frame_peek(const uint8_t *p, size_t n, size_t *frame_len);

/* Decodes one whole frame (as found by rdzv_frame_peek). Byte strings in m
 * point into p. GPL_ERR_PROTOCOL, with a reason in err, for an unknown type,
 * a truncated or overlong payload or a field over its limit. */
gpl_result_t rdzv_decode(const uint8_t *p, size_t n, rdzv_msg *m, char *err, size_t errlen);

/* Walks a list of length-prefixed byte strings (kv_keys.keys). Returns 1 and
 * fills out while items remain, 0 at the end. */
int rdzv_list_next(rdzv_bytes *list, rdzv_bytes *out);
/* Walks RDZV_VALUES items. */
int rdzv_values_next(rdzv_bytes *list, int *found, rdzv_bytes *out);
/* Appends one key (or one VALUES item) to a list being built. */
gpl_result_t rdzv_list_add(rdzv_buf *list, const void *p, uint32_t len);
gpl_result_t rdzv_values_add(rdzv_buf *list, int found, const void *p, uint32_t len);

/* Walks RDZV_STATS entries: 1 and *out filled while entries remain, 0 at the
 * end or at a malformed entry. An entry longer than the fields this codec
 * knows (a newer peer's) is read up to them; one without the checkpoint group
 * (an older peer's) reads ckpt_local_step = ckpt_durable_step = -1 and 0. */
int rdzv_stats_next(rdzv_bytes *list, rdzv_rank_stats *out);
/* Appends one entry to a STATS list being built (the checkpoint group only
 * when it says something: a step >= 0, a stall or a drain). */
gpl_result_t rdzv_stats_add(rdzv_buf *list, const rdzv_rank_stats *r);

const char *rdzv_type_name(uint16_t type);

#endif
