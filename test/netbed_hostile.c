/* netbed_hostile: hostile clients against a rendezvous server, for the fault
 * matrix. Until SIGTERM, in rounds: IDLE connections that never speak (held
 * until the server's handshake deadline closes them), and on fresh connections
 * random bytes, oversized frames, a wrong token, and handshakes that dribble
 * one byte every 200 ms.
 *
 *   netbed_hostile HOST PORT IDLE
 *
 * Prints one summary line at the end: how many of each it sent and how many
 * connections the server closed on it. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gpulaunch/rdzv.h"

#define HOSTILE_EACH 20 /* connections of each bad kind per round */

static volatile sig_atomic_t stop;
static struct sockaddr_in sa;
static long n_idle, n_random, n_oversized, n_wrong_token, n_slow, n_closed_by_server;

static void on_term(int sig) {
    (void)sig;
    stop = 1;
}

static int dial(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Waits up to ms for the server to close fd; counts it when it does. */
static void await_close(int fd, int ms) {
    char buf[4096];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (poll(&p, 1, ms) > 0) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r <= 0) {
            n_closed_by_server++;
            break;
        }
    }
    close(fd);
}

static void send_garbage(int kind) {
    int fd = dial();
    if (fd < 0)
        return;
    unsigned char buf[4096];
    size_t len = sizeof buf;
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)rand();
    if (kind == 1) { /* a frame header announcing 4 GiB - 16 */
        buf[0] = buf[1] = buf[2] = 0xff;
        buf[3] = 0xf0;
        n_oversized++;
    } else {
        n_random++;
    }
    if (write(fd, buf, len) < 0) { /* the server may have closed already */
    }
    await_close(fd, 2000);
}

static void wrong_token(const char *host, int port) {
    rdzv_bclient *c = NULL;
    char err[256];
    n_wrong_token++;
    if (rdzv_bclient_connect(host, port, "not-the-token", 13, 2000, &c, err, sizeof err) ==
        GPL_OK) {
        fprintf(stderr, "netbed_hostile: a wrong token was accepted\n");
        rdzv_bclient_close(c);
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: netbed_hostile HOST PORT IDLE\n");
        return 2;
    }
    const char *host = argv[1];
    char *e1, *e2;
    long lport = strtol(argv[2], &e1, 10), lidle = strtol(argv[3], &e2, 10);
    if (*e1 || *e2 || lport < 1 || lport > 65535 || lidle < 0 || lidle > 1000000) {
        fprintf(stderr, "netbed_hostile: PORT is 1-65535, IDLE 0-1000000\n");
        return 2;
    }
    int port = (int)lport, idle = (int)lidle;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "netbed_hostile: %s is not an IPv4 address\n", host);
        return 2;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < (rlim_t)idle + 64) {
        struct rlimit want = {(rlim_t)idle + 64, (rlim_t)idle + 64}; /* root may raise both */
        if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want.rlim_max)
            want.rlim_max = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &want) != 0) {
            rl.rlim_cur = rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (long)rl.rlim_cur < idle + 64)
        idle = (int)rl.rlim_cur - 64; /* as many as this machine allows */
    signal(SIGTERM, on_term);
    signal(SIGPIPE, SIG_IGN);
    srand((unsigned)getpid());
    int *fds = calloc((size_t)idle, sizeof *fds);
    printf("hostile: started\n");
    fflush(stdout);
    while (!stop) {
        int open_now = 0;
        for (int i = 0; i < idle && !stop; i++) {
            fds[i] = dial();
            if (fds[i] >= 0) {
                open_now++;
                n_idle++;
            }
        }
        printf("hostile: %d idle connections open\n", open_now);
        fflush(stdout);
        for (int i = 0; i < HOSTILE_EACH && !stop; i++) {
            send_garbage(0);
            send_garbage(1);
            wrong_token(host, port);
        }
        /* slow handshakes: one byte every 200 ms until the server gives up */
        int slow[HOSTILE_EACH];
        for (int i = 0; i < HOSTILE_EACH; i++) {
            slow[i] = dial();
            n_slow++;
        }
        for (int t = 0; t < 40 && !stop; t++) {
            for (int i = 0; i < HOSTILE_EACH; i++)
                if (slow[i] >= 0 && write(slow[i], "\0", 1) != 1) {
                    close(slow[i]);
                    slow[i] = -1;
                    n_closed_by_server++;
                }
            usleep(200000);
        }
        for (int i = 0; i < HOSTILE_EACH; i++)
            if (slow[i] >= 0)
                close(slow[i]);
        /* the idle ones: the server's handshake deadline closes them */
        for (int i = 0; i < idle; i++)
            if (fds[i] >= 0)
                await_close(fds[i], stop ? 0 : 100);
    }
    printf("hostile: idle %ld random %ld oversized %ld wrong_token %ld slow %ld "
           "closed_by_server %ld\n",
           n_idle, n_random, n_oversized, n_wrong_token, n_slow, n_closed_by_server);
    free(fds);
    return 0;
}
