/* Worker output: each worker's stdout and stderr, read from its pipes and
 * written a line at a time with its rank prefix to the console
 * (--local-ranks-filter) and to its --log-dir file (--redirects, --tee); the
 * last stderr lines are kept for the failure report. A gl_output router is
 * embedded by its owner (the worker group) and reports each closed pipe to
 * it through on_closed. */
#ifndef GPULAUNCH_GL_OUTPUT_H
#define GPULAUNCH_GL_OUTPUT_H

#include <stddef.h>

#include "gl_options.h"
#include "gl_worker.h"

#define GL_DUP_FILTERS_MAX 64

typedef struct gl_output gl_output;
/* One of w's two pipes is closed (w->pipes_open counts the rest). */
typedef void (*gl_output_closed_cb)(gl_output *o, worker *w);

/* --duplicate-stdout-filters / --duplicate-stderr-filters: the attempt's
 * filtered_stdout.log / filtered_stderr.log and the substrings that select
 * --tee'd lines for it (torchrun's PContext does the same). */
typedef struct gl_dup_filter {
    int fd;
    int n;
    char *needle[GL_DUP_FILTERS_MAX];
    char text[4096];
} gl_dup_filter;

struct gl_output {
    void *data; /* the owner's */
    /* private */
    const gl_config *cfg;
    const char *run_id, *hostname; /* the log directories' and the prefix's */
    gl_output_closed_cb on_closed;
    gl_dup_filter dup[2]; /* stdout, stderr */
};

/* Sets o up; run_id and hostname must outlive it. Opens nothing yet. */
void gl_output_init(gl_output *o, const gl_config *cfg, const char *run_id, const char *hostname,
                    gl_output_closed_cb on_closed);
/* Routes w's streams (w->local_rank set, w->log_fd -1) through o: its
 * --redirects and --tee bits, whether the console shows it, and its --log-dir
 * file of this attempt (the restart count); local rank 0 also opens the
 * attempt's filtered logs. */
void gl_output_open(gl_output *o, worker *w, int attempt);
/* Starts reading w's two pipes, once they are open on the loop. */
void gl_output_start(worker *w);
/* Closes w's two pipes (a worker that did not start). */
void gl_output_close(worker *w);
/* Expands $name and ${name} for the n names in t into out (as Python's
 * string.Template.safe_substitute: other names stay as they are); with
 * dollar_escape, $$ becomes $. Returns the length written. */
size_t gl_subst(const char *t, const char *const *names, const char *const *vals, int n,
                int dollar_escape, char *out, size_t len);
/* w's last stderr lines, oldest first, each as "    line\n", into out. */
void gl_output_tail(const worker *w, char *out, size_t len);

#endif
