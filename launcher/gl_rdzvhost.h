/* The job's rendezvous as this node sees it: its run id, where it is,
 * whether this launcher hosts it (and then its server), the endpoint the
 * workers are given, and the address this node advertises. */
#ifndef GPULAUNCH_GL_RDZVHOST_H
#define GPULAUNCH_GL_RDZVHOST_H

#include <stddef.h>
#include <uv.h>

#include "gl_options.h"
#include "gpulaunch/rdzv.h"

#define GL_EXIT_RDZV 200 /* the launcher's exit when the rendezvous cannot be had */

typedef struct gl_rdzvhost {
    char run_id[256];
    char addr[256]; /* this node's: --local-addr, its FQDN, or 127.0.0.1 standalone */
    char host[256]; /* where the clients connect */
    int port;
    char ep[300];     /* the rendezvous endpoint the workers are given */
    rdzv_server *srv; /* hosted by this launcher, on its loop; NULL: another's */
} gl_rdzvhost;

/* Fills p (zeroed by the caller) and starts the server where this launcher
 * hosts it. Returns 0, or GL_EXIT_RDZV with the reason said on stderr. */
int gl_rdzvhost_start(uv_loop_t *loop, const gl_config *cfg, const char *hostname,
                      const char *token, size_t token_len, gl_rdzvhost *p);

#endif
