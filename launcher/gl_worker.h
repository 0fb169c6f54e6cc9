/* One local worker's record, shared by those that handle it: the worker group
 * (gl_workers.c) owns the array and fills it at each spawn; its output router
 * (gl_output.c) owns the pipes' lines, prefix, log file and stderr tail; the
 * watchdog, the GPU monitor and the failure report only read it. */
#ifndef GPULAUNCH_GL_WORKER_H
#define GPULAUNCH_GL_WORKER_H

#include <stddef.h>
#include <sys/types.h>
#include <uv.h>

#define GL_LINE_MAX 65536    /* a longer output line is written in pieces */
#define GL_ERR_TAIL_LINES 20 /* stderr lines kept for the failure report */

struct gl_output;

typedef struct linebuf {
    char buf[GL_LINE_MAX];
    size_t len;
} linebuf;

typedef struct worker {
    pid_t pid;
    int redirect, tee, show; /* stream bits (1 out, 2 err); show: on the console */
    uv_pipe_t out, err;
    struct gl_output *router; /* where its lines go (gl_output_open) */
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

#endif
