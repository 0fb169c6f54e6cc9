/* The checkpoint's background threads, one pair per rank, so that a save
 * stalls training only for the copy into the staging buffer:
 *   the writer   writes a staged save into the first tier (each file to a
 *                temporary name, hashed on the way, fsync'd, renamed; the
 *                rank's manifest last), and marks steps COMPLETE there once
 *                every rank wrote them (the training thread learns that from
 *                step_end's agreement and hands the step over);
 *   the drainer  copies the newest written step from the first tier to the
 *                durable one (a shared directory or S3), the manifest last;
 *                rank 0's marks a step COMPLETE there once every rank's
 *                files are durable, and keeps keep=N there.
 * A failure is said once on stderr with the tier and what to do; training
 * goes on and the newest COMPLETE step stays what it was. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "gb_progress.h"
#include "gb_thread.h"
#include "gb_time.h"

static void say_failure(const char *who, int64_t step, const gb_err *e) {
    fprintf(stderr,
            "gpulaunch runtime: checkpoint %s of step %lld failed: %s; training goes on, "
            "the newest complete checkpoint is kept\n",
            who, (long long)step, gb_errmsg(e));
}

static void step_dir(const ckpt_tier *t, int64_t step, char *out, size_t len) {
    char s[32];
    ckpt_step_name(step, s, sizeof s);
    snprintf(out, len, "%s/%s", t->where, s);
}

static gpl_result_t manifest_add(ckpt_job *j, const char *file, uint64_t len, const char *hex,
                                 gb_err *err) {
    size_t room = sizeof j->manifest - j->man_len;
    int w = snprintf(j->manifest + j->man_len, room, "%s %llu %s\n", file, (unsigned long long)len,
                     hex);
    if (w < 0 || (size_t)w >= room)
        return gb_seterr(err, GPL_ERR_LIMIT,
                         "rank %d: more checkpoint files than the %d-byte manifest holds", j->rank,
                         CKPT_MANIFEST_MAX);
    j->man_len += (size_t)w;
    return GPL_OK;
}

/* One file of the save into dir: staged bytes written and hashed, or the
 * caller's temporary file fsync'd and hashed; renamed into place. */
static gpl_result_t write_file(ckpt_bg *b, ckpt_job *j, const ckpt_file *f, const char *dir,
                               gb_err *err) {
    char tmp[PATH_MAX], path[PATH_MAX], hex[65];
    uint64_t size = f->len;
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", dir, f->name);
    snprintf(path, sizeof path, "%s/%s", dir, f->name);
    int fd = -1, ok;
    if (f->kind == CKPT_STAGED) {
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        ok = fd >= 0 && ckpt_write_hashed(fd, b->stage->base + f->off, f->len, hex) == 0 &&
             fsync(fd) == 0;
    } else {
        fd = open(tmp, O_RDWR | O_CLOEXEC);
        ok = fd >= 0 && fsync(fd) == 0;
        ok = ok && ckpt_hash_file(tmp, hex, &size) == 0;
    }
    int e = errno;
    if (fd >= 0 && close(fd) != 0 && ok) {
        ok = 0;
        e = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        e = errno;
    }
    if (!ok) {
        unlink(tmp); /* a partial file of maybe many GiB: not left behind */
        return gb_seterr(err, e == ENOSPC ? GPL_ERR_LIMIT : GPL_ERR_SYSTEM,
                         "rank %d: writing checkpoint file %s: %s; %s", j->rank, path, strerror(e),
                         e == ENOSPC ? "the checkpoint tier is full: free space there or lower "
                                       "keep"
                                     : "check the space and health of the checkpoint tier");
    }
    return manifest_add(j, f->name, size, hex, err);
}

static gpl_result_t write_job(ckpt_bg *b, ckpt_job *j, gb_err *err) {
    char dir[PATH_MAX], man[64];
    gpl_result_t rc = GPL_OK;
    step_dir(b->first, j->step, dir, sizeof dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return gb_seterr(err, GPL_ERR_SYSTEM, "rank %d: cannot create %s: %s", j->rank, dir,
                         strerror(errno));
    j->man_len = 0;
    for (int i = 0; i < j->nfiles && rc == GPL_OK; i++)
        rc = write_file(b, j, &j->files[i], dir, err);
    if (rc != GPL_OK) { /* the rest of this rank's files of the step go too */
        for (int i = 0; i < j->nfiles; i++) {
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s/.tmp-%s", dir, j->files[i].name);
            unlink(p);
        }
        return rc;
    }
    snprintf(man, sizeof man, "rank-%d.manifest", j->rank);
    if (ckpt_write_atomic(dir, man, j->manifest, j->man_len) != 0 || ckpt_fsync_dir(dir) != 0)
        return gb_seterr(err, errno == ENOSPC ? GPL_ERR_LIMIT : GPL_ERR_SYSTEM,
                         "rank %d: writing %s/%s: %s; check the space of the checkpoint tier %s",
                         j->rank, dir, man, strerror(errno), b->first->where);
    return GPL_OK;
}

static gpl_result_t mark_complete(ckpt_tier *t, int64_t step, int world, int64_t busy,
                                  gb_err *err) {
    char text[128];
    int n = ckpt_complete_text(text, sizeof text, step, world);
    gpl_result_t rc = ckpt_tier_put_small(t, step, "COMPLETE", text, (size_t)n, err);
    if (rc == GPL_OK && t->kind == CKPT_TIER_DIR)
        ckpt_fsync_dir(t->where);
    if (rc == GPL_OK)
        ckpt_tier_prune(t, step, busy);
    return rc;
}

/* Called with b->mu held, which it drops while writing: every step this rank
 * wrote that is not marked yet, up to `step` (which every rank wrote), is
 * marked COMPLETE, oldest first; those at or below `floor` (a write failed
 * somewhere then) only when they are `step` itself. Steps are marked when an
 * agreement shows them written everywhere; one agreement may show several. */
static void mark_written(ckpt_bg *b, int64_t step, int world, int64_t floor) {
    int64_t todo[CKPT_WRITTEN_KEEP];
    int n = 0;
    for (int i = 0; i < b->nwritten; i++)
        if (b->written[i] > b->local_marked && b->written[i] <= step &&
            (b->written[i] == step || b->written[i] > floor))
            todo[n++] = b->written[i];
    if (n == 0 || todo[n - 1] != step)
        todo[n++] = step; /* written before this process started (a restore), or forgotten */
    if (step > b->local_marked)
        b->local_marked = step;
    int64_t busy = b->draining;
    pthread_mutex_unlock(&b->mu);
    pthread_mutex_lock(&b->mark_mu);
    for (int i = 0; i < n; i++) {
        gb_err e = GB_ERR_INIT;
        if (mark_complete(b->first, todo[i], world, busy, &e) != GPL_OK)
            say_failure("COMPLETE marker", todo[i], &e);
    }
    pthread_mutex_unlock(&b->mark_mu);
    pthread_mutex_lock(&b->mu);
}

/* Called with b->mu held, which it drops: in a job small enough, the rank
 * that finishes a step last sees every rank's manifest in a shared tier and
 * marks the step COMPLETE at once, without waiting for an agreement. */
static void look_and_mark(ckpt_bg *b, ckpt_tier *t, int64_t step, int world) {
    if (world > CKPT_LOOK_MAX_WORLD)
        return;
    int64_t busy = b->draining;
    pthread_mutex_unlock(&b->mu);
    if (ckpt_tier_manifests(t, step, world) == world) {
        gb_err e = GB_ERR_INIT;
        pthread_mutex_lock(&b->mark_mu);
        gpl_result_t rc = mark_complete(t, step, world, t == b->first ? busy : -1, &e);
        if (rc == GPL_OK && t == b->durable && atomic_load(&b->durable_complete) < step)
            atomic_store(&b->durable_complete, step);
        pthread_mutex_unlock(&b->mark_mu);
        if (rc != GPL_OK)
            say_failure("COMPLETE marker", step, &e);
    }
    pthread_mutex_lock(&b->mu);
}

static void *writer_main(void *arg) {
    ckpt_bg *b = arg;
    gb_thread_background("gpl-ckpt-write"); /* training's wake-ups come first */
    int64_t marked = -1;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        if (b->job_busy) {
            pthread_mutex_unlock(&b->mu);
            gb_err e = GB_ERR_INIT;
            gpl_result_t rc = write_job(b, &b->job, &e);
            if (rc != GPL_OK)
                say_failure("write", b->job.step, &e);
            pthread_mutex_lock(&b->mu);
            if (rc == GPL_OK) {
                atomic_store(&b->local_done, b->job.step);
                if (b->nwritten == CKPT_WRITTEN_KEEP)
                    memmove(b->written, b->written + 1, sizeof b->written - sizeof b->written[0]);
                else
                    b->nwritten++;
                b->written[b->nwritten - 1] = b->job.step;
                if (b->durable) {
                    b->drain_want = b->job.step;
                    b->drain_rank = b->job.rank;
                    b->drain_world = b->job.world;
                }
                look_and_mark(b, b->first, b->job.step, b->job.world);
            } else {
                b->werr = e;
                b->werr_step = b->job.step;
            }
            b->job_busy = 0;
            pthread_cond_broadcast(&b->cv);
            continue;
        }
        if (b->mark_local > marked) {
            int64_t s = b->mark_local;
            marked = s;
            mark_written(b, s, b->world_local, b->mark_floor);
            continue;
        }
        if (b->prefault) {
            uint64_t n = b->prefault;
            b->prefault = 0;
            pthread_mutex_unlock(&b->mu);
            ckpt_stage_populate(b->stage, n);
            pthread_mutex_lock(&b->mu);
            continue;
        }
        if (b->stop)
            break;
        pthread_cond_wait(&b->cv, &b->mu);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

typedef struct drain_ctx {
    ckpt_bg *b;
    uint64_t base; /* bytes of earlier files of this drain */
} drain_ctx;

static int on_drain_progress(uint64_t done, uint64_t total, void *user) {
    drain_ctx *d = user;
    (void)total;
    atomic_store(&d->b->drain_done, d->base + done);
    return atomic_load(&d->b->abandon);
}

/* This rank's files of step, from the first tier to the durable one, the manifest last. */
static gpl_result_t drain_step(ckpt_bg *b, int64_t step, int rank, gb_err *err) {
    char man[CKPT_MANIFEST_MAX], name[64], dir[PATH_MAX];
    size_t len = 0;
    gpl_result_t rc;
    snprintf(name, sizeof name, "rank-%d.manifest", rank);
    GB_CHECK_GOTO(ckpt_tier_get_small(b->first, step, name, man, sizeof man - 1, &len, err), rc,
                  out);
    man[len] = '\0';
    step_dir(b->first, step, dir, sizeof dir);
    uint64_t total = 0;
    ckpt_manifest_line m;
    for (const char *l = man; ckpt_manifest_next(&l, &m);)
        total += m.size;
    atomic_store(&b->drain_total, total);
    atomic_store(&b->drain_done, 0);
    atomic_store(&b->drain_started_ns, gb_now_ns());
    drain_ctx d = {b, 0};
    for (const char *l = man; ckpt_manifest_next(&l, &m);) {
        char src[PATH_MAX];
        snprintf(src, sizeof src, "%s/%s", dir, m.file);
        GB_CHECK_GOTO(
            ckpt_tier_put_file(b->durable, step, m.file, src, m.sha, on_drain_progress, &d, err),
            rc, out);
        d.base += m.size;
    }
    rc = ckpt_tier_put_small(b->durable, step, name, man, len, err);
out:
    return rc;
}

static void *drainer_main(void *arg) {
    ckpt_bg *b = arg;
    gb_thread_background("gpl-ckpt-drain"); /* its S3 part threads inherit it */
    int64_t tried = -1, marked = -1;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        if (b->drain_want > tried && !atomic_load(&b->abandon)) {
            int64_t s = b->drain_want;
            int rank = b->drain_rank;
            tried = s;
            b->draining = s;
            pthread_mutex_unlock(&b->mu);
            gb_err e = GB_ERR_INIT;
            uint64_t t0 = gb_now_ns();
            gpl_result_t rc = drain_step(b, s, rank, &e);
            double took = (double)(gb_now_ns() - t0) / 1e9;
            if (rc != GPL_OK && !atomic_load(&b->abandon))
                say_failure("drain to the durable tier", s, &e);
            pthread_mutex_lock(&b->mu);
            b->draining = -1;
            if (rc == GPL_OK) {
                uint64_t bytes = atomic_load(&b->drain_total);
                b->drain_rate = took > 0 ? (double)bytes / took : 0;
                atomic_store(&b->durable_done, s);
                look_and_mark(b, b->durable, s, b->drain_world);
                /* a newer step was written while this one drained: the drain falls behind
                 * the checkpoint interval (the steps between are never made durable) */
                if (b->drain_want > s && !b->drain_warned) {
                    b->drain_warned = 1;
                    fprintf(stderr,
                            "gpulaunch runtime: rank %d: the drain to %s falls behind the "
                            "checkpoints: step %lld (%.1f MB) took %.1f s at %.1f MB/s while "
                            "step %lld was written; only the newest steps are made durable "
                            "(said once)\n",
                            rank, b->durable->where, (long long)s, (double)bytes / 1e6, took,
                            b->drain_rate / 1e6, (long long)b->drain_want);
                }
            } else {
                b->derr = e;
                b->derr_step = s;
            }
            atomic_store(&b->drain_total, 0);
            pthread_cond_broadcast(&b->cv);
            continue;
        }
        if (b->mark_durable > marked) {
            int64_t s = b->mark_durable;
            int world = b->world_durable;
            marked = s;
            pthread_mutex_unlock(&b->mu);
            gb_err e = GB_ERR_INIT;
            pthread_mutex_lock(&b->mark_mu);
            gpl_result_t rc = atomic_load(&b->durable_complete) >= s
                                  ? GPL_OK
                                  : mark_complete(b->durable, s, world, -1, &e);
            if (rc == GPL_OK && atomic_load(&b->durable_complete) < s)
                atomic_store(&b->durable_complete, s);
            pthread_mutex_unlock(&b->mark_mu);
            if (rc != GPL_OK)
                say_failure("COMPLETE marker in the durable tier", s, &e);
            pthread_mutex_lock(&b->mu);
            continue;
        }
        if (b->stop && !b->job_busy) /* the writer may still hand over a step */
            break;
        pthread_cond_wait(&b->cv, &b->mu);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

gpl_result_t ckpt_bg_start(ckpt_bg *b, ckpt_tier *first, ckpt_tier *durable, ckpt_stage *stage,
                           gb_err *err) {
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->mu, NULL);
    pthread_mutex_init(&b->mark_mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->first = first;
    b->durable = durable;
    b->stage = stage;
    b->drain_want = b->draining = b->mark_local = b->mark_durable = -1;
    b->werr_step = b->derr_step = -1;
    b->local_marked = b->mark_floor = -1;
    atomic_store(&b->local_done, -1);
    atomic_store(&b->durable_done, -1);
    atomic_store(&b->durable_complete, -1);
    int e = pthread_create(&b->writer, NULL, writer_main, b);
    if (e == 0) {
        b->have_writer = 1;
        if (durable && (e = pthread_create(&b->drainer, NULL, drainer_main, b)) == 0)
            b->have_drainer = 1;
    }
    if (e != 0) {
        ckpt_bg_stop(b);
        return gb_seterr(err, GPL_ERR_SYSTEM, "cannot start the checkpoint threads: %s",
                         strerror(e));
    }
    return GPL_OK;
}

void ckpt_bg_wait_writer(ckpt_bg *b, double *waited_s) {
    uint64_t t0 = gb_now_ns();
    pthread_mutex_lock(&b->mu);
    while (b->job_busy)
        pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
    if (waited_s)
        *waited_s = (double)(gb_now_ns() - t0) / 1e9;
}

void ckpt_bg_submit(ckpt_bg *b) {
    pthread_mutex_lock(&b->mu);
    b->job_busy = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void ckpt_bg_abandon(ckpt_bg *b) {
    atomic_store(&b->abandon, 1);
    pthread_mutex_lock(&b->mu);
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void ckpt_bg_prefault(ckpt_bg *b, uint64_t n) {
    if (!b->have_writer || b->stage == NULL)
        return;
    n = ckpt_stage_expect(b->stage, n);
    pthread_mutex_lock(&b->mu);
    b->prefault = n;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void ckpt_bg_mark_local(ckpt_bg *b, int64_t step, int world, int64_t floor) {
    if (!b->is_marker)
        return;
    pthread_mutex_lock(&b->mu);
    if (step > b->mark_local) {
        b->mark_local = step;
        b->world_local = world;
        b->mark_floor = floor;
    }
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void ckpt_bg_mark_durable(ckpt_bg *b, int64_t step, int world) {
    if (!b->is_root || !b->have_drainer)
        return;
    pthread_mutex_lock(&b->mu);
    if (step > b->mark_durable) {
        b->mark_durable = step;
        b->world_durable = world;
    }
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

gpl_result_t ckpt_bg_mark_local_now(ckpt_bg *b, int64_t step, int world, int64_t floor,
                                    gb_err *err) {
    if (!b->is_marker)
        return GPL_OK;
    pthread_mutex_lock(&b->mu);
    if (step > b->mark_local) { /* the writer need not do it again */
        b->mark_local = step;
        b->world_local = world;
    }
    mark_written(b, step, world, floor);
    pthread_mutex_unlock(&b->mu);
    (void)err; /* said on stderr, as the background marks: training goes on */
    return GPL_OK;
}

gpl_result_t ckpt_bg_mark_durable_now(ckpt_bg *b, int64_t step, int world, gb_err *err) {
    if (!b->is_root || !b->durable)
        return GPL_OK;
    pthread_mutex_lock(&b->mark_mu);
    gpl_result_t rc = atomic_load(&b->durable_complete) >= step
                          ? GPL_OK
                          : mark_complete(b->durable, step, world, -1, err);
    if (rc == GPL_OK && atomic_load(&b->durable_complete) < step)
        atomic_store(&b->durable_complete, step);
    pthread_mutex_unlock(&b->mark_mu);
    return rc;
}

int ckpt_bg_wait_drained(ckpt_bg *b, int64_t step, double deadline_s) {
    pthread_mutex_lock(&b->mu);
    for (;;) {
        if (atomic_load(&b->durable_done) >= step)
            break;
        /* nothing left that could drain it: written, not wanted, not in flight */
        if (!b->job_busy && b->draining < 0 && b->drain_want < step &&
            atomic_load(&b->local_done) < step)
            break;
        if (!b->job_busy && b->draining < 0 && b->derr_step == step)
            break;
        if (deadline_s > 0) {
            double left = deadline_s - gb_wall_s();
            if (left <= 0)
                break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double w = left < 0.05 ? left : 0.05;
            ts.tv_nsec += (long)(w * 1e9);
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&b->cv, &b->mu, &ts);
        } else {
            pthread_cond_wait(&b->cv, &b->mu);
        }
    }
    int ok = atomic_load(&b->durable_done) >= step;
    pthread_mutex_unlock(&b->mu);
    return ok;
}

void ckpt_bg_stop(ckpt_bg *b) {
    pthread_mutex_lock(&b->mu);
    b->stop = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    if (b->have_writer)
        pthread_join(b->writer, NULL);
    if (b->have_drainer)
        pthread_join(b->drainer, NULL);
    b->have_writer = b->have_drainer = 0;
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    pthread_mutex_destroy(&b->mark_mu);
}
