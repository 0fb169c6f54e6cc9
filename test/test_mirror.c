/* Copies of sharded state in peers' memory (gpl_mirror) with real processes
 * and sockets: a push reaches the same local rank on the next node, checked;
 * after a "loss" (a rank that comes to the agreement without its mirror, as
 * a new process would), its copy is found at its buddy and fetched from
 * there; a rank lost before its push is a fallback to the checkpoint; a rank and its buddy both
 * lost is GPL_ERR_STATE naming them; a copy changed after its push is refused as corrupt; one node
 * pairs ranks on it and says so. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "rt_harness.h"

#define NBUF 2
static const size_t SIZES[NBUF] = {(3u << 20) + 5, 1000};

/* Rank rank's state at step: bytes that say whose and which step they are. */
static uint8_t val(int rank, int64_t step, int buf, size_t i) {
    return (uint8_t)(i * 31 + (size_t)buf * 7 + (size_t)rank * 101 + (size_t)step * 13 + 1);
}

static void fill(void *bufs[NBUF], int rank, int64_t step) {
    for (int b = 0; b < NBUF; b++)
        for (size_t i = 0; i < SIZES[b]; i++)
            ((uint8_t *)bufs[b])[i] = val(rank, step, b, i);
}

static int check(void *const bufs[NBUF], int rank, int64_t step, char *msg, size_t len) {
    for (int b = 0; b < NBUF; b++)
        for (size_t i = 0; i < SIZES[b]; i++)
            if (((uint8_t *)bufs[b])[i] != val(rank, step, b, i)) {
                snprintf(msg, len, "buffer %d byte %zu is not rank %d's at step %lld", b, i, rank,
                         (long long)step);
                return 1;
            }
    return 0;
}

typedef struct mirror_arg {
    int lost[2];     /* ranks that come to the agreement without their mirror (-1: none) */
    int late;        /* this rank stages step 10 but never pushes it (-1: none) */
    int scribble;    /* this rank changes its buffer after pushing step 10 (-1: none) */
    int fetch_other; /* each rank fetches this old rank's copy (-1: its buddy) */
} mirror_arg;

static int is_lost(const mirror_arg *a, int r) { return r == a->lost[0] || r == a->lost[1]; }

static int push_step(gpl_mirror_t m, void *bufs[NBUF], int rank, int64_t step, char *msg,
                     size_t len) {
    gpl_result_t rc = gpl_mirror_stage(m);
    if (rc == GPL_OK) {
        fill(bufs, rank, step);
        rc = gpl_mirror_push(m, step);
    }
    if (rc == GPL_OK)
        rc = gpl_mirror_wait(m);
    if (rc != GPL_OK)
        snprintf(msg, len, "push %lld: rc %d: %s", (long long)step, (int)rc,
                 gpl_mirror_last_error(m));
    return rc != GPL_OK;
}

static int mirror_rank(gpl_comm_t c, void *arg, char *msg, size_t len) {
    mirror_arg *a = arg;
    int rank = gpl_rank(c), world = gpl_world_size(c), bad = 0;
    void *bufs[NBUF], *got[NBUF];
    for (int b = 0; b < NBUF; b++) {
        bufs[b] = malloc(SIZES[b]);
        got[b] = malloc(SIZES[b]);
    }
    gpl_mirror_t m = NULL;
    gpl_mirror_plan_t p = NULL;
    gpl_mirror_status st;
    gpl_result_t rc = gpl_mirror_create(c, NULL, &m);
    for (int b = 0; b < NBUF && rc == GPL_OK; b++)
        rc = gpl_mirror_register(m, bufs[b], SIZES[b]);
    if (rc != GPL_OK) {
        snprintf(msg, len, "create: rc %d: %s", (int)rc, gpl_last_error(c));
        return 2;
    }
    bad = push_step(m, bufs, rank, 5, msg, len);
    gpl_barrier(c); /* every push of step 5 is held */
    if (!bad && rank == a->late) {
        gpl_mirror_stage(m); /* lost while it filled its buffers */
        fill(bufs, rank, 10);
    } else if (!bad)
        bad = push_step(m, bufs, rank, 10, msg, len);
    if (!bad && rank == a->scribble)
        ((uint8_t *)bufs[0])[12345] ^= 1;
    gpl_barrier(c);
    gpl_mirror_status_get(m, &st);
    if (is_lost(a, rank)) {
        gpl_mirror_destroy(m); /* a new process: nothing of its own */
        m = NULL;
    }
    int64_t step = -1;
    int old_world = 0, old_round = -1;
    if (!bad) {
        rc = gpl_mirror_agree(c, m, &p);
        if (rc != GPL_OK) {
            snprintf(msg, len, "agree: rc %d: %s", (int)rc, gpl_last_error(c));
            bad = 10 + (int)rc;
        }
    }
    if (!bad) {
        gpl_mirror_plan_info(p, &step, &old_world, &old_round);
        int other = a->fetch_other >= 0 ? a->fetch_other : st.buddy;
        int64_t want = 10;
        /* this rank's own state at the agreed step, and another's */
        int mine = is_lost(a, rank) || rank == a->late ? rank : -1;
        int who[2] = {rank, other};
        for (int k = 0; k < 2 && !bad; k++) {
            rc = gpl_mirror_fetch(p, who[k], got, SIZES, NBUF);
            if (rc != GPL_OK) {
                snprintf(msg, len, "fetch %d from rank %d: rc %d: %s", who[k],
                         gpl_mirror_holder(p, who[k]), (int)rc, gpl_last_error(c));
                bad = 30 + (int)rc;
            } else
                bad = check(got, who[k], want, msg, len);
        }
        const void *v = NULL;
        size_t vn = 0;
        int viewed = gpl_mirror_view(p, rank, 0, &v, &vn) == GPL_OK;
        if (!bad)
            snprintf(msg, len,
                     "ok step %lld world %d buddy %d same_node %d held %d sent %lld holder %d "
                     "view %d mine %d",
                     (long long)step, old_world, st.buddy, st.buddy_same_node, st.held_ranks,
                     (long long)st.sent_step, gpl_mirror_holder(p, rank), viewed, mine);
    }
    gpl_barrier(c); /* every fetch served */
    gpl_mirror_plan_free(p);
    gpl_mirror_destroy(m);
    for (int b = 0; b < NBUF; b++) {
        free(bufs[b]);
        free(got[b]);
    }
    (void)world;
    return bad;
}

static void expect_ok(int n, rt_result *res, int rc) {
    for (int r = 0; r < n; r++)
        cr_expect(WIFEXITED(res->status[r]) && WEXITSTATUS(res->status[r]) == 0,
                  "rank %d status %d: %s", r, res->status[r], res->msg[r]);
    cr_expect_eq(rc, 0);
}

Test(mirror, a_push_reaches_the_same_local_rank_on_the_next_node, .timeout = 60) {
    mirror_arg a = {{-1, -1}, -1, -1, -1};
    rt_result res;
    expect_ok(6, &res, rt_run(3, 2, mirror_rank, &a, NULL, &res, 50000));
    for (int r = 0; r < 6; r++) {
        char want[96];
        snprintf(want, sizeof want,
                 "ok step 10 world 6 buddy %d same_node 0 held 1 sent 10 holder %d", (r + 2) % 6,
                 r);
        cr_expect(strstr(res.msg[r], want) != NULL, "rank %d: %s (want %s)", r, res.msg[r], want);
    }
}

Test(mirror, a_lost_ranks_copy_comes_from_its_buddy, .timeout = 60) {
    /* ranks 1 and 4 come back without memory: 1's copy is at 3, 4's at 0 */
    mirror_arg a = {{1, 4}, -1, -1, 1};
    rt_result res;
    expect_ok(6, &res, rt_run(3, 2, mirror_rank, &a, NULL, &res, 50000));
    cr_expect(strstr(res.msg[1], "ok step 10") && strstr(res.msg[1], "holder 3 view 0"), "%s",
              res.msg[1]);
    cr_expect(strstr(res.msg[4], "holder 0 view 0"), "%s", res.msg[4]);
}

Test(mirror, a_rank_lost_before_its_push_falls_back_to_the_checkpoint, .timeout = 60) {
    /* rank 1 was lost while it filled step 10: its buddy holds its step 5,
     * but rank 3, whose copies rank 1 held, has its own step 10 only: no step
     * is whole (the survivors keep one snapshot each), said with the rank */
    mirror_arg a = {{1, -1}, 1, -1, 0};
    rt_result res;
    rt_run(2, 2, mirror_rank, &a, NULL, &res, 50000);
    for (int r = 0; r < 4; r++)
        cr_expect(WIFEXITED(res.status[r]) && WEXITSTATUS(res.status[r]) == 10 + GPL_ERR_STATE &&
                      strstr(res.msg[r], "step 10 lacks rank(s) 1:"),
                  "rank %d: %s", r, res.msg[r]);
}

Test(mirror, a_rank_and_its_buddy_both_lost_is_a_state_error, .timeout = 60) {
    mirror_arg a = {{1, 3}, -1, -1, -1};
    rt_result res;
    rt_run(2, 2, mirror_rank, &a, NULL, &res, 50000);
    for (int r = 0; r < 4; r++) {
        cr_expect(WIFEXITED(res.status[r]) && WEXITSTATUS(res.status[r]) == 10 + GPL_ERR_STATE,
                  "rank %d: %s", r, res.msg[r]);
        cr_expect(strstr(res.msg[r], "step 10 lacks rank(s) 1, 3") &&
                      strstr(res.msg[r], "restore the newest checkpoint"),
                  "rank %d: %s", r, res.msg[r]);
    }
}

Test(mirror, a_copy_changed_after_its_push_is_refused_as_corrupt, .timeout = 60) {
    mirror_arg a = {{-1, -1}, -1, 0, 0};
    rt_result res;
    rt_run(2, 2, mirror_rank, &a, NULL, &res, 50000);
    /* rank 0 serves its own changed buffers: the fetch sees another SHA-256 */
    for (int r = 1; r < 4; r++)
        cr_expect(WIFEXITED(res.status[r]) && WEXITSTATUS(res.status[r]) == 30 + GPL_ERR_CORRUPT &&
                      strstr(res.msg[r], "does not match its SHA-256"),
                  "rank %d: %s", r, res.msg[r]);
}

Test(mirror, one_node_pairs_its_ranks_and_says_so, .timeout = 60) {
    mirror_arg a = {{2, -1}, -1, -1, -1};
    rt_result res;
    expect_ok(3, &res, rt_run(1, 3, mirror_rank, &a, NULL, &res, 50000));
    cr_expect(strstr(res.msg[0], "buddy 1 same_node 1"), "%s", res.msg[0]);
    cr_expect(strstr(res.msg[2], "holder 0 view 0"), "%s", res.msg[2]);
}

/* The bounds: buffers past GPL_MIRROR_MAX_BUFS, a buffer after the first
 * push, another options version; each refused with its message. */
static int bounds_rank(gpl_comm_t c, void *arg, char *msg, size_t len) {
    (void)arg;
    static uint8_t b[GPL_MIRROR_MAX_BUFS + 1];
    gpl_mirror_options o = GPL_MIRROR_OPTIONS_INIT;
    gpl_mirror_t m = NULL;
    o.version = 99;
    gpl_result_t v = gpl_mirror_create(c, &o, &m);
    int bad = v != GPL_ERR_INVALID_ARG || !strstr(gpl_last_error(c), "options version 99");
    if (gpl_mirror_create(c, NULL, &m) != GPL_OK)
        return 2;
    gpl_result_t rc = GPL_OK;
    int i = 0;
    for (; i <= GPL_MIRROR_MAX_BUFS && rc == GPL_OK; i++)
        rc = gpl_mirror_register(m, &b[i], 1);
    bad |= rc != GPL_ERR_LIMIT || i != GPL_MIRROR_MAX_BUFS + 1 ||
           !strstr(gpl_mirror_last_error(m), "GPL_MIRROR_MAX_BUFS");
    bad |= gpl_mirror_stage(m) != GPL_OK || gpl_mirror_push(m, 1) != GPL_OK;
    gpl_result_t late = gpl_mirror_register(m, b, 1);
    bad |= late != GPL_ERR_STATE || !strstr(gpl_mirror_last_error(m), "before the first push");
    snprintf(msg, len, "version %d, limit %d after %d, late %d: %s", (int)v, (int)rc, i, (int)late,
             gpl_mirror_last_error(m));
    gpl_mirror_destroy(m);
    return bad;
}

Test(mirror, its_limits_and_misuse_are_refused_with_their_reason, .timeout = 60) {
    rt_result res;
    expect_ok(1, &res, rt_run(1, 1, bounds_rank, NULL, NULL, &res, 50000));
}
