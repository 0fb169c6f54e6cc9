/* The staging buffer: where a save's bytes are copied at the step boundary so
 * that training goes on while the writer thread writes them.
 *
 * CKPT_STAGE_RESERVE bytes of address space are reserved once (PROT_NONE,
 * not backed, not counted against overcommit) and made readable and writable
 * in CKPT_STAGE_GROW steps as the largest save needs them. So the buffer
 * never moves (a pointer handed out during a save stays valid while it
 * grows), it is reused from save to save, and the memory it holds is the
 * largest save's size, once per rank: no growth from save to save. */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "ckpt_int.h"

gpl_result_t ckpt_stage_init(ckpt_stage *s, gb_err *err) {
    memset(s, 0, sizeof *s);
    void *p = mmap(NULL, CKPT_STAGE_RESERVE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        return gb_seterr(err, GPL_ERR_NOMEM,
                         "checkpoint staging: cannot reserve %llu GiB of address space: %s; "
                         "check `ulimit -v`",
                         (unsigned long long)(CKPT_STAGE_RESERVE >> 30), strerror(errno));
    s->base = p;
    return GPL_OK;
}

/* Makes [0, end) usable (end <= CKPT_STAGE_RESERVE). */
static gpl_result_t grow(ckpt_stage *s, uint64_t end, gb_err *err) {
    if (end > s->committed) {
        /* whole CKPT_STAGE_GROW steps: the next growth starts page-aligned
         * (mprotect refuses another start with EINVAL) */
        uint64_t want =
            (end - s->committed + CKPT_STAGE_GROW - 1) / CKPT_STAGE_GROW * CKPT_STAGE_GROW;
        if (s->committed + want > CKPT_STAGE_RESERVE)
            want = CKPT_STAGE_RESERVE - s->committed;
        if (mprotect(s->base + s->committed, want, PROT_READ | PROT_WRITE) != 0)
            return gb_seterr(err, GPL_ERR_NOMEM,
                             "checkpoint staging: cannot grow the buffer from %llu to %llu MiB: "
                             "%s; the node needs host memory for one copy of each rank's "
                             "checkpoint",
                             (unsigned long long)(s->committed >> 20),
                             (unsigned long long)((s->committed + want) >> 20), strerror(errno));
        /* transparent huge pages: fewer faults on the first save and fewer TLB misses */
        madvise(s->base + s->committed, want, MADV_HUGEPAGE);
        s->committed += want;
    }
    return GPL_OK;
}

gpl_result_t ckpt_stage_take(ckpt_stage *s, uint64_t n, uint8_t **p, gb_err *err) {
    /* 64-byte alignment: vector copies, and any dtype a caller views it as */
    uint64_t start = (s->used + 63) & ~(uint64_t)63;
    if (s->base == NULL || n > CKPT_STAGE_RESERVE - start)
        return gb_seterr(err, GPL_ERR_LIMIT,
                         "checkpoint staging: a rank's checkpoint is at most %llu GiB "
                         "(CKPT_STAGE_RESERVE); this one needs more",
                         (unsigned long long)(CKPT_STAGE_RESERVE >> 30));
    uint64_t end = start + n;
    gpl_result_t rc = grow(s, end, err);
    if (rc != GPL_OK)
        return rc;
    s->used = end;
    *p = s->base + start;
    return GPL_OK;
}

uint64_t ckpt_stage_expect(ckpt_stage *s, uint64_t n) {
    if (s->base == NULL || n > CKPT_STAGE_RESERVE)
        return 0;
    gb_err e = GB_ERR_INIT;
    if (grow(s, n, &e) != GPL_OK)
        return 0; /* the save that needs it says so */
    return n;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

void ckpt_stage_populate(ckpt_stage *s, uint64_t n) {
    /* Faults the pages in, writable, leaving their contents alone: safe while
     * a save copies into them. Older kernels refuse (EINVAL): the first save
     * takes the faults then. */
    if (n > 0)
        madvise(s->base, n, MADV_POPULATE_WRITE);
}

void ckpt_stage_reset(ckpt_stage *s) { s->used = 0; }

void ckpt_stage_free(ckpt_stage *s) {
    if (s->base)
        munmap(s->base, CKPT_STAGE_RESERVE);
    memset(s, 0, sizeof *s);
}
