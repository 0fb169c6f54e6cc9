/* Kernel probes, a node's side: rdzv_kprobe.h says what and why. */
#include "rdzv_kprobe.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gb_log.h"

#define GB_COMPONENT "rdzv-client"

struct rdzv_kport {
    uv_poll_t poll;
    uv_timer_t pause;
    int fd, handles;
};

int rdzv__kport_listen(uint16_t port, int v6) {
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1; /* a launcher started again takes its number while old connections linger */
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t len;
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_any;
        a->sin6_port = htons(port);
        len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_ANY);
        a->sin_port = htons(port);
        len = sizeof *a;
    }
    /* listen here too: another socket may hold the number for listening alone */
    if (bind(fd, (const struct sockaddr *)&ss, len) != 0 || listen(fd, RDZV_KPROBE_BACKLOG) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static void on_closed(uv_handle_t *h) {
    rdzv_kport *k = h->data;
    if (--k->handles == 0) {
        close(k->fd);
        free(k);
    }
}

static void on_readable(uv_poll_t *p, int status, int events);

static void on_pause_end(uv_timer_t *t) {
    rdzv_kport *k = t->data;
    if (uv_poll_start(&k->poll, UV_READABLE, on_readable) != 0)
        uv_timer_start(&k->pause, on_pause_end, RDZV_KPROBE_PAUSE_MS, 0);
}

/* Stops looking at the listener for RDZV_KPROBE_PAUSE_MS, then looks again. */
static void pause_for_a_while(rdzv_kport *k) {
    uv_poll_stop(&k->poll);
    uv_timer_start(&k->pause, on_pause_end, RDZV_KPROBE_PAUSE_MS, 0);
}

/* Takes every completed connection off the queue and closes it: the
 * handshake was the answer. Out of descriptors, or told of an error by the
 * poll, the listener pauses and looks again (the kernel goes on completing
 * connections into the queue meanwhile). */
static void on_readable(uv_poll_t *p, int status, int events) {
    rdzv_kport *k = p->data;
    (void)events;
    if (status < 0) { /* libuv stopped the poll: started again after the pause */
        GB_DEBUG("kernel probe port: %s, looking again in %d ms", uv_strerror(status),
                 RDZV_KPROBE_PAUSE_MS);
        pause_for_a_while(k);
        return;
    }
    for (;;) {
        int fd = accept4(k->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
            close(fd);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            GB_DEBUG("kernel probe port: out of descriptors, looking again in %d ms",
                     RDZV_KPROBE_PAUSE_MS);
            pause_for_a_while(k);
        }
        return; /* EAGAIN: the queue is empty */
    }
}

int rdzv__kport_start(uv_loop_t *loop, int fd, rdzv_kport **out) {
    *out = NULL;
    rdzv_kport *k = calloc(1, sizeof *k);
    if (k == NULL) {
        close(fd);
        return UV_ENOMEM;
    }
    k->fd = fd;
    int r = uv_poll_init(loop, &k->poll, fd);
    if (r != 0) {
        close(fd);
        free(k);
        return r;
    }
    uv_timer_init(loop, &k->pause);
    k->poll.data = k->pause.data = k;
    k->handles = 2;
    if ((r = uv_poll_start(&k->poll, UV_READABLE, on_readable)) != 0) {
        rdzv__kport_close(k);
        return r;
    }
    *out = k;
    return 0;
}

void rdzv__kport_close(rdzv_kport *k) {
    if (k == NULL)
        return;
    uv_close((uv_handle_t *)&k->poll, on_closed);
    uv_close((uv_handle_t *)&k->pause, on_closed);
}

/* Closes an attempt; one that completed with a reset (SO_LINGER 0). */
static void drop(rdzv_kconn *k, int i, int reset) {
    if (k->fd[i] < 0)
        return;
    if (reset) {
        struct linger l = {.l_onoff = 1, .l_linger = 0};
        (void)setsockopt(k->fd[i], SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    close(k->fd[i]);
    k->fd[i] = -1;
}

static void attempt(rdzv_kconn *k, uint64_t now) {
    int i = k->n++;
    k->next_ms = now + k->every_ms;
    k->fd[i] = socket(k->to.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (k->fd[i] < 0) {
        k->unable = 1; /* out of descriptors: this prober cannot say */
        return;
    }
    if (connect(k->fd[i], (const struct sockaddr *)&k->to, k->tolen) == 0) {
        k->connected = 1;
        drop(k, i, 1);
    } else if (errno == ECONNREFUSED) {
        k->refused++;
        drop(k, i, 0);
    } else if (errno != EINPROGRESS) {
        k->unable = 1; /* no route from here, or no port left to connect from */
        drop(k, i, 0);
    }
}

void rdzv__kconn_start(rdzv_kconn *k, const struct sockaddr *to, socklen_t len,
                       uint32_t deadline_ms, uint64_t now) {
    memset(k, 0, sizeof *k);
    for (int i = 0; i < RDZV_KPROBE_MAX_TRIES; i++)
        k->fd[i] = -1;
    memcpy(&k->to, to, len < sizeof k->to ? len : sizeof k->to);
    k->tolen = len;
    uint32_t every = deadline_ms / 4;
    k->every_ms = every < RDZV_KPROBE_EVERY_MIN_MS   ? RDZV_KPROBE_EVERY_MIN_MS
                  : every > RDZV_KPROBE_EVERY_MAX_MS ? RDZV_KPROBE_EVERY_MAX_MS
                                                     : every;
    attempt(k, now);
}

int rdzv__kconn_tick(rdzv_kconn *k, uint64_t now, uint32_t slack_ms) {
    if (k->connected)
        return 1;
    struct pollfd pf[RDZV_KPROBE_MAX_TRIES];
    int idx[RDZV_KPROBE_MAX_TRIES], np = 0;
    for (int i = 0; i < k->n; i++)
        if (k->fd[i] >= 0) {
            pf[np] = (struct pollfd){.fd = k->fd[i], .events = POLLOUT};
            idx[np++] = i;
        }
    if (np > 0 && poll(pf, (nfds_t)np, 0) > 0) {
        for (int j = 0; j < np; j++) {
            if (pf[j].revents == 0)
                continue;
            int err = 0;
            socklen_t el = sizeof err;
            if (getsockopt(pf[j].fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
                err = errno;
            if (err == 0) {
                k->connected = 1;
                drop(k, idx[j], 1);
            } else {
                if (err == ECONNREFUSED)
                    k->refused++;
                drop(k, idx[j], 0);
            }
        }
    }
    if (!k->connected && k->n < RDZV_KPROBE_MAX_TRIES && now + slack_ms >= k->next_ms)
        attempt(k, now);
    return k->connected;
}

void rdzv__kconn_stop(rdzv_kconn *k) {
    for (int i = 0; i < k->n; i++)
        drop(k, i, 1);
}
