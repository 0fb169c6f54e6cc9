/* The node's shared-memory segment: creation through the rendezvous store
 * (so no rank opens a stale segment), a futex barrier that spins only when
 * there are no more ranks than cores, dead-peer detection, and removal of
 * segments left behind by crashed runs. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "gb_time.h"
#include "gb_proc.h"
#include "gpl_int.h"

#define SHM_PREFIX "gpulaunch-"
#define SPIN_ITERS 2000      /* 10-30 microseconds of pause before the yields alone */
#define SPIN_YIELD_EVERY 256 /* a yield in between, so a rank that waits for this core runs */
#define YIELD_ITERS 64       /* then let a rank that shares our core run, before sleeping */

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

/* Dead, or a zombie nobody has reaped yet. */
static int pid_dead(pid_t p) {
    if (kill(p, 0) != 0)
        return errno == ESRCH;
    char st = gb_proc_state(p);
    return st == 'Z' || st == 'X';
}

static size_t seg_len(int nlocal) {
    size_t hdr = (sizeof(gpl_shm_hdr) + 4095) & ~(size_t)4095;
    return hdr + (size_t)(nlocal + 1) * GPL_SHM_SLOT_BYTES;
}

static gpl_result_t map_seg(gpl_comm_t c, int fd) {
    c->shm_len = seg_len(c->local_world);
    void *p = mmap(NULL, c->shm_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return gb_seterr(&c->err, GPL_ERR_SYSTEM, "rank %d: mmap of /dev/shm/%s (%zu bytes): %s",
                         c->rank, c->shm_name + 1, c->shm_len, strerror(errno));
    c->shm = p;
    size_t hdr = (sizeof(gpl_shm_hdr) + 4095) & ~(size_t)4095;
    c->slots = (uint8_t *)p + hdr;
    c->result = c->slots + (size_t)c->local_world * GPL_SHM_SLOT_BYTES;
    return GPL_OK;
}

/* The creator's pid from a segment's name ("...-p<pid>-<8 hex>"), or 0 for a
 * name without one (written by an older version). */
static pid_t pid_of_name(const char *name) {
    const char *last = strrchr(name, '-');
    if (last == NULL || strlen(last + 1) != 8 || last == name)
        return 0;
    const char *p = last - 1;
    while (p > name && *p >= '0' && *p <= '9')
        p--;
    if (p == name || *p != 'p' || p[-1] != '-' || p + 1 == last)
        return 0;
    long v = strtol(p + 1, NULL, 10);
    return v > 0 && v <= INT_MAX ? (pid_t)v : 0;
}

/* The creator of a segment, or 0 when it cannot be known: the header's when
 * it was initialised, else the one its name carries (a creator killed between
 * creating the segment and writing the header leaves it uninitialised). */
static pid_t creator_of(const char *name, const gpl_shm_hdr *h, ssize_t r) {
    if (r == (ssize_t)sizeof *h && h->pid[0] > 0)
        return h->pid[0];
    return pid_of_name(name);
}

/* Removes /dev/shm/gpulaunch-* segments whose creator is dead, and those that
 * were never initialised and name no creator (older versions) once they are
 * GPL_SHM_UNINIT_STALE_S old. Returns how many; report lists them. */
int gpl_shm_clean_stale(char *report, size_t len) {
    DIR *d = opendir("/dev/shm");
    if (d == NULL)
        return 0;
    int n = 0;
    size_t off = 0;
    if (report && len)
        report[0] = '\0';
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, SHM_PREFIX, strlen(SHM_PREFIX)) != 0)
            continue;
        char name[NAME_MAX + 2];
        snprintf(name, sizeof name, "/%s", e->d_name);
        int fd = shm_open(name, O_RDONLY, 0);
        if (fd < 0)
            continue;
        gpl_shm_hdr h;
        memset(&h, 0, sizeof h);
        ssize_t r = pread(fd, &h, sizeof h, 0);
        struct stat st;
        int have_st = fstat(fd, &st) == 0;
        close(fd);
        pid_t creator = creator_of(e->d_name, &h, r);
        if (creator > 0 && !pid_dead(creator))
            continue;
        if (creator <= 0 && (!have_st || time(NULL) - st.st_mtime < GPL_SHM_UNINIT_STALE_S))
            continue;
        if (shm_unlink(name) == 0) {
            n++;
            if (report && off < len) {
                int w = snprintf(report + off, len - off, "%s%s", n > 1 ? ", " : "", e->d_name);
                if (w > 0)
                    off += (size_t)w;
            }
        }
    }
    closedir(d);
    return n;
}

gpl_result_t gpl_shm_setup(gpl_comm_t c) {
    if (c->local_world > GPL_MAX_LOCAL)
        return gb_seterr(&c->err, GPL_ERR_LIMIT, "%d ranks on one node; the limit is %d",
                         c->local_world, GPL_MAX_LOCAL);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    c->spin = cores >= c->local_world;
    char key[64];
    snprintf(key, sizeof key, "gpl/%u/shm/%d", c->inst, c->node_rank);
    gpl_result_t rc;
    int fd = -1;
    if (c->local_rank == 0) {
        char stale[512];
        int n = gpl_shm_clean_stale(stale, sizeof stale);
        if (n)
            fprintf(stderr,
                    "gpulaunch runtime: removed %d stale shared-memory segment(s) of dead "
                    "jobs: %s\n",
                    n, stale);
        unsigned rnd = (unsigned)(gb_now_ns() ^ ((uint64_t)getpid() << 16));
        /* the creator's pid in the name too: a segment left before its header
         * was written is still known to be stale (gpl_shm_clean_stale) */
        snprintf(c->shm_name, sizeof c->shm_name, "/" SHM_PREFIX "%.64s-r%d-n%d-p%d-%08x",
                 c->run_id, c->round, c->node_rank, (int)getpid(), rnd);
        for (char *p = c->shm_name + 1; *p; p++)
            if (*p == '/')
                *p = '_';
        fd = shm_open(c->shm_name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0)
            return gb_seterr(&c->err, GPL_ERR_SYSTEM, "rank %d: cannot create /dev/shm%s: %s",
                             c->rank, c->shm_name, strerror(errno));
        size_t len = seg_len(c->local_world);
        if (ftruncate(fd, (off_t)len) != 0 || posix_fallocate(fd, 0, (off_t)len) != 0) {
            int e = errno;
            close(fd);
            shm_unlink(c->shm_name);
            return gb_seterr(&c->err, GPL_ERR_SYSTEM,
                             "rank %d: cannot size /dev/shm%s to %zu bytes: %s; /dev/shm is too "
                             "small (Kubernetes: emptyDir {medium: Memory}; Docker: --shm-size)",
                             c->rank, c->shm_name, len, strerror(e ? e : ENOSPC));
        }
        rc = map_seg(c, fd);
        close(fd);
        if (rc != GPL_OK) {
            shm_unlink(c->shm_name);
            return rc;
        }
        c->shm->nlocal = (uint32_t)c->local_world;
        c->shm->slot_bytes = GPL_SHM_SLOT_BYTES;
        c->shm->pid[0] = getpid();
        atomic_store(&c->shm->ready, GPL_SHM_MAGIC);
        rc = rdzv_bclient_set(c->rdzv, key, c->shm_name, strlen(c->shm_name));
        if (rc != GPL_OK)
            return gb_seterr(&c->err, rc, "rank %d: publishing the shared-memory name: %s", c->rank,
                             rdzv_bclient_error(c->rdzv));
    } else {
        const char *keys[1] = {key};
        rc = rdzv_bclient_wait(c->rdzv, keys, 1, c->timeout_ms);
        void *v = NULL;
        size_t n = 0;
        if (rc == GPL_OK)
            rc = rdzv_bclient_get(c->rdzv, key, &v, &n);
        if (rc != GPL_OK)
            return gb_seterr(&c->err, rc,
                             "rank %d: local rank 0 of node %d never published its shared "
                             "memory: %s",
                             c->rank, c->node_rank, rdzv_bclient_error(c->rdzv));
        snprintf(c->shm_name, sizeof c->shm_name, "%.*s", (int)n, (char *)v);
        free(v);
        fd = shm_open(c->shm_name, O_RDWR, 0);
        if (fd < 0)
            return gb_seterr(&c->err, GPL_ERR_SYSTEM, "rank %d: cannot open /dev/shm%s: %s",
                             c->rank, c->shm_name, strerror(errno));
        rc = map_seg(c, fd);
        close(fd);
        if (rc != GPL_OK)
            return rc;
        if (atomic_load(&c->shm->ready) != GPL_SHM_MAGIC ||
            c->shm->nlocal != (uint32_t)c->local_world)
            return gb_seterr(&c->err, GPL_ERR_STATE,
                             "rank %d: /dev/shm%s holds %u ranks, expected %d", c->rank,
                             c->shm_name, c->shm->nlocal, c->local_world);
        c->shm->pid[c->local_rank] = getpid();
    }
    /* everyone mapped: the creator can unlink the name (the mapping stays) */
    rc = gpl_shm_barrier(c, gb_now_ms() + c->timeout_ms);
    if (rc == GPL_OK && c->local_rank == 0)
        shm_unlink(c->shm_name);
    return rc;
}

void gpl_shm_teardown(gpl_comm_t c) {
    if (c->shm) {
        if (c->local_rank == 0)
            shm_unlink(c->shm_name); /* no-op when already unlinked */
        munmap(c->shm, c->shm_len);
        c->shm = NULL;
    }
}

/* Names the local ranks that have not reached barrier seq. */
static void missing_ranks(gpl_comm_t c, uint64_t seq, char *out, size_t len) {
    size_t off = 0;
    out[0] = '\0';
    for (int r = 0; r < c->local_world; r++) {
        if (atomic_load(&c->shm->arrived[r]) >= seq)
            continue;
        int w = snprintf(out + off, len - off, "%srank %d (node %s, local rank %d)",
                         off ? ", " : "", c->base_rank + r, c->hostname, r);
        if (w > 0 && (size_t)w < len - off)
            off += (size_t)w;
    }
}

void gpl_shm_abort(gpl_comm_t c, const char *why) {
    if (c->shm == NULL)
        return;
    uint32_t zero = 0;
    if (atomic_compare_exchange_strong(&c->shm->abort_flag, &zero, 1)) {
        snprintf(c->shm->abort_msg, sizeof c->shm->abort_msg, "%s", why);
        atomic_store(&c->shm->abort_flag, 2);
        futex(&c->shm->bar_gen, FUTEX_WAKE, INT_MAX, NULL);
    }
}

gpl_result_t gpl_shm_barrier(gpl_comm_t c, uint64_t deadline_ms) {
    gpl_shm_hdr *h = c->shm;
    uint64_t seq = ++c->bar_seq;
    uint32_t gen = atomic_load(&h->bar_gen);
    atomic_store(&h->arrived[c->local_rank], seq);
    if (atomic_fetch_add(&h->bar_count, 1) == (uint32_t)c->local_world - 1) {
        atomic_store(&h->bar_count, 0);
        atomic_fetch_add(&h->bar_gen, 1);
        if (atomic_load(&h->bar_waiters))
            futex(&h->bar_gen, FUTEX_WAKE, INT_MAX, NULL);
        return GPL_OK;
    }
    if (c->spin)
        for (int i = 0; i < SPIN_ITERS; i++) {
            if (atomic_load_explicit(&h->bar_gen, memory_order_acquire) != gen)
                return GPL_OK;
            __builtin_ia32_pause();
            /* the rank we wait for may share our core (other jobs, or nodes
             * on one machine): a pure spin would hold it off for the whole spin */
            if (i % SPIN_YIELD_EVERY == SPIN_YIELD_EVERY - 1)
                sched_yield();
        }
    for (int i = 0; i < YIELD_ITERS; i++) {
        if (atomic_load_explicit(&h->bar_gen, memory_order_acquire) != gen)
            return GPL_OK;
        sched_yield();
    }
    uint64_t next_check = 0;
    int suspect = -1;
    for (;;) {
        if (atomic_load(&h->bar_gen) != gen)
            return GPL_OK;
        uint64_t now = gb_now_ms();
        if (now >= next_check) {
            next_check = now + GPL_POLL_MS;
            /* the root cause first: the rendezvous ended the round, or the deadline passed */
            char who[512];
            missing_ranks(c, seq, who, sizeof who);
            gpl_result_t rc = gpl_check_abort(c, deadline_ms, who);
            if (rc != GPL_OK)
                return rc;
            /* a local peer that died never arrives; it must be seen dead on two
             * checks in a row with the barrier still closed, so that a peer
             * that passed the barrier and exited in between is not blamed */
            for (int r = 0; r < c->local_world; r++) {
                pid_t p = h->pid[r];
                int dead = atomic_load(&h->arrived[r]) < seq && p > 0 && pid_dead(p);
                if (!dead) {
                    if (suspect == r)
                        suspect = -1;
                    continue;
                }
                if (suspect != r) {
                    suspect = r;
                    next_check = now + 20; /* look again soon */
                    continue;
                }
                if (atomic_load(&h->bar_gen) != gen)
                    return GPL_OK;
                gb_seterr(&c->err, GPL_ERR_PEER_FAILED,
                          "rank %d (node %s, local rank %d, pid %d) died before reaching %s #%llu",
                          c->base_rank + r, c->hostname, r, (int)p, c->coll,
                          (unsigned long long)c->seq);
                gpl_shm_abort(c, c->err.msg);
                return GPL_ERR_PEER_FAILED;
            }
            if (atomic_load(&h->abort_flag) == 2)
                return gb_seterr(&c->err, GPL_ERR_PEER_FAILED, "rank %d: %s #%llu aborted: %s",
                                 c->rank, c->coll, (unsigned long long)c->seq, h->abort_msg);
        }
        atomic_fetch_add(&h->bar_waiters, 1);
        struct timespec ts = {0, 20 * 1000000};
        futex(&h->bar_gen, FUTEX_WAIT, gen, &ts);
        atomic_fetch_sub(&h->bar_waiters, 1);
    }
}
