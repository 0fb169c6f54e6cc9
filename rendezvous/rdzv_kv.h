/* A job's key-value store: the bootstrap store its workers share in a round
 * (torch.distributed's Store: set, get, add, compare-and-set, delete,
 * multi-get, wait), bounded by bytes, and its waiters. No sockets: a request
 * goes in as a decoded message and its reply comes out as one; a waiter is
 * answered through the callback its owner gives. */
#ifndef GPULAUNCH_RDZV_KV_H
#define GPULAUNCH_RDZV_KV_H

#include <stdint.h>
#include <sys/queue.h>

#include "gpulaunch/gpl_error.h"
#include "rdzv_codec.h"

typedef struct rdzv_kv_entry rdzv_kv_entry;
typedef struct rdzv_waiter rdzv_waiter;

/* A KV_WAIT not answered yet, on the store's list and on its owner's (the
 * connection that asked: olink). */
struct rdzv_waiter {
    LIST_ENTRY(rdzv_waiter) klink, olink;
    void *owner;
    uint32_t req;
    uint64_t deadline_ms;
    uint32_t nkeys;
    uint32_t len;
    uint8_t keys[]; /* the request's key list */
};

typedef struct rdzv_kv {
    rdzv_kv_entry **b;
    uint32_t buckets, count;
    uint64_t bytes, max_bytes;
    LIST_HEAD(, rdzv_waiter) waiters;
} rdzv_kv;

void rdzv_kv_init(rdzv_kv *kv, uint64_t max_bytes);
/* Drops every key (a new round starts with an empty store); waiters stay. */
void rdzv_kv_clear(rdzv_kv *kv);

/* Answers a KV_SET, KV_GET, KV_DEL, KV_ADD, KV_CAS or KV_MGET: *reply is the
 * answer (OK, VALUE, VALUES, INT or ERROR with its message); its bytes point
 * into the store or into *scratch, valid until the next change. Returns 1
 * when keys changed (waiters may be ready), else 0. */
int rdzv_kv_request(rdzv_kv *kv, const char *run_id, const rdzv_msg *msg, rdzv_msg *reply,
                    rdzv_buf *scratch);

/* A KV_WAIT: NULL without memory. The caller links olink; the waiter is on
 * the store's list until rdzv_kv_waiter_free. */
rdzv_waiter *rdzv_kv_waiter_new(rdzv_kv *kv, void *owner, const rdzv_msg *msg, uint64_t now);
/* Keys of w not set yet; first: the first of them. */
uint32_t rdzv_kv_missing(const rdzv_kv *kv, const rdzv_waiter *w, rdzv_bytes *first);
/* Unlinks w from the store and its owner, and frees it. */
void rdzv_kv_waiter_free(rdzv_waiter *w);
/* Calls ready for every waiter whose keys are all set; ready frees it. */
void rdzv_kv_wake(rdzv_kv *kv, void (*ready)(rdzv_waiter *w, void *ctx), void *ctx);

#endif
