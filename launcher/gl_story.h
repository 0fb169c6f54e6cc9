/* How each round began on this node and what it cost (docs/health.md,
 * "How each round began"): its kind (the first round, a live re-formation in
 * place, a restart and why it fell back to one, a warm join), the pause from
 * the last round's end to the local workers' first step in the new one, and
 * the steps done again (the new round's first step at or before the newest
 * step the last one reached: a restart from an older checkpoint). Read from
 * the progress slots (base/gb_progress.h: step, steps, step_ns); one log line
 * per round change, and the --metrics text. Workers that report no steps get
 * the line without a pause after GL_STORY_WATCH_MS. */
#ifndef GPULAUNCH_GL_STORY_H
#define GPULAUNCH_GL_STORY_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "gpulaunch/rdzv.h"

#define GL_STORY_TICK_MS 5        /* how often the slots are looked at until the first step */
#define GL_STORY_WATCH_MS 600000  /* a round's first step is waited for at most this long */
#define GL_STORY_WHY_MAX 256      /* bytes of a restart's reason kept */
#define GL_STORY_PAUSE_BUCKETS 11 /* the pause histogram's buckets, +Inf included */

/* The protocol's kinds (gpulaunch/rdzv.h): the same story goes to the rendezvous. */
enum gl_story_kind {
    GL_ROUND_FIRST = RDZV_STORY_FIRST,       /* the node's first round, workers started for it */
    GL_ROUND_IN_PLACE = RDZV_STORY_IN_PLACE, /* the workers kept took it (live re-formation) */
    GL_ROUND_RESTART = RDZV_STORY_RESTART,   /* the workers were stopped and started again */
    GL_ROUND_WARM = RDZV_STORY_WARM,         /* workers started before it took it (warm join) */
    GL_ROUND_KINDS = RDZV_STORY_KINDS
};
const char *gl_story_kind_name(enum gl_story_kind kind);

/* Each story as it is said (the launcher sends it to the rendezvous). */
typedef void (*gl_story_sink)(const rdzv_story *story);
/* Watches the slots of nproc workers on loop; sink may be NULL. */
void gl_story_init(uv_loop_t *loop, int nproc, gl_story_sink sink);
/* The round this node ran ended: the newest step its workers reached is kept. */
void gl_story_ended(uint32_t round);
/* Why the next round restarts the workers, and its category (the metrics'
 * and the rendezvous's reason label); the first reason said since the
 * round's end is kept. */
void gl_story_restart_why(const char *why, enum rdzv_restart_cause cause);
/* The local workers run in `round` now, begun as kind (GL_ROUND_RESTART for
 * workers started for it is said GL_ROUND_FIRST when no round ended before):
 * its first step is watched for, then the line is said. Call after the
 * workers were started (their slots cleared) or took the round. handed_ns:
 * when the round was handed to the workers (gb_now_ns; 0: now): a warm
 * joiner's state lines since then are this round's, also those read before
 * its last worker's word that it took the round. */
void gl_story_began(uint32_t round, enum gl_story_kind kind, uint64_t handed_ns);
/* The Prometheus text (job label value already escaped) appended at p; its length. */
size_t gl_story_metrics(char *p, size_t cap, const char *job);
#endif
