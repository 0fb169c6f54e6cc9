/* Job health: per-rank statistics, straggler detection, the step-rate
 * history, rounds and the event timeline of one job (rdzv_health.h).
 *
 * The straggler rule. In synchronous data-parallel training every rank has
 * the same step time: the slow rank sets it and the others wait for it at the
 * collective. So a rank's "busy" time per step is its step time less the time
 * it waited for the last rank to arrive (the runtime measures it); the
 * straggler is the rank whose busy time is highest. When the wait is not
 * known the step time stands in. A rank is named when its busy time is over
 * threshold x the job's lower median for `windows` consecutive windows of its
 * own reports, and recovers after as many windows not over it. A STATS
 * message costs O(ranks in it), plus O(job ranks) for the medians at most
 * every RDZV_HEALTH_MEDIAN_MS. */
#include "rdzv_health.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb_time.h"

const char *rdzv_tl_kind_name(uint32_t kind) {
    switch (kind) {
    case RDZV_TL_JOIN:
        return "join";
    case RDZV_TL_ROUND:
        return "round";
    case RDZV_TL_ROUND_OVER:
        return "round_over";
    case RDZV_TL_HANG:
        return "hang";
    case RDZV_TL_PREEMPT:
        return "preemption";
    case RDZV_TL_SHUTDOWN:
        return "shutdown";
    case RDZV_TL_STRAGGLER:
        return "straggler";
    case RDZV_TL_RECOVERED:
        return "recovered";
    case RDZV_TL_DONE:
        return "done";
    case RDZV_TL_GPU:
        return "gpu";
    case RDZV_TL_BEGAN:
        return "began";
    }
    return "unknown";
}

static uint64_t unix_ms(void) { return (uint64_t)(gb_wall_s() * 1000.0); }

rdzv_health *rdzv_health_new(double threshold, uint32_t windows) {
    rdzv_health *h = calloc(1, sizeof *h);
    if (h == NULL)
        return NULL;
    h->threshold = threshold > 1.0 ? threshold : RDZV_DEFAULT_STRAGGLER_THRESHOLD;
    h->windows = windows ? windows : RDZV_DEFAULT_STRAGGLER_WINDOWS;
    h->median_wait_us = UINT32_MAX;
    h->ckpt_stale = 1;
    return h;
}

static void ranks_free(rdzv_health *h) {
    free(h->ranks);
    free(h->scratch);
    h->ranks = NULL;
    h->scratch = NULL;
    h->nranks = h->reported = h->nstragglers = 0;
    h->median_ms = 0;
    h->median_busy_us = h->median_step_us = 0;
    h->median_wait_us = UINT32_MAX;
    h->steps_per_s = 0;
    h->ckpt_stale = 1;
}

void rdzv_health_free(rdzv_health *h) {
    if (h == NULL)
        return;
    ranks_free(h);
    free(h->rounds);
    free(h->events);
    free(h);
}

/* A ring that grows (doubling) up to max entries of size sz, then overwrites
 * the oldest. Returns the slot for a new entry, NULL when out of memory. */
static void *ring_push(void **base, uint32_t *head, uint32_t *n, uint32_t *cap, uint32_t max,
                       size_t sz) {
    if (*n == *cap && *cap < max) {
        uint32_t ncap = *cap ? *cap * 2 : 8;
        if (ncap > max)
            ncap = max;
        void *p = realloc(*base, (size_t)ncap * sz);
        if (p == NULL)
            return NULL;
        *base = p;
        *cap = ncap; /* head is 0 while the ring has never wrapped */
    }
    if (*cap == 0)
        return NULL;
    uint32_t slot = (*head + *n) % *cap;
    if (*n == *cap)
        *head = (*head + 1) % *cap;
    else
        (*n)++;
    return (char *)*base + (size_t)slot * sz;
}

static rdzv_tl_event *event_push(rdzv_health *h) {
    void *base = h->events;
    rdzv_tl_event *e = ring_push(&base, &h->ev_head, &h->ev_n, &h->ev_cap, RDZV_HEALTH_MAX_EVENTS,
                                 sizeof *h->events);
    h->events = base;
    if (e)
        h->events_total++;
    return e;
}

const rdzv_tl_event *rdzv_health_event(const rdzv_health *h, uint32_t i) {
    return i < h->ev_n ? &h->events[(h->ev_head + i) % h->ev_cap] : NULL;
}

const rdzv_round_rec *rdzv_health_round(const rdzv_health *h, uint32_t i) {
    return i < h->rounds_n ? &h->rounds[(h->rounds_head + i) % h->rounds_cap] : NULL;
}

const rdzv_rate_sample *rdzv_health_rate(const rdzv_health *h, uint32_t i) {
    return i < h->rate_n ? &h->rate[(h->rate_head + i) % RDZV_HEALTH_RATE_SAMPLES] : NULL;
}

static void event_vset(rdzv_tl_event *e, uint32_t kind, uint32_t round, const char *node,
                       int64_t rank, const char *fmt, va_list ap) {
    e->unix_ms = unix_ms();
    e->kind = kind;
    e->round = round;
    e->count = 1;
    e->rank = rank;
    snprintf(e->node, sizeof e->node, "%s", node ? node : "");
    vsnprintf(e->text, sizeof e->text, fmt, ap);
}

void rdzv_health_note(rdzv_health *h, uint32_t kind, uint32_t round, const char *node, int64_t rank,
                      const char *fmt, ...) {
    if (h == NULL)
        return;
    /* Joins of one gathering are one entry: a 1,000-node job's start does
     * not push everything else out of the timeline. */
    if (kind == RDZV_TL_JOIN && h->ev_n) {
        rdzv_tl_event *last = &h->events[(h->ev_head + h->ev_n - 1) % h->ev_cap];
        if (last->kind == RDZV_TL_JOIN && last->round == round) {
            last->count++;
            last->unix_ms = unix_ms();
            snprintf(last->node, sizeof last->node, "%s", node ? node : "");
            snprintf(last->text, sizeof last->text, "%u nodes joined (the last: %s)", last->count,
                     node ? node : "?");
            return;
        }
    }
    rdzv_tl_event *e = event_push(h);
    if (e == NULL)
        return;
    va_list ap;
    va_start(ap, fmt);
    event_vset(e, kind, round, node, rank, fmt, ap);
    va_end(ap);
}

void rdzv_health_round_start(rdzv_health *h, uint32_t round, uint32_t nnodes, uint32_t world) {
    if (h == NULL)
        return;
    ranks_free(h);
    h->round = round;
    h->nnodes = nnodes;
    h->world = world;
    void *base = h->rounds;
    rdzv_round_rec *r = ring_push(&base, &h->rounds_head, &h->rounds_n, &h->rounds_cap,
                                  RDZV_HEALTH_MAX_ROUNDS, sizeof *h->rounds);
    h->rounds = base;
    if (r) {
        memset(r, 0, sizeof *r);
        r->round = round;
        r->nnodes = nnodes;
        r->world = world;
        r->start_unix_ms = unix_ms();
        r->story.ckpt_step = -1; /* no checkpoint read (yet) */
    }
    rdzv_health_note(h, RDZV_TL_ROUND, round, NULL, -1, "round %u: %u node(s), world size %u",
                     round, nnodes, world);
}

void rdzv_health_round_end(rdzv_health *h, uint32_t round, const char *node, const char *why) {
    if (h == NULL)
        return;
    if (h->rounds_n) {
        rdzv_round_rec *r = &h->rounds[(h->rounds_head + h->rounds_n - 1) % h->rounds_cap];
        if (r->round == round && r->end_unix_ms == 0) {
            r->end_unix_ms = unix_ms();
            snprintf(r->end, sizeof r->end, "%s", why);
        }
    }
    rdzv_health_note(h, RDZV_TL_ROUND_OVER, round, node, -1, "round %u over: %s", round, why);
}

const double rdzv_health_pause_le[RDZV_HEALTH_PAUSE_BUCKETS - 1] = {0.05, 0.1, 0.25, 0.5, 1,
                                                                    2.5,  5,   10,   30,  60};

const char *rdzv_story_kind_name(uint32_t kind) {
    static const char *const names[RDZV_STORY_KINDS] = {"first", "in_place", "restart",
                                                        "warm_join"};
    return kind < RDZV_STORY_KINDS ? names[kind] : "unknown";
}

/* A node's pause in the round's record and the job's histogram. */
static void count_pause(rdzv_health *h, rdzv_round_story *st, uint32_t pause, uint32_t nproc) {
    if (pause > st->pause_max_ms)
        st->pause_max_ms = pause;
    st->pause_rank_ms += (uint64_t)pause * nproc;
    h->cost.pause_rank_ms += (uint64_t)pause * nproc;
    double s = pause / 1000.0;
    h->cost.pauses++;
    h->cost.pause_sum_s += s;
    int b = 0;
    while (b < RDZV_HEALTH_PAUSE_BUCKETS - 1 && s > rdzv_health_pause_le[b])
        b++;
    h->cost.pause_bucket[b]++;
}

/* A node's own story with the round's: those of its changes (not first
 * starts, unless the node took its state from somewhere: a newcomer), the
 * first RDZV_HEALTH_ROUND_NODES of them. */
static void keep_node_story(rdzv_round_story *st, const char *node, const rdzv_msg *m) {
    if (m->u.story.kind == RDZV_STORY_FIRST && m->u.story.source == RDZV_STATE_NONE)
        return;
    if (st->each_n == RDZV_HEALTH_ROUND_NODES) {
        st->each_more++;
        return;
    }
    rdzv_node_story *n = &st->each[st->each_n++];
    snprintf(n->node, sizeof n->node, "%s", node ? node : "");
    n->kind = (uint8_t)m->u.story.kind;
    n->cause = (uint8_t)(m->u.story.kind == RDZV_STORY_RESTART && m->u.story.cause < RDZV_CAUSES
                             ? m->u.story.cause
                             : RDZV_CAUSE_NONE);
    n->source =
        (uint8_t)(m->u.story.source <= RDZV_STATE_CHECKPOINT ? m->u.story.source : RDZV_STATE_NONE);
    n->pause_ms = m->u.story.pause_ms;
    n->redone = m->u.story.redone;
    n->nproc = m->u.story.nproc;
    n->state_ms = m->u.story.state_ms;
    n->state_root = n->source == RDZV_STATE_PEER ? m->u.story.state_root : -1;
    n->state_bytes = n->source != RDZV_STATE_NONE ? m->u.story.state_bytes : 0;
    n->state_step = n->source != RDZV_STATE_NONE ? m->u.story.state_step : -1;
}

/* The round's line on the timeline, from what its nodes said so far: one
 * entry a round, made by its first change's story and updated by every
 * later one while it is in the timeline, so a 1,000-node round change does
 * not push everything else out. A round of first starts alone has none. */
static void note_began(rdzv_health *h, rdzv_round_rec *r, const char *node, int make) {
    const rdzv_round_story *st = &r->story;
    char t[RDZV_HEALTH_TEXT];
    size_t n = 0;
#define ADD(...)                                                                                   \
    do {                                                                                           \
        if (n < sizeof t) {                                                                        \
            int w_ = snprintf(t + n, sizeof t - n, __VA_ARGS__);                                   \
            n += w_ > 0 ? (size_t)w_ : 0;                                                          \
        }                                                                                          \
    } while (0)
    ADD("round %u began:", r->round);
    const char *sep = " ";
    if (st->nodes[RDZV_STORY_IN_PLACE]) {
        ADD("%s%u node(s) in place", sep, st->nodes[RDZV_STORY_IN_PLACE]);
        sep = ", ";
    }
    if (st->nodes[RDZV_STORY_RESTART]) {
        ADD("%s%u restarted (", sep, st->nodes[RDZV_STORY_RESTART]);
        const char *rs = "";
        for (uint32_t c = 0; c < RDZV_CAUSES; c++)
            if (st->restarts[c]) {
                ADD("%s%u %s", rs, st->restarts[c], rdzv_restart_cause_name(c));
                rs = ", ";
            }
        ADD(")");
        sep = ", ";
    }
    if (st->nodes[RDZV_STORY_WARM]) {
        ADD("%s%u joined warm", sep, st->nodes[RDZV_STORY_WARM]);
        sep = ", ";
    }
    if (st->nodes[RDZV_STORY_FIRST])
        ADD("%s%u started", sep, st->nodes[RDZV_STORY_FIRST]);
    if (st->pause_max_ms)
        ADD("; paused up to %.3f s", st->pause_max_ms / 1000.0);
    ADD("; %u step(s) done again", st->redone);
    if (st->peer_bytes)
        ADD("; %llu bytes of state from peers", (unsigned long long)st->peer_bytes);
    if (st->ckpt_bytes)
        ADD("; %llu bytes read from the checkpoint of step %lld",
            (unsigned long long)st->ckpt_bytes, (long long)st->ckpt_step);
#undef ADD
    /* the round's entry, where it is in the ring (events_total numbers them) */
    uint64_t age = h->events_total - r->began_event;
    rdzv_tl_event *e = r->began_event && age < h->ev_n
                           ? &h->events[(h->ev_head + h->ev_n - 1 - (uint32_t)age) % h->ev_cap]
                           : NULL;
    if (e && e->kind == RDZV_TL_BEGAN && e->round == r->round) {
        e->count++;
        e->unix_ms = unix_ms();
        snprintf(e->node, sizeof e->node, "%s", node ? node : "");
        snprintf(e->text, sizeof e->text, "%s", t);
        return;
    }
    if (!make || (r->began_event && age >= h->ev_n))
        return; /* no change yet, or its entry is gone from the timeline */
    rdzv_health_note(h, RDZV_TL_BEGAN, r->round, node, -1, "%s", t);
    r->began_event = h->events_total;
}

void rdzv_health_story(rdzv_health *h, const char *node, const rdzv_msg *m) {
    if (h == NULL || m->u.story.kind >= RDZV_STORY_KINDS)
        return;
    rdzv_round_rec *r = NULL;
    for (uint32_t i = h->rounds_n; i-- > 0 && r == NULL;) {
        rdzv_round_rec *x = &h->rounds[(h->rounds_head + i) % h->rounds_cap];
        if (x->round == m->u.story.round)
            r = x;
    }
    if (r == NULL)
        return; /* a round no longer remembered */
    rdzv_round_story *st = &r->story;
    uint32_t kind = m->u.story.kind, pause = m->u.story.pause_ms;
    if (m->u.story.source == RDZV_STATE_PEER) {
        st->peer_bytes += m->u.story.state_bytes;
        h->cost.peer_bytes += m->u.story.state_bytes;
    } else if (m->u.story.source == RDZV_STATE_CHECKPOINT) {
        st->ckpt_bytes += m->u.story.state_bytes;
        h->cost.ckpt_bytes += m->u.story.state_bytes;
        if (m->u.story.state_step > st->ckpt_step)
            st->ckpt_step = m->u.story.state_step;
    }
    st->nodes[kind]++;
    h->cost.nodes[kind]++;
    keep_node_story(st, node, m);
    if (kind == RDZV_STORY_RESTART) {
        uint32_t cause = m->u.story.cause < RDZV_CAUSES ? m->u.story.cause : RDZV_CAUSE_NONE;
        st->restarts[cause]++;
        h->cost.restarts[cause]++;
    }
    if (kind == RDZV_STORY_RESTART && st->why[0] == '\0')
        snprintf(st->why, sizeof st->why, "%s: %s", node,
                 m->u.story.why[0] ? m->u.story.why : "restarted");
    if (m->u.story.redone > st->redone) {
        h->cost.redone += m->u.story.redone - st->redone;
        st->redone = m->u.story.redone;
    }
    /* a first round's or warm join's time is a start, not a pause */
    if (pause != RDZV_STORY_UNKNOWN && kind != RDZV_STORY_FIRST && kind != RDZV_STORY_WARM)
        count_pause(h, st, pause, m->u.story.nproc);
    note_began(h, r, node, kind != RDZV_STORY_FIRST);
}

void rdzv_health_hang(rdzv_health *h, uint32_t round, const char *node, uint32_t rank,
                      const char *message) {
    if (h == NULL)
        return;
    h->hangs_total++;
    rdzv_health_note(h, RDZV_TL_HANG, round, node, rank, "rank %u on %s hung: %s", rank, node,
                     message);
    h->has_hang = 1;
    memset(&h->hang, 0, sizeof h->hang);
    h->hang.unix_ms = unix_ms();
    h->hang.kind = RDZV_TL_HANG;
    h->hang.round = round;
    h->hang.count = 1;
    h->hang.rank = rank;
    snprintf(h->hang.node, sizeof h->hang.node, "%s", node);
    snprintf(h->hang.text, sizeof h->hang.text, "%s", message);
}

/* The k-th smallest of v[0..n) (v is reordered): quickselect, Hoare's partition. */
static uint32_t select_kth(uint32_t *v, uint32_t n, uint32_t k) {
    int64_t lo = 0, hi = (int64_t)n - 1;
    while (lo < hi) {
        uint32_t pivot = v[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot)
                i++;
            while (v[j] > pivot)
                j--;
            if (i <= j) {
                uint32_t t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        }
        if ((int64_t)k <= j)
            hi = j;
        else if ((int64_t)k >= i)
            lo = i;
        else
            break;
    }
    return v[k];
}

/* The lower median: with two ranks, the faster one (a straggler is above it
 * however few ranks report). */
static uint32_t lower_median(uint32_t *v, uint32_t n) { return select_kth(v, n, (n - 1) / 2); }

static int fresh(const rdzv_rank_health *r, uint64_t now) {
    uint64_t w = r->window_ms ? r->window_ms : 1000;
    return r->updated_ms && now - r->updated_ms <= 3 * w;
}

/* The job's medians over the ranks whose last report is recent (a rank that
 * stopped reporting, hung or gone, does not drag them). */
static void medians(rdzv_health *h, uint64_t now) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < h->nranks; i++)
        if (fresh(&h->ranks[i], now) && h->ranks[i].busy_us)
            h->scratch[n++] = h->ranks[i].busy_us;
    h->median_busy_us = n ? lower_median(h->scratch, n) : 0;
    n = 0;
    for (uint32_t i = 0; i < h->nranks; i++)
        if (fresh(&h->ranks[i], now) && h->ranks[i].st.step_time_us && h->ranks[i].st.steps)
            h->scratch[n++] = h->ranks[i].st.step_time_us;
    h->median_step_us = n ? lower_median(h->scratch, n) : 0;
    n = 0;
    for (uint32_t i = 0; i < h->nranks; i++)
        if (fresh(&h->ranks[i], now) && h->ranks[i].st.wait_us != UINT32_MAX &&
            h->ranks[i].st.steps)
            h->scratch[n++] = h->ranks[i].st.wait_us;
    h->median_wait_us = n ? lower_median(h->scratch, n) : UINT32_MAX;
    /* step rate in milli-steps per second, so that integers select it */
    n = 0;
    for (uint32_t i = 0; i < h->nranks; i++) {
        const rdzv_rank_health *r = &h->ranks[i];
        if (fresh(r, now) && r->window_ms) {
            uint64_t mrate = (uint64_t)r->st.steps * 1000000ull / r->window_ms;
            h->scratch[n++] = mrate > UINT32_MAX ? UINT32_MAX : (uint32_t)mrate;
        }
    }
    h->steps_per_s = n ? (float)select_kth(h->scratch, n, n / 2) / 1000.0f : 0.0f;
    h->median_ms = now;
    if (n && now - h->rate_last_ms >= RDZV_HEALTH_RATE_MIN_MS) {
        h->rate_last_ms = now;
        uint32_t slot = (h->rate_head + h->rate_n) % RDZV_HEALTH_RATE_SAMPLES;
        if (h->rate_n == RDZV_HEALTH_RATE_SAMPLES)
            h->rate_head = (h->rate_head + 1) % RDZV_HEALTH_RATE_SAMPLES;
        else
            h->rate_n++;
        h->rate[slot] = (rdzv_rate_sample){unix_ms(), h->steps_per_s, h->round};
    }
}

static void describe(const rdzv_health *h, const rdzv_rank_health *r, const char *node, int named,
                     char *out, size_t len) {
    char gpu[80] = "";
    if (r->st.gpu[0])
        snprintf(gpu, sizeof gpu, ", GPU %s", r->st.gpu);
    char wait[96] = "";
    if (h->median_wait_us != UINT32_MAX)
        snprintf(wait, sizeof wait, "; the job's ranks wait %.1f ms per step (median)",
                 h->median_wait_us / 1000.0);
    snprintf(out, len,
             "%s: rank %u (node %s, local rank %u%s): busy %.1f ms per step, %.2fx the job's "
             "median of %.1f ms (threshold %.2fx) for %u window(s)%s",
             named ? "straggler" : "straggler recovered", r->st.rank, node, r->st.local_rank, gpu,
             r->busy_us / 1000.0, (double)r->ratio, h->median_busy_us / 1000.0, h->threshold,
             named ? r->over : r->under, wait);
}

uint32_t rdzv_health_stats(rdzv_health *h, uint32_t node_rank, const char *node, uint32_t base,
                           uint32_t nproc, const rdzv_msg *m, uint64_t now_ms,
                           rdzv_health_notice_fn notice, void *ctx) {
    if (h == NULL || h->world == 0)
        return 0;
    h->stats_msgs++;
    if (h->ranks == NULL) {
        uint32_t n = h->world < RDZV_HEALTH_MAX_RANKS ? h->world : RDZV_HEALTH_MAX_RANKS;
        h->ranks = calloc(n, sizeof *h->ranks);
        h->scratch = calloc(n, sizeof *h->scratch);
        if (h->ranks == NULL || h->scratch == NULL) {
            ranks_free(h);
            return 0;
        }
        h->nranks = n;
    }
    rdzv_bytes walk = m->u.stats.ranks;
    rdzv_rank_stats st;
    uint32_t taken = 0;
    /* first every entry, then the verdicts: a node's ranks are judged against
     * medians that include each other */
    while (rdzv_stats_next(&walk, &st)) {
        if (st.rank < base || st.rank - base >= nproc || st.rank >= h->nranks) {
            h->stats_dropped++;
            continue;
        }
        rdzv_rank_health *r = &h->ranks[st.rank];
        if (r->updated_ms == 0)
            h->reported++;
        r->st = st;
        r->node_rank = node_rank;
        r->window_ms = m->u.stats.window_ms;
        r->updated_ms = now_ms ? now_ms : 1;
        if (st.steps && st.step_time_us)
            r->busy_us = st.wait_us != UINT32_MAX && st.wait_us <= st.step_time_us
                             ? st.step_time_us - st.wait_us
                             : st.step_time_us;
        taken++;
    }
    h->stats_ranks += taken;
    if (taken == 0)
        return 0;
    h->ckpt_stale = 1;
    if (h->median_ms == 0 || now_ms - h->median_ms >= RDZV_HEALTH_MEDIAN_MS)
        medians(h, now_ms);
    uint32_t med = h->median_busy_us;
    walk = m->u.stats.ranks;
    while (rdzv_stats_next(&walk, &st)) {
        if (st.rank < base || st.rank - base >= nproc || st.rank >= h->nranks)
            continue;
        rdzv_rank_health *r = &h->ranks[st.rank];
        if (!st.steps || !st.step_time_us || med == 0 || h->reported < 2)
            continue; /* no step finished in this window: nothing to judge */
        r->ratio = (float)r->busy_us / (float)med;
        int over = r->busy_us > h->threshold * med && r->busy_us > med + RDZV_HEALTH_MIN_EXCESS_US;
        if (over) {
            r->over++;
            r->under = 0;
        } else {
            r->under++;
            r->over = 0;
        }
        char text[RDZV_HEALTH_TEXT];
        if (!r->straggler && r->over >= h->windows) {
            r->straggler = 1;
            h->nstragglers++;
            h->stragglers_total++;
            describe(h, r, node, 1, text, sizeof text);
            rdzv_health_note(h, RDZV_TL_STRAGGLER, h->round, node, r->st.rank, "%s", text);
            if (notice)
                notice(ctx, r, 1, text);
        } else if (r->straggler && r->under >= h->windows) {
            r->straggler = 0;
            h->nstragglers--;
            describe(h, r, node, 0, text, sizeof text);
            rdzv_health_note(h, RDZV_TL_RECOVERED, h->round, node, r->st.rank, "%s", text);
            if (notice)
                notice(ctx, r, 0, text);
        }
    }
    return taken;
}

int rdzv_health_rank_has_ckpt(const rdzv_rank_health *r) {
    return r->updated_ms && (r->st.ckpt_local_step >= 0 || r->st.ckpt_durable_step >= 0 ||
                             r->st.ckpt_stall_ms || r->st.ckpt_drain_left);
}

const rdzv_health_ckpt *rdzv_health_checkpoint(rdzv_health *h) {
    static const rdzv_health_ckpt none = {0, -1, -1, 0, 0};
    if (h == NULL)
        return &none;
    if (!h->ckpt_stale)
        return &h->ckpt;
    rdzv_health_ckpt k = none;
    for (uint32_t i = 0; h->ranks && i < h->nranks; i++) {
        const rdzv_rank_health *r = &h->ranks[i];
        if (!rdzv_health_rank_has_ckpt(r))
            continue;
        if (k.ranks == 0 || r->st.ckpt_local_step < k.local_step)
            k.local_step = r->st.ckpt_local_step;
        if (k.ranks == 0 || r->st.ckpt_durable_step < k.durable_step)
            k.durable_step = r->st.ckpt_durable_step;
        if (r->st.ckpt_stall_ms > k.stall_ms)
            k.stall_ms = r->st.ckpt_stall_ms;
        k.drain_left += r->st.ckpt_drain_left;
        k.ranks++;
    }
    /* the steps are every rank's: one without figures (not heard from yet, an
     * older launcher's, no save yet) holds none */
    if (k.ranks < h->nranks)
        k.local_step = k.durable_step = -1;
    h->ckpt = k;
    h->ckpt_stale = 0;
    return &h->ckpt;
}

static const rdzv_health *top_h; /* qsort's context (the loop thread only) */

static int cmp_top(const void *a, const void *b) {
    const rdzv_rank_health *x = &top_h->ranks[*(const uint32_t *)a];
    const rdzv_rank_health *y = &top_h->ranks[*(const uint32_t *)b];
    if (x->straggler != y->straggler)
        return x->straggler ? -1 : 1;
    if (x->busy_us != y->busy_us)
        return x->busy_us > y->busy_us ? -1 : 1;
    return 0;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

uint32_t rdzv_health_top(const rdzv_health *h, uint32_t *out, uint32_t max) {
    if (h == NULL || h->ranks == NULL || max == 0)
        return 0;
    uint32_t *idx = malloc((size_t)h->nranks * sizeof *idx);
    if (idx == NULL)
        return 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < h->nranks; i++)
        if (h->ranks[i].updated_ms)
            idx[n++] = i;
    if (n > max) {
        top_h = h;
        qsort(idx, n, sizeof *idx, cmp_top);
        n = max;
    }
    memcpy(out, idx, (size_t)n * sizeof *out);
    free(idx);
    qsort(out, n, sizeof *out, cmp_u32);
    return n;
}
