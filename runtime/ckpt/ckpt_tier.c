/* A tier of checkpoints: a directory (the node's NVMe, or a shared file system
 * such as a PVC on EFS, FSx or NFS) or an S3 prefix (s3://bucket/prefix), with
 * the same layout in both (ckpt_int.h). Each operation is durable when it
 * returns: files are fsync'd and renamed into place, uploads are complete. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "ckpt_s3.h"

void ckpt_step_name(int64_t step, char *out, size_t len) {
    snprintf(out, len, "step-%012lld", (long long)step);
}

static void step_path(const ckpt_tier *t, int64_t step, char *out, size_t len) {
    char s[32];
    ckpt_step_name(step, s, sizeof s);
    snprintf(out, len, "%s/%s", t->where, s);
}

static void step_key(int64_t step, const char *name, char *out, size_t len) {
    char s[32];
    ckpt_step_name(step, s, sizeof s);
    snprintf(out, len, "%s/%s", s, name);
}

gpl_result_t ckpt_tier_open(ckpt_tier *t, const char *where, int keep, gb_err *err) {
    memset(t, 0, sizeof *t);
    t->keep = keep;
    if (strlen(where) >= sizeof t->where)
        return gb_seterr(err, GPL_ERR_INVALID_ARG, "checkpoint tier '%.64s...': name too long",
                         where);
    snprintf(t->where, sizeof t->where, "%s", where);
    if (strncmp(where, "s3://", 5) == 0) {
        t->kind = CKPT_TIER_S3;
        return ckpt_s3_open(where, &t->s3, err);
    }
    t->kind = CKPT_TIER_DIR;
    if (mkdir(t->where, 0755) != 0 && errno != EEXIST)
        return gb_seterr(err, GPL_ERR_SYSTEM,
                         "cannot create checkpoint directory %s: %s; check that its parent "
                         "exists and is writable",
                         t->where, strerror(errno));
    return GPL_OK;
}

void ckpt_tier_close(ckpt_tier *t) {
    if (t->s3)
        ckpt_s3_close(t->s3);
    t->s3 = NULL;
}

static gpl_result_t dir_mkstep(ckpt_tier *t, int64_t step, char *dir, size_t len, gb_err *err) {
    step_path(t, step, dir, len);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return gb_seterr(err, GPL_ERR_SYSTEM, "checkpoint tier %s: cannot create %s: %s", t->where,
                         dir, strerror(errno));
    return GPL_OK;
}

gpl_result_t ckpt_tier_put_file(ckpt_tier *t, int64_t step, const char *name, const char *src,
                                const char *sha, ckpt_progress_fn fn, void *user, gb_err *err) {
    gpl_result_t rc = GPL_OK;
    int in = -1, out = -1;
    char dir[PATH_MAX], tmp[PATH_MAX], path[PATH_MAX], hex[65] = "";
    struct stat st;
    if ((in = open(src, O_RDONLY | O_CLOEXEC)) < 0 || fstat(in, &st) != 0) {
        rc = gb_seterr(err, GPL_ERR_SYSTEM, "checkpoint drain: cannot read %s: %s", src,
                       strerror(errno));
        goto out;
    }
    if (t->kind == CKPT_TIER_S3) {
        /* the local copy is checked before it is uploaded: a rotten file is not made durable */
        uint64_t size = 0;
        if (sha && (ckpt_hash_file(src, hex, &size) != 0 || strcmp(hex, sha) != 0)) {
            rc = gb_seterr(err, GPL_ERR_CORRUPT,
                           "checkpoint drain: %s no longer matches its SHA-256 in the manifest; "
                           "not uploaded (check the local disk)",
                           src);
            goto out;
        }
        char key[PATH_MAX];
        step_key(step, name, key, sizeof key);
        rc = ckpt_s3_put_file(t->s3, key, in, (uint64_t)st.st_size, fn, user, err);
        goto out;
    }
    GB_CHECK_GOTO(dir_mkstep(t, step, dir, sizeof dir, err), rc, out);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%d-%s", dir, (int)getpid(), name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    uint64_t total = 0;
    if ((out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0 ||
        ckpt_copy_hashed(in, out, hex, &total, fn, user, (uint64_t)st.st_size) != 0 ||
        fsync(out) != 0) {
        rc = gb_seterr(err, errno == ECANCELED ? GPL_ERR_TIMEOUT : GPL_ERR_SYSTEM,
                       "checkpoint tier %s: copying %s to %s: %s; check the space and health of "
                       "that file system",
                       t->where, src, tmp, strerror(errno));
        goto out;
    }
    if (sha && strcmp(hex, sha) != 0) {
        rc = gb_seterr(err, GPL_ERR_CORRUPT,
                       "checkpoint drain: %s no longer matches its SHA-256 in the manifest; not "
                       "copied to %s (check the local disk)",
                       src, t->where);
        goto out;
    }
    int cl = close(out);
    out = -1;
    if (cl != 0 || rename(tmp, path) != 0) {
        rc = gb_seterr(err, GPL_ERR_SYSTEM, "checkpoint tier %s: committing %s: %s", t->where, path,
                       strerror(errno));
        goto out;
    }
out:
    if (out >= 0)
        close(out);
    if (rc != GPL_OK && t->kind == CKPT_TIER_DIR && tmp[0])
        unlink(tmp);
    if (in >= 0)
        close(in);
    return rc;
}

gpl_result_t ckpt_tier_put_small(ckpt_tier *t, int64_t step, const char *name, const void *buf,
                                 size_t len, gb_err *err) {
    if (t->kind == CKPT_TIER_S3) {
        char key[PATH_MAX];
        step_key(step, name, key, sizeof key);
        return ckpt_s3_put(t->s3, key, buf, len, err);
    }
    char dir[PATH_MAX];
    gpl_result_t rc = dir_mkstep(t, step, dir, sizeof dir, err);
    if (rc != GPL_OK)
        return rc;
    if (ckpt_write_atomic(dir, name, buf, len) != 0 || ckpt_fsync_dir(dir) != 0)
        return gb_seterr(err, errno == ENOSPC ? GPL_ERR_LIMIT : GPL_ERR_SYSTEM,
                         "checkpoint tier %s: writing %s/%s: %s", t->where, dir, name,
                         strerror(errno));
    return GPL_OK;
}

gpl_result_t ckpt_tier_get_small(ckpt_tier *t, int64_t step, const char *name, char *buf,
                                 size_t cap, size_t *len, gb_err *err) {
    *len = 0;
    if (t->kind == CKPT_TIER_S3) {
        char key[PATH_MAX];
        step_key(step, name, key, sizeof key);
        return ckpt_s3_get(t->s3, key, buf, cap, len, err);
    }
    char dir[PATH_MAX], path[PATH_MAX];
    step_path(t, step, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return gb_seterr(err, errno == ENOENT ? GPL_ERR_NOT_FOUND : GPL_ERR_SYSTEM, "%s: %s", path,
                         strerror(errno));
    size_t n = fread(buf, 1, cap, f);
    int more = n == cap && fgetc(f) != EOF;
    fclose(f);
    if (more)
        return gb_seterr(err, GPL_ERR_LIMIT, "%s is larger than %zu bytes", path, cap);
    *len = n;
    return GPL_OK;
}

gpl_result_t ckpt_tier_get_file(ckpt_tier *t, int64_t step, const char *name, const char *dst,
                                char sha_out[65], gb_err *err) {
    gpl_result_t rc = GPL_OK;
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.part-%d", dst, (int)getpid());
    int out = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), in = -1;
    uint64_t size = 0;
    if (out < 0) {
        rc = gb_seterr(err, GPL_ERR_SYSTEM, "checkpoint restore: cannot create %s: %s", tmp,
                       strerror(errno));
        goto out;
    }
    if (t->kind == CKPT_TIER_S3) {
        char key[PATH_MAX];
        step_key(step, name, key, sizeof key);
        GB_CHECK_GOTO(ckpt_s3_get_file(t->s3, key, out, &size, NULL, NULL, err), rc, out);
        if (fsync(out) != 0 || ckpt_hash_file(tmp, sha_out, &size) != 0) {
            rc = gb_seterr(err, GPL_ERR_SYSTEM, "checkpoint restore: %s: %s", tmp, strerror(errno));
            goto out;
        }
    } else {
        char dir[PATH_MAX], src[PATH_MAX];
        step_path(t, step, dir, sizeof dir);
        snprintf(src, sizeof src, "%s/%s", dir, name);
        if ((in = open(src, O_RDONLY | O_CLOEXEC)) < 0) {
            rc = gb_seterr(err, errno == ENOENT ? GPL_ERR_NOT_FOUND : GPL_ERR_SYSTEM, "%s: %s", src,
                           strerror(errno));
            goto out;
        }
        if (ckpt_copy_hashed(in, out, sha_out, &size, NULL, NULL, 0) != 0 || fsync(out) != 0) {
            rc = gb_seterr(err, GPL_ERR_SYSTEM, "checkpoint restore: copying %s to %s: %s", src,
                           tmp, strerror(errno));
            goto out;
        }
    }
    if (rename(tmp, dst) != 0)
        rc = gb_seterr(err, GPL_ERR_SYSTEM, "checkpoint restore: %s: %s", dst, strerror(errno));
out:
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    if (rc != GPL_OK)
        unlink(tmp);
    return rc;
}

typedef struct step_list {
    int64_t *steps;
    int n, max;
} step_list;

static int on_prefix(const char *name, uint64_t size, void *user) {
    step_list *l = user;
    long long s;
    char tail;
    (void)size;
    /* "step-000000000120/" */
    if (l->n < l->max && sscanf(name, "step-%lld%c", &s, &tail) == 2 && tail == '/' && s >= 0)
        l->steps[l->n++] = s;
    return 0;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

gpl_result_t ckpt_tier_steps(ckpt_tier *t, int64_t *steps, int max, int *n, gb_err *err) {
    *n = 0;
    if (t->kind == CKPT_TIER_DIR) {
        *n = ckpt_list_steps(t->where, steps, max);
        return GPL_OK;
    }
    step_list l = {steps, 0, max};
    gpl_result_t rc = ckpt_s3_list(t->s3, "step-", "/", on_prefix, &l, err);
    qsort(steps, (size_t)l.n, sizeof *steps, cmp_desc);
    *n = l.n;
    return rc;
}

int ckpt_tier_has(ckpt_tier *t, int64_t step, const char *name) {
    if (t->kind == CKPT_TIER_DIR) {
        char dir[PATH_MAX], path[PATH_MAX];
        step_path(t, step, dir, sizeof dir);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        return access(path, F_OK) == 0;
    }
    char buf[256];
    size_t len = 0;
    gb_err e = GB_ERR_INIT;
    gpl_result_t rc = ckpt_tier_get_small(t, step, name, buf, sizeof buf, &len, &e);
    return rc == GPL_OK || rc == GPL_ERR_LIMIT;
}

typedef struct man_count {
    int n;
} man_count;

static int on_key(const char *name, uint64_t size, void *user) {
    int r;
    char tail;
    const char *slash = strchr(name, '/');
    (void)size;
    if (slash && sscanf(slash + 1, "rank-%d.manifes%c", &r, &tail) == 2 && tail == 't')
        ((man_count *)user)->n++;
    return 0;
}

int ckpt_tier_manifests(ckpt_tier *t, int64_t step, int world) {
    if (t->kind == CKPT_TIER_DIR) {
        int n = 0;
        for (int r = 0; r < world; r++) {
            char name[64];
            snprintf(name, sizeof name, "rank-%d.manifest", r);
            n += ckpt_tier_has(t, step, name);
        }
        return n;
    }
    char prefix[64];
    ckpt_step_name(step, prefix, sizeof prefix - 1);
    size_t pl = strlen(prefix);
    prefix[pl] = '/';
    prefix[pl + 1] = '\0';
    man_count c = {0};
    gb_err e = GB_ERR_INIT;
    if (ckpt_s3_list(t->s3, prefix, NULL, on_key, &c, &e) != GPL_OK)
        return -1;
    return c.n;
}

typedef struct key_list {
    char (*keys)[CKPT_FILE_MAX + 32];
    int n, max;
} key_list;

static int on_any(const char *name, uint64_t size, void *user) {
    key_list *l = user;
    (void)size;
    if (l->n < l->max)
        snprintf(l->keys[l->n++], sizeof l->keys[0], "%s", name);
    return 0;
}

void ckpt_tier_remove_step(ckpt_tier *t, int64_t step) {
    if (t->kind == CKPT_TIER_DIR) {
        char dir[PATH_MAX];
        step_path(t, step, dir, sizeof dir);
        ckpt_remove_dir(dir);
        return;
    }
    /* COMPLETE first: a step half removed is never taken for a complete one */
    char key[PATH_MAX], prefix[64];
    gb_err e = GB_ERR_INIT;
    step_key(step, "COMPLETE", key, sizeof key);
    ckpt_s3_delete(t->s3, key, &e);
    ckpt_step_name(step, prefix, sizeof prefix - 1);
    size_t pl = strlen(prefix);
    prefix[pl] = '/';
    prefix[pl + 1] = '\0';
    key_list l = {calloc(CKPT_MAX_FILES * 4, sizeof *l.keys), 0, CKPT_MAX_FILES * 4};
    if (l.keys == NULL)
        return;
    ckpt_s3_list(t->s3, prefix, NULL, on_any, &l, &e);
    for (int i = 0; i < l.n; i++)
        ckpt_s3_delete(t->s3, l.keys[i], &e);
    free(l.keys);
}

void ckpt_tier_prune(ckpt_tier *t, int64_t current, int64_t busy) {
    int64_t *steps = malloc(CKPT_MAX_STEPS * sizeof *steps);
    int n = 0, kept = 0;
    gb_err e = GB_ERR_INIT;
    if (steps == NULL || ckpt_tier_steps(t, steps, CKPT_MAX_STEPS, &n, &e) != GPL_OK) {
        free(steps);
        return;
    }
    for (int i = 0; i < n; i++) {
        if (steps[i] > current || steps[i] == busy)
            continue; /* a later run's, or being drained: not ours to judge now */
        if (kept < t->keep && ckpt_tier_has(t, steps[i], "COMPLETE")) {
            kept++;
            continue;
        }
        if (steps[i] < current)
            ckpt_tier_remove_step(t, steps[i]);
    }
    free(steps);
}
