/* The running GPU monitor: each GPU the workers hold sampled every
 * --gpu-monitor-interval (utilisation, memory, temperature, power, clock
 * slowdowns), the idle alert (--gpu-idle-alert), XID events named with the
 * worker on that GPU, the launcher's Prometheus endpoint (--metrics) and
 * dcgm-exporter's job-mapping files (--dcgm-job-mapping-dir). One thread makes
 * every NVML call (samples and XID waits) and hands the results to the loop
 * through uv_async, so a hung driver never stalls the loop. Nothing runs
 * without NVML or without GPUs, except an endpoint that was asked for. */
#ifndef GPULAUNCH_GL_GPUMON_H
#define GPULAUNCH_GL_GPUMON_H

#include <stddef.h>
#include <stdio.h>
#include <uv.h>

#include "gl_options.h"
#include "gl_workers.h"

#define GL_GPUMON_XID_MAX 64 /* XIDs kept for the report and /metrics */
#define GL_XID_LINES_MAX 10  /* XID lines printed per GPU; the rest are counted */
#define GL_XID_WAIT_MS 500   /* the longest NVML event wait; the thread's exit check */

/* A GPU notice for the job's timeline (the idle alert, its end, an XID). */
typedef void (*gl_gpumon_event_cb)(void *data, const char *text);

/* Starts what cfg asks for (after preflight, before the rendezvous): the
 * endpoint, the job-mapping files, the XID thread. The workers on the GPUs
 * are read from group; notices go to on_event. cfg and group must outlive
 * the monitor. 0, or 2 with err (a --metrics address that cannot be bound: a
 * usage error). */
int gl_gpumon_start(uv_loop_t *loop, const gl_config *cfg, const char *job, const gl_group *group,
                    gl_gpumon_event_cb on_event, void *data, char *err, size_t errlen);
/* After each spawn: the workers now on the GPUs; starts the sampler. */
void gl_gpumon_round(void);
/* The failure report's GPU lines ("" when none) and its JSON array. */
void gl_gpumon_report(FILE *out);
void gl_gpumon_json(FILE *out);
/* Removes the job-mapping files (also run at exit). */
void gl_gpumon_stop(void);

#endif
