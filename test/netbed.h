/* The multi-node test bed: K hosts on this machine, each a network namespace
 * with its own address (10.77.0.<10+i>) and host name (host<i>), joined by
 * veth pairs to a bridge that lives in a namespace of its own (the machine's
 * own network is never touched), or, for a slow lossy fabric, by TUN devices
 * and the netbed_link forwarder.
 *
 * Every namespace and device is named after the test process
 * ("gplt<pid>..."); netbed_down removes them, and netbed_reap_stale removes
 * those of test processes that died without doing so (a timed-out or
 * interrupted test). Requires root (CI runs as root). */
#ifndef GPULAUNCH_TEST_NETBED_H
#define GPULAUNCH_TEST_NETBED_H

#include <stddef.h>
#include <sys/types.h>

#define NETBED_MAX_HOSTS 16
#define NETBED_HOST_BASE 10 /* host i is 10.77.0.(NETBED_HOST_BASE + i) */
#define NETBED_SUBNET "10.77.0."

#ifndef NETBED_LINK_ONLY
#include "harness.h"

typedef struct netbed {
    char prefix[24]; /* "gplt<pid>": names every namespace */
    int nhosts;
    pid_t link_pid; /* netbed_link, in delay mode */
    char dir[160];  /* logs go here */
} netbed;

/* 1 when the bed can be built here (root, ip, veth, bridge); else 0 and why. */
int netbed_available(char *why, size_t len);
/* Builds nhosts hosts; delay_ms/loss_pct > 0 selects the TUN fabric. */
int netbed_up(netbed *b, int nhosts, int delay_ms, int loss_pct, const char *dir);
/* Kills every process in the bed and removes it. Idempotent. */
void netbed_down(netbed *b);
void netbed_reap_stale(void);
void netbed_addr(int host, char *buf, size_t len);
/* Starts argv[0] (a path) inside host's namespace with its host name. */
int netbed_spawn(netbed *b, int host, proc *p, char *const argv[]);
/* Cuts / restores host's link at the bridge: no packet in or out, no error
 * seen by the host's processes (on the TUN fabric: the host's device goes
 * down, so cut it just before killing what runs on it). */
int netbed_cut(netbed *b, int host);
int netbed_restore(netbed *b, int host);
/* SIGKILLs every process in host's namespace; returns how many. */
int netbed_kill_host(netbed *b, int host);
/* Sends sig to every process in host's namespace (SIGSTOP: the host
 * freezes, its sockets open); returns how many. */
int netbed_signal_host(netbed *b, int host, int sig);
/* How many processes run on host now (signal 0 reaches them). */
int netbed_host_procs(netbed *b, int host);
/* GET path from 127.0.0.1:port inside host's namespace (a launcher's
 * --metrics there): the HTTP status, 0 when nothing answered; the body in
 * out, as http_get_local (harness.h). The calling thread enters the
 * namespace for the request and comes back. */
int netbed_http_get(netbed *b, int host, int port, const char *path, char *out, size_t len);
/* Stalls the TCP connections that process comm on host holds to port on
 * to_host: from now on what host sends on them is lost on the way (dropped
 * as it reaches to_host, iptables in that namespace), as a stream stalled in
 * TCP's backoff is; a new connection is not touched. flags: NETBED_STALL_BOTH
 * also loses what to_host sends on them (dropped as it reaches host);
 * NETBED_STALL_USED only the connections on which host's data was
 * acknowledged (not one that sent nothing yet). Returns how many
 * connections it stalled, -1 on error. */
#define NETBED_STALL_BOTH 1
#define NETBED_STALL_USED 2
int netbed_stall_tcp(netbed *b, int host, const char *comm, int to_host, int port, int flags);
/* Ends every stall netbed_stall_tcp made between host and to_host: what
 * was lost since is retransmitted as TCP's backoff lets it. */
int netbed_unstall_tcp(netbed *b, int host, int to_host);
/* Writes a process's captured output to <dir>/<name>.log. */
void netbed_save_log(netbed *b, const char *name, const proc *p);
#endif

#endif
