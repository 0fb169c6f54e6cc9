/* Fan-out of one push to many sockets. Each send() costs the kernel's whole
 * transmit path (about 10 us on the 2-core machine of docs/performance.md),
 * so a round of 16k nodes is 16k of them back to back on the loop thread; the
 * helpers share that work. They touch nothing but the file descriptors and
 * the caller's read-only bytes, and the loop thread waits for them, so no
 * libuv handle or server state is ever used from two threads. */
#include "rdzv_fanout.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct helper_arg {
    struct rdzv_fanout *f;
    int idx;
    uint64_t gen; /* the generation when it was created: it serves the next ones */
} helper_arg;

struct rdzv_fanout {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_t th[RDZV_FANOUT_MAX_HELPERS];
    helper_arg arg[RDZV_FANOUT_MAX_HELPERS];
    int nth, tried, stop, busy;
    uint64_t gen;
    /* the run in progress */
    rdzv_fan_item *items;
    size_t n, chunk;
    const uint8_t *data;
};

static void send_range(rdzv_fan_item *items, size_t lo, size_t hi, const uint8_t *data) {
    for (size_t i = lo; i < hi; i++) {
        rdzv_fan_item *it = &items[i];
        it->sent = 0;
        if (it->fd < 0)
            continue;
        while (it->sent < it->len) {
            ssize_t w = send(it->fd, data + it->off + it->sent, it->len - it->sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0)
                it->sent += (uint32_t)w;
            else if (!(w < 0 && errno == EINTR))
                break; /* full or failed: the caller queues the rest or sees the error */
        }
    }
}

static void *helper(void *p) {
    helper_arg a = *(helper_arg *)p;
    rdzv_fanout *f = a.f;
    uint64_t seen = a.gen;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (f->gen == seen && !f->stop)
            pthread_cond_wait(&f->go, &f->mu);
        if (f->stop)
            break;
        seen = f->gen;
        size_t lo = (size_t)(a.idx + 1) * f->chunk, hi = lo + f->chunk;
        if (hi > f->n)
            hi = f->n;
        rdzv_fan_item *items = f->items;
        const uint8_t *data = f->data;
        pthread_mutex_unlock(&f->mu);
        if (lo < hi)
            send_range(items, lo, hi, data);
        pthread_mutex_lock(&f->mu);
        if (--f->busy == 0)
            pthread_cond_signal(&f->done);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

rdzv_fanout *rdzv_fanout_new(void) {
    rdzv_fanout *f = calloc(1, sizeof *f);
    if (f == NULL)
        return NULL;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->go, NULL);
    pthread_cond_init(&f->done, NULL);
    return f;
}

/* Helpers block every signal: signals stay with the loop thread (the
 * launcher, as PID 1, reaps its workers on SIGCHLD there). */
static void start_helpers(rdzv_fanout *f) {
    f->tried = 1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int want = cpus > 1 ? (int)(cpus - 1) : 0;
    if (want > RDZV_FANOUT_MAX_HELPERS)
        want = RDZV_FANOUT_MAX_HELPERS;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < want; i++) {
        f->arg[i] = (helper_arg){.f = f, .idx = i, .gen = f->gen};
        if (pthread_create(&f->th[i], NULL, helper, &f->arg[i]) != 0)
            break;
        f->nth++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void rdzv_fanout_run(rdzv_fanout *f, rdzv_fan_item *items, size_t n, const uint8_t *data) {
    if (f && n >= RDZV_FANOUT_PARALLEL_MIN && !f->tried)
        start_helpers(f);
    if (f == NULL || n < RDZV_FANOUT_PARALLEL_MIN || f->nth == 0) {
        send_range(items, 0, n, data);
        return;
    }
    size_t parts = (size_t)f->nth + 1;
    pthread_mutex_lock(&f->mu);
    f->items = items;
    f->n = n;
    f->data = data;
    f->chunk = (n + parts - 1) / parts;
    f->busy = f->nth;
    f->gen++;
    pthread_cond_broadcast(&f->go);
    size_t chunk = f->chunk;
    pthread_mutex_unlock(&f->mu);
    send_range(items, 0, chunk < n ? chunk : n, data);
    pthread_mutex_lock(&f->mu);
    while (f->busy)
        pthread_cond_wait(&f->done, &f->mu);
    f->items = NULL;
    pthread_mutex_unlock(&f->mu);
}

int rdzv_fanout_helpers(const rdzv_fanout *f) { return f ? f->nth : 0; }

void rdzv_fanout_free(rdzv_fanout *f) {
    if (f == NULL)
        return;
    pthread_mutex_lock(&f->mu);
    f->stop = 1;
    pthread_cond_broadcast(&f->go);
    pthread_mutex_unlock(&f->mu);
    for (int i = 0; i < f->nth; i++)
        pthread_join(f->th[i], NULL);
    pthread_cond_destroy(&f->go);
    pthread_cond_destroy(&f->done);
    pthread_mutex_destroy(&f->mu);
    free(f);
}
