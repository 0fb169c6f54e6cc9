/* The checkpoint API in one process: files written by the caller's own writer
 * (temporary path, commit), found again by path on restore, torn ones
 * skipped; and communicators over the caller's collectives
 * (gpl_init_external), which the checkpoint agreement runs over under
 * another launcher. Two ranks of an external world live in this process:
 * their "collectives" are recorded and leave the data as every rank had it. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "gpulaunch/gpulaunch.h"
#include "harness.h"

static char dir[64];

static void teardown(void) { tmpdir_remove(dir); }

static void setup(void) {
    tmpdir_make(dir, sizeof dir, "gpl-ckpt");
    cr_assert(dir[0]);
    skip_cleanup(teardown);
}

TestSuite(ckpt, .init = setup, .fini = teardown, .timeout = 60);

typedef struct calls {
    int allreduce, broadcast, barrier, fail;
    gpl_op_t last_op;
    int64_t root_step; /* what rank 0 broadcasts on restore, for rank 1 */
} calls;

/* A peer with the same data as this rank: SUM doubles, everything else keeps it. */
static int fake_allreduce(void *buf, size_t count, gpl_dtype_t t, gpl_op_t op, void *user) {
    calls *k = user;
    k->allreduce++;
    k->last_op = op;
    if (k->fail)
        return 1;
    if (op == GPL_SUM && t == GPL_FLOAT32)
        for (size_t i = 0; i < count; i++)
            ((float *)buf)[i] *= 2;
    return 0;
}

static int fake_broadcast(void *buf, size_t count, gpl_dtype_t t, int root, void *user) {
    calls *k = user;
    k->broadcast++;
    if (t == GPL_INT64 && count == 1 && k->root_step)
        *(int64_t *)buf = k->root_step;
    return k->fail;
}

static int fake_barrier(void *user) {
    ((calls *)user)->barrier++;
    return ((calls *)user)->fail;
}

static gpl_comm_t external(int rank, calls *k) {
    gpl_external_ops ops = GPL_EXTERNAL_OPS_INIT;
    ops.allreduce = fake_allreduce;
    ops.broadcast = fake_broadcast;
    ops.barrier = fake_barrier;
    ops.user = k;
    gpl_comm_t c = NULL;
    cr_assert_eq(gpl_init_external(rank, 2, rank, 2, &ops, &c), GPL_OK);
    cr_assert_eq(gpl_backend(c), GPL_BACKEND_EXTERNAL);
    return c;
}

#define BIG ((size_t)GPL_CKPT_HASH_PIECE + GPL_CKPT_HASH_PIECE / 2 + 3) /* over one piece */

static unsigned char pattern(size_t i, int rank) { return (unsigned char)(i * 31 + rank * 7); }

/* Writes "state" through the temporary path and commit, "meta" through gpl_ckpt_write. */
static gpl_result_t save_cb(gpl_ckpt_t ck, int64_t step, double left, void *user) {
    int rank = gpl_rank(gpl_ckpt_comm(ck));
    char path[4096];
    gpl_result_t rc = gpl_ckpt_temp_path(ck, "state", path, sizeof path);
    if (rc != GPL_OK)
        return rc;
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    for (size_t i = 0; i < BIG; i++)
        fputc(pattern(i, rank), f);
    fclose(f);
    if ((rc = gpl_ckpt_commit(ck, "state")) != GPL_OK)
        return rc;
    return gpl_ckpt_write(ck, "meta", &step, sizeof step);
}

typedef struct loaded {
    int64_t step, meta;
    int state_ok;
    char state_path[4096];
} loaded;

static gpl_result_t load_cb(gpl_ckpt_t ck, int64_t step, void *user) {
    loaded *l = user;
    int rank = gpl_rank(gpl_ckpt_comm(ck));
    l->step = step;
    gpl_result_t rc = gpl_ckpt_path(ck, "state", l->state_path, sizeof l->state_path);
    if (rc != GPL_OK)
        return rc;
    FILE *f = fopen(l->state_path, "rb");
    size_t i = 0;
    int ch, ok = f != NULL;
    while (f && (ch = fgetc(f)) != EOF)
        ok = ok && ch == pattern(i++, rank);
    if (f)
        fclose(f);
    l->state_ok = ok && i == BIG;
    return gpl_ckpt_read(ck, "meta", &l->meta, sizeof l->meta);
}

static void setup_ck(gpl_comm_t c, int every, void *user) {
    gpl_ckpt_options o = GPL_CKPT_OPTIONS_INIT;
    o.dir = dir;
    o.every_steps = every;
    o.handle_sigterm = 0;
    cr_assert_eq(gpl_ckpt_setup(c, &o, save_cb, load_cb, user), GPL_OK);
}

/* Two ranks save step 4 (rank 1 first, then rank 0); gpl_ckpt_wait then
 * waits for both ranks' writers and rank 0 (local rank 0) marks it COMPLETE. */
static void save_two_ranks(calls *k0, calls *k1) {
    gpl_comm_t c0 = external(0, k0), c1 = external(1, k1);
    setup_ck(c0, 2, NULL);
    setup_ck(c1, 2, NULL);
    cr_assert_eq(gpl_step_end(c1, 3), GPL_OK); /* not due */
    cr_assert_eq(gpl_step_end(c1, 4), GPL_OK, "%s", gpl_last_error(c1));
    cr_assert_eq(gpl_step_end(c0, 4), GPL_OK, "%s", gpl_last_error(c0));
    cr_assert_eq(gpl_ckpt_wait(c1), GPL_OK, "%s", gpl_last_error(c1));
    cr_assert_eq(gpl_ckpt_wait(c0), GPL_OK, "%s", gpl_last_error(c0));
    gpl_finalize(c0);
    gpl_finalize(c1);
}

Test(ckpt, temp_path_and_commit_round_trip_over_external_collectives) {
    calls k0 = {0}, k1 = {0};
    save_two_ranks(&k0, &k1);
    /* the agreement (one all-reduce a step, one in gpl_ckpt_wait) ran outside */
    cr_expect_eq(k1.allreduce, 3);
    cr_expect_eq(k0.allreduce, 2);
    cr_expect_eq(k0.last_op, GPL_MAX);
    char p[256];
    snprintf(p, sizeof p, "%s/step-000000000004/COMPLETE", dir);
    struct stat st;
    cr_assert_eq(stat(p, &st), 0, "no COMPLETE marker");
    snprintf(p, sizeof p, "%s/step-000000000004/r1-state", dir);
    cr_assert_eq(stat(p, &st), 0);
    cr_expect_eq((size_t)st.st_size, BIG);
    /* the manifest's hash is the file's (checked against sha256sum) */
    char cmd[512], want[65] = "", man[8192] = "";
    snprintf(cmd, sizeof cmd, "sha256sum %s", p);
    FILE *f = popen(cmd, "r");
    cr_assert(f && fscanf(f, "%64s", want) == 1);
    pclose(f);
    snprintf(p, sizeof p, "%s/step-000000000004/rank-1.manifest", dir);
    f = fopen(p, "r");
    cr_assert(f && fread(man, 1, sizeof man - 1, f) > 0);
    fclose(f);
    char line[256];
    snprintf(line, sizeof line, "r1-state %zu %s\n", BIG, want);
    cr_expect(strstr(man, line) != NULL, "manifest:\n%s\nexpected line: %s", man, line);

    for (int r = 0; r < 2; r++) {
        calls k = {.root_step = 4};
        loaded l = {0};
        gpl_comm_t c = external(r, &k);
        setup_ck(c, 2, &l);
        int64_t step = -1;
        cr_assert_eq(gpl_ckpt_restore(c, &step), GPL_OK, "%s", gpl_last_error(c));
        cr_expect_eq(step, 4);
        cr_expect_eq(l.meta, 4);
        cr_expect(l.state_ok, "rank %d read back %s wrong", r, l.state_path);
        cr_expect_eq(k.allreduce, 2, "the step proposed, then whether every rank has it");
        gpl_finalize(c);
    }
}

/* Sharded state: a world of one reads what each rank of a world of two saved. */
typedef struct sharded {
    int world;
    gpl_result_t rank1, rank2, missing;
    int rank1_ok;
} sharded;

static gpl_result_t sharded_load(gpl_ckpt_t ck, int64_t step, void *user) {
    sharded *s = user;
    char path[4096];
    s->world = gpl_ckpt_saved_world(ck);
    s->rank1 = gpl_ckpt_rank_path(ck, 1, "state", path, sizeof path);
    if (s->rank1 == GPL_OK) {
        FILE *f = fopen(path, "rb");
        size_t i = 0;
        int ch, ok = f != NULL;
        while (f && (ch = fgetc(f)) != EOF)
            ok = ok && ch == pattern(i++, 1);
        if (f)
            fclose(f);
        s->rank1_ok = ok && i == BIG;
    }
    s->rank2 = gpl_ckpt_rank_path(ck, 2, "state", path, sizeof path);
    s->missing = gpl_ckpt_rank_path(ck, 1, "nope", path, sizeof path);
    return GPL_OK;
}

static void sharded_restore(const char *local, const char *durable, sharded *s) {
    gpl_comm_t c = NULL;
    cr_assert_eq(gpl_init(NULL, &c), GPL_OK);
    gpl_ckpt_options o = GPL_CKPT_OPTIONS_INIT;
    o.dir = local;
    o.durable = durable;
    o.handle_sigterm = 0;
    cr_assert_eq(gpl_ckpt_setup(c, &o, save_cb, sharded_load, s), GPL_OK, "%s", gpl_last_error(c));
    int64_t step = -1;
    memset(s, 0, sizeof *s);
    cr_assert_eq(gpl_ckpt_restore(c, &step), GPL_OK, "%s", gpl_last_error(c));
    cr_expect_eq(step, 4);
    gpl_finalize(c);
}

Test(ckpt, another_ranks_file_is_read_checked_and_fetched_from_the_durable_tier) {
    char local[128], durable[128], cmd[512];
    snprintf(local, sizeof local, "%s/nvme", dir);
    snprintf(durable, sizeof durable, "%s/pvc", dir);
    calls k0 = {0}, k1 = {0};
    gpl_comm_t c0 = external(0, &k0), c1 = external(1, &k1);
    for (int r = 0; r < 2; r++) {
        gpl_ckpt_options o = GPL_CKPT_OPTIONS_INIT;
        o.dir = local;
        o.durable = durable;
        o.every_steps = 2;
        o.handle_sigterm = 0;
        cr_assert_eq(gpl_ckpt_setup(r ? c1 : c0, &o, save_cb, load_cb, NULL), GPL_OK);
    }
    cr_assert_eq(gpl_step_end(c1, 4), GPL_OK, "%s", gpl_last_error(c1));
    cr_assert_eq(gpl_step_end(c0, 4), GPL_OK, "%s", gpl_last_error(c0));
    cr_assert_eq(gpl_ckpt_wait(c1), GPL_OK, "%s", gpl_last_error(c1));
    cr_assert_eq(gpl_ckpt_wait(c0), GPL_OK, "%s", gpl_last_error(c0));
    gpl_finalize(c0);
    gpl_finalize(c1);

    sharded s;
    sharded_restore(local, durable, &s);
    cr_expect_eq(s.world, 2);
    cr_expect_eq(s.rank1, GPL_OK);
    cr_expect(s.rank1_ok, "rank 1's file read by the rank of a world of one");
    cr_expect_eq(s.rank2, GPL_ERR_INVALID_ARG, "no rank 2 saved step 4");
    cr_expect_eq(s.missing, GPL_ERR_NOT_FOUND);

    /* rank 1 was on another node: its file is not on this disk, nor its manifest */
    snprintf(cmd, sizeof cmd, "rm %s/step-000000000004/r1-* %s/step-000000000004/rank-1.manifest",
             local, local);
    cr_assert_eq(system(cmd), 0);
    sharded_restore(local, durable, &s);
    cr_expect_eq(s.rank1, GPL_OK);
    cr_expect(s.rank1_ok, "fetched from the durable tier");

    /* damaged here: fetched again; damaged in both: GPL_ERR_CORRUPT */
    snprintf(cmd, sizeof cmd,
             "printf x | dd of=%s/step-000000000004/r1-state bs=1 seek=100 conv=notrunc "
             "status=none",
             local);
    cr_assert_eq(system(cmd), 0);
    sharded_restore(local, durable, &s);
    cr_expect_eq(s.rank1, GPL_OK);
    cr_expect(s.rank1_ok, "a damaged copy is fetched again");
    cr_assert_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "printf x | dd of=%s/step-000000000004/r1-state bs=1 seek=100 conv=notrunc "
             "status=none",
             durable);
    cr_assert_eq(system(cmd), 0);
    sharded_restore(local, durable, &s);
    cr_expect_eq(s.rank1, GPL_ERR_CORRUPT, "no good copy anywhere");
}

Test(ckpt, a_torn_file_written_by_path_is_skipped) {
    calls k0 = {0}, k1 = {0};
    save_two_ranks(&k0, &k1);
    char p[256];
    snprintf(p, sizeof p, "%s/step-000000000004/r0-state", dir);
    FILE *f = fopen(p, "r+b");
    cr_assert_not_null(f);
    fseek(f, (long)GPL_CKPT_HASH_PIECE + 5, SEEK_SET); /* in the second piece */
    fputc(0xAA ^ pattern(GPL_CKPT_HASH_PIECE + 5, 0), f);
    fclose(f);
    loaded l = {0};
    calls k = {0};
    gpl_comm_t c = external(0, &k);
    setup_ck(c, 2, &l);
    int64_t step = 0;
    cr_assert_eq(gpl_ckpt_restore(c, &step), GPL_OK);
    cr_expect_eq(step, -1, "the torn step must not load");
    gpl_finalize(c);
}

Test(ckpt, a_null_handle_is_an_invalid_argument) {
    char path[64];
    cr_expect_eq(gpl_ckpt_temp_path(NULL, "x", path, sizeof path), GPL_ERR_INVALID_ARG);
    cr_expect_eq(gpl_ckpt_commit(NULL, "x"), GPL_ERR_INVALID_ARG);
    cr_expect_eq(gpl_ckpt_path(NULL, "x", path, sizeof path), GPL_ERR_INVALID_ARG);
    cr_expect_eq(gpl_ckpt_write(NULL, "x", path, 1), GPL_ERR_INVALID_ARG);
    cr_expect_eq(gpl_ckpt_read(NULL, "x", path, 1), GPL_ERR_INVALID_ARG);
    cr_expect_null(gpl_ckpt_comm(NULL));
}

static gpl_result_t bad_save_cb(gpl_ckpt_t ck, int64_t step, double left, void *user) {
    char path[4096], small[8];
    gpl_comm_t c = gpl_ckpt_comm(ck);
    cr_expect_eq(gpl_ckpt_temp_path(ck, "a/b", path, sizeof path), GPL_ERR_INVALID_ARG);
    cr_expect(strstr(gpl_last_error(c), "without '/'") != NULL, "%s", gpl_last_error(c));
    cr_expect_eq(gpl_ckpt_temp_path(ck, "", path, sizeof path), GPL_ERR_INVALID_ARG);
    cr_expect_eq(gpl_ckpt_temp_path(ck, "state", small, sizeof small), GPL_ERR_LIMIT);
    cr_expect_eq(gpl_ckpt_commit(ck, "never-written"), GPL_ERR_NOT_FOUND);
    cr_expect(strstr(gpl_last_error(c), "never-written") != NULL, "%s", gpl_last_error(c));
    cr_expect_eq(gpl_ckpt_path(ck, "state", path, sizeof path), GPL_ERR_STATE);
    cr_expect(strstr(gpl_last_error(c), "outside the load callback") != NULL, "%s",
              gpl_last_error(c));
    *(int *)user = 1;
    return GPL_OK;
}

static gpl_result_t missing_load_cb(gpl_ckpt_t ck, int64_t step, void *user) {
    char path[4096];
    gpl_comm_t c = gpl_ckpt_comm(ck);
    cr_expect_eq(gpl_ckpt_path(ck, "nothing", path, sizeof path), GPL_ERR_NOT_FOUND);
    cr_expect(strstr(gpl_last_error(c), "'nothing'") != NULL, "%s", gpl_last_error(c));
    cr_expect_eq(gpl_ckpt_temp_path(ck, "x", path, sizeof path), GPL_ERR_STATE);
    *(int *)user = 2;
    return GPL_OK;
}

Test(ckpt, bad_names_missing_files_and_calls_in_the_wrong_callback) {
    gpl_comm_t c = NULL;
    cr_assert_eq(gpl_init(NULL, &c), GPL_OK); /* a world of one */
    int seen = 0;
    gpl_ckpt_options o = GPL_CKPT_OPTIONS_INIT;
    o.dir = dir;
    o.every_steps = 1;
    o.handle_sigterm = 0;
    cr_assert_eq(gpl_ckpt_setup(c, &o, bad_save_cb, missing_load_cb, &seen), GPL_OK);
    cr_assert_eq(gpl_step_end(c, 1), GPL_OK, "%s", gpl_last_error(c));
    cr_expect_eq(seen, 1);
    cr_assert_eq(gpl_ckpt_wait(c), GPL_OK, "%s", gpl_last_error(c));
    int64_t step = -1;
    cr_assert_eq(gpl_ckpt_restore(c, &step), GPL_OK, "%s", gpl_last_error(c));
    cr_expect_eq(step, 1);
    cr_expect_eq(seen, 2);
    gpl_finalize(c);
}

Test(ckpt, external_collectives_average_and_report_failure) {
    calls k = {0};
    gpl_comm_t c = external(0, &k);
    float v[3] = {1.5f, -2.0f, 8.0f};
    /* the framework is asked for a SUM (Gloo has no AVG), scaled here */
    cr_assert_eq(gpl_allreduce(c, v, v, 3, GPL_FLOAT32, GPL_AVG, NULL), GPL_OK);
    cr_expect_eq(k.last_op, GPL_SUM);
    cr_expect(v[0] == 1.5f && v[1] == -2.0f && v[2] == 8.0f, "%g %g %g", v[0], v[1], v[2]);
    uint16_t h[2] = {0x3c00, 0x4400}; /* float16 1.0 and 4.0: the fake peer leaves them */
    cr_assert_eq(gpl_allreduce(c, h, h, 2, GPL_FLOAT16, GPL_AVG, NULL), GPL_OK);
    cr_expect(h[0] == 0x3800 && h[1] == 0x4000, "halved: %04x %04x", h[0], h[1]);
    float out[6];
    cr_expect_eq(gpl_allgather(c, v, out, 3, GPL_FLOAT32, NULL), GPL_ERR_UNSUPPORTED);
    k.fail = 1;
    cr_expect_eq(gpl_barrier(c), GPL_ERR_PEER_FAILED);
    cr_expect(strstr(gpl_last_error(c), "process group") != NULL, "%s", gpl_last_error(c));
    cr_expect_eq(gpl_allreduce(c, v, v, 3, GPL_FLOAT32, GPL_SUM, NULL), GPL_ERR_PEER_FAILED);
    gpl_finalize(c);

    cr_expect_eq(gpl_init_external(0, 1, 0, 1, NULL, &c), GPL_ERR_INVALID_ARG);
    cr_expect(strstr(gpl_last_error(c), "GPL_EXTERNAL_OPS_INIT") != NULL, "%s", gpl_last_error(c));
    gpl_finalize(c);
    gpl_external_ops none = GPL_EXTERNAL_OPS_INIT;
    cr_expect_eq(gpl_init_external(0, 2, 0, 2, &none, &c), GPL_ERR_INVALID_ARG);
    cr_expect(strstr(gpl_last_error(c), "needs allreduce") != NULL, "%s", gpl_last_error(c));
    gpl_finalize(c);
    cr_expect_eq(gpl_init_external(2, 2, 0, 2, &none, &c), GPL_ERR_INVALID_ARG);
    gpl_finalize(c);
    /* a world of one needs no ops */
    cr_expect_eq(gpl_init_external(0, 1, 0, 1, &none, &c), GPL_OK);
    cr_expect_eq(gpl_barrier(c), GPL_OK);
    gpl_finalize(c);
}

static gpl_result_t failing_save_cb(gpl_ckpt_t ck, int64_t step, double left, void *user) {
    char path[4096];
    cr_assert_eq(gpl_ckpt_temp_path(ck, "big", path, sizeof path), GPL_OK);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fputs("half a state", f);
    fclose(f);
    snprintf(user, 4096, "%s", path);
    return GPL_ERR_SYSTEM; /* the writer failed (disk full, an exception) */
}

Test(ckpt, a_failed_save_leaves_no_temporary_file) {
    gpl_comm_t c = NULL;
    cr_assert_eq(gpl_init(NULL, &c), GPL_OK);
    char tmp[4096] = "";
    gpl_ckpt_options o = GPL_CKPT_OPTIONS_INIT;
    o.dir = dir;
    o.every_steps = 1;
    o.handle_sigterm = 0;
    cr_assert_eq(gpl_ckpt_setup(c, &o, failing_save_cb, NULL, tmp), GPL_OK);
    cr_expect_eq(gpl_step_end(c, 1), GPL_ERR_SYSTEM);
    cr_assert(tmp[0]);
    struct stat st;
    cr_expect_neq(stat(tmp, &st), 0, "%s was left behind", tmp);
    gpl_finalize(c);
}

/* ---- asynchronous saves and tiers (a world of one) ---- */

typedef struct blob {
    uint8_t *data;
    size_t len;
    int fill;   /* the byte the state holds at the step being saved */
    int loaded; /* the byte the state held when loaded (-1: mixed) */
} blob;

static gpl_result_t blob_save(gpl_ckpt_t ck, int64_t step, double left, void *user) {
    blob *b = user;
    return gpl_ckpt_write(ck, "blob", b->data, b->len);
}

static gpl_result_t blob_load(gpl_ckpt_t ck, int64_t step, void *user) {
    blob *b = user;
    memset(b->data, 0x5a, b->len);
    gpl_result_t rc = gpl_ckpt_read(ck, "blob", b->data, b->len);
    b->loaded = b->data[0];
    for (size_t i = 0; i < b->len; i += 4096)
        if (b->data[i] != b->data[0])
            b->loaded = -1;
    return rc;
}

static gpl_comm_t blob_comm(blob *b, const char *local, const char *durable, int every, int async,
                            int keep) {
    gpl_comm_t c = NULL;
    cr_assert_eq(gpl_init(NULL, &c), GPL_OK);
    gpl_ckpt_options o = GPL_CKPT_OPTIONS_INIT;
    o.dir = local;
    o.durable = durable;
    o.every_steps = every;
    o.handle_sigterm = 0;
    o.async_save = async;
    o.keep = keep;
    cr_assert_eq(gpl_ckpt_setup(c, &o, blob_save, blob_load, b), GPL_OK, "%s", gpl_last_error(c));
    return c;
}

static long rss_kib(void) {
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert(f && fscanf(f, "%ld %ld", &pages, &rss) == 2);
    fclose(f);
    return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

Test(ckpt, an_async_save_writes_the_state_of_its_step_not_what_came_after) {
    blob b = {malloc(32u << 20), 32u << 20, 0, 0};
    cr_assert_not_null(b.data);
    gpl_comm_t c = blob_comm(&b, dir, NULL, 1, 1, 3);
    memset(b.data, 1, b.len);
    cr_assert_eq(gpl_step_end(c, 1), GPL_OK, "%s", gpl_last_error(c));
    /* training goes on at once and changes the state while step 1 is being written */
    memset(b.data, 2, b.len);
    gpl_ckpt_status st = GPL_CKPT_STATUS_INIT;
    cr_assert_eq(gpl_ckpt_status_get(c, &st), GPL_OK);
    cr_expect_gt(st.last_stall_s, 0);
    cr_assert_eq(gpl_ckpt_wait(c), GPL_OK, "%s", gpl_last_error(c));
    cr_assert_eq(gpl_ckpt_status_get(c, &st), GPL_OK);
    cr_expect_eq(st.local_step, 1);
    cr_expect_eq(st.complete_step, 1);
    gpl_finalize(c);
    c = blob_comm(&b, dir, NULL, 1, 1, 3);
    int64_t step = -1;
    cr_assert_eq(gpl_ckpt_restore(c, &step), GPL_OK, "%s", gpl_last_error(c));
    cr_expect_eq(step, 1);
    cr_expect_eq(b.loaded, 1, "the checkpoint holds what the state was at step 1, not after");
    gpl_finalize(c);
    free(b.data);
}

Test(ckpt, host_memory_stays_flat_over_100_async_saves) {
    blob b = {malloc(8u << 20), 8u << 20, 0, 0};
    cr_assert_not_null(b.data);
    memset(b.data, 7, b.len);
    gpl_comm_t c = blob_comm(&b, dir, NULL, 1, 1, 2);
    long after10 = 0;
    for (int s = 1; s <= 100; s++) {
        b.data[s] = (uint8_t)s; /* the state changes between saves */
        cr_assert_eq(gpl_step_end(c, s), GPL_OK, "%s", gpl_last_error(c));
        if (s == 10)
            after10 = rss_kib();
    }
    cr_assert_eq(gpl_ckpt_wait(c), GPL_OK, "%s", gpl_last_error(c));
    long after100 = rss_kib();
    cr_log_info("RSS after 10 saves %ld KiB, after 100 %ld KiB", after10, after100);
    /* one staging buffer, reused: no growth by a checkpoint's size per save.
     * Under ASan freed blocks stay in its quarantine (RSS creeps by up to ~10
     * MiB over the 90 saves' I/O buffers): there, less than four saves' size,
     * where a buffer per save would add 90 saves' size. */
#if defined(__SANITIZE_ADDRESS__)
    long slack = (long)(4 * b.len / 1024);
#else
    long slack = after10 / 100 + 1024;
#endif
    cr_expect(after100 <= after10 + slack, "RSS grew from %ld to %ld KiB", after10, after100);
    gpl_finalize(c);
    free(b.data);
}

/* Skips a test on kernels before 5.14 (no MADV_POPULATE_WRITE). */
#define NEED_POPULATE_WRITE()                                                                      \
    do {                                                                                           \
        struct utsname u_;                                                                         \
        int major_ = 0, minor_ = 0;                                                                \
        if (uname(&u_) == 0 && sscanf(u_.release, "%d.%d", &major_, &minor_) == 2 &&               \
            (major_ < 5 || (major_ == 5 && minor_ < 14)))                                          \
            skip_test("kernel %s has no MADV_POPULATE_WRITE (5.14)", u_.release);                  \
    } while (0)

Test(ckpt, a_state_size_over_the_staging_limit_is_refused_at_setup) {
    gpl_comm_t c = NULL;
    cr_assert_eq(gpl_init(NULL, &c), GPL_OK);
    gpl_ckpt_options o = GPL_CKPT_OPTIONS_INIT;
    o.dir = dir;
    o.handle_sigterm = 0;
    o.state_bytes = (1ull << 40) + 1;
    cr_assert_eq(gpl_ckpt_setup(c, &o, NULL, NULL, NULL), GPL_ERR_LIMIT);
    cr_assert(strstr(gpl_last_error(c), "state_bytes") && strstr(gpl_last_error(c), "1024 GiB"),
              "%s", gpl_last_error(c));
    gpl_finalize(c);
}

/* After a restore the staging buffer is faulted in by the writer thread, in
 * the background, to the restored state's size: the first save then stalls
 * for the copy alone. Seen as RSS growing by that size before any save. */
Test(ckpt, the_staging_buffer_is_faulted_in_after_a_restore_before_the_first_save) {
    NEED_POPULATE_WRITE();
    blob b = {malloc(64u << 20), 64u << 20, 0, 0};
    cr_assert_not_null(b.data);
    memset(b.data, 3, b.len);
    gpl_comm_t c = blob_comm(&b, dir, NULL, 1, 1, 2);
    cr_assert_eq(gpl_step_end(c, 1), GPL_OK, "%s", gpl_last_error(c));
    cr_assert_eq(gpl_ckpt_wait(c), GPL_OK, "%s", gpl_last_error(c));
    gpl_finalize(c);
    c = blob_comm(&b, dir, NULL, 1, 1, 2);
    long before = rss_kib(), after = before;
    int64_t step = -1;
    cr_assert_eq(gpl_ckpt_restore(c, &step), GPL_OK, "%s", gpl_last_error(c));
    cr_assert_eq(step, 1);
    long want = before + (long)(b.len / 1024) * 9 / 10;
    for (int i = 0; i < 500 && after < want; i++) {
        usleep(10000);
        after = rss_kib();
    }
    cr_log_info("RSS before the restore %ld KiB, after %ld KiB (state %zu KiB)", before, after,
                b.len / 1024);
    cr_expect_geq(after, want, "the staging buffer was not faulted in: RSS %ld -> %ld KiB", before,
                  after);
    gpl_finalize(c);
    free(b.data);
}

/* A state size given at setup: the staging buffer is faulted in then, in the
 * background, so that the first save of a fresh run too stalls for the copy
 * alone; without it, nothing is faulted in before the first save. */
Test(ckpt, a_state_size_given_at_setup_faults_the_staging_buffer_in_before_the_first_save) {
    NEED_POPULATE_WRITE();
    blob b = {malloc(64u << 20), 64u << 20, 0, 0};
    cr_assert_not_null(b.data);
    memset(b.data, 5, b.len);
    for (int hint = 0; hint <= 1; hint++) {
        gpl_comm_t c = NULL;
        cr_assert_eq(gpl_init(NULL, &c), GPL_OK);
        gpl_ckpt_options o = GPL_CKPT_OPTIONS_INIT;
        o.dir = dir;
        o.every_steps = 1;
        o.handle_sigterm = 0;
        o.state_bytes = hint ? b.len : 0;
        long before = rss_kib(), after = before;
        cr_assert_eq(gpl_ckpt_setup(c, &o, blob_save, blob_load, &b), GPL_OK, "%s",
                     gpl_last_error(c));
        long want = before + (long)(b.len / 1024) * 9 / 10;
        for (int i = 0; i < (hint ? 500 : 30) && after < want; i++) {
            usleep(10000);
            after = rss_kib();
        }
        cr_log_info("state_bytes %s: RSS %ld -> %ld KiB before the first save (state %zu KiB)",
                    hint ? "64 MiB" : "0", before, after, b.len / 1024);
        if (hint)
            cr_expect_geq(after, want, "the staging buffer was not faulted in: RSS %ld -> %ld KiB",
                          before, after);
        else
            cr_expect_lt(after, want, "faulted in with no size given: RSS %ld -> %ld KiB", before,
                         after);
        cr_assert_eq(gpl_step_end(c, 1), GPL_OK, "%s", gpl_last_error(c));
        cr_assert_eq(gpl_ckpt_wait(c), GPL_OK, "%s", gpl_last_error(c));
        gpl_finalize(c);
    }
    free(b.data);
}

Test(ckpt, the_staging_buffer_grows_twice_past_a_size_of_no_whole_pages) {
    /* a first save of 70 MiB + 5 bytes, then one of 140 MiB: the second growth
     * starts where the first ended */
    blob b = {malloc(140u << 20), (70u << 20) + 5, 0, 0};
    cr_assert_not_null(b.data);
    memset(b.data, 7, 140u << 20);
    gpl_comm_t c = NULL;
    cr_assert_eq(gpl_init(NULL, &c), GPL_OK);
    gpl_ckpt_options o = GPL_CKPT_OPTIONS_INIT;
    o.dir = dir;
    o.every_steps = 1;
    o.handle_sigterm = 0;
    cr_assert_eq(gpl_ckpt_setup(c, &o, blob_save, blob_load, &b), GPL_OK, "%s", gpl_last_error(c));
    cr_assert_eq(gpl_step_end(c, 1), GPL_OK, "%s", gpl_last_error(c));
    cr_assert_eq(gpl_ckpt_wait(c), GPL_OK, "%s", gpl_last_error(c));
    b.len = 140u << 20;
    cr_assert_eq(gpl_step_end(c, 2), GPL_OK, "%s", gpl_last_error(c));
    cr_assert_eq(gpl_ckpt_wait(c), GPL_OK, "%s", gpl_last_error(c));
    gpl_finalize(c);
    char path[256];
    snprintf(path, sizeof path, "%s/step-%012d/COMPLETE", dir, 2);
    cr_expect_eq(access(path, F_OK), 0, "step 2 is not complete");
    free(b.data);
}

Test(ckpt, a_durable_directory_outlives_the_local_one_and_mends_a_torn_local_file) {
    char local[128], durable[128], cmd[512];
    snprintf(local, sizeof local, "%s/nvme", dir);
    snprintf(durable, sizeof durable, "%s/pvc", dir);
    blob b = {malloc(3u << 20), 3u << 20, 0, 0};
    cr_assert_not_null(b.data);
    gpl_comm_t c = blob_comm(&b, local, durable, 2, 1, 3);
    for (int s = 1; s <= 6; s++) {
        memset(b.data, s, b.len);
        cr_assert_eq(gpl_step_end(c, s), GPL_OK, "%s", gpl_last_error(c));
    }
    cr_assert_eq(gpl_ckpt_wait(c), GPL_OK, "%s", gpl_last_error(c));
    gpl_ckpt_status st = GPL_CKPT_STATUS_INIT;
    cr_assert_eq(gpl_ckpt_status_get(c, &st), GPL_OK);
    cr_expect_eq(st.durable_step, 6);
    cr_expect_eq(st.durable_complete_step, 6);
    gpl_finalize(c);
    char p[256];
    snprintf(p, sizeof p, "%s/step-000000000006/COMPLETE", durable);
    cr_expect_eq(access(p, F_OK), 0, "no %s", p);
    snprintf(p, sizeof p, "%s/step-000000000006/r0-blob", durable);
    cr_expect_eq(access(p, F_OK), 0, "no %s", p);

    /* a torn local file: fetched again from the durable tier, checked */
    snprintf(cmd, sizeof cmd,
             "printf x | dd of=%s/step-000000000006/r0-blob bs=1 seek=4096 "
             "conv=notrunc status=none",
             local);
    cr_assert_eq(system(cmd), 0);
    c = blob_comm(&b, local, durable, 2, 1, 3);
    int64_t step = -1;
    cr_assert_eq(gpl_ckpt_restore(c, &step), GPL_OK, "%s", gpl_last_error(c));
    cr_expect_eq(step, 6);
    cr_expect_eq(b.loaded, 6);
    gpl_finalize(c);

    /* the node's disk is gone: everything comes from the durable tier */
    snprintf(cmd, sizeof cmd, "rm -rf %s", local);
    cr_assert_eq(system(cmd), 0);
    c = blob_comm(&b, local, durable, 2, 1, 3);
    step = -1;
    cr_assert_eq(gpl_ckpt_restore(c, &step), GPL_OK, "%s", gpl_last_error(c));
    cr_expect_eq(step, 6);
    cr_expect_eq(b.loaded, 6, "restored bitwise from the durable tier alone");
    gpl_finalize(c);
    free(b.data);
}

Test(ckpt, a_full_local_tier_is_said_training_goes_on_and_the_last_complete_step_stays) {
    if (geteuid() != 0)
        skip_test("not root: the test mounts a 4 MiB tmpfs as a full disk");
    char small[128], cmd[256];
    snprintf(small, sizeof small, "%s/small", dir);
    cr_assert_eq(mkdir(small, 0755), 0);
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=4m tmpfs %s", small);
    if (system(cmd) != 0)
        skip_test("cannot mount a tmpfs here");
    blob b = {malloc(1u << 20), 1u << 20, 0, 0};
    cr_assert_not_null(b.data);
    gpl_comm_t c = blob_comm(&b, small, NULL, 1, 1, 3);
    memset(b.data, 1, b.len);
    cr_assert_eq(gpl_step_end(c, 1), GPL_OK, "%s", gpl_last_error(c));
    cr_assert_eq(gpl_ckpt_wait(c), GPL_OK, "%s", gpl_last_error(c));
    free(b.data);
    b.len = 3u << 20; /* steps 2 and 3 no longer fit beside step 1 */
    b.data = malloc(b.len);
    cr_assert_not_null(b.data);
    memset(b.data, 2, b.len);
    cr_expect_eq(gpl_step_end(c, 2), GPL_OK, "training goes on: %s", gpl_last_error(c));
    cr_expect_eq(gpl_step_end(c, 3), GPL_OK, "training goes on: %s", gpl_last_error(c));
    gpl_ckpt_wait(c);
    gpl_ckpt_status st = GPL_CKPT_STATUS_INIT;
    cr_assert_eq(gpl_ckpt_status_get(c, &st), GPL_OK);
    cr_expect_eq(st.complete_step, 1, "the newest complete step is still 1");
    gpl_finalize(c);
    free(b.data);
    b.len = 1u << 20;
    b.data = malloc(b.len);
    c = blob_comm(&b, small, NULL, 1, 1, 3);
    int64_t step = -1;
    cr_assert_eq(gpl_ckpt_restore(c, &step), GPL_OK, "%s", gpl_last_error(c));
    cr_expect_eq(step, 1);
    cr_expect_eq(b.loaded, 1);
    gpl_finalize(c);
    free(b.data);
    snprintf(cmd, sizeof cmd, "umount %s", small);
    cr_expect_eq(system(cmd), 0);
}

/* The nice value of this process's thread named name, or 99 when there is
 * none. */
static int thread_nice(const char *name) {
    char path[300];
    int found = 99;
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d);
    struct dirent *e;
    while (found == 99 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        char comm[32] = "";
        if (fgets(comm, sizeof comm, f) == NULL)
            comm[0] = '\0';
        fclose(f);
        comm[strcspn(comm, "\n")] = '\0';
        errno = 0;
        int v = getpriority(PRIO_PROCESS, (id_t)strtol(e->d_name, NULL, 10));
        if (strcmp(comm, name) == 0 && (v != -1 || errno == 0))
            found = v;
    }
    closedir(d);
    return found;
}

/* thread_nice once the thread has named itself (it does so as it starts). */
static int thread_nice_when_started(const char *name) {
    int v = 99;
    for (int i = 0; i < 200 && (v = thread_nice(name)) == 99; i++)
        usleep(10000);
    return v;
}

Test(ckpt, the_writer_and_the_drainer_run_named_below_the_training_threads_priority) {
    char local[128], durable[128];
    snprintf(local, sizeof local, "%s/nvme", dir);
    snprintf(durable, sizeof durable, "%s/pvc", dir);
    blob b = {malloc(1u << 20), 1u << 20, 0, 0};
    cr_assert_not_null(b.data);
    errno = 0;
    int own = getpriority(PRIO_PROCESS, 0);
    cr_assert(own != -1 || errno == 0);
    int want = own + 10 > 19 ? 19 : own + 10;
    gpl_comm_t c = blob_comm(&b, local, durable, 2, 1, 3);
    cr_expect_eq(thread_nice_when_started("gpl-ckpt-write"), want, "the writer's nice against %d",
                 want);
    cr_expect_eq(thread_nice_when_started("gpl-ckpt-drain"), want, "the drainer's nice against %d",
                 want);
    memset(b.data, 1, b.len);
    cr_assert_eq(gpl_step_end(c, 1), GPL_OK, "%s", gpl_last_error(c));
    cr_assert_eq(gpl_ckpt_wait(c), GPL_OK, "%s", gpl_last_error(c));
    cr_expect_eq(getpriority(PRIO_PROCESS, 0), own, "the calling thread keeps its priority");
    gpl_finalize(c);
    /* GPULAUNCH_BACKGROUND_NICE=0: at the process's priority */
    setenv("GPULAUNCH_BACKGROUND_NICE", "0", 1);
    c = blob_comm(&b, local, durable, 2, 1, 3);
    cr_expect_eq(thread_nice_when_started("gpl-ckpt-write"), own, "the writer's nice with 0 steps");
    gpl_finalize(c);
    /* not a number from 0 to 19: said, and the default */
    setenv("GPULAUNCH_BACKGROUND_NICE", "20", 1);
    c = blob_comm(&b, local, durable, 2, 1, 3);
    cr_expect_eq(thread_nice_when_started("gpl-ckpt-write"), want, "the default for 20");
    gpl_finalize(c);
    unsetenv("GPULAUNCH_BACKGROUND_NICE");
    free(b.data);
}
