/* Checkpoints agreed by every rank: at the step boundary one small all-reduce
 * decides whether this step is saved (a preemption anywhere, or a periodic
 * checkpoint), every rank writes its files atomically with a manifest of
 * sizes and SHA-256 sums, and rank 0 marks the step COMPLETE only after every
 * rank's files are durable. Restore takes the newest COMPLETE step whose
 * files all check out, skipping (and reporting) torn ones.
 *
 * DIR/step-000000000120/r0-params        files, r<rank>-<name>
 *                      /rank-0.manifest  "<file> <size> <sha256>" per line
 *                      /COMPLETE         "gpulaunch-checkpoint 1\nstep 120\nworld 4\n" */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gb_progress.h"
#include "gb_stop.h"
#include "gb_time.h"
#include "gpl_int.h"

#define CKPT_NAME_MAX 128       /* bytes of a file name given to gpl_ckpt_write */
#define CKPT_MANIFEST_MAX 65536 /* bytes of one rank's manifest */
#define CKPT_MAX_STEPS 4096     /* step directories looked at by restore */

struct gpl_ckpt {
    gpl_comm_t c;
    gpl_ckpt_options o;
    char dir[PATH_MAX - 64];
    gpl_save_fn save;
    gpl_load_fn load;
    void *user;
    double last_save_s;
    int64_t last_saved_step;
    char stepdir[PATH_MAX];
    char manifest[CKPT_MANIFEST_MAX];
    size_t man_len;
    int saving, loading; /* inside the save / load callback */
    uint32_t push_seen;  /* the rendezvous' checkpoint notices acted on ... */
    int push_reforms;    /* ... on the connection of this re-formation */
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

static double wall_s(void) { return gb_wall_s(); }

static void sha256_hex(const void *p, size_t n, char hex[65]) {
    unsigned char md[32];
    unsigned int len = 0;
    EVP_Digest(p, n, md, &len, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

/* SHA-256 of a file read in GPL_CKPT_HASH_PIECE pieces (never the whole file in
 * memory: a rank's state may be many GiB); *size is how many bytes it had. */
static int hash_file(const char *path, char hex[65], uint64_t *size) {
    int rc = -1, fd = -1;
    unsigned char md[32];
    unsigned int mdlen = 0;
    uint8_t *buf = malloc(GPL_CKPT_HASH_PIECE);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    *size = 0;
    if (buf == NULL || ctx == NULL || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL))
        goto out;
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        goto out;
    for (;;) {
        ssize_t n = read(fd, buf, GPL_CKPT_HASH_PIECE);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            goto out;
        if (n == 0)
            break;
        if (!EVP_DigestUpdate(ctx, buf, (size_t)n))
            goto out;
        *size += (uint64_t)n;
    }
    if (!EVP_DigestFinal_ex(ctx, md, &mdlen))
        goto out;
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    EVP_MD_CTX_free(ctx);
    free(buf);
    return rc;
}

static int fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Writes data to path through a temporary name, fsync'd, then renamed. */
static int write_atomic(const char *dir, const char *name, const void *data, size_t len) {
    char tmp[PATH_MAX], path[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", dir, name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    const uint8_t *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            close(fd);
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0)
        return -1;
    return rename(tmp, path);
}

gpl_result_t gpl_ckpt_setup(gpl_comm_t c, const gpl_ckpt_options *o, gpl_save_fn save,
                            gpl_load_fn load, void *user) {
    if (c == NULL || o == NULL || o->version != GPL_CKPT_OPTIONS_VERSION ||
        o->size < sizeof(gpl_ckpt_options))
        return GPL_ERR_INVALID_ARG;
    gpl_ckpt_t k = calloc(1, sizeof *k);
    if (k == NULL)
        return GPL_ERR_NOMEM;
    k->c = c;
    k->o = *o;
    if (k->o.keep < 1)
        k->o.keep = 3;
    if (o->dir) {
        if (strlen(o->dir) >= sizeof k->dir) {
            free(k);
            return gb_seterr(&c->err, GPL_ERR_INVALID_ARG, "checkpoint directory name too long");
        }
        snprintf(k->dir, sizeof k->dir, "%s", o->dir);
        if (mkdir(k->dir, 0755) != 0 && errno != EEXIST) {
            free(k);
            return gb_seterr(&c->err, GPL_ERR_SYSTEM,
                             "rank %d: cannot create checkpoint directory %s: %s", c->rank, o->dir,
                             strerror(errno));
        }
    }
    k->save = save;
    k->load = load;
    k->user = user;
    k->last_save_s = wall_s();
    k->last_saved_step = -1;
    k->o.dir = NULL; /* do not keep the caller's pointer */
    if (o->handle_sigterm) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigterm;
        sa.sa_flags = SA_RESTART | SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        gb_progress_set_ckpt_ready(1); /* a preemption's stop need not wait for us any more */
    }
    free(c->ckpt);
    c->ckpt = k;
    return GPL_OK;
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

/* Inside the save callback only: the step directory exists and the manifest is open. */
static gpl_result_t check_saving(gpl_ckpt_t k, const char *fn) {
    if (!k->saving)
        return gb_seterr(&k->c->err, GPL_ERR_STATE,
                         "%s outside the save callback: call it from the function given to "
                         "gpl_ckpt_setup as save",
                         fn);
    return GPL_OK;
}

static gpl_result_t manifest_add(gpl_ckpt_t k, const char *file, size_t len, const char *hex) {
    gpl_comm_t c = k->c;
    int w = snprintf(k->manifest + k->man_len, sizeof k->manifest - k->man_len, "%s %zu %s\n", file,
                     len, hex);
    if (w < 0 || (size_t)w >= sizeof k->manifest - k->man_len)
        return gb_seterr(&c->err, GPL_ERR_LIMIT,
                         "rank %d: more checkpoint files than the "
                         "%d-byte manifest holds",
                         c->rank, CKPT_MANIFEST_MAX);
    k->man_len += (size_t)w;
    return GPL_OK;
}

gpl_result_t gpl_ckpt_write(gpl_ckpt_t k, const char *name, const void *data, size_t len) {
    gpl_result_t rc = check_name(k, "gpl_ckpt_write", name);
    if (rc != GPL_OK)
        return rc;
    gpl_comm_t c = k->c;
    if (rc == GPL_OK && len && data == NULL)
        rc = gb_seterr(&c->err, GPL_ERR_INVALID_ARG, "gpl_ckpt_write: NULL data for '%s'", name);
    if (rc == GPL_OK)
        rc = check_saving(k, "gpl_ckpt_write");
    if (rc != GPL_OK)
        return rc;
    char file[CKPT_NAME_MAX + 32];
    snprintf(file, sizeof file, "r%d-%s", c->rank, name);
    if (write_atomic(k->stepdir, file, data, len) != 0)
        return gb_seterr(&c->err, GPL_ERR_SYSTEM, "rank %d: writing checkpoint file %s/%s: %s",
                         c->rank, k->stepdir, file, strerror(errno));
    char hex[65];
    sha256_hex(data, len, hex);
    return manifest_add(k, file, len, hex);
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
    char file[CKPT_NAME_MAX + 32], tmp[PATH_MAX], path[PATH_MAX], hex[65];
    snprintf(file, sizeof file, "r%d-%s", c->rank, name);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", k->stepdir, file);
    snprintf(path, sizeof path, "%s/%s", k->stepdir, file);
    uint64_t size = 0;
    int fd = open(tmp, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return gb_seterr(&c->err, errno == ENOENT ? GPL_ERR_NOT_FOUND : GPL_ERR_SYSTEM,
                         "rank %d: gpl_ckpt_commit('%s'): %s: %s; write the file at the path "
                         "gpl_ckpt_temp_path gave first",
                         c->rank, name, tmp, strerror(errno));
    int ok = fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || hash_file(tmp, hex, &size) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp); /* a partial file of maybe many GiB: not left behind */
        return gb_seterr(&c->err, GPL_ERR_SYSTEM,
                         "rank %d: committing checkpoint file %s: %s; check the space and "
                         "health of the checkpoint file system",
                         c->rank, path, strerror(e));
    }
    return manifest_add(k, file, (size_t)size, hex);
}

gpl_comm_t gpl_ckpt_comm(gpl_ckpt_t k) { return k ? k->c : NULL; }

/* Removes a step directory and everything in it. */
static void remove_step(const char *path) {
    DIR *d = opendir(path);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && (e->d_name[1] == '\0' || strcmp(e->d_name, "..") == 0))
            continue;
        char f[PATH_MAX];
        snprintf(f, sizeof f, "%s/%s", path, e->d_name);
        unlink(f);
    }
    closedir(d);
    rmdir(path);
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Step numbers of the step-* directories, newest first. */
static int list_steps(const char *dir, int64_t *steps, int max) {
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        long long s;
        char tail;
        if (sscanf(e->d_name, "step-%lld%c", &s, &tail) == 1 && s >= 0)
            steps[n++] = s;
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof *steps, cmp_desc);
    return n;
}

/* Keeps the newest `keep` complete steps; removes older and abandoned ones. */
static void prune(gpl_ckpt_t k, int64_t current) {
    int64_t *steps = malloc(CKPT_MAX_STEPS * sizeof *steps);
    if (steps == NULL)
        return;
    int n = list_steps(k->dir, steps, CKPT_MAX_STEPS), kept = 0;
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX], done[PATH_MAX];
        snprintf(path, sizeof path, "%s/step-%012lld", k->dir, (long long)steps[i]);
        snprintf(done, sizeof done, "%s/COMPLETE", path);
        int complete = access(done, F_OK) == 0;
        if (steps[i] > current)
            continue; /* a later run's; not ours to judge */
        if (complete && kept < k->o.keep) {
            kept++;
            continue;
        }
        if (steps[i] < current)
            remove_step(path);
    }
    free(steps);
}

/* The save callback failed: this rank's temporary files (gpl_ckpt_temp_path,
 * not committed) go, so a half-written state of many GiB is not left behind. */
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

static gpl_result_t save_step(gpl_ckpt_t k, int64_t step, double left) {
    gpl_comm_t c = k->c;
    if (k->dir[0] == '\0' || k->save == NULL || step == k->last_saved_step)
        return GPL_OK;
    snprintf(k->stepdir, sizeof k->stepdir, "%s/step-%012lld", k->dir, (long long)step);
    if (mkdir(k->stepdir, 0755) != 0 && errno != EEXIST)
        return gb_seterr(&c->err, GPL_ERR_SYSTEM, "rank %d: cannot create %s: %s", c->rank,
                         k->stepdir, strerror(errno));
    k->man_len = 0;
    k->saving = 1;
    gpl_result_t rc = k->save(k, step, left, k->user);
    k->saving = 0;
    if (rc != GPL_OK)
        remove_temps(k);
    if (rc != GPL_OK)
        return gb_seterr(&c->err, rc, "rank %d: the save callback failed at step %lld", c->rank,
                         (long long)step);
    char man[64];
    snprintf(man, sizeof man, "rank-%d.manifest", c->rank);
    if (write_atomic(k->stepdir, man, k->manifest, k->man_len) != 0 || fsync_dir(k->stepdir) != 0)
        return gb_seterr(&c->err, GPL_ERR_SYSTEM, "rank %d: writing %s/%s: %s", c->rank, k->stepdir,
                         man, strerror(errno));
    /* every rank's files are durable before the step is declared complete */
    if (c->world > 1 && (rc = gpl_barrier(c)) != GPL_OK)
        return rc;
    if (c->rank == 0) {
        char done[128];
        int n = snprintf(done, sizeof done, "gpulaunch-checkpoint 1\nstep %lld\nworld %d\n",
                         (long long)step, c->world);
        if (write_atomic(k->stepdir, "COMPLETE", done, (size_t)n) != 0 ||
            fsync_dir(k->stepdir) != 0 || fsync_dir(k->dir) != 0)
            return gb_seterr(&c->err, GPL_ERR_SYSTEM, "rank 0: marking %s complete: %s", k->stepdir,
                             strerror(errno));
        prune(k, step);
    }
    k->last_saved_step = step;
    k->last_save_s = wall_s();
    return GPL_OK;
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
    int32_t flags[2] = {sigterm_seen || notice, 0};
    if (c->rank == 0 && k->o.every_seconds > 0 && wall_s() - k->last_save_s >= k->o.every_seconds)
        flags[1] = 1;
    if (c->world > 1) {
        gpl_result_t rc = gpl_allreduce(c, flags, flags, 2, GPL_INT32, GPL_MAX, NULL);
        if (rc != GPL_OK)
            return rc;
    }
    int periodic = flags[1] || (k->o.every_steps > 0 && step > 0 && step % k->o.every_steps == 0);
    if (!flags[0] && !periodic)
        return GPL_OK;
    double left = 1e9;
    if (flags[0]) {
        const char *g = getenv("GPULAUNCH_GRACE_S");
        left = g ? strtod(g, NULL) : 30.0;
        if (push && push->checkpoint_deadline_unix_ms)
            left = (double)push->checkpoint_deadline_unix_ms / 1000.0 - wall_s();
    }
    double t0 = wall_s();
    gb_progress_set_state(GB_PROGRESS_SAVING); /* the hang watchdog waits for a save */
    gpl_result_t rc = save_step(k, step, left);
    gb_progress_set_state(GB_PROGRESS_RUNNING);
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
                "gpulaunch runtime: rank %d: checkpoint of step %lld written in %.3f s for a "
                "preemption (%s); going on: this node is not the one going away\n",
                c->rank, (long long)step, wall_s() - t0, why);
        return GPL_OK;
    }
    return gb_seterr(&c->err, GPL_ERR_PREEMPTED,
                     "rank %d: checkpoint of step %lld written in %.3f s; stopping for a "
                     "preemption (%s); exit with code %d",
                     c->rank, (long long)step, wall_s() - t0, why, GPL_EXIT_PREEMPTED);
}

/* Checks every file of a step against the manifests; why says what is wrong. */
static int step_valid(const char *stepdir, char *why, size_t whylen) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/COMPLETE", stepdir);
    FILE *f = fopen(path, "r");
    int world = 0;
    long long step = -1;
    if (f == NULL) {
        snprintf(why, whylen, "no COMPLETE marker (partial: a rank stopped while writing)");
        return 0;
    }
    int ok =
        fscanf(f, "gpulaunch-checkpoint 1 step %lld world %d", &step, &world) == 2 && world > 0;
    fclose(f);
    if (!ok) {
        snprintf(why, whylen, "COMPLETE marker unreadable");
        return 0;
    }
    for (int r = 0; r < world; r++) {
        snprintf(path, sizeof path, "%s/rank-%d.manifest", stepdir, r);
        f = fopen(path, "r");
        if (f == NULL) {
            snprintf(why, whylen, "rank %d's manifest is missing", r);
            return 0;
        }
        char name[CKPT_NAME_MAX + 32], hex[65];
        size_t size;
        while (fscanf(f, "%159s %zu %64s", name, &size, hex) == 3) {
            char fp[PATH_MAX];
            snprintf(fp, sizeof fp, "%s/%s", stepdir, name);
            struct stat st;
            if (stat(fp, &st) != 0 || (size_t)st.st_size != size) {
                snprintf(why, whylen, "%s is missing or has the wrong size", name);
                fclose(f);
                return 0;
            }
            char have[65] = "";
            uint64_t got = 0;
            int hashed = hash_file(fp, have, &got) == 0;
            if (!hashed || got != (uint64_t)size || strcmp(have, hex) != 0) {
                snprintf(why, whylen, "%s fails its SHA-256 check (torn write)", name);
                fclose(f);
                return 0;
            }
        }
        fclose(f);
    }
    return 1;
}

static gpl_result_t restore(gpl_comm_t c, int64_t *out) {
    gpl_ckpt_t k = c ? c->ckpt : NULL;
    *out = -1;
    if (k == NULL)
        return c ? gb_seterr(&c->err, GPL_ERR_STATE, "gpl_ckpt_restore before gpl_ckpt_setup")
                 : GPL_ERR_INVALID_ARG;
    int64_t chosen = -1;
    if (c->rank == 0 && k->dir[0]) {
        int64_t *steps = malloc(CKPT_MAX_STEPS * sizeof *steps);
        int n = steps ? list_steps(k->dir, steps, CKPT_MAX_STEPS) : 0;
        for (int i = 0; i < n && chosen < 0; i++) {
            char stepdir[PATH_MAX], why[256];
            snprintf(stepdir, sizeof stepdir, "%s/step-%012lld", k->dir, (long long)steps[i]);
            if (step_valid(stepdir, why, sizeof why))
                chosen = steps[i];
            else
                fprintf(stderr, "gpulaunch runtime: skipping checkpoint %s: %s\n", stepdir, why);
        }
        free(steps);
    }
    if (c->world > 1) {
        gpl_result_t rc = gpl_broadcast(c, &chosen, 1, GPL_INT64, 0, NULL);
        if (rc != GPL_OK)
            return rc;
    }
    if (chosen < 0)
        return GPL_OK;
    snprintf(k->stepdir, sizeof k->stepdir, "%s/step-%012lld", k->dir, (long long)chosen);
    k->loading = 1;
    gpl_result_t rc = k->load ? k->load(k, chosen, k->user) : GPL_OK;
    k->loading = 0;
    if (rc != GPL_OK)
        return gb_seterr(&c->err, rc, "rank %d: the load callback failed for %s", c->rank,
                         k->stepdir);
    k->last_saved_step = chosen;
    *out = chosen;
    return GPL_OK;
}

gpl_result_t gpl_ckpt_restore(gpl_comm_t c, int64_t *out) {
    gb_progress_set_state(GB_PROGRESS_SAVING); /* checkpoint I/O: the hang watchdog waits */
    gpl_result_t rc = restore(c, out);
    gb_progress_set_state(GB_PROGRESS_RUNNING);
    return rc;
}

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
    if (stat(path, st) == 0)
        return GPL_OK;
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
