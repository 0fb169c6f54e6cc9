/* The client library's hooks for the programs that test the server with
 * many simulated nodes (test/bench/rdzv_soak.c); not in the public API. */
#ifndef GPULAUNCH_RDZV_CLIENT_INT_H
#define GPULAUNCH_RDZV_CLIENT_INT_H

#include "gpulaunch/rdzv.h"

/* The node goes silent as a frozen or vanished host does: no heartbeat, no
 * read, no reconnect, its connection left open. Only rdzv_client_close
 * follows. */
void rdzv_client_freeze(rdzv_client *c);
/* Only the link to the rendezvous goes silent (as above); the node still
 * answers its peers' probes: a link bad between the server and it alone. */
void rdzv_client_freeze_link(rdzv_client *c);
/* Its peers' probes go unanswered (stopped 1) or are answered again (0), as
 * those of a launcher SIGSTOPped and let go; its machine answers throughout. */
void rdzv_client_stop_peer(rdzv_client *c, int stopped);

#endif
