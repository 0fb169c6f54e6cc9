/* The rendezvous server, as a real process, against hostile clients and at
 * its limits: junk, oversized frames, wrong versions, clients that do not
 * read, the open-file limit, every named limit refused with a message. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static proc srv;
static int port;
static peer *P;

static void stop(void) {
    int st = rdzv_stop_with_peers(&srv, P, 8);
    free(P);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "server exit status %d: %s", st, srv.out);
}

/* After each hostile client, a well-behaved one is still served. */
static void still_serves(void) {
    rdzv_bclient *c;
    char err[256];
    cr_assert_eq(rdzv_bclient_connect("127.0.0.1", port, NULL, 0, 2000, &c, err, sizeof err),
                 GPL_OK, "server stopped serving: %s", err);
    cr_expect_eq(rdzv_bclient_attach(c, "x", 1), GPL_ERR_NOT_FOUND);
    rdzv_bclient_close(c);
}

static int closed_within(int fd, int ms) {
    size_t got = 0;
    int closed = fd_closed_within(fd, ms, &got);
    if (!closed)
        cr_log_warn("read %zu bytes and the connection is still open", got);
    return closed;
}

Test(rdzv_bad, hostile_clients_are_dropped, .timeout = 60) {
    P = calloc(8, sizeof *P);
    const char *extra[] = {"--handshake-timeout-ms", "500", "--max-outq-bytes", "65536", NULL};
    cr_assert_eq(rdzv_start(&srv, &port, extra), 0);
    /* random bytes */
    int fd = raw_connect(port);
    uint8_t junk[4096];
    srand(7);
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)rand();
    send(fd, junk, sizeof junk, MSG_NOSIGNAL);
    cr_expect(closed_within(fd, 2000), "random bytes: not closed");
    close(fd);
    still_serves();
    /* an oversized frame announcement */
    fd = raw_connect(port);
    uint8_t big[12] = {0x10, 0, 0, 0, 0, RDZV_HELLO};
    send(fd, big, sizeof big, MSG_NOSIGNAL);
    cr_expect(closed_within(fd, 2000), "oversized frame: not closed");
    close(fd);
    still_serves();
    /* a wrong protocol version gets an error naming ours */
    peer *p = &P[0];
    p->fd = raw_connect(port);
    rdzv_msg h = {.type = RDZV_HELLO, .req_id = 1};
    h.u.hello.magic = RDZV_MAGIC;
    h.u.hello.version = 99;
    peer_send(p, &h);
    cr_assert_eq(peer_recv_type(p, RDZV_ERROR, 2000), 0);
    cr_expect(strstr(p->last.u.error.message, "version 99") != NULL, "%s", p->last.u.error.message);
    close(p->fd);
    /* an unknown message type after the handshake */
    cr_assert_eq(peer_open(&P[1], port, NULL), 0);
    uint8_t unk[12] = {0, 0, 0, 8, 0x03, 0xe7};
    send(P[1].fd, unk, sizeof unk, MSG_NOSIGNAL);
    cr_expect(closed_within(P[1].fd, 2000), "unknown type: not closed");
    still_serves();
    /* a client that connects and says nothing is dropped at the deadline */
    fd = raw_connect(port);
    uint64_t t0 = now_ms();
    cr_expect(closed_within(fd, 3000), "silent client: not closed");
    cr_expect_geq(now_ms() - t0, 400);
    close(fd);
    /* a client that never reads its replies is dropped at the output limit */
    cr_assert_eq(peer_open(&P[2], port, NULL), 0);
    peer_join(&P[2], "slow", "s0", 0, 1, 1, 1, 0);
    cr_assert_eq(peer_recv_type(&P[2], RDZV_ASSIGNED, 2000), 0);
    static uint8_t val[512 * 1024];
    rdzv_msg set = {.type = RDZV_KV_SET, .req_id = 2};
    set.u.kv_set.key = (rdzv_bytes){(const uint8_t *)"big", 3};
    set.u.kv_set.value = (rdzv_bytes){val, sizeof val};
    peer_send(&P[2], &set);
    rdzv_msg get = {.type = RDZV_KV_GET, .req_id = 3};
    get.u.kv_key.key = set.u.kv_set.key;
    for (int i = 0; i < 64; i++)
        peer_send(&P[2], &get);
    usleep(1500000); /* not reading: 32 MiB of replies cannot fit in socket buffers */
    cr_expect(closed_within(P[2].fd, 10000), "a client that does not read was not dropped: %s",
              srv.out);
    still_serves();
    /* many idle connections: all accepted, then the server still serves */
    enum { IDLE = 1000 };
    static int fds[IDLE];
    int opened = 0;
    for (int i = 0; i < IDLE; i++)
        if ((fds[i] = raw_connect(port)) >= 0)
            opened++;
    cr_expect_eq(opened, IDLE);
    still_serves();
    for (int i = 0; i < IDLE; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    stop();
}

/* The soft open-file limit of a running process, from /proc. */
static long nofile_soft(pid_t pid) { return proc_read_long(pid, "limits", "Max open files %ld"); }

Test(rdzv_limits, open_file_limit_fits_max_connections_or_is_warned, .timeout = 30) {
    /* this test process, and so the servers it starts, begins at 64 / 256 */
    struct rlimit rl = {64, 256};
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    const char *fits[] = {"--max-connections", "100", NULL};
    cr_assert_eq(rdzv_start(&srv, &port, fits), 0, "%s", srv.out);
    cr_expect_geq(nofile_soft(srv.pid), 164, "the soft limit was not raised to fit 100 + 64");
    cr_expect(strstr(srv.out, "open-file limit") == NULL, "%s", srv.out);
    proc_kill(&srv, SIGTERM);
    proc_wait(&srv, 5000);
    /* 1000 connections do not fit under 256 unless the server may raise the hard limit */
    const char *over[] = {"--max-connections", "1000", NULL};
    cr_assert_eq(rdzv_start(&srv, &port, over), 0, "%s", srv.out);
    long soft = nofile_soft(srv.pid);
    int warned = strstr(srv.out, "the open-file limit is 256") != NULL;
    cr_expect(soft >= 1064 ? !warned : warned,
              "limit %ld: a server that cannot fit --max-connections must say so: %s", soft,
              srv.out);
    proc_kill(&srv, SIGTERM);
    proc_wait(&srv, 5000);
}

Test(rdzv_limits, every_limit_is_enforced_with_a_message, .timeout = 30) {
    P = calloc(8, sizeof *P);
    const char *extra[] = {
        "--max-jobs",        "1", "--max-nodes", "2", "--max-job-kv-bytes", "4096",
        "--max-connections", "6", NULL};
    cr_assert_eq(rdzv_start(&srv, &port, extra), 0);
    /* nodes per job */
    cr_assert_eq(peer_open(&P[0], port, NULL), 0);
    peer_join(&P[0], "big", "b0", 0, 1, 3, 3, 0);
    cr_assert_eq(peer_recv_type(&P[0], RDZV_ERROR, 2000), 0);
    cr_expect_eq(P[0].last.u.error.code, GPL_ERR_LIMIT);
    cr_expect(strstr(P[0].last.u.error.message, "allows at most 2") != NULL, "%s",
              P[0].last.u.error.message);
    /* jobs held at once */
    cr_assert_eq(peer_open(&P[1], port, NULL), 0);
    peer_join(&P[1], "j1", "a0", 0, 1, 1, 1, 0);
    cr_assert_eq(peer_recv_type(&P[1], RDZV_ASSIGNED, 2000), 0);
    cr_assert_eq(peer_open(&P[2], port, NULL), 0);
    peer_join(&P[2], "j2", "c0", 0, 1, 1, 1, 0);
    cr_assert_eq(peer_recv_type(&P[2], RDZV_ERROR, 2000), 0);
    cr_expect(strstr(P[2].last.u.error.message, "maximum of 1 jobs") != NULL, "%s",
              P[2].last.u.error.message);
    /* key-value bytes per job */
    rdzv_bclient *kv;
    char err[256];
    cr_assert_eq(rdzv_bclient_connect("127.0.0.1", port, NULL, 0, 2000, &kv, err, sizeof err),
                 GPL_OK);
    cr_assert_eq(rdzv_bclient_attach(kv, "j1", 1), GPL_OK);
    static char val[3000];
    cr_expect_eq(rdzv_bclient_set(kv, "a", val, sizeof val), GPL_OK);
    cr_expect_eq(rdzv_bclient_set(kv, "b", val, sizeof val), GPL_ERR_LIMIT);
    cr_expect(strstr(rdzv_bclient_error(kv), "key-value store is full") != NULL, "%s",
              rdzv_bclient_error(kv));
    cr_expect_eq(rdzv_bclient_set(kv, "a", val, 100), GPL_OK, "replacing a value frees its bytes");
    /* connections: 4 open so far; the 7th is refused */
    int fds[3];
    for (int i = 0; i < 3; i++)
        fds[i] = raw_connect(port);
    cr_expect(closed_within(fds[2], 3000), "the connection over --max-connections stayed open");
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    rdzv_bclient_close(kv);
    stop();
}

Test(rdzv_limits, oversized_token_file_is_refused) {
    char path[] = "/tmp/gpl-bigtoken-XXXXXX";
    int fd = mkstemp(path);
    static char big[RDZV_MAX_TOKEN + 10];
    memset(big, 'x', sizeof big);
    cr_assert(write(fd, big, sizeof big) == (ssize_t)sizeof big);
    close(fd);
    proc p;
    char *argv[] = {GPL_BUILD_DIR "/rendezvous/gpulaunch-rdzv",
                    "--listen",
                    "127.0.0.1:0",
                    "--token-file",
                    path,
                    NULL};
    cr_assert_eq(proc_start(&p, argv, NULL), 0);
    int st = proc_wait(&p, 5000);
    unlink(path);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "over the 4096-byte limit") != NULL, "%s", p.out);
}
