/* The rendezvous soak's server under test (rdzv_soak.c): gpulaunch-rdzv as a
 * process of its own on a port, its /metrics read over HTTP (the test
 * harness's), and what it holds (descriptors, RSS, CPU) read from /proc. */
#ifndef GPULAUNCH_SOAK_SERVER_H
#define GPULAUNCH_SOAK_SERVER_H

#include <sys/types.h>

/* Starts bin listening on 127.0.0.1:port with /metrics on http_port, the
 * token in a file and the handshake timeout given, without malloc's
 * per-thread cache (gpulaunch_rdzv_heap_bytes is then exact); waits until
 * both ports take connections. probes: --probes (NULL: on). Its pid, -1
 * (said on stderr) on failure. */
pid_t soak_server_start(const char *bin, int port, int http_port, const char *token,
                        int handshake_ms, const char *probes);
/* A value of the server's /metrics (a sample "name" or "name{labels}"), -1
 * when absent or when it does not answer within 3 s. */
double soak_server_metric(int http_port, const char *name);
long soak_proc_fds(pid_t pid);
long soak_proc_rss_kib(pid_t pid); /* -1: unknown */
double soak_proc_cpu_s(pid_t pid); /* user + system, 0 when unknown */

#endif
