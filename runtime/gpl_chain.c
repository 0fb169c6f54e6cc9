/* The state copy's chain (see gpl_chain.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "gb_time.h"
#include "gpl_int.h"
#include "gpl_chain.h"

#define CHAIN_MAGIC 0x47504c44u  /* 0x47504c43 before the state went in several flows */
#define CHAIN_IOV 64             /* buffers gathered into one send or receive */
#define CHAIN_GRACE_MS 1000      /* a dropped link: how long to wait for the round's end */
#define CHAIN_SOCKBUF (4u << 20) /* socket buffers: at most net.core.[rw]mem_max */
/* read from a sender on the same node per call, and how often it says how far it is */
#define CHAIN_CMA_STEP (4u << 20)
/* A link of the chain is this many TCP connections, each with its thread
 * and its slice of the state (as NCCL's socket transport opens several per
 * peer): one connection is bounded by the core that runs its sender, which
 * also carries the packets through the kernel's stack (one stream over the
 * test bed's virtual links moves about half of what it moves over
 * loopback); states under CHAIN_FLOW_MIN go in one. */
#define CHAIN_FLOWS 2
#define CHAIN_FLOW_MIN (16u << 20)

/* What a sender says first, then nbuf pairs {size, address} of its buffers.
 * cma: the receiver, on the same node, may read those buffers itself
 * (process_vm_readv) instead of taking the bytes through the socket; it
 * answers one byte, 1 when it will, and the sender then only says how far
 * its buffers are filled (8-byte counts). */
typedef struct chain_hdr {
    uint32_t magic, round, from, nbuf;
    uint64_t total;
    uint32_t pid, cma;
    uint32_t flows, pad; /* connections of the link; the others follow with a chain_hello */
} chain_hdr;

/* What each of a link's other connections says first: which flow it is. */
typedef struct chain_hello {
    uint32_t magic, round, from, flow;
} chain_hello;

/* A position in the state: buffer i, byte off of it. */
typedef struct chain_pos {
    int i;
    size_t off;
} chain_pos;

static void chain_advance(const gpl_chain *ch, chain_pos *p, size_t k) {
    while (k > 0 && p->i < ch->n) {
        size_t left = ch->bytes[p->i] - p->off;
        if (k < left) {
            p->off += k;
            return;
        }
        k -= left;
        p->i++;
        p->off = 0;
    }
}

/* The next at most limit bytes from p, as an iovec over the buffers. */
static int chain_iov(const gpl_chain *ch, chain_pos p, size_t limit, struct iovec *iov) {
    int k = 0;
    for (int i = p.i; i < ch->n && k < CHAIN_IOV && limit > 0; i++) {
        size_t off = i == p.i ? p.off : 0, m = ch->bytes[i] - off;
        if (m == 0)
            continue;
        m = m < limit ? m : limit;
        iov[k++] = (struct iovec){.iov_base = (uint8_t *)ch->bufs[i] + off, .iov_len = m};
        limit -= m;
    }
    return k;
}

/* A link of the chain dropped: the round's end when that is why (its notice
 * follows a peer's exit by milliseconds), else the peer's failure. */
static gpl_result_t chain_dropped(gpl_comm_t c, int peer, const char *how, int err) {
    uint64_t until = gb_now_ms() + CHAIN_GRACE_MS;
    while (c->rdzv && gb_now_ms() < until) {
        if (gpl_check_abort(c, UINT64_MAX, NULL) == GPL_ERR_ROUND_OVER)
            return GPL_ERR_ROUND_OVER;
        usleep(GPL_POLL_MS * 1000);
    }
    return gb_seterr(&c->err, GPL_ERR_PEER_FAILED,
                     "rank %d: rank %d %s during the state copy (%s #%llu)%s%s; the round must "
                     "be re-formed",
                     c->rank, peer, how, c->coll, (unsigned long long)c->seq, err ? ": " : "",
                     err ? strerror(err) : "");
}

gpl_result_t gpl_chain_listen(gpl_comm_t c, int *fd, int *port) {
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof sa;
    int buf = CHAIN_SOCKBUF;
    *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    /* set before listen: the accepted socket inherits the size and the
     * window scale it allows is chosen at the handshake */
    if (*fd >= 0)
        setsockopt(*fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    if (*fd < 0 || bind(*fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(*fd, 4) != 0 ||
        getsockname(*fd, (struct sockaddr *)&sa, &sl) != 0) {
        int e = errno;
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        return gb_seterr(&c->err, GPL_ERR_SYSTEM, "rank %d: cannot listen for the state copy: %s",
                         c->rank, strerror(e));
    }
    *port = ntohs(sa.sin_port);
    return GPL_OK;
}

/* Waits for fd to be ready for events, checking the round and the deadline. */
static gpl_result_t chain_wait(gpl_comm_t c, int fd, short events, uint64_t deadline,
                               const char *who) {
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int pr = poll(&p, 1, GPL_POLL_MS);
        if (pr > 0)
            return GPL_OK;
        if (pr < 0 && errno != EINTR)
            return gb_seterr(&c->err, GPL_ERR_SYSTEM, "poll: %s", strerror(errno));
        gpl_result_t rc = gpl_check_abort(c, deadline, who);
        if (rc != GPL_OK)
            return rc;
    }
}

/* All n bytes through a non-blocking socket to or from peer (the rank
 * before this one in the chain, or after: to_next), waiting as a collective
 * does. */
static gpl_result_t chain_io(gpl_comm_t c, int fd, void *p, size_t n, int send_, int peer,
                             int to_next, uint64_t deadline) {
    char who[64];
    snprintf(who, sizeof who, "rank %d (the state copy's %s)", peer,
             to_next ? "receiver" : "sender");
    for (size_t done = 0; done < n;) {
        ssize_t r = send_ ? send(fd, (uint8_t *)p + done, n - done, MSG_DONTWAIT | MSG_NOSIGNAL)
                          : recv(fd, (uint8_t *)p + done, n - done, MSG_DONTWAIT);
        if (r > 0)
            done += (size_t)r;
        else if (r == 0 || (errno != EAGAIN && errno != EINTR))
            return chain_dropped(c, peer,
                                 to_next ? "did not take the whole state" : "closed its link",
                                 r == 0 ? 0 : errno);
        else {
            gpl_result_t rc = chain_wait(c, fd, send_ ? POLLOUT : POLLIN, deadline, who);
            if (rc != GPL_OK)
                return rc;
        }
    }
    return GPL_OK;
}

/* One flow of a link: the bytes [lo, hi) of the state, over its own
 * connection to prev and to next, in its own thread (flow 0 in the caller's).
 * A helper thread's flow never touches the communicator: it ends on the
 * deadline or when told to stop, and says how it ended; the caller's flow
 * watches the round for all of them and turns the first failure into the
 * error. */
enum { FLOW_OK, FLOW_DROPPED, FLOW_UNREADABLE, FLOW_POLL, FLOW_TIMEOUT, FLOW_ABORT, FLOW_STOPPED };

typedef struct chain_flow {
    gpl_comm_t c; /* the caller's flow only */
    const gpl_chain *ch, *rv;
    int in, out, in_cma, out_cma;
    pid_t in_pid;
    size_t lo, hi;
    uint64_t deadline, next_check;
    atomic_int *stop;
    int done_fd; /* a helper's flow: written once it ends */
    /* how it ended */
    int fail, err, to_next;
    const char *how;
    gpl_result_t rc; /* FLOW_ABORT: what the round's check said */
    pthread_t thread;
    int threaded;
} chain_flow;

static void flow_fail(chain_flow *f, int fail, int to_next, const char *how, int err) {
    f->fail = fail;
    f->to_next = to_next;
    f->how = how;
    f->err = err;
}

/* Every GPL_POLL_MS: whether the flow goes on (another flow's failure, the
 * round's end or the deadline end it). */
static int flow_check(chain_flow *f, int to_next) {
    uint64_t now = gb_now_ms();
    if (now < f->next_check)
        return 0;
    f->next_check = now + GPL_POLL_MS;
    if (atomic_load(f->stop)) {
        flow_fail(f, FLOW_STOPPED, to_next, NULL, 0);
        return -1;
    }
    if (f->c != NULL) {
        char who[64];
        snprintf(who, sizeof who, "rank %d (the state copy's %s)",
                 to_next ? f->ch->next : f->ch->prev, to_next ? "receiver" : "sender");
        gpl_result_t rc = gpl_check_abort(f->c, f->deadline, who);
        if (rc != GPL_OK) {
            flow_fail(f, FLOW_ABORT, to_next, NULL, 0);
            f->rc = rc;
            return -1;
        }
    } else if (now >= f->deadline) {
        flow_fail(f, FLOW_TIMEOUT, to_next, NULL, 0);
        return -1;
    }
    return 0;
}

static int flow_poll(chain_flow *f, struct pollfd *p, int np, int to_next) {
    if (poll(p, (nfds_t)np, GPL_POLL_MS) < 0 && errno != EINTR) {
        flow_fail(f, FLOW_POLL, to_next, NULL, errno);
        return -1;
    }
    return flow_check(f, to_next);
}

/* One acknowledgement byte to or from a neighbour. */
static int flow_ack(chain_flow *f, int fd, int send_, int to_next) {
    uint8_t ack = 1;
    for (;;) {
        ssize_t r = send_ ? send(fd, &ack, 1, MSG_DONTWAIT | MSG_NOSIGNAL)
                          : recv(fd, &ack, 1, MSG_DONTWAIT);
        if (r == 1)
            return 0;
        if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
            flow_fail(f, FLOW_DROPPED, to_next,
                      to_next ? "did not take the whole state" : "closed its link",
                      r == 0 ? 0 : errno);
            return -1;
        }
        struct pollfd p = {.fd = fd, .events = send_ ? POLLOUT : POLLIN};
        if (flow_poll(f, &p, 1, to_next) != 0)
            return -1;
    }
}

/* Receives [lo, hi) from prev (or reads it from prev's memory) while passing
 * what has arrived on to next (or telling next how far it may read), then
 * the acknowledgements: next's first, then prev's. */
static void flow_run(chain_flow *f) {
    const gpl_chain *ch = f->ch;
    const size_t lo = f->lo, hi = f->hi;
    /* got: bytes here (all at the head); sent: bytes passed on, or said to be
     * there to a next rank that reads them itself; avail: what the sender
     * said it has, when this rank reads it. Both sides are tried before any
     * wait, so a forwarding rank keeps both links busy. */
    size_t got = f->in >= 0 ? lo : hi, sent = f->out >= 0 ? lo : hi, avail = lo;
    chain_pos gp = {0, 0}, sp;
    chain_advance(ch, &gp, lo);
    sp = gp;
    uint8_t said[64]; /* counts from the sender, as they come */
    size_t nsaid = 0;
    uint64_t tell = 0; /* a count being said to the next rank: tell_off of its 8 bytes sent */
    size_t tell_off = 8;
    f->next_check = gb_now_ms() + GPL_POLL_MS;
    while (got < hi || sent < hi) {
        struct iovec iov[CHAIN_IOV], riov[CHAIN_IOV];
        int moved = 0;
        if (got < hi && (!f->in_cma || avail == got)) {
            ssize_t r;
            if (f->in_cma) {
                r = recv(f->in, said + nsaid, sizeof said - nsaid, MSG_DONTWAIT);
                if (r > 0) {
                    nsaid += (size_t)r;
                    size_t k = nsaid / 8;
                    if (k) {
                        uint64_t v;
                        memcpy(&v, said + (k - 1) * 8, 8);
                        avail = v > hi ? hi : (size_t)v;
                        memmove(said, said + k * 8, nsaid - k * 8);
                        nsaid -= k * 8;
                    }
                }
            } else {
                struct msghdr m = {.msg_iov = iov,
                                   .msg_iovlen = (size_t)chain_iov(ch, gp, hi - got, iov)};
                r = recvmsg(f->in, &m, MSG_DONTWAIT);
                if (r > 0) {
                    got += (size_t)r;
                    chain_advance(ch, &gp, (size_t)r);
                }
            }
            if (r > 0)
                moved = 1;
            else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                flow_fail(f, FLOW_DROPPED, 0, "closed its link", r == 0 ? 0 : errno);
                return;
            }
        }
        if (f->in_cma && got < avail) {
            size_t m = avail - got < CHAIN_CMA_STEP ? avail - got : CHAIN_CMA_STEP;
            int nl = chain_iov(ch, gp, m, iov), nr = chain_iov(f->rv, gp, m, riov);
            ssize_t r =
                process_vm_readv(f->in_pid, iov, (unsigned long)nl, riov, (unsigned long)nr, 0);
            if (r <= 0) {
                flow_fail(f, FLOW_UNREADABLE, 0, "could not be read", r < 0 ? errno : 0);
                return;
            }
            got += (size_t)r;
            chain_advance(ch, &gp, (size_t)r);
            moved = 1;
        }
        if (f->out_cma && tell_off == 8 && sent < got &&
            (got - sent >= CHAIN_CMA_STEP || got == hi)) {
            tell = got;
            tell_off = 0;
        }
        if (f->out_cma && tell_off < 8) {
            ssize_t w = send(f->out, (uint8_t *)&tell + tell_off, 8 - tell_off,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w > 0 && (tell_off += (size_t)w) == 8)
                sent = (size_t)tell;
            if (w > 0)
                moved = 1;
            else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                flow_fail(f, FLOW_DROPPED, 1, "closed its link", errno);
                return;
            }
        } else if (!f->out_cma && sent < got) {
            struct msghdr m = {.msg_iov = iov,
                               .msg_iovlen = (size_t)chain_iov(ch, sp, got - sent, iov)};
            ssize_t w = sendmsg(f->out, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w > 0) {
                sent += (size_t)w;
                chain_advance(ch, &sp, (size_t)w);
                moved = 1;
            } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                flow_fail(f, FLOW_DROPPED, 1, "closed its link", errno);
                return;
            }
        }
        if (!moved) {
            struct pollfd p[2];
            int np = 0;
            if (got < hi)
                p[np++] = (struct pollfd){.fd = f->in, .events = POLLIN};
            if ((f->out_cma && tell_off < 8) || (!f->out_cma && sent < got))
                p[np++] = (struct pollfd){.fd = f->out, .events = POLLOUT};
            if (flow_poll(f, p, np, got >= hi) != 0)
                return;
        } else if (flow_check(f, got >= hi) != 0) {
            return;
        }
    }
    /* Done once every rank after this one has it all (the tail says so, each
     * rank passes it back): a sender's buffers stay as they are until then
     * (a rank on the same node may still be reading them), and a rank that
     * could not take the state fails its sender's call too. */
    if (f->out >= 0 && flow_ack(f, f->out, 0, 1) != 0)
        return;
    if (f->in >= 0)
        flow_ack(f, f->in, 1, 0);
}

static void *flow_thread(void *arg) {
    chain_flow *f = arg;
    flow_run(f);
    if (f->fail != FLOW_OK)
        atomic_store(f->stop, 1);
    uint64_t one = 1;
    while (write(f->done_fd, &one, sizeof one) < 0 && errno == EINTR)
        ;
    return NULL;
}

/* The error for a flow that did not finish (the caller's thread). */
static gpl_result_t flow_error(gpl_comm_t c, const chain_flow *f) {
    const gpl_chain *ch = f->ch;
    int peer = f->to_next ? ch->next : ch->prev;
    char who[64];
    switch (f->fail) {
    case FLOW_DROPPED:
    case FLOW_UNREADABLE:
        return chain_dropped(c, peer, f->how, f->err);
    case FLOW_POLL:
        return gb_seterr(&c->err, GPL_ERR_SYSTEM, "poll: %s", strerror(f->err));
    case FLOW_TIMEOUT:
        snprintf(who, sizeof who, "rank %d (the state copy's %s)", peer,
                 f->to_next ? "receiver" : "sender");
        return gpl_check_abort(c, f->deadline, who);
    case FLOW_ABORT:
        return f->rc;
    default:
        return GPL_OK;
    }
}

/* The flows a state of total bytes goes in: the same on every rank of the
 * chain (every rank passes the same sizes). */
static int chain_nflows(size_t total) { return total >= CHAIN_FLOW_MIN ? CHAIN_FLOWS : 1; }

gpl_result_t gpl_chain_copy(gpl_comm_t c, const gpl_chain *ch, uint64_t deadline) {
    int in[CHAIN_FLOWS], out[CHAIN_FLOWS], in_cma = 0, out_cma = 0, ptracer = 0, done_fd = -1;
    pid_t in_pid = 0;
    gpl_result_t rc = GPL_OK;
    char who[64];
    size_t total = 0;
    for (int i = 0; i < ch->n; i++)
        total += ch->bytes[i];
    const int nf = chain_nflows(total);
    for (int k = 0; k < CHAIN_FLOWS; k++)
        in[k] = out[k] = -1;
    chain_flow fl[CHAIN_FLOWS];
    atomic_int stop = 0;
    int started = 0;
    uint64_t *desc = malloc(((size_t)ch->n + 1) * 2 * sizeof *desc);
    void **raddr = malloc(((size_t)ch->n + 1) * sizeof *raddr);
    if (desc == NULL || raddr == NULL) {
        rc = gb_seterr(&c->err, GPL_ERR_NOMEM, "rank %d: state copy: out of memory", c->rank);
        goto out;
    }
    chain_hdr h = {0};
    /* the sender's buffers, to read them on this node */
    gpl_chain rv = {.bufs = raddr, .bytes = ch->bytes, .n = ch->n};
    if (ch->prev >= 0) {
        snprintf(who, sizeof who, "rank %d (the state copy's sender)", ch->prev);
        if ((rc = chain_wait(c, ch->listen_fd, POLLIN, deadline, who)) != GPL_OK)
            goto out;
        if ((in[0] = accept4(ch->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) < 0) {
            rc = gb_seterr(&c->err, GPL_ERR_SYSTEM, "rank %d: state copy: accept: %s", c->rank,
                           strerror(errno));
            goto out;
        }
        if ((rc = chain_io(c, in[0], &h, sizeof h, 0, ch->prev, 0, deadline)) != GPL_OK)
            goto out;
        if (h.magic != CHAIN_MAGIC || h.round != (uint32_t)c->round ||
            h.from != (uint32_t)ch->prev) {
            rc = gb_seterr(&c->err, GPL_ERR_PROTOCOL,
                           "rank %d: the state copy's link is not from rank %d of round %d (magic "
                           "%x, rank %u, round %u)",
                           c->rank, ch->prev, c->round, h.magic, h.from, h.round);
            goto out;
        }
        int same = h.nbuf == (uint32_t)ch->n && h.total == total && h.flows == (uint32_t)nf;
        if (same && (rc = chain_io(c, in[0], desc, (size_t)ch->n * 2 * sizeof *desc, 0, ch->prev, 0,
                                   deadline)) != GPL_OK)
            goto out;
        for (int i = 0; same && i < ch->n; i++) {
            same = desc[2 * i] == ch->bytes[i];
            raddr[i] = (void *)(uintptr_t)desc[2 * i + 1];
        }
        if (!same) {
            rc = gb_seterr(&c->err, GPL_ERR_INVALID_ARG,
                           "rank %d: rank %d sends %u buffers of %llu bytes in all and this rank "
                           "passes %d of %zu (or their sizes differ); every rank must pass the "
                           "same buffers and sizes to gpl_copy_state",
                           c->rank, ch->prev, h.nbuf, (unsigned long long)h.total, ch->n, total);
            goto out;
        }
        if (h.cma && total > 0) { /* can this rank read the sender's memory? */
            struct iovec l[1], r[1];
            uint8_t probe;
            chain_iov(&rv, (chain_pos){0, 0}, 1, r);
            l[0] = (struct iovec){&probe, 1};
            in_cma = process_vm_readv((pid_t)h.pid, l, 1, r, 1, 0) == 1;
            in_pid = (pid_t)h.pid;
        }
        uint8_t mode = (uint8_t)in_cma;
        if ((rc = chain_io(c, in[0], &mode, 1, 1, ch->prev, 0, deadline)) != GPL_OK)
            goto out;
        /* the other flows' connections, each saying which it is */
        for (int k = 1; k < nf; k++) {
            chain_hello hello = {0};
            int fd = -1;
            if ((rc = chain_wait(c, ch->listen_fd, POLLIN, deadline, who)) != GPL_OK)
                goto out;
            if ((fd = accept4(ch->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) < 0) {
                rc = gb_seterr(&c->err, GPL_ERR_SYSTEM, "rank %d: state copy: accept: %s", c->rank,
                               strerror(errno));
                goto out;
            }
            rc = chain_io(c, fd, &hello, sizeof hello, 0, ch->prev, 0, deadline);
            if (rc == GPL_OK && (hello.magic != CHAIN_MAGIC || hello.round != (uint32_t)c->round ||
                                 hello.from != (uint32_t)ch->prev || hello.flow < 1 ||
                                 hello.flow >= (uint32_t)nf || in[hello.flow] >= 0))
                rc = gb_seterr(&c->err, GPL_ERR_PROTOCOL,
                               "rank %d: the state copy's flow %u is not from rank %d of round "
                               "%d (magic %x, rank %u, round %u)",
                               c->rank, hello.flow, ch->prev, c->round, hello.magic, hello.from,
                               hello.round);
            if (rc != GPL_OK) {
                close(fd);
                goto out;
            }
            in[hello.flow] = fd;
        }
    }
    if (ch->next >= 0) {
        h = (chain_hdr){CHAIN_MAGIC,
                        (uint32_t)c->round,
                        (uint32_t)c->rank,
                        (uint32_t)ch->n,
                        total,
                        (uint32_t)getpid(),
                        0,
                        (uint32_t)nf,
                        0};
        if (ch->next_local && !getenv("GPULAUNCH_NO_CMA")) {
            /* the next rank on this node may read these buffers: Yama's
             * ptrace scope 1 needs this (without Yama it fails, harmlessly);
             * the next rank tries a read and says whether it can */
            h.cma = 1;
#ifdef PR_SET_PTRACER
            ptracer = prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0;
#endif
        }
        for (int i = 0; i < ch->n; i++) {
            desc[2 * i] = ch->bytes[i];
            desc[2 * i + 1] = (uint64_t)(uintptr_t)ch->bufs[i];
        }
        for (int k = 0; k < nf; k++) {
            char why[320] = "";
            if ((out[k] = gpl_dial(ch->next_host, ch->next_port, why, sizeof why)) < 0) {
                rc = chain_dropped(c, ch->next, "cannot be reached", 0);
                if (rc == GPL_ERR_PEER_FAILED)
                    gb_seterr(&c->err, rc, "rank %d: state copy: rank %d at %s:%d: %s", c->rank,
                              ch->next, ch->next_host, ch->next_port, why);
                goto out;
            }
            int one = 1, buf = CHAIN_SOCKBUF;
            setsockopt(out[k], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
            setsockopt(out[k], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            fcntl(out[k], F_SETFL, fcntl(out[k], F_GETFL) | O_NONBLOCK);
            if (k == 0) {
                uint8_t mode = 0;
                if ((rc = chain_io(c, out[0], &h, sizeof h, 1, ch->next, 1, deadline)) != GPL_OK ||
                    (rc = chain_io(c, out[0], desc, (size_t)ch->n * 2 * sizeof *desc, 1, ch->next,
                                   1, deadline)) != GPL_OK ||
                    (rc = chain_io(c, out[0], &mode, 1, 0, ch->next, 1, deadline)) != GPL_OK)
                    goto out;
                out_cma = mode == 1;
            } else {
                chain_hello hello = {CHAIN_MAGIC, (uint32_t)c->round, (uint32_t)c->rank,
                                     (uint32_t)k};
                if ((rc = chain_io(c, out[k], &hello, sizeof hello, 1, ch->next, 1, deadline)) !=
                    GPL_OK)
                    goto out;
            }
        }
    }
    /* flow k carries [total * k / nf, total * (k + 1) / nf), on page bounds */
    for (int k = 0; k < nf; k++) {
        fl[k] = (chain_flow){
            .c = k == 0 ? c : NULL,
            .ch = ch,
            .rv = &rv,
            .in = in[k],
            .out = out[k],
            .in_cma = in_cma,
            .out_cma = out_cma,
            .in_pid = in_pid,
            .lo = k == 0 ? 0 : (total / (size_t)nf * (size_t)k) & ~(size_t)4095,
            .hi = k + 1 == nf ? total : (total / (size_t)nf * (size_t)(k + 1)) & ~(size_t)4095,
            .deadline = deadline,
            .stop = &stop,
            .done_fd = -1};
    }
    if (nf > 1 && (done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) >= 0) {
        /* the helpers take no signal: the program's handlers run in its own threads */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        for (int k = 1; k < nf; k++) {
            fl[k].done_fd = done_fd;
            fl[k].threaded = pthread_create(&fl[k].thread, NULL, flow_thread, &fl[k]) == 0;
            started += fl[k].threaded;
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    flow_run(&fl[0]);
    if (fl[0].fail != FLOW_OK)
        atomic_store(&stop, 1);
    /* a flow without a thread runs here after the first (each flow's links
     * are its own, so the order cannot block) */
    for (int k = 1; k < nf; k++)
        if (!fl[k].threaded && !atomic_load(&stop)) {
            fl[k].c = c;
            flow_run(&fl[k]);
            if (fl[k].fail != FLOW_OK)
                atomic_store(&stop, 1);
        }
    /* the helpers' end, watching the round meanwhile */
    gpl_result_t watch = GPL_OK;
    for (int ended = 0; ended < started;) {
        struct pollfd p = {.fd = done_fd, .events = POLLIN};
        uint64_t v;
        if (poll(&p, 1, GPL_POLL_MS) > 0 && read(done_fd, &v, sizeof v) == (ssize_t)sizeof v)
            ended += (int)v;
        if (watch == GPL_OK && !atomic_load(&stop) && ended < started) {
            watch = gpl_check_abort(c, deadline, "the state copy's other flows");
            if (watch != GPL_OK)
                atomic_store(&stop, 1);
        }
    }
    for (int k = 1; k < nf; k++)
        if (fl[k].threaded)
            pthread_join(fl[k].thread, NULL);
    /* the first failure that was not another's consequence */
    for (int k = 0; k < nf && rc == GPL_OK; k++)
        if (fl[k].fail != FLOW_OK && fl[k].fail != FLOW_STOPPED)
            rc = flow_error(c, &fl[k]);
    if (rc == GPL_OK)
        rc = watch;
out:
    if (ch->listen_fd >= 0)
        close(ch->listen_fd);
    for (int k = 0; k < CHAIN_FLOWS; k++) {
        if (in[k] >= 0)
            close(in[k]);
        if (out[k] >= 0)
            close(out[k]);
    }
    if (done_fd >= 0)
        close(done_fd);
#ifdef PR_SET_PTRACER
    if (ptracer && !c->cma) /* no longer readable, unless the all-reduce reads it */
        prctl(PR_SET_PTRACER, 0, 0, 0, 0);
#endif
    free(desc);
    free(raddr);
    return rc;
}
