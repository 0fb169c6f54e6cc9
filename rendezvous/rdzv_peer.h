/* Peer probes, a node's side (docs/protocol.md, "Suspicion and probes"): a
 * UDP port that answers a PING datagram with a PONG of the same size (no
 * amplification), and the probes of other nodes the rendezvous asks for
 * (RDZV_PROBE_REQ) when a node it suspects does not answer it directly, so
 * that a link bad between the server and that node alone condemns no node
 * its peers still reach. The TCP port of the same number answers kernel
 * probes (rdzv_kprobe.h). Part of the client library, on the client's loop. */
#ifndef GPULAUNCH_RDZV_PEER_H
#define GPULAUNCH_RDZV_PEER_H

#include <stdint.h>
#include <uv.h>

#include "gpulaunch/gpl_error.h"

#define RDZV_PEER_EVERY_MS 50          /* a probe's datagram is sent again this often */
#define RDZV_PEER_MAX_PROBES 8         /* probes in flight at once; more: ok 3, no word */
#define RDZV_PEER_MAX_DEADLINE_MS 5000 /* a longer deadline asked for is cut to this */

typedef struct rdzv_peer rdzv_peer;

/* A probe ended: ok is RDZV_PROBE_OK_* (rdzv_codec.h): the node answered (with its round trip),
 * only its machine did (a kernel probe's connection completed), neither by the deadline, or this
 * node could not probe (out of descriptors, no route). */
typedef void (*rdzv_peer_done_cb)(void *data, uint32_t id, int ok, uint32_t rtt_ms);

/* Opens the UDP port (every address, IPv6 and IPv4, else IPv4 alone; a port
 * the kernel picks). */
gpl_result_t rdzv__peer_open(uv_loop_t *loop, rdzv_peer_done_cb done, void *data, rdzv_peer **out,
                             char *err, size_t errlen);
uint16_t rdzv__peer_port(const rdzv_peer *p);
/* Whether the TCP port of the UDP port's number listens (kernel probes,
 * rdzv_kprobe.h): said in the JOIN as RDZV_JOIN_KERNEL. */
int rdzv__peer_kernel(const rdzv_peer *p);
/* Probes addr (numeric) : port until the first PONG or deadline_ms; with
 * RDZV_PROBE_KERNEL also connects to its TCP port, with RDZV_PROBE_MACHINE
 * only that (done at the first connection); done is called once, from the
 * loop. */
void rdzv__peer_probe(rdzv_peer *p, uint32_t id, const char *addr, uint16_t port,
                      uint32_t deadline_ms, uint16_t flags);
/* Answers and probes nothing more, its TCP port closed: the host vanished (a
 * test's hook). */
void rdzv__peer_mute(rdzv_peer *p);
/* Answers nothing while stopped, its TCP port open: a stopped launcher (a
 * test's hook). */
void rdzv__peer_stop(rdzv_peer *p, int stopped);
/* Closes the port; done is not called again; freed once its handles closed. */
void rdzv__peer_close(rdzv_peer *p);

#endif
