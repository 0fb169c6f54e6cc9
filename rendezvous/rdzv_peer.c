/* Peer probes, a node's side: rdzv_peer.h says what and why. */
#include "rdzv_peer.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gb_log.h"
#include "gb_time.h"
#include "rdzv_codec.h"
#include "rdzv_kprobe.h"

#define GB_COMPONENT "rdzv-client"

typedef struct probe {
    int used;
    uint32_t id;    /* the server's */
    uint32_t nonce; /* the datagrams' req id: an answer must echo it */
    uint16_t flags; /* RDZV_PROBE_KERNEL, RDZV_PROBE_MACHINE */
    struct sockaddr_storage to;
    uint64_t start_ms, end_ms;
    rdzv_kconn k; /* its connection attempts (with RDZV_PROBE_KERNEL or MACHINE) */
} probe;

struct rdzv_peer {
    uv_udp_t udp;
    uv_timer_t tick;
    rdzv_kport *kport; /* the TCP port of the same number (rdzv_kprobe.h); NULL: none */
    int v6;            /* the socket is IPv6 (dual stack) */
    int handles, closing, muted;
    rdzv_peer_done_cb done;
    void *data;
    uint16_t port;
    uint32_t nonce;
    probe probes[RDZV_PEER_MAX_PROBES];
    char rx[64]; /* a PING or PONG is RDZV_HEADER_LEN bytes; anything longer is not one */
};

static void on_closed(uv_handle_t *h) {
    rdzv_peer *p = h->data;
    if (--p->handles == 0)
        free(p);
}

/* Sends one frame of type t with req id id to sa, without blocking: a
 * datagram the socket cannot take now is lost as one on the wire would be. */
static void send_frame(rdzv_peer *p, uint16_t t, uint32_t id, const struct sockaddr *sa) {
    rdzv_msg m = {.type = t, .req_id = id};
    uint8_t mem[RDZV_HEADER_LEN + 4];
    rdzv_buf b = {.data = mem, .cap = sizeof mem, .max = sizeof mem};
    if (rdzv_encode(&m, &b) != GPL_OK)
        return;
    uv_buf_t ub = uv_buf_init((char *)b.data, (unsigned)b.len);
    (void)uv_udp_try_send(&p->udp, &ub, 1, sa);
}

/* The address as text without the IPv4-mapped prefix, for comparing. */
static void ip_of(const struct sockaddr *sa, char *out, size_t len) {
    out[0] = '\0';
    if (sa->sa_family == AF_INET6)
        uv_ip6_name((const struct sockaddr_in6 *)(const void *)sa, out, len);
    else if (sa->sa_family == AF_INET)
        uv_ip4_name((const struct sockaddr_in *)(const void *)sa, out, len);
    if (strncmp(out, "::ffff:", 7) == 0 && strchr(out + 7, '.'))
        memmove(out, out + 7, strlen(out + 7) + 1);
}

static void finish(rdzv_peer *p, probe *pr, int ok, uint64_t now) {
    if (pr->used && (pr->flags & (RDZV_PROBE_KERNEL | RDZV_PROBE_MACHINE)))
        rdzv__kconn_stop(&pr->k);
    pr->used = 0;
    if (!p->closing)
        p->done(p->data, pr->id, ok, ok ? (uint32_t)(now - pr->start_ms) : 0);
}

static void on_recv(uv_udp_t *u, ssize_t nread, const uv_buf_t *buf, const struct sockaddr *from,
                    unsigned flags) {
    rdzv_peer *p = u->data;
    (void)flags;
    if (nread <= 0 || from == NULL || p->closing || p->muted)
        return;
    size_t flen = 0;
    rdzv_msg m;
    char why[128];
    if (rdzv_frame_peek((const uint8_t *)buf->base, (size_t)nread, &flen) != GPL_OK ||
        flen != (size_t)nread ||
        rdzv_decode((const uint8_t *)buf->base, flen, &m, why, sizeof why) != GPL_OK)
        return; /* not a probe: nothing is said back to a stranger */
    if (m.type == RDZV_PING) {
        send_frame(p, RDZV_PONG, m.req_id, from);
        return;
    }
    if (m.type != RDZV_PONG)
        return;
    char a[64], b[64];
    ip_of(from, a, sizeof a);
    for (int i = 0; i < RDZV_PEER_MAX_PROBES; i++) {
        probe *pr = &p->probes[i];
        if (!pr->used || pr->nonce != m.req_id)
            continue;
        ip_of((const struct sockaddr *)&pr->to, b, sizeof b);
        if (strcmp(a, b) == 0)
            finish(p, pr, RDZV_PROBE_OK_NODE, gb_now_ms());
        return;
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    rdzv_peer *p = h->data;
    (void)suggested;
    *buf = uv_buf_init(p->rx, sizeof p->rx);
}

static void on_tick(uv_timer_t *t) {
    rdzv_peer *p = t->data;
    uint64_t now = gb_now_ms();
    int active = 0;
    for (int i = 0; i < RDZV_PEER_MAX_PROBES; i++) {
        probe *pr = &p->probes[i];
        if (!pr->used)
            continue;
        int tcp = (pr->flags & (RDZV_PROBE_KERNEL | RDZV_PROBE_MACHINE)) != 0;
        /* the attempts are looked at once more at the deadline: one completed
         * since the last tick counts */
        int machine = tcp && !p->muted && rdzv__kconn_tick(&pr->k, now, RDZV_PEER_EVERY_MS / 2);
        if (machine && (pr->flags & RDZV_PROBE_MACHINE)) {
            finish(p, pr, RDZV_PROBE_OK_MACHINE, now);
            continue;
        }
        if (now >= pr->end_ms || p->muted) {
            finish(p, pr,
                   machine                            ? RDZV_PROBE_OK_MACHINE
                   : tcp && pr->k.unable && !p->muted ? RDZV_PROBE_OK_UNABLE
                                                      : RDZV_PROBE_OK_NONE,
                   now);
            continue;
        }
        if (!(pr->flags & RDZV_PROBE_MACHINE))
            send_frame(p, RDZV_PING, pr->nonce, (const struct sockaddr *)&pr->to);
        active = 1;
    }
    if (!active)
        uv_timer_stop(&p->tick);
}

/* A UDP socket bound to a port the kernel picks on every address, IPv6 and
 * IPv4 on one socket (*v6 = 1), IPv4 alone where IPv6 is off; -1 with errno. */
static int udp_socket(int *v6) {
    struct sockaddr_storage ss;
    *v6 = 0;
    int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        uv_ip6_addr("::", 0, (struct sockaddr_in6 *)&ss);
        if (bind(fd, (const struct sockaddr *)&ss, sizeof(struct sockaddr_in6)) == 0) {
            *v6 = 1;
            return fd;
        }
        close(fd);
    }
    fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    uv_ip4_addr("0.0.0.0", 0, (struct sockaddr_in *)&ss);
    if (fd >= 0 && bind(fd, (const struct sockaddr *)&ss, sizeof(struct sockaddr_in)) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static uint16_t port_of(int fd) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                          : ((struct sockaddr_in *)&ss)->sin_port);
}

gpl_result_t rdzv__peer_open(uv_loop_t *loop, rdzv_peer_done_cb done, void *data, rdzv_peer **out,
                             char *err, size_t errlen) {
    *out = NULL;
    rdzv_peer *p = calloc(1, sizeof *p);
    if (p == NULL) {
        snprintf(err, errlen, "out of memory");
        return GPL_ERR_NOMEM;
    }
    p->done = done;
    p->data = data;
    if (getrandom(&p->nonce, sizeof p->nonce, GRND_NONBLOCK) != (ssize_t)sizeof p->nonce)
        p->nonce = (uint32_t)gb_now_ns();
    uv_udp_init(loop, &p->udp);
    uv_timer_init(loop, &p->tick);
    p->udp.data = p->tick.data = p;
    p->handles = 2;
    /* the UDP port, and the TCP port of its number for kernel probes: a
     * number whose TCP port another program holds is given back for another */
    int r = 0, fd = -1, kfd = -1, kerr = 0;
    for (int i = 0; i < RDZV_KPROBE_PORT_TRIES; i++) {
        if (fd >= 0)
            close(fd);
        if ((fd = udp_socket(&p->v6)) < 0 || (p->port = port_of(fd)) == 0) {
            r = errno ? uv_translate_sys_error(errno) : UV_EADDRNOTAVAIL;
            break;
        }
        if ((kfd = rdzv__kport_listen(p->port, p->v6)) >= 0)
            break;
        kerr = errno; /* what the last try found, said below */
        if (kerr != EADDRINUSE)
            break;
    }
    if (r != 0 && fd >= 0)
        close(fd); /* its port unknown */
    if (r == 0 && (r = uv_udp_open(&p->udp, fd)) != 0)
        close(fd);
    if (r == 0)
        r = uv_udp_recv_start(&p->udp, on_alloc, on_recv);
    if (r != 0) {
        if (kfd >= 0)
            close(kfd);
        snprintf(err, errlen, "could not open a UDP port for peer probes: %s", uv_strerror(r));
        p->closing = 1;
        rdzv__peer_close(p);
        return GPL_ERR_SYSTEM;
    }
    int kr = kfd < 0 ? uv_translate_sys_error(kerr) : rdzv__kport_start(loop, kfd, &p->kport);
    if (kr != 0)
        GB_WARN("could not listen on TCP port %u for kernel probes (%s): a stopped or starved "
                "launcher on this node is told from a lost machine only by the heartbeat rules, "
                "which take about a second longer",
                (unsigned)p->port, uv_strerror(kr));
    *out = p;
    return GPL_OK;
}

uint16_t rdzv__peer_port(const rdzv_peer *p) { return p->port; }

int rdzv__peer_kernel(const rdzv_peer *p) { return p->kport != NULL; }

/* addr:port as this socket can send to it (IPv4 as IPv4-mapped on a dual
 * stack socket, IPv4-mapped as IPv4 on an IPv4 one); 0 when it cannot. */
static int target(const rdzv_peer *p, const char *addr, uint16_t port,
                  struct sockaddr_storage *to) {
    char v4[64];
    const char *mapped = strncmp(addr, "::ffff:", 7) == 0 ? addr + 7 : NULL;
    if (uv_ip4_addr(addr, port, (struct sockaddr_in *)to) == 0 ||
        (mapped && uv_ip4_addr(mapped, port, (struct sockaddr_in *)to) == 0)) {
        if (!p->v6)
            return 1;
        snprintf(v4, sizeof v4, "::ffff:%s", mapped ? mapped : addr);
        return uv_ip6_addr(v4, port, (struct sockaddr_in6 *)to) == 0;
    }
    return p->v6 && uv_ip6_addr(addr, port, (struct sockaddr_in6 *)to) == 0;
}

void rdzv__peer_probe(rdzv_peer *p, uint32_t id, const char *addr, uint16_t port,
                      uint32_t deadline_ms, uint16_t flags) {
    uint64_t now = gb_now_ms();
    probe *pr = NULL;
    for (int i = 0; i < RDZV_PEER_MAX_PROBES && pr == NULL; i++)
        if (!p->probes[i].used)
            pr = &p->probes[i];
    if (pr == NULL || p->muted || port == 0 || !target(p, addr, port, &pr->to)) {
        GB_DEBUG("peer probe of %s:%u not sent: %s", addr, port,
                 pr == NULL ? "too many in flight" : "not an address this socket reaches");
        probe none = {.id = id, .start_ms = now};
        /* a probe this node could not make says so (no word on the node): with its
         * probes all in flight, or, to a server that asks kernel probes, any */
        finish(p, pr ? pr : &none,
               (pr == NULL || flags) && !p->muted && port != 0 ? RDZV_PROBE_OK_UNABLE
                                                               : RDZV_PROBE_OK_NONE,
               now);
        return;
    }
    pr->used = 1;
    pr->id = id;
    pr->flags = flags & (RDZV_PROBE_KERNEL | RDZV_PROBE_MACHINE);
    if (++p->nonce == 0)
        p->nonce = 1;
    pr->nonce = p->nonce;
    pr->start_ms = now;
    pr->end_ms =
        now + (deadline_ms > RDZV_PEER_MAX_DEADLINE_MS ? RDZV_PEER_MAX_DEADLINE_MS : deadline_ms);
    if (pr->flags)
        rdzv__kconn_start(&pr->k, (const struct sockaddr *)&pr->to,
                          pr->to.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                       : sizeof(struct sockaddr_in),
                          (uint32_t)(pr->end_ms - now), now);
    if (!(pr->flags & RDZV_PROBE_MACHINE))
        send_frame(p, RDZV_PING, pr->nonce, (const struct sockaddr *)&pr->to);
    if (!uv_is_active((uv_handle_t *)&p->tick))
        uv_timer_start(&p->tick, on_tick, RDZV_PEER_EVERY_MS, RDZV_PEER_EVERY_MS);
}

void rdzv__peer_mute(rdzv_peer *p) {
    if (p == NULL)
        return;
    p->muted = 1;
    rdzv__kport_close(p->kport); /* the machine is gone too */
    p->kport = NULL;
}

void rdzv__peer_stop(rdzv_peer *p, int stopped) {
    if (p != NULL)
        p->muted = stopped; /* its machine (the TCP port) still answers */
}

void rdzv__peer_close(rdzv_peer *p) {
    if (p == NULL)
        return;
    p->closing = 1;
    for (int i = 0; i < RDZV_PEER_MAX_PROBES; i++)
        if (p->probes[i].used && p->probes[i].flags)
            rdzv__kconn_stop(&p->probes[i].k);
    rdzv__kport_close(p->kport);
    p->kport = NULL;
    uv_close((uv_handle_t *)&p->udp, on_closed);
    uv_close((uv_handle_t *)&p->tick, on_closed);
}
