/* Round formation of one job (rdzv_round.h): joins, the last call, survivors
 * of a failed round, scale-up, failures, static ranks, the join timeout and
 * the end of the job, as a state machine with the time as an argument. */
#include "rdzv_round.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb_log.h"

#define GB_COMPONENT "rdzv"

/* ---- decisions ---- */

static int out_own(rdzv_round_out *o, void *p) {
    if (o->nowned == o->owned_cap) {
        size_t cap = o->owned_cap ? 2 * o->owned_cap : 8;
        void **n = realloc(o->owned, cap * sizeof *n);
        if (n == NULL)
            return -1;
        o->owned = n;
        o->owned_cap = cap;
    }
    o->owned[o->nowned++] = p;
    return 0;
}

/* A copy of s that lives until the reset ("" without memory). */
static const char *out_str(rdzv_round_out *o, const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p == NULL || out_own(o, p) != 0) {
        free(p);
        return "";
    }
    memcpy(p, s, n);
    return p;
}

static rdzv_decision *out_add(rdzv_round_out *o, rdzv_decision_kind kind) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 8;
        rdzv_decision *n = realloc(o->d, cap * sizeof *n);
        if (n == NULL) {
            o->lost++;
            GB_ERROR("out of memory recording a round decision (%d lost)", o->lost);
            return NULL;
        }
        o->d = n;
        o->cap = cap;
    }
    rdzv_decision *d = &o->d[o->n++];
    memset(d, 0, sizeof *d);
    d->kind = kind;
    d->node_rank = UINT32_MAX;
    d->host = d->text = "";
    return d;
}

void rdzv_round_out_reset(rdzv_round_out *o) {
    for (size_t i = 0; i < o->nowned; i++)
        free(o->owned[i]);
    o->nowned = 0;
    o->n = 0;
    o->lost = 0;
}

void rdzv_round_out_free(rdzv_round_out *o) {
    rdzv_round_out_reset(o);
    free(o->d);
    free(o->owned);
    memset(o, 0, sizeof *o);
}

/* ---- the job ---- */

gpl_result_t rdzv_round_init(rdzv_round *r, const rdzv_msg *join, uint32_t hb_timeout_ms) {
    const __typeof__(join->u.join) *jn = &join->u.join;
    memset(r, 0, sizeof *r);
    memcpy(r->run_id, jn->run_id, sizeof r->run_id);
    memcpy(r->first_host, jn->hostname, sizeof r->first_host);
    r->min_nodes = jn->min_nodes ? jn->min_nodes : 1;
    r->max_nodes = jn->max_nodes ? jn->max_nodes : r->min_nodes;
    r->last_call_ms = jn->last_call_ms;
    r->join_timeout_ms = jn->join_timeout_ms ? jn->join_timeout_ms : RDZV_DEFAULT_JOIN_TIMEOUT_MS;
    r->hb_timeout_ms = jn->heartbeat_timeout_ms ? jn->heartbeat_timeout_ms : hb_timeout_ms;
    r->is_static = jn->static_rank >= 0;
    LIST_INIT(&r->pending);
    if (r->is_static) {
        r->static_slots = calloc(r->max_nodes ? r->max_nodes : 1, sizeof *r->static_slots);
        if (r->static_slots == NULL)
            return GPL_ERR_NOMEM;
    }
    return GPL_OK;
}

void rdzv_round_free(rdzv_round *r) {
    rdzv_rmember *m;
    while ((m = LIST_FIRST(&r->pending)) != NULL) {
        LIST_REMOVE(m, plink);
        m->pending = 0;
    }
    free(r->static_slots);
    free(r->ranks);
    r->static_slots = NULL;
    r->ranks = NULL;
    r->nranks = r->npending = 0;
}

const char *rdzv_round_state_name(int state) {
    return state == RDZV_R_RUNNING ? "running" : state == RDZV_R_DONE ? "done" : "gathering";
}

int rdzv_round_awaits(const rdzv_rmember *m) {
    const rdzv_round *r = m->r;
    return r && r->reforming && m->awaited_round == r->reform_round;
}

/* When a waiting node next needs the tick: a progress note or its join timeout. */
static uint64_t pending_due(const rdzv_round *r, const rdzv_rmember *m) {
    uint64_t timeout = m->joined_ms + r->join_timeout_ms;
    return m->next_progress_ms < timeout ? m->next_progress_ms : timeout;
}

static void member_unpend(rdzv_rmember *m) {
    if (!m->pending)
        return;
    rdzv_round *r = m->r;
    LIST_REMOVE(m, plink);
    m->pending = 0;
    r->npending--;
    if (r->is_static && m->static_rank >= 0 && (uint32_t)m->static_rank < r->max_nodes &&
        r->static_slots[m->static_rank] == m)
        r->static_slots[m->static_rank] = NULL;
    if (r->npending < r->min_nodes)
        r->min_reached_ms = 0;
}

/* A member of the failed round is back (or gone): one survivor fewer to wait for. */
static void survivor_in(rdzv_rmember *m) {
    rdzv_round *r = m->r;
    if (r && m->awaited_round && m->awaited_round == r->reform_round && r->reform_left)
        r->reform_left--;
    m->awaited_round = 0;
}

static void end_round(rdzv_round *r, rdzv_rmember *culprit, uint32_t reason, uint64_t now,
                      rdzv_round_out *out, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static void end_round(rdzv_round *r, rdzv_rmember *culprit, uint32_t reason, uint64_t now,
                      rdzv_round_out *out, const char *fmt, ...) {
    if (r->state != RDZV_R_RUNNING)
        return;
    char text[RDZV_MAX_MSG + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    GB_WARN("job %s: round %u over: %s", r->run_id, r->round, text);
    rdzv_decision *d = out_add(out, RDZV_DO_ROUND_OVER);
    /* The ended round's members are told from its rank table: it lives in
     * out until the caller has acted. */
    int owned = out_own(out, r->ranks) == 0;
    if (d) {
        d->round = r->round;
        d->reason = reason;
        if (culprit) {
            d->node_rank = culprit->node_rank;
            d->host = out_str(out, culprit->hostname);
        }
        d->text = out_str(out, text);
        d->members = owned ? r->ranks : NULL;
        d->nmembers = owned ? r->nranks : 0;
    }
    /* After a failure the survivors re-join at once: the next round starts when
     * they all have, without the last call (a late node comes in by scale-up).
     * The culprit is no survivor unless only its workers failed. A scale-up,
     * or survivors fewer than the minimum, gather as a first round does. */
    int reform = reason != RDZV_REASON_SCALE_UP || r->warm_end;
    r->warm_end = 0;
    uint32_t survivors = 0;
    for (uint32_t i = 0; i < r->nranks; i++) {
        rdzv_rmember *x = r->ranks[i];
        if (x) {
            x->active = 0;
            x->done = 0;
            x->prev_rank = x->node_rank;
            if (reform &&
                (x != culprit || reason == RDZV_REASON_FAILED || reason == RDZV_REASON_HUNG)) {
                x->awaited_round = r->round;
                survivors++;
            }
        }
    }
    r->reforming = reform && survivors > 0 && survivors + r->npending >= r->min_nodes;
    r->reform_round = r->round;
    r->reform_left = survivors;
    r->reform_deadline_ms = now + r->last_call_ms;
    snprintf(r->reform_why, sizeof r->reform_why, "%s", culprit ? culprit->hostname : "a node");
    if (!owned) { /* no memory to keep it: no decision may point at it */
        for (size_t i = 0; i < out->n; i++)
            if (out->d[i].members == r->ranks) {
                out->d[i].members = NULL;
                out->d[i].nmembers = 0;
            }
        free(r->ranks);
    }
    r->ranks = NULL;
    r->nranks = r->nactive = r->ndone = 0;
    r->resume_deadline_ms = 0;
    r->state = RDZV_R_GATHERING;
    r->min_reached_ms = r->npending >= r->min_nodes ? now : 0;
}

static int cmp_join_order(const void *a, const void *b) {
    const rdzv_rmember *x = *(rdzv_rmember *const *)a, *y = *(rdzv_rmember *const *)b;
    return x->join_seq < y->join_seq ? -1 : x->join_seq > y->join_seq;
}

/* The round is complete: assign ranks, in one decision for every member. */
static void complete_round(rdzv_round *r, rdzv_round_out *out) {
    uint32_t n = r->npending;
    if (n > r->max_nodes)
        n = r->max_nodes;
    rdzv_rmember **ranks = calloc(n ? n : 1, sizeof *ranks);
    rdzv_rmember **order = calloc(r->npending ? r->npending : 1, sizeof *order);
    if (ranks == NULL || order == NULL) {
        free(ranks);
        free(order);
        GB_ERROR("job %s: out of memory completing the round", r->run_id);
        return;
    }
    uint32_t k = 0;
    rdzv_rmember *m;
    LIST_FOREACH(m, &r->pending, plink)
    order[k++] = m;
    qsort(order, k, sizeof *order, cmp_join_order);
    if (r->is_static) {
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
    r->reforming = 0;
    r->reform_left = 0;
    r->round++;
    r->ranks = ranks;
    r->nranks = n;
    r->nactive = n;
    r->ndone = 0;
    r->state = RDZV_R_RUNNING;
    uint32_t base = 0;
    for (uint32_t i = 0; i < n; i++) {
        m = ranks[i];
        member_unpend(m);
        m->active = 1;
        m->done = 0;
        m->warm = 0;
        m->node_rank = i;
        m->base_rank = base;
        base += m->nproc;
    }
    rdzv_decision *d = out_add(out, RDZV_DO_ASSIGN);
    if (d) {
        d->round = r->round;
        d->world_size = base;
        d->members = ranks;
        d->nmembers = n;
    }
    GB_INFO("job %s: round %u assigned: %u nodes, world size %u, master %s:%u", r->run_id, r->round,
            n, base, n ? ranks[0]->addr : "", n ? ranks[0]->master_port : 0);
    /* Nodes still pending (over max) are told they wait for the next round. */
    if (r->npending && (d = out_add(out, RDZV_DO_WAITING)) != NULL) {
        d->count = r->npending;
        d->total = n;
        d->members = ranks;
        d->nmembers = n;
    }
}

static void maybe_complete(rdzv_round *r, uint64_t now, rdzv_round_out *out) {
    if (r->state != RDZV_R_GATHERING)
        return;
    if (r->is_static) {
        if (r->npending < r->max_nodes)
            return;
        for (uint32_t i = 0; i < r->max_nodes; i++)
            if (r->static_slots[i] == NULL)
                return;
        complete_round(r, out);
        return;
    }
    if (r->npending >= r->max_nodes) {
        complete_round(r, out);
        return;
    }
    if (r->reforming && r->npending + r->reform_left < r->min_nodes)
        r->reforming = 0; /* survivors died too: gather as a first round does */
    if (r->npending >= r->min_nodes) {
        if (r->min_reached_ms == 0)
            r->min_reached_ms = now;
        if (r->reforming ? r->reform_left == 0 || now >= r->reform_deadline_ms
                         : now - r->min_reached_ms >= r->last_call_ms)
            complete_round(r, out);
    }
}

void rdzv_round_describe(const rdzv_round *r, uint64_t now, char *out, size_t len) {
    out[0] = '\0';
    if (!r->is_static) {
        if (r->reforming && now < r->reform_deadline_ms) {
            uint64_t left = r->reform_deadline_ms - now;
            snprintf(out, len,
                     "%u node(s) joined; round %u ended (%s): waiting for %u more of its "
                     "survivors to re-join, at most %.0f s more",
                     r->npending, r->reform_round, r->reform_why, r->reform_left, left / 1000.0);
        } else if (r->npending < r->min_nodes) {
            snprintf(out, len, "%u node(s) joined; %u more needed for the minimum of %u",
                     r->npending, r->min_nodes - r->npending, r->min_nodes);
        } else {
            uint64_t end = r->min_reached_ms + r->last_call_ms;
            snprintf(out, len,
                     "%u node(s) joined, the minimum is %u; last call: the round starts in %.0f s "
                     "and takes up to %u more node(s)",
                     r->npending, r->min_nodes, end > now ? (end - now) / 1000.0 : 0.0,
                     r->max_nodes > r->npending ? r->max_nodes - r->npending : 0);
        }
        return;
    }
    int w = snprintf(out, len, "%u of %u nodes joined; missing ", r->npending, r->max_nodes);
    size_t off = w > 0 ? (size_t)w : 0;
    uint32_t shown = 0, missing = 0;
    for (uint32_t i = 0; i < r->max_nodes; i++) {
        if (r->static_slots[i])
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

/* ---- events ---- */

/* The member of r waiting for its round with the same launcher (instance)
 * on another connection: the one a reconnect left behind, or NULL. */
static rdzv_rmember *pending_twin(rdzv_round *r, const rdzv_rmember *m, const char *instance) {
    rdzv_rmember *o;
    if (instance[0] == '\0')
        return NULL;
    LIST_FOREACH(o, &r->pending, plink) {
        if (o != m && strcmp(o->instance, instance) == 0)
            return o;
    }
    return NULL;
}

/* Whether msg may join r, before anything changes: GPL_OK or the refusal. */
static gpl_result_t join_check(rdzv_round *r, const rdzv_rmember *m, const rdzv_msg *msg,
                               rdzv_rmember **twin_out, char *err, size_t errlen) {
    const __typeof__(msg->u.join) *jn = &msg->u.join;
    *twin_out = NULL;
    if (m->r && (m->pending || m->active)) {
        snprintf(err, errlen, "this connection already joined job %s; rejoin after the round ends",
                 m->r->run_id);
        return GPL_ERR_STATE;
    }
    int resume = (msg->flags & RDZV_JOIN_RESUME) != 0;
    /* looked for only when the launcher says it joined before: a walk of the pending list */
    rdzv_rmember *twin =
        resume || !(msg->flags & RDZV_JOIN_AGAIN) ? NULL : pending_twin(r, m, jn->instance);
    if (twin && twin->join_req > msg->req_id) {
        /* sent before the JOIN that waits: it crossed a slow link on a connection its
         * launcher has given up (nobody reads this) */
        snprintf(err, errlen,
                 "node %s (instance %s) already waits in job %s with a later join on another "
                 "connection: this connection's join is stale",
                 jn->hostname, jn->instance, r->run_id);
        return GPL_ERR_STATE;
    }
    if (!resume && ((jn->min_nodes && jn->min_nodes != r->min_nodes) ||
                    (jn->max_nodes && jn->max_nodes != r->max_nodes) ||
                    (jn->static_rank >= 0) != r->is_static)) {
        snprintf(err, errlen,
                 "node %s asks job %s for %u:%u nodes (%s ranks) but node %s started it with "
                 "%u:%u nodes (%s ranks); give every node the same --nnodes and mode",
                 jn->hostname, r->run_id, jn->min_nodes, jn->max_nodes,
                 jn->static_rank >= 0 ? "static" : "elastic", r->first_host, r->min_nodes,
                 r->max_nodes, r->is_static ? "static" : "elastic");
        return GPL_ERR_CONFIG;
    }
    if (r->is_static && !resume && (uint32_t)jn->static_rank >= r->max_nodes) {
        snprintf(err, errlen, "node %s has node rank %d but job %s has %u nodes (ranks 0..%u)",
                 jn->hostname, jn->static_rank, r->run_id, r->max_nodes, r->max_nodes - 1);
        return GPL_ERR_INVALID_ARG;
    }
    if (r->is_static && !resume && r->static_slots[jn->static_rank]) {
        const rdzv_rmember *o = r->static_slots[jn->static_rank];
        if (strcmp(o->instance, jn->instance) != 0) {
            snprintf(err, errlen,
                     "duplicate node rank %d in job %s: %s (%s, instance %s) already holds "
                     "it, refused %s (%s, instance %s); give each node its own --node-rank",
                     jn->static_rank, r->run_id, o->hostname, o->addr, o->instance, jn->hostname,
                     jn->addr, jn->instance);
            return GPL_ERR_EXISTS;
        }
        if (twin == NULL) /* the same launcher on a new connection, found without a walk */
            twin = r->static_slots[jn->static_rank];
    }
    if (resume && (jn->nnodes == 0 || jn->nnodes > r->max_nodes)) {
        snprintf(err, errlen, "node %s re-registers a round of %u nodes in job %s of at most %u",
                 jn->hostname, jn->nnodes, r->run_id, r->max_nodes);
        return GPL_ERR_INVALID_ARG;
    }
    if (resume) {
        int fresh = r->state == RDZV_R_GATHERING && r->round == 0 && r->npending == 0;
        uint32_t nranks = fresh ? jn->nnodes : r->nranks;
        if ((!fresh && (r->state != RDZV_R_RUNNING || r->round != jn->round)) ||
            jn->node_rank >= nranks ||
            (!fresh && r->ranks[jn->node_rank] && r->ranks[jn->node_rank] != m)) {
            snprintf(err, errlen,
                     "round %u of job %s cannot be resumed (the server is at round %u); rejoin",
                     jn->round, r->run_id, fresh ? jn->round : r->round);
            return GPL_ERR_ROUND_OVER;
        }
    }
    *twin_out = twin; /* a pending one of the same launcher: stale, the caller unpends it */
    return GPL_OK;
}

/* A node re-registers the round it is running after a server restart. */
static gpl_result_t join_resume(rdzv_round *r, rdzv_rmember *m, const rdzv_msg *msg, uint64_t now,
                                rdzv_round_out *out, char *err, size_t errlen) {
    const __typeof__(msg->u.join) *jn = &msg->u.join;
    if (r->state == RDZV_R_GATHERING && r->round == 0 && r->npending == 0) {
        rdzv_rmember **ranks = calloc(jn->nnodes ? jn->nnodes : 1, sizeof *ranks);
        if (ranks == NULL) {
            snprintf(err, errlen, "out of memory");
            return GPL_ERR_NOMEM;
        }
        r->round = jn->round;
        r->state = RDZV_R_RUNNING;
        r->nranks = jn->nnodes;
        r->ranks = ranks;
        r->nactive = 0;
        r->resume_deadline_ms = now + 2ull * r->hb_timeout_ms;
    }
    r->ranks[jn->node_rank] = m;
    r->nactive++;
    m->active = 1;
    m->node_rank = jn->node_rank;
    m->base_rank = jn->base_rank;
    rdzv_decision *d = out_add(out, RDZV_DO_RESUMED);
    if (d) {
        d->m = m;
        d->round = jn->round;
        d->node_rank = jn->node_rank;
        d->total = jn->nnodes;
        d->world_size = jn->world_size;
    }
    GB_INFO("job %s: %s resumed node rank %u of round %u", r->run_id, m->hostname, m->node_rank,
            r->round);
    return GPL_OK;
}

/* The running round may take in a waiting node by ending (scale-up). */
static int may_grow(const rdzv_round *r) {
    return r->state == RDZV_R_RUNNING && !r->is_static && r->nranks < r->max_nodes && r->ndone == 0;
}

/* Every node of the running round said its workers re-form in place. */
static int all_live(const rdzv_round *r) {
    for (uint32_t i = 0; i < r->nranks; i++)
        if (r->ranks[i] && !r->ranks[i]->done && !r->ranks[i]->live)
            return 0;
    return r->nactive > 0;
}

void rdzv_round_node(rdzv_rmember *m, uint32_t flags, uint64_t now, rdzv_round_out *out) {
    rdzv_round *r = m->r;
    m->live = (flags & RDZV_NODE_LIVE) != 0;
    if (r == NULL)
        return;
    if ((flags & RDZV_NODE_READY) && m->pending && m->warm == 1)
        m->warm = 2;
    if (!may_grow(r))
        return;
    rdzv_rmember *x, *ready = NULL;
    uint32_t starting = 0;
    LIST_FOREACH(x, &r->pending, plink) {
        starting += x->warm == 1;
        if (x->warm == 2)
            ready = x;
    }
    if (starting == 0 && ready) {
        r->warm_end = 1;
        end_round(r, NULL, RDZV_REASON_SCALE_UP, now, out,
                  "node %s (%s) started its workers, and job %s has room for %u more node(s): "
                  "its nodes re-form in place to take it in",
                  ready->hostname, ready->addr, r->run_id, r->max_nodes - r->nranks);
    } else if (starting && !all_live(r))
        end_round(r, NULL, RDZV_REASON_SCALE_UP, now, out,
                  "node %s (%s) no longer re-forms in place, and %u node(s) wait to join job %s: "
                  "re-rendezvous to take them in",
                  m->hostname, m->addr, r->npending, r->run_id);
}

gpl_result_t rdzv_round_join(rdzv_round *r, rdzv_rmember *m, const rdzv_msg *msg, uint64_t now,
                             rdzv_round_out *out, char *err, size_t errlen) {
    const __typeof__(msg->u.join) *jn = &msg->u.join;
    rdzv_rmember *twin;
    gpl_result_t rc = join_check(r, m, msg, &twin, err, errlen);
    if (rc != GPL_OK)
        return rc;
    if (twin) { /* the same launcher joined again on a new connection: the old one is stale */
        GB_INFO("job %s: %s joined again on a new connection; its join on the old one is dropped",
                r->run_id, jn->hostname);
        member_unpend(twin);
    }
    if (m->r != r) {
        if (m->r)
            rdzv_round_leave(m, "it joined another job", now, out);
        m->r = r;
        m->prev_rank = -1;
        r->nmembers++;
    }
    memcpy(m->hostname, jn->hostname, sizeof m->hostname);
    memcpy(m->addr, jn->addr, sizeof m->addr);
    memcpy(m->instance, jn->instance, sizeof m->instance);
    m->master_port = jn->master_port;
    m->nproc = jn->nproc;
    m->ngpus = jn->ngpus;
    m->static_rank = jn->static_rank;
    m->join_req = msg->req_id;
    m->joined_ms = now;
    m->join_seq = ++r->join_seq;
    m->next_progress_ms = now + RDZV_PROGRESS_AFTER_MS;
    if (pending_due(r, m) < r->pending_due_ms)
        r->pending_due_ms = pending_due(r, m);
    if (msg->flags & RDZV_JOIN_RESUME)
        return join_resume(r, m, msg, now, out, err, errlen);

    if (r->state == RDZV_R_DONE) {
        /* A finished run id used again starts over: the finished round's
         * nodes are in no round any more. */
        for (uint32_t i = 0; i < r->nranks; i++)
            if (r->ranks[i])
                r->ranks[i]->active = r->ranks[i]->done = 0;
        free(r->ranks);
        r->ranks = NULL;
        r->nranks = r->nactive = r->ndone = 0;
        r->state = RDZV_R_GATHERING;
    }
    survivor_in(m);
    m->pending = 1;
    LIST_INSERT_HEAD(&r->pending, m, plink);
    r->npending++;
    if (r->is_static)
        r->static_slots[jn->static_rank] = m;
    GB_INFO("job %s: %s (%s) joined, %u pending", r->run_id, m->hostname, m->addr, r->npending);
    if (r->state == RDZV_R_RUNNING) {
        rdzv_decision *d = out_add(out, RDZV_DO_WAITING);
        if (d) {
            d->count = r->npending;
            d->total = r->nranks;
            d->members = r->ranks;
            d->nmembers = r->nranks;
        }
        /* An elastic job grows as torchelastic's do: a node waiting while the
         * round has room ends the round, and the next one takes it in (the
         * workers resume from their last checkpoint). Not once nodes have
         * started to finish, and never in static mode (its ranks are fixed).
         * A warm joiner, when every node of the round re-forms in place, is
         * held instead: it starts its workers first, and the round ends when
         * they wait (rdzv_round_node), so the others stop only to re-form. */
        if (may_grow(r)) {
            if ((msg->flags & RDZV_JOIN_WARM) && all_live(r)) {
                m->warm = 1;
                rdzv_decision *w = out_add(out, RDZV_DO_WARM);
                if (w) {
                    w->m = m;
                    w->count = r->npending;
                    w->total = r->nranks;
                }
                GB_INFO("job %s: %s (%s) is held while it starts its workers: every node of round "
                        "%u re-forms in place",
                        r->run_id, m->hostname, m->addr, r->round);
            } else
                end_round(r, NULL, RDZV_REASON_SCALE_UP, now, out,
                          "node %s (%s) is waiting and job %s has room for %u more node(s): "
                          "re-rendezvous to take it in",
                          m->hostname, m->addr, r->run_id, r->max_nodes - r->nranks);
        }
        return GPL_OK;
    }
    maybe_complete(r, now, out);
    return GPL_OK;
}

void rdzv_round_leave(rdzv_rmember *m, const char *why, uint64_t now, rdzv_round_out *out) {
    rdzv_round *r = m->r;
    if (r == NULL)
        return;
    member_unpend(m);
    survivor_in(m); /* gone: the re-forming round stops waiting for it */
    if (m->active && r->state == RDZV_R_RUNNING && !m->done) {
        r->ranks[m->node_rank] = NULL;
        end_round(r, m, RDZV_REASON_DISCONNECT, now, out,
                  "node %s (%s, node rank %u) lost its connection to the rendezvous (%s)",
                  m->hostname, m->addr, m->node_rank, why);
    } else if (m->active && r->ranks && m->node_rank < r->nranks && r->ranks[m->node_rank] == m) {
        r->ranks[m->node_rank] = NULL;
    }
    m->active = 0;
    m->r = NULL;
    r->nmembers--;
}

void rdzv_round_fail(rdzv_rmember *m, int hung, uint32_t rank, const char *message, uint64_t now,
                     rdzv_round_out *out) {
    if (m->r == NULL || !m->active)
        return;
    if (hung)
        end_round(m->r, m, RDZV_REASON_HUNG, now, out, "node %s (node rank %u): rank %u hung: %s",
                  m->hostname, m->node_rank, rank, message);
    else
        end_round(m->r, m, RDZV_REASON_FAILED, now, out, "node %s (node rank %u): %s", m->hostname,
                  m->node_rank, message);
}

void rdzv_round_heartbeat_lost(rdzv_rmember *m, uint64_t silent_ms, uint64_t now,
                               rdzv_round_out *out) {
    if (m->r == NULL || !m->active || m->done)
        return;
    end_round(m->r, m, RDZV_REASON_HEARTBEAT, now, out,
              "node %s (%s, node rank %u) sent no heartbeat for %.1f s (timeout %.1f s)",
              m->hostname, m->addr, m->node_rank, (double)silent_ms / 1000.0,
              m->r->hb_timeout_ms / 1000.0);
}

void rdzv_round_unresponsive(rdzv_rmember *m, const char *evidence, uint64_t now,
                             rdzv_round_out *out) {
    if (m->r == NULL || !m->active || m->done)
        return;
    end_round(m->r, m, RDZV_REASON_HEARTBEAT, now, out, "node %s (%s, node rank %u) %s",
              m->hostname, m->addr, m->node_rank, evidence);
}

void rdzv_round_done(rdzv_rmember *m, rdzv_round_out *out) {
    rdzv_round *r = m->r;
    if (r == NULL || !m->active || m->done)
        return;
    m->done = 1;
    if (++r->ndone != r->nranks)
        return;
    GB_INFO("job %s: every node finished round %u", r->run_id, r->round);
    rdzv_decision *d = out_add(out, RDZV_DO_JOB_DONE);
    if (d) {
        d->round = r->round;
        d->members = r->ranks;
        d->nmembers = r->nranks;
        /* nodes still waiting to join will not be needed */
        rdzv_rmember **p = calloc(r->npending ? r->npending : 1, sizeof *p);
        if (p && out_own(out, p) == 0) {
            rdzv_rmember *x;
            LIST_FOREACH(x, &r->pending, plink)
            p[d->npending++] = x;
            d->pending = p;
        } else {
            free(p);
        }
    }
    r->state = RDZV_R_DONE;
}

/* Join timeouts and progress notes of the nodes waiting for a round. */
static void tick_pending(rdzv_round *r, uint64_t now, rdzv_round_out *out) {
    uint64_t due = UINT64_MAX;
    /* the missing-node text is O(nodes): built at most once per tick */
    char missing[RDZV_MAX_MSG + 1];
    const char *text = NULL;
    rdzv_rmember *m = LIST_FIRST(&r->pending), *n;
    for (; m; m = n) {
        n = LIST_NEXT(m, plink);
        uint64_t waited = now - m->joined_ms;
        int timed_out = waited >= r->join_timeout_ms;
        if (!timed_out && now < m->next_progress_ms) {
            if (pending_due(r, m) < due)
                due = pending_due(r, m);
            continue;
        }
        if (text == NULL) {
            rdzv_round_describe(r, now, missing, sizeof missing);
            text = out_str(out, missing);
        }
        rdzv_decision *d = out_add(out, timed_out ? RDZV_DO_TIMEOUT : RDZV_DO_PROGRESS);
        if (d) {
            d->m = m;
            d->waited_ms = waited;
            d->text = text;
            d->count = r->npending;
            d->total = r->is_static ? r->max_nodes : r->min_nodes;
        }
        if (timed_out) {
            member_unpend(m);
            continue;
        }
        m->next_progress_ms = now + RDZV_PROGRESS_MS;
        if (pending_due(r, m) < due)
            due = pending_due(r, m);
    }
    r->pending_due_ms = due;
}

void rdzv_round_tick(rdzv_round *r, uint64_t now, rdzv_round_out *out) {
    if (r->state == RDZV_R_GATHERING) {
        maybe_complete(r, now, out);
        if (r->state == RDZV_R_GATHERING && now >= r->pending_due_ms)
            tick_pending(r, now, out);
        return;
    }
    if (r->state == RDZV_R_RUNNING && r->resume_deadline_ms && now > r->resume_deadline_ms) {
        r->resume_deadline_ms = 0;
        for (uint32_t i = 0; i < r->nranks; i++)
            if (r->ranks[i] == NULL) {
                end_round(r, NULL, RDZV_REASON_DISCONNECT, now, out,
                          "node rank %u did not reconnect after the rendezvous restarted", i);
                return;
            }
    }
}
