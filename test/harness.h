/* Test helpers: start real server processes, talk the rendezvous protocol
 * over real sockets. */
#ifndef GPULAUNCH_TEST_HARNESS_H
#define GPULAUNCH_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gpulaunch/rdzv.h"
#include "rdzv_codec.h"

typedef struct proc {
    pid_t pid;
    int out_fd; /* the child's stdout+stderr */
    char out[65536];
    size_t out_len;
} proc;

/* Starts argv (argv[0] a path) with stdout/stderr piped to p->out_fd. */
int proc_start(proc *p, char *const argv[], char *const envp[]);
/* Reads the child's output until needle appears or timeout; 1 when found. */
int proc_expect(proc *p, const char *needle, int timeout_ms);
/* Waits for exit; returns the wait status, or -1 on timeout (then kills). */
int proc_wait(proc *p, int timeout_ms);
void proc_kill(proc *p, int sig);

/* Starts gpulaunch-rdzv on 127.0.0.1 with a free port plus extra args. */
int rdzv_start(proc *p, int *port, const char *const *extra);

/* A raw protocol peer: connect + handshake through the blocking client,
 * then frames by hand. */
typedef struct peer {
    rdzv_bclient *bc;
    int fd;
    uint8_t buf[1 << 21];
    size_t len, consumed;
    rdzv_msg last;
} peer;

int peer_open(peer *p, int port, const char *token);
void peer_close(peer *p);
int peer_send(peer *p, const rdzv_msg *m);
/* Reads the next frame into p->last; 0 on success, -1 on timeout or error. */
int peer_recv(peer *p, int timeout_ms);
/* Reads until a frame of the given type arrives (others skipped). */
int peer_recv_type(peer *p, uint16_t type, int timeout_ms);
int peer_join(peer *p, const char *run, const char *host, int static_rank, uint32_t nproc,
              uint32_t min, uint32_t max, uint32_t last_call_ms);
/* Closes peers[0..n-1], then stops the server (SIGTERM, 5 s): its wait status. */
int rdzv_stop_with_peers(proc *srv, peer *peers, int n);

int raw_connect(int port);
/* Whether the other side closed fd within ms (what it still sends is read
 * and dropped, counted in *read when read is not NULL). */
int fd_closed_within(int fd, int ms, size_t *read);
uint64_t now_ms(void);
/* Whether process pid ignores signal sig (/proc/PID/status SigIgn). */
int proc_ignores(pid_t pid, int sig);
/* The number on the first line of /proc/PID/<file> that fmt (one %ld)
 * matches, e.g. ("status", "VmHWM: %ld"); -1 when none does. */
long proc_read_long(pid_t pid, const char *file, const char *fmt);
/* A TCP port that was free a moment ago (for listeners started by others). */
int free_tcp_port(void);
/* GET path from 127.0.0.1:port over plain HTTP/1.0 (3 s at most): the
 * status code (0: no answer), the body NUL-terminated into out (len bytes). */
int http_get_local(int port, const char *path, char *out, size_t len);
/* The value of a Prometheus sample line "name value" in text, -1 when absent. */
double prom_value(const char *text, const char *name);
/* The largest relative difference between two float32 parameter dumps
 * (dp_train --dump-params), |a-b| / (|a| + 1e-3); -1 when either cannot be
 * read, holds under 100 values, or their sizes differ (*n says how many). */
double params_worst_rel_diff(const char *a, const char *b, int *n);
/* The training examples' lines (dp_train, train_ddp.py), searched in one or
 * two outputs (b may be NULL): "rank R params_sha256 HEX" into sha[R] for
 * R < n, returning how many were found; "rank R preempted after step N",
 * returning N or -1. */
int params_sha_lines(const char *a, const char *b, char sha[][65], int n);
long preempted_step_line(const char *a, const char *b, int rank);
/* A process whose environment holds both entries (e.g. "RANK=5"; b may be
 * NULL) and, when parent > 0, whose parent is parent; 0 when none. */
pid_t proc_find(pid_t parent, const char *a, const char *b);
/* What `promtool check metrics` refuses, for machines without it: a sample
 * whose family has no TYPE before it, a family's samples apart, HELP or TYPE
 * twice, a malformed name, label set or value, a series twice. 0 when clean,
 * else -1 with the line in why. */
int prom_check(const char *text, char *why, size_t len);
/* Every family of a Prometheus text (its # HELP lines) named in backquotes
 * (`name` or `name{...}`) somewhere in the project's docs' Markdown files: 0 when so,
 * else -1 with the undocumented names in why. */
int prom_documented(const char *text, char *why, size_t len);
/* mkdtemp under /tmp, and rm -rf of it. */
void tmpdir_make(char *buf, size_t len, const char *prefix);
void tmpdir_remove(const char *dir);

/* Criterion ends a skipped test without running its suite's .fini: a suite
 * whose .init makes something (a folder, a bed, a server) names its .fini
 * with skip_cleanup, and skip_test runs it before it skips. */
void skip_cleanup(void (*fini)(void));
void skip_cleanup_run(void);
#define skip_test(...)                                                                             \
    do {                                                                                           \
        skip_cleanup_run();                                                                        \
        cr_skip_test(__VA_ARGS__);                                                                 \
    } while (0)

#endif
