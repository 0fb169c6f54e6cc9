/* Cloud preemption notices polled from the instance metadata services. */
#ifndef GPULAUNCH_GL_CLOUD_H
#define GPULAUNCH_GL_CLOUD_H

#include <stdint.h>
#include <uv.h>

enum {
    GL_CLOUD_NONE = 0,
    GL_CLOUD_AUTO = 1,
    GL_CLOUD_AWS = 2,
    GL_CLOUD_GCP = 3,
    GL_CLOUD_AZURE = 4
};

typedef struct gl_cloud gl_cloud;
/* Called on the loop once, when a notice is seen: the time the node goes
 * away (unix ms) and what was seen. */
typedef void (*gl_cloud_cb)(void *data, uint64_t deadline_unix_ms, const char *why);

/* "none", "auto", "aws", "gcp", "azure" -> GL_CLOUD_*; -1 otherwise. */
int gl_cloud_parse_source(const char *s);
/* Starts polling on a thread of its own; NULL for GL_CLOUD_NONE. endpoint
 * overrides the metadata base URL (IMDS proxies, tests). */
gl_cloud *gl_cloud_start(uv_loop_t *loop, int source, const char *endpoint, double interval_s,
                         gl_cloud_cb cb, void *data);

#endif
