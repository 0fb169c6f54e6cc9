/* Restore: the newest step every rank can load, from whichever tier holds it.
 *
 * Each rank proposes the newest step it might load (marked COMPLETE in its
 * first tier or in the durable one); every rank takes the smallest proposal
 * (one all-reduce) and checks its files of that step: its own and rank 0's
 * (replicated state is read from rank 0's files at any world size) against
 * the manifests' sizes, and its own against their SHA-256 sums. A file that
 * is missing or fails its check locally is fetched from the durable tier into
 * the first one, checked on the way. A second all-reduce says whether every
 * rank could; if not, the next older step is tried. So a replacement node
 * with an empty disk restores from S3 while the others read their own disks,
 * and a torn or partial step is skipped with the reason. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "gb_progress.h"
#include "gb_time.h"

typedef struct restore_ctx {
    gpl_comm_t c;
    ckpt_tier *first, *durable;
    int64_t *first_steps, *durable_steps;
    int nfirst, ndurable;
    uint64_t fetched; /* bytes copied from the durable tier */
    int world;        /* the world of the step usable() last looked at */
    int durable_ok;   /* ... and whether the durable tier has that step COMPLETE */
} restore_ctx;

/* The COMPLETE marker of step in tier t: 1 with *world set. */
static int complete_in(ckpt_tier *t, int64_t step, int *world) {
    char buf[128];
    size_t len = 0;
    gb_err e = GB_ERR_INIT;
    if (ckpt_tier_get_small(t, step, "COMPLETE", buf, sizeof buf, &len, &e) != GPL_OK)
        return 0;
    return ckpt_complete_parse(buf, len, step, world);
}

/* Newest step below bound marked COMPLETE in either tier (-1: none). */
static int64_t propose(restore_ctx *x, int64_t bound) {
    int64_t best = -1;
    int w;
    for (int i = 0; i < x->nfirst; i++) {
        if (x->first_steps[i] >= bound)
            continue;
        if (complete_in(x->first, x->first_steps[i], &w)) {
            best = x->first_steps[i];
            break;
        }
        if (bound == INT64_MAX && x->c->local_rank == 0) { /* said once, by one rank a node */
            char sname[32];
            ckpt_step_name(x->first_steps[i], sname, sizeof sname);
            fprintf(stderr,
                    "gpulaunch runtime: rank %d: skipping checkpoint %s/%s: no COMPLETE marker "
                    "(partial: a rank stopped while writing)\n",
                    x->c->rank, x->first->where, sname);
        }
    }
    for (int i = 0; x->durable && i < x->ndurable; i++)
        if (x->durable_steps[i] < bound && x->durable_steps[i] > best &&
            complete_in(x->durable, x->durable_steps[i], &w)) {
            best = x->durable_steps[i];
            break;
        }
    return best;
}

/* One file of a manifest line in the first tier's step directory: there with
 * its size (and its SHA-256 when hash), else fetched from the durable tier
 * (when it has the step COMPLETE) and checked. */
static int get_file(restore_ctx *x, int64_t step, const char *dir, const char *file, uint64_t size,
                    const char *sha, int hash, int durable_ok, char *why, size_t whylen) {
    char path[PATH_MAX], have[65] = "";
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (stat(path, &st) == 0 && (uint64_t)st.st_size == size) {
        uint64_t got = 0;
        if (!hash || (ckpt_hash_file(path, have, &got) == 0 && strcmp(have, sha) == 0))
            return 1;
        snprintf(why, whylen, "%s fails its SHA-256 check (torn or corrupted)", file);
    } else {
        snprintf(why, whylen, "%s is missing or has the wrong size", file);
    }
    if (!durable_ok)
        return 0;
    gb_err e = GB_ERR_INIT;
    if (ckpt_tier_get_file(x->durable, step, file, path, have, &e) != GPL_OK) {
        snprintf(why + strlen(why), whylen - strlen(why), "; from %s: %s", x->durable->where,
                 gb_errmsg(&e));
        return 0;
    }
    if (strcmp(have, sha) != 0) {
        unlink(path);
        snprintf(why + strlen(why), whylen - strlen(why),
                 "; the copy in %s fails its SHA-256 check too", x->durable->where);
        return 0;
    }
    if (stat(path, &st) == 0 && why[0] && strstr(why, "SHA-256"))
        fprintf(stderr, "gpulaunch runtime: rank %d: step %lld: %s; fetched again from %s\n",
                x->c->rank, (long long)step, why, x->durable->where);
    why[0] = '\0';
    x->fetched += size;
    return 1;
}

/* The manifest of rank r for step: from the first tier, else from the durable
 * one (then also written to the first tier). */
static int get_manifest(restore_ctx *x, int64_t step, int r, int durable_ok, char *man, size_t cap,
                        size_t *len) {
    char name[64];
    gb_err e = GB_ERR_INIT;
    snprintf(name, sizeof name, "rank-%d.manifest", r);
    if (ckpt_tier_get_small(x->first, step, name, man, cap - 1, len, &e) == GPL_OK) {
        man[*len] = '\0';
        return 1;
    }
    if (!durable_ok || ckpt_tier_get_small(x->durable, step, name, man, cap - 1, len, &e) != GPL_OK)
        return 0;
    man[*len] = '\0';
    gb_err e2 = GB_ERR_INIT;
    ckpt_tier_put_small(x->first, step, name, man, *len, &e2);
    return 1;
}

/* Whether this rank has what it needs of step (fetching what it lacks). */
static int usable(restore_ctx *x, int64_t step, char *why, size_t whylen) {
    gpl_comm_t c = x->c;
    int world = 0, wd = 0;
    int local_complete = complete_in(x->first, step, &world);
    int durable_ok = x->durable && complete_in(x->durable, step, &wd);
    if (!local_complete && !durable_ok) {
        snprintf(why, whylen, "no COMPLETE marker (partial: a rank stopped while writing)");
        return 0;
    }
    if (!local_complete)
        world = wd;
    x->world = world;
    x->durable_ok = durable_ok;
    char dir[PATH_MAX], sname[32];
    ckpt_step_name(step, sname, sizeof sname);
    snprintf(dir, sizeof dir, "%s/%s", x->first->where, sname);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(why, whylen, "cannot create %s: %s", dir, strerror(errno));
        return 0;
    }
    char *man = malloc(CKPT_MANIFEST_MAX);
    int ok = man != NULL;
    /* this rank's files (when the step's world had this rank), then rank 0's */
    int ranks[2] = {c->rank < world ? c->rank : -1, c->rank != 0 ? 0 : -1};
    for (int i = 0; i < 2 && ok; i++) {
        if (ranks[i] < 0)
            continue;
        size_t len = 0;
        if (!get_manifest(x, step, ranks[i], durable_ok, man, CKPT_MANIFEST_MAX, &len)) {
            snprintf(why, whylen, "rank %d's manifest is missing", ranks[i]);
            ok = 0;
            break;
        }
        ckpt_manifest_line m;
        for (const char *l = man; ok && ckpt_manifest_next(&l, &m);)
            ok = get_file(x, step, dir, m.file, m.size, m.sha, ranks[i] == c->rank, durable_ok, why,
                          whylen);
    }
    free(man);
    return ok;
}

static gpl_result_t min_all(gpl_comm_t c, int64_t *v) {
    if (c->world <= 1)
        return GPL_OK;
    int64_t neg = -*v;
    gpl_result_t rc = gpl_allreduce(c, &neg, &neg, 1, GPL_INT64, GPL_MAX, NULL);
    *v = -neg;
    return rc;
}

static gpl_result_t restore(gpl_comm_t c, int64_t *out) {
    gpl_ckpt_t k = c ? c->ckpt : NULL;
    *out = -1;
    if (k == NULL)
        return c ? gb_seterr(&c->err, GPL_ERR_STATE, "gpl_ckpt_restore before gpl_ckpt_setup")
                 : GPL_ERR_INVALID_ARG;
    gb_clearerr(&c->err);
    restore_ctx x = {c, gpl__ckpt_first(k), gpl__ckpt_durable(k), NULL, NULL, 0, 0, 0, 0, 0};
    gpl_result_t rc = GPL_OK;
    int64_t chosen = -1, bound = INT64_MAX;
    double t0 = gb_wall_s();
    x.first_steps = malloc(CKPT_MAX_STEPS * sizeof(int64_t));
    x.durable_steps = malloc(CKPT_MAX_STEPS * sizeof(int64_t));
    if (x.first_steps == NULL || x.durable_steps == NULL) {
        rc = gb_seterr(&c->err, GPL_ERR_NOMEM, "rank %d: restore: out of memory", c->rank);
        goto out;
    }
    if (x.first) {
        gb_err e = GB_ERR_INIT;
        ckpt_tier_steps(x.first, x.first_steps, CKPT_MAX_STEPS, &x.nfirst, &e);
        if (x.durable &&
            ckpt_tier_steps(x.durable, x.durable_steps, CKPT_MAX_STEPS, &x.ndurable, &e) != GPL_OK)
            fprintf(stderr,
                    "gpulaunch runtime: rank %d: cannot list the durable checkpoint tier %s: %s; "
                    "restoring from the local one alone\n",
                    c->rank, x.durable->where, gb_errmsg(&e));
    }
    for (int iter = 0; iter < CKPT_MAX_STEPS; iter++) {
        int64_t s = x.first ? propose(&x, bound) : -1;
        GB_CHECK_GOTO(min_all(c, &s), rc, out);
        if (s < 0)
            break;
        char why[512] = "";
        int64_t ok = usable(&x, s, why, sizeof why);
        if (!ok) {
            char sname[32];
            ckpt_step_name(s, sname, sizeof sname);
            fprintf(stderr, "gpulaunch runtime: rank %d: skipping checkpoint %s/%s: %s\n", c->rank,
                    x.first->where, sname, why);
        }
        GB_CHECK_GOTO(min_all(c, &ok), rc, out);
        if (ok) {
            chosen = s;
            break;
        }
        bound = s;
    }
    if (chosen < 0)
        goto out;
    if (x.fetched)
        fprintf(stderr,
                "gpulaunch runtime: rank %d: restoring step %lld: %.1f MB fetched from the "
                "durable tier %s in %.3f s\n",
                c->rank, (long long)chosen, (double)x.fetched / 1e6, x.durable->where,
                gb_wall_s() - t0);
    GB_CHECK_GOTO(gpl__ckpt_restore_load(k, chosen, x.world, x.durable_ok), rc, out);
    *out = chosen;
out:
    free(x.first_steps);
    free(x.durable_steps);
    return rc;
}

gpl_result_t gpl_ckpt_restore(gpl_comm_t c, int64_t *out) {
    gb_progress_set_state(GB_PROGRESS_SAVING); /* checkpoint I/O: the hang watchdog waits */
    gpl_result_t rc = restore(c, out);
    gb_progress_set_state(GB_PROGRESS_RUNNING);
    return rc;
}

/* Another rank's file of the step being loaded (a sharded state read into
 * another world): its line in that rank's manifest, the file in the first
 * tier with that size and SHA-256, else fetched from the durable tier and
 * checked. */
gpl_result_t ckpt_restore_rank_file(gpl_comm_t c, int64_t step, int world, int durable_ok, int rank,
                                    const char *file, char *path, size_t len) {
    restore_ctx x = {
        c,         gpl__ckpt_first(c->ckpt), gpl__ckpt_durable(c->ckpt), NULL, NULL, 0, 0, 0, world,
        durable_ok};
    char dir[PATH_MAX], sname[32], why[512] = "";
    ckpt_step_name(step, sname, sizeof sname);
    snprintf(dir, sizeof dir, "%s/%s", x.first->where, sname);
    char *man = malloc(CKPT_MANIFEST_MAX);
    gpl_result_t rc = GPL_OK;
    size_t mlen = 0;
    int found = 0;
    if (man == NULL)
        return gb_seterr(&c->err, GPL_ERR_NOMEM, "rank %d: out of memory", c->rank);
    if (!get_manifest(&x, step, rank, durable_ok && x.durable, man, CKPT_MANIFEST_MAX, &mlen)) {
        rc = gb_seterr(&c->err, GPL_ERR_NOT_FOUND,
                       "rank %d: rank %d's manifest of %s/%s is missing%s", c->rank, rank,
                       x.first->where, sname,
                       x.durable ? " in both tiers" : " (no durable tier to fetch it from)");
        goto out;
    }
    ckpt_manifest_line m;
    for (const char *l = man; !found && ckpt_manifest_next(&l, &m);) {
        if (strcmp(m.file, file) != 0)
            continue;
        found = 1;
        /* this rank's own files of its own world were hashed when the step was chosen */
        int hash = !(rank == c->rank && rank < world);
        if (!get_file(&x, step, dir, file, m.size, m.sha, hash, durable_ok && x.durable, why,
                      sizeof why)) {
            rc = gb_seterr(&c->err, GPL_ERR_CORRUPT, "rank %d: checkpoint %s/%s: %s", c->rank,
                           x.first->where, sname, why);
            goto out;
        }
    }
    if (!found) {
        rc = gb_seterr(&c->err, GPL_ERR_NOT_FOUND,
                       "rank %d: rank %d saved no file %s in %s/%s; was it saved under another "
                       "name?",
                       c->rank, rank, file, x.first->where, sname);
        goto out;
    }
    if (x.fetched)
        fprintf(stderr, "gpulaunch runtime: rank %d: step %lld: %s fetched from %s (%.1f MB)\n",
                c->rank, (long long)step, file, x.durable->where, (double)x.fetched / 1e6);
    int n = snprintf(path, len, "%s/%s", dir, file);
    if (n < 0 || (size_t)n >= len)
        rc = gb_seterr(&c->err, GPL_ERR_LIMIT, "the path of %s/%s does not fit in %zu bytes", dir,
                       file, len);
out:
    free(man);
    return rc;
}
