/* The worker's side of the progress channel (see gb_progress.h). */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "gb_progress.h"

static gb_progress_slot *slot;
static gb_progress_round *round_blk; /* NULL: the launcher has none */
static pthread_once_t once = PTHREAD_ONCE_INIT;
/* Collectives in progress in this process, over all threads: the time with
 * at least one is the time spent in collectives (the union of overlapping
 * ones, e.g. a framework's gradient buckets in flight together). The count
 * and the slot's coll_since_ns change together under coll_mu: with the count
 * alone atomic, a thread's end (1 -> 0) could clear coll_since_ns after
 * another thread's begin (0 -> 1) had set it, and a rank blocked in a
 * collective would look busy to the watchdog (blamed instead of its peer). */
static pthread_mutex_t coll_mu = PTHREAD_MUTEX_INITIALIZER;
static int coll_depth;

/* A child forked while another thread held coll_mu would block at its first
 * collective: fork waits for the (short) critical section to end. */
static void coll_prepare(void) { pthread_mutex_lock(&coll_mu); }
static void coll_unlock(void) { pthread_mutex_unlock(&coll_mu); }

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void attach_once(void) {
    const char *v = getenv("GPULAUNCH_PROGRESS_SHM");
    if (v == NULL || *v == '\0')
        return;
    char *end;
    errno = 0;
    long fd = strtol(v, &end, 10);
    long idx = -1;
    if (!errno && *end == ':' && fd >= 0 && fd < 1 << 20)
        idx = strtol(end + 1, &end, 10);
    struct stat st;
    const char *why = NULL;
    if (errno || *end || idx < 0 || idx >= GB_PROGRESS_MAX_SLOTS)
        why = "not FD:SLOT";
    else if (fstat((int)fd, &st) != 0)
        why = "its descriptor is not open (closed by the program, or not started by gpulaunch)";
    else if ((uint64_t)st.st_size < gb_progress_region_bytes((uint32_t)idx + 1))
        why = "its region is smaller than the slot";
    void *p = MAP_FAILED;
    size_t maplen = why ? 0 : (size_t)st.st_size; /* the whole region: the round block too */
    if (why == NULL) {
        p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
        const gb_progress_header *h = p;
        if (p == MAP_FAILED)
            why = "mmap failed";
        else if (h->magic != GB_PROGRESS_MAGIC || h->version != GB_PROGRESS_VERSION ||
                 (uint32_t)idx >= h->nslots)
            why = "the region is not a gpulaunch progress region of this version";
    }
    if (why) {
        if (p != MAP_FAILED)
            munmap(p, maplen);
        fprintf(stderr,
                "gpulaunch: GPULAUNCH_PROGRESS_SHM=%s: %s; this worker's progress is not "
                "reported (the launcher's --progress-timeout does not watch it)\n",
                v, why);
        return;
    }
    gb_progress_slot *s = (gb_progress_slot *)((char *)p + GB_PROGRESS_SLOT_BYTES) + idx;
    atomic_store_explicit(&s->pid, (int32_t)getpid(), memory_order_relaxed);
    uint64_t now = mono_ns();
    atomic_store_explicit(&s->beat_ns, now, memory_order_relaxed);
    atomic_store_explicit(&s->joined_ns, now, memory_order_release);
    pthread_atfork(coll_prepare, coll_unlock, coll_unlock);
    const gb_progress_header *h = p;
    if (h->round_off >= gb_progress_region_bytes(h->nslots) &&
        (uint64_t)h->round_off + GB_PROGRESS_ROUND_BYTES <= maplen && h->round_off % 64 == 0)
        round_blk = (gb_progress_round *)((char *)p + h->round_off);
    slot = s;
}

gb_progress_slot *gb_progress_attach(void) {
    pthread_once(&once, attach_once);
    return slot;
}

void gb_progress_step(int64_t step) {
    gb_progress_slot *s = gb_progress_attach();
    if (s == NULL)
        return;
    uint64_t now = mono_ns();
    atomic_store_explicit(&s->step, step, memory_order_relaxed);
    /* an add, not a load and a store: threads that report at once all count */
    atomic_fetch_add_explicit(&s->steps, 1, memory_order_relaxed);
    atomic_store_explicit(&s->step_ns, now, memory_order_relaxed);
    atomic_store_explicit(&s->beat_ns, now, memory_order_release);
}

void gb_progress_coll_begin(void) {
    gb_progress_slot *s = gb_progress_attach();
    if (s == NULL)
        return;
    pthread_mutex_lock(&coll_mu);
    if (coll_depth++ == 0)
        atomic_store_explicit(&s->coll_since_ns, mono_ns(), memory_order_release);
    pthread_mutex_unlock(&coll_mu);
}

void gb_progress_coll_end(void) {
    gb_progress_slot *s = gb_progress_attach();
    if (s == NULL)
        return;
    pthread_mutex_lock(&coll_mu);
    if (coll_depth > 0 && --coll_depth == 0) { /* else an end without its begin */
        uint64_t t0 = atomic_load_explicit(&s->coll_since_ns, memory_order_relaxed);
        uint64_t now = mono_ns();
        if (t0 && now > t0)
            atomic_fetch_add_explicit(&s->coll_ns, now - t0, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->colls, 1, memory_order_relaxed);
        atomic_store_explicit(&s->coll_since_ns, 0, memory_order_relaxed);
        atomic_store_explicit(&s->beat_ns, now, memory_order_release);
    }
    pthread_mutex_unlock(&coll_mu);
}

void gb_progress_set_state(enum gb_progress_state st) {
    gb_progress_slot *s = gb_progress_attach();
    if (s == NULL)
        return;
    atomic_store_explicit(&s->state, (uint32_t)st, memory_order_relaxed);
    /* leaving a save is progress: the watchdog measures from here */
    atomic_store_explicit(&s->beat_ns, mono_ns(), memory_order_release);
}

void gb_progress_set_stack_signal(int sig) {
    gb_progress_slot *s = gb_progress_attach();
    if (s)
        atomic_store_explicit(&s->stack_signal, sig, memory_order_release);
}

void gb_progress_set_ckpt_ready(int ready) {
    gb_progress_slot *s = gb_progress_attach();
    if (s)
        atomic_store_explicit(&s->ckpt_ready, ready ? 1 : 0, memory_order_release);
}

void gb_progress_ckpt(int64_t local_step, int64_t durable_step, uint64_t stall_us,
                      uint64_t drain_left) {
    gb_progress_slot *s = slot;
    if (s == NULL)
        return;
    atomic_store_explicit(&s->ckpt_local1, local_step + 1, memory_order_relaxed);
    atomic_store_explicit(&s->ckpt_durable1, durable_step + 1, memory_order_relaxed);
    atomic_store_explicit(&s->ckpt_stall_us, stall_us, memory_order_relaxed);
    atomic_store_explicit(&s->ckpt_drain_left, drain_left, memory_order_relaxed);
}

void gb_progress_wait_alive(void) {
    gb_progress_slot *s = slot;
    if (s)
        atomic_store_explicit(&s->wait_ns, mono_ns(), memory_order_relaxed);
}

int gb_progress_set_reform_ok(int ok) {
    gb_progress_slot *s = gb_progress_attach();
    if (s == NULL || round_blk == NULL)
        return -1;
    atomic_store_explicit(&s->reform_ok, ok ? 1 : 0, memory_order_release);
    return 0;
}

int gb_progress_goes_on(void) {
    gb_progress_slot *s = gb_progress_attach();
    if (s == NULL || round_blk == NULL)
        return 0;
    return atomic_load_explicit(&s->reform_ok, memory_order_acquire) == 1 && round_blk->go_on == 1;
}

int gb_progress_round_moved(uint32_t seen) {
    gb_progress_slot *s = slot;
    gb_progress_round *b = round_blk;
    if (s == NULL || b == NULL || atomic_load_explicit(&s->reform_ok, memory_order_relaxed) != 1)
        return 0;
    return atomic_load_explicit(&b->seq, memory_order_acquire) != seen &&
           atomic_load_explicit(&b->state, memory_order_relaxed) != GB_ROUND_RUNNING;
}

const gb_progress_round *gb_progress_round_block(void) {
    gb_progress_attach();
    return round_blk;
}

int gb_progress_round_wait(uint32_t seen, uint32_t timeout_ms, gb_progress_round *out) {
    gb_progress_round *b = (gb_progress_round *)gb_progress_round_block();
    if (b == NULL)
        return -1;
    uint64_t deadline = mono_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        uint32_t q = atomic_load_explicit(&b->seq, memory_order_acquire);
        if (q != seen) {
            memcpy(out, b, sizeof *out); /* the launcher writes only before bumping seq */
            atomic_thread_fence(memory_order_acquire);
            if (atomic_load_explicit(&b->seq, memory_order_relaxed) == q) {
                atomic_store_explicit(&out->seq, q, memory_order_relaxed);
                return 0;
            }
            continue; /* changed while copied: again */
        }
        uint64_t now = mono_ns();
        if (now >= deadline)
            return 1;
        /* at most 100 ms per sleep: a lost wake-up costs no more than that */
        uint64_t left = deadline - now;
        if (left > 100000000u)
            left = 100000000u;
        struct timespec ts = {(time_t)(left / 1000000000u), (long)(left % 1000000000u)};
        syscall(SYS_futex, (uint32_t *)&b->seq, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
}

void gb_progress_round_ack(uint32_t round) {
    gb_progress_slot *s = gb_progress_attach();
    if (s)
        atomic_store_explicit(&s->round_ack, round, memory_order_release);
}
