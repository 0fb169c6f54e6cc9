/* The rendezvous server: connections, the handshake, jobs, rounds, the
 * key-value store, liveness and events, on one libuv loop. Every message is
 * O(1) work except the ones that complete or end a round, which are O(N) once
 * per round. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb_log.h"
#include "gb_time.h"
#include "rdzv_auth.h"
#include "rdzv_fanout.h"
#include "rdzv_server_int.h"

#define GB_COMPONENT "rdzv"

#define SWEEP_MS 100           /* timer granularity of deadlines */
#define HB_SCAN_MS 250         /* how often heartbeats are checked */
#define PROGRESS_MS 5000       /* progress pushes to nodes waiting for a round ... */
#define PROGRESS_AFTER_MS 2000 /* ... once they have waited this long */
#define CONN_IN_MAX (RDZV_MAX_FRAME + 4 + sizeof(((rdzv_server *)0)->readbuf))

enum conn_state { C_HELLO = 0, C_AUTH = 1, C_READY = 2 };

struct conn {
    uv_tcp_t tcp;
    rdzv_server *s;
    LIST_ENTRY(conn) link, alink;
    TAILQ_ENTRY(conn) hlink; /* s->handshaking, in accept order, while state != C_READY */
    uint64_t push_mark;      /* the last push_send that listed it */
    int state, closing;
    uint8_t nonce[RDZV_NONCE_LEN];
    rdzv_buf in;
    size_t outq;
    uint64_t accepted_ms, last_rx_ms;
    char peer[64];
    member *m;
    job *aj; /* attached job (worker connections) */
    uint32_t around;
    LIST_HEAD(, waiter) waiters;
};

typedef struct wreq {
    uv_write_t req;
    conn *c;
    size_t len;
    uint8_t *data;
} wreq;

static void conn_close(conn *c, const char *why);
static void job_maybe_free(job *j);
static void end_round(job *j, member *culprit, uint32_t reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

uint64_t rdzv_member_last_rx_ms(const member *m) { return m->c ? m->c->last_rx_ms : 0; }

/* The peer's address, looked up the first time a message needs it (one
 * syscall fewer per connection on the hot path). */
static const char *peer_of(conn *c) {
    if (c->peer[0])
        return c->peer;
    struct sockaddr_storage ss;
    int len = sizeof ss;
    snprintf(c->peer, sizeof c->peer, "?");
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
        char ip[48] = "";
        int port = 0;
        if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        } else {
            uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        }
        snprintf(c->peer, sizeof c->peer, "%s:%d", ip, port);
    }
    return c->peer;
}

/* ---- output ---- */

static void on_written(uv_write_t *req, int status) {
    wreq *w = (wreq *)req;
    w->c->outq -= w->len;
    free(w->data);
    free(w);
}

/* Sends one encoded frame: written at once when the socket takes it,
 * otherwise the rest is copied into the connection's bounded output queue.
 * Returns NULL, or why the connection must be closed (the caller closes it:
 * closing can end a round, which pushes to other connections). */
static const char *deliver(conn *c, const uint8_t *data, size_t len) {
    if (c->closing)
        return NULL;
    size_t off = 0;
    if (c->outq == 0) {
        uv_buf_t ub = uv_buf_init((char *)data, (unsigned)len);
        int n = uv_try_write((uv_stream_t *)&c->tcp, &ub, 1);
        if (n > 0)
            off = (size_t)n;
    }
    if (off == len)
        return NULL;
    size_t left = len - off;
    if (c->outq + left > c->s->o.max_outq_bytes)
        return "output queue over its limit: the client does not read its replies";
    wreq *w = malloc(sizeof *w);
    uint8_t *copy = malloc(left);
    if (w == NULL || copy == NULL) {
        free(w);
        free(copy);
        return "out of memory";
    }
    memcpy(copy, data + off, left);
    w->c = c;
    w->len = left;
    w->data = copy;
    uv_buf_t ub = uv_buf_init((char *)copy, (unsigned)left);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &ub, 1, on_written) != 0) {
        free(copy);
        free(w);
        return "write failed";
    }
    c->outq += left;
    return NULL;
}

static void send_frame(conn *c, const uint8_t *data, size_t len) {
    const char *why = deliver(c, data, len);
    if (why)
        conn_close(c, why);
}

/* Encodes into the server's one scratch buffer (no allocation per message);
 * send_frame does not read it after anything that could send again. */
static void send_msg(conn *c, const rdzv_msg *m) {
    if (c->closing)
        return;
    rdzv_buf *b = &c->s->scratch;
    b->len = 0;
    if (rdzv_encode(m, b) != GPL_OK) {
        GB_ERROR("cannot encode %s for %s", rdzv_type_name(m->type), peer_of(c));
        return;
    }
    send_frame(c, b->data, b->len);
}

static void send_error(conn *c, uint32_t req, gpl_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void send_error(conn *c, uint32_t req, gpl_result_t code, const char *fmt, ...) {
    rdzv_msg m = {.type = RDZV_ERROR, .req_id = req};
    m.u.error.code = (uint32_t)code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.u.error.message, sizeof m.u.error.message, fmt, ap);
    va_end(ap);
    send_msg(c, &m);
}

static void send_simple(conn *c, uint16_t type, uint32_t req) {
    rdzv_msg m = {.type = type, .req_id = req};
    send_msg(c, &m);
}

/* ---- key-value store ---- */

static uint32_t hash_bytes(const uint8_t *p, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

static kv_entry **kv_slot(job *j, const rdzv_bytes *k, uint32_t h) {
    if (j->kv_buckets == 0)
        return NULL;
    kv_entry **e = &j->kv[h & (j->kv_buckets - 1)];
    while (*e &&
           !((*e)->hash == h && (*e)->klen == k->len && memcmp((*e)->data, k->p, k->len) == 0))
        e = &(*e)->next;
    return e;
}

static kv_entry *kv_find(job *j, const rdzv_bytes *k) {
    kv_entry **e = kv_slot(j, k, hash_bytes(k->p, k->len));
    return e ? *e : NULL;
}

static void kv_clear(job *j) {
    for (uint32_t i = 0; i < j->kv_buckets; i++) {
        kv_entry *e = j->kv[i];
        while (e) {
            kv_entry *n = e->next;
            free(e);
            e = n;
        }
    }
    free(j->kv);
    j->kv = NULL;
    j->kv_buckets = j->kv_count = 0;
    j->kv_bytes = 0;
}

static gpl_result_t kv_grow(job *j) {
    uint32_t nb = j->kv_buckets ? j->kv_buckets * 2 : 64;
    kv_entry **t = calloc(nb, sizeof *t);
    if (t == NULL)
        return GPL_ERR_NOMEM;
    for (uint32_t i = 0; i < j->kv_buckets; i++) {
        kv_entry *e = j->kv[i];
        while (e) {
            kv_entry *n = e->next;
            e->next = t[e->hash & (nb - 1)];
            t[e->hash & (nb - 1)] = e;
            e = n;
        }
    }
    free(j->kv);
    j->kv = t;
    j->kv_buckets = nb;
    return GPL_OK;
}

/* Sets key to value, replacing any old value. */
static gpl_result_t kv_put(job *j, const rdzv_bytes *k, const void *v, uint32_t vlen) {
    uint32_t h = hash_bytes(k->p, k->len);
    kv_entry **slot = kv_slot(j, k, h);
    uint64_t old = (slot && *slot) ? (uint64_t)(*slot)->klen + (*slot)->vlen : 0;
    uint64_t add = (uint64_t)k->len + vlen;
    if (j->kv_bytes - old + add > j->s->o.max_job_kv_bytes)
        return GPL_ERR_LIMIT;
    if (!(slot && *slot) && j->kv_count + 1 > j->kv_buckets) {
        if (kv_grow(j) != GPL_OK)
            return GPL_ERR_NOMEM;
        slot = kv_slot(j, k, h);
    }
    kv_entry *e = malloc(sizeof *e + k->len + vlen);
    if (e == NULL)
        return GPL_ERR_NOMEM;
    e->hash = h;
    e->klen = k->len;
    e->vlen = vlen;
    memcpy(e->data, k->p, k->len);
    if (vlen)
        memcpy(e->data + k->len, v, vlen);
    if (*slot) {
        e->next = (*slot)->next;
        free(*slot);
    } else {
        e->next = NULL;
        j->kv_count++;
    }
    *slot = e;
    j->kv_bytes = j->kv_bytes - old + add;
    return GPL_OK;
}

static void kv_del(job *j, const rdzv_bytes *k) {
    kv_entry **slot = kv_slot(j, k, hash_bytes(k->p, k->len));
    if (slot == NULL || *slot == NULL)
        return;
    kv_entry *e = *slot;
    *slot = e->next;
    j->kv_bytes -= (uint64_t)e->klen + e->vlen;
    j->kv_count--;
    free(e);
}

static void waiter_free(waiter *w) {
    LIST_REMOVE(w, jlink);
    LIST_REMOVE(w, clink);
    free(w);
}

/* Number of keys of a waiter's list that are not set yet. */
static uint32_t waiter_missing(job *j, const waiter *w, rdzv_bytes *first) {
    rdzv_bytes walk = {w->keys, (uint32_t)w->len}, k;
    uint32_t missing = 0;
    while (rdzv_list_next(&walk, &k))
        if (kv_find(j, &k) == NULL && missing++ == 0 && first)
            *first = k;
    return missing;
}

/* After a write: wake the waiters whose keys are all set. */
static void kv_wake(job *j) {
    waiter *w = LIST_FIRST(&j->waiters), *n;
    for (; w; w = n) {
        n = LIST_NEXT(w, jlink);
        if (waiter_missing(j, w, NULL) == 0) {
            send_simple(w->c, RDZV_OK, w->req);
            waiter_free(w);
        }
    }
}

static void waiters_fail(job *j, gpl_result_t code, const char *msg) {
    waiter *w;
    while ((w = LIST_FIRST(&j->waiters)) != NULL) {
        send_error(w->c, w->req, code, "%s", msg);
        waiter_free(w);
    }
}

/* ---- jobs ---- */

/* When a waiting node next needs the sweep: a progress push or its join timeout. */
static uint64_t pending_due(const job *j, const member *m) {
    uint64_t timeout = m->joined_ms + j->join_timeout_ms;
    return m->next_progress_ms < timeout ? m->next_progress_ms : timeout;
}

static job *job_find(rdzv_server *s, const char *run_id) {
    job *j;
    LIST_FOREACH(j, &s->jobs, link)
    if (strcmp(j->run_id, run_id) == 0)
        return j;
    return NULL;
}

static job *job_new(rdzv_server *s, const rdzv_msg *jm) {
    job *j = calloc(1, sizeof *j);
    if (j == NULL)
        return NULL;
    j->s = s;
    memcpy(j->run_id, jm->u.join.run_id, sizeof j->run_id);
    j->min_nodes = jm->u.join.min_nodes ? jm->u.join.min_nodes : 1;
    j->max_nodes = jm->u.join.max_nodes ? jm->u.join.max_nodes : j->min_nodes;
    j->last_call_ms = jm->u.join.last_call_ms;
    j->join_timeout_ms =
        jm->u.join.join_timeout_ms ? jm->u.join.join_timeout_ms : RDZV_DEFAULT_JOIN_TIMEOUT_MS;
    j->hb_timeout_ms = jm->u.join.heartbeat_timeout_ms ? jm->u.join.heartbeat_timeout_ms
                                                       : s->o.heartbeat_timeout_ms;
    j->is_static = jm->u.join.static_rank >= 0;
    memcpy(j->first_host, jm->u.join.hostname, sizeof j->first_host);
    LIST_INIT(&j->pending);
    LIST_INIT(&j->waiters);
    LIST_INIT(&j->attached);
    if (j->is_static) {
        j->static_slots = calloc(j->max_nodes, sizeof *j->static_slots);
        if (j->static_slots == NULL) {
            free(j);
            return NULL;
        }
    }
    j->health = rdzv_health_new(s->o.straggler_threshold, s->o.straggler_windows);
    LIST_INSERT_HEAD(&s->jobs, j, link);
    s->njobs++;
    GB_INFO("job %s: created by %s (%u:%u nodes%s)", j->run_id, j->first_host, j->min_nodes,
            j->max_nodes, j->is_static ? ", static ranks" : "");
    return j;
}

static void job_free(job *j) {
    waiter *w;
    while ((w = LIST_FIRST(&j->waiters)) != NULL)
        waiter_free(w);
    conn *c;
    while ((c = LIST_FIRST(&j->attached)) != NULL) {
        LIST_REMOVE(c, alink);
        c->aj = NULL;
    }
    kv_clear(j);
    free(j->static_slots);
    free(j->ranks);
    rdzv_health_free(j->health);
    LIST_REMOVE(j, link);
    j->s->njobs--;
    free(j);
}

/* A job with no node and no worker connected is forgotten. */
static void job_maybe_free(job *j) {
    if (j->nmembers_total == 0 && LIST_EMPTY(&j->attached))
        job_free(j);
}

static void member_unpend(member *m) {
    if (!m->pending)
        return;
    job *j = m->j;
    LIST_REMOVE(m, plink);
    m->pending = 0;
    j->npending--;
    if (j->is_static && m->static_rank >= 0 && (uint32_t)m->static_rank < j->max_nodes &&
        j->static_slots[m->static_rank] == m)
        j->static_slots[m->static_rank] = NULL;
    if (j->npending < j->min_nodes)
        j->min_reached_ms = 0;
}

/* One push to many connections: the frames are laid out in one buffer and
 * written by rdzv_fanout (with helper threads past RDZV_FANOUT_PARALLEL_MIN);
 * what a socket does not take at once, and connections that already have
 * queued output, go through send_frame's queue afterwards, on this thread. */
typedef struct push {
    rdzv_fan_item *items;
    conn **conns;
    const char **why; /* a connection to close once every frame is out */
    size_t n, cap;
    rdzv_buf data;
} push;

static int push_init(push *p, size_t cap) {
    memset(p, 0, sizeof *p);
    rdzv_buf_init(&p->data, SIZE_MAX);
    p->cap = cap ? cap : 1;
    p->items = malloc(p->cap * sizeof *p->items);
    p->conns = malloc(p->cap * sizeof *p->conns);
    p->why = calloc(p->cap, sizeof *p->why);
    if (p->items == NULL || p->conns == NULL || p->why == NULL) {
        free(p->items);
        free(p->conns);
        free(p->why);
        return -1;
    }
    return 0;
}

/* Adds c with the frame at [off, off + len) of p->data (frames may be shared). */
static void push_add(push *p, conn *c, size_t off, size_t len) {
    if (p->n == p->cap || c == NULL || c->closing)
        return;
    p->items[p->n] = (rdzv_fan_item){.fd = -1, .off = (uint32_t)off, .len = (uint32_t)len};
    p->conns[p->n++] = c;
}

static void push_send(rdzv_server *s, push *p) {
    /* A connection that is in the push twice (a node's own connection can
     * also attach) is written directly once only: two threads must never
     * write one socket, and its second frame follows the first in order. */
    uint64_t mark = ++s->push_mark;
    for (size_t i = 0; i < p->n; i++) {
        conn *c = p->conns[i];
        uv_os_fd_t fd;
        if (!c->closing && c->outq == 0 && c->push_mark != mark &&
            uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
            p->items[i].fd = fd;
        c->push_mark = mark;
    }
    rdzv_fanout_run(s->fan, p->items, p->n, p->data.data);
    /* Every frame is whole in its socket or its queue before any connection
     * is closed: a close can end the round and push again, and that push must
     * not land in the middle of a frame of this one. */
    for (size_t i = 0; i < p->n; i++) {
        rdzv_fan_item *it = &p->items[i];
        if (it->sent < it->len)
            p->why[i] = deliver(p->conns[i], p->data.data + it->off + it->sent, it->len - it->sent);
    }
    for (size_t i = 0; i < p->n; i++)
        if (p->why[i])
            conn_close(p->conns[i], p->why[i]);
    free(p->items);
    free(p->conns);
    free(p->why);
    rdzv_buf_free(&p->data);
}

/* One encoding for every member and, with attached, every attached worker
 * connection. */
static void push_to(job *j, const rdzv_msg *msg, int attached) {
    size_t n = j->nranks;
    conn *c;
    if (attached) {
        LIST_FOREACH(c, &j->attached, alink)
        n++;
    }
    push p;
    if (push_init(&p, n) != 0) {
        GB_ERROR("cannot send %s to job %s: out of memory", rdzv_type_name(msg->type), j->run_id);
        return;
    }
    if (rdzv_encode(msg, &p.data) != GPL_OK) {
        GB_ERROR("cannot encode %s for job %s", rdzv_type_name(msg->type), j->run_id);
        push_send(j->s, &p);
        return;
    }
    for (uint32_t i = 0; i < j->nranks; i++)
        if (j->ranks[i])
            push_add(&p, j->ranks[i]->c, 0, p.data.len);
    if (attached) {
        LIST_FOREACH(c, &j->attached, alink)
        push_add(&p, c, 0, p.data.len);
    }
    push_send(j->s, &p);
}

static void push_to_job(job *j, const rdzv_msg *msg) { push_to(j, msg, 1); }

/* One encoding for every member (not the attached workers). */
static void push_to_nodes(job *j, const rdzv_msg *msg) { push_to(j, msg, 0); }

static void end_round(job *j, member *culprit, uint32_t reason, const char *fmt, ...) {
    if (j->state != JOB_RUNNING)
        return;
    rdzv_msg m = {.type = RDZV_ROUND_OVER};
    m.u.round_over.round = j->round;
    m.u.round_over.reason = reason;
    m.u.round_over.node_rank = culprit ? culprit->node_rank : UINT32_MAX;
    if (culprit)
        memcpy(m.u.round_over.hostname, culprit->hostname, sizeof m.u.round_over.hostname);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.u.round_over.message, sizeof m.u.round_over.message, fmt, ap);
    va_end(ap);
    GB_WARN("job %s: round %u over: %s", j->run_id, j->round, m.u.round_over.message);
    rdzv_health_round_end(j->health, j->round, culprit ? culprit->hostname : NULL,
                          m.u.round_over.message);
    if (reason != RDZV_REASON_SCALE_UP && /* growing is not a failure */
        reason < sizeof j->s->m.failures / sizeof j->s->m.failures[0])
        j->s->m.failures[reason]++;
    push_to_job(j, &m);
    waiters_fail(j, GPL_ERR_ROUND_OVER, m.u.round_over.message);
    /* After a failure the survivors re-join at once: the next round starts when
     * they all have, without the last call (a late node comes in by scale-up).
     * The culprit is no survivor unless only its workers failed. A scale-up,
     * or survivors fewer than the minimum, gather as a first round does. */
    int reform = reason != RDZV_REASON_SCALE_UP;
    uint32_t survivors = 0;
    for (uint32_t i = 0; i < j->nranks; i++) {
        member *x = j->ranks[i];
        if (x) {
            x->active = 0;
            x->done = 0;
            x->prev_rank = x->node_rank;
            if (reform &&
                (x != culprit || reason == RDZV_REASON_FAILED || reason == RDZV_REASON_HUNG)) {
                x->awaited_round = j->round;
                survivors++;
            }
        }
    }
    j->reforming = reform && survivors > 0 && survivors + j->npending >= j->min_nodes;
    j->reform_round = j->round;
    j->reform_left = survivors;
    j->reform_deadline_ms = gb_now_ms() + j->last_call_ms;
    snprintf(j->reform_why, sizeof j->reform_why, "%s", culprit ? culprit->hostname : "a node");
    free(j->ranks);
    j->ranks = NULL;
    j->nranks = j->nactive = j->ndone = 0;
    j->state = JOB_GATHERING;
    j->min_reached_ms = j->npending >= j->min_nodes ? gb_now_ms() : 0;
    kv_clear(j);
}

static int cmp_join_order(const void *a, const void *b) {
    const member *x = *(member *const *)a, *y = *(member *const *)b;
    return x->join_seq < y->join_seq ? -1 : x->join_seq > y->join_seq;
}

/* The round is complete: assign ranks and push them to every member at once. */
static void complete_round(job *j) {
    uint32_t n = j->npending;
    if (n > j->max_nodes)
        n = j->max_nodes;
    member **ranks = calloc(n ? n : 1, sizeof *ranks);
    member **order = calloc(j->npending ? j->npending : 1, sizeof *order);
    if (ranks == NULL || order == NULL) {
        free(ranks);
        free(order);
        GB_ERROR("job %s: out of memory completing the round", j->run_id);
        return;
    }
    uint32_t k = 0;
    member *m;
    LIST_FOREACH(m, &j->pending, plink)
    order[k++] = m;
    qsort(order, k, sizeof *order, cmp_join_order);
    if (j->is_static) {
        for (uint32_t i = 0; i < k; i++)
            if ((uint32_t)order[i]->static_rank < n)
                ranks[order[i]->static_rank] = order[i];
    } else {
        /* Members of the last round keep their rank when it is still in range. */
        for (uint32_t i = 0; i < k; i++) {
            m = order[i];
            if (m->prev_rank >= 0 && m->prev_rank < (int64_t)n && ranks[m->prev_rank] == NULL) {
                ranks[m->prev_rank] = m;
                order[i] = NULL;
            }
        }
        uint32_t slot = 0;
        for (uint32_t i = 0; i < k; i++) {
            if (order[i] == NULL)
                continue;
            while (slot < n && ranks[slot])
                slot++;
            if (slot >= n)
                break; /* over max: stays pending for the next round */
            ranks[slot] = order[i];
        }
    }
    free(order);
    j->reforming = 0;
    j->reform_left = 0;
    j->round++;
    j->ranks = ranks;
    j->nranks = n;
    j->nactive = n;
    j->ndone = 0;
    j->state = JOB_RUNNING;
    kv_clear(j);
    uint32_t world = 0;
    for (uint32_t i = 0; i < n; i++)
        world += ranks[i]->nproc;
    rdzv_msg a = {.type = RDZV_ASSIGNED};
    a.u.assigned.round = j->round;
    a.u.assigned.nnodes = n;
    a.u.assigned.world_size = world;
    a.u.assigned.master_port = ranks[0]->master_port;
    memcpy(a.u.assigned.master_addr, ranks[0]->addr, sizeof a.u.assigned.master_addr);
    uint32_t base = 0;
    push p;
    int pushing = push_init(&p, n) == 0;
    for (uint32_t i = 0; i < n; i++) {
        m = ranks[i];
        member_unpend(m);
        m->active = 1;
        m->done = 0;
        m->node_rank = i;
        a.req_id = m->join_req;
        a.u.assigned.node_rank = i;
        a.u.assigned.base_rank = base;
        m->base_rank = base;
        base += m->nproc;
        size_t off = p.data.len;
        if (pushing && rdzv_encode(&a, &p.data) == GPL_OK)
            push_add(&p, m->c, off, p.data.len - off);
        else
            send_msg(m->c, &a);
    }
    if (pushing)
        push_send(j->s, &p);
    j->s->m.rounds++;
    rdzv_health_round_start(j->health, j->round, n, world);
    GB_INFO("job %s: round %u assigned: %u nodes, world size %u, master %s:%u", j->run_id, j->round,
            n, world, a.u.assigned.master_addr, a.u.assigned.master_port);
    /* Nodes still pending (over max) are told they wait for the next round. */
    if (j->npending) {
        rdzv_msg w = {.type = RDZV_WAITING};
        w.u.waiting.waiting = j->npending;
        w.u.waiting.members = n;
        push_to_job(j, &w);
    }
}

static void maybe_complete(job *j, uint64_t now) {
    if (j->state != JOB_GATHERING)
        return;
    if (j->is_static) {
        if (j->npending < j->max_nodes)
            return;
        for (uint32_t i = 0; i < j->max_nodes; i++)
            if (j->static_slots[i] == NULL)
                return;
        complete_round(j);
        return;
    }
    if (j->npending >= j->max_nodes) {
        complete_round(j);
        return;
    }
    if (j->reforming && j->npending + j->reform_left < j->min_nodes)
        j->reforming = 0; /* survivors died too: gather as a first round does */
    if (j->npending >= j->min_nodes) {
        if (j->min_reached_ms == 0)
            j->min_reached_ms = now;
        if (j->reforming ? j->reform_left == 0 || now >= j->reform_deadline_ms
                         : now - j->min_reached_ms >= j->last_call_ms)
            complete_round(j);
    }
}

/* A member of the failed round is back (or gone): one survivor fewer to wait for. */
static void survivor_in(member *m) {
    job *j = m->j;
    if (j && m->awaited_round && m->awaited_round == j->reform_round && j->reform_left)
        j->reform_left--;
    m->awaited_round = 0;
}

/* What a gathering round waits for, for the nodes waiting in it: how many
 * joined, then the missing static ranks, the survivors of a failed round, the
 * minimum, or the last call's remaining time. */
static void describe_missing(job *j, uint64_t now, char *out, size_t len) {
    out[0] = '\0';
    if (!j->is_static) {
        if (j->reforming && now < j->reform_deadline_ms) {
            uint64_t left = j->reform_deadline_ms > now ? j->reform_deadline_ms - now : 0;
            snprintf(out, len,
                     "%u node(s) joined; round %u ended (%s): waiting for %u more of its "
                     "survivors to re-join, at most %.0f s more",
                     j->npending, j->reform_round, j->reform_why, j->reform_left, left / 1000.0);
        } else if (j->npending < j->min_nodes) {
            snprintf(out, len, "%u node(s) joined; %u more needed for the minimum of %u",
                     j->npending, j->min_nodes - j->npending, j->min_nodes);
        } else {
            uint64_t end = j->min_reached_ms + j->last_call_ms;
            snprintf(out, len,
                     "%u node(s) joined, the minimum is %u; last call: the round starts in %.0f s "
                     "and takes up to %u more node(s)",
                     j->npending, j->min_nodes, end > now ? (end - now) / 1000.0 : 0.0,
                     j->max_nodes > j->npending ? j->max_nodes - j->npending : 0);
        }
        return;
    }
    int w = snprintf(out, len, "%u of %u nodes joined; missing ", j->npending, j->max_nodes);
    size_t off = w > 0 ? (size_t)w : 0;
    uint32_t shown = 0, missing = 0;
    for (uint32_t i = 0; i < j->max_nodes; i++) {
        if (j->static_slots[i])
            continue;
        missing++;
        if (shown < 16 && off < len) {
            w = snprintf(out + off, len - off, "%s%u", shown ? ", " : "node ranks ", i);
            if (w > 0)
                off += (size_t)w;
            shown++;
        }
    }
    if (missing > shown && off < len)
        snprintf(out + off, len - off, " and %u more", missing - shown);
}

/* ---- message handlers ---- */

static void handle_join(conn *c, const rdzv_msg *msg) {
    rdzv_server *s = c->s;
    const __typeof__(msg->u.join) *jn = &msg->u.join;
    if (jn->run_id[0] == '\0' || jn->nproc == 0) {
        send_error(c, msg->req_id, GPL_ERR_INVALID_ARG,
                   "JOIN needs a run id and nproc >= 1 (got run id '%s', nproc %u)", jn->run_id,
                   jn->nproc);
        return;
    }
    if (c->m && (c->m->pending || c->m->active)) {
        send_error(c, msg->req_id, GPL_ERR_STATE,
                   "this connection already joined job %s; rejoin after the round ends",
                   c->m->j->run_id);
        return;
    }
    job *j = job_find(s, jn->run_id);
    if (j == NULL) {
        if (s->njobs >= s->o.max_jobs) {
            send_error(c, msg->req_id, GPL_ERR_LIMIT,
                       "the server holds its maximum of %u jobs; raise --max-jobs", s->o.max_jobs);
            return;
        }
        uint32_t maxn = jn->max_nodes ? jn->max_nodes : jn->min_nodes;
        if (maxn > s->o.max_nodes || (jn->min_nodes > maxn)) {
            send_error(c, msg->req_id, GPL_ERR_LIMIT,
                       "job %s asks for %u:%u nodes; this server allows at most %u", jn->run_id,
                       jn->min_nodes, maxn, s->o.max_nodes);
            return;
        }
        j = job_new(s, msg);
        if (j == NULL) {
            send_error(c, msg->req_id, GPL_ERR_NOMEM, "out of memory creating job %s", jn->run_id);
            return;
        }
    } else if (!(msg->flags & RDZV_JOIN_RESUME) &&
               ((jn->min_nodes && jn->min_nodes != j->min_nodes) ||
                (jn->max_nodes && jn->max_nodes != j->max_nodes) ||
                (jn->static_rank >= 0) != j->is_static)) {
        send_error(c, msg->req_id, GPL_ERR_CONFIG,
                   "node %s asks job %s for %u:%u nodes (%s ranks) but node %s started it with "
                   "%u:%u nodes (%s ranks); give every node the same --nnodes and mode",
                   jn->hostname, j->run_id, jn->min_nodes, jn->max_nodes,
                   jn->static_rank >= 0 ? "static" : "elastic", j->first_host, j->min_nodes,
                   j->max_nodes, j->is_static ? "static" : "elastic");
        return;
    }
    if (j->is_static && !(msg->flags & RDZV_JOIN_RESUME) &&
        (uint32_t)jn->static_rank >= j->max_nodes) {
        send_error(c, msg->req_id, GPL_ERR_INVALID_ARG,
                   "node %s has node rank %d but job %s has %u nodes (ranks 0..%u)", jn->hostname,
                   jn->static_rank, j->run_id, j->max_nodes, j->max_nodes - 1);
        return;
    }
    if (j->is_static && !(msg->flags & RDZV_JOIN_RESUME) && j->static_slots[jn->static_rank]) {
        member *o = j->static_slots[jn->static_rank];
        if (strcmp(o->instance, jn->instance) != 0) {
            send_error(c, msg->req_id, GPL_ERR_EXISTS,
                       "duplicate node rank %d in job %s: %s (%s, instance %s) already holds "
                       "it, refused %s (%s, instance %s); give each node its own --node-rank",
                       jn->static_rank, j->run_id, o->hostname, o->addr, o->instance, jn->hostname,
                       jn->addr, jn->instance);
            return;
        }
        /* The same instance joined again on a new connection: the old one is stale. */
        member_unpend(o);
    }
    member *m = c->m;
    job *left = NULL; /* the job this connection's node was in before */
    if (m == NULL) {
        m = calloc(1, sizeof *m);
        if (m == NULL) {
            send_error(c, msg->req_id, GPL_ERR_NOMEM, "out of memory");
            return;
        }
        m->prev_rank = -1;
        m->c = c;
        c->m = m;
    } else if (m->j != j) {
        survivor_in(m); /* no survivor of that job's failed round any more */
        left = m->j;
        left->nmembers_total--;
        m->prev_rank = -1;
    }
    if (m->j != j)
        j->nmembers_total++;
    m->j = j;
    if (left)
        job_maybe_free(left);
    memcpy(m->hostname, jn->hostname, sizeof m->hostname);
    memcpy(m->addr, jn->addr, sizeof m->addr);
    memcpy(m->instance, jn->instance, sizeof m->instance);
    m->master_port = jn->master_port;
    m->nproc = jn->nproc;
    m->ngpus = jn->ngpus;
    m->static_rank = jn->static_rank;
    m->join_req = msg->req_id;
    m->joined_ms = gb_now_ms();
    m->join_seq = ++s->join_seq;
    m->next_progress_ms = m->joined_ms + PROGRESS_AFTER_MS;
    if (pending_due(j, m) < j->pending_due_ms)
        j->pending_due_ms = pending_due(j, m);
    s->m.joins++;

    if (msg->flags & RDZV_JOIN_RESUME) {
        /* A node re-registers the round it is running after a server restart. */
        if (j->state == JOB_GATHERING && j->round == 0 && j->npending == 0) {
            j->round = jn->round;
            j->state = JOB_RUNNING;
            j->nranks = jn->nnodes;
            j->ranks = calloc(jn->nnodes ? jn->nnodes : 1, sizeof *j->ranks);
            j->nactive = 0;
            j->resume_deadline_ms = gb_now_ms() + 2ull * j->hb_timeout_ms;
            if (j->ranks == NULL) {
                send_error(c, msg->req_id, GPL_ERR_NOMEM, "out of memory");
                return;
            }
        }
        if (j->state != JOB_RUNNING || j->round != jn->round || jn->node_rank >= j->nranks ||
            (j->ranks[jn->node_rank] && j->ranks[jn->node_rank] != m)) {
            send_error(c, msg->req_id, GPL_ERR_ROUND_OVER,
                       "round %u of job %s cannot be resumed (the server is at round %u); "
                       "rejoin",
                       jn->round, j->run_id, j->round);
            return;
        }
        if (j->health && j->health->round != j->round)
            rdzv_health_round_start(j->health, j->round, jn->nnodes, jn->world_size);
        j->ranks[jn->node_rank] = m;
        j->nactive++;
        m->active = 1;
        m->node_rank = jn->node_rank;
        m->base_rank = jn->base_rank;
        rdzv_msg a = {.type = RDZV_ASSIGNED, .req_id = msg->req_id};
        a.u.assigned.round = jn->round;
        a.u.assigned.node_rank = jn->node_rank;
        a.u.assigned.nnodes = jn->nnodes;
        a.u.assigned.base_rank = jn->base_rank;
        a.u.assigned.world_size = jn->world_size;
        send_msg(c, &a);
        GB_INFO("job %s: %s resumed node rank %u of round %u", j->run_id, m->hostname, m->node_rank,
                j->round);
        return;
    }

    if (j->state == JOB_DONE) {
        /* A finished run id used again starts over. */
        j->state = JOB_GATHERING;
    }
    survivor_in(m);
    m->pending = 1;
    LIST_INSERT_HEAD(&j->pending, m, plink);
    j->npending++;
    if (j->is_static)
        j->static_slots[jn->static_rank] = m;
    GB_INFO("job %s: %s (%s) joined, %u pending", j->run_id, m->hostname, m->addr, j->npending);
    rdzv_health_note(j->health, RDZV_TL_JOIN, j->round + 1, m->hostname, -1, "%s (%s) joined",
                     m->hostname, m->addr);
    if (j->state == JOB_RUNNING) {
        rdzv_msg w = {.type = RDZV_WAITING};
        w.u.waiting.waiting = j->npending;
        w.u.waiting.members = j->nranks;
        push_to_job(j, &w);
        /* An elastic job grows as torchelastic's do: a node waiting while the
         * round has room ends the round, and the next one takes it in (the
         * workers resume from their last checkpoint). Not once nodes have
         * started to finish, and never in static mode (its ranks are fixed). */
        if (!j->is_static && j->nranks < j->max_nodes && j->ndone == 0)
            end_round(j, NULL, RDZV_REASON_SCALE_UP,
                      "node %s (%s) is waiting and job %s has room for %u more node(s): "
                      "re-rendezvous to take it in",
                      m->hostname, m->addr, j->run_id, j->max_nodes - j->nranks);
        return;
    }
    maybe_complete(j, gb_now_ms());
}

static job *kv_job(conn *c, uint32_t req) {
    if (c->m && c->m->j && (c->m->active || c->m->pending))
        return c->m->j;
    if (c->aj) {
        if (c->aj->state != JOB_RUNNING || c->aj->round != c->around) {
            send_error(c, req, GPL_ERR_ROUND_OVER,
                       "round %u of job %s is over; the workers must restart", c->around,
                       c->aj->run_id);
            return NULL;
        }
        return c->aj;
    }
    send_error(c, req, GPL_ERR_STATE, "join or attach to a job before using its key-value store");
    return NULL;
}

static void handle_kv(conn *c, const rdzv_msg *msg) {
    job *j = kv_job(c, msg->req_id);
    if (j == NULL)
        return;
    c->s->m.kv_ops++;
    gpl_result_t rc;
    switch (msg->type) {
    case RDZV_KV_SET:
        rc = kv_put(j, &msg->u.kv_set.key, msg->u.kv_set.value.p, msg->u.kv_set.value.len);
        if (rc != GPL_OK) {
            send_error(c, msg->req_id, rc,
                       "job %s key-value store is full (%llu bytes, limit %llu); delete keys or "
                       "raise --max-job-kv-bytes",
                       j->run_id, (unsigned long long)j->kv_bytes,
                       (unsigned long long)c->s->o.max_job_kv_bytes);
            return;
        }
        send_simple(c, RDZV_OK, msg->req_id);
        kv_wake(j);
        return;
    case RDZV_KV_GET: {
        kv_entry *e = kv_find(j, &msg->u.kv_key.key);
        rdzv_msg r = {.type = RDZV_VALUE, .req_id = msg->req_id};
        if (e) {
            r.u.value.found = 1;
            r.u.value.value = (rdzv_bytes){e->data + e->klen, e->vlen};
        }
        send_msg(c, &r);
        return;
    }
    case RDZV_KV_DEL:
        kv_del(j, &msg->u.kv_key.key);
        send_simple(c, RDZV_OK, msg->req_id);
        return;
    case RDZV_KV_ADD: {
        kv_entry *e = kv_find(j, &msg->u.kv_add.key);
        int64_t v = 0;
        if (e) {
            char tmp[32];
            if (e->vlen == 0 || e->vlen >= sizeof tmp) {
                send_error(c, msg->req_id, GPL_ERR_INVALID_ARG,
                           "key holds %u bytes, not a decimal integer", e->vlen);
                return;
            }
            memcpy(tmp, e->data + e->klen, e->vlen);
            tmp[e->vlen] = '\0';
            char *end;
            errno = 0;
            v = strtoll(tmp, &end, 10);
            if (errno || *end) {
                send_error(c, msg->req_id, GPL_ERR_INVALID_ARG,
                           "key holds '%s', not a decimal integer", tmp);
                return;
            }
        }
        v = (int64_t)((uint64_t)v + (uint64_t)msg->u.kv_add.delta);
        char out[32];
        int n = snprintf(out, sizeof out, "%lld", (long long)v);
        rc = kv_put(j, &msg->u.kv_add.key, out, (uint32_t)n);
        if (rc != GPL_OK) {
            send_error(c, msg->req_id, rc, "job %s key-value store is full", j->run_id);
            return;
        }
        rdzv_msg r = {.type = RDZV_INT, .req_id = msg->req_id};
        r.u.int_.value = v;
        r.u.int_.ok = 1;
        send_msg(c, &r);
        kv_wake(j);
        return;
    }
    case RDZV_KV_CAS: {
        kv_entry *e = kv_find(j, &msg->u.kv_cas.key);
        int match = msg->u.kv_cas.expect_absent
                        ? e == NULL
                        : (e && e->vlen == msg->u.kv_cas.expected.len &&
                           memcmp(e->data + e->klen, msg->u.kv_cas.expected.p, e->vlen) == 0);
        rdzv_msg r = {.type = RDZV_INT, .req_id = msg->req_id};
        if (match) {
            rc = kv_put(j, &msg->u.kv_cas.key, msg->u.kv_cas.desired.p, msg->u.kv_cas.desired.len);
            if (rc != GPL_OK) {
                send_error(c, msg->req_id, rc, "job %s key-value store is full", j->run_id);
                return;
            }
            r.u.int_.ok = 1;
        }
        send_msg(c, &r);
        if (match)
            kv_wake(j);
        return;
    }
    case RDZV_KV_MGET: {
        rdzv_buf items;
        rdzv_buf_init(&items, RDZV_MAX_FRAME - 64);
        rdzv_bytes walk = msg->u.kv_keys.keys, k;
        while (rdzv_list_next(&walk, &k)) {
            kv_entry *e = kv_find(j, &k);
            rc = e ? rdzv_values_add(&items, 1, e->data + e->klen, e->vlen)
                   : rdzv_values_add(&items, 0, NULL, 0);
            if (rc != GPL_OK) {
                rdzv_buf_free(&items);
                send_error(c, msg->req_id, GPL_ERR_LIMIT,
                           "the values of these %u keys exceed one %u-byte reply; ask for fewer",
                           msg->u.kv_keys.nkeys, (unsigned)RDZV_MAX_FRAME);
                return;
            }
        }
        rdzv_msg r = {.type = RDZV_VALUES, .req_id = msg->req_id};
        r.u.values.count = msg->u.kv_keys.nkeys;
        r.u.values.items = (rdzv_bytes){items.data, (uint32_t)items.len};
        send_msg(c, &r);
        rdzv_buf_free(&items);
        return;
    }
    case RDZV_KV_WAIT: {
        waiter *w = malloc(sizeof *w + msg->u.kv_keys.keys.len);
        if (w == NULL) {
            send_error(c, msg->req_id, GPL_ERR_NOMEM, "out of memory");
            return;
        }
        w->c = c;
        w->req = msg->req_id;
        w->nkeys = msg->u.kv_keys.nkeys;
        w->len = msg->u.kv_keys.keys.len;
        if (w->len)
            memcpy(w->keys, msg->u.kv_keys.keys.p, w->len);
        w->deadline_ms = gb_now_ms() + msg->u.kv_keys.timeout_ms;
        LIST_INSERT_HEAD(&j->waiters, w, jlink);
        LIST_INSERT_HEAD(&c->waiters, w, clink);
        if (waiter_missing(j, w, NULL) == 0) {
            send_simple(c, RDZV_OK, w->req);
            waiter_free(w);
        }
        return;
    }
    default:
        return;
    }
}

static void handle_attach(conn *c, const rdzv_msg *msg) {
    job *j = job_find(c->s, msg->u.attach.run_id);
    if (j == NULL || j->state != JOB_RUNNING || j->round != msg->u.attach.round) {
        send_error(c, msg->req_id, j ? GPL_ERR_ROUND_OVER : GPL_ERR_NOT_FOUND,
                   j ? "job %s is at round %u (%s), not round %u: the workers must restart"
                     : "job %s is not known to this server (round %u%s); is the launcher "
                       "running?",
                   msg->u.attach.run_id, j ? j->round : msg->u.attach.round,
                   j ? (j->state == JOB_RUNNING ? "running" : "gathering") : "",
                   msg->u.attach.round);
        return;
    }
    if (c->aj)
        LIST_REMOVE(c, alink);
    c->aj = j;
    c->around = j->round;
    LIST_INSERT_HEAD(&j->attached, c, alink);
    send_simple(c, RDZV_OK, msg->req_id);
}

static void handle_event(conn *c, const rdzv_msg *msg) {
    job *j = c->m ? c->m->j : c->aj;
    if (j == NULL) {
        send_error(c, msg->req_id, GPL_ERR_STATE, "join or attach to a job before sending events");
        return;
    }
    rdzv_msg e = *msg;
    e.req_id = 0;
    e.u.event.round = j->round;
    if (e.u.event.node[0] == '\0' && c->m)
        memcpy(e.u.event.node, c->m->hostname, sizeof e.u.event.node);
    if (e.u.event.kind == RDZV_EVENT_GPU) { /* the timeline's: the node acts on it itself */
        GB_WARN("job %s: GPU notice from %s: %s", j->run_id, e.u.event.node, e.u.event.reason);
        rdzv_health_note(j->health, RDZV_TL_GPU, j->round, e.u.event.node, -1, "%s: %s",
                         e.u.event.node, e.u.event.reason);
        send_simple(c, RDZV_OK, msg->req_id);
        return;
    }
    GB_WARN("job %s: event %s from %s: %s", j->run_id,
            e.u.event.kind == RDZV_EVENT_CHECKPOINT ? "checkpoint" : "shutdown", e.u.event.node,
            e.u.event.reason);
    rdzv_health_note(j->health,
                     e.u.event.kind == RDZV_EVENT_CHECKPOINT ? RDZV_TL_PREEMPT : RDZV_TL_SHUTDOWN,
                     j->round, e.u.event.node, -1, "%s from %s: %s",
                     e.u.event.kind == RDZV_EVENT_CHECKPOINT ? "checkpoint" : "shutdown",
                     e.u.event.node, e.u.event.reason);
    push_to_job(j, &e);
    /* Members between rounds hear it too. */
    member *m;
    LIST_FOREACH(m, &j->pending, plink)
    send_msg(m->c, &e);
    send_simple(c, RDZV_OK, msg->req_id);
}

/* Named and recovered stragglers: the server's log, and the job's nodes
 * (their launchers print it); workers are not told. */
static void straggler_notice(void *ctx, const rdzv_rank_health *r, int named, const char *text) {
    job *j = ctx;
    GB_WARN("job %s: round %u: %s", j->run_id, j->round, text);
    rdzv_msg e = {.type = RDZV_EVENT};
    e.u.event.kind = RDZV_EVENT_STRAGGLER;
    e.u.event.round = j->round;
    member *m = r->node_rank < j->nranks ? j->ranks[r->node_rank] : NULL;
    if (m)
        memcpy(e.u.event.node, m->hostname, sizeof e.u.event.node);
    snprintf(e.u.event.reason, sizeof e.u.event.reason, "%s", text);
    (void)named;
    push_to_nodes(j, &e);
}

/* A launcher's per-rank summaries of its last window; no reply. */
static void handle_stats(conn *c, const rdzv_msg *msg) {
    member *m = c->m;
    if (m == NULL || !m->active || m->j == NULL || m->j->state != JOB_RUNNING)
        return; /* between rounds: stale, dropped */
    job *j = m->j;
    rdzv_health_stats(j->health, m->node_rank, m->hostname, m->base_rank, m->nproc, msg,
                      gb_now_ms(), straggler_notice, j);
}

static void handle_ready(conn *c, const rdzv_msg *msg) {
    switch (msg->type) {
    case RDZV_JOIN:
        handle_join(c, msg);
        return;
    case RDZV_HEARTBEAT:
        return;
    case RDZV_ATTACH:
        handle_attach(c, msg);
        return;
    case RDZV_KV_SET:
    case RDZV_KV_GET:
    case RDZV_KV_WAIT:
    case RDZV_KV_ADD:
    case RDZV_KV_CAS:
    case RDZV_KV_DEL:
    case RDZV_KV_MGET:
        handle_kv(c, msg);
        return;
    case RDZV_EVENT:
        handle_event(c, msg);
        return;
    case RDZV_FAIL:
        if (c->m && c->m->active && (msg->flags & RDZV_FAIL_HANG)) {
            job *j = c->m->j;
            GB_WARN("job %s: rank %u on node %s (node rank %u) hung: %s", j->run_id,
                    msg->u.fail.rank, c->m->hostname, c->m->node_rank, msg->u.fail.message);
            rdzv_health_hang(j->health, j->round, c->m->hostname, msg->u.fail.rank,
                             msg->u.fail.message);
            end_round(j, c->m, RDZV_REASON_HUNG, "node %s (node rank %u): rank %u hung: %s",
                      c->m->hostname, c->m->node_rank, msg->u.fail.rank, msg->u.fail.message);
        } else if (c->m && c->m->active) {
            end_round(c->m->j, c->m, RDZV_REASON_FAILED, "node %s (node rank %u): %s",
                      c->m->hostname, c->m->node_rank, msg->u.fail.message);
        }
        send_simple(c, RDZV_OK, msg->req_id);
        return;
    case RDZV_STATS:
        handle_stats(c, msg);
        return;
    case RDZV_DONE:
        if (c->m && c->m->active && !c->m->done) {
            job *j = c->m->j;
            c->m->done = 1;
            if (++j->ndone == j->nranks) {
                GB_INFO("job %s: every node finished round %u", j->run_id, j->round);
                rdzv_health_note(j->health, RDZV_TL_DONE, j->round, NULL, -1,
                                 "every node finished round %u", j->round);
                rdzv_msg d = {.type = RDZV_JOB_DONE};
                push_to_job(j, &d);
                /* nodes still waiting to join will not be needed */
                member *p;
                LIST_FOREACH(p, &j->pending, plink)
                if (p->c)
                    send_msg(p->c, &d);
                j->state = JOB_DONE;
                c->s->m.jobs_done++;
            }
        }
        send_simple(c, RDZV_OK, msg->req_id);
        return;
    default:
        c->s->m.protocol_errors++;
        send_error(c, msg->req_id, GPL_ERR_PROTOCOL, "message %s is not a request",
                   rdzv_type_name(msg->type));
        conn_close(c, "unexpected message type");
        return;
    }
}

/* Connections that have not finished the handshake are kept in accept order,
 * so the sweep looks only at the ones whose deadline has passed. Called once:
 * when the handshake completes, or when a connection still in it closes. */
static void handshake_done(conn *c) { TAILQ_REMOVE(&c->s->handshaking, c, hlink); }

static void handle_frame(conn *c, const uint8_t *p, size_t n) {
    rdzv_server *s = c->s;
    rdzv_msg msg;
    char why[160];
    if (rdzv_decode(p, n, &msg, why, sizeof why) != GPL_OK) {
        s->m.protocol_errors++;
        send_error(c, 0, GPL_ERR_PROTOCOL, "malformed frame: %s", why);
        conn_close(c, why);
        return;
    }
    switch (c->state) {
    case C_HELLO:
        if (msg.type != RDZV_HELLO || msg.u.hello.magic != RDZV_MAGIC) {
            s->m.protocol_errors++;
            send_error(c, msg.req_id, GPL_ERR_PROTOCOL,
                       "expected HELLO with the gpulaunch magic; is this a gpulaunch client?");
            conn_close(c, "bad hello");
            return;
        }
        if (msg.u.hello.version != RDZV_VERSION) {
            s->m.protocol_errors++;
            send_error(c, msg.req_id, GPL_ERR_PROTOCOL,
                       "protocol version %u is not supported; this server speaks version %u",
                       msg.u.hello.version, RDZV_VERSION);
            conn_close(c, "wrong version");
            return;
        }
        c->state = C_AUTH;
        return;
    case C_AUTH:
        if (msg.type != RDZV_AUTH) {
            s->m.protocol_errors++;
            send_error(c, msg.req_id, GPL_ERR_PROTOCOL, "expected AUTH");
            conn_close(c, "bad auth message");
            return;
        }
        if (s->token && !rdzv_auth_check(s->token, s->o.token_len, c->nonce, msg.u.auth.mac)) {
            s->m.auth_refused++;
            GB_WARN("refused %s: wrong or missing rendezvous token", peer_of(c));
            send_error(c, msg.req_id, GPL_ERR_AUTH,
                       "wrong or missing rendezvous token; give every node the same "
                       "--rdzv-token-file or GPULAUNCH_RDZV_TOKEN");
            conn_close(c, "auth refused");
            return;
        }
        handshake_done(c);
        c->state = C_READY;
        if (!(msg.flags & RDZV_AUTH_QUIET)) {
            rdzv_msg w = {.type = RDZV_WELCOME, .req_id = msg.req_id};
            w.u.welcome.server_epoch = s->epoch;
            send_msg(c, &w);
        }
        return;
    default:
        handle_ready(c, &msg);
        return;
    }
}

/* ---- connections ---- */

static void server_unref(rdzv_server *s) {
    if (--s->open_handles == 0) {
        rdzv_buf_free(&s->scratch);
        rdzv_fanout_free(s->fan);
        free(s->token);
        free(s);
    }
}

static void on_conn_closed(uv_handle_t *h) {
    conn *c = h->data;
    rdzv_server *s = c->s;
    rdzv_buf_free(&c->in);
    free(c);
    server_unref(s);
}

static void conn_close(conn *c, const char *why) {
    if (c->closing)
        return;
    c->closing = 1;
    rdzv_server *s = c->s;
    GB_DEBUG("closing %s: %s", peer_of(c), why);
    if (c->state != C_READY)
        handshake_done(c);
    waiter *w;
    while ((w = LIST_FIRST(&c->waiters)) != NULL)
        waiter_free(w);
    job *aj = c->aj;
    if (aj) {
        LIST_REMOVE(c, alink);
        c->aj = NULL;
    }
    member *m = c->m;
    if (m) {
        job *j = m->j;
        c->m = NULL;
        if (j) {
            member_unpend(m);
            survivor_in(m); /* gone: the re-forming round stops waiting for it */
            if (m->active && j->state == JOB_RUNNING && !m->done) {
                j->ranks[m->node_rank] = NULL;
                end_round(j, m, RDZV_REASON_DISCONNECT,
                          "node %s (%s, node rank %u) lost its connection to the rendezvous (%s)",
                          m->hostname, m->addr, m->node_rank, why);
            } else if (m->active && j->ranks && m->node_rank < j->nranks &&
                       j->ranks[m->node_rank] == m) {
                j->ranks[m->node_rank] = NULL;
            }
            j->nmembers_total--;
            job_maybe_free(j);
        }
        free(m);
    }
    if (aj)
        job_maybe_free(aj);
    LIST_REMOVE(c, link);
    s->m.connections_open--;
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    conn *c = h->data;
    rdzv_server *s = c->s;
    if (s->readbuf_busy) {
        buf->base = NULL;
        buf->len = 0;
        return;
    }
    s->readbuf_busy = 1;
    buf->base = (char *)s->readbuf;
    buf->len = sizeof s->readbuf;
}

/* Parses the whole frames at p; returns the bytes consumed. */
static size_t parse_frames(conn *c, const uint8_t *p, size_t n) {
    size_t off = 0;
    while (!c->closing) {
        size_t flen;
        gpl_result_t rc = rdzv_frame_peek(p + off, n - off, &flen);
        if (rc == GPL_ERR_STATE)
            break;
        if (rc != GPL_OK) {
            c->s->m.protocol_errors++;
            send_error(c, 0, rc,
                       rc == GPL_ERR_LIMIT ? "frame over the %u-byte limit"
                                           : "frame shorter than its header (limit %u)",
                       (unsigned)RDZV_MAX_FRAME);
            conn_close(c, "bad frame length");
            break;
        }
        handle_frame(c, p + off, flen);
        off += flen;
    }
    return off;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    conn *c = st->data;
    rdzv_server *s = c->s;
    if (buf->base == (char *)s->readbuf)
        s->readbuf_busy = 0;
    if (nread < 0) {
        conn_close(c, nread == UV_EOF ? "peer closed the connection" : uv_strerror((int)nread));
        return;
    }
    if (nread == 0 || c->closing)
        return;
    c->last_rx_ms = gb_now_ms();
    const uint8_t *p = (const uint8_t *)buf->base;
    size_t n = (size_t)nread;
    if (c->in.len == 0) {
        size_t used = parse_frames(c, p, n);
        if (used < n && !c->closing && rdzv_buf_append(&c->in, p + used, n - used) != GPL_OK)
            conn_close(c, "input buffer over its limit");
        return;
    }
    if (rdzv_buf_append(&c->in, p, n) != GPL_OK) {
        conn_close(c, "input buffer over its limit");
        return;
    }
    size_t used = parse_frames(c, c->in.data, c->in.len);
    if (!c->closing) {
        rdzv_buf_consume(&c->in, used);
        if (c->in.len == 0) {
            /* Give back the memory of a large frame once it is handled. */
            rdzv_buf_free(&c->in);
            rdzv_buf_init(&c->in, CONN_IN_MAX);
        }
    }
}

static void on_connection(uv_stream_t *ls, int status) {
    rdzv_server *s = ls->data;
    if (status < 0) {
        GB_WARN("accept failed: %s", uv_strerror(status));
        return;
    }
    conn *c = calloc(1, sizeof *c);
    if (c == NULL)
        return;
    c->s = s;
    uv_tcp_init(s->loop, &c->tcp);
    c->tcp.data = c;
    s->open_handles++;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) != 0) {
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
        return;
    }
    rdzv_buf_init(&c->in, CONN_IN_MAX);
    LIST_INIT(&c->waiters);
    c->accepted_ms = c->last_rx_ms = gb_now_ms();
    LIST_INSERT_HEAD(&s->conns, c, link);
    TAILQ_INSERT_TAIL(&s->handshaking, c, hlink);
    s->m.connections_total++;
    s->m.connections_open++;
    if (s->m.connections_open > s->o.max_connections || s->closing) {
        send_error(c, 0, GPL_ERR_LIMIT, "the server holds its maximum of %u connections",
                   s->o.max_connections);
        conn_close(c, "connection limit");
        return;
    }
    /* TCP_NODELAY is inherited from the listener (set at start) */
    if (rdzv_auth_nonce(c->nonce) != 0) {
        conn_close(c, "no random bytes for the challenge");
        return;
    }
    /* The challenge goes out at once: the client answers with HELLO and AUTH
     * (and may add its JOIN) in one write, 1.5 round trips in all. */
    rdzv_msg ch = {.type = RDZV_CHALLENGE};
    memcpy(ch.u.challenge.nonce, c->nonce, RDZV_NONCE_LEN);
    ch.u.challenge.auth_required = s->token != NULL;
    ch.u.challenge.version = RDZV_VERSION;
    ch.flags = RDZV_CHALLENGE_HEALTH;
    send_msg(c, &ch);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

/* ---- timers ---- */

static void sweep_job(job *j, uint64_t now, int hb_scan) {
    if (j->state == JOB_GATHERING) {
        maybe_complete(j, now);
        if (j->state != JOB_GATHERING || now < j->pending_due_ms)
            return; /* no waiting node is due for a progress push or its timeout */
        uint64_t due = UINT64_MAX;
        /* the missing-node text is O(nodes): built at most once per sweep */
        char missing[RDZV_MAX_MSG + 1];
        int have_missing = 0;
        member *m = LIST_FIRST(&j->pending), *n;
        for (; m; m = n) {
            n = LIST_NEXT(m, plink);
            uint64_t waited = now - m->joined_ms;
            int timed_out = waited >= j->join_timeout_ms;
            if (!timed_out && now < m->next_progress_ms) {
                if (pending_due(j, m) < due)
                    due = pending_due(j, m);
                continue;
            }
            if (!have_missing) {
                describe_missing(j, now, missing, sizeof missing);
                have_missing = 1;
            }
            if (timed_out) {
                send_error(m->c, m->join_req, GPL_ERR_TIMEOUT,
                           "rendezvous of job %s timed out after %.1f s: %s; start the "
                           "missing nodes, or raise --rdzv-conf join_timeout",
                           j->run_id, (double)waited / 1000.0, missing);
                member_unpend(m);
                continue;
            }
            m->next_progress_ms = now + PROGRESS_MS;
            if (pending_due(j, m) < due)
                due = pending_due(j, m);
            rdzv_msg p = {.type = RDZV_PROGRESS, .req_id = 0};
            p.u.progress.joined = j->npending;
            p.u.progress.expected = j->is_static ? j->max_nodes : j->min_nodes;
            p.u.progress.waited_ms = (uint32_t)waited;
            memcpy(p.u.progress.missing, missing, sizeof p.u.progress.missing);
            send_msg(m->c, &p);
        }
        j->pending_due_ms = due;
        return;
    }
    if (j->state != JOB_RUNNING)
        return;
#ifdef GPULAUNCH_BREAK_HEARTBEATS
    hb_scan = 0; /* the broken build of scripts/fault_selftest.sh: scenario 2 must fail */
#endif
    if (hb_scan) {
        for (uint32_t i = 0; i < j->nranks && j->state == JOB_RUNNING; i++) {
            member *m = j->ranks[i];
            if (m == NULL || m->done || m->c == NULL)
                continue;
            if (now - m->c->last_rx_ms > j->hb_timeout_ms) {
                conn *c = m->c;
                end_round(j, m, RDZV_REASON_HEARTBEAT,
                          "node %s (%s, node rank %u) sent no heartbeat for %.1f s (timeout "
                          "%.1f s)",
                          m->hostname, m->addr, m->node_rank,
                          (double)(now - c->last_rx_ms) / 1000.0, j->hb_timeout_ms / 1000.0);
                conn_close(c, "heartbeat timeout");
                return;
            }
        }
        if (j->resume_deadline_ms && now > j->resume_deadline_ms) {
            j->resume_deadline_ms = 0;
            for (uint32_t i = 0; i < j->nranks; i++)
                if (j->ranks[i] == NULL) {
                    end_round(j, NULL, RDZV_REASON_DISCONNECT,
                              "node rank %u did not reconnect after the rendezvous restarted", i);
                    return;
                }
        }
    }
    waiter *w = LIST_FIRST(&j->waiters), *n;
    for (; w; w = n) {
        n = LIST_NEXT(w, jlink);
        if (now >= w->deadline_ms) {
            rdzv_bytes first = {NULL, 0};
            uint32_t miss = waiter_missing(j, w, &first);
            send_error(w->c, w->req, GPL_ERR_TIMEOUT,
                       "waited %u key(s) in job %s: %u never set (first: '%.*s')", w->nkeys,
                       j->run_id, miss, (int)(first.len > 200 ? 200 : first.len),
                       first.p ? (const char *)first.p : "");
            waiter_free(w);
        }
    }
}

/* A survivor of a failed round is in no round while the next one re-forms, so
 * the running rounds' heartbeat check does not see it: one whose heartbeats
 * stop (its host went down too, or its client moved to a new connection) is
 * closed, and the round stops waiting for it. Launchers beat between rounds. */
static void sweep_survivors(rdzv_server *s, uint64_t now) {
    conn *c = LIST_FIRST(&s->conns), *cn;
    for (; c; c = cn) {
        cn = LIST_NEXT(c, link);
        member *m = c->m;
        job *j = m ? m->j : NULL;
        if (j == NULL || !j->reforming || m->awaited_round != j->reform_round ||
            now - c->last_rx_ms <= j->hb_timeout_ms)
            continue;
        GB_WARN("job %s: %s (%s), a survivor of round %u, sent no heartbeat for %.1f s while the "
                "next round re-forms: not waited for",
                j->run_id, m->hostname, m->addr, j->reform_round,
                (double)(now - c->last_rx_ms) / 1000.0);
        conn_close(c, "no heartbeat while the round re-forms");
    }
}

static void on_sweep(uv_timer_t *t) {
    rdzv_server *s = t->data;
    uint64_t now = gb_now_ms();
    int hb = now - s->last_hb_scan_ms >= HB_SCAN_MS;
    if (hb)
        s->last_hb_scan_ms = now;
    conn *c;
    while ((c = TAILQ_FIRST(&s->handshaking)) != NULL &&
           now - c->accepted_ms > s->o.handshake_timeout_ms) {
        GB_INFO("closing %s: no handshake within %u ms", peer_of(c), s->o.handshake_timeout_ms);
        conn_close(c, "handshake timeout");
    }
    if (hb)
        sweep_survivors(s, now);
    job *j = LIST_FIRST(&s->jobs), *jn;
    for (; j; j = jn) {
        jn = LIST_NEXT(j, link);
        sweep_job(j, now, hb);
    }
}

/* ---- lifecycle ---- */

static void on_handle_closed(uv_handle_t *h) { server_unref(h->data); }

gpl_result_t rdzv_server_start(uv_loop_t *loop, const rdzv_server_options *opts, rdzv_server **out,
                               char *err, size_t errlen) {
    *out = NULL;
    if (opts == NULL || opts->version != RDZV_SERVER_OPTIONS_VERSION) {
        snprintf(err, errlen,
                 "rdzv_server_options.version must be %d (use "
                 "RDZV_SERVER_OPTIONS_INIT)",
                 RDZV_SERVER_OPTIONS_VERSION);
        return GPL_ERR_INVALID_ARG;
    }
    rdzv_server *s = calloc(1, sizeof *s);
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return GPL_ERR_NOMEM;
    }
    s->loop = loop;
    s->o = *opts;
    LIST_INIT(&s->conns);
    TAILQ_INIT(&s->handshaking);
    LIST_INIT(&s->jobs);
    rdzv_buf_init(&s->scratch, RDZV_MAX_FRAME + 4);
    if (opts->token && opts->token_len) {
        s->token = malloc(opts->token_len);
        if (s->token == NULL) {
            free(s);
            snprintf(err, errlen, "out of memory");
            return GPL_ERR_NOMEM;
        }
        memcpy(s->token, opts->token, opts->token_len);
    } else if (opts->listen_addr == NULL || strncmp(opts->listen_addr, "127.", 4) != 0) {
        GB_WARN("no rendezvous token: any client that reaches this port can join jobs; "
                "set --token-file or GPULAUNCH_RDZV_TOKEN");
    }
    uint8_t e[RDZV_NONCE_LEN];
    rdzv_auth_nonce(e);
    memcpy(&s->epoch, e, sizeof s->epoch);

    const char *addr = opts->listen_addr ? opts->listen_addr : "0.0.0.0";
    struct sockaddr_storage sa;
    int r = strchr(addr, ':') ? uv_ip6_addr(addr, opts->listen_port, (struct sockaddr_in6 *)&sa)
                              : uv_ip4_addr(addr, opts->listen_port, (struct sockaddr_in *)&sa);
    if (r != 0) {
        snprintf(err, errlen, "listen address '%s' is not an IP address: %s", addr, uv_strerror(r));
        free(s->token);
        free(s);
        return GPL_ERR_INVALID_ARG;
    }
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    s->open_handles = 1;
    r = uv_tcp_bind(&s->listener, (struct sockaddr *)&sa, 0);
    if (r == 0)
        uv_tcp_nodelay(&s->listener, 1); /* accepted connections inherit it */
    if (r == 0)
        r = uv_listen((uv_stream_t *)&s->listener, 4096, on_connection);
    if (r != 0) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s%s", addr, opts->listen_port,
                 uv_strerror(r),
                 r == UV_EADDRINUSE ? " (another process holds this port; pick another with "
                                      "--listen or stop it)"
                                    : "");
        s->closing = 1;
        uv_close((uv_handle_t *)&s->listener, on_handle_closed);
        return r == UV_EADDRINUSE ? GPL_ERR_EXISTS : GPL_ERR_SYSTEM;
    }
    struct sockaddr_storage bound;
    int blen = sizeof bound;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &blen);
    s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    s->fan = rdzv_fanout_new(); /* NULL: every push from this thread */
    uv_timer_init(loop, &s->sweep);
    s->sweep.data = s;
    s->open_handles++;
    uv_timer_start(&s->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
    GB_INFO("rendezvous listening on %s:%d", addr, s->port);
    *out = s;
    return GPL_OK;
}

int rdzv_server_port(const rdzv_server *s) { return s->port; }

void rdzv_server_close(rdzv_server *s) {
    if (s == NULL)
        return;
    s->closing = 1;
    conn *c;
    while ((c = LIST_FIRST(&s->conns)) != NULL)
        conn_close(c, "server shutting down");
    job *j;
    while ((j = LIST_FIRST(&s->jobs)) != NULL)
        job_free(j);
    if (s->http_close)
        s->http_close(s);
    uv_timer_stop(&s->sweep);
    uv_close((uv_handle_t *)&s->sweep, on_handle_closed);
    uv_close((uv_handle_t *)&s->listener, on_handle_closed);
}
