/* Round formation (rdzv_round.c) as a state machine: events in, decisions
 * out, the time an argument. No sockets, no sleeps: every ordering of joins,
 * failures and deadline expiries for 1-4 nodes is tried, then the single
 * cases (bounds, static ranks, timeouts, progress texts, a server restart,
 * refusals). test_reform.c keeps the end-to-end cases through real sockets. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "gb_log.h"
#include "rdzv_round.h"

#define MAXN 8
#define LC 1000 /* the last call of every elastic job here, ms */

static rdzv_round R;
static rdzv_rmember M[MAXN];
static rdzv_round_out O;
static uint32_t g_min, g_max, g_lc;
static int g_static;
static int have_round;

static void fini(void) {
    if (have_round)
        rdzv_round_free(&R);
    have_round = 0;
    rdzv_round_out_free(&O);
}

static void init(void) { gb_log_set_level(GB_LOG_ERROR); /* round ends are warnings */ }

TestSuite(round, .init = init, .fini = fini, .timeout = 60);

static rdzv_msg jmsg(const char *run, int i) {
    rdzv_msg m = {.type = RDZV_JOIN, .req_id = 100u + (uint32_t)i};
    snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "%s", run);
    snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "n%d", i);
    snprintf(m.u.join.addr, sizeof m.u.join.addr, "10.0.0.%d", i + 1);
    snprintf(m.u.join.instance, sizeof m.u.join.instance, "n%d-i", i);
    m.u.join.master_port = (uint16_t)(29500 + i);
    m.u.join.nproc = (uint32_t)i + 1; /* heterogeneous: base ranks are sums */
    m.u.join.static_rank = g_static ? i : -1;
    m.u.join.min_nodes = g_min;
    m.u.join.max_nodes = g_max;
    m.u.join.last_call_ms = g_lc;
    m.u.join.join_timeout_ms = 60000;
    m.u.join.heartbeat_timeout_ms = 3000;
    return m;
}

/* A new job min:max (static: node i has node rank i). */
static void job(uint32_t min, uint32_t max, uint32_t last_call, int is_static) {
    fini();
    g_min = min, g_max = max, g_lc = last_call, g_static = is_static;
    memset(M, 0, sizeof M);
    for (int i = 0; i < MAXN; i++)
        M[i].prev_rank = -1;
    rdzv_msg m = jmsg("job", 0);
    cr_assert_eq(rdzv_round_init(&R, &m, 5000), GPL_OK);
    have_round = 1;
}

/* Node i joins at now; the decisions of this call alone are in O. */
static gpl_result_t join(int i, uint64_t now) {
    rdzv_round_out_reset(&O);
    rdzv_msg m = jmsg("job", i);
    char err[RDZV_MAX_MSG + 1] = "";
    return rdzv_round_join(&R, &M[i], &m, now, &O, err, sizeof err);
}

static void tick(uint64_t now) {
    rdzv_round_out_reset(&O);
    rdzv_round_tick(&R, now, &O);
}

/* As the server does after every event: a tick at the same time, its
 * decisions added to the event's. */
static void tick_too(uint64_t now) { rdzv_round_tick(&R, now, &O); }

static size_t count(rdzv_decision_kind k) {
    size_t n = 0;
    for (size_t i = 0; i < O.n; i++)
        n += O.d[i].kind == k;
    return n;
}

static const rdzv_decision *find(rdzv_decision_kind k) {
    for (size_t i = 0; i < O.n; i++)
        if (O.d[i].kind == k)
            return &O.d[i];
    return NULL;
}

/* The one ASSIGN in O: n members, each keeping its previous rank in range,
 * base ranks the sums of nproc in rank order, the world their total. */
static void check_assign(uint32_t round, uint32_t n, const char *ctx) {
    const rdzv_decision *d = find(RDZV_DO_ASSIGN);
    cr_assert(d != NULL, "%s: no round started", ctx);
    cr_assert_eq(count(RDZV_DO_ASSIGN), 1, "%s", ctx);
    cr_assert_eq(d->round, round, "%s: round %u, not %u", ctx, d->round, round);
    cr_assert_eq(d->nmembers, n, "%s: %u members, not %u", ctx, d->nmembers, n);
    uint32_t base = 0;
    for (uint32_t i = 0; i < n; i++) {
        const rdzv_rmember *m = d->members[i];
        cr_assert(m != NULL && m->node_rank == i && m->active && !m->pending, "%s: rank %u", ctx,
                  i);
        cr_assert_eq(m->base_rank, base, "%s: rank %u base %u, not %u", ctx, i, m->base_rank, base);
        base += m->nproc;
        cr_assert_eq(m->join_req, 100u + (uint32_t)(m - M), "%s", ctx);
    }
    cr_assert_eq(d->world_size, base, "%s", ctx);
    cr_assert_eq(R.state, RDZV_R_RUNNING, "%s", ctx);
    cr_assert_eq(R.round, round, "%s", ctx);
}

static int next_perm(int *a, int n) {
    int i = n - 2;
    while (i >= 0 && a[i] >= a[i + 1])
        i--;
    if (i < 0)
        return 0;
    int j = n - 1;
    while (a[j] <= a[i])
        j--;
    int t = a[i];
    a[i] = a[j];
    a[j] = t;
    for (int l = i + 1, r = n - 1; l < r; l++, r--)
        t = a[l], a[l] = a[r], a[r] = t;
    return 1;
}

/* ---- every ordering ---- */

Test(round, every_order_of_joins_and_the_last_call_for_1_to_4_nodes) {
    int runs = 0;
    for (int n = 1; n <= 4; n++)
        for (uint32_t min = 1; min <= (uint32_t)n; min++)
            for (uint32_t max = min; max <= 4; max++)
                for (int p = 0; p <= n; p++) { /* the last call expires after p joins */
                    int order[4] = {0, 1, 2, 3};
                    do {
                        char ctx[96];
                        snprintf(ctx, sizeof ctx,
                                 "n=%d %u:%u expiry after %d joins, order %d%d%d%d", n, min, max, p,
                                 order[0], order[1], order[2], order[3]);
                        job(min, max, LC, 0);
                        uint64_t t = 0;
                        uint32_t joined = 0, started = 0; /* members of round 1 */
                        for (int step = 0; step <= n; step++) {
                            if (step == p) {
                                t += LC + 1;
                                tick(t);
                                if (!started && joined >= min) {
                                    check_assign(1, joined, ctx);
                                    started = joined;
                                } else {
                                    cr_assert_eq(count(RDZV_DO_ASSIGN), 0, "%s", ctx);
                                }
                            }
                            if (step == n)
                                break;
                            int who = order[step];
                            t += 1;
                            cr_assert_eq(join(who, t), GPL_OK, "%s", ctx);
                            joined++;
                            if (started) {
                                /* running: the newcomer waits; with room the round ends */
                                const rdzv_decision *w = find(RDZV_DO_WAITING);
                                cr_assert(w != NULL, "%s: no WAITING", ctx);
                                cr_assert_eq(w->count, joined - started, "%s", ctx);
                                cr_assert_eq(w->total, started, "%s", ctx);
                                if (started < max) {
                                    const rdzv_decision *o = find(RDZV_DO_ROUND_OVER);
                                    cr_assert(o && o->reason == RDZV_REASON_SCALE_UP, "%s", ctx);
                                    cr_assert_eq(o->nmembers, started, "%s", ctx);
                                    break; /* the rest is a new first round */
                                }
                                cr_assert_eq(count(RDZV_DO_ROUND_OVER), 0, "%s", ctx);
                            } else if (joined == max) {
                                check_assign(1, max, ctx); /* full: no last call */
                                started = joined;
                            } else {
                                cr_assert_eq(O.n, 0, "%s: decided before the last call", ctx);
                            }
                        }
                        /* ranks follow arrival order */
                        for (uint32_t r = 0; r < started && r < (uint32_t)n; r++)
                            cr_assert_eq(M[order[r]].node_rank, r, "%s", ctx);
                        runs++;
                    } while (next_perm(order, n));
                }
    cr_log_info("%d orderings", runs);
}

enum fail_kind { F_LEAVE, F_HEARTBEAT, F_FAIL, F_HANG, F_KINDS };

/* Node f of the running round fails as kind says, at now. */
static void fail(int f, int kind, uint64_t now) {
    rdzv_round_out_reset(&O);
    switch (kind) {
    case F_LEAVE:
        rdzv_round_leave(&M[f], "peer closed the connection", now, &O);
        break;
    case F_HEARTBEAT: /* the server then closes its connection */
        rdzv_round_heartbeat_lost(&M[f], 3500, now, &O);
        rdzv_round_leave(&M[f], "heartbeat timeout", now, &O);
        break;
    case F_FAIL:
        rdzv_round_fail(&M[f], 0, 0, "worker 0 exited with 1", now, &O);
        break;
    case F_HANG:
        rdzv_round_fail(&M[f], 1, 2, "no step for 3 s", now, &O);
        break;
    }
}

static const uint32_t reason_of[F_KINDS] = {RDZV_REASON_DISCONNECT, RDZV_REASON_HEARTBEAT,
                                            RDZV_REASON_FAILED, RDZV_REASON_HUNG};

/* Round 1 of k nodes in index order (max nodes when k == max, else after the last call). */
static uint64_t round_one(int k) {
    uint64_t t = 0;
    for (int i = 0; i < k; i++)
        cr_assert_eq(join(i, ++t), GPL_OK);
    if (find(RDZV_DO_ASSIGN) == NULL) {
        t += LC;
        tick(t);
    }
    check_assign(1, (uint32_t)k, "round 1");
    return t;
}

Test(round, every_order_of_survivor_rejoins_and_the_deadline_after_each_failure) {
    int runs = 0;
    for (int k = 2; k <= 4; k++)
        for (uint32_t min = 1; min <= (uint32_t)k; min++)
            for (int kind = 0; kind < F_KINDS; kind++)
                for (int f = 0; f < k; f++) {
                    /* the survivors, then -1 for the deadline */
                    int ev[5], nev = 0;
                    for (int i = 0; i < k; i++)
                        if (i != f || kind == F_FAIL || kind == F_HANG)
                            ev[nev++] = i;
                    uint32_t nsurv = (uint32_t)nev;
                    ev[nev++] = -1;
                    /* sorted for next_perm */
                    for (int a = 0; a < nev; a++)
                        for (int b = a + 1; b < nev; b++)
                            if (ev[b] < ev[a]) {
                                int t = ev[a];
                                ev[a] = ev[b], ev[b] = t;
                            }
                    do {
                        char ctx[128];
                        snprintf(ctx, sizeof ctx, "k=%d min %u kind %d culprit %d, events", k, min,
                                 kind, f);
                        for (int e = 0; e < nev; e++)
                            snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " %d", ev[e]);
                        job(min, 4, LC, 0);
                        uint64_t t0 = round_one(k) + 10;
                        fail(f, kind, t0);
                        const rdzv_decision *o = find(RDZV_DO_ROUND_OVER);
                        cr_assert(o != NULL, "%s: no ROUND_OVER", ctx);
                        cr_assert_eq(count(RDZV_DO_ROUND_OVER), 1, "%s", ctx);
                        cr_assert_eq(o->reason, reason_of[kind], "%s", ctx);
                        cr_assert_eq(o->node_rank, (uint32_t)f, "%s", ctx);
                        cr_assert_str_eq(o->host, M[f].hostname, "%s", ctx);
                        uint32_t told = 0;
                        for (uint32_t i = 0; i < o->nmembers; i++)
                            told += o->members[i] != NULL;
                        /* a node that closed is not told; one whose heartbeats stopped is
                         * (its connection closes after) */
                        cr_assert_eq(told, kind == F_LEAVE ? k - 1 : k, "%s: %u told", ctx, told);
                        int reforming = nsurv >= min;
                        uint32_t back = 0, started = 0;
                        int expired = 0;
                        uint64_t t = t0;
                        for (int e = 0; e < nev && !started; e++) {
                            if (ev[e] < 0) {
                                expired = 1;
                                t = t0 + LC;
                                tick(t);
                            } else {
                                t = expired ? t + 1 : t0 + 1 + (uint64_t)e;
                                cr_assert_eq(join(ev[e], t), GPL_OK, "%s", ctx);
                                back++;
                                tick_too(t);
                            }
                            int should = reforming && back >= min && (back == nsurv || expired);
                            if (should) {
                                check_assign(2, back, ctx);
                                started = back;
                            } else {
                                cr_assert_eq(count(RDZV_DO_ASSIGN), 0, "%s: started with %u", ctx,
                                             back);
                            }
                        }
                        if (!reforming) {
                            /* too few survivors: a first round, the last call from the minimum */
                            cr_assert_eq(started, 0, "%s", ctx);
                            cr_assert(!R.reforming, "%s", ctx);
                        } else {
                            cr_assert(started > 0, "%s: never started", ctx);
                            /* survivors keep their ranks where in range */
                            for (int i = 0; i < k; i++)
                                if (M[i].active && M[i].prev_rank < (int64_t)started)
                                    cr_assert_eq(M[i].node_rank, (uint32_t)M[i].prev_rank, "%s",
                                                 ctx);
                        }
                        runs++;
                    } while (next_perm(ev, nev));
                }
    cr_log_info("%d orderings", runs);
}

Test(round, two_failures_in_one_tick_end_the_round_once) {
    for (int k = 3; k <= 4; k++)
        for (uint32_t min = 1; min <= (uint32_t)k; min++)
            for (int kind = 0; kind < F_KINDS; kind++) {
                char ctx[64];
                snprintf(ctx, sizeof ctx, "k=%d min %u kind %d", k, min, kind);
                job(min, 4, LC, 0);
                uint64_t t = round_one(k) + 10;
                fail(0, kind, t);
                cr_assert_eq(count(RDZV_DO_ROUND_OVER), 1, "%s", ctx);
                fail(1, kind, t); /* the same tick */
                cr_assert_eq(count(RDZV_DO_ROUND_OVER), 0, "%s: the round ended twice", ctx);
                int leaves = kind == F_LEAVE || kind == F_HEARTBEAT;
                /* a node that left is waited for no more; one whose workers failed
                 * is still a survivor of the round */
                uint32_t nsurv = leaves ? (uint32_t)k - 2 : (uint32_t)k;
                if (nsurv >= min)
                    cr_assert_eq(R.reform_left, nsurv, "%s", ctx);
                uint32_t back = 0;
                for (int i = leaves ? 2 : 0; i < k; i++) {
                    cr_assert_eq(join(i, ++t), GPL_OK, "%s", ctx);
                    back++;
                }
                if (nsurv >= min)
                    check_assign(2, back, ctx); /* at once: no last call */
                else
                    cr_assert_eq(count(RDZV_DO_ASSIGN), 0, "%s", ctx);
            }
}

/* ---- bounds ---- */

Test(round, over_max_the_rest_wait_and_hear_the_job_is_done) {
    job(2, 4, LC, 0);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(join(i, 1 + (uint64_t)i), GPL_OK);
        cr_assert_eq(O.n, 0);
    }
    cr_assert_eq(join(3, 10), GPL_OK);
    check_assign(1, 4, "at max");
    for (int i = 4; i < 6; i++) {
        cr_assert_eq(join(i, 20 + (uint64_t)i), GPL_OK);
        const rdzv_decision *w = find(RDZV_DO_WAITING);
        cr_assert(w && w->count == (uint32_t)i - 3 && w->total == 4);
        cr_assert_eq(count(RDZV_DO_ROUND_OVER), 0, "a full round does not re-form");
    }
    for (int i = 0; i < 4; i++) {
        rdzv_round_out_reset(&O);
        rdzv_round_done(&M[i], &O);
        rdzv_round_done(&M[i], &O); /* twice: counted once */
        cr_assert_eq(count(RDZV_DO_JOB_DONE), i == 3 ? 1u : 0u);
    }
    const rdzv_decision *d = find(RDZV_DO_JOB_DONE);
    cr_assert_eq(d->npending, 2);
    cr_assert_eq(d->nmembers, 4);
    cr_assert_eq(R.state, RDZV_R_DONE);
    /* a 1:3 job of one node finishes; its run id used again starts over */
    job(1, 3, LC, 0);
    join(0, 1);
    tick(1 + LC);
    check_assign(1, 1, "1 of 1:3");
    rdzv_round_out_reset(&O);
    rdzv_round_done(&M[0], &O);
    cr_assert_eq(count(RDZV_DO_JOB_DONE), 1);
    cr_assert_eq(join(1, 5000), GPL_OK);
    cr_assert_eq(R.state, RDZV_R_GATHERING);
    cr_assert(!M[0].active, "the finished round's node is in no round");
    tick(5000 + LC);
    check_assign(2, 1, "started over");
}

Test(round, one_node_jobs_and_the_minimum) {
    job(1, 1, LC, 0);
    cr_assert_eq(join(0, 1), GPL_OK);
    check_assign(1, 1, "1:1 at once");
    job(3, 4, LC, 0);
    join(0, 1);
    join(1, 2);
    tick(10 * LC);
    cr_assert_eq(count(RDZV_DO_ASSIGN), 0, "under the minimum");
    join(2, 10 * LC + 1); /* the minimum: the last call counts from here */
    tick(11 * LC);
    cr_assert_eq(count(RDZV_DO_ASSIGN), 0, "before the last call ended");
    tick(11 * LC + 1);
    check_assign(1, 3, "3:4 after the last call");
}

/* ---- static ranks ---- */

Test(round, static_ranks_heterogeneous_nproc_and_refusals) {
    job(3, 3, 0, 1);
    char err[RDZV_MAX_MSG + 1];
    cr_assert_eq(join(2, 1), GPL_OK);
    cr_assert_eq(join(0, 2), GPL_OK);
    /* a second node claiming rank 0 (another instance) is refused, naming both */
    rdzv_msg dup = jmsg("job", 0);
    snprintf(dup.u.join.hostname, sizeof dup.u.join.hostname, "intruder");
    snprintf(dup.u.join.instance, sizeof dup.u.join.instance, "other");
    rdzv_round_out_reset(&O);
    cr_assert_eq(rdzv_round_join(&R, &M[5], &dup, 3, &O, err, sizeof err), GPL_ERR_EXISTS);
    cr_assert(strstr(err, "duplicate node rank 0") && strstr(err, "n0") && strstr(err, "intruder"),
              "%s", err);
    cr_assert(M[5].r == NULL && R.npending == 2, "a refusal changes nothing");
    /* out of range, and a mismatched mode */
    rdzv_msg far = jmsg("job", 0);
    far.u.join.static_rank = 7;
    cr_assert_eq(rdzv_round_join(&R, &M[5], &far, 3, &O, err, sizeof err), GPL_ERR_INVALID_ARG);
    cr_assert(strstr(err, "node rank 7") && strstr(err, "ranks 0..2"), "%s", err);
    rdzv_msg cnt = jmsg("job", 1);
    cnt.u.join.max_nodes = 4;
    cr_assert_eq(rdzv_round_join(&R, &M[5], &cnt, 3, &O, err, sizeof err), GPL_ERR_CONFIG);
    cr_assert(strstr(err, "node n1 asks job job for 3:4 nodes") &&
                  strstr(err, "node n0 started it with 3:3 nodes"),
              "%s", err);
    rdzv_msg el = jmsg("job", 1);
    el.u.join.static_rank = -1;
    cr_assert_eq(rdzv_round_join(&R, &M[5], &el, 3, &O, err, sizeof err), GPL_ERR_CONFIG);
    cr_assert(strstr(err, "elastic") && strstr(err, "static"), "%s", err);
    /* the same instance on a new connection replaces its stale self */
    rdzv_msg again = jmsg("job", 0); /* (no AGAIN flag: its rank's slot names it) */
    rdzv_round_out_reset(&O);
    cr_assert_eq(rdzv_round_join(&R, &M[6], &again, 4, &O, err, sizeof err), GPL_OK);
    cr_assert(!M[0].pending && M[6].pending && R.npending == 2);
    cr_assert_eq(join(1, 5), GPL_OK);
    const rdzv_decision *d = find(RDZV_DO_ASSIGN);
    cr_assert(d && d->nmembers == 3 && d->members[0] == &M[6] && d->members[1] == &M[1] &&
              d->members[2] == &M[2]);
    /* base ranks in node-rank order: nproc 1 (M6 as n0), 2, 3 */
    cr_assert_eq(M[1].base_rank, 1);
    cr_assert_eq(M[2].base_rank, 3);
    cr_assert_eq(d->world_size, 6);
    /* static jobs never scale up; a node already in the round cannot join again */
    cr_assert_eq(join(1, 6), GPL_ERR_STATE);
}

Test(round, a_missing_static_rank_is_named_in_progress_and_at_the_join_timeout) {
    job(4, 4, 0, 1);
    join(0, 0);
    join(2, 0);
    tick(RDZV_PROGRESS_AFTER_MS - 1);
    cr_assert_eq(O.n, 0, "progress before %d ms", RDZV_PROGRESS_AFTER_MS);
    tick(RDZV_PROGRESS_AFTER_MS);
    cr_assert_eq(count(RDZV_DO_PROGRESS), 2);
    const rdzv_decision *p = find(RDZV_DO_PROGRESS);
    cr_assert_str_eq(p->text, "2 of 4 nodes joined; missing node ranks 1, 3");
    cr_assert(p->count == 2 && p->total == 4 && p->waited_ms == RDZV_PROGRESS_AFTER_MS);
    tick(RDZV_PROGRESS_AFTER_MS + RDZV_PROGRESS_MS - 1);
    cr_assert_eq(O.n, 0, "progress again before its interval");
    tick(RDZV_PROGRESS_AFTER_MS + RDZV_PROGRESS_MS);
    cr_assert_eq(count(RDZV_DO_PROGRESS), 2);
    tick(60000);
    cr_assert_eq(count(RDZV_DO_TIMEOUT), 2);
    p = find(RDZV_DO_TIMEOUT);
    cr_assert(strstr(p->text, "missing node ranks 1, 3") && p->waited_ms == 60000, "%s", p->text);
    cr_assert_eq(R.npending, 0, "timed-out nodes wait no more");
}

/* ---- progress texts ---- */

Test(round, progress_says_the_minimum_the_last_call_and_the_survivors) {
    job(2, 3, 5000, 0);
    join(0, 0);
    tick(RDZV_PROGRESS_AFTER_MS);
    cr_assert_str_eq(find(RDZV_DO_PROGRESS)->text,
                     "1 node(s) joined; 1 more needed for the minimum of 2");
    join(1, 3000);
    tick(3000 + RDZV_PROGRESS_AFTER_MS);
    cr_assert_str_eq(find(RDZV_DO_PROGRESS)->text,
                     "2 node(s) joined, the minimum is 2; last call: the round starts in 3 s and "
                     "takes up to 1 more node(s)");
    tick(8000);
    check_assign(1, 2, "last call");
    join(2, 8001); /* a third node waits; the round has room: scale-up */
    cr_assert_eq(find(RDZV_DO_ROUND_OVER)->reason, RDZV_REASON_SCALE_UP);
    job(2, 4, 20000, 0);
    uint64_t t = round_one(4);
    fail(3, F_LEAVE, t);
    join(0, t + 1);
    tick(t + 1 + RDZV_PROGRESS_AFTER_MS);
    const char *s = find(RDZV_DO_PROGRESS)->text;
    cr_assert(strstr(s, "1 node(s) joined; round 1 ended (n3): waiting for 2 more of its "
                        "survivors to re-join, at most 18 s more"),
              "%s", s);
    /* a second failure: survivor n2 goes before re-joining; n1 comes back */
    rdzv_round_out_reset(&O);
    rdzv_round_leave(&M[2], "gone", t + 3000, &O);
    cr_assert_eq(O.n, 0);
    join(1, t + 3001);
    check_assign(2, 2, "the second failure stopped the wait");
}

Test(round, a_node_arriving_while_survivors_rejoin_is_taken_in) {
    job(2, 4, 20000, 0);
    uint64_t t = round_one(4);
    fail(3, F_LEAVE, t);
    fail(2, F_LEAVE, t + 1);
    cr_assert_eq(join(4, t + 2), GPL_OK); /* a newcomer */
    cr_assert_eq(count(RDZV_DO_ASSIGN), 0);
    join(0, t + 3);
    cr_assert_eq(count(RDZV_DO_ASSIGN), 0);
    join(1, t + 4);
    check_assign(2, 3, "survivors and the newcomer");
    cr_assert(M[0].node_rank == 0 && M[1].node_rank == 1 && M[4].node_rank == 2);
}

Test(round, a_survivor_that_joins_another_job_is_not_waited_for) {
    job(1, 3, 20000, 0);
    uint64_t t = round_one(3);
    fail(2, F_LEAVE, t);
    cr_assert(rdzv_round_awaits(&M[0]));
    /* n0 joins job B instead: it leaves this job */
    rdzv_round B;
    rdzv_msg bm = jmsg("B", 0);
    bm.u.join.min_nodes = bm.u.join.max_nodes = 2;
    cr_assert_eq(rdzv_round_init(&B, &bm, 5000), GPL_OK);
    char err[RDZV_MAX_MSG + 1];
    rdzv_round_out_reset(&O);
    cr_assert_eq(rdzv_round_join(&B, &M[0], &bm, t + 1, &O, err, sizeof err), GPL_OK);
    cr_assert(M[0].r == &B && R.nmembers == 1 && B.nmembers == 1);
    join(1, t + 2);
    check_assign(2, 1, "without n0");
    rdzv_round_out_reset(&O);
    rdzv_round_leave(&M[0], "closed", t + 3, &O);
    rdzv_round_free(&B);
}

/* ---- a server restart ---- */

Test(round, a_round_resumed_after_a_restart_ends_when_a_node_does_not_come_back) {
    job(2, 3, LC, 0);
    rdzv_msg m = jmsg("job", 0);
    m.flags = RDZV_JOIN_RESUME;
    m.u.join.round = 7;
    m.u.join.node_rank = 1;
    m.u.join.nnodes = 3;
    m.u.join.base_rank = 4;
    m.u.join.world_size = 9;
    char err[RDZV_MAX_MSG + 1];
    rdzv_round_out_reset(&O);
    cr_assert_eq(rdzv_round_join(&R, &M[0], &m, 1000, &O, err, sizeof err), GPL_OK);
    const rdzv_decision *d = find(RDZV_DO_RESUMED);
    cr_assert(d && d->m == &M[0] && d->round == 7 && d->node_rank == 1 && d->total == 3 &&
              d->world_size == 9 && M[0].base_rank == 4);
    cr_assert(R.state == RDZV_R_RUNNING && R.round == 7);
    /* a node of another round is refused; node rank 0 comes back */
    rdzv_msg old = m;
    old.u.join.round = 6;
    old.u.join.node_rank = 0;
    cr_assert_eq(rdzv_round_join(&R, &M[1], &old, 1100, &O, err, sizeof err), GPL_ERR_ROUND_OVER);
    cr_assert(strstr(err, "round 6") && strstr(err, "at round 7"), "%s", err);
    old.u.join.round = 7;
    cr_assert_eq(rdzv_round_join(&R, &M[1], &old, 1100, &O, err, sizeof err), GPL_OK);
    /* node rank 2 never does: two heartbeat timeouts (2 x 3 s) after the first */
    tick(1000 + 6000);
    cr_assert_eq(count(RDZV_DO_ROUND_OVER), 0);
    tick(1000 + 6001);
    d = find(RDZV_DO_ROUND_OVER);
    cr_assert(d && d->reason == RDZV_REASON_DISCONNECT &&
                  strstr(d->text, "node rank 2 did not reconnect"),
              "%s", d ? d->text : "none");
    cr_assert_eq(R.reform_left, 2, "both that came back are survivors");
}

/* ---- what each decision names stays valid ---- */

Test(round, a_leaving_member_is_not_among_those_told) {
    job(3, 3, LC, 0);
    round_one(3);
    rdzv_round_out_reset(&O);
    rdzv_round_leave(&M[1], "peer closed the connection", 50, &O);
    const rdzv_decision *d = find(RDZV_DO_ROUND_OVER);
    cr_assert(d && d->nmembers == 3 && d->members[0] == &M[0] && d->members[1] == NULL &&
              d->members[2] == &M[2]);
    cr_assert(strstr(d->text, "node n1 (10.0.0.2, node rank 1) lost its connection to the "
                              "rendezvous (peer closed the connection)"),
              "%s", d->text);
    cr_assert(M[1].r == NULL && R.nmembers == 2 && !M[1].active);
    /* the culprit's name outlives it */
    memset(&M[1], 0xee, sizeof M[1].hostname);
    cr_assert_str_eq(d->host, "n1");
}

/* ---- warm joins (a new node starts its workers before the round takes it) ---- */

static gpl_result_t join_warm(int i, uint64_t now) {
    rdzv_round_out_reset(&O);
    rdzv_msg m = jmsg("job", i);
    m.flags = RDZV_JOIN_WARM;
    char err[RDZV_MAX_MSG + 1] = "";
    return rdzv_round_join(&R, &M[i], &m, now, &O, err, sizeof err);
}

static void node(int i, uint32_t flags, uint64_t now) {
    rdzv_round_out_reset(&O);
    rdzv_round_node(&M[i], flags, now, &O);
}

/* Every node of the round live: a warm joiner is held (told alone, the round
 * goes on) until it is ready; then the round ends and the old nodes re-form
 * without the last call: the round starts once they are all back. */
Test(round, a_warm_joiner_is_held_until_ready_then_taken_in_without_the_last_call) {
    job(2, 4, LC, 0);
    uint64_t t = round_one(2);
    node(0, RDZV_NODE_LIVE, t);
    node(1, RDZV_NODE_LIVE, t);
    cr_assert_eq(O.n, 0, "saying live decides nothing");
    cr_assert_eq(join_warm(2, t + 1), GPL_OK);
    const rdzv_decision *w = find(RDZV_DO_WARM);
    cr_assert(w != NULL && w->m == &M[2], "the joiner is told to start its workers");
    cr_assert_eq(w->total, 2);
    cr_assert_eq(count(RDZV_DO_ROUND_OVER), 0, "the round goes on while it starts");
    cr_assert_eq(R.state, RDZV_R_RUNNING);
    tick(t + 30000); /* no deadline ends a hold: the joiner's launcher bounds it */
    cr_assert_eq(count(RDZV_DO_ROUND_OVER), 0);
    cr_assert_eq(count(RDZV_DO_TIMEOUT), 0);
    node(2, RDZV_NODE_READY, t + 30001);
    const rdzv_decision *o = find(RDZV_DO_ROUND_OVER);
    cr_assert(o != NULL && o->reason == RDZV_REASON_SCALE_UP, "ready: the round ends");
    cr_assert(strstr(o->text, "n2") && strstr(o->text, "re-form in place"), "%s", o->text);
    join(0, t + 30002);
    cr_assert_eq(count(RDZV_DO_ASSIGN), 0);
    join(1, t + 30003); /* every old node back: no last call */
    check_assign(2, 3, "the old nodes and the warm joiner");
    cr_assert(M[0].node_rank == 0 && M[1].node_rank == 1 && M[2].node_rank == 2);
    cr_assert_eq(M[2].warm, 0);
    cr_assert(M[0].live && M[1].live, "live is kept across rounds");
}

/* A node of the round that does not re-form in place: a warm join ends the
 * round at once, as any join does (and the last call applies). */
Test(round, a_warm_join_ends_the_round_at_once_unless_every_node_is_live) {
    job(2, 4, 1000, 0);
    uint64_t t = round_one(2);
    node(0, RDZV_NODE_LIVE, t);
    cr_assert_eq(join_warm(2, t + 1), GPL_OK);
    cr_assert_eq(count(RDZV_DO_WARM), 0);
    cr_assert_eq(find(RDZV_DO_ROUND_OVER)->reason, RDZV_REASON_SCALE_UP);
    join(0, t + 2);
    join(1, t + 3);
    cr_assert_eq(count(RDZV_DO_ASSIGN), 0, "a cold scale-up keeps the last call");
    tick(t + 3 + 1000);
    check_assign(2, 3, "after the last call");
}

/* A held joiner's wait ends when a node of the round stops being live (its
 * workers were restarted): the round ends to take the joiner in then; and
 * with two held joiners the round ends once both are ready. */
Test(round, a_hold_ends_when_a_node_is_no_longer_live_or_every_joiner_is_ready) {
    job(2, 4, LC, 0);
    uint64_t t = round_one(2);
    node(0, RDZV_NODE_LIVE, t);
    node(1, RDZV_NODE_LIVE, t);
    join_warm(2, t + 1);
    join_warm(3, t + 2);
    cr_assert_eq(count(RDZV_DO_WARM), 1);
    node(2, RDZV_NODE_READY, t + 3);
    cr_assert_eq(count(RDZV_DO_ROUND_OVER), 0, "n3 still starts its workers");
    node(1, 0, t + 4);
    const rdzv_decision *o = find(RDZV_DO_ROUND_OVER);
    cr_assert(o != NULL && strstr(o->text, "no longer re-forms in place"), "%s",
              o ? o->text : "no round end");
    join(0, t + 5);
    join(1, t + 6);
    check_assign(2, 4, "every waiting node taken in");

    /* again with both joiners ready, no one leaving live */
    job(2, 4, LC, 0);
    t = round_one(2);
    node(0, RDZV_NODE_LIVE, t);
    node(1, RDZV_NODE_LIVE, t);
    join_warm(2, t + 1);
    join_warm(3, t + 2);
    node(3, RDZV_NODE_READY, t + 3);
    cr_assert_eq(count(RDZV_DO_ROUND_OVER), 0, "n2 still starts its workers");
    node(2, RDZV_NODE_READY, t + 4);
    cr_assert_eq(count(RDZV_DO_ROUND_OVER), 1, "both ready: the round ends");
}

/* A node of the round lost while a warm joiner is held: the round ends for
 * the loss; the survivors' re-formed round takes the joiner in (its workers
 * take that round once they wait), and a held joiner that leaves ends nothing. */
Test(round, a_loss_while_a_joiner_is_held_takes_it_into_the_re_formed_round) {
    job(2, 4, LC, 0);
    uint64_t t = round_one(3);
    for (int i = 0; i < 3; i++)
        node(i, RDZV_NODE_LIVE, t);
    join_warm(3, t + 1);
    cr_assert_eq(count(RDZV_DO_WARM), 1);
    fail(2, F_LEAVE, t + 2);
    cr_assert_eq(find(RDZV_DO_ROUND_OVER)->reason, RDZV_REASON_DISCONNECT);
    join(0, t + 3);
    join(1, t + 4); /* every survivor back: no last call; the held joiner is in */
    check_assign(2, 3, "the survivors and the held joiner");
    cr_assert(M[3].active && M[3].node_rank == 2 && M[3].warm == 0);

    /* a held joiner that goes away: the round goes on */
    job(2, 4, LC, 0);
    t = round_one(2);
    node(0, RDZV_NODE_LIVE, t);
    node(1, RDZV_NODE_LIVE, t);
    join_warm(2, t + 1);
    rdzv_round_out_reset(&O);
    rdzv_round_leave(&M[2], "closed", t + 2, &O);
    cr_assert_eq(count(RDZV_DO_ROUND_OVER), 0);
    cr_assert_eq(R.state, RDZV_R_RUNNING);
    cr_assert_eq(R.npending, 0);
}

/* A launcher that gave up its connection while it waited (a path silent for
 * RDZV_PENDING_KEEP_MS) joins again on a new one: the JOIN that waits on the
 * old connection is stale and goes, so the round does not take the node
 * twice (once on a connection nobody reads). A JOIN sent before the one that
 * waits, arriving late across a slow link, is refused and changes nothing. */
Test(round, a_launcher_joining_again_on_a_new_connection_replaces_its_waiting_join) {
    job(2, 3, LC, 0);
    char err[RDZV_MAX_MSG + 1] = "";
    cr_assert_eq(join(0, 1), GPL_OK);
    rdzv_msg again = jmsg("job", 0);
    again.req_id = 150; /* the launcher's later JOIN, on a new connection */
    again.flags = RDZV_JOIN_AGAIN;
    rdzv_round_out_reset(&O);
    cr_assert_eq(rdzv_round_join(&R, &M[6], &again, 2, &O, err, sizeof err), GPL_OK);
    cr_assert(!M[0].pending && M[6].pending && R.npending == 1, "npending %u", R.npending);
    rdzv_msg late = jmsg("job", 0);
    late.req_id = 120; /* sent between the two, on a third connection given up too */
    late.flags = RDZV_JOIN_AGAIN;
    rdzv_round_out_reset(&O);
    cr_assert_eq(rdzv_round_join(&R, &M[7], &late, 3, &O, err, sizeof err), GPL_ERR_STATE);
    cr_assert(strstr(err, "node n0 (instance n0-i)") && strstr(err, "stale"), "%s", err);
    cr_assert(M[7].r == NULL && M[6].pending && R.npending == 1, "a refusal changes nothing");
    cr_assert_eq(join(1, 4), GPL_OK);
    tick(4 + LC);
    const rdzv_decision *d = find(RDZV_DO_ASSIGN);
    cr_assert(d && d->nmembers == 2, "%u members", d ? d->nmembers : 0);
    cr_assert(d->members[0] == &M[6] || d->members[1] == &M[6], "the new connection's member");
    cr_assert(d->members[0] != &M[0] && d->members[1] != &M[0], "the stale one was taken");
}
