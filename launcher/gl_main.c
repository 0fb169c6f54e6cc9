/* gpulaunch: options -> preflight -> rendezvous -> spawn -> supervise ->
 * report, on one libuv loop. This file owns the flow and the launcher's state
 * (L): the options, preflight, the rendezvous callbacks, the round's flags,
 * the first failure, the restart decision, signals to the launcher,
 * preemption, the failure report and main(). The worker group (environment,
 * spawn, signals, reaping, output: gl_workers.c, gl_output.c) and the hang
 * watchdog (gl_watchdog.c) own their state and report here through the
 * callbacks this file gives them; they never call into it. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "gb_log.h"
#include "gb_time.h"
#include "gl_ckptview.h"
#include "gl_story.h"
#include "gl_endpoint.h"
#include "gl_errfile.h"
#include "gl_report.h"
#include "gl_gpumon.h"
#include "gl_hold.h"
#include "gl_numa.h"
#include "gl_options.h"
#include "gl_output.h"
#include "gl_preflight.h"
#include "gl_progress.h"
#include "gl_rdzvhost.h"
#include "gl_reform.h"
#include "gl_notice.h"
#include "gl_warm.h"
#include "gl_watchdog.h"
#include "gl_waits.h"
#include "gl_workers.h"
#include "gpulaunch/rdzv.h"

#define GB_COMPONENT "launcher"

#define GL_EXIT_USAGE 2
#define GL_EXIT_PREFLIGHT 3
#define GL_DONE_WAIT_MS 60000 /* wait for the rest of the job after local success */
#define GL_PEER_LOSS_S 2.0    /* a local failure this soon before a node's loss is its effect */

static struct launcher {
    gl_config cfg;
    uv_loop_t *loop;
    gl_rdzvhost rh; /* the job's rendezvous: run id, where, hosted here or not */
    rdzv_client *cli;
    rdzv_assignment a;
    int restarts;
    int group_failed;   /* a local worker failed this round */
    int round_over;     /* the rendezvous ended the round */
    int round_hung;     /* ... because a rank hung (exit 201 when no restarts are left) */
    int scale_up;       /* ... to take in waiting nodes: not a failure */
    int assigned;       /* holds an assignment of the current round */
    int exit_requested; /* a signal to us: exit once workers are gone */
    int exit_code;
    int done_sent;
    uv_timer_t done_timer;
    char hostname[256], instance[64];
    char nccl_ifname[64]; /* chosen NCCL_SOCKET_IFNAME, "" when left alone */
    char *token;
    size_t token_len;
    gl_failure first; /* the job's root cause on this node, kept across restarts */
    uint64_t t_start_ns;
    uint64_t t_join_ns; /* this node's last JOIN: the banner's rendezvous time */
} L;

static gl_group G;     /* the local workers */
static gl_watchdog WD; /* --progress-timeout */
static gl_reform R;    /* live re-formation of workers that can */
static gl_hold H;      /* a preemption's stop, held while the workers start */
static gl_warm W;      /* what the workers can do, told to the rendezvous; warm joins */

/* ---- the failure report and the restart decision ---- */

/* The first failure's error file (TORCHELASTIC_ERROR_FILE), read when it
 * failed: the next round's workers start without theirs. */
static gl_errfile first_ef;
static char first_ef_path[PATH_MAX];

static void report_failure(void) {
    if (L.first.set)
        gl_report_failure(&L.first, first_ef_path[0] ? &first_ef : NULL, first_ef_path, L.hostname,
                          L.a.node_rank, L.cfg.val[GL_LOG_DIR]);
}

static void finish(int code) {
    L.exit_code = code;
    if (code == 128 + SIGTERM)
        gl_ckptview_exit_note(); /* which step is durable, or the newest that is */
    if (code != 0)
        report_failure();
    fflush(stdout);
    fflush(stderr);
    exit(code);
}

static void on_done_timeout(uv_timer_t *t);

/* Everything local is gone (the group also ended its stop): decide between
 * done, restart and exit. Called whenever a worker exits or its pipes close. */
static void maybe_finish_round(void) {
    if (!gl_group_idle(&G))
        return;
    if (L.exit_requested)
        finish(L.exit_code);
    if (gl_warm_phase(&W) != GL_WARM_NONE)
        return; /* a warm join's given-up workers are gone: the round takes the node in */
    if (!L.group_failed && !L.round_over) {
        /* local success: wait (bounded) for the rest of the job */
        if (!L.done_sent) {
            L.done_sent = 1;
            rdzv_client_done(L.cli);
            uv_timer_start(&L.done_timer, on_done_timeout, GL_DONE_WAIT_MS, 0);
        }
        return;
    }
    /* A membership change (the round ended to take in waiting nodes) is not
     * a failure: like torchelastic, it does not use up --max-restarts. */
    if (L.scale_up && !L.group_failed) {
        fprintf(stderr, "gpulaunch: re-rendezvous to take in waiting nodes (not counted as a "
                        "restart)\n");
        L.round_over = L.scale_up = 0;
        L.t_join_ns = gb_now_ns();
        rdzv_client_rejoin(L.cli);
        return;
    }
    if (L.restarts >= L.cfg.max_restarts) {
        if (L.first.set) {
            if (L.first.hung)
                finish(GL_EXIT_HUNG);
            if (L.first.peer_lost) {
                fprintf(stderr,
                        "gpulaunch: rank %d failed as another node (or the rendezvous' host) went "
                        "away, and no restarts are left (--max-restarts %d): exit %d, retryable\n",
                        L.first.rank, L.cfg.max_restarts, GL_EXIT_RDZV);
                finish(GL_EXIT_RDZV);
            }
            if (L.first.signal)
                finish(128 + L.first.signal);
            finish(L.first.exit_code > 0 && L.first.exit_code < 128 ? (int)L.first.exit_code : 1);
        }
        fprintf(stderr, "gpulaunch: the round ended and no restarts are left (--max-restarts %d)\n",
                L.cfg.max_restarts);
        finish(L.round_hung ? GL_EXIT_HUNG : GL_EXIT_RDZV);
    }
    L.restarts++;
    GB_WARN("restarting the worker group (restart %d of %d)", L.restarts, L.cfg.max_restarts);
    fprintf(stderr, "gpulaunch: restarting workers (%d/%d)\n", L.restarts, L.cfg.max_restarts);
    L.group_failed = L.round_over = L.scale_up = 0;
    L.t_join_ns = gb_now_ns();
    rdzv_client_rejoin(L.cli);
}

static void on_done_timeout(uv_timer_t *t) {
    if (L.rh.srv) { /* the others' rendezvous lives in this process: it stays until JOB_DONE */
        static int said;
        if (!said++)
            fprintf(stderr,
                    "gpulaunch: local workers finished; this launcher hosts the rendezvous, so it "
                    "waits for the other nodes to finish\n");
        uv_timer_start(t, on_done_timeout, GL_DONE_WAIT_MS, 0);
        return;
    }
    fprintf(stderr, "gpulaunch: local workers finished; other nodes did not finish within %d s\n",
            GL_DONE_WAIT_MS / 1000);
    finish(0);
}

/* ---- the worker group's and the watchdog's reports ---- */

/* A re-formation that cannot finish (a kept worker exited, or did not take
 * the round in time): today's restart. The workers are told, then stopped; a
 * round this node already holds ends for everyone, which re-forms it again. */
static void reform_fall_back(const char *why) {
    fprintf(stderr, "gpulaunch: re-forming in place failed: %s; restarting the local workers\n",
            why);
    GB_WARN("re-formation failed: %s; restarting the local workers", why);
    /* the round it was taking ends; unless its workers began one since the
     * last end, the change is still that end's (gl_story_ended) */
    if (L.assigned)
        gl_story_ended(L.a.round);
    char told[GL_STORY_WHY_MAX];
    snprintf(told, sizeof told, "re-forming in place failed: %s", why);
    gl_story_restart_why(told, RDZV_CAUSE_REFORM_FAILED);
    gl_reform_abort(&R, why);
    L.group_failed = 1;
    L.round_over = 0;
    if (L.assigned) {
        L.assigned = 0;
        rdzv_client_fail(L.cli, why);
    }
    gl_group_stop(&G, 0);
}

static void on_reform_failed(gl_reform *r, const char *why) { reform_fall_back(why); }

static void on_reform_taken(gl_reform *r, uint32_t round, double told_ms, double taken_ms) {
    L.round_over = 0;
    gl_group_ranks(&G, L.a.base_rank);
    if (r->first)
        fprintf(stderr,
                "gpulaunch: round %u: the %d workers started before it took it (%.1f ms after "
                "they were started, %.1f ms after it was handed over)\n",
                round, L.cfg.nproc, told_ms, taken_ms);
    else
        fprintf(stderr,
                "gpulaunch: round %u: %d workers re-formed in place (%.1f ms after the last "
                "round ended, %.1f ms after this one was handed over)\n",
                round, L.cfg.nproc, told_ms, taken_ms);
    gl_watchdog_round(&WD);
    gl_story_began(round, r->first ? GL_ROUND_WARM : GL_ROUND_IN_PLACE, r->handed_ns);
}

/* How the round began here, to the rendezvous (its job page and /metrics). */
static void send_story(const rdzv_story *story) {
    if (L.cli)
        rdzv_client_story(L.cli, story);
}

static void on_worker_exit(gl_group *g, worker *w, int64_t status, int sig) {
    int failed = status != 0 || sig != 0;
    if (gl_warm_phase(&W) != GL_WARM_NONE && !L.assigned && !g->stopping) {
        char why[160];
        snprintf(why, sizeof why, "local rank %d %s before it had a round", w->local_rank,
                 failed ? "failed" : "exited");
        gl_warm_give_up(&W, why);
        maybe_finish_round();
        return;
    }
    if (gl_reform_state(&R) != GL_REFORM_NONE && !g->stopping) {
        char why[160];
        snprintf(why, sizeof why, "rank %d (local rank %d) %s while re-forming", w->rank,
                 w->local_rank, failed ? "failed" : "exited");
        reform_fall_back(why);
        maybe_finish_round();
        return;
    }
    /* while the watchdog has hung ranks print their stacks, the hang is the
     * failure (on_hang reports it): not a rank that ends meanwhile */
    if (failed && !g->stopping && !L.exit_requested && !L.round_over && !gl_watchdog_dumping(&WD)) {
        if (!L.first.set) {
            gl_failure *f = &L.first;
            f->set = 1;
            f->when = gb_wall_s();
            f->rank = w->rank;
            f->local_rank = w->local_rank;
            f->pid = w->pid;
            f->exit_code = status;
            f->signal = sig;
            /* the rendezvous' connection already gone: its host (static mode:
             * node rank 0) went away, and with it this worker's peers */
            f->peer_lost = L.cli != NULL && !rdzv_client_connected(L.cli);
            gl_output_tail(w, f->tail, sizeof f->tail);
            char path[PATH_MAX];
            gl_group_error_file(g, w, path, sizeof path);
            if (gl_errfile_read(path, &first_ef) == 0)
                snprintf(first_ef_path, sizeof first_ef_path, "%s", path);
        }
        L.group_failed = 1;
        char msg[256];
        if (sig)
            snprintf(msg, sizeof msg, "rank %d (local rank %d) killed by %s", w->rank,
                     w->local_rank, gl_signame(sig));
        else
            snprintf(msg, sizeof msg, "rank %d (local rank %d) exited with code %lld", w->rank,
                     w->local_rank, (long long)status);
        GB_ERROR("%s: stopping the local workers", msg);
        if (L.assigned)
            gl_story_ended(L.a.round);
        gl_story_restart_why(msg, RDZV_CAUSE_WORKER_FAILED);
        gl_group_stop(g, GL_DISCARD_GRACE_MS);
        rdzv_client_fail(L.cli, msg);
    }
    maybe_finish_round();
}

static void on_spawn_error(gl_group *g, worker *w, int err) {
    if (!L.first.set) {
        L.first.set = 1;
        L.first.when = gb_wall_s();
        L.first.rank = w->rank;
        L.first.local_rank = w->local_rank;
        L.first.exit_code = 127;
        snprintf(L.first.tail, sizeof L.first.tail, "    cannot start %s: %s\n", L.cfg.prog_argv[0],
                 strerror(err));
    }
    L.group_failed = 1;
}

static void on_pipe_closed(gl_group *g, worker *w) { maybe_finish_round(); }

/* The group knows its own stop; the rest of a round's end is ours. */
static int round_ending(gl_watchdog *wd) {
    return L.round_over || L.exit_requested || L.group_failed;
}

/* The whole job restarts its workers through the rendezvous; a round that
 * already ends (the rendezvous, a failure, a preemption) only loses the hung
 * ranks. The rendezvous hears of the hang before they are killed. */
static void on_hang(gl_watchdog *wd, const worker *cw, const char *detail) {
    if (G.stopping || L.round_over || L.exit_requested) {
        gl_watchdog_kill_hung(wd);
        return;
    }
    if (!L.first.set) {
        gl_failure *f = &L.first;
        f->set = 1;
        f->hung = 1;
        f->when = gb_wall_s();
        f->rank = cw->rank;
        f->local_rank = cw->local_rank;
        f->pid = cw->pid;
        f->exit_code = -1;
        snprintf(f->why, sizeof f->why, "%s", detail);
        gl_output_tail(cw, f->tail, sizeof f->tail);
    }
    L.group_failed = 1;
    if (L.assigned)
        gl_story_ended(L.a.round);
    char why[GL_STORY_WHY_MAX];
    snprintf(why, sizeof why, "rank %d (local rank %d) hung: %s", cw->rank, cw->local_rank, detail);
    gl_story_restart_why(why, RDZV_CAUSE_HANG);
    rdzv_client_hang(L.cli, (uint32_t)cw->rank, detail);
    gl_watchdog_kill_hung(wd); /* the others stop as after a failure */
    gl_group_stop(&G, 0);
}

static int stats_due(void *data) {
    return G.w != NULL && G.nrunning > 0 && !G.stopping && L.cli != NULL;
}

static void send_stats(void *data, uint32_t window_ms, const rdzv_rank_stats *rs, uint32_t n) {
    rdzv_client_stats(L.cli, window_ms, rs, n);
}

static void on_gpu_event(void *data, const char *text) {
    if (L.cli)
        rdzv_client_event(L.cli, RDZV_EVENT_GPU, 0, text);
}

/* ---- rendezvous callbacks ---- */

/* Several candidate interfaces and no NCCL_SOCKET_IFNAME: NCCL may pick one
 * that cannot reach the other nodes and hang (pytorch/pytorch#64926). Pin it
 * to the interface that routes to the master. */
static void choose_ifname(const char *master) {
    L.nccl_ifname[0] = '\0';
    if (!L.cfg.nccl_ifname_auto || getenv("NCCL_SOCKET_IFNAME") || L.a.nnodes < 2)
        return;
    char names[GL_MAX_IFACES][32];
    if (gl_list_ifaces(names, GL_MAX_IFACES) < 2)
        return;
    char ifn[64];
    if (gl_route_iface(master, ifn, sizeof ifn) == 0 && strcmp(ifn, "lo") != 0)
        snprintf(L.nccl_ifname, sizeof L.nccl_ifname, "=%s", ifn);
}

static void on_assigned(rdzv_client *c, const rdzv_assignment *a) {
    L.a = *a;
    L.assigned = 1;
    gl_warm_assigned(&W);
    choose_ifname(a->master_addr);
    gl_notice_workers_started();
    /* the same in every round: from this node's JOIN (connecting included) to its rank */
    double ms = (double)(gb_now_ns() - L.t_join_ns) / 1e6;
    fprintf(stderr,
            "gpulaunch: job %s round %u: node rank %u of %u, ranks %u-%u of %u, master %s:%u, "
            "%d workers (rendezvous %.1f ms)\n",
            L.rh.run_id, a->round, a->node_rank, a->nnodes, a->base_rank,
            a->base_rank + (uint32_t)L.cfg.nproc - 1, a->world_size, a->master_addr, a->master_port,
            L.cfg.nproc, ms);
    if (gl_reform_state(&R) == GL_REFORM_WAITING) {
        /* the kept workers take this round in place (gl_reform.c) */
        gl_reform_hand(&R, &L.a, L.nccl_ifname, L.restarts);
        return;
    }
    if (!gl_group_idle(&G)) {
        /* a fallen-back re-formation's workers are still stopping: this
         * round cannot have them; it ends and the next one restarts them */
        rdzv_client_fail(L.cli, "the local workers of a failed re-formation are still stopping");
        L.assigned = 0;
        return;
    }
    gl_hold_spawned(&H);
    if (gl_group_spawn(&G, &L.a, L.restarts, L.nccl_ifname) > 0) {
        gl_group_stop(&G, GL_DISCARD_GRACE_MS);
        rdzv_client_fail(L.cli, "a worker could not be started");
        maybe_finish_round();
    }
    gl_gpumon_round();
    gl_watchdog_round(&WD);
    gl_story_began(a->round, GL_ROUND_RESTART, 0); /* the first round when none ended before */
    gl_progress_start_stats(L.loop, L.cfg.stats_interval_s, stats_due, send_stats, NULL);
}

/* Every local worker runs, none failed or is stopping, no exit is under
 * way, and each said it re-forms in place: they go on through a round's end
 * (or another node's preemption) instead of being restarted. */
static int workers_go_on(void) {
    return G.nrunning == L.cfg.nproc && !G.stopping && !L.group_failed && !L.exit_requested &&
           gl_reform_possible(&R);
}

static void on_round_over(rdzv_client *c, uint32_t round, uint32_t reason, uint32_t node_rank,
                          const char *host, const char *msg) {
    fprintf(stderr, "gpulaunch: round %u is over: %s\n", round, msg);
    gl_story_ended(round);
    gl_hold_end(&H);
    /* a local worker that failed just before another node was found gone
     * failed because of it (its peer's link dropped first) */
    if ((reason == RDZV_REASON_DISCONNECT || reason == RDZV_REASON_HEARTBEAT ||
         reason == RDZV_REASON_LEFT) &&
        node_rank != L.a.node_rank && L.first.set && gb_wall_s() - L.first.when < GL_PEER_LOSS_S)
        L.first.peer_lost = 1; /* a held preemption still saves: its SIGTERM goes first */
    L.round_over = 1;
    L.assigned = 0;
    L.scale_up = reason == RDZV_REASON_SCALE_UP;
    L.round_hung = reason == RDZV_REASON_HUNG;
    /* workers that re-form in place are kept: the next round is joined now */
    if (workers_go_on()) {
        gl_reform_begin(&R, msg);
        fprintf(stderr, "gpulaunch: the %d local workers re-form in place (not restarted)\n",
                L.cfg.nproc);
        L.scale_up = 0;
        L.t_join_ns = gb_now_ns();
        int port = gl_free_port(); /* the last round's store may still hold its port */
        if (port > 0)
            rdzv_client_set_master_port(L.cli, (uint16_t)port);
        rdzv_client_rejoin(L.cli);
        return;
    }
    if (!gl_reform_possible(&R))
        gl_story_restart_why("not every local worker re-forms in place", RDZV_CAUSE_NOT_LIVE);
    else
        gl_story_restart_why(G.nrunning < L.cfg.nproc ? "a local worker had exited"
                                                      : "the local workers were stopping",
                             RDZV_CAUSE_STOPPING);
    if (gl_reform_state(&R) != GL_REFORM_NONE)
        gl_reform_abort(&R, msg);
    if (G.nrunning)
        gl_group_stop(&G, 0);
    else
        maybe_finish_round();
}

/* ---- the warm join (gl_warm.h) ---- */

static int warm_live(gl_warm *w) {
    return L.assigned && gl_reform_state(&R) == GL_REFORM_NONE && workers_go_on();
}

static int warm_gone(gl_warm *w) { return gl_group_idle(&G); }

/* Workers started before their round that will not get there (gl_warm said
 * why): stopped; the node is taken in as a new one and starts them then. */
static void warm_stop(gl_warm *w, const char *why) {
    gl_reform_abort(&R, why);
    L.group_failed = 0;
    gl_group_stop(&G, 0);
}

/* The rendezvous holds this node's join: every node of the running round
 * re-forms in place. The workers start now, before this node has a round. */
static void on_warm(rdzv_client *c, uint32_t waiting, uint32_t members) {
    if (gl_warm_phase(&W) != GL_WARM_NONE || L.assigned || !gl_group_idle(&G) || L.exit_requested)
        return;
    gl_warm_start(&W, L.rh.run_id, members);
    gl_reform_first(&R);
    gl_hold_spawned(&H);
    if (gl_group_spawn(&G, NULL, L.restarts, "") > 0) {
        gl_warm_give_up(&W, "a worker could not be started");
        return;
    }
    gl_notice_workers_started();
    gl_gpumon_round();
    gl_progress_start_stats(L.loop, L.cfg.stats_interval_s, stats_due, send_stats, NULL);
}

static void on_progress(rdzv_client *c, uint32_t joined, uint32_t expected, uint32_t waited,
                        const char *missing) {
    /* the server says what the round waits for, with the counts (an older
     * server may not: then the counts alone) */
    if (missing[0])
        fprintf(stderr, "gpulaunch: waiting for the rendezvous (%.0f s): %s\n", waited / 1000.0,
                missing);
    else
        fprintf(stderr, "gpulaunch: waiting for the rendezvous (%.0f s): %u of %u nodes joined\n",
                waited / 1000.0, joined, expected);
}

static void on_waiting(rdzv_client *c, uint32_t waiting, uint32_t members) {
    GB_INFO("%u node(s) waiting to join the next round", waiting);
}

static void on_job_done(rdzv_client *c) {
    if (G.nrunning == 0 && L.done_sent)
        finish(0);
    if (G.nrunning == 0 && !L.assigned) {
        fprintf(stderr,
                "gpulaunch: job %s finished while this node waited to join it; nothing "
                "left to do\n",
                L.rh.run_id);
        finish(0);
    }
}

static void on_rdzv_error(rdzv_client *c, gpl_result_t code, const char *msg) {
    fprintf(stderr, "gpulaunch: rendezvous failed: %s\n", msg);
    gl_hold_end(&H);
    gl_reform_abort(&R, msg);
    if (G.nrunning) {
        L.exit_requested = 1;
        L.exit_code = GL_EXIT_RDZV;
        gl_group_stop(&G, GL_DISCARD_GRACE_MS);
        return;
    }
    finish(code == GPL_ERR_CONFIG || code == GPL_ERR_EXISTS || code == GPL_ERR_INVALID_ARG
               ? GL_EXIT_USAGE
               : GL_EXIT_RDZV);
}

/* A preemption: every node's workers checkpoint the same step and stop; the
 * launcher exits 143 (retryable). Workers get SIGTERM: those that use the
 * runtime turn it into a checkpoint request, others (PyTorch) stop as they
 * always do. SIGKILL comes only after the deadline. */
static void preempt(uint64_t deadline_unix_ms, const char *why) {
    if (L.exit_requested)
        return;
    L.exit_requested = 1;
    L.exit_code = 128 + SIGTERM;
    gl_progress_set_go_on(0); /* this node's workers stop after the save, even before the SIGTERM */
    fprintf(stderr, "gpulaunch: preemption (%s): workers checkpoint and stop%s\n", why,
            G.nrunning ? "" : " (none running)");
    if (G.nrunning == 0) {
        maybe_finish_round();
        return;
    }
    gl_hold_stop(&H, deadline_unix_ms);
}

static void on_event(rdzv_client *c, uint32_t kind, uint64_t deadline_unix_ms, const char *node,
                     const char *reason) {
    if (kind == RDZV_EVENT_STRAGGLER) {
        fprintf(stderr, "gpulaunch: %s\n", reason); /* "straggler: rank ..." */
        return;
    }
    if (kind != RDZV_EVENT_CHECKPOINT)
        return;
    char why[512];
    snprintf(why, sizeof why, "%s", reason[0] ? reason : node);
    /* Another node's notice (ours set exit_requested before it was sent): in
     * an elastic job, workers that re-form in place save the same step as
     * every rank and go on; they re-form when that node has left. */
    if (L.cfg.min_nodes < L.cfg.max_nodes && workers_go_on()) {
        fprintf(stderr,
                "gpulaunch: preemption of another node (%s): the local workers save the same "
                "step as every rank and go on; they re-form in place when it has left\n",
                why);
        return;
    }
    preempt(deadline_unix_ms, why);
}

static int stopping(void) { return L.exit_requested; }

/* A --signals-to-handle signal that is no preemption notice: forwarded to
 * the workers, which are stopped (SIGKILL after the grace period). */
static void on_other_signal(int sig) {
    fprintf(stderr, "gpulaunch: got %s: stopping the workers\n", gl_signame(sig));
    L.exit_requested = 1;
    L.exit_code = 128 + sig;
    if (G.nrunning == 0)
        finish(L.exit_code);
    gl_group_signal(&G, sig);
    if (!G.stopping)
        gl_group_kill_after(&G, (uint64_t)(L.cfg.shutdown_timeout_s * 1000));
}

/* ---- preflight ---- */

static int preflight(int verbose) {
    gl_preflight_env e = {
        .shm_path = "/dev/shm",
        .shm_min = L.cfg.shm_min,
        .nccl_ifname = getenv("NCCL_SOCKET_IFNAME"),
        .gpus_visible = -1,
        .gpus_needed =
            L.cfg.bind_gpus || strcmp(L.cfg.val[GL_NPROC_PER_NODE], "gpu") == 0 ? L.cfg.nproc : 0,
        .memlock_min = gpl_visible_gpu_count() > 0 ? 64ull << 20 : 0,
        .gpu_health = L.cfg.gpu_health,
    };
    int fails = gl_preflight(&e, stdout, verbose);
    fflush(stdout);
    return fails;
}

/* ---- main ---- */

int main(int argc, char **argv) {
    for (int i = 1; i < argc && argv[i][0] == '-'; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(gl_usage, stdout);
            return 0;
        }
    L.t_start_ns = gb_now_ns();
    /* a peer that closed its socket is an error to handle, not a reason to die
     * (libuv writes with write(2); workers get SIGPIPE back to default) */
    signal(SIGPIPE, SIG_IGN);
    char err[1024] = "";
    if (gl_config_load(&L.cfg, argc, argv, err, sizeof err) != 0) {
        fprintf(stderr, "gpulaunch: %s\n", err);
        return GL_EXIT_USAGE;
    }
    if (L.cfg.val[GL_PRINT_COMPLETION][0]) {
        gl_print_completion(L.cfg.val[GL_PRINT_COMPLETION], stdout);
        return 0;
    }
    if (L.cfg.print_config) {
        gl_config_print(&L.cfg, stdout);
        if (L.cfg.prog_argc == 0)
            return 0;
    }
    if (L.cfg.check) {
        int f = preflight(1) + gl_endpoint_check(&L.cfg);
        return f ? GL_EXIT_PREFLIGHT : 0;
    }
    if (gl_group_check_program(&L.cfg, err, sizeof err) != 0) {
        fprintf(stderr, "gpulaunch: %s; nothing was started\n", err);
        return GL_EXIT_USAGE;
    }
    L.loop = uv_default_loop();

    gethostname(L.hostname, sizeof L.hostname);
    snprintf(L.instance, sizeof L.instance, "%s-%d-%llu", L.hostname, (int)getpid(),
             (unsigned long long)gb_now_ns());
    const char *tf = L.cfg.val[GL_RDZV_TOKEN_FILE][0] ? L.cfg.val[GL_RDZV_TOKEN_FILE] : NULL;
    if (rdzv_load_token(tf, &L.token, &L.token_len, err, sizeof err) != GPL_OK) {
        fprintf(stderr, "gpulaunch: --rdzv-token-file: %s\n", err);
        return GL_EXIT_USAGE;
    }
    fflush(stdout);
    if (preflight(0)) {
        fprintf(stderr, "gpulaunch: preflight failed (see above); nothing was started\n");
        return GL_EXIT_PREFLIGHT;
    }
    if (gl_numa_prepare(L.cfg.numa_binding, L.cfg.nproc, err, sizeof err) != 0) {
        fprintf(stderr, "gpulaunch: %s\n", err);
        return GL_EXIT_USAGE;
    }
    fflush(stdout);

    /* who hosts the rendezvous, where it is, and who we are */
    int rc = gl_rdzvhost_start(L.loop, &L.cfg, L.hostname, L.token, L.token_len, &L.rh);
    if (rc != 0)
        return rc;
    /* the GPU monitor, --metrics and the DCGM job-mapping files (docs/gpu-health.md) */
    if (gl_gpumon_start(L.loop, &L.cfg, L.rh.run_id, &G, on_gpu_event, NULL, err, sizeof err) !=
        0) {
        fprintf(stderr, "gpulaunch: %s\n", err);
        return GL_EXIT_USAGE;
    }
    rdzv_client_options co = {.host = L.rh.host,
                              .port = L.rh.port,
                              .token = L.token,
                              .token_len = L.token_len,
                              .connect_timeout_ms = L.cfg.join_timeout_ms};
    rdzv_join_params jp = {
        .run_id = L.rh.run_id,
        .hostname = L.hostname,
        .addr = L.rh.addr,
        .instance = L.instance,
        .master_port = (uint16_t)gl_free_port(),
        .nproc = (uint32_t)L.cfg.nproc,
        .ngpus = (uint32_t)gpl_visible_gpu_count(),
        .static_rank = L.cfg.mode == GL_MODE_STATIC ? L.cfg.node_rank : -1,
        .min_nodes = L.cfg.min_nodes,
        .max_nodes = L.cfg.max_nodes,
        .last_call_ms = L.cfg.mode == GL_MODE_DYNAMIC ? L.cfg.last_call_ms : 0,
        .join_timeout_ms = L.cfg.join_timeout_ms,
        .heartbeat_interval_ms = L.cfg.hb_timeout_ms / 5 ? L.cfg.hb_timeout_ms / 5 : 1,
        .heartbeat_timeout_ms = L.cfg.hb_timeout_ms,
        /* a new node of an elastic job may start its workers before it has a
         * round when they get the round block (gl_warm.h) */
        .warm = L.cfg.mode == GL_MODE_DYNAMIC && L.cfg.min_nodes < L.cfg.max_nodes &&
                gl_group_channel(&L.cfg) && L.cfg.warm_start_s > 0,
    };
    rdzv_client_callbacks cb = {.on_assigned = on_assigned,
                                .on_round_over = on_round_over,
                                .on_waiting = on_waiting,
                                .on_progress = on_progress,
                                .on_job_done = on_job_done,
                                .on_event = on_event,
                                .on_error = on_rdzv_error,
                                .on_warm = on_warm};
    uv_timer_init(L.loop, &L.done_timer);
    gl_notice_callbacks ncb = {
        .preempt = preempt, .on_signal = on_other_signal, .stopping = stopping};
    gl_notice_start(L.loop, &L.cfg, L.hostname, &ncb);
    gl_group_job job = {.run_id = L.rh.run_id,
                        .hostname = L.hostname,
                        .addr = L.rh.addr,
                        .rdzv_ep = L.rh.ep,
                        .token = L.token,
                        .token_len = L.token_len};
    gl_group_callbacks gcb = {
        .on_exit = on_worker_exit, .on_spawn_error = on_spawn_error, .on_closed = on_pipe_closed};
    gl_group_init(&G, L.loop, &L.cfg, &job, &gcb); /* reaps from here on */
    gl_watchdog_init(&WD, L.loop, &L.cfg, L.hostname, &G, round_ending, on_hang);
    gl_reform_callbacks rcb = {.on_taken = on_reform_taken, .on_failed = on_reform_failed};
    gl_reform_init(&R, L.loop, L.cfg.nproc, &rcb);
    gl_hold_init(&H, L.loop, &G, L.cfg.nproc, maybe_finish_round);
    gl_progress_set_go_on(L.cfg.min_nodes < L.cfg.max_nodes); /* on_event */
    gl_ckptview_start(L.loop, L.cfg.nproc);
    gl_story_init(L.loop, L.cfg.nproc, send_story);
    L.t_join_ns = gb_now_ns();
    if (rdzv_client_start(L.loop, &co, &jp, &cb, &L.cli, err, sizeof err) != GPL_OK) {
        fprintf(stderr, "gpulaunch: %s\n", err);
        return GL_EXIT_RDZV;
    }
    gl_notice_client(L.cli);
    gl_waits_start(L.loop, L.cli, &G);
    gl_warm_callbacks wcb = {.live = warm_live, .gone = warm_gone, .stop = warm_stop};
    if (jp.warm) /* only an elastic job takes in new nodes */
        gl_warm_init(&W, L.loop, L.cli, L.cfg.nproc, (uint32_t)(L.cfg.warm_start_s * 1000), &wcb);
    uv_run(L.loop, UV_RUN_DEFAULT);
    return L.exit_code;
}
