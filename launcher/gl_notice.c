/* The preemption notices this node hears (see gl_notice.h). */
#include <signal.h>
#include <stdio.h>

#include "gb_time.h"
#include "gl_notice.h"
#include "gl_workers.h"

static struct {
    uv_loop_t *loop;
    const gl_config *cfg;
    const char *hostname;
    rdzv_client *cli;
    gl_notice_callbacks cb;
    gl_cloud *cloud;
    uv_timer_t cloud_timer;
    uv_signal_t sigs[GL_MAX_SIGNALS]; /* --signals-to-handle */
    uv_signal_t slurm[2];
} N;

/* Tells every node first, so that all ranks save the same step; then stops. */
static void notice(uint64_t deadline_unix_ms, const char *why) {
    if (!N.cb.stopping() && N.cli)
        rdzv_client_event(N.cli, RDZV_EVENT_CHECKPOINT, deadline_unix_ms, why);
    N.cb.preempt(deadline_unix_ms, why);
}

static uint64_t grace_deadline(void) {
    return (uint64_t)((gb_wall_s() + N.cfg->shutdown_timeout_s) * 1000.0);
}

/* A cloud notice on this node: tell every node, then stop like SIGTERM. */
static void on_cloud_notice(void *data, uint64_t deadline_unix_ms, const char *why) {
    char msg[600];
    snprintf(msg, sizeof msg, "%s on %s", why, N.hostname);
    notice(deadline_unix_ms, msg);
}

/* Polling starts a second after the workers: short jobs never pay for it. */
static void on_cloud_timer(uv_timer_t *t) {
    if (N.cloud == NULL)
        N.cloud =
            gl_cloud_start(N.loop, N.cfg->preemption_source, N.cfg->val[GL_PREEMPTION_ENDPOINT],
                           N.cfg->preemption_poll_s, on_cloud_notice, NULL);
}

void gl_notice_workers_started(void) {
    if (N.cloud == NULL && N.cfg->preemption_source != GL_CLOUD_NONE)
        uv_timer_start(&N.cloud_timer, on_cloud_timer, GL_CLOUD_AFTER_MS, 0);
}

/* Inside a Slurm job (--slurm auto), SIGUSR1 and SIGUSR2 are preemption
 * notices (sbatch --signal=USR1@90, scancel --signal=USR1): like SIGTERM, one
 * checkpoint of the same step on every node, then exit 143, which the batch
 * script requeues (docs/slurm.md). They are not forwarded as
 * --signals-to-handle would: a program that dies of SIGUSR1 would lose the
 * step. 1 when sig was such a notice. */
static int slurm_notice(int sig) {
    if (!N.cfg->slurm || (sig != SIGUSR1 && sig != SIGUSR2))
        return 0;
    if (N.cb.stopping())
        return 1;
    char why[320];
    snprintf(why, sizeof why, "Slurm's %s on %s", gl_signame(sig), N.hostname);
    notice(grace_deadline(), why);
    return 1;
}

static void on_slurm_signal(uv_signal_t *h, int sig) { slurm_notice(sig); }

static void on_signal(uv_signal_t *h, int sig) {
    if (slurm_notice(sig))
        return;
    if (sig == SIGTERM && !N.cb.stopping() && N.cli) {
        char why[300];
        snprintf(why, sizeof why, "SIGTERM on %s", N.hostname);
        notice(grace_deadline(), why);
        return;
    }
    N.cb.on_signal(sig);
}

void gl_notice_start(uv_loop_t *loop, const gl_config *cfg, const char *hostname,
                     const gl_notice_callbacks *cb) {
    N.loop = loop;
    N.cfg = cfg;
    N.hostname = hostname;
    N.cb = *cb;
    uv_timer_init(loop, &N.cloud_timer);
    for (int i = 0; i < cfg->nsignals; i++) {
        uv_signal_init(loop, &N.sigs[i]);
        uv_signal_start(&N.sigs[i], on_signal, cfg->signals[i]);
    }
    /* Slurm's notices that --signals-to-handle does not already route here */
    static const int slurm_sigs[2] = {SIGUSR1, SIGUSR2};
    for (int i = 0; i < 2 && cfg->slurm; i++) {
        int routed = 0;
        for (int k = 0; k < cfg->nsignals; k++)
            routed |= cfg->signals[k] == slurm_sigs[i];
        if (routed)
            continue;
        uv_signal_init(loop, &N.slurm[i]);
        uv_signal_start(&N.slurm[i], on_slurm_signal, slurm_sigs[i]);
    }
}

void gl_notice_client(rdzv_client *cli) { N.cli = cli; }
