/* Job health on the rendezvous server (docs/health.md): the per-rank
 * statistics of the current round that launchers send (STATS, with the
 * ranks' checkpoint figures), straggler detection over them, the job's
 * checkpoints summed up, its step-rate history, its rounds and its event
 * timeline (joins, rounds, failures, hangs, preemptions, stragglers). One per
 * job, owned by it; fed by rdzv_server.c on the loop thread, read by the HTTP
 * side (rdzv_health_render.c) on the same thread. Every table is bounded. */
#ifndef GPULAUNCH_RDZV_HEALTH_H
#define GPULAUNCH_RDZV_HEALTH_H

#include <stdint.h>

#include "gpulaunch/rdzv.h"
#include "rdzv_codec.h"

#define RDZV_HEALTH_MAX_RANKS 131072  /* ranks tracked per job; higher ranks are not */
#define RDZV_HEALTH_MAX_EVENTS 256    /* timeline entries per job; the oldest go first */
#define RDZV_HEALTH_MAX_ROUNDS 64     /* rounds remembered per job */
#define RDZV_HEALTH_RATE_SAMPLES 720  /* step-rate samples per job (the oldest go first) */
#define RDZV_HEALTH_RATE_MIN_MS 1000  /* at most one step-rate sample per second */
#define RDZV_HEALTH_MEDIAN_MS 100     /* the job's medians are recomputed at most this often */
#define RDZV_HEALTH_MIN_EXCESS_US 100 /* a rank under the median + this is never named */
#define RDZV_HEALTH_TEXT 320          /* bytes of one timeline text */

/* Kinds of timeline events. */
enum rdzv_tl_kind {
    RDZV_TL_JOIN = 1,       /* nodes joined (consecutive joins are one entry with a count) */
    RDZV_TL_ROUND = 2,      /* a round was assigned */
    RDZV_TL_ROUND_OVER = 3, /* a round ended: node lost, heartbeat, failure, scale-up */
    RDZV_TL_HANG = 4,       /* a launcher's watchdog found a hung rank */
    RDZV_TL_PREEMPT = 5,    /* checkpoint event: a node is being preempted */
    RDZV_TL_SHUTDOWN = 6,
    RDZV_TL_STRAGGLER = 7, /* a rank was named a straggler */
    RDZV_TL_RECOVERED = 8, /* a named straggler is back under the threshold */
    RDZV_TL_DONE = 9,      /* every node finished */
    RDZV_TL_GPU = 10,      /* a launcher's GPU notice: idle alert, XID, lost GPU */
    RDZV_TL_BEGAN = 11,    /* how a round's nodes began it (their STORY; one entry a round) */
};
const char *rdzv_tl_kind_name(uint32_t kind);

typedef struct rdzv_tl_event {
    uint64_t unix_ms;
    uint32_t kind, round, count;
    int64_t rank; /* global rank, -1: none */
    char node[RDZV_MAX_STR + 1];
    char text[RDZV_HEALTH_TEXT];
} rdzv_tl_event;

/* How a round began, from its nodes' STORY messages (enum rdzv_story_kind). */
#define RDZV_HEALTH_PAUSE_BUCKETS 11 /* the pause histogram's buckets, +Inf included */
#define RDZV_HEALTH_ROUND_NODES 8    /* nodes' own stories kept per round (the rest counted) */
#define RDZV_HEALTH_NODE_NAME 65     /* a node's name kept with its story (HOST_NAME_MAX + 1) */
/* One node's story of a round, as it told it (the first RDZV_HEALTH_ROUND_NODES
 * to tell that were not a first start: the changes are what is looked for). */
typedef struct rdzv_node_story {
    char node[RDZV_HEALTH_NODE_NAME];
    uint8_t kind, cause, source; /* enum rdzv_story_kind, rdzv_restart_cause, rdzv_state_source */
    uint32_t pause_ms;           /* RDZV_STORY_UNKNOWN: no step seen */
    uint32_t redone, nproc, state_ms;
    int32_t state_root; /* the peer rank copied (-1: not said) */
    int64_t state_step; /* the step of the state taken (-1: none) */
    uint64_t state_bytes;
} rdzv_node_story;
typedef struct rdzv_round_story {
    uint32_t nodes[RDZV_STORY_KINDS]; /* nodes that began it each way */
    uint32_t pause_max_ms;            /* the longest pause a node said (0: none said) */
    uint64_t pause_rank_ms;           /* pauses x the nodes' workers, summed */
    uint32_t redone;                  /* steps done again (the most a node said) */
    char why[RDZV_HEALTH_TEXT];       /* the first restart's node and reason ("": none) */
    uint64_t peer_bytes, ckpt_bytes;  /* state copied from peers, read from checkpoints */
    int64_t ckpt_step;                /* the checkpoint's step read (-1: none) */
    uint32_t restarts[RDZV_CAUSES];   /* nodes that restarted, by reason (0: not said) */
    rdzv_node_story each[RDZV_HEALTH_ROUND_NODES]; /* nodes' own stories */
    uint32_t each_n, each_more; /* kept, and told beyond those (first starts not counted) */
} rdzv_round_story;

typedef struct rdzv_round_rec {
    uint32_t round, nnodes, world;
    uint64_t start_unix_ms, end_unix_ms; /* end 0: running */
    char end[RDZV_HEALTH_TEXT];          /* why it ended */
    rdzv_round_story story;
    uint64_t began_event; /* its "began" timeline entry's number (events_total); 0: none */
} rdzv_round_rec;

/* What the job's membership changes cost so far (every node's STORY). */
typedef struct rdzv_health_cost {
    uint64_t nodes[RDZV_STORY_KINDS]; /* node rounds begun each way */
    uint64_t pause_rank_ms;           /* paused rank-milliseconds (GPU-ms with a GPU a rank) */
    uint64_t redone;                  /* steps done again, a round's most summed */
    uint64_t peer_bytes, ckpt_bytes;  /* state copied from peers, read from checkpoints */
    uint64_t pauses, pause_bucket[RDZV_HEALTH_PAUSE_BUCKETS]; /* nodes' pauses, histogram */
    double pause_sum_s;
    uint64_t restarts[RDZV_CAUSES]; /* node rounds begun by a restart, by reason (0: not said) */
} rdzv_health_cost;

typedef struct rdzv_rank_health {
    rdzv_rank_stats st; /* its last window, as reported */
    uint32_t node_rank; /* the node that reported it */
    uint32_t window_ms;
    uint64_t updated_ms;  /* monotonic time of the last report; 0: none this round */
    uint32_t busy_us;     /* step time less collective wait (step time when wait is unknown) */
    uint32_t over, under; /* consecutive windows over / not over the threshold */
    float ratio;          /* busy / the job's median at the last window */
    uint8_t straggler;
} rdzv_rank_health;

typedef struct rdzv_rate_sample {
    uint64_t unix_ms;
    float steps_per_s;
    uint32_t round;
} rdzv_rate_sample;

/* The job's checkpoints, from its ranks' last reports (docs/health.md). */
typedef struct rdzv_health_ckpt {
    uint32_t ranks;       /* ranks whose last report had checkpoint figures; 0: none */
    int64_t local_step;   /* newest step every rank wrote to its local tier; -1: none (or a
                             rank of the round has not said) */
    int64_t durable_step; /* newest step every rank's files are durable; -1: as above */
    uint32_t stall_ms;    /* the worst last stall of a save */
    uint64_t drain_left;  /* bytes still draining to the durable tier, all ranks */
} rdzv_health_ckpt;

typedef struct rdzv_health {
    double threshold;
    uint32_t windows;
    /* the current round */
    uint32_t round, nnodes, world;
    rdzv_rank_health *ranks; /* min(world, RDZV_HEALTH_MAX_RANKS) entries, on first STATS */
    uint32_t nranks, reported, nstragglers;
    uint32_t *scratch;       /* nranks values for the medians */
    uint64_t median_ms;      /* when the medians below were computed; 0: never */
    uint32_t median_busy_us; /* the job's lower median of busy time */
    uint32_t median_step_us; /* ... of step time */
    uint32_t median_wait_us; /* ... of known collective waits; UINT32_MAX: none known */
    float steps_per_s;       /* the job's median step rate */
    /* step rate over time */
    rdzv_rate_sample rate[RDZV_HEALTH_RATE_SAMPLES];
    uint32_t rate_head, rate_n;
    uint64_t rate_last_ms;
    /* rounds and the timeline: rings that grow to their bound */
    rdzv_round_rec *rounds;
    uint32_t rounds_head, rounds_n, rounds_cap;
    rdzv_tl_event *events;
    uint32_t ev_head, ev_n, ev_cap;
    uint64_t events_total;
    /* the checkpoint summary, recomputed when read after a STATS changed it */
    rdzv_health_ckpt ckpt;
    int ckpt_stale;
    /* the last hang reported */
    int has_hang;
    rdzv_tl_event hang;
    /* counters */
    uint64_t stats_msgs, stats_ranks, stats_dropped, hangs_total, stragglers_total;
    rdzv_health_cost cost;
} rdzv_health;

/* The pause histogram's upper bounds in seconds (the last, +Inf, left out). */
extern const double rdzv_health_pause_le[RDZV_HEALTH_PAUSE_BUCKETS - 1];

/* A straggler named (named = 1) or recovered (0); text says who and why. */
typedef void (*rdzv_health_notice_fn)(void *ctx, const rdzv_rank_health *r, int named,
                                      const char *text);

/* threshold <= 1 or windows 0: the defaults (RDZV_DEFAULT_STRAGGLER_*). NULL: out of memory. */
rdzv_health *rdzv_health_new(double threshold, uint32_t windows);
void rdzv_health_free(rdzv_health *h);

/* Every function below accepts h == NULL (a job whose health could not be
 * allocated) and then does nothing. */
void rdzv_health_note(rdzv_health *h, uint32_t kind, uint32_t round, const char *node, int64_t rank,
                      const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* A round was assigned: the rank table starts over (ranks change meaning). */
void rdzv_health_round_start(rdzv_health *h, uint32_t round, uint32_t nnodes, uint32_t world);
/* The current round ended; why goes into its record and the timeline. */
void rdzv_health_round_end(rdzv_health *h, uint32_t round, const char *node, const char *why);
/* Node `node` said how it began a round (a STORY message): kept with the
 * round's record (dropped when the round is no longer remembered) and in
 * the job's cost. */
void rdzv_health_story(rdzv_health *h, const char *node, const rdzv_msg *m);
/* The kind's name in /status and /metrics: first, in_place, restart, warm_join. */
const char *rdzv_story_kind_name(uint32_t kind);
/* Rank `rank` of node `node` hung (a FAIL with RDZV_FAIL_HANG). */
void rdzv_health_hang(rdzv_health *h, uint32_t round, const char *node, uint32_t rank,
                      const char *message);
/* One STATS message from node node_rank (hostname node), whose ranks are
 * [base, base + nproc): entries outside are dropped. Named and recovered
 * stragglers are told to notice. Returns the entries taken. */
uint32_t rdzv_health_stats(rdzv_health *h, uint32_t node_rank, const char *node, uint32_t base,
                           uint32_t nproc, const rdzv_msg *m, uint64_t now_ms,
                           rdzv_health_notice_fn notice, void *ctx);
/* Up to max rank indices for per-rank output: named stragglers first, then
 * the highest busy times; returned in rank order. */
uint32_t rdzv_health_top(const rdzv_health *h, uint32_t *out, uint32_t max);
/* Whether a rank's last report had checkpoint figures. */
int rdzv_health_rank_has_ckpt(const rdzv_rank_health *r);
/* The job's checkpoints over the current round's ranks: min of the steps
 * (a rank that has not reported counts as none), max of the stalls, sum of
 * the drains. O(ranks) after a STATS, then kept until the next. Never NULL:
 * h == NULL gives a summary of nothing. */
const rdzv_health_ckpt *rdzv_health_checkpoint(rdzv_health *h);
/* The i-th oldest entry of the timeline / rounds / rate rings. */
const rdzv_tl_event *rdzv_health_event(const rdzv_health *h, uint32_t i);
const rdzv_round_rec *rdzv_health_round(const rdzv_health *h, uint32_t i);
const rdzv_rate_sample *rdzv_health_rate(const rdzv_health *h, uint32_t i);

#endif
