/* The failure report: the first failure of the job on this node (its root
 * cause) on stderr, with the worker's error file (torch's @record: message
 * and traceback as lines), its last stderr lines and the GPUs' XID errors, and
 * as failure.json in --log-dir. */
#ifndef GPULAUNCH_GL_REPORT_H
#define GPULAUNCH_GL_REPORT_H

#include <stdint.h>

#include "gl_errfile.h"
#include "gl_worker.h"

typedef struct gl_failure {
    int set;
    double when;
    int rank, local_rank, pid;
    int64_t exit_code;
    int signal;
    char tail[GL_ERR_TAIL_LINES * 256];
    int hung;       /* the hang watchdog stopped it */
    char why[1024]; /* then: who, for how long, behind which collective */
    int peer_lost;  /* it failed as another node, or the rendezvous' host, went away: that
                       node's loss ended the round (exit 200, retryable), not this worker */
} gl_failure;

/* ef: what the worker wrote at ef_path, NULL when it wrote nothing. */
void gl_report_failure(const gl_failure *f, const gl_errfile *ef, const char *ef_path,
                       const char *hostname, unsigned node_rank, const char *log_dir);

#endif
