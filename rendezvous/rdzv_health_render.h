/* Job health in /status (JSON) and /metrics (Prometheus text): rendering of
 * rdzv_health.h's state for the HTTP side. */
#ifndef GPULAUNCH_RDZV_HEALTH_RENDER_H
#define GPULAUNCH_RDZV_HEALTH_RENDER_H

#include <stddef.h>
#include <stdint.h>

#include "rdzv_sbuf.h"
#include "rdzv_server_int.h"

#define RDZV_STATUS_MAX_RANKS 512 /* per-rank entries of one job in /status */
#define RDZV_METRICS_RANKS 16     /* per-rank series of one job in /metrics, per metric */

/* The job page (rdzv_page.html), embedded at build time. */
extern const char rdzv_page_html[];
extern const size_t rdzv_page_html_len;

/* Appends the job's health fields (",\"rounds\":...,\"health\":{...},\"checkpoint\":...")
 * to its object. */
void rdzv_health_render_job(job *j, sbuf *b, uint64_t now_ms);
/* Appends a one-line object for the job list: run id, state, round, nodes,
 * ranks, stragglers, hangs. */
void rdzv_health_render_job_line(job *j, sbuf *b);
/* Appends a member's health fields (base rank, GPU bindings of its ranks). */
void rdzv_health_render_member(job *j, rdzv_rmember *m, sbuf *b);
/* Appends the per-job and per-rank health metrics. */
void rdzv_health_render_metrics(rdzv_server *s, sbuf *b);

#endif
