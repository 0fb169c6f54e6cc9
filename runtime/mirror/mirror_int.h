/* What the peer-memory copy room's files share (runtime/mirror/):
 *   mirror.c       the public API: create, register, stage, push, wait,
 *                  status, destroy; the agreement after a loss and the plan
 *                  (which rank holds which old rank's copy, views, fetch)
 *   mirror_net.c   the wire: the server thread each mirror runs (takes
 *                  pushes into held slots, serves fetches), the push sender
 *                  thread and the fetch client
 *
 * A rank's copies: the registered buffers are its own snapshot (the program
 * fills them between gpl_mirror_stage and gpl_mirror_push); each push sends
 * them, with their SHA-256, to its buddy (the same local rank on the next
 * node), which keeps the two newest checked copies of each rank it holds
 * (slots): a copy being received never overwrites the newest complete one,
 * so a failure during a push leaves the previous step whole. */
#ifndef GPULAUNCH_MIRROR_INT_H
#define GPULAUNCH_MIRROR_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "gb_error.h"
#include "gpl_int.h"

#define MIRROR_MAGIC 0x47504d31u  /* "GPM1" */
#define MIRROR_ADDR_MAX 256       /* bytes of a rank's advertised address */
#define MIRROR_SLOTS_MAX 16       /* held copies: 2 per rank held, 8 ranks held at most */
#define MIRROR_HANDLERS_MAX 32    /* connections served at once */
#define MIRROR_PIECE (1u << 20)   /* bytes sent, received or hashed at once */
#define MIRROR_SOCKBUF (4u << 20) /* socket buffers */
#define MIRROR_DIGEST 32          /* SHA-256 */

enum { MIRROR_PUSH = 1, MIRROR_FETCH = 2 };
/* a push's or fetch's answer */
enum { MIRROR_ANS_BAD = 0, MIRROR_ANS_OK = 1, MIRROR_ANS_REFUSED = 2, MIRROR_ANS_NONE = 3 };

/* What a pusher or fetcher says first (then, for a push: nbuf uint64 sizes,
 * the bytes, the digest); a fetch's answer is one too (then the same). */
typedef struct mirror_hdr {
    uint32_t magic, kind; /* kind: MIRROR_PUSH / MIRROR_FETCH; in an answer, MIRROR_ANS_* */
    int32_t round, owner, world, nbuf;
    int64_t step;
    uint64_t total;
} mirror_hdr;

/* One held copy of another rank's buffers. */
typedef struct mirror_slot {
    int used;     /* allocated to an owner */
    int owner;    /* its rank in the world the copies were made in */
    int round;    /* that world's round */
    int64_t step; /* valid: the step it holds */
    int valid;    /* received whole and its SHA-256 matched */
    int writing;  /* a push is being received into it */
    int readers;  /* fetches being served from it */
    int nbuf;
    uint64_t sizes[GPL_MIRROR_MAX_BUFS];
    uint8_t *data;
    size_t cap, total;
    unsigned char digest[MIRROR_DIGEST];
} mirror_slot;

struct gpl_mirror {
    gb_err err;
    uint32_t timeout_ms;
    int rank, world, round, node; /* the world the copies are made in */
    int buddy, buddy_same_node;
    char buddy_addr[MIRROR_ADDR_MAX];
    int buddy_port;
    /* the registered buffers: this rank's own snapshot */
    int nbuf;
    void *bufs[GPL_MIRROR_MAX_BUFS];
    size_t sizes[GPL_MIRROR_MAX_BUFS];
    size_t total;
    int64_t own_step; /* the step the buffers hold; -1: none (or being filled) */
    unsigned char own_digest[MIRROR_DIGEST];
    int own_digest_ok; /* own_digest is that step's (computed by its push) */
    /* the push in flight */
    pthread_t sender;
    int sending; /* sender is to be joined */
    int64_t sending_step;
    atomic_int send_fd; /* its socket (shut down to cancel it) */
    gpl_result_t send_rc;
    gb_err send_err;
    int64_t sent_step; /* the newest step the buddy checked */
    double last_push_s, last_wait_s, rate_mbs;
    /* the server */
    int listen_fd, port, wake_fd;
    pthread_t server;
    int serving;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int handlers; /* connection threads running */
    int handler_fd[MIRROR_HANDLERS_MAX];
    int frozen; /* agreed on: no push taken any more, none in flight */
    int stop;
    mirror_slot slot[MIRROR_SLOTS_MAX];
};

/* mirror_net.c */
gpl_result_t mirror_serve_start(gpl_mirror_t m);
void mirror_serve_stop(gpl_mirror_t m);
/* Starts the sender thread for the registered buffers at m->own_step. */
gpl_result_t mirror_send_start(gpl_mirror_t m);
/* Cancels the push in flight (its socket shut down); the caller joins it. */
void mirror_send_cancel(gpl_mirror_t m);
/* Receives owner's copy at step from addr:port into bufs (sizes must match
 * what the holder has), checking its SHA-256. */
gpl_result_t mirror_fetch_remote(gb_err *e, const char *addr, int port, uint32_t timeout_ms,
                                 int round, int owner, int64_t step, void *const bufs[],
                                 const size_t bytes[], int n);
/* The SHA-256 of n buffers back to back. */
void mirror_hash(void *const bufs[], const size_t sizes[], int n,
                 unsigned char digest[MIRROR_DIGEST]);
/* A listening TCP socket on any port. */
gpl_result_t mirror_listen(gb_err *e, int *fd, int *port);

#endif
