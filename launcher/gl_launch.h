/* The launcher's shared state, internal to the gpulaunch executable: the
 * worker and failure records and the one launcher instance L, defined in
 * gl_main.c (the flow: options, preflight, rendezvous, restarts, preemption,
 * the failure report) and used by gl_workers.c (the worker group) and
 * gl_output.c (worker output lines). */
#ifndef GPULAUNCH_GL_LAUNCH_H
#define GPULAUNCH_GL_LAUNCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "gl_cloud.h"
#include "gl_options.h"
#include "gpulaunch/rdzv.h"

#define GL_LINE_MAX 65536    /* a longer output line is written in pieces */
#define GL_ERR_TAIL_LINES 20 /* stderr lines kept for the failure report */

typedef struct linebuf {
    char buf[GL_LINE_MAX];
    size_t len;
} linebuf;

typedef struct worker {
    pid_t pid;
    int redirect, tee, show; /* stream bits (1 out, 2 err); show: on the console */
    uv_pipe_t out, err;
    int local_rank, rank;
    int running, pipes_open;
    linebuf lout, lerr;
    char tail[GL_ERR_TAIL_LINES][256];
    int tail_n;
    int log_fd;
    char prefix[256]; /* the console prefix of its lines (--log-line-prefix-template) */
    size_t prefix_len;
    char gpu[64]; /* its CUDA_VISIBLE_DEVICES, "" without */
} worker;

typedef struct failure {
    int set;
    double when;
    int rank, local_rank, pid;
    int64_t exit_code;
    int signal;
    char tail[GL_ERR_TAIL_LINES * 256];
    int hung;       /* the hang watchdog stopped it (gl_watchdog.c) */
    char why[1024]; /* then: who, for how long, behind which collective */
} failure;

struct launcher {
    gl_config cfg;
    uv_loop_t *loop;
    rdzv_server *srv;
    rdzv_client *cli;
    rdzv_assignment a;
    worker *w;
    int nrunning;
    int restarts;
    int stopping;       /* SIGTERM sent to the group */
    int group_failed;   /* a local worker failed this round */
    int round_over;     /* the rendezvous ended the round */
    int round_hung;     /* ... because a rank hung (exit 201 when no restarts are left) */
    int scale_up;       /* ... to take in waiting nodes: not a failure */
    int assigned;       /* holds an assignment of the current round */
    int exit_requested; /* a signal to us: exit once workers are gone */
    int exit_code;
    int done_sent;
    uv_timer_t kill_timer, done_timer, cloud_timer, discard_timer;
    gl_cloud *cloud;
    uv_signal_t sigchld;
    uv_signal_t sigs[GL_MAX_SIGNALS]; /* --signals-to-handle */
    char hostname[256], addr[256], run_id[256], instance[64];
    char nccl_ifname[64]; /* chosen NCCL_SOCKET_IFNAME, "" when left alone */
    char *token;
    size_t token_len;
    failure first;
    char rdzv_ep[300]; /* the rendezvous endpoint the workers are given */
    uint64_t t_start_ns;
    uint64_t t_join_ns; /* this node's last JOIN: the banner's rendezvous time */
};

extern struct launcher L;

/* Everything local is gone: decide between done, restart and exit
 * (gl_main.c). Called whenever a worker exits or its pipes close. */
void gl_maybe_finish_round(void);

#endif
