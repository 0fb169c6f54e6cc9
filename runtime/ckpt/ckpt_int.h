/* What the checkpoint room's files share (runtime/ckpt/):
 *   ckpt.c          the public API: setup, the agreement at step_end, the save
 *                   and load callbacks' calls, gpl_ckpt_wait
 *   ckpt_stage.c    the staging buffer a save is copied into (one per rank, reused)
 *   ckpt_writer.c   the background threads: the writer (staging -> the first tier:
 *                   files, fsync, SHA-256, manifest) and the drainer (the first
 *                   tier -> the durable one), COMPLETE markers, keep=N
 *   ckpt_tier.c     a tier: a directory (local NVMe, or a shared PVC) or S3
 *   ckpt_files.c    file helpers: atomic writes, hashing, step directories
 *   ckpt_restore.c  restore from whichever tier holds a verified step
 *   s3/                      the S3 client and AWS credentials (s3/s3_int.h)
 *
 * A step's layout is the same in every tier (a directory, or keys under an S3
 * prefix):
 *   step-000000000120/r0-params        files, r<rank>-<name>
 *                    /rank-0.manifest  "<file> <size> <sha256>" per line, written
 *                                      after the rank's files
 *                    /COMPLETE         "gpulaunch-checkpoint 1\nstep 120\nworld 4\n",
 *                                      written last, once every rank's files are there */
#ifndef GPULAUNCH_CKPT_INT_H
#define GPULAUNCH_CKPT_INT_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "gb_error.h"
#include "gpl_int.h"

#define CKPT_NAME_MAX 128                  /* bytes of a file name given to gpl_ckpt_write */
#define CKPT_FILE_MAX (CKPT_NAME_MAX + 32) /* r<rank>-<name> */
#define CKPT_MANIFEST_MAX 65536            /* bytes of one rank's manifest */
#define CKPT_MAX_STEPS 4096                /* step directories looked at by restore and keep */
#define CKPT_MAX_FILES 1024                /* files one rank saves in one checkpoint */
#define CKPT_STAGE_RESERVE                                                                         \
    (1ull << 40)                       /* address space of the staging buffer: a rank's            \
                                          checkpoint is at most 1 TiB */
#define CKPT_STAGE_GROW (64ull << 20)  /* the staging buffer grows by this much at least */
#define CKPT_STAGE_SLACK (64ull << 10) /* prefaulted beyond a known state size: alignment */
#define CKPT_IO_PIECE (4u << 20)       /* bytes written, read or hashed at once */
/* up to this world size, a rank that finishes a step looks for every rank's
 * manifest in the tier and marks the step COMPLETE at once (a shared tier);
 * larger jobs wait for the next agreement */
#define CKPT_LOOK_MAX_WORLD 64
#define CKPT_WRITTEN_KEEP 64 /* steps a writer remembers having written, for the marks */

enum ckpt_file_kind {
    CKPT_STAGED = 0,  /* bytes in the staging buffer */
    CKPT_TEMPFILE = 1 /* written by the caller to a temporary path: fsync, hash, rename */
};

typedef struct ckpt_file {
    char name[CKPT_FILE_MAX]; /* r<rank>-<name> */
    int kind;
    uint64_t off, len; /* CKPT_STAGED: where in the staging buffer */
} ckpt_file;

/* The staging buffer: address space reserved once, made usable as saves need
 * it, never moved (pointers handed out stay valid) and never given back:
 * memory grows to the largest save and stays there (one buffer per rank). */
typedef struct ckpt_stage {
    uint8_t *base;
    uint64_t used, committed; /* bytes handed out in this save, bytes usable */
} ckpt_stage;

gpl_result_t ckpt_stage_init(ckpt_stage *s, gb_err *err);
/* n more bytes for the save being staged: *p points at them. */
gpl_result_t ckpt_stage_take(ckpt_stage *s, uint64_t n, uint8_t **p, gb_err *err);
void ckpt_stage_reset(ckpt_stage *s);
/* The next save is expected to need n bytes (the size of the state just
 * restored): the buffer is grown to n now, on the caller's thread; n, or 0
 * when it cannot be. ckpt_stage_populate then faults its first n bytes in
 * (the writer thread does it, in the background), so that the first save
 * after a restore stalls for the copy alone, not for page faults too. */
uint64_t ckpt_stage_expect(ckpt_stage *s, uint64_t n);
void ckpt_stage_populate(ckpt_stage *s, uint64_t n);
void ckpt_stage_free(ckpt_stage *s);

/* ---- tiers ---- */
enum ckpt_tier_kind { CKPT_TIER_DIR = 0, CKPT_TIER_S3 = 1 };
struct ckpt_s3;
typedef struct ckpt_tier {
    int kind;
    char where[PATH_MAX - 64]; /* the directory, or the s3:// URL */
    struct ckpt_s3 *s3;
    int keep;
} ckpt_tier;

/* progress of one transfer; non-zero aborts it */
typedef int (*ckpt_progress_fn)(uint64_t done, uint64_t total, void *user);

gpl_result_t ckpt_tier_open(ckpt_tier *t, const char *where, int keep, gb_err *err);
void ckpt_tier_close(ckpt_tier *t);
/* "step-000000000120" */
void ckpt_step_name(int64_t step, char *out, size_t len);
/* A whole file of the local directory `src` copied into the tier as step/name,
 * through a temporary name (directories) or one upload (S3); its bytes hashed
 * on the way and checked against sha (NULL: not checked). */
gpl_result_t ckpt_tier_put_file(ckpt_tier *t, int64_t step, const char *name, const char *src,
                                const char *sha, ckpt_progress_fn fn, void *user, gb_err *err);
/* A small object step/name (manifest, COMPLETE) from memory, durable when it returns. */
gpl_result_t ckpt_tier_put_small(ckpt_tier *t, int64_t step, const char *name, const void *buf,
                                 size_t len, gb_err *err);
/* A small object into buf (at most cap bytes); GPL_ERR_NOT_FOUND when absent. */
gpl_result_t ckpt_tier_get_small(ckpt_tier *t, int64_t step, const char *name, char *buf,
                                 size_t cap, size_t *len, gb_err *err);
/* step/name into the local file dst (created through a temporary name, fsync'd),
 * its bytes hashed on the way into sha_out (65 bytes). */
gpl_result_t ckpt_tier_get_file(ckpt_tier *t, int64_t step, const char *name, const char *dst,
                                char sha_out[65], gb_err *err);
/* Steps present in the tier, newest first; *n how many (at most max). */
gpl_result_t ckpt_tier_steps(ckpt_tier *t, int64_t *steps, int max, int *n, gb_err *err);
/* 1 when step/name exists. */
int ckpt_tier_has(ckpt_tier *t, int64_t step, const char *name);
/* How many rank-<r>.manifest objects step has. */
int ckpt_tier_manifests(ckpt_tier *t, int64_t step, int world);
void ckpt_tier_remove_step(ckpt_tier *t, int64_t step);
/* Keeps the newest t->keep COMPLETE steps at or below `current`; removes older
 * ones and abandoned ones, except `busy` (a step being drained). */
void ckpt_tier_prune(ckpt_tier *t, int64_t current, int64_t busy);

/* ---- files (ckpt_files.c) ---- */
void ckpt_sha256_hex(const unsigned char md[32], char hex[65]);
/* The open file `in` read to its end in CKPT_IO_PIECE pieces, written to
 * `out` (-1: hashed only), SHA-256 of it into hex, *total its bytes; fn is
 * told the progress (against size) and stops the copy (ECANCELED) when it
 * returns non-zero. 0, or -1 with errno. */
int ckpt_copy_hashed(int in, int out, char hex[65], uint64_t *total, ckpt_progress_fn fn,
                     void *user, uint64_t size);
/* SHA-256 of a file read in pieces; *size its bytes. */
int ckpt_hash_file(const char *path, char hex[65], uint64_t *size);
int ckpt_fsync_dir(const char *path);
/* data written to dir/name through a temporary name, fsync'd, renamed. */
int ckpt_write_atomic(const char *dir, const char *name, const void *data, size_t len);
/* the file's bytes written to fd in pieces; SHA-256 of them into hex */
int ckpt_write_hashed(int fd, const uint8_t *p, uint64_t len, char hex[65]);
void ckpt_remove_dir(const char *path);
int ckpt_list_steps(const char *dir, int64_t *steps, int max);
/* One line of a rank's manifest ("<file> <size> <sha256>"). */
typedef struct ckpt_manifest_line {
    char file[CKPT_FILE_MAX];
    uint64_t size;
    char sha[65];
} ckpt_manifest_line;
/* The next well-formed line at *l into *m, *l moved past it: 1; 0 at the end. */
int ckpt_manifest_next(const char **l, ckpt_manifest_line *m);
/* The COMPLETE marker's text for step/world; its length. */
int ckpt_complete_text(char *buf, size_t len, int64_t step, int world);
/* Parses a COMPLETE marker: 1 with *world set when it is one for step. */
int ckpt_complete_parse(const char *buf, size_t len, int64_t step, int *world);

/* ---- the background threads (ckpt_writer.c) ---- */
typedef struct ckpt_job {
    int64_t step;
    int world, rank;
    int nfiles;
    ckpt_file files[CKPT_MAX_FILES];
    char manifest[CKPT_MANIFEST_MAX]; /* filled by the writer */
    size_t man_len;
} ckpt_job;

typedef struct ckpt_bg {
    pthread_mutex_t mu, mark_mu; /* mark_mu: one COMPLETE marker write at a time */
    pthread_cond_t cv;
    pthread_t writer, drainer;
    int have_writer, have_drainer, stop;
    ckpt_tier *first, *durable; /* first: where the writer puts the files; durable: NULL or where
                                   they drain to */
    ckpt_stage *stage;
    ckpt_job job;       /* the save being written (job_busy) */
    int job_busy;       /* the writer has the job (staged data in use) */
    uint64_t prefault;  /* staging bytes the writer is to fault in (0: none) */
    int64_t drain_want; /* newest step written by the writer and not drained yet (-1: none) */
    int drain_rank;     /* the rank whose files drain_want's are (a re-formation renumbers) */
    int64_t draining;   /* the step being drained (-1: none) */
    int64_t mark_local; /* a step every rank wrote: the writer marks it COMPLETE (-1: none) */
    int64_t mark_floor; /* newest step some rank failed to write: older steps this rank
                           wrote but were never marked are marked only above it */
    int64_t written[CKPT_WRITTEN_KEEP]; /* steps this rank wrote, oldest first */
    int nwritten;
    int64_t local_marked;           /* newest step marked in the first tier by this rank */
    int drain_world;                /* the world of drain_want's save */
    int64_t mark_durable;           /* rank 0: a step every rank drained: the drainer marks it */
    int is_marker;                  /* local rank 0: writes COMPLETE markers in its first tier */
    int is_root;                    /* rank 0: writes COMPLETE in the durable tier (both set by the
                                       training thread at each save: a re-formation renumbers) */
    int world_local, world_durable; /* the world of the steps to mark */
    /* results, read by the training thread and the progress slot */
    _Atomic int64_t local_done;       /* newest step this rank's files are in the first tier */
    _Atomic int64_t durable_done;     /* newest step this rank's files are in the durable tier */
    _Atomic int64_t durable_complete; /* newest step rank 0 marked COMPLETE in the durable tier */
    _Atomic uint64_t drain_total, drain_done; /* bytes of the drain in flight */
    _Atomic uint64_t drain_started_ns;
    _Atomic int abandon; /* a preemption's deadline passed: drop the drain in flight */
    double drain_rate;   /* bytes/s of the last drain */
    gb_err werr, derr;   /* the writer's and the drainer's last failure, said once */
    int64_t werr_step, derr_step;
    uint64_t drain_warned; /* a drain behind the interval was said */
} ckpt_bg;

gpl_result_t ckpt_bg_start(ckpt_bg *b, ckpt_tier *first, ckpt_tier *durable, ckpt_stage *stage,
                           gb_err *err);
/* Waits until the writer has no job (the staging buffer is free); *waited_s how long. */
void ckpt_bg_wait_writer(ckpt_bg *b, double *waited_s);
/* Hands the save staged in b->job to the writer (which was idle while it was staged). */
void ckpt_bg_submit(ckpt_bg *b);
/* The drain in flight is aborted and no other starts (a preemption's
 * deadline passed): the process can end at once instead of when the last
 * part gets through. The durable tier keeps its newest COMPLETE step. */
void ckpt_bg_abandon(ckpt_bg *b);
/* Grows the staging buffer to n bytes and has the writer fault it in. */
void ckpt_bg_prefault(ckpt_bg *b, uint64_t n);
/* Every rank wrote `step` to its first tier: mark it COMPLETE there (the marker
 * ranks), in the background. */
void ckpt_bg_mark_local(ckpt_bg *b, int64_t step, int world, int64_t floor);
/* Rank 0: every rank's files of step are durable: mark it COMPLETE there, in the background. */
void ckpt_bg_mark_durable(ckpt_bg *b, int64_t step, int world);
/* The same, now, on the calling thread (a preemption's save, gpl_ckpt_wait). */
gpl_result_t ckpt_bg_mark_local_now(ckpt_bg *b, int64_t step, int world, int64_t floor,
                                    gb_err *err);
/* Waits until this rank's `step` is drained (or a later one), at most until
 * deadline_s (wall clock; 0: no limit). 1 when it is. */
int ckpt_bg_wait_drained(ckpt_bg *b, int64_t step, double deadline_s);
/* Rank 0, with every rank's files of step durable: writes COMPLETE now. */
gpl_result_t ckpt_bg_mark_durable_now(ckpt_bg *b, int64_t step, int world, gb_err *err);
/* Waits for the writer and the drainer to go idle, then joins them. */
void ckpt_bg_stop(ckpt_bg *b);

/* ---- restore's view of the handle (ckpt.c) ---- */
/* The load callback called for step (its files in the first tier's step
 * directory), saved by a world of `world` ranks; durable_ok: the durable tier
 * has it COMPLETE too (files missing here are fetched from there). */
gpl_result_t gpl__ckpt_restore_load(gpl_ckpt_t k, int64_t step, int world, int durable_ok);
/* Rank `rank`'s file (r<rank>-<name>) of that step, checked against its
 * manifest's size and SHA-256, fetched from the durable tier when missing or
 * damaged here: its path (ckpt_restore.c). */
gpl_result_t ckpt_restore_rank_file(gpl_comm_t c, int64_t step, int world, int durable_ok, int rank,
                                    const char *file, char *path, size_t len);
ckpt_tier *gpl__ckpt_first(gpl_ckpt_t k);   /* NULL: nowhere to restore from */
ckpt_tier *gpl__ckpt_durable(gpl_ckpt_t k); /* NULL: no tier to fetch from */

#endif
