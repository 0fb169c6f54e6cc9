/* rdzv_soak: a real gpulaunch-rdzv process under hours of churn, every
 * decision it sends checked against the round state machine fed the same
 * events (the model as oracle).
 *
 * One process drives --nodes simulated nodes, each a real client of the
 * client library on its own TCP connection (heartbeats at the default
 * interval), in jobs of 2 to 6 nodes, elastic (1:N) and static (N:N). Each
 * job in turn forms, then, every --dwell-ms or so, goes through one of:
 *   kill     a node's connection drops (static jobs: a replacement node of
 *            the same rank joins);
 *   vanish   a node goes silent with its connection open (heartbeats stop);
 *   fail     a node reports a failed worker;
 *   notice   a node raises a preemption notice (every node must hear it);
 *   grow     an elastic job below its maximum takes new nodes in (scale-up);
 *   done     every node finishes: the job ends, and a new one takes its place.
 * Beside them: hostile connections (garbage, an oversized frame, a wrong
 * token, one that never speaks), each of which the server must close; and
 * --restarts server restarts (SIGKILL, then a new process on the same port:
 * every running node must re-register its round, no round may end).
 *
 * The oracle: every job has its own rdzv_round, the state machine the server
 * runs, fed the events the soak causes, in the order it causes them, with
 * the soak's clock. Whatever the model decides a node must hear (its
 * assignment: round, node rank, world size; the end of its round: which
 * round, why, which node; the job's end) that node must hear from the server
 * within a deadline, and a node hears nothing the model did not decide.
 * Node ranks are compared exactly where the model fixes them (static ranks,
 * a survivor keeping its rank); nodes new to a round fill the other ranks in
 * the order the server saw their joins, which one process cannot impose on
 * several connections, so there each rank must be one of those and no two
 * nodes may hold it. The time a node stays silent before the server says so
 * must be between the silence that gets a node probed at the soonest
 * (rdzv_probe.h: a vanished node answers no probe, and its machine accepts
 * no peer's connection: the early threshold) less one heartbeat interval
 * and the heartbeat timeout plus one.
 *
 * Figures: rounds formed, decisions checked, violations, the time from the
 * last join to every node assigned (p50, p99), the time to find a vanished
 * node, the server's RSS and descriptors sampled every --sample-s with their
 * drift after warm-up (the first quarter of each server's life), its CPU per
 * heartbeat, and at the end, every client gone, its descriptors against the
 * count before the first client and its jobs and nodes (both must be 0).
 *
 *   rdzv_soak [--nodes N] [--duration-s S] [--dwell-ms MS] [--restarts R]
 *             [--sample-s S] [--seed X] [--hostile-per-s H]
 *
 * Exit status 0 when no violation was seen and nothing was left behind. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "gb_log.h"
#include "gb_procstat.h"
#include "gb_time.h"
#include "gpulaunch/rdzv.h"
#include "rdzv_client_int.h"
#include "rdzv_codec.h"
#include "rdzv_probe.h"
#include "harness.h"
#include "rdzv_round.h"
#include "soak_hostile.h"
#include "soak_server.h"

#define SOAK_JOB_MAX_NODES 6      /* nodes in one simulated job at most */
#define SOAK_ANSWER_MS 5000       /* a node hears what the model decided within this */
#define SOAK_HB_TIMEOUT_MS 5000   /* the default heartbeat timeout, said in each JOIN */
#define SOAK_HB_INTERVAL_MS 1000  /* the default heartbeat interval */
#define SOAK_DETECT_SLACK_MS 1500 /* past the timeout, a silent node is said within this */
#define SOAK_LAST_CALL_MS 1000    /* elastic jobs' last call (a grow waits for it) */
#define SOAK_HANDSHAKE_MS 2000    /* the server's handshake timeout in the soak */
#define SOAK_SAMPLES_MAX 100000   /* latency samples kept per kind */
#define SOAK_RESUME_MS 15000      /* every node reconnected after a server restart by then */
#define SOAK_SHOWN_MAX 30         /* violations printed in full */
/* Heap bytes the server may hold at the end past the drain: this, and libuv's
 * table of watchers by descriptor number, which doubles (8 bytes an entry)
 * when a higher descriptor than any before comes (heap_slack()). */
#define SOAK_HEAP_SLACK 4096
#define SOAK_QUIET_MS 10000 /* before the drain: heartbeats alone, nothing changing */
#define SOAK_DRAIN_MS 1500  /* after the last job ended, the server has seen them go */
#define SOAK_TOKEN "soak-token"

enum { EX_NONE, EX_ASSIGN_ANY, EX_ASSIGN, EX_OVER, EX_DONE };

typedef struct job job;

typedef struct node {
    rdzv_rmember m; /* the model's member: first, so a member is its node */
    job *j;
    rdzv_client *c;
    char host[64], inst[64];
    int32_t static_rank;
    int expect;
    uint32_t ex_round, ex_rank, ex_reason, ex_world, ex_nnodes;
    int ex_rank_fixed;
    uint64_t ex_by;
    int assigned;
    uint32_t round, node_rank, nnodes, base_rank, world;
    uint32_t events_want, events_seen;
    uint64_t events_by;
    int frozen, closed;
} node;

struct job {
    int idx, gen;
    char run_id[64];
    int is_static;
    uint32_t nmax, nproc, hosts;
    node *nodes[SOAK_JOB_MAX_NODES];
    uint32_t n;
    rdzv_round model;
    int model_live;
    int live;   /* a generation is running */
    int ending; /* every node said done */
    uint64_t next_ms;
    /* the round the model assigned last: who must hear it, and since when */
    uint32_t a_round, a_left, a_free_mask, a_seen_mask;
    uint64_t a_t0;
    int a_timed; /* completed by a join (its latency counts), not a last call */
    node *frozen;
    uint64_t frozen_at;
};

static struct {
    uv_loop_t loop;
    uv_timer_t tick;
    uint32_t seed;
    int nodes, restarts, restarts_done;
    double duration_s, sample_s, hostile_per_s;
    uint32_t dwell_ms;
    uint64_t t0, end_ms, next_sample, next_restart, next_hostile, quiesce_from;
    int quiescing, stopping, finished;
    int port, http_port;
    pid_t server;
    uint64_t server_started;
    double server_cpu0;
    job *jobs;
    int njobs;
    int live_nodes;
    /* figures */
    uint64_t rounds, decisions, violations, actions[8], resumed;
    uint64_t node_ms; /* node-milliseconds connected: heartbeats sent ~ this / interval */
    uint64_t *join_lat, *detect_lat;
    size_t njoin_lat, ndetect_lat;
    double cpu_per_hb_us[16];
    long rss_warm[16], rss_end[16], fds_warm[16], fds_end[16];
    double fit[16][5]; /* after warm-up: n, sum t (h), sum rss (KiB), sum t^2, sum t rss */
    int lives;
    long fds_before;
    double heap_before; /* bytes the first server held from malloc before any client */
    /* the drain: every job ends once, a quarter into the last server's life,
     * and what the server holds then is what it must hold at the end */
    uint64_t drain_at, drained_at;
    int draining, drains;
    double heap_drained;
    long fds_drained;
    int quiet; /* 1: waiting for every job to settle, 2: nothing changes since quiet_from */
    uint64_t quiet_from, quiet_node_ms;
    double quiet_cpu, quiet_us;
    int quiet_nodes;
    uint64_t reconnect_ms; /* the last restart: until every node was connected again */
} S;

static const char *action_names[] = {"kill", "vanish", "fail", "notice", "grow", "done"};
enum { A_KILL, A_VANISH, A_FAIL, A_NOTICE, A_GROW, A_DONE };

static uint32_t rnd(void) {
    S.seed ^= S.seed << 13;
    S.seed ^= S.seed >> 17;
    S.seed ^= S.seed << 5;
    return S.seed;
}

static void violation(const job *j, const node *x, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void violation(const job *j, const node *x, const char *fmt, ...) {
    S.violations++;
    if (S.violations > SOAK_SHOWN_MAX)
        return;
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fprintf(stderr, "rdzv_soak: VIOLATION at %.3f s: job %s%s%s: %s\n",
            (double)(now_ms() - S.t0) / 1000.0, j ? j->run_id : "-", x ? " node " : "",
            x ? x->host : "", text);
}

static void hostile_violation(const char *text) { violation(NULL, NULL, "%s", text); }

/* ---- the server process (soak_server.c) ---- */

static int server_start(void) {
    pid_t pid =
        soak_server_start(GPL_RDZV_BIN, S.port, S.http_port, SOAK_TOKEN, SOAK_HANDSHAKE_MS, NULL);
    if (pid < 0)
        return -1;
    S.server = pid;
    S.server_started = now_ms();
    S.server_cpu0 = soak_proc_cpu_s(pid);
    S.node_ms = 0;
    return 0;
}

static double server_metric(const char *name) { return soak_server_metric(S.http_port, name); }

/* ---- the model ---- */

static void join_msg(const node *x, int resume, rdzv_msg *m) {
    const job *j = x->j;
    memset(m, 0, sizeof *m);
    m->type = RDZV_JOIN;
    snprintf(m->u.join.run_id, sizeof m->u.join.run_id, "%s", j->run_id);
    snprintf(m->u.join.hostname, sizeof m->u.join.hostname, "%s", x->host);
    snprintf(m->u.join.addr, sizeof m->u.join.addr, "%s", x->host);
    snprintf(m->u.join.instance, sizeof m->u.join.instance, "%s", x->inst);
    m->u.join.master_port = 29500;
    m->u.join.nproc = j->nproc;
    m->u.join.static_rank = x->static_rank;
    m->u.join.min_nodes = j->is_static ? j->nmax : 1;
    m->u.join.max_nodes = j->nmax;
    m->u.join.last_call_ms = SOAK_LAST_CALL_MS;
    m->u.join.join_timeout_ms = RDZV_DEFAULT_JOIN_TIMEOUT_MS;
    m->u.join.heartbeat_timeout_ms = SOAK_HB_TIMEOUT_MS;
    if (resume) {
        m->flags = RDZV_JOIN_RESUME;
        m->u.join.round = x->round;
        m->u.join.node_rank = x->node_rank;
        m->u.join.base_rank = x->base_rank;
        m->u.join.world_size = x->world;
        m->u.join.nnodes = x->nnodes;
    }
}

/* What the model decided: who must hear what, by when. */
static void model_apply(job *j, rdzv_round_out *out, uint64_t now, int by_join) {
    for (size_t i = 0; i < out->n; i++) {
        const rdzv_decision *d = &out->d[i];
        switch (d->kind) {
        case RDZV_DO_ASSIGN:
            S.rounds++;
            j->a_round = d->round;
            j->a_left = 0;
            j->a_free_mask = j->a_seen_mask = 0;
            j->a_t0 = now;
            j->a_timed = by_join;
            for (uint32_t k = 0; k < d->nmembers; k++) {
                node *x = (node *)d->members[k];
                if (x == NULL)
                    continue;
                x->expect = EX_ASSIGN;
                x->ex_round = d->round;
                x->ex_rank = k;
                x->ex_world = d->world_size;
                x->ex_nnodes = d->nmembers;
                x->ex_rank_fixed = j->is_static || x->m.prev_rank == (int64_t)k;
                x->ex_by = now + SOAK_ANSWER_MS;
                if (!x->ex_rank_fixed)
                    j->a_free_mask |= 1u << k;
                j->a_left++;
            }
            break;
        case RDZV_DO_ROUND_OVER:
            for (uint32_t k = 0; k < d->nmembers; k++) {
                node *x = (node *)d->members[k];
                if (x == NULL || x->frozen)
                    continue;
                x->expect = EX_OVER;
                x->ex_round = d->round;
                x->ex_reason = d->reason;
                x->ex_rank = d->node_rank;
                x->ex_by = now + SOAK_ANSWER_MS;
            }
            break;
        case RDZV_DO_JOB_DONE:
            for (uint32_t k = 0; k < d->nmembers; k++) {
                node *x = (node *)d->members[k];
                if (x == NULL)
                    continue;
                x->expect = EX_DONE;
                x->ex_round = d->round;
                x->ex_by = now + SOAK_ANSWER_MS;
            }
            break;
        case RDZV_DO_TIMEOUT:
            violation(j, (node *)d->m, "the model timed its join out: %s", d->text);
            break;
        default: /* waiting, progress notes, resumes, warm holds: not checked */
            break;
        }
    }
    rdzv_round_out_reset(out);
}

static void model_join(node *x, int resume, uint64_t now) {
    job *j = x->j;
    rdzv_msg m;
    join_msg(x, resume, &m);
    rdzv_round_out out = {0};
    if (!j->model_live) {
        if (rdzv_round_init(&j->model, &m, SOAK_HB_TIMEOUT_MS) != GPL_OK) {
            violation(j, x, "out of memory in the model");
            return;
        }
        j->model_live = 1;
    }
    char err[512];
    if (rdzv_round_join(&j->model, &x->m, &m, now, &out, err, sizeof err) != GPL_OK)
        violation(j, x, "the model refused the join: %s", err);
    if (!resume && x->expect == EX_NONE) {
        x->expect = EX_ASSIGN_ANY; /* a round must take it in */
        x->ex_by = now + SOAK_ANSWER_MS + SOAK_LAST_CALL_MS;
    }
    model_apply(j, &out, now, 1);
    rdzv_round_out_free(&out);
}

static void model_tick(job *j, uint64_t now) {
    if (!j->model_live)
        return;
    rdzv_round_out out = {0};
    rdzv_round_tick(&j->model, now, &out);
    model_apply(j, &out, now, 0);
    rdzv_round_out_free(&out);
}

/* ---- the nodes ---- */

static void on_assigned(rdzv_client *c, const rdzv_assignment *a);
static void on_round_over(rdzv_client *c, uint32_t round, uint32_t reason, uint32_t node_rank,
                          const char *hostname, const char *message);
static void on_event(rdzv_client *c, uint32_t kind, uint64_t deadline, const char *who,
                     const char *reason);
static void on_job_done(rdzv_client *c);
static void on_error(rdzv_client *c, gpl_result_t code, const char *message);

static node *node_start(job *j, int32_t static_rank, uint64_t now) {
    node *x = calloc(1, sizeof *x);
    if (x == NULL)
        return NULL;
    x->j = j;
    x->static_rank = static_rank;
    x->m.prev_rank = -1;
    snprintf(x->host, sizeof x->host, "j%d-g%d-h%u", j->idx, j->gen, j->hosts++);
    snprintf(x->inst, sizeof x->inst, "%s-%u", x->host, rnd());
    rdzv_client_options o = {.host = "127.0.0.1",
                             .port = S.port,
                             .token = SOAK_TOKEN,
                             .token_len = strlen(SOAK_TOKEN),
                             .connect_timeout_ms = 60000};
    rdzv_join_params jp = {.run_id = j->run_id,
                           .hostname = x->host,
                           .addr = x->host,
                           .instance = x->inst,
                           .master_port = 29500,
                           .nproc = j->nproc,
                           .static_rank = static_rank,
                           .min_nodes = j->is_static ? j->nmax : 1,
                           .max_nodes = j->nmax,
                           .last_call_ms = SOAK_LAST_CALL_MS,
                           .join_timeout_ms = RDZV_DEFAULT_JOIN_TIMEOUT_MS,
                           .heartbeat_interval_ms = SOAK_HB_INTERVAL_MS,
                           .heartbeat_timeout_ms = SOAK_HB_TIMEOUT_MS};
    rdzv_client_callbacks cb = {.data = x,
                                .on_assigned = on_assigned,
                                .on_round_over = on_round_over,
                                .on_event = on_event,
                                .on_job_done = on_job_done,
                                .on_error = on_error};
    char err[256];
    if (rdzv_client_start(&S.loop, &o, &jp, &cb, &x->c, err, sizeof err) != GPL_OK) {
        violation(j, x, "the client did not start: %s", err);
        free(x);
        return NULL;
    }
    j->nodes[j->n++] = x;
    S.live_nodes++;
    model_join(x, 0, now);
    return x;
}

/* The node goes (its client closed) and the model hears it left. */
static void node_gone(node *x, const char *why, uint64_t now) {
    job *j = x->j;
    rdzv_client_close(x->c);
    x->c = NULL;
    S.live_nodes--;
    if (j->model_live) {
        rdzv_round_out out = {0};
        rdzv_round_leave(&x->m, why, now, &out);
        model_apply(j, &out, now, 0);
        rdzv_round_out_free(&out);
    }
    for (uint32_t i = 0; i < j->n; i++)
        if (j->nodes[i] == x) {
            j->nodes[i] = j->nodes[--j->n];
            break;
        }
    if (j->frozen == x)
        j->frozen = NULL;
    free(x);
}

/* A callback came that the model did not decide yet: time may have decided
 * it (a last call, a silent node); the model catches up first. */
static void catch_up(job *j, uint32_t reason, uint64_t now) {
    if (reason == RDZV_REASON_HEARTBEAT && j->frozen && j->frozen->m.active) {
        node *f = j->frozen;
        uint64_t silent = now - j->frozen_at;
        if (S.ndetect_lat < SOAK_SAMPLES_MAX)
            S.detect_lat[S.ndetect_lat++] = silent;
        /* probed once silent past its threshold (at least RDZV_EARLY_MIN_MS: its
         * machine is gone too, rdzv_client_freeze closes its kernel-probe port),
         * at the latest the heartbeat timeout */
        if (silent + SOAK_HB_INTERVAL_MS + 100 < RDZV_EARLY_MIN_MS ||
            silent > SOAK_HB_TIMEOUT_MS + SOAK_HB_INTERVAL_MS + SOAK_DETECT_SLACK_MS)
            violation(j, f,
                      "said silent %.2f s after it froze (probed after %.1f s of silence at the "
                      "soonest, timeout %.1f s, heartbeats every %.1f s)",
                      (double)silent / 1000.0, RDZV_EARLY_MIN_MS / 1000.0,
                      SOAK_HB_TIMEOUT_MS / 1000.0, SOAK_HB_INTERVAL_MS / 1000.0);
        rdzv_round_out out = {0};
        rdzv_round_heartbeat_lost(&f->m, silent, now, &out);
        model_apply(j, &out, now, 0);
        rdzv_round_out_free(&out);
        int32_t sr = f->static_rank;
        node_gone(f, "heartbeat timeout", now); /* the server drops its connection */
        if (j->is_static)
            node_start(j, sr, now); /* its rank's replacement */
        return;
    }
    model_tick(j, now);
}

/* Every node heard the round: where the model left the order of new nodes
 * free, it takes the server's, so that both go on from the same ranks. */
static void model_follow(job *j) {
    rdzv_round *r = &j->model;
    if (!j->model_live || r->state != RDZV_R_RUNNING || r->round != j->a_round)
        return;
    for (uint32_t i = 0; i < j->n; i++) {
        node *x = j->nodes[i];
        if (x->assigned && x->round == r->round && x->node_rank < r->nranks && x->m.active) {
            r->ranks[x->node_rank] = &x->m;
            x->m.node_rank = x->node_rank;
            x->m.base_rank = x->base_rank;
        }
    }
}

static void on_assigned(rdzv_client *c, const rdzv_assignment *a) {
    node *x = rdzv_client_data(c);
    job *j = x->j;
    uint64_t now = now_ms();
    if (x->expect != EX_ASSIGN)
        catch_up(j, 0, now);
    S.decisions++;
    if (x->expect != EX_ASSIGN) {
        violation(j, x, "assigned node rank %u of round %u; the model expected %s", a->node_rank,
                  a->round, x->expect == EX_OVER ? "the end of its round" : "nothing yet");
        goto out;
    }
    uint32_t bit = a->node_rank < 32 ? 1u << a->node_rank : 0;
    if (a->round != x->ex_round || a->world_size != x->ex_world || a->nnodes != x->ex_nnodes ||
        a->base_rank != a->node_rank * j->nproc ||
        (x->ex_rank_fixed ? a->node_rank != x->ex_rank : !(j->a_free_mask & bit)) ||
        (j->a_seen_mask & bit))
        violation(j, x,
                  "assigned round %u node rank %u of %u, base rank %u, world %u; the model: round "
                  "%u node rank %u%s of %u, world %u%s",
                  a->round, a->node_rank, a->nnodes, a->base_rank, a->world_size, x->ex_round,
                  x->ex_rank, x->ex_rank_fixed ? "" : " (or another new node's)", x->ex_nnodes,
                  x->ex_world, (j->a_seen_mask & bit) ? "; another node holds that rank" : "");
    j->a_seen_mask |= bit;
out:
    x->expect = EX_NONE;
    x->assigned = 1;
    x->round = a->round;
    x->node_rank = a->node_rank;
    x->nnodes = a->nnodes;
    x->base_rank = a->base_rank;
    x->world = a->world_size;
    if (j->a_left && --j->a_left == 0) {
        if (j->a_timed && S.njoin_lat < SOAK_SAMPLES_MAX)
            S.join_lat[S.njoin_lat++] = now - j->a_t0;
        model_follow(j);
    }
}

static void on_round_over(rdzv_client *c, uint32_t round, uint32_t reason, uint32_t node_rank,
                          const char *hostname, const char *message) {
    node *x = rdzv_client_data(c);
    job *j = x->j;
    uint64_t now = now_ms();
    (void)hostname;
    if (x->expect != EX_OVER)
        catch_up(j, reason, now);
    S.decisions++;
    if (x->expect != EX_OVER)
        violation(j, x, "told round %u is over (reason %u: %s); the model expected %s", round,
                  reason, message, x->expect == EX_ASSIGN ? "an assignment" : "nothing");
    else if (round != x->ex_round || reason != x->ex_reason ||
             (reason != RDZV_REASON_SCALE_UP && node_rank != x->ex_rank))
        violation(j, x,
                  "told round %u is over, reason %u, node rank %u (%s); the model: round %u, "
                  "reason %u, node rank %u",
                  round, reason, node_rank, message, x->ex_round, x->ex_reason, x->ex_rank);
    x->expect = EX_NONE;
    x->assigned = 0;
    if (j->ending)
        return;
    rdzv_client_rejoin(c);
    model_join(x, 0, now);
}

static void on_event(rdzv_client *c, uint32_t kind, uint64_t deadline, const char *who,
                     const char *reason) {
    node *x = rdzv_client_data(c);
    (void)deadline, (void)who;
    S.decisions++;
    if (kind != RDZV_EVENT_CHECKPOINT || x->events_seen >= x->events_want)
        violation(x->j, x, "an event it was not sent (kind %u: %s)", kind, reason);
    else
        x->events_seen++;
}

static void on_job_done(rdzv_client *c) {
    node *x = rdzv_client_data(c);
    S.decisions++;
    if (x->expect != EX_DONE)
        violation(x->j, x, "told the job is done; the model expected %s",
                  x->expect == EX_NONE ? "nothing" : "an assignment or a round's end");
    x->expect = EX_NONE;
}

static void on_error(rdzv_client *c, gpl_result_t code, const char *message) {
    node *x = rdzv_client_data(c);
    violation(x->j, x, "client error %d: %s", (int)code, message);
}

/* ---- the jobs ---- */

static void job_begin(job *j, uint64_t now) {
    j->gen++;
    j->hosts = 0;
    snprintf(j->run_id, sizeof j->run_id, "soak-%d-%d", j->idx, j->gen);
    j->is_static = rnd() % 4 == 0;
    j->nmax = 2 + rnd() % (SOAK_JOB_MAX_NODES - 1);
    j->nproc = 1 + rnd() % 8;
    j->live = 1;
    j->ending = 0;
    j->frozen = NULL;
    j->model_live = 0;
    for (uint32_t i = 0; i < j->nmax; i++)
        node_start(j, j->is_static ? (int32_t)i : -1, now);
}

static void job_end(job *j, uint64_t now) {
    while (j->n)
        node_gone(j->nodes[0], "the job ended", now);
    if (j->model_live)
        rdzv_round_free(&j->model);
    j->model_live = 0;
    j->live = 0;
    j->next_ms = now + 200 + rnd() % 800;
}

/* Nothing is outstanding: every node heard what it must hear. */
static int job_settled(const job *j) {
    if (j->frozen)
        return 0;
    for (uint32_t i = 0; i < j->n; i++) {
        const node *x = j->nodes[i];
        if (x->expect != EX_NONE || x->events_seen != x->events_want || !x->assigned)
            return 0;
    }
    return 1;
}

static void job_act(job *j, uint64_t now) {
    int a;
    uint32_t r = rnd() % 100;
    if (r < 30)
        a = A_KILL;
    else if (r < 34)
        a = A_VANISH;
    else if (r < 54)
        a = A_FAIL;
    else if (r < 72)
        a = A_NOTICE;
    else if (r < 88)
        a = A_GROW;
    else
        a = A_DONE;
    if (a == A_GROW && (j->is_static || j->n >= j->nmax))
        a = A_NOTICE;
    if ((a == A_KILL || a == A_VANISH) && !j->is_static && j->n < 2)
        a = A_GROW;
    node *x = j->nodes[rnd() % j->n];
    S.actions[a]++;
    j->next_ms = UINT64_MAX; /* until the job settles again */
    switch (a) {
    case A_KILL: {
        int32_t sr = x->static_rank;
        node_gone(x, "connection closed", now);
        if (j->is_static)
            node_start(j, sr, now);
        break;
    }
    case A_VANISH:
        rdzv_client_freeze(x->c);
        x->frozen = 1;
        j->frozen = x;
        j->frozen_at = now;
        break;
    case A_FAIL: {
        rdzv_client_fail(x->c, "soak: a worker failed");
        rdzv_round_out out = {0};
        rdzv_round_fail(&x->m, 0, 0, "soak: a worker failed", now, &out);
        model_apply(j, &out, now, 0);
        rdzv_round_out_free(&out);
        break;
    }
    case A_NOTICE:
        rdzv_client_event(x->c, RDZV_EVENT_CHECKPOINT, 0, "soak: spot notice");
        for (uint32_t i = 0; i < j->n; i++) {
            j->nodes[i]->events_want++;
            j->nodes[i]->events_by = now + SOAK_ANSWER_MS;
        }
        break;
    case A_GROW:
        while (j->n < j->nmax)
            node_start(j, -1, now);
        break;
    case A_DONE: {
        j->ending = 1;
        for (uint32_t i = 0; i < j->n; i++) {
            rdzv_client_done(j->nodes[i]->c);
            rdzv_round_out out = {0};
            rdzv_round_done(&j->nodes[i]->m, &out);
            model_apply(j, &out, now, 0);
            rdzv_round_out_free(&out);
        }
        break;
    }
    }
}

/* Deadlines, the model's clock, and the job's next change once it settled. */
static void job_check(job *j, uint64_t now) {
    if (!j->live) {
        if (now >= j->next_ms && !S.stopping && !S.quiescing && !S.draining && S.quiet != 2)
            job_begin(j, now); /* a quiet period begins with every job running */
        return;
    }
    if (S.draining && !j->ending && job_settled(j)) {
        job_end(j, now);
        return;
    }
    model_tick(j, now);
    for (uint32_t i = 0; i < j->n; i++) {
        node *x = j->nodes[i];
        if (x->expect != EX_NONE && now > x->ex_by) {
            static const char *what[] = {"", "an assignment", "its assignment",
                                         "the end of its round", "the job's end"};
            violation(j, x, "heard nothing of %s (round %u) %u ms after the model decided it",
                      what[x->expect], x->ex_round, (unsigned)(now - x->ex_by + SOAK_ANSWER_MS));
            x->expect = EX_NONE;
        }
        if (x->events_seen < x->events_want && now > x->events_by) {
            violation(j, x, "did not hear %u preemption notice(s) within %d ms",
                      x->events_want - x->events_seen, SOAK_ANSWER_MS);
            x->events_seen = x->events_want;
        }
    }
    if (j->frozen && now - j->frozen_at > SOAK_HB_TIMEOUT_MS + SOAK_ANSWER_MS) {
        violation(j, j->frozen, "froze %.1f s ago and nobody was told",
                  (double)(now - j->frozen_at) / 1000.0);
        node_gone(j->frozen, "given up", now);
    }
    if (j->ending) {
        int all = 1;
        for (uint32_t i = 0; i < j->n; i++)
            all &= j->nodes[i]->expect == EX_NONE;
        if (all)
            job_end(j, now);
        return;
    }
    if (!job_settled(j))
        return;
    if (j->next_ms == UINT64_MAX)
        j->next_ms = now + S.dwell_ms / 2 + rnd() % (S.dwell_ms + 1);
    if (now >= j->next_ms && !S.stopping && !S.quiescing && !S.draining && !S.quiet)
        job_act(j, now);
}

/* ---- samples and restarts ---- */

static void sample(uint64_t now, int last) {
    int life = S.restarts_done;
    if (life >= 16)
        return;
    uint64_t age = now - S.server_started, span = S.end_ms - S.t0;
    long rss = soak_proc_rss_kib(S.server), fds = soak_proc_fds(S.server);
    /* the first sample past a quarter of this server's life is the warm one */
    uint64_t life_ms = S.restarts ? span / (uint64_t)(S.restarts + 1) : span;
    if (S.rss_warm[life] == 0 && age >= life_ms / 4) {
        S.rss_warm[life] = rss;
        S.fds_warm[life] = fds;
    }
    S.rss_end[life] = rss;
    S.fds_end[life] = fds;
    if (S.rss_warm[life] && !S.draining && !last) { /* the trend: a least-squares line */
        double t = (double)(now - S.t0) / 3.6e6, r = (double)rss;
        S.fit[life][0] += 1, S.fit[life][1] += t, S.fit[life][2] += r;
        S.fit[life][3] += t * t, S.fit[life][4] += t * r;
    }
    S.lives = life + 1;
    double cpu = soak_proc_cpu_s(S.server) - S.server_cpu0;
    double hb = (double)S.node_ms / SOAK_HB_INTERVAL_MS;
    if (hb > 0)
        S.cpu_per_hb_us[life] = cpu * 1e6 / hb;
    printf("rdzv_soak: t=%.0fs server rss=%ldKiB fds=%ld nodes=%d rounds=%llu decisions=%llu "
           "violations=%llu%s\n",
           (double)(now - S.t0) / 1000.0, rss, fds, S.live_nodes, (unsigned long long)S.rounds,
           (unsigned long long)S.decisions, (unsigned long long)S.violations,
           last ? " (last)" : "");
    fflush(stdout);
}

/* The server restarts (SIGKILL, a new process on the same port): every node
 * re-registers its round; the models start over from those re-registrations. */
static void restart_server(uint64_t now) {
    sample(now, 1);
    soak_hostile_close_all(); /* a connect in flight would be reset by the kill */
    kill(S.server, SIGKILL);
    waitpid(S.server, NULL, 0);
    S.restarts_done++;
    if (server_start() != 0) {
        violation(NULL, NULL, "the server did not start again");
        S.stopping = 1;
        return;
    }
    now = now_ms();
    for (int i = 0; i < S.njobs; i++) {
        job *j = &S.jobs[i];
        if (!j->live)
            continue;
        if (j->model_live)
            rdzv_round_free(&j->model);
        j->model_live = 0;
        for (uint32_t k = 0; k < j->n; k++) {
            node *x = j->nodes[k];
            memset(&x->m, 0, sizeof x->m);
            x->m.prev_rank = -1;
        }
        /* the models take the re-registrations in rank order */
        for (uint32_t rank = 0; rank < SOAK_JOB_MAX_NODES; rank++)
            for (uint32_t k = 0; k < j->n; k++)
                if (j->nodes[k]->node_rank == rank) {
                    model_join(j->nodes[k], 1, now);
                    S.resumed++;
                }
    }
    S.quiesce_from = now; /* no change until every node re-registered */
}

static void on_tick(uv_timer_t *t) {
    (void)t;
    uint64_t now = now_ms();
    static uint64_t last;
    if (last)
        S.node_ms += (now - last) * (uint64_t)S.live_nodes;
    last = now;
    for (int i = 0; i < S.njobs; i++)
        job_check(&S.jobs[i], now);
    soak_hostile_check(now);
    if (S.quiesce_from) { /* after a restart: every node back before the next change */
        int missing = 0;
        for (int i = 0; i < S.njobs; i++)
            for (uint32_t k = 0; k < S.jobs[i].n; k++)
                missing += !rdzv_client_connected(S.jobs[i].nodes[k]->c);
        if (missing && now - S.quiesce_from > SOAK_RESUME_MS)
            violation(NULL, NULL, "%d node(s) did not reconnect within %d ms of the restart",
                      missing, SOAK_RESUME_MS);
        if (missing == 0 || now - S.quiesce_from > SOAK_RESUME_MS) {
            S.reconnect_ms = now - S.quiesce_from;
            S.quiesce_from = 0;
            S.quiescing = 0;
        }
    }
    if (!S.stopping && !S.draining && S.hostile_per_s > 0 && now >= S.next_hostile) {
        soak_hostile_start(now);
        S.next_hostile = now + (uint64_t)(1000.0 / S.hostile_per_s);
    }
    if (now >= S.next_sample) {
        sample(now, 0);
        S.next_sample = now + (uint64_t)(S.sample_s * 1000);
    }
    if (!S.stopping && !S.quiesce_from && S.restarts_done < S.restarts && now >= S.next_restart) {
        S.quiescing = 1; /* no new action: the restart waits for every job to settle */
        int settled = 1;
        for (int i = 0; i < S.njobs && settled; i++)
            settled =
                !S.jobs[i].live || S.jobs[i].ending ? !S.jobs[i].live : job_settled(&S.jobs[i]);
        if ((settled && !S.draining) || now - S.next_restart > 30000) {
            restart_server(now);
            S.next_restart = S.t0 + (S.end_ms - S.t0) * (uint64_t)(S.restarts_done + 1) /
                                        (uint64_t)(S.restarts + 1);
        }
    }
    /* Before the drain, SOAK_QUIET_MS with nothing changing: what heartbeats
     * alone cost the server. */
    if (!S.stopping && !S.quiescing && !S.drains && !S.quiet && now >= S.drain_at)
        S.quiet = 1;
    if (S.quiet == 1) {
        int settled = 1;
        for (int i = 0; i < S.njobs && settled; i++)
            settled = S.jobs[i].live && !S.jobs[i].ending && job_settled(&S.jobs[i]);
        if (settled) {
            S.quiet = 2;
            S.quiet_from = now;
            S.quiet_cpu = soak_proc_cpu_s(S.server);
            S.quiet_node_ms = S.node_ms;
        }
    } else if (S.quiet == 2 && now - S.quiet_from >= SOAK_QUIET_MS) {
        double hb = (double)(S.node_ms - S.quiet_node_ms) / SOAK_HB_INTERVAL_MS;
        S.quiet_us = hb > 0 ? (soak_proc_cpu_s(S.server) - S.quiet_cpu) * 1e6 / hb : 0;
        S.quiet_nodes = S.live_nodes;
        S.quiet = 0;
        S.draining = 1;
        S.drains = 1;
    }
    if (S.draining) {
        int live = 0;
        for (int i = 0; i < S.njobs; i++)
            live += S.jobs[i].live;
        if (live == 0 && soak_hostile_open() == 0 && S.drained_at == 0)
            S.drained_at = now;
        if (S.drained_at && now - S.drained_at >= SOAK_DRAIN_MS) { /* the server saw them go */
            S.fds_drained = soak_proc_fds(S.server); /* before the HTTP request's own */
            S.heap_drained = server_metric("gpulaunch_rdzv_heap_bytes");
            printf("rdzv_soak: t=%.0fs every job ended once: server heap %.0f bytes, fds %ld\n",
                   (double)(now - S.t0) / 1000.0, S.heap_drained, S.fds_drained);
            fflush(stdout);
            S.draining = 0;
        }
    }
    if (!S.stopping && now >= S.end_ms) {
        S.stopping = 1; /* no new action; what is outstanding still comes */
        S.quiesce_from = 0;
    }
    if (S.stopping && !S.finished) {
        int busy = 0;
        for (int i = 0; i < S.njobs; i++)
            busy += S.jobs[i].live && !job_settled(&S.jobs[i]) && !S.jobs[i].ending;
        if (busy == 0 || now > S.end_ms + 20000) {
            sample(now, 1);
            for (int i = 0; i < S.njobs; i++)
                if (S.jobs[i].live)
                    job_end(&S.jobs[i], now);
            soak_hostile_close_all();
            S.finished = 1;
            uv_timer_stop(&S.tick);
            uv_close((uv_handle_t *)&S.tick, NULL);
        }
    }
}

/* SOAK_HEAP_SLACK and the most libuv's watcher table can grow after the drain:
 * to the power of two above the most descriptors the server can hold (every
 * job at its largest, every hostile connection, a few of its own). */
static double heap_slack(void) {
    uint64_t fds = (uint64_t)S.njobs * SOAK_JOB_MAX_NODES + SOAK_HOSTILE_MAX + 64, cap = 1;
    while (cap < fds + 2)
        cap <<= 1;
    return SOAK_HEAP_SLACK + 8.0 * (double)cap;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(uint64_t *v, size_t n, double p) {
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_u64);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return (double)v[i];
}

/* The soak itself stuck (a blocking call that never returned): said, and the
 * server does not outlive it. */
static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "rdzv_soak: stuck past its end and a minute: giving up\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    if (S.server > 0)
        kill(S.server, SIGKILL);
    _exit(1);
}

static void usage(void) {
    fprintf(stderr, "usage: rdzv_soak [--nodes N] [--duration-s S] [--dwell-ms MS] [--restarts R] "
                    "[--sample-s S] [--seed X] [--hostile-per-s H]\n");
    exit(2);
}

int main(int argc, char **argv) {
    S.nodes = 2000;
    S.duration_s = 3600;
    S.dwell_ms = 2000;
    S.restarts = 2;
    S.sample_s = 60;
    S.seed = 20261203;
    S.hostile_per_s = 2;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            usage();
        if (strcmp(argv[i], "--nodes") == 0)
            S.nodes = (int)strtol(v, NULL, 10);
        else if (strcmp(argv[i], "--duration-s") == 0)
            S.duration_s = strtod(v, NULL);
        else if (strcmp(argv[i], "--dwell-ms") == 0)
            S.dwell_ms = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(argv[i], "--restarts") == 0)
            S.restarts = (int)strtol(v, NULL, 10);
        else if (strcmp(argv[i], "--sample-s") == 0)
            S.sample_s = strtod(v, NULL);
        else if (strcmp(argv[i], "--seed") == 0)
            S.seed = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(argv[i], "--hostile-per-s") == 0)
            S.hostile_per_s = strtod(v, NULL);
        else
            usage();
        i++;
    }
    if (S.nodes < 2 || S.duration_s <= 0 || S.restarts < 0 || S.restarts > 15 || S.sample_s <= 0 ||
        S.seed == 0 || S.dwell_ms == 0)
        usage();
    signal(SIGPIPE, SIG_IGN);
    signal(SIGALRM, on_alarm);
    alarm((unsigned)S.duration_s + 120);
    gb_log_set_level(gb_log_parse_level("error")); /* the model's notes: not wanted here */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    S.port = free_tcp_port();
    S.http_port = free_tcp_port();
    S.join_lat = calloc(SOAK_SAMPLES_MAX, sizeof *S.join_lat);
    S.detect_lat = calloc(SOAK_SAMPLES_MAX, sizeof *S.detect_lat);
    S.njobs = S.nodes / ((2 + SOAK_JOB_MAX_NODES) / 2);
    S.jobs = calloc((size_t)S.njobs, sizeof *S.jobs);
    if (S.port < 0 || S.join_lat == NULL || S.detect_lat == NULL || S.jobs == NULL ||
        server_start() != 0)
        return 1;
    usleep(200000);
    S.fds_before = soak_proc_fds(S.server);
    S.heap_before = server_metric("gpulaunch_rdzv_heap_bytes");
    uv_loop_init(&S.loop);
    soak_hostile_init(&S.loop, S.port, SOAK_HANDSHAKE_MS, SOAK_ANSWER_MS, rnd, hostile_violation);
    S.t0 = now_ms();
    S.end_ms = S.t0 + (uint64_t)(S.duration_s * 1000);
    S.next_sample = S.t0 + (uint64_t)(S.sample_s * 1000);
    S.next_restart = S.t0 + (S.end_ms - S.t0) / (uint64_t)(S.restarts + 1);
    uint64_t last_life = (S.end_ms - S.t0) / (uint64_t)(S.restarts + 1);
    S.drain_at = S.end_ms - last_life + last_life / 4;
    printf("rdzv_soak: %d jobs of 2-%d nodes (about %d nodes), %.0f s, a change every ~%u ms a "
           "job, %d server restart(s), seed %u\n",
           S.njobs, SOAK_JOB_MAX_NODES, S.nodes, S.duration_s, S.dwell_ms, S.restarts, S.seed);
    fflush(stdout);
    for (int i = 0; i < S.njobs; i++) {
        S.jobs[i].idx = i;
        S.jobs[i].next_ms = S.t0 + rnd() % 2000; /* the jobs start over two seconds */
    }
    uv_timer_init(&S.loop, &S.tick);
    uv_timer_start(&S.tick, on_tick, 50, 50);
    uv_run(&S.loop, UV_RUN_DEFAULT);
    uv_loop_close(&S.loop);

    /* Every client is gone: the server must hold what it held before the first. */
    usleep(1000000);
    long fds_after = soak_proc_fds(S.server);
    double jobs_left = server_metric("gpulaunch_rdzv_jobs"),
           nodes_left = server_metric("gpulaunch_rdzv_nodes"),
           perr = server_metric("gpulaunch_rdzv_protocol_errors_total"),
           aref = server_metric("gpulaunch_rdzv_auth_refused_total");
    /* after restarts the server is a fresh process, started as the first
     * was: it is held to the first one's figures */
    double heap_after = server_metric("gpulaunch_rdzv_heap_bytes");
    int left_behind = fds_after != S.fds_before || jobs_left != 0 || nodes_left != 0 ||
                      (S.fds_drained > 0 && fds_after != S.fds_drained) ||
                      (S.heap_drained > 0 && heap_after - S.heap_drained > heap_slack());
    kill(S.server, SIGTERM);
    int st = 0;
    waitpid(S.server, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        violation(NULL, NULL, "the server did not exit cleanly on SIGTERM (status %d)", st);
    }

    uint64_t acts = 0;
    for (int a = 0; a <= A_DONE; a++)
        acts += S.actions[a];
    printf("rdzv_soak: changes %llu (", (unsigned long long)acts);
    for (int a = 0; a <= A_DONE; a++)
        printf("%s%s %llu", a ? ", " : "", action_names[a], (unsigned long long)S.actions[a]);
    printf("), hostile connections closed by the server %llu (its protocol errors %.0f, auth "
           "refusals %.0f), nodes re-registered after restarts %llu (all back in %llu ms)\n",
           (unsigned long long)soak_hostile_closed(), perr, aref, (unsigned long long)S.resumed,
           (unsigned long long)S.reconnect_ms);
    printf("rdzv_soak: last join to every node assigned: p50 %.0f ms, p99 %.0f ms (%zu rounds); a "
           "vanished node said after p50 %.2f s, max %.2f s (%zu)\n",
           pct(S.join_lat, S.njoin_lat, 0.5), pct(S.join_lat, S.njoin_lat, 0.99), S.njoin_lat,
           pct(S.detect_lat, S.ndetect_lat, 0.5) / 1000.0,
           pct(S.detect_lat, S.ndetect_lat, 1.0) / 1000.0, S.ndetect_lat);
    printf("rdzv_soak: heartbeats alone (%d nodes, %d s with nothing changing): server cpu %.1f us "
           "a heartbeat\n",
           S.quiet_nodes, SOAK_QUIET_MS / 1000, S.quiet_us);
    for (int l = 0; l < S.lives; l++) {
        const double *f = S.fit[l];
        double den = f[0] * f[3] - f[1] * f[1], slope = 0, mean = f[0] > 0 ? f[2] / f[0] : 0;
        if (f[0] >= 3 && den > 0)
            slope = (f[0] * f[4] - f[1] * f[2]) / den;
        printf("rdzv_soak: server life %d: rss after warm-up %.0f KiB on average, trend %+.0f KiB "
               "an hour (%+.2f %% an hour, %d samples)\n",
               l + 1, mean, slope, mean > 0 ? 100.0 * slope / mean : 0.0, (int)f[0]);
        printf("rdzv_soak: server life %d: rss %ld -> %ld KiB (%+.2f %% after warm-up), fds %ld "
               "-> %ld, cpu %.1f us a heartbeat (all its work over the heartbeats sent)\n",
               l + 1, S.rss_warm[l], S.rss_end[l],
               S.rss_warm[l] > 0
                   ? 100.0 * (double)(S.rss_end[l] - S.rss_warm[l]) / (double)S.rss_warm[l]
                   : 0.0,
               S.fds_warm[l], S.fds_end[l], S.cpu_per_hb_us[l]);
    }
    printf("rdzv_soak: every client gone: server fds %ld (before the first client %ld, when every "
           "job had ended once %ld), jobs %.0f, nodes %.0f, heap %.0f bytes (before the first "
           "client %.0f, when every job had ended once %.0f: at most %.0f more)\n",
           fds_after, S.fds_before, S.fds_drained, jobs_left, nodes_left, heap_after, S.heap_before,
           S.heap_drained, heap_slack());
    printf("rdzv_soak nodes=%d duration_s=%.0f rounds=%llu decisions=%llu violations=%llu "
           "left_behind=%d\n",
           S.nodes, S.duration_s, (unsigned long long)S.rounds, (unsigned long long)S.decisions,
           (unsigned long long)S.violations, left_behind);
    return S.violations || left_behind ? 1 : 0;
}
