/* The collective waits of this node's workers, told to the rendezvous
 * (docs/protocol.md, "Suspicion and probes"): when every running local worker
 * has waited inside one collective for longer than this node's collectives
 * take (GL_WAITS_FACTOR x their mean, at least GL_WAITS_MIN_MS), the wait is
 * said at once, and its end too; the server then probes the nodes the job
 * waits for instead of waiting for their heartbeat timeout. Read from the
 * progress channel (base/gb_progress.h: coll_since_ns, wait_ns, coll_ns,
 * colls) every GL_WAITS_TICK_MS. */
#ifndef GPULAUNCH_GL_WAITS_H
#define GPULAUNCH_GL_WAITS_H

#include <stdint.h>
#include <uv.h>

#include "gl_workers.h"
#include "gpulaunch/rdzv.h"

#define GL_WAITS_TICK_MS 50 /* how often the slots are looked at */
#define GL_WAITS_MIN_MS 200 /* a wait shorter than this is never said ... */
#define GL_WAITS_FACTOR 4   /* ... nor one under this many times the mean collective */

/* Looks at g's workers every GL_WAITS_TICK_MS from now on and tells cli. */
void gl_waits_start(uv_loop_t *loop, rdzv_client *cli, const gl_group *g);
#endif
