/* The server's jobs: each request of a node or worker carried to its job's
 * round formation (rdzv_round.c) or key-value store (rdzv_kv.c), each
 * decision of the round carried to the connections it concerns, events and
 * statistics to the job's nodes, and liveness: heartbeats of the running
 * round and of the survivors a re-forming round waits for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb_log.h"
#include "gb_time.h"
#include "rdzv_server_int.h"

#define GB_COMPONENT "rdzv"

/* ---- the registry ---- */

static job *job_find(rdzv_server *s, const char *run_id) {
    job *j;
    LIST_FOREACH(j, &s->jobs, link)
    if (strcmp(j->r.run_id, run_id) == 0)
        return j;
    return NULL;
}

static job *job_new(rdzv_server *s, const rdzv_msg *jm) {
    job *j = calloc(1, sizeof *j);
    if (j == NULL)
        return NULL;
    if (rdzv_round_init(&j->r, jm, s->o.heartbeat_timeout_ms) != GPL_OK) {
        rdzv_round_free(&j->r);
        free(j);
        return NULL;
    }
    j->s = s;
    rdzv_kv_init(&j->kv, s->o.max_job_kv_bytes);
    LIST_INIT(&j->attached);
    j->health = rdzv_health_new(s->o.straggler_threshold, s->o.straggler_windows);
    LIST_INSERT_HEAD(&s->jobs, j, link);
    s->njobs++;
    GB_INFO("job %s: created by %s (%u:%u nodes%s)", j->r.run_id, j->r.first_host, j->r.min_nodes,
            j->r.max_nodes, j->r.is_static ? ", static ranks" : "");
    return j;
}

static void job_free(job *j) {
    rdzv_waiter *w;
    while ((w = LIST_FIRST(&j->kv.waiters)) != NULL)
        rdzv_kv_waiter_free(w);
    conn *c;
    while ((c = LIST_FIRST(&j->attached)) != NULL) {
        LIST_REMOVE(c, alink);
        c->aj = NULL;
    }
    rdzv_kv_clear(&j->kv);
    rdzv_round_free(&j->r);
    rdzv_health_free(j->health);
    LIST_REMOVE(j, link);
    j->s->njobs--;
    free(j);
}

/* A job with no node and no worker connected is forgotten. */
static void job_maybe_free(job *j) {
    if (j->r.nmembers == 0 && LIST_EMPTY(&j->attached))
        job_free(j);
}

void rdzv__jobs_free(rdzv_server *s) {
    job *j;
    while ((j = LIST_FIRST(&s->jobs)) != NULL)
        job_free(j);
}

/* ---- carrying out the round's decisions ---- */

static void waiters_fail(job *j, gpl_result_t code, const char *msg) {
    rdzv_waiter *w;
    while ((w = LIST_FIRST(&j->kv.waiters)) != NULL) {
        rdzv__send_error(w->owner, w->req, code, "%s", msg);
        rdzv_kv_waiter_free(w);
    }
}

/* One encoding for the n members and, with attached, every attached worker
 * connection of the job. */
static void push_to(job *j, rdzv_rmember *const *members, uint32_t n, const rdzv_msg *msg,
                    int attached) {
    size_t cap = n;
    conn *c;
    if (attached) {
        LIST_FOREACH(c, &j->attached, alink)
        cap++;
    }
    rdzv_push p;
    if (rdzv__push_init(&p, cap) != 0) {
        GB_ERROR("cannot send %s to job %s: out of memory", rdzv_type_name(msg->type), j->r.run_id);
        return;
    }
    if (rdzv_encode(msg, &p.data) != GPL_OK) {
        GB_ERROR("cannot encode %s for job %s", rdzv_type_name(msg->type), j->r.run_id);
        rdzv__push_send(j->s, &p);
        return;
    }
    for (uint32_t i = 0; i < n; i++)
        if (members[i])
            rdzv__push_add(&p, member_of(members[i])->c, 0, p.data.len);
    if (attached) {
        LIST_FOREACH(c, &j->attached, alink)
        rdzv__push_add(&p, c, 0, p.data.len);
    }
    rdzv__push_send(j->s, &p);
}

/* The round starts: each member's assignment, in one push. */
static void do_assign(job *j, const rdzv_decision *d) {
    rdzv_kv_clear(&j->kv);
    rdzv_msg a = {.type = RDZV_ASSIGNED};
    a.u.assigned.round = d->round;
    a.u.assigned.nnodes = d->nmembers;
    a.u.assigned.world_size = d->world_size;
    if (d->nmembers) {
        a.u.assigned.master_port = d->members[0]->master_port;
        memcpy(a.u.assigned.master_addr, d->members[0]->addr, sizeof a.u.assigned.master_addr);
    }
    rdzv_push p;
    int pushing = rdzv__push_init(&p, d->nmembers) == 0;
    for (uint32_t i = 0; i < d->nmembers; i++) {
        rdzv_rmember *m = d->members[i];
        a.req_id = m->join_req;
        a.u.assigned.node_rank = i;
        a.u.assigned.base_rank = m->base_rank;
        size_t off = p.data.len;
        if (pushing && rdzv_encode(&a, &p.data) == GPL_OK)
            rdzv__push_add(&p, member_of(m)->c, off, p.data.len - off);
        else
            rdzv__send_msg(member_of(m)->c, &a);
    }
    if (pushing)
        rdzv__push_send(j->s, &p);
    j->s->m.rounds++;
    rdzv_health_round_start(j->health, d->round, d->nmembers, d->world_size);
}

static void do_round_over(job *j, const rdzv_decision *d) {
    rdzv_msg m = {.type = RDZV_ROUND_OVER};
    m.u.round_over.round = d->round;
    m.u.round_over.reason = d->reason;
    m.u.round_over.node_rank = d->node_rank;
    snprintf(m.u.round_over.hostname, sizeof m.u.round_over.hostname, "%s", d->host);
    snprintf(m.u.round_over.message, sizeof m.u.round_over.message, "%s", d->text);
    rdzv_health_round_end(j->health, d->round, d->host[0] ? d->host : NULL, d->text);
    rdzv_server *s = j->s;
    if (d->reason != RDZV_REASON_SCALE_UP && /* growing is not a failure */
        d->reason < sizeof s->m.failures / sizeof s->m.failures[0])
        s->m.failures[d->reason]++;
    push_to(j, d->members, d->nmembers, &m, 1);
    waiters_fail(j, GPL_ERR_ROUND_OVER, d->text);
    rdzv_kv_clear(&j->kv);
}

static void do_job_done(job *j, const rdzv_decision *d) {
    rdzv_health_note(j->health, RDZV_TL_DONE, d->round, NULL, -1, "every node finished round %u",
                     d->round);
    rdzv_msg done = {.type = RDZV_JOB_DONE};
    push_to(j, d->members, d->nmembers, &done, 1);
    for (uint32_t i = 0; i < d->npending; i++)
        rdzv__send_msg(member_of(d->pending[i])->c, &done);
    j->s->m.jobs_done++;
}

/* Carries out what the round decided, then forgets it. No connection closes
 * meanwhile (a failed write drops it for later), so every member a decision
 * names is still there. */
static void apply(job *j, rdzv_round_out *out) {
    for (size_t i = 0; i < out->n; i++) {
        const rdzv_decision *d = &out->d[i];
        conn *c = d->m ? member_of(d->m)->c : NULL;
        switch (d->kind) {
        case RDZV_DO_ASSIGN:
            do_assign(j, d);
            break;
        case RDZV_DO_RESUMED: {
            if (j->health && j->health->round != d->round)
                rdzv_health_round_start(j->health, d->round, d->total, d->world_size);
            rdzv_msg a = {.type = RDZV_ASSIGNED, .req_id = d->m->join_req};
            a.u.assigned.round = d->round;
            a.u.assigned.node_rank = d->node_rank;
            a.u.assigned.nnodes = d->total;
            a.u.assigned.base_rank = d->m->base_rank;
            a.u.assigned.world_size = d->world_size;
            rdzv__send_msg(c, &a);
            break;
        }
        case RDZV_DO_WAITING: {
            rdzv_msg w = {.type = RDZV_WAITING};
            w.u.waiting.waiting = d->count;
            w.u.waiting.members = d->total;
            push_to(j, d->members, d->nmembers, &w, 1);
            break;
        }
        case RDZV_DO_ROUND_OVER:
            do_round_over(j, d);
            break;
        case RDZV_DO_PROGRESS: {
            rdzv_msg p = {.type = RDZV_PROGRESS};
            p.u.progress.joined = d->count;
            p.u.progress.expected = d->total;
            p.u.progress.waited_ms = (uint32_t)d->waited_ms;
            snprintf(p.u.progress.missing, sizeof p.u.progress.missing, "%s", d->text);
            rdzv__send_msg(c, &p);
            break;
        }
        case RDZV_DO_TIMEOUT:
            rdzv__send_error(c, d->m->join_req, GPL_ERR_TIMEOUT,
                             "rendezvous of job %s timed out after %.1f s: %s; start the "
                             "missing nodes, or raise --rdzv-conf join_timeout",
                             j->r.run_id, (double)d->waited_ms / 1000.0, d->text);
            break;
        case RDZV_DO_JOB_DONE:
            do_job_done(j, d);
            break;
        case RDZV_DO_WARM: {
            rdzv_msg w = {.type = RDZV_WAITING, .flags = RDZV_WAITING_WARM};
            w.u.waiting.waiting = d->count;
            w.u.waiting.members = d->total;
            rdzv__send_msg(c, &w);
            break;
        }
        }
    }
    rdzv_round_out_reset(out);
}

/* ---- requests ---- */

/* A node re-registers the round it runs on a second connection while its
 * first still stands (RDZV_CHALLENGE_MOVE): the first stalled, a TCP stream
 * backing off on a lossy link. The node moves to the new connection and
 * nothing else changes: its rank, its round, what is known of its probes;
 * the old connection stays the node's until the client has drained and
 * closed it. Only the same launcher (its instance) moves a node. */
static int try_move(conn *c, job *j, const rdzv_msg *msg) {
    const __typeof__(msg->u.join) *jn = &msg->u.join;
    rdzv_round *r = &j->r;
    if (!(msg->flags & RDZV_JOIN_RESUME) || c->m || r->state != RDZV_R_RUNNING ||
        r->round != jn->round || jn->node_rank >= r->nranks || jn->instance[0] == '\0')
        return 0;
    rdzv_rmember *rm = r->ranks[jn->node_rank];
    if (rm == NULL || !rm->active || rm->done || strcmp(rm->instance, jn->instance) != 0)
        return 0;
    member *m = member_of(rm);
    conn *old = m->c;
    uint64_t now = gb_now_ms();
    if (m->was) { /* moved twice before it closed the first: that one is nobody's now */
        m->was->m = NULL;
        rdzv__conn_drop(m->was, "its node moved again");
    }
    m->was = old;
    m->c = c;
    c->m = m;
    rm->join_req = msg->req_id;
    c->s->m.moves++;
    GB_INFO("job %s: %s (node rank %u) moved to a new connection, %.1f s after its old one last "
            "carried anything (a stalled stream): round %u goes on",
            r->run_id, rm->hostname, rm->node_rank, (double)(now - old->last_rx_ms) / 1000.0,
            r->round);
    rdzv_msg a = {.type = RDZV_ASSIGNED, .req_id = msg->req_id};
    a.u.assigned.round = r->round;
    a.u.assigned.node_rank = rm->node_rank;
    a.u.assigned.nnodes = r->nranks;
    a.u.assigned.base_rank = rm->base_rank;
    a.u.assigned.world_size = jn->world_size;
    rdzv__send_msg(c, &a);
    c->move_fresh = 1; /* until it carries anything more */
    return 1;
}

static void handle_join(conn *c, const rdzv_msg *msg) {
    rdzv_server *s = c->s;
    const __typeof__(msg->u.join) *jn = &msg->u.join;
    if (jn->run_id[0] == '\0' || jn->nproc == 0) {
        rdzv__send_error(c, msg->req_id, GPL_ERR_INVALID_ARG,
                         "JOIN needs a run id and nproc >= 1 (got run id '%s', nproc %u)",
                         jn->run_id, jn->nproc);
        return;
    }
    job *j = job_find(s, jn->run_id);
    if (j && try_move(c, j, msg))
        return;
    if (j == NULL) {
        if (s->njobs >= s->o.max_jobs) {
            rdzv__send_error(c, msg->req_id, GPL_ERR_LIMIT,
                             "the server holds its maximum of %u jobs; raise --max-jobs",
                             s->o.max_jobs);
            return;
        }
        uint32_t maxn = jn->max_nodes ? jn->max_nodes : jn->min_nodes;
        if (maxn > s->o.max_nodes || (jn->min_nodes > maxn)) {
            rdzv__send_error(c, msg->req_id, GPL_ERR_LIMIT,
                             "job %s asks for %u:%u nodes; this server allows at most %u",
                             jn->run_id, jn->min_nodes, maxn, s->o.max_nodes);
            return;
        }
        j = job_new(s, msg);
        if (j == NULL) {
            rdzv__send_error(c, msg->req_id, GPL_ERR_NOMEM, "out of memory creating job %s",
                             jn->run_id);
            return;
        }
    }
    member *m = c->m;
    if (m == NULL) {
        m = calloc(1, sizeof *m);
        if (m == NULL) {
            rdzv__send_error(c, msg->req_id, GPL_ERR_NOMEM, "out of memory");
            job_maybe_free(j);
            return;
        }
        m->rm.prev_rank = -1;
        m->c = c;
    }
    job *left = m->rm.r ? job_of(m->rm.r) : NULL;
    rdzv_round_out out = {0};
    char err[RDZV_MAX_MSG + 1];
    gpl_result_t rc = rdzv_round_join(&j->r, &m->rm, msg, gb_now_ms(), &out, err, sizeof err);
    if (rc != GPL_OK) {
        rdzv__send_error(c, msg->req_id, rc, "%s", err);
        if (c->m == NULL)
            free(m);
        apply(j, &out);
        rdzv_round_out_free(&out);
        job_maybe_free(j);
        return;
    }
    c->m = m;
    s->m.joins++;
    rdzv__probe_joined(c, msg);
    if (!(msg->flags & RDZV_JOIN_RESUME))
        rdzv_health_note(j->health, RDZV_TL_JOIN, j->r.round + 1, m->rm.hostname, -1,
                         "%s (%s) joined", m->rm.hostname, m->rm.addr);
    apply(j, &out);
    rdzv_round_out_free(&out);
    if (left && left != j)
        job_maybe_free(left);
}

static job *kv_job(conn *c, uint32_t req) {
    if (c->m && c->m->rm.r && (c->m->rm.active || c->m->rm.pending))
        return job_of(c->m->rm.r);
    if (c->aj) {
        if (c->aj->r.state != RDZV_R_RUNNING || c->aj->r.round != c->around) {
            rdzv__send_error(c, req, GPL_ERR_ROUND_OVER,
                             "round %u of job %s is over; the workers must restart", c->around,
                             c->aj->r.run_id);
            return NULL;
        }
        return c->aj;
    }
    rdzv__send_error(c, req, GPL_ERR_STATE,
                     "join or attach to a job before using its key-value store");
    return NULL;
}

static void waiter_ready(rdzv_waiter *w, void *ctx) {
    (void)ctx;
    rdzv__send_simple(w->owner, RDZV_OK, w->req);
    rdzv_kv_waiter_free(w);
}

static void handle_kv(conn *c, const rdzv_msg *msg) {
    job *j = kv_job(c, msg->req_id);
    if (j == NULL)
        return;
    rdzv_server *s = c->s;
    s->m.kv_ops++;
    if (msg->type == RDZV_KV_WAIT) {
        rdzv_waiter *w = rdzv_kv_waiter_new(&j->kv, c, msg, gb_now_ms());
        if (w == NULL) {
            rdzv__send_error(c, msg->req_id, GPL_ERR_NOMEM, "out of memory");
            return;
        }
        LIST_INSERT_HEAD(&c->waiters, w, olink);
        if (rdzv_kv_missing(&j->kv, w, NULL) == 0)
            waiter_ready(w, NULL);
        return;
    }
    rdzv_msg r;
    int changed = rdzv_kv_request(&j->kv, j->r.run_id, msg, &r, &s->kv_scratch);
    rdzv__send_msg(c, &r);
    if (s->kv_scratch.cap > 64 * 1024) { /* give back the memory of a large multi-get */
        rdzv_buf_free(&s->kv_scratch);
        rdzv_buf_init(&s->kv_scratch, RDZV_MAX_FRAME - 64);
    }
    if (changed)
        rdzv_kv_wake(&j->kv, waiter_ready, NULL);
}

static void handle_attach(conn *c, const rdzv_msg *msg) {
    job *j = job_find(c->s, msg->u.attach.run_id);
    if (j == NULL || j->r.state != RDZV_R_RUNNING || j->r.round != msg->u.attach.round) {
        rdzv__send_error(c, msg->req_id, j ? GPL_ERR_ROUND_OVER : GPL_ERR_NOT_FOUND,
                         j ? "job %s is at round %u (%s), not round %u: the workers must restart"
                           : "job %s is not known to this server (round %u%s); is the launcher "
                             "running?",
                         msg->u.attach.run_id, j ? j->r.round : msg->u.attach.round,
                         j ? (j->r.state == RDZV_R_RUNNING ? "running" : "gathering") : "",
                         msg->u.attach.round);
        return;
    }
    if (c->aj)
        LIST_REMOVE(c, alink);
    c->aj = j;
    c->around = j->r.round;
    LIST_INSERT_HEAD(&j->attached, c, alink);
    rdzv__send_simple(c, RDZV_OK, msg->req_id);
}

static void handle_event(conn *c, const rdzv_msg *msg) {
    job *j = c->m && c->m->rm.r ? job_of(c->m->rm.r) : c->aj;
    if (j == NULL) {
        rdzv__send_error(c, msg->req_id, GPL_ERR_STATE,
                         "join or attach to a job before sending events");
        return;
    }
    rdzv_msg e = *msg;
    e.req_id = 0;
    e.u.event.round = j->r.round;
    if (e.u.event.node[0] == '\0' && c->m)
        memcpy(e.u.event.node, c->m->rm.hostname, sizeof e.u.event.node);
    if (e.u.event.kind == RDZV_EVENT_GPU) { /* the timeline's: the node acts on it itself */
        GB_WARN("job %s: GPU notice from %s: %s", j->r.run_id, e.u.event.node, e.u.event.reason);
        rdzv_health_note(j->health, RDZV_TL_GPU, j->r.round, e.u.event.node, -1, "%s: %s",
                         e.u.event.node, e.u.event.reason);
        rdzv__send_simple(c, RDZV_OK, msg->req_id);
        return;
    }
    const char *kind = e.u.event.kind == RDZV_EVENT_CHECKPOINT ? "checkpoint" : "shutdown";
    GB_WARN("job %s: event %s from %s: %s", j->r.run_id, kind, e.u.event.node, e.u.event.reason);
    rdzv_health_note(
        j->health, e.u.event.kind == RDZV_EVENT_CHECKPOINT ? RDZV_TL_PREEMPT : RDZV_TL_SHUTDOWN,
        j->r.round, e.u.event.node, -1, "%s from %s: %s", kind, e.u.event.node, e.u.event.reason);
    push_to(j, j->r.ranks, j->r.nranks, &e, 1);
    /* Members between rounds hear it too. */
    rdzv_rmember *m;
    LIST_FOREACH(m, &j->r.pending, plink)
    rdzv__send_msg(member_of(m)->c, &e);
    rdzv__send_simple(c, RDZV_OK, msg->req_id);
}

/* Named and recovered stragglers: the server's log, and the job's nodes
 * (their launchers print it); workers are not told. */
static void straggler_notice(void *ctx, const rdzv_rank_health *r, int named, const char *text) {
    job *j = ctx;
    GB_WARN("job %s: round %u: %s", j->r.run_id, j->r.round, text);
    rdzv_msg e = {.type = RDZV_EVENT};
    e.u.event.kind = RDZV_EVENT_STRAGGLER;
    e.u.event.round = j->r.round;
    rdzv_rmember *m = r->node_rank < j->r.nranks ? j->r.ranks[r->node_rank] : NULL;
    if (m)
        memcpy(e.u.event.node, m->hostname, sizeof e.u.event.node);
    snprintf(e.u.event.reason, sizeof e.u.event.reason, "%s", text);
    (void)named;
    push_to(j, j->r.ranks, j->r.nranks, &e, 0);
}

/* A launcher's per-rank summaries of its last window; no reply. */
static void handle_stats(conn *c, const rdzv_msg *msg) {
    member *m = c->m;
    if (m == NULL || !m->rm.active || m->rm.r == NULL || m->rm.r->state != RDZV_R_RUNNING)
        return; /* between rounds: stale, dropped */
    job *j = job_of(m->rm.r);
    rdzv_health_stats(j->health, m->rm.node_rank, m->rm.hostname, m->rm.base_rank, m->rm.nproc, msg,
                      gb_now_ms(), straggler_notice, j);
}

/* How the node began a round: kept with the round while the node is in
 * the job (the round may have ended meanwhile: it is still its story). */
static void handle_story(conn *c, const rdzv_msg *msg) {
    member *m = c->m;
    if (m == NULL || m->rm.r == NULL)
        return;
    job *j = job_of(m->rm.r);
    GB_INFO("job %s: %s began round %u: %s, paused %.3f s, %u step(s) done again%s%s", j->r.run_id,
            m->rm.hostname, msg->u.story.round, rdzv_story_kind_name(msg->u.story.kind),
            msg->u.story.pause_ms == RDZV_STORY_UNKNOWN ? -1.0 : msg->u.story.pause_ms / 1000.0,
            msg->u.story.redone, msg->u.story.why[0] ? ": " : "", msg->u.story.why);
    rdzv_health_story(j->health, m->rm.hostname, msg);
}

static void handle_fail(conn *c, const rdzv_msg *msg) {
    member *m = c->m;
    if (m && m->rm.active && m->rm.r) {
        job *j = job_of(m->rm.r);
        int hung = (msg->flags & RDZV_FAIL_HANG) != 0;
        if (hung) {
            GB_WARN("job %s: rank %u on node %s (node rank %u) hung: %s", j->r.run_id,
                    msg->u.fail.rank, m->rm.hostname, m->rm.node_rank, msg->u.fail.message);
            rdzv_health_hang(j->health, j->r.round, m->rm.hostname, msg->u.fail.rank,
                             msg->u.fail.message);
        }
        rdzv_round_out out = {0};
        rdzv_round_fail(&m->rm, hung, msg->u.fail.rank, msg->u.fail.message, gb_now_ms(), &out);
        apply(j, &out);
        rdzv_round_out_free(&out);
    }
    rdzv__send_simple(c, RDZV_OK, msg->req_id);
}

static void handle_done(conn *c, const rdzv_msg *msg) {
    member *m = c->m;
    if (m && m->rm.r) {
        job *j = job_of(m->rm.r);
        rdzv_round_out out = {0};
        rdzv_round_done(&m->rm, &out);
        apply(j, &out);
        rdzv_round_out_free(&out);
    }
    rdzv__send_simple(c, RDZV_OK, msg->req_id);
}

static void handle_node(conn *c, const rdzv_msg *msg) {
    member *m = c->m;
    if (m && m->rm.r) {
        job *j = job_of(m->rm.r);
        rdzv_round_out out = {0};
        rdzv_round_node(&m->rm, msg->flags, gb_now_ms(), &out);
        apply(j, &out);
        rdzv_round_out_free(&out);
    }
    rdzv__send_simple(c, RDZV_OK, msg->req_id);
}

void rdzv__job_request(conn *c, const rdzv_msg *msg) {
    switch (msg->type) {
    case RDZV_JOIN:
        handle_join(c, msg);
        return;
    case RDZV_ATTACH:
        handle_attach(c, msg);
        return;
    case RDZV_EVENT:
        handle_event(c, msg);
        return;
    case RDZV_FAIL:
        handle_fail(c, msg);
        return;
    case RDZV_STATS:
        handle_stats(c, msg);
        return;
    case RDZV_STORY:
        handle_story(c, msg);
        return;
    case RDZV_DONE:
        handle_done(c, msg);
        return;
    case RDZV_NODE:
        handle_node(c, msg);
        return;
    default: /* the key-value requests */
        handle_kv(c, msg);
        return;
    }
}

int rdzv__job_conn_fallback(conn *c, const char *why) {
    member *m = c->m;
    if (m == NULL || m->c != c || (m->was == NULL && !c->move_fresh))
        return 0; /* not a node's, or not one that moved here */
    if (!c->move_fresh || m->was == NULL || m->was->closing || m->was->doomed) {
        GB_INFO("job %s: %s (node rank %u): the connection it moved to closed (%s) and it does "
                "not go back: %s",
                m->rm.r ? m->rm.r->run_id : "?", m->rm.hostname, m->rm.node_rank, why,
                !c->move_fresh   ? c->move_spoiled
                : m->was == NULL ? "the one it moved from is gone"
                                 : "the one it moved from is closing");
        return 0;
    }
    conn *old = m->was;
    uint64_t now = gb_now_ms();
    double opened_s = (double)(now - c->accepted_ms) / 1000.0;
    m->c = old;
    m->was = NULL;
    c->m = NULL;
    if (old->last_rx_ms < c->last_rx_ms)
        old->last_rx_ms = c->last_rx_ms; /* the node's silence goes on from its last frame */
    c->s->m.moves_back++;
    GB_INFO("job %s: %s (node rank %u) is back on the connection it moved from (%s on the new "
            "one, opened %.1f s before, which carried nothing after the move): its launcher "
            "gave up on it before the move's answer came and kept the old one; round %u goes on",
            m->rm.r ? m->rm.r->run_id : "?", m->rm.hostname, m->rm.node_rank, why, opened_s,
            m->rm.r ? m->rm.r->round : 0u);
    return 1;
}

void rdzv__job_conn_gone(conn *c, const char *why) {
    rdzv_waiter *w;
    while ((w = LIST_FIRST(&c->waiters)) != NULL)
        rdzv_kv_waiter_free(w);
    job *aj = c->aj;
    if (aj) {
        LIST_REMOVE(c, alink);
        c->aj = NULL;
    }
    member *m = c->m;
    if (m && m->c != c) { /* the connection a node moved from: the node stays */
        c->m = NULL;
        if (m->was == c)
            m->was = NULL;
        m = NULL;
    }
    job *j = m && m->rm.r ? job_of(m->rm.r) : NULL;
    if (m) {
        c->m = NULL;
        if (m->was) { /* nothing on it is anybody's now */
            m->was->m = NULL;
            rdzv__conn_drop(m->was, "the node it carried left");
        }
        rdzv__probe_gone(m);
        if (j) {
            rdzv_round_out out = {0};
            rdzv_round_leave(&m->rm, why, gb_now_ms(), &out);
            apply(j, &out);
            rdzv_round_out_free(&out);
        }
        free(m);
    }
    if (j)
        job_maybe_free(j);
    if (aj && aj != j)
        job_maybe_free(aj);
}

/* ---- the sweep ---- */

/* Heartbeats of the running round: the first member silent past the
 * timeout ends it, and its connection goes. */
static void sweep_heartbeats(job *j, uint64_t now, rdzv_round_out *out) {
#ifdef GPULAUNCH_BREAK_HEARTBEATS
    (void)j, (void)now, (void)out;
    return; /* the broken build of scripts/fault_selftest.sh: scenario 2 must fail */
#else
    for (uint32_t i = 0; i < j->r.nranks && j->r.state == RDZV_R_RUNNING; i++) {
        rdzv_rmember *m = j->r.ranks[i];
        if (m == NULL || m->done)
            continue;
        conn *c = member_of(m)->c;
        rdzv__probe_machine(member_of(m), now);
        rdzv__probe_silent(member_of(m), now);
        if (now - c->last_rx_ms > j->r.hb_timeout_ms) {
            char probed[256], ev[512];
            if (rdzv__probe_kept(member_of(m), now, probed, sizeof probed))
                continue; /* its peers reach it (its link to the rendezvous alone is bad),
                             or their word is still to come */
            if (probed[0]) {
                snprintf(ev, sizeof ev, "sent no heartbeat for %.1f s (timeout %.1f s)%s",
                         (double)(now - c->last_rx_ms) / 1000.0, j->r.hb_timeout_ms / 1000.0,
                         probed);
                rdzv_round_unresponsive(m, ev, now, out);
            } else {
                rdzv_round_heartbeat_lost(m, now - c->last_rx_ms, now, out);
            }
            apply(j, out);
            rdzv__conn_drop(c, "heartbeat timeout");
            return;
        }
    }
#endif
}

void rdzv__job_unresponsive(member *m, const char *evidence, uint64_t now) {
#ifdef GPULAUNCH_BREAK_HEARTBEATS
    (void)m, (void)evidence, (void)now;
    return; /* the broken build of scripts/fault_selftest.sh finds no lost node at all */
#else
    job *j = job_of(m->rm.r);
    rdzv_round_out out = {0};
    rdzv_round_unresponsive(&m->rm, evidence, now, &out);
    apply(j, &out);
    rdzv_round_out_free(&out);
    rdzv__conn_drop(m->c, "unresponsive to probes");
#endif
}

static void sweep_job(job *j, uint64_t now, int hb) {
    rdzv_round_out out = {0};
    int running = j->r.state == RDZV_R_RUNNING;
    if (hb && running)
        sweep_heartbeats(j, now, &out);
    if (!running || hb) { /* a running round's deadline is looked at with heartbeats */
        rdzv_round_tick(&j->r, now, &out);
        apply(j, &out);
    }
    rdzv_round_out_free(&out);
    if (j->r.state != RDZV_R_RUNNING || !running)
        return;
    rdzv_waiter *w = LIST_FIRST(&j->kv.waiters), *n;
    for (; w; w = n) {
        n = LIST_NEXT(w, klink);
        if (now >= w->deadline_ms) {
            rdzv_bytes first = {NULL, 0};
            uint32_t miss = rdzv_kv_missing(&j->kv, w, &first);
            rdzv__send_error(w->owner, w->req, GPL_ERR_TIMEOUT,
                             "waited %u key(s) in job %s: %u never set (first: '%.*s')", w->nkeys,
                             j->r.run_id, miss, (int)(first.len > 200 ? 200 : first.len),
                             first.p ? (const char *)first.p : "");
            rdzv_kv_waiter_free(w);
        }
    }
}

void rdzv__jobs_sweep(rdzv_server *s, uint64_t now, int hb) {
    job *j;
    /* nothing closes or frees a job during the sweep: closes wait (rdzv__conn_drop) */
    LIST_FOREACH(j, &s->jobs, link)
    sweep_job(j, now, hb);
}

/* A survivor of a failed round is in no round while the next one re-forms, so
 * the running rounds' heartbeat check does not see it: one whose heartbeats
 * stop (its host went down too, or its client moved to a new connection) is
 * closed, and the round stops waiting for it. Launchers beat between rounds.
 * A connection a node moved from goes once it is silent as long as a node
 * kept by its peers may be (its client drains and closes it sooner). */
void rdzv__jobs_sweep_survivors(rdzv_server *s, uint64_t now) {
    conn *c;
    LIST_FOREACH(c, &s->conns, link) {
        member *m = c->m;
        if (m && m->c != c) {
            /* the connection a node moved from: drained by the client, or a dead path */
            uint64_t hb = m->rm.r ? m->rm.r->hb_timeout_ms : RDZV_DEFAULT_HEARTBEAT_TIMEOUT_MS;
            if (now - c->last_rx_ms > (uint64_t)RDZV_KEEP_FACTOR * hb)
                rdzv__conn_drop(c, "the connection its node moved from stayed silent");
            continue;
        }
        if (m == NULL || !rdzv_round_awaits(&m->rm) ||
            now - c->last_rx_ms <= m->rm.r->hb_timeout_ms)
            continue;
        GB_WARN("job %s: %s (%s), a survivor of round %u, sent no heartbeat for %.1f s while the "
                "next round re-forms: not waited for",
                m->rm.r->run_id, m->rm.hostname, m->rm.addr, m->rm.r->reform_round,
                (double)(now - c->last_rx_ms) / 1000.0);
        rdzv__conn_drop(c, "no heartbeat while the round re-forms");
    }
}

uint64_t rdzv_member_last_rx_ms(const rdzv_rmember *m) {
    return member_of((rdzv_rmember *)m)->c->last_rx_ms;
}
