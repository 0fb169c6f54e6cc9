/* The launcher's side of the progress channel (see gl_progress.h). It owns
 * the region, the pipes and their readers, and the summaries' window; who
 * holds each slot it learns at gl_progress_started, and whether and where a
 * summary goes it asks its owner through the callbacks it was given. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gb_log.h"
#include "gb_time.h"
#include "gl_progress.h"

#define GB_COMPONENT "launcher"

typedef struct slot_holder {
    int rank;
    char gpu[64];
} slot_holder;

typedef struct reader {
    uv_pipe_t pipe;
    int local_rank;
    char line[GL_PROGRESS_LINE_MAX];
    size_t len;
    int bad; /* said once that its lines are malformed */
} reader;

static struct {
    int fd; /* the memfd */
    uint32_t nslots;
    gb_progress_header *hdr;
    gb_progress_slot *slots;
    gb_progress_round *round; /* the round block, after the slots */
    uint32_t go_on;           /* written into every round's block (gl_progress_set_go_on) */
    int *pipe_r, *pipe_w;
    reader **rd;
    /* the summaries */
    slot_holder *holder; /* per slot: the worker of this round */
    uv_timer_t stats_timer;
    int stats_on;
    gl_progress_active_cb active;
    gl_progress_send_cb send;
    void *data;
    uint64_t win_start_ns;
    uint64_t *prev_steps, *prev_step_ns, *prev_coll_ns;
    gl_state_report *state; /* per slot: the worker's last "state ..." line */
} P = {.fd = -1};

static void on_reader_closed(uv_handle_t *h) { free(h->data); }

static void close_readers(void) {
    for (uint32_t i = 0; P.rd && i < P.nslots; i++) {
        if (P.rd[i]) { /* the handle owns the read end */
            uv_close((uv_handle_t *)&P.rd[i]->pipe, on_reader_closed);
            P.rd[i] = NULL;
            P.pipe_r[i] = -1;
        }
        if (P.pipe_r[i] >= 0)
            close(P.pipe_r[i]);
        if (P.pipe_w[i] >= 0)
            close(P.pipe_w[i]);
        P.pipe_r[i] = P.pipe_w[i] = -1;
    }
}

int gl_progress_round(int nproc) {
    if (P.fd < 0) {
        if (nproc < 1 || nproc > GB_PROGRESS_MAX_SLOTS) {
            fprintf(stderr,
                    "gpulaunch: %d workers on this node: the progress channel takes at most %d; "
                    "the job runs without the hang watchdog and straggler summaries\n",
                    nproc, GB_PROGRESS_MAX_SLOTS);
            return -1;
        }
        size_t bytes = gb_progress_region_bytes_v2((uint32_t)nproc);
        int fd = memfd_create("gpulaunch-progress", MFD_CLOEXEC);
        void *p = MAP_FAILED;
        if (fd >= 0 && ftruncate(fd, (off_t)bytes) == 0)
            p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            fprintf(stderr,
                    "gpulaunch: cannot make the progress channel (%s): the job runs without "
                    "the hang watchdog and straggler summaries\n",
                    strerror(errno));
            if (fd >= 0)
                close(fd);
            return -1;
        }
        P.fd = fd;
        P.nslots = (uint32_t)nproc;
        P.hdr = p;
        P.slots = (gb_progress_slot *)((char *)p + GB_PROGRESS_SLOT_BYTES);
        P.round = (gb_progress_round *)((char *)p + gb_progress_region_bytes((uint32_t)nproc));
        P.pipe_r = malloc((size_t)nproc * sizeof *P.pipe_r);
        P.pipe_w = malloc((size_t)nproc * sizeof *P.pipe_w);
        P.rd = calloc((size_t)nproc, sizeof *P.rd);
        P.holder = calloc((size_t)nproc, sizeof *P.holder);
        P.prev_steps = calloc((size_t)nproc, sizeof *P.prev_steps);
        P.prev_step_ns = calloc((size_t)nproc, sizeof *P.prev_step_ns);
        P.prev_coll_ns = calloc((size_t)nproc, sizeof *P.prev_coll_ns);
        P.state = calloc((size_t)nproc, sizeof *P.state);
        for (int i = 0; i < nproc; i++)
            P.pipe_r[i] = P.pipe_w[i] = -1;
    }
    close_readers();
    /* a new round: every slot starts empty (the last round's workers are gone) */
    memset(P.hdr, 0, gb_progress_region_bytes_v2(P.nslots));
    P.hdr->magic = GB_PROGRESS_MAGIC;
    P.hdr->version = GB_PROGRESS_VERSION;
    P.hdr->nslots = P.nslots;
    P.hdr->slot_bytes = GB_PROGRESS_SLOT_BYTES;
    P.hdr->round_off = (uint32_t)gb_progress_region_bytes(P.nslots);
    P.round->go_on = P.go_on;
    memset(P.prev_steps, 0, P.nslots * sizeof *P.prev_steps);
    memset(P.prev_step_ns, 0, P.nslots * sizeof *P.prev_step_ns);
    memset(P.prev_coll_ns, 0, P.nslots * sizeof *P.prev_coll_ns);
    if (P.state)
        memset(P.state, 0, P.nslots * sizeof *P.state);
    P.win_start_ns = gb_now_ns();
    for (uint32_t i = 0; i < P.nslots; i++) {
        int fds[2];
        if (pipe2(fds, O_CLOEXEC) == 0) {
            P.pipe_r[i] = fds[0];
            P.pipe_w[i] = fds[1];
        }
    }
    return 0;
}

void gl_progress_child(int local_rank) {
    if (P.fd < 0 || (uint32_t)local_rank >= P.nslots)
        return;
    fcntl(P.fd, F_SETFD, 0);
    if (P.pipe_w[local_rank] >= 0)
        fcntl(P.pipe_w[local_rank], F_SETFD, 0);
}

int gl_progress_env(int local_rank, char **env, int n, int max) {
    if (P.fd < 0 || (uint32_t)local_rank >= P.nslots)
        return n;
    char kv[64];
    if (n < max) {
        snprintf(kv, sizeof kv, "GPULAUNCH_PROGRESS_SHM=%d:%d", P.fd, local_rank);
        env[n++] = strdup(kv);
    }
    if (n < max && P.pipe_w[local_rank] >= 0) {
        snprintf(kv, sizeof kv, "GPULAUNCH_PROGRESS_FD=%d", P.pipe_w[local_rank]);
        env[n++] = strdup(kv);
    }
    if (n < max) {
        snprintf(kv, sizeof kv, "GPULAUNCH_STACK_SIGNAL=%d", GL_STACK_SIGNAL);
        env[n++] = strdup(kv);
    }
    return n;
}

gb_progress_slot *gl_progress_slot(int local_rank) {
    return P.fd >= 0 && (uint32_t)local_rank < P.nslots ? &P.slots[local_rank] : NULL;
}

uint64_t gl_progress_waiting_since(int local_rank, uint64_t now_ns) {
    gb_progress_slot *s = gl_progress_slot(local_rank);
    uint64_t since = s ? atomic_load(&s->coll_since_ns) : 0;
    if (since == 0 || since > now_ns)
        return 0;
    uint64_t alive = atomic_load(&s->wait_ns);
    if (alive >= since && now_ns > alive && now_ns - alive > (uint64_t)GL_WAIT_ALIVE_MS * 1000000)
        return 0;
    return since;
}

/* ---- line reports: "STEP\n" on the pipe ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    static char chunk[4096];
    buf->base = chunk;
    buf->len = sizeof chunk;
}

/* "state peer|checkpoint STEP BYTES MS ROOT": where the worker's state came
 * from (1), or not such a line (0); malformed: -1. */
static int state_report(reader *r) {
    if (strncmp(r->line, "state ", 6) != 0)
        return 0;
    char src[16];
    long long step, bytes, ms;
    int root;
    if (sscanf(r->line + 6, "%15s %lld %lld %lld %d", src, &step, &bytes, &ms, &root) != 5 ||
        bytes < 0 || ms < 0 || (strcmp(src, "peer") && strcmp(src, "checkpoint")))
        return -1;
    if (P.state == NULL)
        return 1;
    gl_state_report *st = &P.state[r->local_rank];
    st->source = strcmp(src, "peer") == 0 ? GL_STATE_PEER : GL_STATE_CHECKPOINT;
    st->step = step;
    st->bytes = (uint64_t)bytes;
    st->ms = ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
    st->root = root;
    st->at_ns = gb_now_ns();
    return 1;
}

static void line_report(reader *r) {
    r->line[r->len] = '\0';
    int st = state_report(r);
    if (st > 0)
        return;
    char *end;
    errno = 0;
    long long step = strtoll(r->line, &end, 10);
    while (*end == ' ' || *end == '\t' || *end == '\r')
        end++;
    if (st < 0 || errno || end == r->line || *end) {
        if (!r->bad)
            fprintf(stderr,
                    "gpulaunch: local rank %d wrote '%.32s' to GPULAUNCH_PROGRESS_FD: expected "
                    "one step number per line (e.g. echo $STEP >&$GPULAUNCH_PROGRESS_FD) or "
                    "'state peer|checkpoint STEP BYTES MS ROOT'; ignored\n",
                    r->local_rank, r->line);
        r->bad = 1;
        return;
    }
    gb_progress_slot *s = &P.slots[r->local_rank];
    uint64_t now = gb_now_ns();
    if (atomic_load(&s->joined_ns) == 0)
        atomic_store(&s->joined_ns, now);
    atomic_store(&s->step, (int64_t)step);
    atomic_store(&s->steps, atomic_load(&s->steps) + 1);
    atomic_store(&s->step_ns, now);
    atomic_store(&s->beat_ns, now);
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
    reader *r = st->data;
    if (n < 0) {
        uv_close((uv_handle_t *)st, on_reader_closed);
        if (P.rd && (uint32_t)r->local_rank < P.nslots && P.rd[r->local_rank] == r) {
            P.rd[r->local_rank] = NULL;
            P.pipe_r[r->local_rank] = -1; /* closed with the handle */
        }
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        char ch = buf->base[i];
        if (ch == '\n') {
            line_report(r);
            r->len = 0;
        } else if (r->len < sizeof r->line - 1) {
            r->line[r->len++] = ch;
        }
    }
}

void gl_progress_holder(int local_rank, int rank, const char *gpu) {
    if (P.fd < 0 || (uint32_t)local_rank >= P.nslots || P.holder == NULL)
        return;
    P.holder[local_rank].rank = rank;
    snprintf(P.holder[local_rank].gpu, sizeof P.holder[local_rank].gpu, "%s", gpu);
}

void gl_progress_started(uv_loop_t *loop, int local_rank) {
    if (P.fd < 0 || (uint32_t)local_rank >= P.nslots)
        return;
    if (P.pipe_w[local_rank] >= 0) {
        close(P.pipe_w[local_rank]);
        P.pipe_w[local_rank] = -1;
    }
    if (P.pipe_r[local_rank] < 0)
        return;
    reader *r = calloc(1, sizeof *r);
    if (r == NULL)
        return;
    r->local_rank = local_rank;
    r->pipe.data = r;
    uv_pipe_init(loop, &r->pipe, 0);
    if (uv_pipe_open(&r->pipe, P.pipe_r[local_rank]) != 0 ||
        uv_read_start((uv_stream_t *)&r->pipe, on_alloc, on_read) != 0) {
        uv_close((uv_handle_t *)&r->pipe, on_reader_closed);
        P.pipe_r[local_rank] = -1;
        return;
    }
    P.rd[local_rank] = r;
}

void gl_progress_held(int *regions, long long *bytes, int *pipes) {
    *regions = P.fd >= 0;
    *bytes = P.fd >= 0 ? (long long)gb_progress_region_bytes_v2(P.nslots) : 0;
    *pipes = 0;
    for (uint32_t i = 0; P.fd >= 0 && i < P.nslots; i++)
        *pipes += (P.pipe_r[i] >= 0) + (P.pipe_w[i] >= 0);
}

/* ---- live re-formation: the round block ---- */

int gl_progress_reform_ok(int nproc) {
    if (P.fd < 0 || (uint32_t)nproc > P.nslots)
        return 0;
    for (int i = 0; i < nproc; i++)
        if (atomic_load_explicit(&P.slots[i].reform_ok, memory_order_acquire) != 1)
            return 0;
    return 1;
}

int gl_progress_acked(int nproc, uint32_t round) {
    int n = 0;
    for (int i = 0; P.fd >= 0 && i < nproc && (uint32_t)i < P.nslots; i++)
        n += atomic_load_explicit(&P.slots[i].round_ack, memory_order_acquire) == round;
    return n;
}

void gl_progress_set_go_on(int on) {
    P.go_on = on ? 1 : 0;
    if (P.fd >= 0)
        P.round->go_on = P.go_on;
}

void gl_progress_publish(enum gb_round_state state, const rdzv_assignment *a, const char *ifname,
                         int restarts, const char *why) {
    if (P.fd < 0)
        return;
    gb_progress_round *b = P.round;
    if (a) {
        b->round = a->round;
        b->node_rank = a->node_rank;
        b->nnodes = a->nnodes;
        b->base_rank = a->base_rank;
        b->world_size = a->world_size;
        b->master_port = a->master_port;
        snprintf(b->master_addr, sizeof b->master_addr, "%s", a->master_addr);
        snprintf(b->nccl_ifname, sizeof b->nccl_ifname, "%s", ifname ? ifname : "");
    }
    b->restarts = (uint32_t)restarts;
    snprintf(b->why, sizeof b->why, "%s", why ? why : "");
    atomic_store_explicit(&b->state, (uint32_t)state, memory_order_relaxed);
    atomic_fetch_add_explicit(&b->seq, 1, memory_order_release);
    syscall(SYS_futex, (uint32_t *)&b->seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* ---- the summaries ---- */

static void on_stats_timer(uv_timer_t *t) {
    if (P.fd < 0 || P.holder == NULL || !P.active(P.data))
        return;
    uint64_t now = gb_now_ns();
    rdzv_rank_stats *rs = calloc(P.nslots, sizeof *rs);
    if (rs == NULL)
        return;
    uint32_t n = 0;
    for (uint32_t i = 0; i < P.nslots; i++) {
        gb_progress_slot *s = &P.slots[i];
        if (atomic_load(&s->joined_ns) == 0)
            continue;
        rdzv_rank_stats *r = &rs[n++];
        uint64_t steps = atomic_load(&s->steps), step_ns = atomic_load(&s->step_ns);
        uint64_t coll_ns = atomic_load(&s->coll_ns), beat = atomic_load(&s->beat_ns);
        r->rank = (uint32_t)P.holder[i].rank;
        r->local_rank = i;
        r->step = (uint64_t)atomic_load(&s->step);
        r->wait_us = UINT32_MAX;
        uint64_t ds = steps - P.prev_steps[i];
        /* the first report of a window starts its first step interval */
        if (ds > 0 && P.prev_steps[i] > 0 && step_ns > P.prev_step_ns[i]) {
            r->steps = (uint32_t)ds;
            uint64_t st = (step_ns - P.prev_step_ns[i]) / ds / 1000;
            r->step_time_us = st > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)st;
            if (atomic_load(&s->colls) > 0) {
                uint64_t w = (coll_ns - P.prev_coll_ns[i]) / ds / 1000;
                r->wait_us = w > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)w;
            }
        }
        if (ds > 0) {
            P.prev_steps[i] = steps;
            P.prev_step_ns[i] = step_ns;
            P.prev_coll_ns[i] = coll_ns;
        }
        r->since_progress_ms = now > beat ? (uint32_t)((now - beat) / 1000000) : 0;
        snprintf(r->gpu, sizeof r->gpu, "%s", P.holder[i].gpu);
        /* its checkpoints, as its runtime last reported them (steps + 1 in the slot) */
        int64_t l1 = atomic_load(&s->ckpt_local1), d1 = atomic_load(&s->ckpt_durable1);
        uint64_t stall_us = atomic_load(&s->ckpt_stall_us);
        uint64_t stall_ms = stall_us / 1000 + (stall_us % 1000 >= 500);
        r->ckpt_local_step = l1 > 0 ? l1 - 1 : -1;
        r->ckpt_durable_step = d1 > 0 ? d1 - 1 : -1;
        r->ckpt_stall_ms = stall_ms > UINT32_MAX ? UINT32_MAX : (uint32_t)stall_ms;
        r->ckpt_drain_left = atomic_load(&s->ckpt_drain_left);
    }
    uint32_t window_ms = (uint32_t)((now - P.win_start_ns) / 1000000);
    P.win_start_ns = now;
    if (n)
        P.send(P.data, window_ms, rs, n);
    free(rs);
}

void gl_progress_start_stats(uv_loop_t *loop, double interval_s, gl_progress_active_cb active,
                             gl_progress_send_cb send, void *data) {
    if (P.stats_on || !(interval_s > 0))
        return;
    P.stats_on = 1;
    P.active = active;
    P.send = send;
    P.data = data;
    uv_timer_init(loop, &P.stats_timer);
    uint64_t ms = (uint64_t)(interval_s * 1000);
    uv_timer_start(&P.stats_timer, on_stats_timer, ms, ms);
}

int gl_progress_state(int local_rank, gl_state_report *out) {
    if (P.state == NULL || (uint32_t)local_rank >= P.nslots || P.state[local_rank].at_ns == 0)
        return -1;
    *out = P.state[local_rank];
    return 0;
}
