/* Live re-formation, the worker's side (see gpulaunch.h): the round block
 * the launcher writes, the communicator re-made in place, and the agreement
 * on whose state the job goes on from, and the copy of that state to the
 * ranks that lack it. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gb_progress.h"
#include "gb_time.h"
#include "gpl_int.h"
#include "gpl_chain.h"

gpl_result_t gpl_reform_enable(void) {
    return gb_progress_set_reform_ok(1) == 0 ? GPL_OK : GPL_ERR_UNSUPPORTED;
}

gpl_result_t gpl_round_wait(uint32_t seq, uint32_t timeout_ms, gpl_round_info *info) {
    gb_progress_round b;
    int r = gb_progress_round_wait(seq, timeout_ms, &b);
    if (r < 0)
        return GPL_ERR_UNSUPPORTED;
    if (r > 0)
        return GPL_ERR_TIMEOUT;
    memset(info, 0, sizeof *info);
    info->seq = atomic_load_explicit(&b.seq, memory_order_relaxed);
    info->state = (gpl_round_state)atomic_load_explicit(&b.state, memory_order_relaxed);
    info->round = (int)b.round;
    info->node_rank = (int)b.node_rank;
    info->nnodes = (int)b.nnodes;
    info->base_rank = (int)b.base_rank;
    info->world_size = (int)b.world_size;
    info->master_port = (int)b.master_port;
    info->restarts = (int)b.restarts;
    memcpy(info->master_addr, b.master_addr, sizeof info->master_addr);
    info->master_addr[sizeof info->master_addr - 1] = '\0';
    memcpy(info->why, b.why, sizeof info->why);
    info->why[sizeof info->why - 1] = '\0';
    return GPL_OK;
}

void gpl_round_ack(int round) { gb_progress_round_ack((uint32_t)round); }

/* The round block's seq when this worker took its first round before it had
 * one (gpl_await_round); 0: it was started in its round. */
static uint32_t first_round_seq;

uint32_t gpl__first_round_seq(void) { return first_round_seq; }

static void setenv_int(const char *name, int v) {
    char b[16];
    snprintf(b, sizeof b, "%d", v);
    setenv(name, b, 1);
}

gpl_result_t gpl_await_round(uint32_t timeout_ms, gpl_round_info *info) {
    gpl_round_info tmp;
    if (info == NULL)
        info = &tmp;
    memset(info, 0, sizeof *info);
    info->round = -1;
    const char *p = getenv("GPULAUNCH_ROUND_PENDING");
    if (p == NULL || strcmp(p, "1") != 0)
        return GPL_OK;
    const char *lr = getenv("GPULAUNCH_LOCAL_RANK");
    if (gb_progress_set_reform_ok(1) != 0) {
        fprintf(stderr,
                "gpulaunch: local rank %s was started before its round, but no round block "
                "hands it one (GPULAUNCH_PROGRESS_SHM is missing or malformed)\n",
                lr ? lr : "?");
        return GPL_ERR_UNSUPPORTED;
    }
    uint64_t deadline = timeout_ms ? gb_now_ms() + timeout_ms : UINT64_MAX;
    uint32_t seen = 0;
    for (;;) {
        uint64_t now = gb_now_ms();
        if (now >= deadline) {
            fprintf(stderr,
                    "gpulaunch: local rank %s: no first round within %.0f s of waiting for it\n",
                    lr ? lr : "?", timeout_ms / 1000.0);
            return GPL_ERR_TIMEOUT;
        }
        uint64_t left = deadline - now;
        gpl_result_t rc = gpl_round_wait(seen, left > 1000 ? 1000 : (uint32_t)left, info);
        if (rc == GPL_ERR_TIMEOUT)
            continue;
        if (rc != GPL_OK)
            return rc;
        seen = info->seq;
        if (info->state == GPL_ROUND_RESTART) {
            fprintf(stderr,
                    "gpulaunch: local rank %s: the launcher gave up this worker before its first "
                    "round (%s); it is started again once its node has a round\n",
                    lr ? lr : "?", info->why);
            return GPL_ERR_ROUND_OVER;
        }
        if (info->state == GPL_ROUND_NEW)
            break;
    }
    long local = lr ? strtol(lr, NULL, 10) : 0;
    if (local < 0 || local >= info->world_size)
        local = 0; /* the launcher's own variable: never so */
    setenv_int("RANK", info->base_rank + (int)local);
    setenv_int("ROLE_RANK", info->base_rank + (int)local);
    setenv_int("GROUP_RANK", info->node_rank);
    setenv_int("WORLD_SIZE", info->world_size);
    setenv_int("ROLE_WORLD_SIZE", info->world_size);
    setenv_int("GROUP_WORLD_SIZE", info->nnodes);
    setenv("MASTER_ADDR", info->master_addr, 1);
    setenv_int("MASTER_PORT", info->master_port);
    setenv_int("GPULAUNCH_ROUND", info->round);
    setenv_int("GPULAUNCH_NODE_RANK", info->node_rank);
    setenv_int("TORCHELASTIC_RESTART_COUNT", info->restarts);
    const gb_progress_round *b = gb_progress_round_block();
    if (b && b->nccl_ifname[0] && getenv("NCCL_SOCKET_IFNAME") == NULL) {
        char ifn[GB_ROUND_IFNAME_MAX];
        memcpy(ifn, b->nccl_ifname, sizeof ifn); /* stable while the round is NEW */
        ifn[sizeof ifn - 1] = '\0';
        setenv("NCCL_SOCKET_IFNAME", ifn, 1);
    }
    unsetenv("GPULAUNCH_ROUND_PENDING");
    first_round_seq = info->seq;
    gb_progress_round_ack((uint32_t)info->round);
    return GPL_OK;
}

int gpl_round(gpl_comm_t c) { return c ? c->round : -1; }

/* Errors after which the next round may still come: the round (or the one
 * being made) ended under us, or its peers went away. */
static int round_may_come(gpl_result_t rc) {
    return rc == GPL_ERR_ROUND_OVER || rc == GPL_ERR_PEER_FAILED || rc == GPL_ERR_TIMEOUT ||
           rc == GPL_ERR_CLOSED || rc == GPL_ERR_SYSTEM || rc == GPL_ERR_NCCL;
}

gpl_result_t gpl_reform(gpl_comm_t c, uint32_t timeout_ms) {
    if (c == NULL || c->backend == GPL_BACKEND_EXTERNAL)
        return GPL_ERR_INVALID_ARG;
    uint64_t deadline = gb_now_ms() + timeout_ms;
    gb_clearerr(&c->err);
    c->coll = "reform";
    for (;;) {
        uint64_t now = gb_now_ms();
        gpl_round_info r;
        gpl_result_t rc = now >= deadline
                              ? GPL_ERR_TIMEOUT
                              : gpl_round_wait(c->round_seq, (uint32_t)(deadline - now), &r);
        if (rc == GPL_ERR_UNSUPPORTED)
            return gb_seterr(&c->err, rc,
                             "rank %d: no launcher hands this worker its next round (not under "
                             "gpulaunch, or its progress channel is off); it is restarted instead",
                             c->rank);
        if (rc == GPL_ERR_TIMEOUT)
            return gb_seterr(&c->err, rc,
                             "rank %d: no next round within %.0f s of round %d's end; the "
                             "launcher restarts the workers",
                             c->rank, timeout_ms / 1000.0, c->round);
        c->round_seq = r.seq;
        if (r.state == GPL_ROUND_RESTART)
            return gb_seterr(&c->err, GPL_ERR_ROUND_OVER,
                             "rank %d: the launcher restarts this worker instead of re-forming "
                             "round %d: %s",
                             c->rank, c->round, r.why);
        if (r.state != GPL_ROUND_NEW || r.round <= c->round)
            continue; /* over: the next one is being formed */
        if (r.world_size < 1 || r.base_rank < 0 || r.base_rank + c->local_world > r.world_size ||
            r.nnodes < 1 || r.node_rank >= r.nnodes)
            return gb_seterr(&c->err, GPL_ERR_PROTOCOL,
                             "rank %d: the launcher handed over round %d with base rank %d of "
                             "world %d (node %d of %d) for %d local ranks",
                             c->rank, r.round, r.base_rank, r.world_size, r.node_rank, r.nnodes,
                             c->local_world);
        gb_progress_coll_begin(); /* waiting for the new peers is a collective */
        gpl_comm_disconnect(c, 1);
        c->round = r.round;
        c->rank = r.base_rank + c->local_rank;
        c->base_rank = r.base_rank;
        c->world = r.world_size;
        c->node_rank = r.node_rank;
        c->nnodes = r.nnodes;
        c->seq = 0;
        c->bar_seq = 0;
        c->round_over_seen_ms = 0;
        c->cma = 0;
        c->coll = "reform";
        rc = gpl_comm_connect(c);
        gb_progress_coll_end();
        if (rc == GPL_OK) {
            c->reforms++;
            gb_progress_round_ack((uint32_t)c->round);
            return GPL_OK;
        }
        if (!round_may_come(rc))
            return rc;
        /* this round ended too while being made: its launcher says what next */
    }
}

gpl_result_t gpl_reform_agree(gpl_comm_t c, int64_t step, gpl_reform_info *info) {
    if (c == NULL || info == NULL)
        return GPL_ERR_INVALID_ARG;
    memset(info, 0, sizeof *info);
    int64_t *all = malloc((size_t)c->world * sizeof *all);
    if (all == NULL)
        return gb_seterr(&c->err, GPL_ERR_NOMEM, "rank %d: out of memory", c->rank);
    int64_t mine = step < 0 ? -1 : step;
    gpl_result_t rc = gpl_allgather(c, &mine, all, 1, GPL_INT64, NULL);
    if (rc == GPL_OK) {
        info->step = -1;
        info->root = -1;
        /* the lowest step any rank with state is at: a rank further on (its
         * last collective completed where another's failed) is set back */
        for (int r = 0; r < c->world; r++)
            if (all[r] >= 0 && (info->step < 0 || all[r] < info->step))
                info->step = all[r];
        for (int r = 0; r < c->world; r++) {
            info->survivors += all[r] >= 0;
            if (info->root < 0 && all[r] >= 0 && all[r] == info->step)
                info->root = r;
            if (info->step >= 0 && all[r] != info->step)
                info->copy = 1;
        }
        info->mine = info->copy && mine != info->step;
    }
    free(all);
    return rc;
}

/* What each rank says before the copy: whether it needs the state and where
 * it listens for it. int32s, for the allgather. */
#define COPY_ADDR_MAX 256
typedef struct copy_rec {
    int32_t mine, port, node, pad;
    char addr[COPY_ADDR_MAX];
} copy_rec;

/* A whole buffer through gpl_broadcast (the framework's, or NCCL's on the
 * device), in the widest element its size allows. */
static gpl_result_t bcast_bytes(gpl_comm_t c, void *buf, size_t bytes, int root) {
    if (bytes % 2 != 0)
        return gb_seterr(&c->err, GPL_ERR_INVALID_ARG,
                         "rank %d: gpl_copy_state: a buffer of %zu bytes goes by %s, which "
                         "copies elements of 2 or 4 bytes; pad it to an even size",
                         c->rank, bytes,
                         c->backend == GPL_BACKEND_EXTERNAL ? "the framework's broadcast"
                                                            : "ncclBroadcast (on the device)");
    if (bytes % 4 == 0)
        return gpl_broadcast(c, buf, bytes / 4, GPL_INT32, root, NULL);
    return gpl_broadcast(c, buf, bytes / 2, GPL_FLOAT16, root, NULL);
}

static int by_broadcast(gpl_comm_t c, const void *buf) {
    return c->backend == GPL_BACKEND_EXTERNAL ||
           (c->backend == GPL_BACKEND_NCCL && gpl_nccl_is_device_ptr(buf));
}

/* The ranks outside the chain wait for its end asleep, in the round's store
 * (the chain's tail sets the key once it has every byte): a collective's
 * wait loop, or a framework's, would take the cores the copy runs on. Short
 * slices: the watchdog hears that the rank waits, and a round that ends
 * fails the wait (the server fails a round's waits at its end). */
#define COPY_DONE_SLICE_MS 200

static gpl_result_t copy_done_wait(gpl_comm_t c, const char *key) {
    uint64_t deadline = gb_now_ms() + c->timeout_ms;
    const char *k[1] = {key};
    for (;;) {
        gpl_result_t rc = rdzv_bclient_wait(c->rdzv, k, 1, COPY_DONE_SLICE_MS);
        if (rc == GPL_OK) {
            void *v = NULL;
            size_t vn = 0;
            rc = rdzv_bclient_get(c->rdzv, key, &v, &vn);
            int ok = rc == GPL_OK && vn == 1 && ((const char *)v)[0] == '1';
            free(v);
            if (ok)
                return GPL_OK;
            return gb_seterr(&c->err, GPL_ERR_PEER_FAILED,
                             "rank %d: the state copy failed on a rank of its chain (its own "
                             "error says why)",
                             c->rank);
        }
        if (rc != GPL_ERR_TIMEOUT)
            return gb_seterr(&c->err, rc, "rank %d: the state copy did not end: %s", c->rank,
                             rdzv_bclient_error(c->rdzv));
        if ((rc = gpl_check_abort(c, deadline, "the state copy's end")) != GPL_OK)
            return rc;
    }
}

gpl_result_t gpl_copy_state(gpl_comm_t c, void *const bufs[], const size_t bytes[], int n,
                            const gpl_reform_info *ri) {
    if (c == NULL || ri == NULL || n < 0 || (n > 0 && (bufs == NULL || bytes == NULL)))
        return GPL_ERR_INVALID_ARG;
    gb_clearerr(&c->err);
    if (!ri->copy || c->world == 1)
        return GPL_OK;
    if (ri->root < 0 || ri->root >= c->world || (ri->root == c->rank && ri->mine))
        return gb_seterr(&c->err, GPL_ERR_INVALID_ARG,
                         "rank %d: gpl_copy_state: info (root %d, mine %d) is not from "
                         "gpl_reform_agree in this world of %d",
                         c->rank, ri->root, ri->mine, c->world);
    for (int i = 0; i < n; i++)
        if (bytes[i] && bufs[i] == NULL)
            return gb_seterr(&c->err, GPL_ERR_INVALID_ARG,
                             "rank %d: gpl_copy_state: buffer %d of %zu bytes is NULL", c->rank, i,
                             bytes[i]);
    gb_progress_coll_begin();
    gpl_result_t rc = GPL_OK;
    copy_rec me = {0}, *all = NULL;
    void **hb = NULL;
    size_t *hn = NULL;
    int lfd = -1, nh = 0, *chain = NULL;
    for (int i = 0; i < n && rc == GPL_OK; i++)
        if (bytes[i] && by_broadcast(c, bufs[i]))
            rc = bcast_bytes(c, bufs[i], bytes[i], ri->root);
    if (rc != GPL_OK || c->backend == GPL_BACKEND_EXTERNAL)
        goto out;
    /* the host buffers: the chain root -> needers in rank order */
    hb = malloc(((size_t)n + 1) * sizeof *hb);
    hn = malloc(((size_t)n + 1) * sizeof *hn);
    all = malloc((size_t)c->world * sizeof *all);
    chain = malloc((size_t)c->world * sizeof *chain);
    if (!hb || !hn || !all || !chain) {
        rc = gb_seterr(&c->err, GPL_ERR_NOMEM, "rank %d: gpl_copy_state: out of memory", c->rank);
        goto out;
    }
    for (int i = 0; i < n; i++)
        if (bytes[i] && !by_broadcast(c, bufs[i])) {
            hb[nh] = bufs[i];
            hn[nh++] = bytes[i];
        }
    if (ri->mine) {
        int port = 0;
        if ((rc = gpl_chain_listen(c, &lfd, &port)) != GPL_OK)
            goto out;
        const char *addr = getenv("GPULAUNCH_NODE_ADDR");
        me.mine = 1;
        me.port = port;
        me.node = c->node_rank;
        snprintf(me.addr, sizeof me.addr, "%s", addr && *addr ? addr : c->hostname);
    }
    rc = gpl_allgather(c, &me, all, sizeof me / sizeof(int32_t), GPL_INT32, NULL);
    c->seq++;
    c->coll = "state copy";
    char done_key[64];
    snprintf(done_key, sizeof done_key, "gpl/copy/%llu", (unsigned long long)c->seq);
    if (rc == GPL_OK && c->rank != ri->root && !ri->mine && c->rdzv)
        rc = copy_done_wait(c, done_key);
    if (rc != GPL_OK || (c->rank != ri->root && !ri->mine))
        goto out;
    int len = 0, pos = -1;
    chain[len++] = ri->root;
    for (int r = 0; r < c->world; r++)
        if (all[r].mine && r != ri->root)
            chain[len++] = r;
    for (int k = 0; k < len; k++)
        if (chain[k] == c->rank)
            pos = k;
    gpl_chain ch = {.bufs = hb, .bytes = hn, .n = nh, .listen_fd = lfd, .prev = -1, .next = -1};
    lfd = -1; /* gpl_chain_copy closes it */
    if (pos > 0)
        ch.prev = chain[pos - 1];
    if (pos >= 0 && pos + 1 < len) {
        const copy_rec *nx = &all[chain[pos + 1]];
        ch.next = chain[pos + 1];
        ch.next_port = nx->port;
        /* the same node: its own stack, whatever the advertised address */
        ch.next_host = nx->node == c->node_rank ? "127.0.0.1" : nx->addr;
        ch.next_local = nx->node == c->node_rank;
        all[chain[pos + 1]].addr[COPY_ADDR_MAX - 1] = '\0';
    }
    rc = gpl_chain_copy(c, &ch, gb_now_ms() + c->timeout_ms);
    /* the tail says the copy ended; a chain rank that failed, that it did
     * not (best effort: a rank that died is the round's end instead); the
     * first word stays, so every waiting rank reads the same */
    if (c->rdzv && rc != GPL_OK)
        (void)rdzv_bclient_cas(c->rdzv, done_key, NULL, 0, "0", 1, NULL);
    else if (c->rdzv && pos == len - 1 &&
             (rc = rdzv_bclient_cas(c->rdzv, done_key, NULL, 0, "1", 1, NULL)) != GPL_OK)
        rc = gb_seterr(&c->err, rc, "rank %d: cannot say the state copy ended: %s", c->rank,
                       rdzv_bclient_error(c->rdzv));
out:
    if (lfd >= 0)
        close(lfd);
    free(hb);
    free(hn);
    free(all);
    free(chain);
    gb_progress_coll_end();
    return rc;
}
