/* What this node's workers' checkpoints are doing, as their runtimes report
 * it in the progress channel (base/gb_progress.h: ckpt_* fields): a log line
 * when a newer step is written or made durable, a drain in flight with its
 * progress, the --metrics text, and the note at a preemption's exit. */
#ifndef GPULAUNCH_GL_CKPTVIEW_H
#define GPULAUNCH_GL_CKPTVIEW_H

#include <stddef.h>
#include <uv.h>

#define GL_CKPTVIEW_TICK_MS 1000     /* how often the slots are looked at */
#define GL_CKPTVIEW_DRAIN_SAY_S 10.0 /* a drain in flight is said this often */

/* Looks at the slots of nproc workers every GL_CKPTVIEW_TICK_MS from now on. */
void gl_ckptview_start(uv_loop_t *loop, int nproc);
/* The Prometheus text (job label value already escaped) appended at p; its length. */
size_t gl_ckptview_metrics(char *p, size_t cap, const char *job);
/* At a preemption's exit: which step this node's workers made durable, or
 * the newest durable one when the deadline came first. */
void gl_ckptview_exit_note(void);

#endif
