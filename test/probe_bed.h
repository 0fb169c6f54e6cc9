/* The bed of the probe tests (test_probe.c: a waiting job's suspicion and
 * pings; test_kprobe.c: machine checks and kernel probes): a real
 * gpulaunch-rdzv with its HTTP port, and raw protocol peers standing in for
 * the nodes' launchers. */
#ifndef GPULAUNCH_TEST_PROBE_BED_H
#define GPULAUNCH_TEST_PROBE_BED_H

#include "harness.h"
#include "rdzv_codec.h"

#define PROBE_BED_NODES 4 /* raw peers P[0..3] */

extern proc bed_srv;
extern int bed_port, bed_hport; /* the protocol's and the HTTP port */
extern peer *P;
/* a node's calibration pong this late (await_assigned): a node far away */
extern int pong_delay_ms[PROBE_BED_NODES];
/* what a node does with a probe request met while it waits to be assigned
 * (NULL: nothing; the kernel-probe tests answer it) */
extern void (*probe_bed_on_probe)(int i, const rdzv_msg *m);

/* The server, started with --http and `extra` (NULL-terminated, may be NULL);
 * a Criterion assertion fails when it does not start. */
void probe_bed_start(const char *const *extra);
/* The server stopped (exit status 0 expected), the peers closed. */
void probe_bed_stop(void);
/* The server again, with --probes udp (no machine checks, no kernel probes). */
void restart_with_probes_udp(void);
/* Node i is assigned, and the join's calibration ping answered (after
 * pong_delay_ms[i]) when it says it answers probes (none is sent when it
 * does not). */
void await_assigned(int i, int answers);
/* Node i (of n, one static job `run`) connects and joins: hostname
 * RUN-i, address 10.0.0.(i + 1), one process, JOIN flags as given, its
 * UDP peer port peer_port (0: none). */
void probe_bed_join(int i, const char *run, int n, uint16_t flags, uint16_t peer_port);
/* A sample's value in the server's /metrics now. */
double metric_of(const char *name);

#endif
