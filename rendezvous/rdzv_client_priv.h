/* The asynchronous rendezvous client's state, shared by its three files:
 * rdzv_client.c (handshake, join, heartbeats, pushed messages, the API),
 * rdzv_client_connect.c (connecting, and reconnecting with backoff) and
 * rdzv_client_move.c (moving a running round to a second connection when the
 * first stalls). Not installed. */
#ifndef GPULAUNCH_RDZV_CLIENT_PRIV_H
#define GPULAUNCH_RDZV_CLIENT_PRIV_H

#include <sys/socket.h>
#include <uv.h>

#include "gpulaunch/rdzv.h"
#include "rdzv_codec.h"
#include "rdzv_peer.h"

#define RDZV_CLIENT_MAX_ADDRS 8 /* a host's addresses tried in turn (localhost: ::1, 127.0.0.1) */

/* Moving to a new connection (RDZV_CHALLENGE_MOVE). A connection whose
 * oldest unacknowledged frame has been backing off (retransmission timeouts,
 * TCP_INFO) for RDZV_MOVE_STALL_DIV-th of the heartbeat timeout (at least
 * RDZV_MOVE_STALL_MIN_MS) is stalled in TCP's exponential backoff, which on a
 * slow, lossy link can outlast what the server bears: the client moves its
 * round to a second connection. A new connection needs 2.5 round trips before
 * the server hears its JOIN (8.5 s on a 3.4 s path), so the client keeps one
 * ready, a spare, from the first retransmission timeout it sees in a round
 * until RDZV_SPARE_IDLE_MS pass without one: a move is then one frame on it.
 * A spare not ready within RDZV_KEEP_FACTOR x the heartbeat timeout is given
 * up (the next trouble opens another), unless the move's JOIN went on it (the
 * server may have moved the node there: only the spare's own failure ends
 * it); the old connection is drained until
 * the server closes it, at most as long. One move at a time: the next waits
 * until the server has the last one's JOIN (its answer came, or the server's
 * kernel acknowledged the JOIN's bytes): a connection moved to can stall in
 * its turn before that answer crosses the same slow link. */
#define RDZV_MOVE_STALL_DIV 2 /* also: frames unacknowledged that long + the smoothed RTT */
#define RDZV_MOVE_STALL_MIN_MS 1000
#define RDZV_SPARE_IDLE_MS 300000

/* A node that holds no round (its JOIN on its way or waiting for the round
 * to form) bears a connection's unacknowledged data this long before it
 * gives the connection up (TCP_USER_TIMEOUT; a node in a round bears
 * RDZV_KEEP_FACTOR x the heartbeat timeout, rdzv_codec.h): a new connection
 * whose SYN was lost retransmits from 3 s, so on a slow, lossy link its
 * JOIN can take longer than 10 s to arrive, and one given up on just before
 * it arrived is taken into a round by the server and lost at once. Nothing
 * waits for such a node but the round it would join. */
#define RDZV_PENDING_KEEP_MS 30000

enum cstate { CS_IDLE, CS_CONNECTING, CS_HANDSHAKE, CS_READY, CS_CLOSED };

struct rdzv_client {
    uv_loop_t *loop;
    rdzv_client_options o;
    char host[256];
    char *token;
    rdzv_join_params jp;
    char run_id[RDZV_MAX_STR + 1], hostname[RDZV_MAX_STR + 1], addr[RDZV_MAX_STR + 1],
        instance[RDZV_MAX_STR + 1];
    rdzv_client_callbacks cb;
    uv_tcp_t *tcp; /* a fresh handle per connection attempt */
    uv_connect_t creq;
    uv_timer_t retry, hb, notice;
    char target[80]; /* the address of the last connection attempt */
    struct sockaddr_storage addrs[RDZV_CLIENT_MAX_ADDRS]; /* what the host resolved to */
    int naddrs, next_addr;
    char last_why[300]; /* why the last attempt failed */
    char doing[300];    /* the attempt under way */
    int noticed;        /* the outage was reported */
    uv_getaddrinfo_t gai;
    int state;
    int want_join; /* send JOIN once ready */
    int pending;   /* a JOIN for a new round was sent, its ASSIGNED has not come: the server holds
                      this node for the next round (a new connection asks again) */
    int assigned;  /* holds a running assignment */
    rdzv_assignment a;
    uint32_t join_req, next_req;
    uint64_t down_since_ms; /* first failed attempt of this outage, 0 when up */
    uint32_t backoff_ms;
    rdzv_buf in;
    int closing, handles;
    int failed;
    int server_health; /* the server takes STATS and hang reports (RDZV_CHALLENGE_HEALTH) */
    int server_warm;   /* the server takes NODE and warm joins (RDZV_CHALLENGE_WARM) */
    int server_probe;  /* the server takes waits in heartbeats and probes (RDZV_CHALLENGE_PROBE) */
    int server_kernel; /* ... and kernel probes (RDZV_CHALLENGE_KERNEL) */
    int server_story;  /* the server takes how rounds began (RDZV_CHALLENGE_STORY) */
    int server_story_more; /* ... and its cause and root (RDZV_CHALLENGE_STORY_MORE) */
    uint32_t wait_ms;      /* rdzv_client_waiting's last: said in every heartbeat */
    uint64_t wait_said_ms; /* when a heartbeat last said a wait */
    int stats_warned;
    uint16_t node_flags;     /* the last RDZV_NODE_* said: said again after a reconnect */
    int frozen;              /* rdzv_client_freeze: sends nothing more */
    rdzv_peer *peer;         /* the UDP port for peer probes (rdzv_peer.c); NULL: none */
    int peer_failed;         /* it could not be opened: said once, not tried again */
    int server_move;         /* the server takes a running round on a second connection
                                (RDZV_CHALLENGE_MOVE) */
    uv_tcp_t *mv;            /* the spare connection to move to; NULL none */
    rdzv_buf mv_in;          /* its input until it is the connection */
    uint64_t mv_since_ms;    /* opened then */
    int mv_ready;            /* its WELCOME came: a move is one JOIN on it */
    int mv_go;               /* the move is asked: the JOIN goes as soon as it can */
    uint64_t trouble_ms;     /* the last retransmission timeout seen on the connection; 0 none */
    uint32_t mv_stall_ms;    /* how long the old one had stalled when the move began */
    char mv_tcp[112];        /* TCP_INFO's figures then, for the log */
    uint32_t mv_req;         /* the move's JOIN */
    uint64_t stall_since_ms; /* the connection's oldest frame unacknowledged through a
                                retransmission timeout since about then; 0 none */
    uv_tcp_t *drain;         /* the connection moved from, read until the server closes it */
    rdzv_buf drain_in;
    uint64_t drain_since_ms;
    uint32_t moves;       /* moves done (said in the log) */
    int move_pending;     /* the last move's JOIN is not answered yet: the old connection stays
                             open (its close would reach the server as the node's) */
    int respare;          /* a move was made: a new spare is opened at once */
    uint64_t acked_seen;  /* the connection's bytes acknowledged when last seen */
    uint64_t progress_ms; /* ... and when they last grew, or nothing waited */
    uint64_t tcp_sent, mv_sent;     /* bytes given to the connection's and the spare's sends */
    uint64_t join_end, mv_join_end; /* their bytes up to the end of the move's JOIN sent on
                                       them (0: none): once the server's kernel acknowledged
                                       them, the server has the node there */
};

/* rdzv_client.c */
/* Says msg (to on_error, else the log) and ends the client; once. */
void rdzv__client_fatal(rdzv_client *c, gpl_result_t code, const char *msg);
/* A handle of the client's closed (or a resolve ended): frees it with the last. */
void rdzv__client_unref(rdzv_client *c);
void rdzv__client_close_tcp(rdzv_client *c, uv_tcp_t **t);
/* Encodes m onto t (queued when the socket is full); nothing when frozen. */
void rdzv__client_send_on(rdzv_client *c, uv_tcp_t *t, rdzv_msg *m);
/* HELLO and AUTH on t; 0 when there is no token to answer with (fatal). */
int rdzv__client_answer_challenge(rdzv_client *c, uv_tcp_t *t, const rdzv_msg *m);
/* The JOIN of this node: a RESUME of its round while it holds one. */
void rdzv__client_fill_join(rdzv_client *c, rdzv_msg *m);
uint32_t rdzv__client_hb_timeout_ms(const rdzv_client *c);
/* The read callbacks of every connection of the client. */
void rdzv__client_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
void rdzv__client_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

/* rdzv_client_connect.c */
/* Resolves the host (a numeric address needs no resolver) and connects. */
void rdzv__client_start_connect(rdzv_client *c);
/* An outage begins: said after RDZV_NOTICE_FIRST_MS, then every RDZV_NOTICE_EVERY_MS. */
void rdzv__client_outage_begins(rdzv_client *c, uint64_t now);
/* Closes the connection and gives up a move or a drain (a reconnect re-registers). */
void rdzv__client_drop_conn(rdzv_client *c);
/* The connection failed for why: a retry after a backoff, or fatal at the join timeout. */
void rdzv__client_schedule_retry(rdzv_client *c, const char *why);
/* TCP_NODELAY and the bound on unacknowledged data (TCP_USER_TIMEOUT):
 * again whenever the node gains or loses its round. */
void rdzv__client_tune(rdzv_client *c, uv_tcp_t *t);

/* rdzv_client_move.c */
void rdzv__client_drop_move(rdzv_client *c);
void rdzv__client_drop_drain(rdzv_client *c);
/* The server answered the move: the old connection's sending side is shut down. */
void rdzv__client_move_confirmed(rdzv_client *c);
/* A frame on the connection being opened to move to. */
void rdzv__client_handle_move(rdzv_client *c, const rdzv_msg *m);
/* On every heartbeat: keeps a spare while the connection has trouble, moves
 * from a stalled connection, gives up a spare or a drain that outlasts the
 * server's bound. */
void rdzv__client_check_stall(rdzv_client *c);

#endif
