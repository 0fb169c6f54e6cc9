/* Worker output: each worker's stdout and stderr, read from its pipes and
 * written a line at a time with its rank prefix to the console
 * (--local-ranks-filter) and to its --log-dir file (--redirects, --tee); the
 * last stderr lines are kept for the failure report. */
#ifndef GPULAUNCH_GL_OUTPUT_H
#define GPULAUNCH_GL_OUTPUT_H

#include <stddef.h>

#include "gl_launch.h"

/* Routes w's streams (w->local_rank set, w->log_fd -1): its --redirects and
 * --tee bits, whether the console shows it, and its --log-dir file. */
void gl_output_open(worker *w);
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
