/* Job health for the HTTP side: each job's rounds, timeline, step rate,
 * per-rank statistics, stragglers, last hang and checkpoints in /status, and
 * bounded per-job and per-rank gauges in /metrics (docs/health.md lists them). */
#include "rdzv_health_render.h"

#include <stdint.h>
#include <stdlib.h>

static void json_ms(sbuf *b, const char *key, uint32_t us) {
    if (us == UINT32_MAX)
        sb_printf(b, ",\"%s\":null", key);
    else
        sb_printf(b, ",\"%s\":%.3f", key, us / 1000.0);
}

static void json_step(sbuf *b, const char *key, int64_t step) {
    if (step < 0)
        sb_printf(b, "\"%s\":null", key);
    else
        sb_printf(b, "\"%s\":%lld", key, (long long)step);
}

/* A checkpoint summary's fields and the object's end:
 * "local_step":..,"durable_step":..,"stall_ms":..,"drain_bytes":..} */
static void json_ckpt(sbuf *b, int64_t local, int64_t durable, uint32_t stall_ms, uint64_t drain) {
    json_step(b, "local_step", local);
    sb_printf(b, ",");
    json_step(b, "durable_step", durable);
    sb_printf(b, ",\"stall_ms\":%u,\"drain_bytes\":%llu}", stall_ms, (unsigned long long)drain);
}

static const char *node_name(job *j, uint32_t node_rank) {
    rdzv_rmember *m = node_rank < j->r.nranks ? j->r.ranks[node_rank] : NULL;
    return m ? m->hostname : "";
}

void rdzv_health_render_member(job *j, rdzv_rmember *m, sbuf *b) {
    sb_printf(b, ",\"base_rank\":%u,\"ngpus\":%u,\"gpus\":[", m->base_rank, m->ngpus);
    const rdzv_health *h = j->health;
    if (h && h->ranks) {
        uint32_t shown = 0;
        for (uint32_t r = m->base_rank; r < m->base_rank + m->nproc && r < h->nranks; r++) {
            if (shown == 64)
                break; /* a node's ranks: 64 are enough to read its binding */
            sb_printf(b, "%s", shown ? "," : "");
            sb_json_str(b, h->ranks[r].updated_ms ? h->ranks[r].st.gpu : "");
            shown++;
        }
    }
    sb_printf(b, "]");
}

void rdzv_health_render_job_line(job *j, sbuf *b) {
    const rdzv_health *h = j->health;
    sb_printf(b, "{\"run_id\":");
    sb_json_str(b, j->r.run_id);
    sb_printf(b,
              ",\"state\":\"%s\",\"round\":%u,\"nodes\":%u,\"world\":%u,\"stragglers\":%u,"
              "\"hang\":%s}",
              rdzv_round_state_name(j->r.state), j->r.round, j->r.nactive, h ? h->world : 0,
              h ? h->nstragglers : 0, h && h->has_hang ? "true" : "false");
}

static void render_event(sbuf *b, const rdzv_tl_event *e) {
    sb_printf(b, "{\"unix_ms\":%llu,\"kind\":\"%s\",\"round\":%u,\"count\":%u,\"rank\":",
              (unsigned long long)e->unix_ms, rdzv_tl_kind_name(e->kind), e->round, e->count);
    if (e->rank >= 0)
        sb_printf(b, "%lld", (long long)e->rank);
    else
        sb_printf(b, "null");
    sb_printf(b, ",\"node\":");
    sb_json_str(b, e->node);
    sb_printf(b, ",\"text\":");
    sb_json_str(b, e->text);
    sb_printf(b, "}");
}

/* ,"restart_reasons":{"worker_failed":1,...}: the reasons restarts were said
 * for ("unknown": an older launcher's), those with a count only. */
static void render_reasons(sbuf *b, const uint64_t counts[RDZV_CAUSES]) {
    sb_printf(b, ",\"restart_reasons\":{");
    const char *sep = "";
    for (uint32_t c = 0; c < RDZV_CAUSES; c++) {
        if (counts[c] == 0)
            continue;
        sb_printf(b, "%s\"%s\":%llu", sep, rdzv_restart_cause_name(c),
                  (unsigned long long)counts[c]);
        sep = ",";
    }
    sb_printf(b, "}");
}

/* How a round began: ,"story":{...} (nodes by kind, the longest pause, the
 * rank-seconds paused, steps done again, the first restart's reason), or
 * nothing when no node said. */
static void render_story(sbuf *b, const rdzv_round_story *st) {
    uint32_t said = 0;
    for (int k = 0; k < RDZV_STORY_KINDS; k++)
        said += st->nodes[k];
    if (said == 0)
        return;
    sb_printf(b,
              ",\"story\":{\"first\":%u,\"in_place\":%u,\"restart\":%u,\"warm_join\":%u,"
              "\"pause_max_s\":%.3f,\"rank_seconds_paused\":%.3f,\"steps_redone\":%u,"
              "\"bytes_from_peers\":%llu,\"bytes_from_checkpoint\":%llu,\"checkpoint_step\":%lld,"
              "\"why\":",
              st->nodes[RDZV_STORY_FIRST], st->nodes[RDZV_STORY_IN_PLACE],
              st->nodes[RDZV_STORY_RESTART], st->nodes[RDZV_STORY_WARM], st->pause_max_ms / 1000.0,
              st->pause_rank_ms / 1000.0, st->redone, (unsigned long long)st->peer_bytes,
              (unsigned long long)st->ckpt_bytes, (long long)st->ckpt_step);
    sb_json_str(b, st->why);
    uint64_t reasons[RDZV_CAUSES];
    for (uint32_t c = 0; c < RDZV_CAUSES; c++)
        reasons[c] = st->restarts[c];
    render_reasons(b, reasons);
    sb_printf(b, ",\"nodes\":[");
    for (uint32_t i = 0; i < st->each_n; i++) {
        const rdzv_node_story *n = &st->each[i];
        sb_printf(b, "%s{\"node\":", i ? "," : "");
        sb_json_str(b, n->node);
        /* a first start's or warm join's time is from the round's start to
         * its first step, not a pause */
        int start = n->kind == RDZV_STORY_FIRST || n->kind == RDZV_STORY_WARM;
        sb_printf(b, ",\"kind\":\"%s\",\"%s\":", rdzv_story_kind_name(n->kind),
                  start ? "first_step_s" : "pause_s");
        if (n->pause_ms == RDZV_STORY_UNKNOWN)
            sb_printf(b, "null");
        else
            sb_printf(b, "%.3f", n->pause_ms / 1000.0);
        sb_printf(b, ",\"steps_redone\":%u,\"ranks\":%u", n->redone, n->nproc);
        if (n->kind == RDZV_STORY_RESTART)
            sb_printf(b, ",\"reason\":\"%s\"", rdzv_restart_cause_name(n->cause));
        if (n->source != RDZV_STATE_NONE)
            sb_printf(b,
                      ",\"state\":\"%s\",\"state_step\":%lld,\"state_bytes\":%llu,"
                      "\"state_ms\":%u",
                      n->source == RDZV_STATE_PEER ? "peer" : "checkpoint",
                      (long long)n->state_step, (unsigned long long)n->state_bytes, n->state_ms);
        if (n->source == RDZV_STATE_PEER && n->state_root >= 0)
            sb_printf(b, ",\"state_root\":%d", n->state_root);
        sb_printf(b, "}");
    }
    sb_printf(b, "],\"nodes_more\":%u}", st->each_more);
}

void rdzv_health_render_job(job *j, sbuf *b, uint64_t now_ms) {
    const rdzv_health *h = j->health;
    if (h == NULL)
        return;
    sb_printf(b, ",\"rounds\":[");
    for (uint32_t i = 0; i < h->rounds_n; i++) {
        const rdzv_round_rec *r = rdzv_health_round(h, i);
        sb_printf(b,
                  "%s{\"round\":%u,\"nnodes\":%u,\"world\":%u,\"start_unix_ms\":%llu,"
                  "\"end_unix_ms\":%llu,\"end\":",
                  i ? "," : "", r->round, r->nnodes, r->world, (unsigned long long)r->start_unix_ms,
                  (unsigned long long)r->end_unix_ms);
        sb_json_str(b, r->end);
        render_story(b, &r->story);
        sb_printf(b, "}");
    }
    const rdzv_health_cost *c = &h->cost;
    sb_printf(b,
              "],\"membership_cost\":{\"first\":%llu,\"in_place\":%llu,\"restart\":%llu,"
              "\"warm_join\":%llu,\"rank_seconds_paused\":%.3f,\"steps_redone\":%llu,"
              "\"bytes_from_peers\":%llu,\"bytes_from_checkpoints\":%llu",
              (unsigned long long)c->nodes[RDZV_STORY_FIRST],
              (unsigned long long)c->nodes[RDZV_STORY_IN_PLACE],
              (unsigned long long)c->nodes[RDZV_STORY_RESTART],
              (unsigned long long)c->nodes[RDZV_STORY_WARM], c->pause_rank_ms / 1000.0,
              (unsigned long long)c->redone, (unsigned long long)c->peer_bytes,
              (unsigned long long)c->ckpt_bytes);
    render_reasons(b, c->restarts);
    sb_printf(b, "}");
    sb_printf(b, ",\"events_total\":%llu,\"events\":[", (unsigned long long)h->events_total);
    for (uint32_t i = 0; i < h->ev_n; i++) {
        sb_printf(b, "%s", i ? "," : "");
        render_event(b, rdzv_health_event(h, i));
    }
    sb_printf(b,
              "],\"health\":{\"threshold\":%.3f,\"windows\":%u,\"round\":%u,\"world\":%u,"
              "\"reported\":%u,\"steps_per_s\":%.3f",
              h->threshold, h->windows, h->round, h->world, h->reported, (double)h->steps_per_s);
    json_ms(b, "median_step_ms", h->median_step_us);
    json_ms(b, "median_busy_ms", h->median_busy_us);
    json_ms(b, "median_wait_ms", h->median_wait_us);
    sb_printf(b,
              ",\"stats_messages\":%llu,\"stats_dropped\":%llu,\"hangs_total\":%llu,"
              "\"stragglers_total\":%llu,\"hang\":",
              (unsigned long long)h->stats_msgs, (unsigned long long)h->stats_dropped,
              (unsigned long long)h->hangs_total, (unsigned long long)h->stragglers_total);
    if (h->has_hang)
        render_event(b, &h->hang);
    else
        sb_printf(b, "null");
    sb_printf(b, ",\"stragglers\":[");
    uint32_t ns = 0;
    for (uint32_t i = 0; h->ranks && i < h->nranks && ns < RDZV_STATUS_MAX_RANKS; i++)
        if (h->ranks[i].straggler)
            sb_printf(b, "%s%u", ns++ ? "," : "", i);
    sb_printf(b, "],\"rate\":[");
    for (uint32_t i = 0; i < h->rate_n; i++) {
        const rdzv_rate_sample *r = rdzv_health_rate(h, i);
        sb_printf(b, "%s[%llu,%.3f,%u]", i ? "," : "", (unsigned long long)r->unix_ms,
                  (double)r->steps_per_s, r->round);
    }
    uint32_t top[RDZV_STATUS_MAX_RANKS];
    uint32_t n = rdzv_health_top(h, top, RDZV_STATUS_MAX_RANKS);
    sb_printf(b, "],\"ranks_shown\":%u,\"ranks\":[", n);
    for (uint32_t k = 0; k < n; k++) {
        const rdzv_rank_health *r = &h->ranks[top[k]];
        sb_printf(b, "%s{\"rank\":%u,\"local_rank\":%u,\"node_rank\":%u,\"node\":", k ? "," : "",
                  top[k], r->st.local_rank, r->node_rank);
        sb_json_str(b, node_name(j, r->node_rank));
        sb_printf(b, ",\"gpu\":");
        sb_json_str(b, r->st.gpu);
        sb_printf(b, ",\"step\":%llu,\"steps\":%u,\"window_ms\":%u", (unsigned long long)r->st.step,
                  r->st.steps, r->window_ms);
        json_ms(b, "step_ms", r->st.step_time_us);
        json_ms(b, "wait_ms", r->st.wait_us);
        json_ms(b, "busy_ms", r->busy_us);
        sb_printf(b,
                  ",\"ratio\":%.3f,\"since_progress_ms\":%u,\"report_age_ms\":%llu,"
                  "\"straggler\":%s,\"checkpoint\":",
                  (double)r->ratio, r->st.since_progress_ms,
                  (unsigned long long)(now_ms - r->updated_ms), r->straggler ? "true" : "false");
        if (rdzv_health_rank_has_ckpt(r)) {
            sb_printf(b, "{");
            json_ckpt(b, r->st.ckpt_local_step, r->st.ckpt_durable_step, r->st.ckpt_stall_ms,
                      r->st.ckpt_drain_left);
        } else {
            sb_printf(b, "null");
        }
        sb_printf(b, "}");
    }
    sb_printf(b, "]}");
    /* the job's checkpoints: null while no rank has reported one */
    const rdzv_health_ckpt *k = rdzv_health_checkpoint(j->health);
    sb_printf(b, ",\"checkpoint\":");
    if (k->ranks == 0) {
        sb_printf(b, "null");
        return;
    }
    sb_printf(b, "{\"ranks\":%u,", k->ranks);
    json_ckpt(b, k->local_step, k->durable_step, k->stall_ms, k->drain_left);
}

static void rank_series(sbuf *b, const char *metric, job *j, const rdzv_rank_health *r,
                        uint32_t rank, double v) {
    sb_printf(b, "%s{job=", metric);
    sb_label(b, j->r.run_id);
    sb_printf(b, ",node=");
    sb_label(b, node_name(j, r->node_rank));
    sb_printf(b, ",rank=\"%u\"} %.6g\n", rank, v);
}

static void job_series(sbuf *b, const char *metric, job *j, double v) {
    sb_printf(b, "%s{job=", metric);
    sb_label(b, j->r.run_id);
    sb_printf(b, "} %.6g\n", v);
}

void rdzv_health_render_metrics(rdzv_server *s, sbuf *b) {
    static const struct {
        const char *name, *type, *help;
    } jm[] = {
        {"gpulaunch_job_steps_per_second", "gauge", "The job's median step rate."},
        {"gpulaunch_job_step_time_seconds", "gauge", "The job's median step time."},
        {"gpulaunch_job_stragglers", "gauge", "Ranks named stragglers now."},
        {"gpulaunch_job_stragglers_total", "counter", "Ranks named stragglers so far."},
        {"gpulaunch_job_hangs_total", "counter", "Ranks reported hung by their launcher."},
        {"gpulaunch_job_rank_stats_total", "counter", "Per-rank summaries received."},
    };
    job *j;
    for (size_t k = 0; k < sizeof jm / sizeof jm[0]; k++) {
        sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", jm[k].name, jm[k].help, jm[k].name,
                  jm[k].type);
        LIST_FOREACH(j, &s->jobs, link) {
            const rdzv_health *h = j->health;
            if (h == NULL)
                continue;
            double v = k == 0   ? h->steps_per_s
                       : k == 1 ? h->median_step_us / 1e6
                       : k == 2 ? h->nstragglers
                       : k == 3 ? (double)h->stragglers_total
                       : k == 4 ? (double)h->hangs_total
                                : (double)h->stats_ranks;
            job_series(b, jm[k].name, j, v);
        }
    }
    /* The job's checkpoints, for jobs whose ranks reported one; integers
     * printed whole (a step or a byte count is past %g's digits). */
    static const struct {
        const char *name, *help;
    } cm[] = {
        {"gpulaunch_job_checkpoint_local_step",
         "Newest step every rank wrote to its local tier (-1: none yet)."},
        {"gpulaunch_job_checkpoint_durable_step",
         "Newest step every rank's files are durable (-1: none yet)."},
        {"gpulaunch_job_checkpoint_stall_seconds",
         "The longest time a rank's last save stopped training."},
        {"gpulaunch_job_checkpoint_drain_bytes",
         "Bytes the ranks' drains to the durable tier still copy."},
    };
    for (size_t k = 0; k < sizeof cm / sizeof cm[0]; k++) {
        sb_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", cm[k].name, cm[k].help, cm[k].name);
        LIST_FOREACH(j, &s->jobs, link) {
            const rdzv_health_ckpt *c = rdzv_health_checkpoint(j->health);
            if (c->ranks == 0)
                continue;
            sb_printf(b, "%s{job=", cm[k].name);
            sb_label(b, j->r.run_id);
            if (k == 0 || k == 1)
                sb_printf(b, "} %lld\n", (long long)(k == 0 ? c->local_step : c->durable_step));
            else if (k == 2)
                sb_printf(b, "} %.3f\n", c->stall_ms / 1e3);
            else
                sb_printf(b, "} %llu\n", (unsigned long long)c->drain_left);
        }
    }
    /* What membership changes cost each job (its nodes' STORY messages). */
    sb_printf(b, "# HELP gpulaunch_job_node_rounds_total Rounds the job's nodes began, by how "
                 "(first, in_place, restart, warm_join).\n"
                 "# TYPE gpulaunch_job_node_rounds_total counter\n");
    LIST_FOREACH(j, &s->jobs, link) {
        if (j->health == NULL)
            continue;
        for (uint32_t k = 0; k < RDZV_STORY_KINDS; k++) {
            sb_printf(b, "gpulaunch_job_node_rounds_total{job=");
            sb_label(b, j->r.run_id);
            sb_printf(b, ",kind=\"%s\"} %llu\n", rdzv_story_kind_name(k),
                      (unsigned long long)j->health->cost.nodes[k]);
        }
    }
    sb_printf(b, "# HELP gpulaunch_job_round_pause_seconds A node's pause from a round's end to "
                 "its first step in the next.\n"
                 "# TYPE gpulaunch_job_round_pause_seconds histogram\n");
    LIST_FOREACH(j, &s->jobs, link) {
        if (j->health == NULL)
            continue;
        const rdzv_health_cost *c = &j->health->cost;
        uint64_t cum = 0;
        for (int k = 0; k < RDZV_HEALTH_PAUSE_BUCKETS; k++) {
            cum += c->pause_bucket[k];
            sb_printf(b, "gpulaunch_job_round_pause_seconds_bucket{job=");
            sb_label(b, j->r.run_id);
            if (k < RDZV_HEALTH_PAUSE_BUCKETS - 1)
                sb_printf(b, ",le=\"%g\"} %llu\n", rdzv_health_pause_le[k],
                          (unsigned long long)cum);
            else
                sb_printf(b, ",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
        }
        sb_printf(b, "gpulaunch_job_round_pause_seconds_sum{job=");
        sb_label(b, j->r.run_id);
        sb_printf(b, "} %.3f\ngpulaunch_job_round_pause_seconds_count{job=", c->pause_sum_s);
        sb_label(b, j->r.run_id);
        sb_printf(b, "} %llu\n", (unsigned long long)c->pauses);
    }
    static const struct {
        const char *name, *help;
    } sm[] = {
        {"gpulaunch_job_paused_rank_seconds_total",
         "Rank-seconds (GPU-seconds with a GPU a rank) the job's ranks paused in round changes."},
        {"gpulaunch_job_steps_redone_total", "Steps the job did again after round changes."},
    };
    for (size_t k = 0; k < sizeof sm / sizeof sm[0]; k++) {
        sb_printf(b, "# HELP %s %s\n# TYPE %s counter\n", sm[k].name, sm[k].help, sm[k].name);
        LIST_FOREACH(j, &s->jobs, link) {
            if (j->health == NULL)
                continue;
            const rdzv_health_cost *c = &j->health->cost;
            job_series(b, sm[k].name, j, k == 0 ? c->pause_rank_ms / 1000.0 : (double)c->redone);
        }
    }
    sb_printf(b, "# HELP gpulaunch_job_restarts_total Round changes the job's nodes took by a "
                 "restart instead of in place, by reason (unknown: not said).\n"
                 "# TYPE gpulaunch_job_restarts_total counter\n");
    LIST_FOREACH(j, &s->jobs, link) {
        if (j->health == NULL)
            continue;
        for (uint32_t c = 0; c < RDZV_CAUSES; c++) {
            sb_printf(b, "gpulaunch_job_restarts_total{job=");
            sb_label(b, j->r.run_id);
            sb_printf(b, ",reason=\"%s\"} %llu\n", rdzv_restart_cause_name(c),
                      (unsigned long long)j->health->cost.restarts[c]);
        }
    }
    sb_printf(b, "# HELP gpulaunch_job_state_bytes_total Bytes of state new ranks took after "
                 "round changes, by source (peer: copied from a peer rank; checkpoint: read).\n"
                 "# TYPE gpulaunch_job_state_bytes_total counter\n");
    LIST_FOREACH(j, &s->jobs, link) {
        if (j->health == NULL)
            continue;
        for (int k = 0; k < 2; k++) {
            sb_printf(b, "gpulaunch_job_state_bytes_total{job=");
            sb_label(b, j->r.run_id);
            sb_printf(
                b, ",source=\"%s\"} %llu\n", k ? "checkpoint" : "peer",
                (unsigned long long)(k ? j->health->cost.ckpt_bytes : j->health->cost.peer_bytes));
        }
    }
    /* Per-rank series: at most RDZV_METRICS_RANKS per job and metric, the
     * named stragglers first, then the ranks with the highest busy time. */
    static const struct {
        const char *name, *help;
    } rm[] = {
        {"gpulaunch_rank_step_time_seconds", "Mean step time of the rank's last window."},
        {"gpulaunch_rank_wait_seconds",
         "Mean time per step the rank waited for the last rank at collectives (when known)."},
        {"gpulaunch_rank_busy_seconds", "Step time less that wait: what the straggler rule uses."},
        {"gpulaunch_rank_straggler", "1 while the rank is named a straggler."},
    };
    uint32_t top[RDZV_METRICS_RANKS];
    for (size_t k = 0; k < sizeof rm / sizeof rm[0]; k++) {
        sb_printf(b, "# HELP %s %s (top %d ranks per job)\n# TYPE %s gauge\n", rm[k].name,
                  rm[k].help, RDZV_METRICS_RANKS, rm[k].name);
        LIST_FOREACH(j, &s->jobs, link) {
            const rdzv_health *h = j->health;
            uint32_t n = rdzv_health_top(h, top, RDZV_METRICS_RANKS);
            for (uint32_t i = 0; i < n; i++) {
                const rdzv_rank_health *r = &h->ranks[top[i]];
                if (k == 1 && r->st.wait_us == UINT32_MAX)
                    continue;
                double v = k == 0   ? r->st.step_time_us / 1e6
                           : k == 1 ? r->st.wait_us / 1e6
                           : k == 2 ? r->busy_us / 1e6
                                    : (double)r->straggler;
                rank_series(b, rm[k].name, j, r, top[i], v);
            }
        }
    }
}
