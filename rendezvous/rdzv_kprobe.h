/* Kernel probes, a node's side (docs/protocol.md, "Suspicion and probes",
 * rule 8): a TCP port of the same number as the node's UDP peer port, which
 * the node's kernel answers (it completes a connection into the listen
 * queue) while the launcher itself is stopped, starved or swapping; and a
 * prober's connection attempts to a suspect's port. A connection completed
 * says the suspect's machine lives although its launcher did not answer; none
 * within the deadline, and no UDP answer either, says the machine is gone (a
 * reclaim, a kernel panic, a cut link). A refusal (RST) is not the machine's
 * answer: a middlebox or another host may send one. Part of the client
 * library, on the client's loop; rdzv_peer.c owns both. */
#ifndef GPULAUNCH_RDZV_KPROBE_H
#define GPULAUNCH_RDZV_KPROBE_H

#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#define RDZV_KPROBE_BACKLOG 128  /* connections the kernel completes while the node is stopped */
#define RDZV_KPROBE_PAUSE_MS 100 /* out of descriptors: the listener looks again after this */
#define RDZV_KPROBE_MAX_TRIES 8  /* connection attempts of one probe (a lost SYN is tried again) */
/* a probe's attempts are spread over its deadline, deadline / 4 apart within these bounds */
#define RDZV_KPROBE_EVERY_MIN_MS 50
#define RDZV_KPROBE_EVERY_MAX_MS 200
#define RDZV_KPROBE_PORT_TRIES 8 /* UDP ports tried when the TCP port of its number is taken */

/* The listener: accepts and closes at once (the completed handshake is the
 * answer). */
typedef struct rdzv_kport rdzv_kport;

/* A TCP socket bound to port on every address (v6: IPv6 and IPv4 on one
 * socket) and listening; -1 with errno set (EADDRINUSE: the number is
 * taken). */
int rdzv__kport_listen(uint16_t port, int v6);
/* Accepts on fd (rdzv__kport_listen's) on loop; takes fd. 0, or a libuv
 * error (fd closed). */
int rdzv__kport_start(uv_loop_t *loop, int fd, rdzv_kport **out);
/* Closes the listener; freed once its handles closed. */
void rdzv__kport_close(rdzv_kport *k);

/* One probe's connection attempts, embedded in the probe (no allocation, no
 * handle: looked at on the prober's tick and once more at the deadline). */
typedef struct rdzv_kconn {
    int fd[RDZV_KPROBE_MAX_TRIES];
    int n;             /* attempts made */
    int connected;     /* one completed: the machine answered */
    int refused;       /* attempts refused (RST): not counted as an answer */
    int unable;        /* an attempt could not be made (no descriptor, no route) */
    uint32_t every_ms; /* between attempts */
    uint64_t next_ms;  /* the next attempt is due */
    struct sockaddr_storage to;
    socklen_t tolen;
} rdzv_kconn;

/* Starts the first attempt to to (len bytes) for a probe of deadline_ms. */
void rdzv__kconn_start(rdzv_kconn *k, const struct sockaddr *to, socklen_t len,
                       uint32_t deadline_ms, uint64_t now);
/* Looks at the attempts in flight and makes the next one when due (within
 * half a tick of slack_ms); returns k->connected. */
int rdzv__kconn_tick(rdzv_kconn *k, uint64_t now, uint32_t slack_ms);
/* Closes every attempt (a completed one is closed with a reset: no TIME_WAIT
 * left behind on the prober). */
void rdzv__kconn_stop(rdzv_kconn *k);

#endif
