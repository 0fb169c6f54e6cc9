/* Whether a rendezvous endpoint names this machine, by torchrun's rule for
 * its c10d backend: the launcher on the endpoint's host hosts the rendezvous
 * itself (gl_main.c), every other one connects. */
#ifndef GPULAUNCH_GL_ENDPOINT_H
#define GPULAUNCH_GL_ENDPOINT_H

#include "gl_options.h"

enum {
    GL_EP_REMOTE = 0,   /* another machine, or a name that does not resolve */
    GL_EP_LOOPBACK = 1, /* localhost or a loopback address: reachable from here only */
    GL_EP_HERE = 2,     /* this host's name or FQDN, or an address of one of its interfaces */
};

/* GL_EP_*: host as `localhost`, a loopback address, this host's name or
 * FQDN, or a name or address that resolves to an address one of this
 * machine's interfaces holds. */
int gl_endpoint_locality(const char *host);
/* The loopback address to listen on for a GL_EP_LOOPBACK host: "127.0.0.1"
 * when it resolves to an IPv4 one (clients try each address in turn), else "::1". */
const char *gl_endpoint_loopback_listen(const char *host);
/* --check: the rendezvous this node would join resolves and answers, or this
 * node would host it; prints ok/FAIL lines. Returns the number of FAILs. */
int gl_endpoint_check(const gl_config *cfg);
/* The name this node advertises to the others without --local-addr: the
 * host name's canonical name when it is a fully qualified one (torchrun's
 * socket.getfqdn(): in a Kubernetes JobSet pod only <pod>.<subdomain> and
 * the FQDN resolve, not the bare pod name), else the host name itself. */
void gl_endpoint_fqdn(const char *hostname, char *out, size_t len);
/* A round's master port: a TCP port free on this machine now, chosen at
 * random between GL_PORT_FLOOR and the kernel's ephemeral range (so that no
 * socket made meanwhile is given it), GL_PORT_TRIES tries; else the kernel's
 * pick; 0 when none can be had. */
#define GL_PORT_FLOOR 10000
#define GL_PORT_TRIES 64
int gl_free_port(void);

#endif
