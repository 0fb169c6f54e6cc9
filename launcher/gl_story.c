/* How each round began on this node and what it cost (see gl_story.h). */
#include "gl_story.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "gb_progress.h"
#include "gb_time.h"
#include "gl_progress.h"

/* the pause histogram's upper bounds (s), +Inf last */
static const double pause_le[GL_STORY_PAUSE_BUCKETS - 1] = {0.05, 0.1, 0.25, 0.5, 1,
                                                            2.5,  5,   10,   30,  60};

static struct {
    uv_timer_t timer;
    int inited, nproc, watching;
    gl_story_sink sink;
    uint64_t ended_ns; /* the last round's end (0: none yet) */
    uint32_t ended_round;
    int64_t reached; /* the newest step the ended round reached (-1: none said) */
    uint32_t round;  /* the round being watched */
    enum gl_story_kind kind;
    uint64_t began_ns;
    uint64_t handed_ns;    /* when the round was handed to the workers (a warm join's mark) */
    int64_t pending_first; /* the first step seen, told at the next tick (its state line first) */
    double pending_pause;
    int pending;
    uint64_t base[GB_PROGRESS_MAX_SLOTS]; /* each slot's step count when it began */
    char why[GL_STORY_WHY_MAX];
    uint32_t cause;  /* why's enum rdzv_restart_cause */
    int began_since; /* a round began here since the last end */
    /* --metrics */
    uint64_t rounds[GL_ROUND_KINDS], redone, restarts[RDZV_CAUSES];
    uint64_t peer_bytes,
        ckpt_bytes; /* state the workers copied from peers, read from checkpoints */
    uint64_t pause_count, pause_bucket[GL_STORY_PAUSE_BUCKETS];
    double pause_sum;
} S;

const char *gl_story_kind_name(enum gl_story_kind kind) {
    static const char *const names[GL_ROUND_KINDS] = {"first", "in_place", "restart", "warm_join"};
    return (unsigned)kind < GL_ROUND_KINDS ? names[kind] : "unknown";
}

void gl_story_init(uv_loop_t *loop, int nproc, gl_story_sink sink) {
    S.sink = sink;
    S.nproc = nproc < GB_PROGRESS_MAX_SLOTS ? nproc : GB_PROGRESS_MAX_SLOTS;
    S.reached = -1;
    if (S.inited)
        return;
    S.inited = 1;
    uv_timer_init(loop, &S.timer);
    uv_unref((uv_handle_t *)&S.timer); /* never what keeps the launcher running */
}

static void tell(int64_t first, double pause_s);

void gl_story_ended(uint32_t round) {
    if (S.ended_ns && S.ended_round == round)
        return;       /* said twice (the server's word after a local failure's) */
    if (S.watching) { /* ended before its first step was told */
        if (S.pending)
            tell(S.pending_first, S.pending_pause);
        S.pending = 0;
        S.watching = 0;
        uv_timer_stop(&S.timer);
    }
    if (S.ended_ns && !S.began_since) {
        /* a round this node never began in (its workers were still stopping
         * or re-forming for it): the change is still the one that began at
         * the last end, with its reason and its newest step */
        S.ended_round = round;
        return;
    }
    S.began_since = 0;
    S.ended_ns = gb_now_ns();
    S.ended_round = round;
    S.reached = -1;
    for (int i = 0; i < S.nproc; i++) {
        gb_progress_slot *s = gl_progress_slot(i);
        if (s && atomic_load(&s->steps) > 0) {
            int64_t st = atomic_load(&s->step);
            S.reached = st > S.reached ? st : S.reached;
        }
    }
    S.why[0] = '\0';
    S.cause = RDZV_CAUSE_NONE;
}

void gl_story_restart_why(const char *why, enum rdzv_restart_cause cause) {
    if (S.why[0] == '\0' && why) {
        snprintf(S.why, sizeof S.why, "%s", why);
        S.cause = (uint32_t)cause < RDZV_CAUSES ? (uint32_t)cause : RDZV_CAUSE_NONE;
    }
}

/* Where the local workers' state came from this round (their "state" lines
 * since the round's change): the source, the step, bytes summed, the
 * longest time, the first peer named; source GL_STATE_NONE when none said. */
static gl_state_report state_now(void) {
    gl_state_report all = {.source = GL_STATE_NONE, .step = -1, .root = -1};
    uint64_t mark =
        S.kind == GL_ROUND_IN_PLACE || S.kind == GL_ROUND_RESTART ? S.ended_ns : S.handed_ns;
    /* a peer's copy is what the round is said by: a worker that read a
     * checkpoint first and was then given its peers' newer state took that */
    for (int pass = 0; pass < 2 && all.source == GL_STATE_NONE; pass++)
        for (int i = 0; i < S.nproc; i++) {
            gl_state_report r;
            if (gl_progress_state(i, &r) != 0 || r.at_ns < mark ||
                (pass == 0 && r.source != GL_STATE_PEER))
                continue;
            if (all.source == GL_STATE_NONE) {
                all.source = r.source;
                all.step = r.step;
                all.root = r.root;
            }
            all.bytes += r.bytes;
            all.ms = r.ms > all.ms ? r.ms : all.ms;
        }
    return all;
}

/* The line and the figures; pause_s < 0: no step seen. */
static void tell(int64_t first, double pause_s) {
    gl_state_report st = state_now();
    int after_end = S.ended_ns != 0 && S.kind != GL_ROUND_FIRST && S.kind != GL_ROUND_WARM;
    int64_t redone =
        after_end && first >= 0 && S.reached >= 0 && first <= S.reached ? S.reached - first + 1 : 0;
    S.rounds[S.kind]++;
    S.redone += (uint64_t)redone;
    if (st.source == GL_STATE_PEER)
        S.peer_bytes += st.bytes;
    else if (st.source == GL_STATE_CHECKPOINT)
        S.ckpt_bytes += st.bytes;
    uint32_t cause = S.kind == GL_ROUND_RESTART ? S.cause : RDZV_CAUSE_NONE;
    if (after_end && S.kind == GL_ROUND_RESTART)
        S.restarts[cause]++; /* RDZV_CAUSE_NONE: not said ("unknown") */
    if (pause_s >= 0 && after_end) {
        S.pause_count++;
        S.pause_sum += pause_s;
        int b = 0;
        while (b < GL_STORY_PAUSE_BUCKETS - 1 && pause_s > pause_le[b])
            b++;
        S.pause_bucket[b]++;
    }
    if (S.sink) {
        rdzv_story story = RDZV_STORY_INIT;
        story.round = S.round;
        story.kind = (uint32_t)S.kind;
        story.pause_ms = pause_s < 0 ? RDZV_STORY_UNKNOWN : (uint32_t)(pause_s * 1000);
        story.redone = (uint32_t)redone;
        story.nproc = (uint32_t)S.nproc;
        story.why = S.kind == GL_ROUND_RESTART ? S.why : NULL;
        story.source = st.source == GL_STATE_PEER         ? RDZV_STATE_PEER
                       : st.source == GL_STATE_CHECKPOINT ? RDZV_STATE_CHECKPOINT
                                                          : RDZV_STATE_NONE;
        story.state_step = st.step;
        story.state_bytes = st.bytes;
        story.state_ms = st.ms;
        story.cause = after_end ? cause : RDZV_CAUSE_NONE;
        story.state_root = st.source == GL_STATE_PEER ? st.root : -1;
        S.sink(&story);
    }
    if (S.kind == GL_ROUND_FIRST)
        return; /* not a change: the launcher's round line says it */
    char how[GL_STORY_WHY_MAX + 64], cost[160], from[160] = "";
    if (st.source == GL_STATE_PEER)
        snprintf(from, sizeof from, "; state: step %lld copied from rank %d (%llu bytes in %u ms)",
                 (long long)st.step, st.root, (unsigned long long)st.bytes, st.ms);
    else if (st.source == GL_STATE_CHECKPOINT)
        snprintf(from, sizeof from,
                 "; state: the checkpoint of step %lld read (%llu bytes in %u ms)",
                 (long long)st.step, (unsigned long long)st.bytes, st.ms);
    else if (S.kind == GL_ROUND_IN_PLACE)
        snprintf(from, sizeof from, "; state: kept in memory");
    switch (S.kind) {
    case GL_ROUND_IN_PLACE:
        snprintf(how, sizeof how, "re-formed in place (the workers kept)");
        break;
    case GL_ROUND_WARM:
        snprintf(how, sizeof how, "joined warm (the workers started before it took it)");
        break;
    default:
        snprintf(how, sizeof how, "restarted the workers (%s)",
                 S.why[0] ? S.why : "they do not re-form in place");
        break;
    }
    if (pause_s < 0)
        snprintf(cost, sizeof cost, "no step reported within %d s", GL_STORY_WATCH_MS / 1000);
    else if (after_end)
        snprintf(cost, sizeof cost,
                 "paused %.3f s from round %u's end to the first step (step %lld), %lld step(s) "
                 "done again",
                 pause_s, S.ended_round, (long long)first, (long long)redone);
    else
        snprintf(cost, sizeof cost, "first step (step %lld) %.3f s after it began",
                 (long long)first, (double)(gb_now_ns() - S.began_ns) / 1e9);
    fprintf(stderr, "gpulaunch: round %u began: %s; %s%s\n", S.round, how, cost, from);
}

static void on_tick(uv_timer_t *t) {
    (void)t;
    uint64_t now = gb_now_ns();
    if (S.pending) { /* a tick later: a state line written before the step has been read */
        S.pending = 0;
        S.watching = 0;
        uv_timer_stop(&S.timer);
        tell(S.pending_first, S.pending_pause);
        return;
    }
    for (int i = 0; i < S.nproc; i++) {
        gb_progress_slot *s = gl_progress_slot(i);
        if (s == NULL)
            continue;
        uint64_t n = atomic_load(&s->steps);
        if (n <= S.base[i])
            continue;
        /* the first step of this round: the step now less those after it */
        int64_t first = atomic_load(&s->step) - (int64_t)(n - S.base[i]) + 1;
        uint64_t at = atomic_load(&s->step_ns);
        uint64_t from = S.ended_ns && S.kind != GL_ROUND_FIRST && S.kind != GL_ROUND_WARM
                            ? S.ended_ns
                            : S.began_ns;
        S.pending = 1;
        S.pending_first = first;
        S.pending_pause = at > from ? (double)(at - from) / 1e9 : 0.0;
        return;
    }
    if (now - S.began_ns > (uint64_t)GL_STORY_WATCH_MS * 1000000ull) {
        S.watching = 0;
        uv_timer_stop(&S.timer);
        tell(-1, -1);
    }
}

void gl_story_began(uint32_t round, enum gl_story_kind kind, uint64_t handed_ns) {
    if (!S.inited)
        return;
    if (S.watching) /* the last one never stepped (or its step is still to be told) */
        tell(S.pending ? S.pending_first : -1, S.pending ? S.pending_pause : -1);
    S.pending = 0;
    S.began_since = 1;
    S.round = round;
    S.kind = kind == GL_ROUND_RESTART && S.ended_ns == 0 ? GL_ROUND_FIRST : kind;
    S.began_ns = gb_now_ns();
    S.handed_ns = handed_ns && handed_ns < S.began_ns ? handed_ns : S.began_ns;
    for (int i = 0; i < S.nproc; i++) {
        gb_progress_slot *s = gl_progress_slot(i);
        S.base[i] = s ? atomic_load(&s->steps) : 0;
    }
    S.watching = 1;
    uv_timer_start(&S.timer, on_tick, GL_STORY_TICK_MS, GL_STORY_TICK_MS);
}

size_t gl_story_metrics(char *p, size_t cap, const char *job) {
    size_t len = 0;
    int w = snprintf(p, cap,
                     "# HELP gpulaunch_rounds_total Rounds this node ran, by how they began "
                     "(first, in_place, restart, warm_join).\n"
                     "# TYPE gpulaunch_rounds_total counter\n");
    if (w < 0 || (size_t)w >= cap)
        return 0;
    len = (size_t)w;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        w = snprintf(p + len, cap - len, __VA_ARGS__);                                             \
        if (w < 0 || (size_t)w >= cap - len)                                                       \
            return len;                                                                            \
        len += (size_t)w;                                                                          \
    } while (0)
    for (int k = 0; k < GL_ROUND_KINDS; k++)
        PUT("gpulaunch_rounds_total{job=\"%s\",kind=\"%s\"} %llu\n", job,
            gl_story_kind_name((enum gl_story_kind)k), (unsigned long long)S.rounds[k]);
    PUT("# HELP gpulaunch_round_pause_seconds From a round's end to this node's first step in "
        "the next (re-formed in place or restarted).\n"
        "# TYPE gpulaunch_round_pause_seconds histogram\n");
    uint64_t cum = 0;
    for (int b = 0; b < GL_STORY_PAUSE_BUCKETS; b++) {
        cum += S.pause_bucket[b];
        if (b < GL_STORY_PAUSE_BUCKETS - 1)
            PUT("gpulaunch_round_pause_seconds_bucket{job=\"%s\",le=\"%g\"} %llu\n", job,
                pause_le[b], (unsigned long long)cum);
        else
            PUT("gpulaunch_round_pause_seconds_bucket{job=\"%s\",le=\"+Inf\"} %llu\n", job,
                (unsigned long long)cum);
    }
    PUT("gpulaunch_round_pause_seconds_sum{job=\"%s\"} %.9g\n"
        "gpulaunch_round_pause_seconds_count{job=\"%s\"} %llu\n",
        job, S.pause_sum, job, (unsigned long long)S.pause_count);
    PUT("# HELP gpulaunch_steps_redone_total Steps this node's workers did again after a round "
        "change (a restart from an older checkpoint).\n"
        "# TYPE gpulaunch_steps_redone_total counter\n"
        "gpulaunch_steps_redone_total{job=\"%s\"} %llu\n",
        job, (unsigned long long)S.redone);
    PUT("# HELP gpulaunch_state_bytes_total Bytes of state this node's workers took when a round "
        "began, by source (peer: copied from a peer rank; checkpoint: read).\n"
        "# TYPE gpulaunch_state_bytes_total counter\n"
        "gpulaunch_state_bytes_total{job=\"%s\",source=\"peer\"} %llu\n"
        "gpulaunch_state_bytes_total{job=\"%s\",source=\"checkpoint\"} %llu\n",
        job, (unsigned long long)S.peer_bytes, job, (unsigned long long)S.ckpt_bytes);
    PUT("# HELP gpulaunch_restarts_total Round changes this node's workers took by a restart "
        "instead of in place, by reason.\n"
        "# TYPE gpulaunch_restarts_total counter\n");
    for (uint32_t c = 0; c < RDZV_CAUSES; c++)
        PUT("gpulaunch_restarts_total{job=\"%s\",reason=\"%s\"} %llu\n", job,
            rdzv_restart_cause_name(c), (unsigned long long)S.restarts[c]);
    PUT("# HELP gpulaunch_reform_fallbacks_total Re-formations in place that fell back to "
        "restarting the workers.\n"
        "# TYPE gpulaunch_reform_fallbacks_total counter\n"
        "gpulaunch_reform_fallbacks_total{job=\"%s\"} %llu\n",
        job, (unsigned long long)S.restarts[RDZV_CAUSE_REFORM_FAILED]);
#undef PUT
    return len;
}
