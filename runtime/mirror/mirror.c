/* Copies of sharded state in peers' memory: the public API (gpulaunch.h,
 * gpl_mirror_*) and the agreement after a loss (see mirror_int.h). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gb_time.h"
#include "mirror_int.h"

/* What each rank of the new world says in gpl_mirror_agree (int32s, for
 * the allgather). */
#define MIRROR_REC_HELD MIRROR_SLOTS_MAX
typedef struct mirror_rec {
    int32_t has, round, world, rank; /* has: a mirror; its world and rank there */
    int32_t port, node, nheld, pad;
    int64_t own_step;
    struct {
        int32_t owner, round;
        int64_t step;
    } held[MIRROR_REC_HELD];
    char addr[MIRROR_ADDR_MAX];
} mirror_rec;

struct gpl_mirror_plan {
    gpl_comm_t comm;
    gpl_mirror_t m;
    int64_t step;
    int world, round; /* the old world's */
    int me, my_node;
    int *holder;      /* old rank -> new rank */
    mirror_rec *recs; /* the new world's */
};

static const char *advertised(gpl_comm_t c) {
    const char *a = getenv("GPULAUNCH_NODE_ADDR");
    return a && *a ? a : c->hostname;
}

gpl_result_t gpl_mirror_create(gpl_comm_t c, const gpl_mirror_options *opts, gpl_mirror_t *out) {
    if (c == NULL || out == NULL)
        return GPL_ERR_INVALID_ARG;
    *out = NULL;
    gb_clearerr(&c->err);
    if (opts && opts->version != GPL_MIRROR_OPTIONS_VERSION)
        return gb_seterr(&c->err, GPL_ERR_INVALID_ARG,
                         "gpl_mirror_create: options version %d; this library reads version %d "
                         "(start from GPL_MIRROR_OPTIONS_INIT)",
                         opts->version, GPL_MIRROR_OPTIONS_VERSION);
    gpl_result_t rc = GPL_OK;
    mirror_rec *all = NULL, me;
    gpl_mirror_t m = calloc(1, sizeof *m);
    if (!m)
        return GPL_ERR_NOMEM;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    atomic_init(&m->send_fd, -1);
    m->listen_fd = m->wake_fd = -1;
    m->timeout_ms = opts && opts->timeout_ms ? opts->timeout_ms : c->timeout_ms;
    m->rank = c->rank;
    m->world = c->world;
    m->round = c->round;
    m->node = c->node_rank;
    m->own_step = m->sent_step = -1;
    m->buddy = -1;
    GB_CHECK_GOTO(mirror_listen(&c->err, &m->listen_fd, &m->port), rc, out);
    GB_CHECK_GOTO(mirror_serve_start(m), rc, out);
    memset(&me, 0, sizeof me);
    me.port = m->port;
    me.node = c->node_rank;
    snprintf(me.addr, sizeof me.addr, "%s", advertised(c));
    all = calloc((size_t)c->world, sizeof *all);
    if (!all) {
        rc = GPL_ERR_NOMEM;
        goto out;
    }
    GB_CHECK_GOTO(gpl_allgather(c, &me, all, sizeof me / sizeof(int32_t), GPL_INT32, NULL), rc,
                  out);
    if (c->world > 1) {
        /* the same local rank on the next node: another failure domain */
        if (c->nnodes > 1 && c->node_base && c->node_size) {
            int nn = (c->node_rank + 1) % c->nnodes;
            m->buddy = c->node_base[nn] + c->local_rank % c->node_size[nn];
        } else
            m->buddy = (c->rank + 1) % c->world;
        const mirror_rec *b = &all[m->buddy];
        snprintf(m->buddy_addr, sizeof m->buddy_addr, "%s",
                 b->node == c->node_rank ? "127.0.0.1" : b->addr);
        m->buddy_addr[sizeof m->buddy_addr - 1] = '\0';
        m->buddy_port = b->port;
        m->buddy_same_node = b->node == c->node_rank;
    }
out:
    free(all);
    if (rc != GPL_OK) {
        gpl_mirror_destroy(m);
        return rc;
    }
    *out = m;
    return GPL_OK;
}

gpl_result_t gpl_mirror_register(gpl_mirror_t m, void *buf, size_t bytes) {
    if (m == NULL || (buf == NULL && bytes > 0))
        return GPL_ERR_INVALID_ARG;
    gb_clearerr(&m->err);
    if (m->own_step >= 0 || m->sending)
        return gb_seterr(&m->err, GPL_ERR_STATE,
                         "gpl_mirror_register: rank %d: buffers are registered before the first "
                         "push",
                         m->rank);
    if (m->nbuf >= GPL_MIRROR_MAX_BUFS)
        return gb_seterr(
            &m->err, GPL_ERR_LIMIT,
            "gpl_mirror_register: rank %d: more than %d buffers (GPL_MIRROR_MAX_BUFS); "
            "register one buffer holding several tensors",
            m->rank, GPL_MIRROR_MAX_BUFS);
    m->bufs[m->nbuf] = buf;
    m->sizes[m->nbuf++] = bytes;
    m->total += bytes;
    return GPL_OK;
}

/* Joins the push in flight; its result. */
static gpl_result_t join_sender(gpl_mirror_t m) {
    if (!m->sending)
        return GPL_OK;
    pthread_join(m->sender, NULL);
    m->sending = 0;
    if (m->send_rc != GPL_OK) {
        gb_clearerr(&m->err);
        gb_seterr(&m->err, m->send_rc, "%s", gb_errmsg(&m->send_err));
    }
    return m->send_rc;
}

gpl_result_t gpl_mirror_wait(gpl_mirror_t m) {
    if (m == NULL)
        return GPL_ERR_INVALID_ARG;
    gb_clearerr(&m->err);
    return join_sender(m);
}

gpl_result_t gpl_mirror_stage(gpl_mirror_t m) {
    if (m == NULL)
        return GPL_ERR_INVALID_ARG;
    gb_clearerr(&m->err);
    uint64_t t0 = gb_now_ms();
    int was = m->sending;
    /* a failed push is said by wait; staging goes on (the buddy holds the
     * step before, and the next push tries again) */
    join_sender(m);
    gb_clearerr(&m->err);
    pthread_mutex_lock(&m->mu);
    if (m->frozen) {
        pthread_mutex_unlock(&m->mu);
        return gb_seterr(&m->err, GPL_ERR_STATE,
                         "gpl_mirror_stage: rank %d: this mirror was agreed on after a loss; "
                         "create one for the new world",
                         m->rank);
    }
    m->own_step = -1;
    m->own_digest_ok = 0;
    m->last_wait_s = was ? (double)(gb_now_ms() - t0) / 1000.0 : 0.0;
    pthread_mutex_unlock(&m->mu);
    return GPL_OK;
}

gpl_result_t gpl_mirror_push(gpl_mirror_t m, int64_t step) {
    if (m == NULL || step < 0)
        return GPL_ERR_INVALID_ARG;
    gb_clearerr(&m->err);
    if (m->sending)
        return gb_seterr(&m->err, GPL_ERR_STATE,
                         "gpl_mirror_push: rank %d: a push is in flight; call gpl_mirror_stage, "
                         "fill the buffers, then push",
                         m->rank);
    pthread_mutex_lock(&m->mu);
    int frozen = m->frozen;
    if (!frozen)
        m->own_step = step;
    pthread_mutex_unlock(&m->mu);
    if (frozen)
        return gb_seterr(&m->err, GPL_ERR_STATE,
                         "gpl_mirror_push: rank %d: this mirror was agreed on after a loss",
                         m->rank);
    if (m->buddy < 0)
        return GPL_OK;
    return mirror_send_start(m);
}

gpl_result_t gpl_mirror_status_get(gpl_mirror_t m, gpl_mirror_status *st) {
    if (m == NULL || st == NULL)
        return GPL_ERR_INVALID_ARG;
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&m->mu);
    st->rank = m->rank;
    st->world = m->world;
    st->round = m->round;
    st->buddy = m->buddy;
    st->buddy_same_node = m->buddy_same_node;
    st->own_step = m->own_step;
    st->sent_step = m->sent_step;
    st->in_flight = m->sending;
    st->bytes = m->total;
    int owners[MIRROR_SLOTS_MAX] = {0}, no = 0;
    for (int i = 0; i < MIRROR_SLOTS_MAX; i++) {
        const mirror_slot *s = &m->slot[i];
        if (!s->used)
            continue;
        st->held_bytes += s->cap;
        int seen = 0;
        for (int k = 0; k < no; k++)
            seen |= owners[k] == s->owner;
        if (!seen)
            owners[no++] = s->owner;
    }
    st->held_ranks = no;
    st->last_push_s = m->last_push_s;
    st->last_rate_mbs = m->rate_mbs;
    st->last_wait_s = m->last_wait_s;
    pthread_mutex_unlock(&m->mu);
    return GPL_OK;
}

const char *gpl_mirror_last_error(gpl_mirror_t m) {
    return m ? gb_errmsg(&m->err) : "gpl_mirror_last_error: no mirror";
}

void gpl_mirror_destroy(gpl_mirror_t m) {
    if (m == NULL)
        return;
    mirror_send_cancel(m);
    join_sender(m);
    mirror_serve_stop(m);
    if (m->listen_fd >= 0)
        close(m->listen_fd);
    for (int i = 0; i < MIRROR_SLOTS_MAX; i++)
        free(m->slot[i].data);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m);
}

/* ---- after a loss ---- */

/* No more pushes into m, none in flight from it: what it holds is fixed. */
static void freeze(gpl_mirror_t m) {
    pthread_mutex_lock(&m->mu);
    m->frozen = 1;
    pthread_mutex_unlock(&m->mu);
    mirror_send_cancel(m);
    join_sender(m);
    /* this rank's snapshot whose push was cut off: its digest, for fetches */
    if (m->own_step >= 0 && !m->own_digest_ok) {
        mirror_hash(m->bufs, m->sizes, m->nbuf, m->own_digest);
        m->own_digest_ok = 1;
    }
    pthread_mutex_lock(&m->mu);
    for (;;) { /* a push being received sees frozen and ends (take_push signals cv) */
        int writing = 0;
        for (int i = 0; i < MIRROR_SLOTS_MAX; i++)
            writing |= m->slot[i].used && m->slot[i].writing;
        if (!writing)
            break;
        pthread_cond_wait(&m->cv, &m->mu);
    }
    pthread_mutex_unlock(&m->mu);
}

/* Fills holder[o] (o < world) with the new rank holding old rank o's copy
 * of step in round: the rank that was it, else the lowest holding its
 * buddy's copy; -1: none. One pass over the records. Returns how many old
 * ranks have none. */
static int holders_at(const mirror_rec *recs, int n, int round, int world, int64_t step,
                      int *holder) {
    for (int o = 0; o < world; o++)
        holder[o] = -1;
    for (int r = 0; r < n; r++) { /* first the owners themselves */
        const mirror_rec *x = &recs[r];
        if (x->has && x->round == round && x->own_step == step && x->rank >= 0 && x->rank < world &&
            holder[x->rank] < 0)
            holder[x->rank] = r;
    }
    for (int r = 0; r < n; r++) /* then the buddies, the lowest rank first */
        for (int k = 0; recs[r].has && k < recs[r].nheld; k++) {
            int o = recs[r].held[k].owner;
            if (recs[r].held[k].round == round && recs[r].held[k].step == step && o >= 0 &&
                o < world && holder[o] < 0)
                holder[o] = r;
        }
    int missing = 0;
    for (int o = 0; o < world; o++)
        missing += holder[o] < 0;
    return missing;
}

gpl_result_t gpl_mirror_agree(gpl_comm_t c, gpl_mirror_t m, gpl_mirror_plan_t *out) {
    if (c == NULL || out == NULL)
        return GPL_ERR_INVALID_ARG;
    *out = NULL;
    gb_clearerr(&c->err);
    gpl_result_t rc = GPL_OK;
    gpl_mirror_plan_t p = calloc(1, sizeof *p);
    mirror_rec me;
    memset(&me, 0, sizeof me);
    if (!p)
        return GPL_ERR_NOMEM;
    p->comm = c;
    p->m = m;
    p->step = -1;
    p->me = c->rank;
    p->my_node = c->node_rank;
    if (m) {
        freeze(m);
        pthread_mutex_lock(&m->mu);
        me.has = 1;
        me.round = m->round;
        me.world = m->world;
        me.rank = m->rank;
        me.port = m->port;
        me.own_step = m->own_step;
        for (int i = 0; i < MIRROR_SLOTS_MAX && me.nheld < MIRROR_REC_HELD; i++)
            if (m->slot[i].used && m->slot[i].valid) {
                me.held[me.nheld].owner = m->slot[i].owner;
                me.held[me.nheld].round = m->slot[i].round;
                me.held[me.nheld++].step = m->slot[i].step;
            }
        pthread_mutex_unlock(&m->mu);
    }
    me.node = c->node_rank;
    snprintf(me.addr, sizeof me.addr, "%s", advertised(c));
    p->recs = calloc((size_t)c->world, sizeof *p->recs);
    if (!p->recs) {
        rc = GPL_ERR_NOMEM;
        goto out;
    }
    GB_CHECK_GOTO(gpl_allgather(c, &me, p->recs, sizeof me / sizeof(int32_t), GPL_INT32, NULL), rc,
                  out);
    /* the newest old world any rank made copies in */
    int round = -1, world = 0;
    for (int r = 0; r < c->world; r++)
        if (p->recs[r].has && p->recs[r].round > round) {
            round = p->recs[r].round;
            world = p->recs[r].world;
        }
    if (round < 0 || world <= 0) {
        rc = gb_seterr(&c->err, GPL_ERR_STATE,
                       "gpl_mirror_agree: rank %d: no rank of round %d holds copies (none "
                       "pushed); restore a checkpoint",
                       c->rank, c->round);
        goto out;
    }
    p->round = round;
    p->world = world;
    p->holder = malloc(sizeof(int) * (size_t)world);
    if (!p->holder) {
        rc = GPL_ERR_NOMEM;
        goto out;
    }
    /* the newest step every old rank has a copy of: the steps any rank
     * holds, newest first, each checked in one pass */
    int64_t best = -1, newest = -1, tried = INT64_MAX;
    for (;;) {
        int64_t s = -1;
        for (int r = 0; r < c->world; r++) {
            const mirror_rec *x = &p->recs[r];
            if (!x->has || x->round != round)
                continue;
            if (x->own_step < tried && x->own_step > s)
                s = x->own_step;
            for (int k = 0; k < x->nheld; k++)
                if (x->held[k].round == round && x->held[k].step < tried && x->held[k].step > s)
                    s = x->held[k].step;
        }
        if (s < 0)
            break;
        newest = newest < 0 ? s : newest;
        if (holders_at(p->recs, c->world, round, world, s, p->holder) == 0) {
            best = s;
            break;
        }
        tried = s;
    }
    if (best < 0) {
        char miss[256] = "";
        size_t len = 0;
        if (newest >= 0)
            holders_at(p->recs, c->world, round, world, newest, p->holder);
        for (int o = 0; o < world && newest >= 0 && len + 16 < sizeof miss; o++)
            if (p->holder[o] < 0)
                len += (size_t)snprintf(miss + len, sizeof miss - len, "%s%d", len ? ", " : "", o);
        rc = gb_seterr(&c->err, GPL_ERR_STATE,
                       "gpl_mirror_agree: rank %d: no step has a copy of every rank of round %d's "
                       "world of %d (step %lld lacks rank(s) %s: a rank and its buddy both lost, "
                       "or a push cut off); restore the newest checkpoint",
                       c->rank, round, world, (long long)newest, miss[0] ? miss : "?");
        goto out;
    }
    p->step = best;
out:
    if (rc != GPL_OK) {
        gpl_mirror_plan_free(p);
        return rc;
    }
    *out = p;
    return GPL_OK;
}

void gpl_mirror_plan_info(gpl_mirror_plan_t p, int64_t *step, int *old_world, int *old_round) {
    if (step)
        *step = p ? p->step : -1;
    if (old_world)
        *old_world = p ? p->world : 0;
    if (old_round)
        *old_round = p ? p->round : -1;
}

int gpl_mirror_holder(gpl_mirror_plan_t p, int old_rank) {
    if (p == NULL || old_rank < 0 || old_rank >= p->world)
        return -1;
    return p->holder[old_rank];
}

/* The local copy of old rank: buffer pointers and sizes (NULL: not here). */
static int local_copy(gpl_mirror_plan_t p, int owner, const uint8_t **bufs, size_t *sizes) {
    gpl_mirror_t m = p->m;
    if (!m || p->holder[owner] != p->me)
        return -1;
    if (m->round == p->round && m->rank == owner && m->own_step == p->step) {
        for (int i = 0; i < m->nbuf; i++) {
            bufs[i] = m->bufs[i];
            sizes[i] = m->sizes[i];
        }
        return m->nbuf;
    }
    for (int i = 0; i < MIRROR_SLOTS_MAX; i++) {
        const mirror_slot *s = &m->slot[i];
        if (s->used && s->valid && s->owner == owner && s->round == p->round &&
            s->step == p->step) {
            size_t off = 0;
            for (int k = 0; k < s->nbuf; k++) {
                bufs[k] = s->data + off;
                sizes[k] = s->sizes[k];
                off += s->sizes[k];
            }
            return s->nbuf;
        }
    }
    return -1;
}

gpl_result_t gpl_mirror_view(gpl_mirror_plan_t p, int old_rank, int i, const void **data,
                             size_t *bytes) {
    if (p == NULL || data == NULL || bytes == NULL || old_rank < 0 || old_rank >= p->world)
        return GPL_ERR_INVALID_ARG;
    const uint8_t *bufs[GPL_MIRROR_MAX_BUFS];
    size_t sizes[GPL_MIRROR_MAX_BUFS];
    int n = local_copy(p, old_rank, bufs, sizes);
    if (n < 0)
        return gb_seterr(&p->comm->err, GPL_ERR_NOT_FOUND,
                         "gpl_mirror_view: rank %d does not hold rank %d's copy of step %lld "
                         "(rank %d does: gpl_mirror_fetch)",
                         p->me, old_rank, (long long)p->step, p->holder[old_rank]);
    if (i < 0 || i >= n)
        return gb_seterr(&p->comm->err, GPL_ERR_INVALID_ARG,
                         "gpl_mirror_view: rank %d's copy has %d buffers, not %d", old_rank, n,
                         i + 1);
    *data = bufs[i];
    *bytes = sizes[i];
    return GPL_OK;
}

gpl_result_t gpl_mirror_fetch(gpl_mirror_plan_t p, int old_rank, void *const bufs[],
                              const size_t bytes[], int n) {
    if (p == NULL || old_rank < 0 || old_rank >= p->world || n < 0 || n > GPL_MIRROR_MAX_BUFS ||
        (n > 0 && (bufs == NULL || bytes == NULL)))
        return GPL_ERR_INVALID_ARG;
    gpl_comm_t c = p->comm;
    gb_clearerr(&c->err);
    const uint8_t *have[GPL_MIRROR_MAX_BUFS];
    size_t sizes[GPL_MIRROR_MAX_BUFS];
    int k = local_copy(p, old_rank, have, sizes);
    if (k >= 0) {
        if (k != n)
            return gb_seterr(&c->err, GPL_ERR_INVALID_ARG,
                             "gpl_mirror_fetch: rank %d's copy is %d buffers; %d were given",
                             old_rank, k, n);
        for (int i = 0; i < n; i++)
            if (sizes[i] != bytes[i])
                return gb_seterr(&c->err, GPL_ERR_INVALID_ARG,
                                 "gpl_mirror_fetch: buffer %d of rank %d's copy is %zu bytes; %zu "
                                 "were given",
                                 i, old_rank, sizes[i], bytes[i]);
        for (int i = 0; i < n; i++)
            if (bufs[i] != have[i])
                memcpy(bufs[i], have[i], sizes[i]);
        return GPL_OK;
    }
    const mirror_rec *h = &p->recs[p->holder[old_rank]];
    const char *addr = h->node == p->my_node ? "127.0.0.1" : h->addr;
    uint32_t tmo = p->m ? p->m->timeout_ms : c->timeout_ms;
    return mirror_fetch_remote(&c->err, addr, h->port, tmo, p->round, old_rank, p->step, bufs,
                               bytes, n);
}

void gpl_mirror_plan_free(gpl_mirror_plan_t p) {
    if (p == NULL)
        return;
    free(p->holder);
    free(p->recs);
    free(p);
}
