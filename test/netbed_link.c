/* netbed_link: a switch with a slow, lossy fabric for the multi-node test bed,
 * for kernels without tc netem. It creates one TUN device per host (named on
 * the command line), and forwards every IPv4 packet to the device of the host
 * that owns the destination address (10.77.0.<10+i> is host i), after a fixed
 * delay and dropping a given share at random. The test moves each device into
 * its host's network namespace once this prints "ready".
 *
 *   netbed_link DELAY_MS LOSS_PERCENT SEED TUN0 TUN1 ...
 *
 * NETBED_PAIR=A:B:EXTRA_MS:SLOW_S:FAST_S in the environment makes the link
 * between hosts A and B alone slower by EXTRA_MS for SLOW_S seconds out of
 * every SLOW_S + FAST_S (both ways; the pair's packets keep their order, as
 * a queue that drains would).
 *
 * Bounded: at most LINK_QUEUE_MAX packets wait at once (more are dropped, as a
 * full switch queue would). Stops on SIGTERM or when stdin closes. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <uv.h>

#define NETBED_LINK_ONLY
#include "netbed.h"

#define LINK_QUEUE_MAX 65536
#define LINK_MTU 1500

typedef struct pkt {
    struct pkt *next;
    uint64_t due_ms;
    int to;
    uint16_t len;
    uint8_t data[LINK_MTU];
} pkt;

static int ntun;
static int tunfd[NETBED_MAX_HOSTS];
static uv_poll_t polls[NETBED_MAX_HOSTS];
static uv_timer_t timer;
static uv_signal_t sigterm;
static uint64_t delay_ms;
static unsigned loss_pct, seed;
/* two queues, each in due order: every other packet, and the slow pair's */
typedef struct queue {
    pkt *head, *tail;
} queue;
static queue q[2];
static unsigned queued;
static int pair_a = -1, pair_b = -1;
static uint64_t pair_extra_ms, pair_slow_ms, pair_fast_ms, t_start;
static unsigned long forwarded, lost, overflow;

static unsigned next_rand(void) {
    seed = seed * 1103515245u + 12345u;
    return (seed >> 16) & 0x7fff;
}

static void on_timer(uv_timer_t *t);

static void rearm(void) {
    uint64_t due = UINT64_MAX;
    for (int i = 0; i < 2; i++)
        if (q[i].head && q[i].head->due_ms < due)
            due = q[i].head->due_ms;
    if (due == UINT64_MAX)
        return;
    uint64_t now = uv_now(uv_default_loop());
    uv_timer_start(&timer, on_timer, due > now ? due - now : 0, 0);
}

static void on_timer(uv_timer_t *t) {
    (void)t;
    uint64_t now = uv_now(uv_default_loop());
    for (int i = 0; i < 2; i++) {
        while (q[i].head && q[i].head->due_ms <= now) {
            pkt *p = q[i].head;
            q[i].head = p->next;
            if (q[i].head == NULL)
                q[i].tail = NULL;
            queued--;
            /* a host whose TUN queue is full loses the packet, as a link would */
            if (write(tunfd[p->to], p->data, p->len) == (ssize_t)p->len)
                forwarded++;
            free(p);
        }
    }
    rearm();
}

/* The slow pair's extra delay now (0 in its fast phase); UINT64_MAX for
 * any other two hosts. */
static uint64_t pair_delay(int from, int to, uint64_t now) {
    if (!((from == pair_a && to == pair_b) || (from == pair_b && to == pair_a)))
        return UINT64_MAX;
    return (now - t_start) % (pair_slow_ms + pair_fast_ms) < pair_slow_ms ? pair_extra_ms : 0;
}

static void on_readable(uv_poll_t *h, int status, int events) {
    (void)events;
    if (status < 0)
        return;
    int fd = tunfd[(int)(intptr_t)h->data];
    for (;;) {
        pkt *p = malloc(sizeof *p);
        if (p == NULL)
            return;
        ssize_t n = read(fd, p->data, sizeof p->data);
        if (n <= 0) {
            free(p);
            return;
        }
        /* IPv4 only; the destination's last byte names the host */
        int to = n >= 20 && (p->data[0] >> 4) == 4 ? (int)p->data[19] - NETBED_HOST_BASE : -1;
        if (to < 0 || to >= ntun || next_rand() % 100 < loss_pct) {
            lost++;
            free(p);
            continue;
        }
        if (queued >= LINK_QUEUE_MAX) {
            overflow++;
            free(p);
            continue;
        }
        p->len = (uint16_t)n;
        p->to = to;
        uint64_t now = uv_now(uv_default_loop());
        int from = (int)p->data[15] - NETBED_HOST_BASE;
        uint64_t extra = pair_delay(from, to, now);
        queue *qq = &q[extra != UINT64_MAX];
        p->due_ms = now + delay_ms + (extra == UINT64_MAX ? 0 : extra);
        if (qq->tail && qq->tail->due_ms > p->due_ms)
            p->due_ms = qq->tail->due_ms; /* behind what the pair's queue holds */
        p->next = NULL;
        if (qq->tail)
            qq->tail->next = p;
        else
            qq->head = p;
        qq->tail = p;
        queued++;
        rearm();
    }
}

static void on_sigterm(uv_signal_t *s, int sig) {
    (void)sig;
    uv_stop(s->loop);
}

static int tun_open(const char *name) {
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", name);
    if (ioctl(fd, TUNSETIFF, &ifr) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int main(int argc, char **argv) {
    if (argc < 6 || argc - 4 > NETBED_MAX_HOSTS) {
        fprintf(stderr, "usage: netbed_link DELAY_MS LOSS_PERCENT SEED TUN0 TUN1 ... (2 to %d)\n",
                NETBED_MAX_HOSTS);
        return 2;
    }
    delay_ms = strtoull(argv[1], NULL, 10);
    loss_pct = (unsigned)strtoul(argv[2], NULL, 10);
    seed = (unsigned)strtoul(argv[3], NULL, 10);
    ntun = argc - 4;
    uv_loop_t *loop = uv_default_loop();
    t_start = uv_now(loop);
    const char *pair = getenv("NETBED_PAIR");
    if (pair) {
        unsigned a, b;
        unsigned long long extra, slow, fast;
        if (sscanf(pair, "%u:%u:%llu:%llu:%llu", &a, &b, &extra, &slow, &fast) != 5 || slow == 0 ||
            (int)a >= ntun || (int)b >= ntun) {
            fprintf(stderr, "netbed_link: NETBED_PAIR=A:B:EXTRA_MS:SLOW_S:FAST_S, not '%s'\n",
                    pair);
            return 2;
        }
        pair_a = (int)a, pair_b = (int)b;
        pair_extra_ms = extra, pair_slow_ms = slow * 1000, pair_fast_ms = fast * 1000;
    }
    for (int i = 0; i < ntun; i++) {
        tunfd[i] = tun_open(argv[4 + i]);
        if (tunfd[i] < 0) {
            fprintf(stderr, "netbed_link: cannot create TUN device %s: %s\n", argv[4 + i],
                    strerror(errno));
            return 1;
        }
        uv_poll_init(loop, &polls[i], tunfd[i]);
        polls[i].data = (void *)(intptr_t)i;
        uv_poll_start(&polls[i], UV_READABLE, on_readable);
    }
    uv_timer_init(loop, &timer);
    uv_signal_init(loop, &sigterm);
    uv_signal_start(&sigterm, on_sigterm, SIGTERM);
    printf("ready\n");
    fflush(stdout);
    uv_run(loop, UV_RUN_DEFAULT);
    fprintf(stderr, "netbed_link: forwarded %lu packets, dropped %lu at random, %lu on overflow\n",
            forwarded, lost, overflow);
    return 0;
}
