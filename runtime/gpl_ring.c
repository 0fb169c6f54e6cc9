/* The ring of node leaders (local rank 0 of each node) over TCP: ring
 * reduce-scatter + all-gather for all-reduce, ring all-gather, pipelined
 * broadcast. Leaders find each other through the rendezvous store. Sends and
 * receives run together on non-blocking sockets, so no step can deadlock on
 * full socket buffers; waits check the deadline and the rendezvous. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gb_time.h"
#include "gpl_int.h"

#define RING_MAGIC 0x47504c47u
#define RING_NOTE_FIRST_MS 2000  /* a next node not reached: said after this */
#define RING_NOTE_EVERY_MS 10000 /* ... and again this often */
#define BCAST_CHUNK (1u << 20)
#define RING_SMALL_BYTES 4096u /* all-reduce by all-gather up to this size */

struct gpl_ring {
    int listen_fd, next_fd, prev_fd;
    int n, me;
    char next_host[256];
    int next_port;
    uint8_t *tmp;
    size_t tmp_len;
};

int gpl_ring_node_base(gpl_comm_t c, int node) { return c->node_base ? c->node_base[node] : 0; }
int gpl_ring_node_size(gpl_comm_t c, int node) {
    return c->node_size ? c->node_size[node] : c->local_world;
}

static void tune(int fd) {
    int one = 1, buf = 4 << 20;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Sends s and receives r at the same time. */
static gpl_result_t xfer(gpl_comm_t c, const void *s, size_t slen, void *r, size_t rlen,
                         uint64_t deadline) {
    gpl_ring *g = c->ring;
    const uint8_t *sp = s;
    uint8_t *rp = r;
    uint64_t next_check = gb_now_ms() + GPL_POLL_MS;
    while (slen || rlen) {
        struct pollfd p[2];
        int np = 0, si = -1, ri = -1;
        if (slen) {
            p[np] = (struct pollfd){.fd = g->next_fd, .events = POLLOUT};
            si = np++;
        }
        if (rlen) {
            p[np] = (struct pollfd){.fd = g->prev_fd, .events = POLLIN};
            ri = np++;
        }
        int pr = poll(p, (nfds_t)np, GPL_POLL_MS);
        if (pr < 0 && errno != EINTR)
            return gb_seterr(&c->err, GPL_ERR_SYSTEM, "poll: %s", strerror(errno));
        if (si >= 0 && (p[si].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t w = send(g->next_fd, sp, slen, MSG_NOSIGNAL);
            if (w < 0 && errno != EAGAIN && errno != EINTR) {
                int nx = (g->me + 1) % g->n;
                return gb_seterr(&c->err, GPL_ERR_PEER_FAILED,
                                 "rank %d: node %d (%s, ranks %d-%d) dropped its link during %s "
                                 "#%llu: %s",
                                 c->rank, nx, c->node_host[nx], c->node_base[nx],
                                 c->node_base[nx] + c->node_size[nx] - 1, c->coll,
                                 (unsigned long long)c->seq, strerror(errno));
            }
            if (w > 0) {
                sp += w;
                slen -= (size_t)w;
            }
        }
        if (ri >= 0 && (p[ri].revents & (POLLIN | POLLERR | POLLHUP))) {
            ssize_t rd = recv(g->prev_fd, rp, rlen, 0);
            if (rd == 0 || (rd < 0 && errno != EAGAIN && errno != EINTR)) {
                int pv = (g->me + g->n - 1) % g->n;
                return gb_seterr(&c->err, GPL_ERR_PEER_FAILED,
                                 "rank %d: node %d (%s, ranks %d-%d) dropped its link during %s "
                                 "#%llu",
                                 c->rank, pv, c->node_host[pv], c->node_base[pv],
                                 c->node_base[pv] + c->node_size[pv] - 1, c->coll,
                                 (unsigned long long)c->seq);
            }
            if (rd > 0) {
                rp += rd;
                rlen -= (size_t)rd;
            }
        }
        uint64_t now = gb_now_ms();
        if (now >= next_check) {
            next_check = now + GPL_POLL_MS;
            /* the peer we still wait for: the sender while receiving, else the receiver */
            int pn = rlen ? (g->me + g->n - 1) % g->n : (g->me + 1) % g->n;
            char who[300];
            snprintf(who, sizeof who, "node %d (%s, ranks %d-%d)", pn, c->node_host[pn],
                     c->node_base[pn], c->node_base[pn] + c->node_size[pn] - 1);
            gpl_result_t rc = gpl_check_abort(c, deadline, who);
            if (rc != GPL_OK)
                return rc;
        }
    }
    return GPL_OK;
}

int gpl_dial(const char *host, int port, char *why, size_t whylen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int ge = getaddrinfo(host, ps, &hints, &res);
    if (ge != 0) {
        snprintf(why, whylen, "the name %s does not resolve here (%s)", host, gai_strerror(ge));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            snprintf(why, whylen, "connect: %s", strerror(errno));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

gpl_result_t gpl_ring_publish(gpl_comm_t c) {
    gpl_ring *g = calloc(1, sizeof *g);
    if (g == NULL)
        return gb_seterr(&c->err, GPL_ERR_NOMEM, "out of memory");
    c->ring = g;
    g->n = c->nnodes;
    g->me = c->node_rank;
    g->next_fd = g->prev_fd = -1;
    g->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof sa;
    if (g->listen_fd < 0 || bind(g->listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(g->listen_fd, 16) != 0 ||
        getsockname(g->listen_fd, (struct sockaddr *)&sa, &sl) != 0)
        return gb_seterr(&c->err, GPL_ERR_SYSTEM, "rank %d: cannot listen for the node ring: %s",
                         c->rank, strerror(errno));
    const char *addr = getenv("GPULAUNCH_NODE_ADDR");
    char val[600];
    snprintf(val, sizeof val, "%s %d %d %d %s", addr && *addr ? addr : c->hostname,
             ntohs(sa.sin_port), c->base_rank, c->local_world, c->hostname);
    char key[64];
    snprintf(key, sizeof key, "gpl/%u/ring/%d", c->inst, c->node_rank);
    gpl_result_t rc = rdzv_bclient_set(c->rdzv, key, val, strlen(val));
    if (rc != GPL_OK)
        return gb_seterr(&c->err, rc, "rank %d: %s", c->rank, rdzv_bclient_error(c->rdzv));
    return GPL_OK;
}

gpl_result_t gpl_nodes_load(gpl_comm_t c) {
    int n = c->nnodes;
    c->node_base = calloc((size_t)n, sizeof *c->node_base);
    c->node_size = calloc((size_t)n, sizeof *c->node_size);
    c->node_host = calloc((size_t)n, sizeof *c->node_host);
    char **keys = calloc((size_t)n, sizeof *keys);
    void **vals = calloc((size_t)n, sizeof *vals);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    gpl_result_t rc = GPL_OK;
    if (!c->node_base || !c->node_size || !c->node_host || !keys || !vals || !lens) {
        rc = gb_seterr(&c->err, GPL_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        keys[i] = malloc(32);
        if (keys[i] == NULL) {
            rc = gb_seterr(&c->err, GPL_ERR_NOMEM, "out of memory");
            goto out;
        }
        snprintf(keys[i], 32, "gpl/%u/ring/%d", c->inst, i);
    }
    rc = rdzv_bclient_wait(c->rdzv, (const char *const *)keys, (size_t)n, c->timeout_ms);
    if (rc == GPL_OK)
        rc = rdzv_bclient_mget(c->rdzv, (const char *const *)keys, (size_t)n, vals, lens);
    if (rc != GPL_OK) {
        gb_seterr(&c->err, rc, "rank %d: node leaders did not all publish their address: %s",
                  c->rank, rdzv_bclient_error(c->rdzv));
        goto out;
    }
    for (int i = 0; i < n; i++) {
        char buf[600], h[256], hn[256];
        int port = 0, base = 0, size = 0;
        snprintf(buf, sizeof buf, "%.*s", (int)lens[i], vals[i] ? (char *)vals[i] : "");
        if (sscanf(buf, "%255s %d %d %d %255s", h, &port, &base, &size, hn) != 5) {
            rc = gb_seterr(&c->err, GPL_ERR_PROTOCOL, "bad ring entry for node %d: '%s'", i, buf);
            goto out;
        }
        c->node_base[i] = base;
        c->node_size[i] = size;
        snprintf(c->node_host[i], sizeof c->node_host[i], "%s", hn);
        if (c->ring && i == (c->node_rank + 1) % n) {
            snprintf(c->ring->next_host, sizeof c->ring->next_host, "%s", h);
            c->ring->next_port = port;
        }
    }
out:
    for (int i = 0; keys && i < n; i++) {
        free(keys[i]);
        if (vals)
            free(vals[i]);
    }
    free(keys);
    free(vals);
    free(lens);
    return rc;
}

gpl_result_t gpl_ring_setup(gpl_comm_t c) {
    gpl_ring *g = c->ring;
    uint64_t t0 = gb_now_ms(), deadline = t0 + c->timeout_ms, next_note = t0 + RING_NOTE_FIRST_MS;
    char why[320] = "";
    while ((g->next_fd = gpl_dial(g->next_host, g->next_port, why, sizeof why)) < 0) {
        uint64_t now = gb_now_ms();
        if (now > deadline)
            return gb_seterr(&c->err, GPL_ERR_TIMEOUT,
                             "rank %d: cannot connect to node %d at %s:%d for %.0f s: %s; the "
                             "address is the one its launcher advertises (--local-addr)",
                             c->rank, (g->me + 1) % g->n, g->next_host, g->next_port,
                             (double)(now - t0) / 1000.0, why);
        /* a peer's name may take a while to appear in DNS: said, not silent */
        if (now >= next_note) {
            fprintf(stderr,
                    "gpulaunch runtime: rank %d: node %d at %s:%d not reached for %.0f s: %s; "
                    "still trying for %.0f s\n",
                    c->rank, (g->me + 1) % g->n, g->next_host, g->next_port,
                    (double)(now - t0) / 1000.0, why, (double)(deadline - now) / 1000.0);
            next_note = now + RING_NOTE_EVERY_MS;
        }
        /* a round that ends meanwhile (a node lost while the ring forms) */
        gpl_result_t rc = gpl_check_abort(c, deadline, "the ring's next node");
        if (rc != GPL_OK)
            return rc;
        usleep(20000);
    }
    uint32_t hello[2] = {RING_MAGIC, (uint32_t)g->me};
    if (send(g->next_fd, hello, sizeof hello, MSG_NOSIGNAL) != (ssize_t)sizeof hello)
        return gb_seterr(&c->err, GPL_ERR_SYSTEM, "ring hello: %s", strerror(errno));
    struct pollfd p = {.fd = g->listen_fd, .events = POLLIN};
    if (poll(&p, 1, (int)c->timeout_ms) <= 0)
        return gb_seterr(&c->err, GPL_ERR_TIMEOUT, "rank %d: node %d never connected to the ring",
                         c->rank, (g->me + g->n - 1) % g->n);
    g->prev_fd = accept4(g->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    uint32_t got[2] = {0, 0};
    if (g->prev_fd < 0 || recv(g->prev_fd, got, sizeof got, MSG_WAITALL) != (ssize_t)sizeof got ||
        got[0] != RING_MAGIC || got[1] != (uint32_t)((g->me + g->n - 1) % g->n))
        return gb_seterr(&c->err, GPL_ERR_PROTOCOL,
                         "rank %d: the ring peer is not node %d (got magic %x node %u)", c->rank,
                         (g->me + g->n - 1) % g->n, got[0], got[1]);
    tune(g->next_fd);
    tune(g->prev_fd);
    return GPL_OK;
}

void gpl_ring_teardown(gpl_comm_t c) {
    gpl_ring *g = c->ring;
    if (g == NULL)
        return;
    if (g->listen_fd >= 0)
        close(g->listen_fd);
    if (g->next_fd >= 0)
        close(g->next_fd);
    if (g->prev_fd >= 0)
        close(g->prev_fd);
    free(g->tmp);
    free(g);
    c->ring = NULL;
}

static gpl_result_t need_tmp(gpl_comm_t c, size_t n) {
    gpl_ring *g = c->ring;
    if (g->tmp_len >= n)
        return GPL_OK;
    uint8_t *t = realloc(g->tmp, n);
    if (t == NULL)
        return gb_seterr(&c->err, GPL_ERR_NOMEM, "out of memory (%zu bytes)", n);
    g->tmp = t;
    g->tmp_len = n;
    return GPL_OK;
}

gpl_result_t gpl_ring_allreduce(gpl_comm_t c, void *buf, size_t count, gpl_dtype_t t, gpl_op_t op,
                                uint64_t deadline) {
    gpl_ring *g = c->ring;
    int n = g->n;
    size_t es = gpl_dtype_size(t);
    uint8_t *b = buf;
    gpl_result_t rc;
    if (count == 0)
        return GPL_OK;
    if (count * es <= RING_SMALL_BYTES) {
        /* latency-bound: gather every node's whole buffer (n - 1 steps, not
         * the 2(n - 1) of reduce-scatter + all-gather), then every node
         * reduces the n buffers in node order, so all get the same bits */
        size_t bytes = count * es;
        if ((rc = need_tmp(c, (size_t)n * bytes)) != GPL_OK)
            return rc;
        memcpy(g->tmp + (size_t)g->me * bytes, b, bytes);
        for (int s = 0; s < n - 1; s++) {
            int si = ((g->me - s) % n + n) % n, ri = ((g->me - s - 1) % n + n) % n;
            rc = xfer(c, g->tmp + (size_t)si * bytes, bytes, g->tmp + (size_t)ri * bytes, bytes,
                      deadline);
            if (rc != GPL_OK)
                return rc;
        }
        memcpy(b, g->tmp, bytes);
        for (int i = 1; i < n; i++)
            gpl_reduce_into(b, g->tmp + (size_t)i * bytes, count, t, op);
        return GPL_OK;
    }
    size_t seg = (count + (size_t)n - 1) / (size_t)n;
    if ((rc = need_tmp(c, seg * es)) != GPL_OK)
        return rc;
#define SEG_OFF(i) ((size_t)(i)*seg < count ? (size_t)(i)*seg : count)
#define SEG_LEN(i) (SEG_OFF((i) + 1) - SEG_OFF(i))
    for (int s = 0; s < n - 1; s++) {
        int si = ((g->me - s) % n + n) % n, ri = ((g->me - s - 1) % n + n) % n;
        rc = xfer(c, b + SEG_OFF(si) * es, SEG_LEN(si) * es, g->tmp, SEG_LEN(ri) * es, deadline);
        if (rc != GPL_OK)
            return rc;
        gpl_reduce_into(b + SEG_OFF(ri) * es, g->tmp, SEG_LEN(ri), t, op);
    }
    for (int s = 0; s < n - 1; s++) {
        int si = ((g->me - s + 1) % n + n) % n, ri = ((g->me - s) % n + n) % n;
        rc = xfer(c, b + SEG_OFF(si) * es, SEG_LEN(si) * es, b + SEG_OFF(ri) * es, SEG_LEN(ri) * es,
                  deadline);
        if (rc != GPL_OK)
            return rc;
    }
#undef SEG_OFF
#undef SEG_LEN
    return GPL_OK;
}

gpl_result_t gpl_ring_allgather(gpl_comm_t c, void *buf, const size_t *off, const size_t *len,
                                uint64_t deadline) {
    gpl_ring *g = c->ring;
    int n = g->n;
    uint8_t *b = buf;
    for (int s = 0; s < n - 1; s++) {
        int si = ((g->me - s) % n + n) % n, ri = ((g->me - s - 1) % n + n) % n;
        gpl_result_t rc = xfer(c, b + off[si], len[si], b + off[ri], len[ri], deadline);
        if (rc != GPL_OK)
            return rc;
    }
    return GPL_OK;
}

gpl_result_t gpl_ring_bcast(gpl_comm_t c, void *buf, size_t bytes, int root, uint64_t deadline) {
    gpl_ring *g = c->ring;
    int next_is_root = (g->me + 1) % g->n == root;
    uint8_t *b = buf;
    for (size_t off = 0; off < bytes; off += BCAST_CHUNK) {
        size_t n = bytes - off < BCAST_CHUNK ? bytes - off : BCAST_CHUNK;
        gpl_result_t rc;
        if (g->me != root) {
            rc = xfer(c, NULL, 0, b + off, n, deadline);
            if (rc != GPL_OK)
                return rc;
        }
        if (!next_is_root) {
            rc = xfer(c, b + off, n, NULL, 0, deadline);
            if (rc != GPL_OK)
                return rc;
        }
    }
    return GPL_OK;
}
