/* Checkpoints agreed by every rank (the public gpl_ckpt_* API): at the step
 * boundary one small all-reduce decides whether this step is saved (a
 * preemption anywhere, or a periodic checkpoint) and carries what every rank's
 * background threads finished, so that a step is marked COMPLETE in a tier
 * only once every rank's files are there. A save copies the state into the
 * staging buffer and returns; the writer and the drainer (ckpt_writer.c) do
 * the rest. A preemption's save is the same save, waited for: written, marked,
 * drained before the deadline, then GPL_ERR_PREEMPTED. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "gb_progress.h"
#include "gb_stop.h"
#include "gb_time.h"

#define CKPT_DRAIN_MARGIN_S 2.0 /* a preemption's drain ends this long before the deadline */
#define CKPT_WAIT_SAY_S 60.0    /* a save waiting for the previous one is said this often */

struct gpl_ckpt {
    gpl_comm_t c;
    gpl_ckpt_options o;
    ckpt_tier local, durable;
    ckpt_tier *first;   /* where the writer writes: &local, or &durable without dir */
    ckpt_tier *drainto; /* &durable when both are given, else NULL */
    ckpt_stage stage;
    ckpt_bg bg;
    int bg_started;
    gpl_save_fn save;
    gpl_load_fn load;
    void *user;
    double last_save_s;
    int64_t last_saved_step;
    char stepdir[PATH_MAX];
    int saving, loading; /* inside the save / load callback */
    uint64_t loaded_own; /* bytes of this rank's own files the load callback found */
    int64_t load_step;   /* the step being loaded ... */
    int load_world;      /* ... the world that saved it ... */
    int load_durable;    /* ... and whether the durable tier has it COMPLETE */
    uint32_t push_seen;  /* the rendezvous' checkpoint notices acted on ... */
    int push_reforms;    /* ... on the connection of this re-formation */
    int64_t local_marked, durable_marked; /* newest steps every rank wrote / drained */
    int64_t fail_floor; /* newest step some rank failed to write (the last agreement's) */
    double last_stall_s, last_wait_s;
    int waits;                    /* saves that waited for the previous one */
    double waited_s, wait_said_s; /* their time in all; when that was last said */
};

static volatile sig_atomic_t sigterm_seen;

/* SIGTERM asks for a checkpoint, unless the launcher says the round is over
 * (gb_stop.h): then this process's state is discarded, and it ends as an
 * unhandled SIGTERM would end it, even inside a framework's collective. */
static void on_sigterm(int sig, siginfo_t *si, void *ctx) {
    if (si && si->si_code == SI_QUEUE && si->si_value.sival_int == GB_SIGVAL_ROUND_OVER &&
        si->si_pid == getppid()) {
        signal(SIGTERM, SIG_DFL);
        raise(SIGTERM);
        return;
    }
    sigterm_seen = 1;
}

static void ckpt_free(gpl_ckpt_t k) {
    if (k == NULL)
        return;
    if (k->bg_started)
        ckpt_bg_stop(&k->bg); /* what is in flight is written first */
    ckpt_tier_close(&k->local);
    ckpt_tier_close(&k->durable);
    ckpt_stage_free(&k->stage);
    free(k);
}

void gpl__ckpt_destroy(gpl_comm_t c) {
    ckpt_free(c->ckpt);
    c->ckpt = NULL;
}

static int env_flag(const char *name, int dflt) {
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return dflt;
    return !(strcmp(v, "0") == 0 || strcmp(v, "false") == 0 || strcmp(v, "off") == 0);
}

gpl_result_t gpl_ckpt_setup(gpl_comm_t c, const gpl_ckpt_options *o, gpl_save_fn save,
                            gpl_load_fn load, void *user) {
    if (c == NULL || o == NULL || o->version < 1 || o->version > GPL_CKPT_OPTIONS_VERSION ||
        o->size < offsetof(gpl_ckpt_options, durable))
        return GPL_ERR_INVALID_ARG;
    gb_clearerr(&c->err);
    gpl_result_t rc = GPL_OK;
    gpl_ckpt_t k = calloc(1, sizeof *k);
    if (k == NULL)
        return GPL_ERR_NOMEM;
    k->c = c;
    gpl_ckpt_options dflt = GPL_CKPT_OPTIONS_INIT;
    k->o = dflt;
    memcpy(&k->o, o, o->size < sizeof k->o ? o->size : sizeof k->o); /* a version 1 caller's */
    k->o.size = sizeof k->o;
    k->o.version = GPL_CKPT_OPTIONS_VERSION;
    if (k->o.keep < 1)
        k->o.keep = 3;
    if (k->o.keep_durable < 1)
        k->o.keep_durable = k->o.keep;
    /* the environment's say, for programs that do not expose the options
     * (docs/checkpoints.md): GPULAUNCH_CKPT_DURABLE, GPULAUNCH_CKPT_ASYNC */
    const char *durable = k->o.durable;
    if ((durable == NULL || *durable == '\0') && getenv("GPULAUNCH_CKPT_DURABLE") &&
        *getenv("GPULAUNCH_CKPT_DURABLE"))
        durable = getenv("GPULAUNCH_CKPT_DURABLE");
    if (durable && *durable == '\0')
        durable = NULL;
    k->o.async_save = env_flag("GPULAUNCH_CKPT_ASYNC", k->o.async_save);
    if (k->o.dir && *k->o.dir)
        GB_CHECK_GOTO(ckpt_tier_open(&k->local, k->o.dir, k->o.keep, &c->err), rc, out);
    if (durable) {
        if (!(k->o.dir && *k->o.dir) && strncmp(durable, "s3://", 5) == 0) {
            rc = gb_seterr(&c->err, GPL_ERR_CONFIG,
                           "checkpoint durable tier %s needs a local directory to write to "
                           "first and drain from: give the checkpoint a dir (the node's disk)",
                           durable);
            goto out;
        }
        GB_CHECK_GOTO(ckpt_tier_open(&k->durable, durable, k->o.keep_durable, &c->err), rc, out);
    }
    k->first = k->o.dir && *k->o.dir ? &k->local : durable ? &k->durable : NULL;
    k->drainto = k->first == &k->local && durable ? &k->durable : NULL;
    if (k->o.state_bytes > CKPT_STAGE_RESERVE) {
        rc = gb_seterr(&c->err, GPL_ERR_LIMIT,
                       "gpl_ckpt_setup: state_bytes %llu is over %llu GiB, the most one rank can "
                       "checkpoint (CKPT_STAGE_RESERVE): save less a rank (more ranks, or shards)",
                       (unsigned long long)k->o.state_bytes,
                       (unsigned long long)(CKPT_STAGE_RESERVE >> 30));
        goto out;
    }
    if (k->first) {
        GB_CHECK_GOTO(ckpt_stage_init(&k->stage, &c->err), rc, out);
        GB_CHECK_GOTO(ckpt_bg_start(&k->bg, k->first, k->drainto, &k->stage, &c->err), rc, out);
        k->bg_started = 1;
        /* the first save's page faults taken now, in the background; the
         * slack covers each file's 64-byte alignment in the buffer */
        if (k->o.async_save && k->o.state_bytes > 0)
            ckpt_bg_prefault(&k->bg, k->o.state_bytes + CKPT_STAGE_SLACK);
    }
    k->o.dir = k->o.durable = NULL; /* do not keep the caller's pointers */
    k->save = save;
    k->load = load;
    k->user = user;
    k->last_save_s = gb_wall_s();
    k->last_saved_step = k->local_marked = k->durable_marked = -1;
    if (k->o.handle_sigterm) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigterm;
        sa.sa_flags = SA_RESTART | SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        gb_progress_set_ckpt_ready(1); /* a preemption's stop need not wait for us any more */
    }
    ckpt_free(c->ckpt);
    c->ckpt = k;
    k = NULL;
out:
    ckpt_free(k);
    return rc;
}

/* A file name given by the caller: 1 to CKPT_NAME_MAX characters, no '/'. */
static gpl_result_t check_name(gpl_ckpt_t k, const char *fn, const char *name) {
    if (k == NULL)
        return GPL_ERR_INVALID_ARG;
    gb_clearerr(&k->c->err); /* each call's own error is the last one */
    if (name == NULL || *name == '\0' || strlen(name) > CKPT_NAME_MAX || strchr(name, '/'))
        return gb_seterr(&k->c->err, GPL_ERR_INVALID_ARG,
                         "%s: a checkpoint file name of 1 to %d characters without '/' is "
                         "needed, not '%s'",
                         fn, CKPT_NAME_MAX, name ? name : "(null)");
    return GPL_OK;
}

/* Inside the save callback only: the step directory exists and the job is open. */
static gpl_result_t check_saving(gpl_ckpt_t k, const char *fn) {
    if (!k->saving)
        return gb_seterr(&k->c->err, GPL_ERR_STATE,
                         "%s outside the save callback: call it from the function given to "
                         "gpl_ckpt_setup as save",
                         fn);
    return GPL_OK;
}

static gpl_result_t add_file(gpl_ckpt_t k, const char *name, int kind, ckpt_file **out) {
    ckpt_job *j = &k->bg.job;
    gpl_comm_t c = k->c;
    char file[CKPT_FILE_MAX];
    snprintf(file, sizeof file, "r%d-%s", c->rank, name);
    for (int i = 0; i < j->nfiles; i++)
        if (strcmp(j->files[i].name, file) == 0)
            return gb_seterr(&c->err, GPL_ERR_EXISTS,
                             "rank %d: checkpoint file '%s' saved twice in step %lld; give each "
                             "file its own name",
                             c->rank, name, (long long)j->step);
    if (j->nfiles >= CKPT_MAX_FILES)
        return gb_seterr(&c->err, GPL_ERR_LIMIT,
                         "rank %d: more than %d checkpoint files in one save (CKPT_MAX_FILES); "
                         "put several tensors in one file",
                         c->rank, CKPT_MAX_FILES);
    ckpt_file *f = &j->files[j->nfiles++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", file);
    f->kind = kind;
    *out = f;
    return GPL_OK;
}

gpl_result_t gpl_ckpt_stage(gpl_ckpt_t k, const char *name, size_t size, void **buf) {
    gpl_result_t rc = check_name(k, "gpl_ckpt_stage", name);
    if (rc == GPL_OK && buf == NULL)
        rc = gb_seterr(&k->c->err, GPL_ERR_INVALID_ARG, "gpl_ckpt_stage: buf is NULL");
    if (rc == GPL_OK)
        rc = check_saving(k, "gpl_ckpt_stage");
    if (rc != GPL_OK)
        return rc;
    ckpt_file *f = NULL;
    uint8_t *p = NULL;
    if ((rc = ckpt_stage_take(&k->stage, size, &p, &k->c->err)) != GPL_OK ||
        (rc = add_file(k, name, CKPT_STAGED, &f)) != GPL_OK)
        return rc;
    f->off = (uint64_t)(p - k->stage.base);
    f->len = size;
    *buf = p;
    return GPL_OK;
}

gpl_result_t gpl_ckpt_write(gpl_ckpt_t k, const char *name, const void *data, size_t len) {
    if (k != NULL && len && data == NULL)
        return gb_seterr(&k->c->err, GPL_ERR_INVALID_ARG, "gpl_ckpt_write: NULL data for '%s'",
                         name ? name : "(null)");
    void *p = NULL;
    gpl_result_t rc = gpl_ckpt_stage(k, name, len, &p);
    if (rc == GPL_OK && len)
        memcpy(p, data, len); /* the stall of an asynchronous save: this copy */
    return rc;
}

gpl_result_t gpl_ckpt_temp_path(gpl_ckpt_t k, const char *name, char *path, size_t len) {
    gpl_result_t rc = check_name(k, "gpl_ckpt_temp_path", name);
    if (rc == GPL_OK)
        rc = check_saving(k, "gpl_ckpt_temp_path");
    if (rc != GPL_OK)
        return rc;
    int n = snprintf(path, len, "%s/.tmp-r%d-%s", k->stepdir, k->c->rank, name);
    if (n < 0 || (size_t)n >= len)
        return gb_seterr(&k->c->err, GPL_ERR_LIMIT,
                         "gpl_ckpt_temp_path: %d bytes are needed for the path of '%s', the "
                         "buffer holds %zu",
                         n + 1, name, len);
    return GPL_OK;
}

gpl_result_t gpl_ckpt_commit(gpl_ckpt_t k, const char *name) {
    gpl_result_t rc = check_name(k, "gpl_ckpt_commit", name);
    if (rc == GPL_OK)
        rc = check_saving(k, "gpl_ckpt_commit");
    if (rc != GPL_OK)
        return rc;
    gpl_comm_t c = k->c;
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/.tmp-r%d-%s", k->stepdir, c->rank, name);
    if (access(tmp, F_OK) != 0)
        return gb_seterr(&c->err, errno == ENOENT ? GPL_ERR_NOT_FOUND : GPL_ERR_SYSTEM,
                         "rank %d: gpl_ckpt_commit('%s'): %s: %s; write the file at the path "
                         "gpl_ckpt_temp_path gave first",
                         c->rank, name, tmp, strerror(errno));
    ckpt_file *f = NULL;
    /* fsync, hash and rename: the writer's work, in the background */
    return add_file(k, name, CKPT_TEMPFILE, &f);
}

gpl_comm_t gpl_ckpt_comm(gpl_ckpt_t k) { return k ? k->c : NULL; }

/* The save callback failed: this rank's temporary files (gpl_ckpt_temp_path,
 * committed or not) go, so a half-written state of many GiB is not left behind. */
static void remove_temps(gpl_ckpt_t k) {
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, ".tmp-r%d-", k->c->rank);
    DIR *d = opendir(k->stepdir);
    if (d == NULL || n <= 0) {
        if (d)
            closedir(d);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, (size_t)n) != 0)
            continue;
        char f[PATH_MAX];
        snprintf(f, sizeof f, "%s/%s", k->stepdir, e->d_name);
        unlink(f);
    }
    closedir(d);
}

/* The state of step copied into the staging buffer and handed to the writer;
 * with sync (or a synchronous checkpoint) waited for until written. */
static gpl_result_t save_step(gpl_ckpt_t k, int64_t step, double left, int sync) {
    gpl_comm_t c = k->c;
    if (k->first == NULL || k->save == NULL || step == k->last_saved_step)
        return GPL_OK;
    double t0 = gb_wall_s(), waited = 0;
    ckpt_bg_wait_writer(&k->bg, &waited); /* the staging buffer is free again */
    if (waited >= 0.001) {                /* said the first time, then at most once a minute */
        k->waits++;
        k->waited_s += waited;
        if (k->waits == 1 || t0 - k->wait_said_s >= CKPT_WAIT_SAY_S) {
            fprintf(stderr,
                    "gpulaunch runtime: rank %d: the checkpoint of step %lld waited %.3f s for "
                    "the previous one (step %lld) to be written (%d such waits, %.1f s in all); "
                    "checkpoints come faster than the tier %s takes them: checkpoint less "
                    "often\n",
                    c->rank, (long long)step, waited, (long long)k->bg.job.step, k->waits,
                    k->waited_s, k->first->where);
            k->wait_said_s = t0;
        }
    }
    char sname[32];
    ckpt_step_name(step, sname, sizeof sname);
    snprintf(k->stepdir, sizeof k->stepdir, "%s/%s", k->first->where, sname);
    if (mkdir(k->stepdir, 0755) != 0 && errno != EEXIST)
        return gb_seterr(&c->err, GPL_ERR_SYSTEM, "rank %d: cannot create %s: %s", c->rank,
                         k->stepdir, strerror(errno));
    ckpt_job *j = &k->bg.job;
    j->step = step;
    j->rank = c->rank;
    j->world = c->world;
    j->nfiles = 0;
    ckpt_stage_reset(&k->stage);
    k->bg.is_marker = c->local_rank == 0;
    k->bg.is_root = c->rank == 0;
    k->saving = 1;
    gpl_result_t rc = k->save(k, step, left, k->user);
    k->saving = 0;
    if (rc != GPL_OK) {
        remove_temps(k);
        j->nfiles = 0;
        return gb_seterr(&c->err, rc, "rank %d: the save callback failed at step %lld", c->rank,
                         (long long)step);
    }
    ckpt_bg_submit(&k->bg);
    k->last_saved_step = step;
    k->last_save_s = gb_wall_s();
    k->last_stall_s = k->last_save_s - t0;
    k->last_wait_s = waited;
    if (!sync)
        return GPL_OK;
    ckpt_bg_wait_writer(&k->bg, NULL);
    if (atomic_load(&k->bg.local_done) < step)
        return gb_seterr(&c->err, k->bg.werr.code ? k->bg.werr.code : GPL_ERR_SYSTEM, "%s",
                         gb_errmsg(&k->bg.werr));
    k->last_stall_s = gb_wall_s() - t0;
    return GPL_OK;
}

/* What every rank finished: the newest step all wrote (*all_local) and all
 * drained (*all_durable), with flags ORed, in one all-reduce. */
static gpl_result_t agree(gpl_ckpt_t k, int64_t flags[2], int64_t *all_local,
                          int64_t *all_durable) {
    gpl_comm_t c = k->c;
    int64_t v[5] = {flags ? flags[0] : 0, flags ? flags[1] : 0, 0, 0, -1};
    v[2] = k->bg_started ? -atomic_load(&k->bg.local_done) : 1;
    v[3] = k->drainto ? -atomic_load(&k->bg.durable_done) : 1;
    if (k->bg_started) {
        pthread_mutex_lock(&k->bg.mu);
        v[4] = k->bg.werr_step; /* the newest step this rank failed to write */
        pthread_mutex_unlock(&k->bg.mu);
    }
    /* the minimum of what each rank finished is the maximum of its negation */
    if (c->world > 1) {
        gpl_result_t rc = gpl_allreduce(c, v, v, 5, GPL_INT64, GPL_MAX, NULL);
        if (rc != GPL_OK)
            return rc;
    }
    if (flags) {
        flags[0] = v[0];
        flags[1] = v[1];
    }
    *all_local = -v[2];
    *all_durable = -v[3];
    k->fail_floor = v[4];
    return GPL_OK;
}

/* Marks what every rank finished COMPLETE, in the background or now. */
static gpl_result_t mark(gpl_ckpt_t k, int64_t all_local, int64_t all_durable, int now) {
    gpl_comm_t c = k->c;
    gpl_result_t rc = GPL_OK;
    if (!k->bg_started)
        return GPL_OK;
    k->bg.is_marker = c->local_rank == 0;
    k->bg.is_root = c->rank == 0;
    if (all_local > k->local_marked) {
        k->local_marked = all_local;
        if (now)
            rc = ckpt_bg_mark_local_now(&k->bg, all_local, c->world, k->fail_floor, &c->err);
        else
            ckpt_bg_mark_local(&k->bg, all_local, c->world, k->fail_floor);
    }
    if (k->drainto && all_durable > k->durable_marked && rc == GPL_OK) {
        k->durable_marked = all_durable;
        if (now)
            rc = ckpt_bg_mark_durable_now(&k->bg, all_durable, c->world, &c->err);
        else
            ckpt_bg_mark_durable(&k->bg, all_durable, c->world);
    }
    return rc;
}

/* A preemption's checkpoint, after it was staged: written, agreed, marked,
 * drained before the deadline, agreed and marked again. */
static gpl_result_t finish_preempt(gpl_ckpt_t k, int64_t step, double deadline_s,
                                   char *durable_note, size_t note_len) {
    gpl_comm_t c = k->c;
    int64_t all_local = -1, all_durable = -1;
    gpl_result_t rc;
    durable_note[0] = '\0';
    if (!k->bg_started)
        return GPL_OK;
    ckpt_bg_wait_writer(&k->bg, NULL);
    if (k->drainto)
        ckpt_bg_wait_drained(&k->bg, step, deadline_s - CKPT_DRAIN_MARGIN_S);
    if ((rc = agree(k, NULL, &all_local, &all_durable)) != GPL_OK ||
        (rc = mark(k, all_local, all_durable, 1)) != GPL_OK)
        return rc;
    if (all_local < step)
        return gb_seterr(&c->err, GPL_ERR_SYSTEM,
                         "rank %d: the preemption's checkpoint of step %lld was not written by "
                         "every rank (%s); the newest complete one is step %lld",
                         c->rank, (long long)step,
                         k->bg.werr_step == step ? gb_errmsg(&k->bg.werr) : "another rank failed",
                         (long long)all_local);
    if (k->drainto) {
        if (all_durable >= step)
            snprintf(durable_note, note_len, ", durable in %s", k->durable.where);
        else {
            snprintf(durable_note, note_len,
                     "; NOT durable before the deadline: the newest durable step in %s is %lld",
                     k->durable.where, (long long)k->durable_marked);
            ckpt_bg_abandon(&k->bg); /* the process ends now, not when a part gets through */
        }
    }
    return GPL_OK;
}

static void report_progress(gpl_ckpt_t k) {
    if (!k->bg_started)
        return;
    uint64_t total = atomic_load(&k->bg.drain_total), done = atomic_load(&k->bg.drain_done);
    gb_progress_ckpt(atomic_load(&k->bg.local_done), k->durable_marked,
                     (uint64_t)(k->last_stall_s * 1e6), total > done ? total - done : 0);
}

gpl_result_t gpl_step_end(gpl_comm_t c, int64_t step) {
    gpl_ckpt_t k = c ? c->ckpt : NULL;
    if (k == NULL)
        return c ? gb_seterr(&c->err, GPL_ERR_STATE, "gpl_step_end before gpl_ckpt_setup")
                 : GPL_ERR_INVALID_ARG;
    gb_progress_step(step); /* the launcher's watchdog and straggler detection */
    const rdzv_push_state *push = NULL;
    if (c->rdzv) {
        rdzv_bclient_poll(c->rdzv, 0);
        push = rdzv_bclient_pushes(c->rdzv);
    }
    /* a notice the rendezvous pushed since the last step end (each is acted
     * on once: a rank that goes on does not save again at the next step) */
    int notice = 0;
    if (push) {
        if (k->push_reforms != c->reforms) { /* a new connection counts from 0 */
            k->push_reforms = c->reforms;
            k->push_seen = 0;
        }
        notice = push->checkpoint_seq != k->push_seen;
        k->push_seen = push->checkpoint_seq;
    }
    int64_t flags[2] = {sigterm_seen || notice, 0}, all_local = -1, all_durable = -1;
    if (c->rank == 0 && k->o.every_seconds > 0 &&
        gb_wall_s() - k->last_save_s >= k->o.every_seconds)
        flags[1] = 1;
    gpl_result_t rc = agree(k, flags, &all_local, &all_durable);
    if (rc != GPL_OK)
        return rc;
    mark(k, all_local, all_durable, 0);
    report_progress(k);
    int periodic = flags[1] || (k->o.every_steps > 0 && step > 0 && step % k->o.every_steps == 0);
    if (!flags[0] && !periodic)
        return GPL_OK;
    double left = 1e9;
    if (flags[0]) {
        const char *g = getenv("GPULAUNCH_GRACE_S");
        left = g ? strtod(g, NULL) : 30.0;
        if (push && push->checkpoint_deadline_unix_ms)
            left = (double)push->checkpoint_deadline_unix_ms / 1000.0 - gb_wall_s();
    }
    double t0 = gb_wall_s(), deadline = t0 + left;
    gb_progress_set_state(GB_PROGRESS_SAVING); /* the hang watchdog waits for a save */
    rc = save_step(k, step, left, flags[0] || !k->o.async_save);
    char note[PATH_MAX + 128] = "";
    if (rc == GPL_OK && flags[0])
        rc = finish_preempt(k, step, deadline, note, sizeof note);
    gb_progress_set_state(GB_PROGRESS_RUNNING);
    report_progress(k);
    if (rc != GPL_OK)
        return rc;
    if (!flags[0])
        return GPL_OK;
    const char *why = push && push->checkpoint_seq ? push->checkpoint_reason
                      : sigterm_seen               ? "SIGTERM"
                                                   : "another rank's request";
    /* Another node goes away, and this one's launcher keeps workers that
     * re-form in place (an elastic job): this rank saved the same step as
     * every other and goes on; it re-forms when that node has left. */
    if (!sigterm_seen && gb_progress_goes_on()) {
        fprintf(stderr,
                "gpulaunch runtime: rank %d: checkpoint of step %lld written in %.3f s%s for a "
                "preemption (%s); going on: this node is not the one going away\n",
                c->rank, (long long)step, gb_wall_s() - t0, note, why);
        return GPL_OK;
    }
    return gb_seterr(&c->err, GPL_ERR_PREEMPTED,
                     "rank %d: checkpoint of step %lld written in %.3f s%s; stopping for a "
                     "preemption (%s); exit with code %d",
                     c->rank, (long long)step, gb_wall_s() - t0, note, why, GPL_EXIT_PREEMPTED);
}

gpl_result_t gpl_ckpt_wait(gpl_comm_t c) {
    gpl_ckpt_t k = c ? c->ckpt : NULL;
    if (k == NULL)
        return c ? gb_seterr(&c->err, GPL_ERR_STATE, "gpl_ckpt_wait before gpl_ckpt_setup")
                 : GPL_ERR_INVALID_ARG;
    gb_clearerr(&c->err);
    if (!k->bg_started)
        return GPL_OK;
    int64_t all_local = -1, all_durable = -1;
    gb_progress_set_state(GB_PROGRESS_SAVING);
    ckpt_bg_wait_writer(&k->bg, NULL);
    if (k->drainto)
        ckpt_bg_wait_drained(&k->bg, atomic_load(&k->bg.local_done), 0);
    gpl_result_t rc = agree(k, NULL, &all_local, &all_durable);
    if (rc == GPL_OK)
        rc = mark(k, all_local, all_durable, 1);
    gb_progress_set_state(GB_PROGRESS_RUNNING);
    report_progress(k);
    return rc;
}

gpl_result_t gpl_ckpt_status_get(gpl_comm_t c, gpl_ckpt_status *out) {
    if (c == NULL || out == NULL || out->size < sizeof *out ||
        out->version != GPL_CKPT_STATUS_VERSION)
        return GPL_ERR_INVALID_ARG;
    gpl_ckpt_t k = c->ckpt;
    gpl_ckpt_status s = GPL_CKPT_STATUS_INIT;
    if (k && k->bg_started) {
        s.local_step = atomic_load(&k->bg.local_done);
        s.durable_step = atomic_load(&k->bg.durable_done);
        s.complete_step = k->local_marked;
        s.durable_complete_step = k->durable_marked;
        s.last_stall_s = k->last_stall_s;
        s.last_wait_s = k->last_wait_s;
        s.drain_total = atomic_load(&k->bg.drain_total);
        s.drain_bytes = s.drain_total ? atomic_load(&k->bg.drain_done) : 0;
        pthread_mutex_lock(&k->bg.mu);
        s.drain_rate = k->bg.drain_rate;
        pthread_mutex_unlock(&k->bg.mu);
    }
    *out = s;
    return GPL_OK;
}

/* ---- restore's side of the callbacks (the choice of step: ckpt_restore.c) ---- */

gpl_result_t gpl__ckpt_restore_load(gpl_ckpt_t k, int64_t step, int world, int durable_ok) {
    gpl_comm_t c = k->c;
    char sname[32];
    ckpt_step_name(step, sname, sizeof sname);
    snprintf(k->stepdir, sizeof k->stepdir, "%s/%s", k->first->where, sname);
    k->load_step = step;
    k->load_world = world;
    k->load_durable = durable_ok;
    k->loading = 1;
    k->loaded_own = 0;
    gpl_result_t rc = k->load ? k->load(k, step, k->user) : GPL_OK;
    k->loading = 0;
    if (rc != GPL_OK)
        return gb_seterr(&c->err, rc, "rank %d: the load callback failed for %s", c->rank,
                         k->stepdir);
    k->last_saved_step = step;
    /* the next save is this size again: its staging pages are faulted in now,
     * in the background, instead of during that save's stall */
    if (k->bg_started)
        ckpt_bg_prefault(&k->bg, k->loaded_own);
    return GPL_OK;
}

ckpt_tier *gpl__ckpt_first(gpl_ckpt_t k) { return k->first; }
ckpt_tier *gpl__ckpt_durable(gpl_ckpt_t k) { return k->drainto; }

/* Inside the load callback: this rank's file `name`, else rank 0's (replicated
 * state reloads at any world size). */
static gpl_result_t find_file(gpl_ckpt_t k, const char *fn, const char *name, char *path,
                              size_t len, struct stat *st) {
    gpl_result_t rc = check_name(k, fn, name);
    if (rc != GPL_OK)
        return rc;
    gpl_comm_t c = k->c;
    if (!k->loading)
        return gb_seterr(&c->err, GPL_ERR_STATE,
                         "%s outside the load callback: call it from the function given to "
                         "gpl_ckpt_setup as load",
                         fn);
    int n = snprintf(path, len, "%s/r%d-%s", k->stepdir, c->rank, name);
    if (n < 0 || (size_t)n >= len)
        return gb_seterr(&c->err, GPL_ERR_LIMIT, "%s: the path of '%s' does not fit in %zu bytes",
                         fn, name, len);
    if (stat(path, st) == 0) {
        k->loaded_own += (uint64_t)st->st_size + 64; /* + staging's alignment */
        return GPL_OK;
    }
    n = snprintf(path, len, "%s/r0-%s", k->stepdir, name);
    if (n >= 0 && (size_t)n < len && stat(path, st) == 0)
        return GPL_OK;
    return gb_seterr(&c->err, GPL_ERR_NOT_FOUND,
                     "rank %d: no checkpoint file '%s' in %s (neither r%d-%s nor r0-%s); was it "
                     "saved under another name?",
                     c->rank, name, k->stepdir, c->rank, name, name);
}

gpl_result_t gpl_ckpt_path(gpl_ckpt_t k, const char *name, char *path, size_t len) {
    struct stat st;
    return find_file(k, "gpl_ckpt_path", name, path, len, &st);
}

gpl_result_t gpl_ckpt_read(gpl_ckpt_t k, const char *name, void *data, size_t len) {
    char path[PATH_MAX];
    struct stat st;
    gpl_result_t rc = find_file(k, "gpl_ckpt_read", name, path, sizeof path, &st);
    if (rc != GPL_OK)
        return rc;
    gpl_comm_t c = k->c;
    if ((size_t)st.st_size != len)
        return gb_seterr(&c->err, GPL_ERR_CORRUPT,
                         "checkpoint file %s holds %lld bytes, expected %zu (a different model?)",
                         path, (long long)st.st_size, len);
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(data, 1, len, f) : 0;
    if (f)
        fclose(f);
    if (got != len)
        return gb_seterr(&c->err, GPL_ERR_SYSTEM, "reading %s: %s", path, strerror(errno));
    return GPL_OK;
}

gpl_result_t gpl_ckpt_rank_path(gpl_ckpt_t k, int rank, const char *name, char *path, size_t len) {
    if (k == NULL || path == NULL || len == 0)
        return GPL_ERR_INVALID_ARG;
    gpl_result_t rc = check_name(k, "gpl_ckpt_rank_path", name);
    if (rc != GPL_OK)
        return rc;
    gpl_comm_t c = k->c;
    if (!k->loading)
        return gb_seterr(&c->err, GPL_ERR_STATE,
                         "gpl_ckpt_rank_path outside the load callback: call it from the function "
                         "given to gpl_ckpt_setup as load");
    if (rank < 0 || rank >= k->load_world)
        return gb_seterr(&c->err, GPL_ERR_INVALID_ARG,
                         "gpl_ckpt_rank_path: rank %d is not one of the %d ranks that saved %s "
                         "(gpl_ckpt_saved_world)",
                         rank, k->load_world, k->stepdir);
    char file[CKPT_FILE_MAX];
    snprintf(file, sizeof file, "r%d-%s", rank, name);
    return ckpt_restore_rank_file(c, k->load_step, k->load_world, k->load_durable, rank, file, path,
                                  len);
}

int gpl_ckpt_saved_world(gpl_ckpt_t k) { return k && k->loading ? k->load_world : 0; }
