/* The async client's connection to the rendezvous: resolving the host,
 * connecting to its addresses in turn, the socket's tuning, and after a
 * failure or a broken connection a retry with backoff and jitter until the
 * join timeout, said while it lasts. The handshake and what follows:
 * rdzv_client.c. */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb_log.h"
#include "gb_time.h"
#include "rdzv_client_priv.h"

#define GB_COMPONENT "rdzv-client"

#define RDZV_NOTICE_FIRST_MS 2000  /* an unreachable rendezvous is said after this ... */
#define RDZV_NOTICE_EVERY_MS 10000 /* ... and again at this interval */

static void connect_addr(rdzv_client *c, const struct sockaddr *sa);
static void on_retry(uv_timer_t *t) { rdzv__client_start_connect(t->data); }

void rdzv__client_drop_conn(rdzv_client *c) {
    rdzv__client_close_tcp(c, &c->tcp);
    c->in.len = 0;
    c->state = CS_IDLE;
    rdzv__client_drop_move(c); /* a reconnect re-registers the round itself */
    rdzv__client_drop_drain(c);
    c->stall_since_ms = 0;
    c->move_pending = 0;
    c->respare = 0;
}

/* Never silent: an outage is said RDZV_NOTICE_FIRST_MS after it began, then
 * every RDZV_NOTICE_EVERY_MS, with what was tried and the time left. */
static void on_notice(uv_timer_t *t) {
    rdzv_client *c = t->data;
    if (c->closing || c->failed || c->down_since_ms == 0)
        return;
    uint64_t now = gb_now_ms(), down = now - c->down_since_ms;
    uint64_t left = c->o.connect_timeout_ms > down ? c->o.connect_timeout_ms - down : 0;
    char now_doing[320];
    snprintf(now_doing, sizeof now_doing, "%s: no answer yet", c->doing);
    GB_WARN("rendezvous %s:%d not reached for %.1f s: %s; still trying for %.0f s (the join "
            "timeout, --rdzv-conf join_timeout=SECONDS)",
            c->host, c->o.port, (double)down / 1000.0, c->last_why[0] ? c->last_why : now_doing,
            (double)left / 1000.0);
    c->noticed = 1;
}

void rdzv__client_outage_begins(rdzv_client *c, uint64_t now) {
    c->down_since_ms = now;
    c->backoff_ms = 50;
    c->noticed = 0;
    c->last_why[0] = '\0';
    uv_timer_start(&c->notice, on_notice, RDZV_NOTICE_FIRST_MS, RDZV_NOTICE_EVERY_MS);
}

/* The connection failed or broke: try again after a backoff with jitter,
 * until the retry budget of this outage is spent. */
void rdzv__client_schedule_retry(rdzv_client *c, const char *why) {
    rdzv__client_drop_conn(c);
    if (c->closing || c->failed || c->frozen)
        return;
    uint64_t now = gb_now_ms();
    if (c->down_since_ms == 0) {
        rdzv__client_outage_begins(c, now);
        GB_WARN("rendezvous %s:%d: %s; reconnecting", c->host, c->o.port, why);
    }
    snprintf(c->last_why, sizeof c->last_why, "%s", why);
    if (now - c->down_since_ms >= c->o.connect_timeout_ms) {
        char msg[512];
        snprintf(msg, sizeof msg,
                 "could not reach the rendezvous at %s:%d for %.1f s (last error: %s); check "
                 "--rdzv-endpoint / --master-addr, and that the launcher on that host (or the "
                 "gpulaunch-rdzv server) is running",
                 c->host, c->o.port, (double)(now - c->down_since_ms) / 1000.0, why);
        rdzv__client_fatal(c, GPL_ERR_TIMEOUT, msg);
        return;
    }
    uint32_t d = c->backoff_ms / 2 + (uint32_t)(rand() % (int)(c->backoff_ms / 2 + 1));
    if (c->backoff_ms < 2000)
        c->backoff_ms *= 2;
    uint64_t left = c->o.connect_timeout_ms - (now - c->down_since_ms);
    if (d > left) /* the last try comes at the deadline, not up to 2 s after it */
        d = (uint32_t)left;
    uv_timer_start(&c->retry, on_retry, d, 0);
}

static void on_connect(uv_connect_t *req, int status) {
    rdzv_client *c = req->data;
    if (c->closing || req->handle != (uv_stream_t *)c->tcp)
        return;
    if (status < 0) {
        char why[160];
        snprintf(why, sizeof why, "connect to %s: %s", c->target, uv_strerror(status));
        if (c->next_addr < c->naddrs) { /* the host's next address, at once */
            snprintf(c->last_why, sizeof c->last_why, "%s", why);
            rdzv__client_drop_conn(c);
            connect_addr(c, (struct sockaddr *)&c->addrs[c->next_addr++]);
            return;
        }
        rdzv__client_schedule_retry(c, why);
        return;
    }
    rdzv__client_tune(c, c->tcp);
    c->state = CS_HANDSHAKE;
    uv_read_start((uv_stream_t *)c->tcp, rdzv__client_on_alloc,
                  rdzv__client_on_read); /* the server speaks first */
}

void rdzv__client_tune(rdzv_client *c, uv_tcp_t *t) {
    uv_tcp_nodelay(t, 1);
    /* A path that goes silent (a cut link, a server host that vanished without
     * closing anything) must not look alive for the 15 minutes of TCP's
     * retransmissions: once the heartbeats sent on it stay unacknowledged for
     * RDZV_KEEP_FACTOR x the heartbeat timeout (as long as the server keeps a
     * node its peers still reach: a slow, lossy link is not given up on
     * sooner), the connection fails and the client reconnects (a RESUME of a
     * round that ended meanwhile comes back as round over). */
    uv_os_fd_t fd;
    unsigned ut = RDZV_KEEP_FACTOR * rdzv__client_hb_timeout_ms(c);
    if (!c->assigned && ut < RDZV_PENDING_KEEP_MS)
        ut = RDZV_PENDING_KEEP_MS; /* no round to keep: its JOIN is not given up on early */
    if (uv_fileno((uv_handle_t *)t, &fd) == 0)
        (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
    rdzv_client *c = req->data;
    rdzv__client_unref(c);
    if (c->closing) {
        uv_freeaddrinfo(res);
        return;
    }
    if (status < 0) {
        char why[300];
        snprintf(why, sizeof why, "cannot resolve %s: %s", c->host, uv_strerror(status));
        uv_freeaddrinfo(res);
        rdzv__client_schedule_retry(c, why);
        return;
    }
    c->naddrs = 0;
    for (struct addrinfo *a = res; a && c->naddrs < RDZV_CLIENT_MAX_ADDRS; a = a->ai_next)
        if (a->ai_addrlen <= sizeof c->addrs[0])
            memcpy(&c->addrs[c->naddrs++], a->ai_addr, a->ai_addrlen);
    uv_freeaddrinfo(res);
    c->next_addr = 1;
    connect_addr(c, (struct sockaddr *)&c->addrs[0]);
}

static void connect_addr(rdzv_client *c, const struct sockaddr *sa) {
    char ip[64] = "?";
    if (sa->sa_family == AF_INET6) {
        uv_ip6_name((const struct sockaddr_in6 *)sa, ip, sizeof ip);
        snprintf(c->target, sizeof c->target, "[%s]:%d", ip, c->o.port);
    } else {
        uv_ip4_name((const struct sockaddr_in *)sa, ip, sizeof ip);
        snprintf(c->target, sizeof c->target, "%s:%d", ip, c->o.port);
    }
    snprintf(c->doing, sizeof c->doing, "connecting to %s", c->target);
    c->tcp = malloc(sizeof *c->tcp);
    c->tcp_sent = c->join_end = c->acked_seen = 0;
    if (c->tcp == NULL) {
        rdzv__client_fatal(c, GPL_ERR_NOMEM, "out of memory");
        return;
    }
    uv_tcp_init(c->loop, c->tcp);
    c->tcp->data = c;
    c->creq.data = c;
    c->state = CS_CONNECTING;
    int r = uv_tcp_connect(&c->creq, c->tcp, sa, on_connect);
    if (r != 0)
        rdzv__client_schedule_retry(c, uv_strerror(r));
}

void rdzv__client_start_connect(rdzv_client *c) {
    if (c->closing)
        return;
    /* a numeric address needs no resolver (and no thread pool) */
    struct sockaddr_storage ss;
    if (uv_ip4_addr(c->host, c->o.port, (struct sockaddr_in *)&ss) == 0 ||
        uv_ip6_addr(c->host, c->o.port, (struct sockaddr_in6 *)&ss) == 0) {
        c->naddrs = c->next_addr = 0;
        connect_addr(c, (struct sockaddr *)&ss);
        return;
    }
    snprintf(c->doing, sizeof c->doing, "resolving %s", c->host);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    char port[16];
    snprintf(port, sizeof port, "%d", c->o.port);
    c->gai.data = c;
    c->handles++;
    int r = uv_getaddrinfo(c->loop, &c->gai, on_resolved, c->host, port, &hints);
    if (r != 0) {
        rdzv__client_unref(c);
        rdzv__client_schedule_retry(c, uv_strerror(r));
    }
}
