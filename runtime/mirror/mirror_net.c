/* The mirror's wire (see mirror_int.h): each mirror's server thread takes
 * its buddies' pushes into held slots and serves fetches; a push is sent by
 * a thread of its own; a fetch is the caller's. Blocking sockets with the
 * mirror's timeout on every send and receive. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gb_thread.h"
#include "gb_time.h"
#include "mirror_int.h"

static void set_timeouts(int fd, uint32_t ms) {
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    int one = 1, buf = MIRROR_SOCKBUF;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
}

/* All n bytes; 0, or errno (ETIMEDOUT for a timeout, EPIPE for a close). */
static int io_all(int fd, void *p, size_t n, int send_) {
    for (size_t done = 0; done < n;) {
        ssize_t r = send_ ? send(fd, (uint8_t *)p + done, n - done, MSG_NOSIGNAL)
                          : recv(fd, (uint8_t *)p + done, n - done, 0);
        if (r > 0)
            done += (size_t)r;
        else if (r == 0)
            return EPIPE;
        else if (errno == EAGAIN || errno == EWOULDBLOCK)
            return ETIMEDOUT;
        else if (errno != EINTR)
            return errno;
    }
    return 0;
}

gpl_result_t mirror_listen(gb_err *e, int *fd, int *port) {
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof sa;
    int buf = MIRROR_SOCKBUF;
    *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (*fd >= 0)
        setsockopt(*fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    if (*fd < 0 || bind(*fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(*fd, MIRROR_HANDLERS_MAX) != 0 ||
        getsockname(*fd, (struct sockaddr *)&sa, &sl) != 0) {
        int err = errno;
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        return gb_seterr(e, GPL_ERR_SYSTEM, "mirror: cannot listen for peers' copies: %s",
                         strerror(err));
    }
    *port = ntohs(sa.sin_port);
    return GPL_OK;
}

static int dial(const char *addr, int port, uint32_t timeout_ms, int *err) {
    char svc[16];
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    snprintf(svc, sizeof svc, "%d", port);
    int g = getaddrinfo(addr, svc, &hints, &ai);
    if (g != 0) {
        *err = EHOSTUNREACH;
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *err = errno;
        freeaddrinfo(ai);
        return -1;
    }
    set_timeouts(fd, timeout_ms);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        *err = errno == EINPROGRESS ? ETIMEDOUT : errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

void mirror_hash(void *const bufs[], const size_t sizes[], int n,
                 unsigned char digest[MIRROR_DIGEST]) {
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    unsigned int dl = 0;
    EVP_DigestInit_ex(h, EVP_sha256(), NULL);
    for (int i = 0; i < n; i++)
        EVP_DigestUpdate(h, bufs[i], sizes[i]);
    EVP_DigestFinal_ex(h, digest, &dl);
    EVP_MD_CTX_free(h);
}

/* The n buffers through fd, hashed as they go, then the digest: sent after
 * them (send_: digest gets it), or received and compared with the hash of
 * what came (*match). stop (read under mu) cuts a receive off when set. */
static int stream_bufs(int fd, void *const bufs[], const size_t sizes[], int n, int send_,
                       const int *stop, pthread_mutex_t *mu, unsigned char digest[MIRROR_DIGEST],
                       int *match) {
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    int err = h && EVP_DigestInit_ex(h, EVP_sha256(), NULL) == 1 ? 0 : ENOMEM;
    for (int i = 0; i < n && !err; i++)
        for (size_t off = 0; off < sizes[i] && !err;) {
            size_t k = sizes[i] - off < MIRROR_PIECE ? sizes[i] - off : MIRROR_PIECE;
            uint8_t *p = (uint8_t *)bufs[i] + off;
            if (send_)
                EVP_DigestUpdate(h, p, k);
            err = io_all(fd, p, k, send_);
            if (!err && !send_)
                EVP_DigestUpdate(h, p, k);
            off += k;
            if (stop && mu) {
                pthread_mutex_lock(mu);
                if (*stop)
                    err = ECANCELED;
                pthread_mutex_unlock(mu);
            }
        }
    unsigned char mine[MIRROR_DIGEST];
    if (!err) {
        unsigned int dl = 0;
        EVP_DigestFinal_ex(h, send_ ? digest : mine, &dl);
        err = io_all(fd, digest, MIRROR_DIGEST, send_);
        if (!send_)
            *match = !err && memcmp(mine, digest, MIRROR_DIGEST) == 0;
    }
    EVP_MD_CTX_free(h);
    return err;
}

/* ---- the server ---- */

typedef struct handler_arg {
    gpl_mirror_t m;
    int fd, idx;
} handler_arg;

/* A slot for owner's next copy: never the newest checked one. */
static mirror_slot *push_slot(gpl_mirror_t m, int owner, int round) {
    mirror_slot *newest = NULL, *other = NULL, *free_ = NULL;
    for (int i = 0; i < MIRROR_SLOTS_MAX; i++) {
        mirror_slot *s = &m->slot[i];
        if (!s->used) {
            if (!free_)
                free_ = s;
            continue;
        }
        if (s->owner != owner)
            continue;
        if (s->round != round || !s->valid) {
            other = other ? other : s;
            continue;
        }
        if (!newest || s->step > newest->step) {
            if (newest)
                other = newest;
            newest = s;
        } else
            other = s;
    }
    mirror_slot *s = other ? other : free_;
    if (!s || s->writing || s->readers)
        return NULL;
    s->used = 1;
    s->owner = owner;
    s->round = round;
    s->valid = 0;
    s->writing = 1;
    return s;
}

static void take_push(gpl_mirror_t m, int fd, const mirror_hdr *h) {
    uint8_t ans = MIRROR_ANS_REFUSED;
    uint64_t sizes[GPL_MIRROR_MAX_BUFS];
    if (h->nbuf < 0 || h->nbuf > GPL_MIRROR_MAX_BUFS ||
        io_all(fd, sizes, sizeof(uint64_t) * (size_t)h->nbuf, 0) != 0)
        return;
    uint64_t total = 0;
    for (int i = 0; i < h->nbuf; i++)
        total += sizes[i];
    if (total != h->total)
        return;
    pthread_mutex_lock(&m->mu);
    mirror_slot *s = m->frozen || m->stop ? NULL : push_slot(m, h->owner, h->round);
    pthread_mutex_unlock(&m->mu);
    if (!s) {
        io_all(fd, &ans, 1, 1);
        return;
    }
    if (s->cap < total) {
        uint8_t *d = realloc(s->data, total ? total : 1);
        if (d) {
            s->data = d;
            s->cap = total;
        }
    }
    int match = 0, err = ENOMEM;
    if (s->cap >= total) {
        void *bufs[GPL_MIRROR_MAX_BUFS];
        size_t bs[GPL_MIRROR_MAX_BUFS];
        size_t off = 0;
        for (int i = 0; i < h->nbuf; i++) {
            bufs[i] = s->data + off;
            bs[i] = sizes[i];
            off += sizes[i];
        }
        err = stream_bufs(fd, bufs, bs, h->nbuf, 0, &m->frozen, &m->mu, s->digest, &match);
    }
    pthread_mutex_lock(&m->mu);
    s->writing = 0;
    pthread_cond_broadcast(&m->cv); /* freeze() waits for it */
    if (!err && match && !m->frozen) {
        s->valid = 1;
        s->step = h->step;
        s->nbuf = h->nbuf;
        s->total = total;
        memcpy(s->sizes, sizes, sizeof(uint64_t) * (size_t)h->nbuf);
        ans = MIRROR_ANS_OK;
    } else
        ans = !err && !match ? MIRROR_ANS_BAD : MIRROR_ANS_REFUSED;
    pthread_mutex_unlock(&m->mu);
    if (!err)
        io_all(fd, &ans, 1, 1);
}

static void serve_fetch(gpl_mirror_t m, int fd, const mirror_hdr *h) {
    mirror_hdr a = {.magic = MIRROR_MAGIC, .kind = MIRROR_ANS_NONE};
    void *bufs[GPL_MIRROR_MAX_BUFS];
    size_t sizes[GPL_MIRROR_MAX_BUFS];
    uint64_t wire[GPL_MIRROR_MAX_BUFS];
    unsigned char digest[MIRROR_DIGEST];
    mirror_slot *from = NULL;
    pthread_mutex_lock(&m->mu);
    if (h->owner == m->rank && h->round == m->round && h->step == m->own_step && m->own_digest_ok) {
        a.nbuf = m->nbuf;
        for (int i = 0; i < m->nbuf; i++) {
            bufs[i] = m->bufs[i];
            sizes[i] = m->sizes[i];
        }
        memcpy(digest, m->own_digest, sizeof digest);
        a.kind = MIRROR_ANS_OK;
    } else
        for (int i = 0; i < MIRROR_SLOTS_MAX; i++) {
            mirror_slot *s = &m->slot[i];
            if (s->used && s->valid && s->owner == h->owner && s->round == h->round &&
                s->step == h->step) {
                from = s;
                s->readers++;
                a.nbuf = s->nbuf;
                size_t off = 0;
                for (int k = 0; k < s->nbuf; k++) {
                    bufs[k] = s->data + off;
                    sizes[k] = s->sizes[k];
                    off += s->sizes[k];
                }
                memcpy(digest, s->digest, sizeof digest);
                a.kind = MIRROR_ANS_OK;
                break;
            }
        }
    pthread_mutex_unlock(&m->mu);
    a.owner = h->owner;
    a.round = h->round;
    a.step = h->step;
    for (int i = 0; i < a.nbuf; i++) {
        wire[i] = sizes[i];
        a.total += sizes[i];
    }
    int err = io_all(fd, &a, sizeof a, 1);
    if (!err && a.kind == MIRROR_ANS_OK)
        err = io_all(fd, wire, sizeof(uint64_t) * (size_t)a.nbuf, 1);
    /* the bytes, then the digest they were checked against when received
     * (or sent, for this rank's own): the fetcher hashes what it gets */
    for (int i = 0; i < a.nbuf && !err && a.kind == MIRROR_ANS_OK; i++)
        err = io_all(fd, bufs[i], sizes[i], 1);
    if (!err && a.kind == MIRROR_ANS_OK)
        io_all(fd, digest, sizeof digest, 1);
    if (from) {
        pthread_mutex_lock(&m->mu);
        from->readers--;
        pthread_mutex_unlock(&m->mu);
    }
}

static void *handler_main(void *p) {
    handler_arg *a = p;
    gpl_mirror_t m = a->m;
    mirror_hdr h;
    if (io_all(a->fd, &h, sizeof h, 0) == 0 && h.magic == MIRROR_MAGIC) {
        if (h.kind == MIRROR_PUSH)
            take_push(m, a->fd, &h);
        else if (h.kind == MIRROR_FETCH)
            serve_fetch(m, a->fd, &h);
    }
    pthread_mutex_lock(&m->mu);
    m->handler_fd[a->idx] = -1;
    close(a->fd);
    m->handlers--;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    free(a);
    return NULL;
}

static void *server_main(void *p) {
    gpl_mirror_t m = p;
    gb_thread_background("gpl-mirror-serve"); /* its handlers inherit name and priority */
    for (;;) {
        struct pollfd pf[2] = {{.fd = m->listen_fd, .events = POLLIN},
                               {.fd = m->wake_fd, .events = POLLIN}};
        if (poll(pf, 2, -1) < 0 && errno != EINTR)
            break;
        if (pf[1].revents)
            break;
        if (!(pf[0].revents & POLLIN))
            continue;
        int fd = accept4(m->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        set_timeouts(fd, m->timeout_ms);
        pthread_mutex_lock(&m->mu);
        int idx = -1;
        for (int i = 0; i < MIRROR_HANDLERS_MAX && idx < 0 && !m->stop; i++)
            if (m->handler_fd[i] < 0)
                idx = i;
        handler_arg *a = idx >= 0 ? malloc(sizeof *a) : NULL;
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (a) {
            *a = (handler_arg){.m = m, .fd = fd, .idx = idx};
            m->handler_fd[idx] = fd;
            m->handlers++;
            if (pthread_create(&t, &at, handler_main, a) != 0) {
                m->handler_fd[idx] = -1;
                m->handlers--;
                free(a);
                a = NULL;
            }
        }
        pthread_attr_destroy(&at);
        pthread_mutex_unlock(&m->mu);
        if (!a)
            close(fd); /* too many at once: the peer sees the close and says so */
    }
    return NULL;
}

gpl_result_t mirror_serve_start(gpl_mirror_t m) {
    m->wake_fd = eventfd(0, EFD_CLOEXEC);
    if (m->wake_fd < 0)
        return gb_seterr(&m->err, GPL_ERR_SYSTEM, "mirror: eventfd: %s", strerror(errno));
    for (int i = 0; i < MIRROR_HANDLERS_MAX; i++)
        m->handler_fd[i] = -1;
    if (pthread_create(&m->server, NULL, server_main, m) != 0)
        return gb_seterr(&m->err, GPL_ERR_SYSTEM, "mirror: cannot start its server thread");
    m->serving = 1;
    return GPL_OK;
}

void mirror_serve_stop(gpl_mirror_t m) {
    if (m->serving) {
        uint64_t one = 1;
        ssize_t w = write(m->wake_fd, &one, sizeof one);
        (void)w;
        pthread_join(m->server, NULL);
        m->serving = 0;
    }
    pthread_mutex_lock(&m->mu);
    m->stop = 1;
    for (int i = 0; i < MIRROR_HANDLERS_MAX; i++)
        if (m->handler_fd[i] >= 0)
            shutdown(m->handler_fd[i], SHUT_RDWR);
    while (m->handlers > 0)
        pthread_cond_wait(&m->cv, &m->mu);
    pthread_mutex_unlock(&m->mu);
    if (m->wake_fd >= 0)
        close(m->wake_fd);
    m->wake_fd = -1;
}

/* ---- the push sender ---- */

static void *sender_main(void *p) {
    gpl_mirror_t m = p;
    gb_thread_background("gpl-mirror-push");
    uint64_t t0 = gb_now_ms();
    int err = 0;
    int fd = dial(m->buddy_addr, m->buddy_port, m->timeout_ms, &err);
    gpl_result_t rc = GPL_OK;
    uint8_t ans = MIRROR_ANS_REFUSED;
    unsigned char digest[MIRROR_DIGEST];
    if (fd >= 0) {
        atomic_store(&m->send_fd, fd);
        mirror_hdr h = {.magic = MIRROR_MAGIC,
                        .kind = MIRROR_PUSH,
                        .round = m->round,
                        .owner = m->rank,
                        .world = m->world,
                        .nbuf = m->nbuf,
                        .step = m->sending_step,
                        .total = m->total};
        uint64_t wire[GPL_MIRROR_MAX_BUFS];
        for (int i = 0; i < m->nbuf; i++)
            wire[i] = m->sizes[i];
        err = io_all(fd, &h, sizeof h, 1);
        if (!err)
            err = io_all(fd, wire, sizeof(uint64_t) * (size_t)m->nbuf, 1);
        if (!err)
            err = stream_bufs(fd, m->bufs, m->sizes, m->nbuf, 1, NULL, NULL, digest, NULL);
        if (!err)
            err = io_all(fd, &ans, 1, 0);
        atomic_store(&m->send_fd, -1);
        close(fd);
    }
    double s = (double)(gb_now_ms() - t0) / 1000.0;
    if (err == ETIMEDOUT)
        rc = gb_seterr(&m->send_err, GPL_ERR_TIMEOUT,
                       "rank %d: its copy of step %lld did not reach rank %d (%s:%d) within %u ms; "
                       "the copy there is the step before",
                       m->rank, (long long)m->sending_step, m->buddy, m->buddy_addr, m->buddy_port,
                       m->timeout_ms);
    else if (err)
        rc = gb_seterr(&m->send_err, GPL_ERR_PEER_FAILED,
                       "rank %d: its copy of step %lld to rank %d (%s:%d) failed: %s (the buddy is "
                       "gone or stopped taking copies)",
                       m->rank, (long long)m->sending_step, m->buddy, m->buddy_addr, m->buddy_port,
                       strerror(err));
    else if (ans == MIRROR_ANS_BAD)
        rc = gb_seterr(&m->send_err, GPL_ERR_CORRUPT,
                       "rank %d: rank %d received its copy of step %lld with another SHA-256 "
                       "(damaged in transit or in memory): not kept",
                       m->rank, m->buddy, (long long)m->sending_step);
    else if (ans != MIRROR_ANS_OK)
        rc = gb_seterr(&m->send_err, GPL_ERR_PEER_FAILED,
                       "rank %d: rank %d refused its copy of step %lld (it is re-forming, or "
                       "serving the slot)",
                       m->rank, m->buddy, (long long)m->sending_step);
    pthread_mutex_lock(&m->mu);
    m->send_rc = rc;
    if (rc == GPL_OK) {
        m->sent_step = m->sending_step;
        m->last_push_s = s;
        m->rate_mbs = s > 0 ? (double)m->total / 1e6 / s : 0;
    }
    if (!err) {
        memcpy(m->own_digest, digest, sizeof digest);
        m->own_digest_ok = m->own_step == m->sending_step;
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

gpl_result_t mirror_send_start(gpl_mirror_t m) {
    gb_clearerr(&m->send_err);
    m->send_rc = GPL_OK;
    m->sending_step = m->own_step;
    if (pthread_create(&m->sender, NULL, sender_main, m) != 0)
        return gb_seterr(&m->err, GPL_ERR_SYSTEM, "rank %d: cannot start the copy's thread",
                         m->rank);
    m->sending = 1;
    return GPL_OK;
}

void mirror_send_cancel(gpl_mirror_t m) {
    int fd = atomic_load(&m->send_fd);
    if (fd >= 0)
        shutdown(fd, SHUT_RDWR);
}

/* ---- fetch ---- */

gpl_result_t mirror_fetch_remote(gb_err *e, const char *addr, int port, uint32_t timeout_ms,
                                 int round, int owner, int64_t step, void *const bufs[],
                                 const size_t bytes[], int n) {
    int err = 0;
    int fd = dial(addr, port, timeout_ms, &err);
    if (fd < 0)
        return gb_seterr(e, GPL_ERR_PEER_FAILED,
                         "mirror: cannot reach %s:%d for rank %d's copy of step %lld: %s", addr,
                         port, owner, (long long)step, strerror(err));
    gpl_result_t rc = GPL_OK;
    mirror_hdr h = {.magic = MIRROR_MAGIC,
                    .kind = MIRROR_FETCH,
                    .round = round,
                    .owner = owner,
                    .step = step},
               a;
    uint64_t wire[GPL_MIRROR_MAX_BUFS];
    unsigned char digest[MIRROR_DIGEST];
    int match = 0;
    err = io_all(fd, &h, sizeof h, 1);
    if (!err)
        err = io_all(fd, &a, sizeof a, 0);
    if (err)
        goto io;
    if (a.magic != MIRROR_MAGIC || a.kind != MIRROR_ANS_OK) {
        rc = gb_seterr(e, GPL_ERR_NOT_FOUND,
                       "mirror: %s:%d does not hold rank %d's copy of step %lld", addr, port, owner,
                       (long long)step);
        goto out;
    }
    if (a.nbuf != n || (err = io_all(fd, wire, sizeof(uint64_t) * (size_t)n, 0)) != 0) {
        if (err)
            goto io;
        rc = gb_seterr(e, GPL_ERR_INVALID_ARG,
                       "mirror: rank %d's copy is %d buffers; %d were given for it", owner, a.nbuf,
                       n);
        goto out;
    }
    for (int i = 0; i < n; i++)
        if (wire[i] != bytes[i]) {
            rc = gb_seterr(e, GPL_ERR_INVALID_ARG,
                           "mirror: buffer %d of rank %d's copy is %llu bytes; %zu were given", i,
                           owner, (unsigned long long)wire[i], bytes[i]);
            goto out;
        }
    if ((err = stream_bufs(fd, bufs, bytes, n, 0, NULL, NULL, digest, &match)) != 0)
        goto io;
    if (!match)
        rc = gb_seterr(e, GPL_ERR_CORRUPT,
                       "mirror: rank %d's copy of step %lld from %s:%d does not match its SHA-256",
                       owner, (long long)step, addr, port);
    goto out;
io:
    rc = gb_seterr(e, err == ETIMEDOUT ? GPL_ERR_TIMEOUT : GPL_ERR_PEER_FAILED,
                   "mirror: rank %d's copy of step %lld from %s:%d was cut off: %s", owner,
                   (long long)step, addr, port, strerror(err));
out:
    close(fd);
    return rc;
}
