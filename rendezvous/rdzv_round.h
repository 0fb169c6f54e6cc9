/* Round formation of one job, as a state machine and nothing else: events go
 * in (a node joins, leaves, fails, hangs, finishes, or stops beating; the
 * clock ticks), decisions come out (a round starts with these members and
 * ranks, a round is over and why, who waits for what, a join timed out, the
 * job is done). It has no sockets, no event loop and no clock of its own:
 * every call takes the time, so its cases are tested in microseconds
 * (test_round.c). The server (rdzv_job.c) carries its events and decisions. */
#ifndef GPULAUNCH_RDZV_ROUND_H
#define GPULAUNCH_RDZV_ROUND_H

#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "gpulaunch/gpl_error.h"
#include "rdzv_codec.h"

#define RDZV_PROGRESS_AFTER_MS 2000 /* a waiting node hears what the round waits for ... */
#define RDZV_PROGRESS_MS 5000       /* ... after this long, then at this interval */

enum rdzv_round_state { RDZV_R_GATHERING = 0, RDZV_R_RUNNING = 1, RDZV_R_DONE = 2 };

typedef struct rdzv_round rdzv_round;
typedef struct rdzv_rmember rdzv_rmember;

/* A node of a job, embedded by its owner (the server's member): the owner
 * keeps it alive while it is in a round, and calls rdzv_round_leave before
 * freeing it. Zero-initialised, then every field is the round's. */
struct rdzv_rmember {
    rdzv_round *r;                  /* the job it joined, NULL before */
    LIST_ENTRY(rdzv_rmember) plink; /* r->pending */
    char hostname[RDZV_MAX_STR + 1], addr[RDZV_MAX_STR + 1], instance[RDZV_MAX_STR + 1];
    uint16_t master_port;
    uint32_t nproc, ngpus;
    int32_t static_rank;
    uint32_t join_req; /* the JOIN its assignment answers */
    uint64_t joined_ms, next_progress_ms;
    uint64_t join_seq; /* arrival order (joined_ms ties within a millisecond) */
    int pending, active, done;
    uint32_t node_rank;
    uint32_t base_rank;     /* its first global rank in the current round */
    int64_t prev_rank;      /* node rank in the last round it was in, -1 none */
    uint32_t awaited_round; /* a survivor of this failed round, not re-joined yet (0: none) */
    int live;               /* its workers re-form in place (RDZV_NODE_LIVE) */
    int warm;               /* a warm joiner held while a round runs: 1 its workers start,
                               2 they wait for their round (RDZV_NODE_READY); 0 none */
};

struct rdzv_round {
    char run_id[RDZV_MAX_STR + 1];
    char first_host[RDZV_MAX_STR + 1]; /* the node that started the job */
    int state;                         /* enum rdzv_round_state */
    uint32_t round;                    /* the current or last round, 0 before the first */
    uint32_t min_nodes, max_nodes, last_call_ms, join_timeout_ms, hb_timeout_ms;
    int is_static;
    uint64_t join_seq;
    uint32_t nmembers; /* members whose r is this round */
    /* gathering */
    LIST_HEAD(, rdzv_rmember) pending;
    uint32_t npending;
    rdzv_rmember **static_slots; /* max_nodes entries in static mode */
    uint64_t min_reached_ms;
    uint64_t pending_due_ms; /* no waiting node is due before this (tick skips them) */
    /* re-forming after a failure: the round starts once every survivor of
     * reform_round has re-joined (no last call), or at reform_deadline_ms */
    int reforming;
    uint32_t reform_round, reform_left;
    uint64_t reform_deadline_ms;
    char reform_why[RDZV_MAX_STR + 1]; /* the node whose failure ended that round */
    int warm_end; /* the round ends to take in warm joiners: its nodes re-form without the
                     last call (the joiners wait already) */
    /* running */
    rdzv_rmember **ranks; /* nranks entries by node rank; NULL: gone */
    uint32_t nranks, nactive, ndone;
    uint64_t resume_deadline_ms; /* re-registered after a server restart: the rest by then */
};

typedef enum rdzv_decision_kind {
    RDZV_DO_ASSIGN,     /* round `round` starts: members[i] is node rank i (node_rank,
                         * base_rank and join_req set); world_size ranks in all */
    RDZV_DO_RESUMED,    /* m re-registered its running round: answer its JOIN */
    RDZV_DO_WAITING,    /* count nodes wait beside the total of the round: tell members */
    RDZV_DO_ROUND_OVER, /* round `round` is over (reason, culprit node_rank and host, text):
                         * tell members, the nodes that were in it */
    RDZV_DO_PROGRESS,   /* tell the waiting m what the round waits for (text); count
                         * joined of total expected, waited_ms so far */
    RDZV_DO_TIMEOUT,    /* m waited waited_ms, past the join timeout: refuse its JOIN
                         * (text: what was missing); m waits no more */
    RDZV_DO_JOB_DONE,   /* every node of round `round` finished: tell members and the
                         * nodes still waiting (pending) */
    RDZV_DO_WARM,       /* the waiting m is held: every node of the running round re-forms
                         * in place; m starts its workers and says when they wait (count
                         * nodes wait beside the total of the round) */
} rdzv_decision_kind;

typedef struct rdzv_decision {
    rdzv_decision_kind kind;
    uint32_t round, reason, node_rank, world_size;
    uint32_t count, total;
    uint64_t waited_ms;
    rdzv_rmember *m;
    rdzv_rmember *const *members; /* nmembers entries, NULL ones skipped */
    uint32_t nmembers;
    rdzv_rmember *const *pending; /* JOB_DONE: the waiting nodes */
    uint32_t npending;
    const char *host, *text; /* "" when none */
} rdzv_decision;

/* What one call decided, in order. The arrays and strings its decisions point
 * to live until the next rdzv_round_out_reset, so the caller acts on them
 * before it lets any member go. */
typedef struct rdzv_round_out {
    rdzv_decision *d;
    size_t n, cap;
    void **owned; /* arrays and strings to free at the reset */
    size_t nowned, owned_cap;
    int lost; /* decisions dropped for want of memory (logged) */
} rdzv_round_out;

void rdzv_round_out_reset(rdzv_round_out *o);
/* Resets o and gives back its memory. */
void rdzv_round_out_free(rdzv_round_out *o);

/* A job from its first JOIN (hb_timeout_ms: the server's default when the
 * JOIN has none). GPL_ERR_NOMEM, or GPL_OK. */
gpl_result_t rdzv_round_init(rdzv_round *r, const rdzv_msg *join, uint32_t hb_timeout_ms);
void rdzv_round_free(rdzv_round *r);

/* m (of this job or none) joins with msg, a JOIN (RDZV_JOIN_RESUME: it
 * re-registers the round it runs after a server restart). A refused join
 * changes nothing and returns the code, its reason in err. */
gpl_result_t rdzv_round_join(rdzv_round *r, rdzv_rmember *m, const rdzv_msg *msg, uint64_t now,
                             rdzv_round_out *out, char *err, size_t errlen);
/* m leaves its job (its connection closed, or it joins another job); a
 * member of the running round ends it, why in the message. */
void rdzv_round_leave(rdzv_rmember *m, const char *why, uint64_t now, rdzv_round_out *out);
/* m's node reported a failed worker (hung: the watchdog's rank) */
void rdzv_round_fail(rdzv_rmember *m, int hung, uint32_t rank, const char *message, uint64_t now,
                     rdzv_round_out *out);
/* m's heartbeats stopped for silent_ms while it is in the running round */
void rdzv_round_heartbeat_lost(rdzv_rmember *m, uint64_t silent_ms, uint64_t now,
                               rdzv_round_out *out);
/* m answered no probe while its peers waited for it (rdzv_probe.c): the
 * running round ends as for a lost heartbeat, evidence in the message */
void rdzv_round_unresponsive(rdzv_rmember *m, const char *evidence, uint64_t now,
                             rdzv_round_out *out);
/* what m's workers can do now (RDZV_NODE_* flags): a held warm joiner's
 * readiness ends the round to take it in (once every held one is ready), as
 * does a node of the round whose workers no longer re-form in place */
void rdzv_round_node(rdzv_rmember *m, uint32_t flags, uint64_t now, rdzv_round_out *out);
/* every worker of m's node finished the round */
void rdzv_round_done(rdzv_rmember *m, rdzv_round_out *out);
/* the time is now: last calls, re-formation deadlines, join timeouts,
 * progress notes and the deadline of a round re-registered after a restart */
void rdzv_round_tick(rdzv_round *r, uint64_t now, rdzv_round_out *out);

/* a survivor of a failed round that has not re-joined yet */
int rdzv_round_awaits(const rdzv_rmember *m);
/* what the round waits for, for the nodes waiting in it */
void rdzv_round_describe(const rdzv_round *r, uint64_t now, char *out, size_t len);
const char *rdzv_round_state_name(int state);

#endif
