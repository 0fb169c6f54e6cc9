/* The communicator: init from the launcher's environment, the rendezvous
 * attachment that tells a waiting rank the round is over, backend choice and
 * collective dispatch. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gb_progress.h"
#include "gb_time.h"
#include "gpl_int.h"

static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return def;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < -1 || x > 1 << 30)
        return -2;
    return (int)x;
}

gpl_result_t gpl_check_abort(gpl_comm_t c, uint64_t deadline_ms, const char *waiting_for) {
    gb_progress_wait_alive(); /* the watchdog: waiting, not stuck */
    if (c->rdzv) {
        rdzv_bclient_poll(c->rdzv, 0);
        const rdzv_push_state *p = rdzv_bclient_pushes(c->rdzv);
        /* The round's end is acted on at the second check that sees it: the
         * caller makes one more pass over its data in between, so a collective
         * whose last bytes arrived just before a finished peer left (its node's
         * launcher exits at once after a checkpoint) still completes. */
        if (p->round_over && c->round_over_seen_ms == 0)
            c->round_over_seen_ms = gb_now_ms();
        else if (p->round_over)
            return gb_seterr(&c->err, GPL_ERR_ROUND_OVER,
                             "rank %d: %s #%llu stopped: the rendezvous ended round %u: %s%s%s",
                             c->rank, c->coll, (unsigned long long)c->seq, p->round, p->message,
                             waiting_for && *waiting_for ? "; never reached it: " : "",
                             waiting_for ? waiting_for : "");
    }
    if (gb_now_ms() >= deadline_ms)
        return gb_seterr(&c->err, GPL_ERR_TIMEOUT,
                         "rank %d: %s #%llu timed out after %.0f s waiting for %s; raise "
                         "GPULAUNCH_TIMEOUT_MS if the step is that slow",
                         c->rank, c->coll, (unsigned long long)c->seq, c->timeout_ms / 1000.0,
                         waiting_for && *waiting_for ? waiting_for : "its peers");
    return GPL_OK;
}

gpl_result_t gpl_init(const gpl_options *o, gpl_comm_t *out) {
    *out = NULL;
    gpl_options def = GPL_OPTIONS_INIT;
    if (o == NULL)
        o = &def;
    if (o->size < offsetof(gpl_options, device) || o->version != GPL_OPTIONS_VERSION)
        return GPL_ERR_INVALID_ARG;
    gpl_comm_t c = calloc(1, sizeof *c);
    if (c == NULL)
        return GPL_ERR_NOMEM;
    *out = c;
    gpl_result_t rc = GPL_OK;
    /* joins the launcher's progress channel; waiting for the peers is a collective */
    gb_progress_attach();
    /* a worker started before its round waits for it here (a warm join) */
    rc = gpl_await_round(0, NULL);
    if (rc != GPL_OK)
        return gb_seterr(&c->err, rc,
                         "this worker was started before its round and did not get one (the "
                         "reason is above); it is started again once its node has a round");
    c->round_seq = gpl__first_round_seq();
    gb_progress_coll_begin();
    c->rank = o->rank >= 0 ? o->rank : env_int("RANK", 0);
    c->world = o->world_size >= 0 ? o->world_size : env_int("WORLD_SIZE", 1);
    /* GPULAUNCH_LOCAL_RANK: the true one under --virtual-local-rank (LOCAL_RANK=0) */
    c->local_rank = o->local_rank >= 0 ? o->local_rank
                                       : env_int("GPULAUNCH_LOCAL_RANK", env_int("LOCAL_RANK", 0));
    c->local_world =
        o->local_world_size >= 0 ? o->local_world_size : env_int("LOCAL_WORLD_SIZE", c->world);
    c->nnodes = env_int("GROUP_WORLD_SIZE", 1);
    c->node_rank = env_int("GROUP_RANK", 0);
    c->round = o->round >= 0 ? o->round : env_int("GPULAUNCH_ROUND", 0);
    if (c->rank < 0 || c->world < 1 || c->local_rank < 0 || c->local_world < 1 ||
        c->rank >= c->world || c->local_rank >= c->local_world || c->nnodes < 1 ||
        c->node_rank < 0 || c->round < 0) {
        rc = gb_seterr(&c->err, GPL_ERR_CONFIG,
                       "inconsistent launcher environment: RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d "
                       "LOCAL_WORLD_SIZE=%d GROUP_WORLD_SIZE=%d; start the program with "
                       "gpulaunch",
                       c->rank, c->world, c->local_rank, c->local_world, c->nnodes);
        goto out;
    }
    c->base_rank = c->rank - c->local_rank;
    int t = env_int("GPULAUNCH_TIMEOUT_MS", -1);
    c->timeout_ms = o->timeout_ms ? o->timeout_ms : t > 0 ? (uint32_t)t : GPL_DEFAULT_TIMEOUT_MS;
    c->small_bytes = o->small_bytes ? o->small_bytes : GPL_DEFAULT_SMALL_BYTES;
    if (c->small_bytes > GPL_SHM_SLOT_BYTES)
        c->small_bytes = GPL_SHM_SLOT_BYTES;
    int cb = env_int("GPULAUNCH_CHUNK_BYTES", -1);
    c->chunk_bytes = cb > 0 ? (size_t)cb : GPL_DEFAULT_CHUNK_BYTES;
    if (c->chunk_bytes > GPL_SHM_SLOT_BYTES / 2)
        c->chunk_bytes = GPL_SHM_SLOT_BYTES / 2;
    const char *hn = getenv("GPULAUNCH_HOSTNAME");
    if (hn)
        snprintf(c->hostname, sizeof c->hostname, "%s", hn);
    else
        gethostname(c->hostname, sizeof c->hostname);
    const char *run = o->run_id ? o->run_id : getenv("GPULAUNCH_RUN_ID");
    snprintf(c->run_id, sizeof c->run_id, "%s", run ? run : "local");
    c->coll = "init";

    gpl_backend_t be = o->backend;
    const char *eb = getenv("GPULAUNCH_BACKEND");
    if (be == GPL_BACKEND_AUTO && eb) {
        if (strcmp(eb, "cpu") == 0)
            be = GPL_BACKEND_CPU;
        else if (strcmp(eb, "nccl") == 0)
            be = GPL_BACKEND_NCCL;
        else if (strcmp(eb, "auto") != 0) {
            rc = gb_seterr(&c->err, GPL_ERR_CONFIG,
                           "GPULAUNCH_BACKEND='%s': expected auto, cpu or nccl", eb);
            goto out;
        }
    }
    if (be == GPL_BACKEND_AUTO)
        be = gpl_have_nccl() && gpl_cuda_device_count() > 0 ? GPL_BACKEND_NCCL : GPL_BACKEND_CPU;
    if (be == GPL_BACKEND_NCCL && !gpl_have_nccl()) {
        rc = gb_seterr(&c->err, GPL_ERR_UNSUPPORTED,
                       "the NCCL backend was asked for but this build has no CUDA/NCCL; "
                       "rebuild with -DGPULAUNCH_CUDA=ON or use GPULAUNCH_BACKEND=cpu");
        goto out;
    }
    c->backend = be;

    /* kept in a world of one too: a re-formation may make it bigger */
    const char *ep = o->rdzv_endpoint ? o->rdzv_endpoint : getenv("GPULAUNCH_RDZV_ENDPOINT");
    if (c->world > 1 || (ep && *ep)) {
        if (ep == NULL || *ep == '\0') {
            rc = gb_seterr(&c->err, GPL_ERR_CONFIG,
                           "rank %d of %d: GPULAUNCH_RDZV_ENDPOINT is not set; start the "
                           "program with gpulaunch",
                           c->rank, c->world);
            goto out;
        }
        snprintf(c->rdzv_ep, sizeof c->rdzv_ep, "%s", ep);
        const char *tok = o->token ? o->token : getenv("GPULAUNCH_RDZV_TOKEN");
        if (tok && (c->token = strdup(tok)) == NULL) {
            rc = GPL_ERR_NOMEM;
            goto out;
        }
    }
    c->device = o->device;
    rc = gpl_comm_connect(c);
out:
    gb_progress_coll_end();
    return rc;
}

/* Communicators of one round share its key-value scope: each takes the next
 * number of its process in that round, so the second of two (or one made
 * after another was finalized) never reads the first's shared-memory name or
 * ring address. Ranks create and re-form their communicators in the same
 * order (as with torch's process groups), so the numbers agree. */
static unsigned next_inst(int round) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static int last_round = -1;
    static unsigned n;
    pthread_mutex_lock(&mu);
    if (round != last_round) {
        last_round = round;
        n = 0;
    }
    unsigned v = ++n;
    pthread_mutex_unlock(&mu);
    return v;
}

gpl_result_t gpl_comm_connect(gpl_comm_t c) {
    gpl_result_t rc = GPL_OK;
    c->inst = next_inst(c->round);
    if (c->world > 1) {
        char host[256], err[512];
        int port;
        if (rdzv_parse_endpoint(c->rdzv_ep, RDZV_DEFAULT_PORT, host, sizeof host, &port) != GPL_OK)
            return gb_seterr(&c->err, GPL_ERR_CONFIG,
                             "GPULAUNCH_RDZV_ENDPOINT='%s' is not HOST:PORT", c->rdzv_ep);
        const char *tok = c->token;
        rc = rdzv_bclient_connect(host, port, tok, tok ? strlen(tok) : 0, 30000, &c->rdzv, err,
                                  sizeof err);
        if (rc != GPL_OK)
            return gb_seterr(&c->err, rc, "rank %d: %s", c->rank, err);
        rc = rdzv_bclient_attach(c->rdzv, c->run_id, (uint32_t)c->round);
        if (rc != GPL_OK)
            return gb_seterr(&c->err, rc, "rank %d: %s", c->rank, rdzv_bclient_error(c->rdzv));
        if (c->local_world > 1 && (rc = gpl_shm_setup(c)) != GPL_OK)
            return rc;
        if (c->local_world > 1 && c->nnodes == 1 && (rc = gpl_cma_setup(c)) != GPL_OK)
            return rc;
        if (c->nnodes > 1) {
            if (c->local_rank == 0 && (rc = gpl_ring_publish(c)) != GPL_OK)
                return rc;
            if ((rc = gpl_nodes_load(c)) != GPL_OK)
                return rc;
            if (c->local_rank == 0 && (rc = gpl_ring_setup(c)) != GPL_OK)
                return rc;
        }
    }
    if (c->backend == GPL_BACKEND_NCCL)
        rc = gpl_nccl_init(c, c->device);
    return rc;
}

void gpl_comm_disconnect(gpl_comm_t c, int abort) {
    if (abort)
        gpl_nccl_abort(c);
    else
        gpl_nccl_finalize(c);
    gpl_ring_teardown(c);
    gpl_shm_teardown(c);
    rdzv_bclient_close(c->rdzv);
    c->rdzv = NULL;
    free(c->node_base);
    free(c->node_size);
    free(c->node_host);
    free(c->cma_tmp);
    c->node_base = c->node_size = NULL;
    c->node_host = NULL;
    c->cma_tmp = NULL;
}

gpl_result_t gpl_init_external(int rank, int world, int local_rank, int local_world,
                               const gpl_external_ops *ops, gpl_comm_t *out) {
    *out = NULL;
    gpl_comm_t c = calloc(1, sizeof *c);
    if (c == NULL)
        return GPL_ERR_NOMEM;
    *out = c;
    if (ops == NULL || ops->version != GPL_EXTERNAL_OPS_VERSION ||
        ops->size < sizeof(gpl_external_ops))
        return gb_seterr(&c->err, GPL_ERR_INVALID_ARG,
                         "gpl_init_external: ops must start from GPL_EXTERNAL_OPS_INIT (version "
                         "%d, %zu bytes); got %s",
                         GPL_EXTERNAL_OPS_VERSION, sizeof(gpl_external_ops),
                         ops ? "another version or size" : "NULL");
    c->rank = rank;
    c->world = world;
    c->local_rank = local_rank;
    c->local_world = local_world;
    c->nnodes = 1;
    c->backend = GPL_BACKEND_EXTERNAL;
    c->ext = *ops;
    c->coll = "init";
    c->timeout_ms = GPL_DEFAULT_TIMEOUT_MS;
    snprintf(c->run_id, sizeof c->run_id, "external");
    gethostname(c->hostname, sizeof c->hostname);
    if (rank < 0 || world < 1 || rank >= world || local_rank < 0 || local_world < 1 ||
        local_rank >= local_world)
        return gb_seterr(&c->err, GPL_ERR_INVALID_ARG,
                         "gpl_init_external: rank %d of world %d (local %d of %d) is not a rank "
                         "of that world",
                         rank, world, local_rank, local_world);
    if (world > 1 && (ops->allreduce == NULL || ops->broadcast == NULL || ops->barrier == NULL))
        return gb_seterr(&c->err, GPL_ERR_INVALID_ARG,
                         "gpl_init_external: a world of %d needs allreduce, broadcast and "
                         "barrier in the ops",
                         world);
    c->base_rank = rank - local_rank;
    return GPL_OK;
}

/* A collective of the caller's framework failed: say which and what to look at. */
static gpl_result_t ext_failed(gpl_comm_t c) {
    return gb_seterr(&c->err, GPL_ERR_PEER_FAILED,
                     "rank %d: %s #%llu through the caller's collectives (the framework's "
                     "process group) failed; its own error says why",
                     c->rank, c->coll, (unsigned long long)c->seq);
}

/* The framework summed; divide by the world (half types through float32). */
static gpl_result_t ext_scale_avg(gpl_comm_t c, void *r, size_t count, gpl_dtype_t t) {
    if (t != GPL_FLOAT16 && t != GPL_BFLOAT16) {
        gpl_scale_avg(r, count, t, c->world);
        return GPL_OK;
    }
    float *w = malloc(count * sizeof *w);
    if (w == NULL)
        return gb_seterr(&c->err, GPL_ERR_NOMEM, "rank %d: out of memory averaging %zu elements",
                         c->rank, count);
    gpl_widen(w, r, count, t);
    gpl_scale_avg(w, count, GPL_FLOAT32, c->world);
    gpl_narrow(r, w, count, t);
    free(w);
    return GPL_OK;
}

void gpl_finalize(gpl_comm_t c) {
    if (c == NULL)
        return;
    gpl__ckpt_destroy(c); /* a save in flight is written first */
    gpl_comm_disconnect(c, 0);
    free(c->token);
    free(c);
}

int gpl_rank(gpl_comm_t c) { return c->rank; }
int gpl_world_size(gpl_comm_t c) { return c->world; }
int gpl_local_rank(gpl_comm_t c) { return c->local_rank; }
int gpl_local_world_size(gpl_comm_t c) { return c->local_world; }
gpl_backend_t gpl_backend(gpl_comm_t c) { return c->backend; }
const char *gpl_last_error(gpl_comm_t c) { return c ? gb_errmsg(&c->err) : "no communicator"; }

static gpl_result_t check_args(gpl_comm_t c, const char *what, const void *a, size_t count,
                               gpl_dtype_t t, int op) {
    if (c == NULL)
        return GPL_ERR_INVALID_ARG;
    gb_clearerr(&c->err);
    c->seq++;
    c->coll = what;
    if ((unsigned)t >= GPL_DTYPE_COUNT || (op >= 0 && (unsigned)op >= GPL_OP_COUNT) ||
        (count && a == NULL))
        return gb_seterr(&c->err, GPL_ERR_INVALID_ARG,
                         "%s #%llu: bad argument (dtype %d, op %d, count %zu, buffer %p)", what,
                         (unsigned long long)c->seq, (int)t, op, count, a);
    if (c->shm && atomic_load(&c->shm->abort_flag) == 2)
        return gb_seterr(&c->err, GPL_ERR_PEER_FAILED,
                         "%s #%llu: an earlier collective failed on node %s (%s); the round "
                         "must restart",
                         what, (unsigned long long)c->seq, c->hostname, c->shm->abort_msg);
    /* the launcher said the round ended (a world of one has no peer whose
     * loss would fail the collective; bigger ones learn it here first) */
    if (gb_progress_round_moved(c->round_seq))
        return gb_seterr(&c->err, GPL_ERR_ROUND_OVER,
                         "rank %d: %s #%llu not started: the launcher says round %d ended; "
                         "re-form (gpl_reform) or exit",
                         c->rank, what, (unsigned long long)c->seq, c->round);
    return GPL_OK;
}

/* enqueued == NULL: the call returns when the result is there; otherwise a
 * device buffer on NCCL is only enqueued (and *enqueued says so). */
static gpl_result_t allreduce(gpl_comm_t c, const void *s, void *r, size_t count, gpl_dtype_t t,
                              gpl_op_t op, void *stream, int *enqueued) {
    gpl_result_t rc = check_args(c, "allreduce", r, count, t, (int)op);
    if (rc != GPL_OK)
        return rc;
    if (count && s == NULL)
        return gb_seterr(&c->err, GPL_ERR_INVALID_ARG, "allreduce: NULL send buffer");
    if (c->backend == GPL_BACKEND_EXTERNAL) {
        if (s != r)
            memmove(r, s, count * gpl_dtype_size(t));
        if (c->world == 1 || count == 0)
            return GPL_OK;
        /* frameworks differ in AVG (Gloo has none): sum, then scale here */
        if (c->ext.allreduce(r, count, t, op == GPL_AVG ? GPL_SUM : op, c->ext.user) != 0)
            return ext_failed(c);
        if (op == GPL_AVG)
            return ext_scale_avg(c, r, count, t);
        return GPL_OK;
    }
    if (c->backend != GPL_BACKEND_NCCL || !gpl_nccl_is_device_ptr(r))
        return gpl_cpu_allreduce(c, s, r, count, t, op);
    rc = gpl_nccl_allreduce_enqueue(c, s, r, count, t, op, stream);
    if (rc != GPL_OK)
        return rc;
    if (enqueued) {
        *enqueued = 1;
        return GPL_OK;
    }
    return gpl_nccl_wait(c, stream, "allreduce");
}

/* Every public collective is timed for the progress channel: the time a rank
 * spends in collectives is mostly waiting for the last rank to arrive, which
 * names the straggler (the one the others wait for), and a rank blocked in a
 * collective is a hang's victim, not its cause. */
gpl_result_t gpl_allreduce(gpl_comm_t c, const void *s, void *r, size_t count, gpl_dtype_t t,
                           gpl_op_t op, void *stream) {
    gb_progress_coll_begin();
    gpl_result_t rc = allreduce(c, s, r, count, t, op, stream, NULL);
    gb_progress_coll_end();
    return rc;
}

gpl_result_t gpl_allreduce_deferred(gpl_comm_t c, void *buf, size_t count, gpl_dtype_t t,
                                    gpl_op_t op, int *enqueued) {
    *enqueued = 0;
    gb_progress_coll_begin();
    gpl_result_t rc = allreduce(c, buf, buf, count, t, op, NULL, enqueued);
    gb_progress_coll_end();
    return rc;
}

static gpl_result_t broadcast_impl(gpl_comm_t c, void *buf, size_t count, gpl_dtype_t t, int root,
                                   void *stream) {
    gpl_result_t rc = check_args(c, "broadcast", buf, count, t, -1);
    if (rc != GPL_OK)
        return rc;
    if (root < 0 || root >= c->world)
        return gb_seterr(&c->err, GPL_ERR_INVALID_ARG, "broadcast: root %d is not a rank (0..%d)",
                         root, c->world - 1);
    if (c->backend == GPL_BACKEND_EXTERNAL)
        return c->world == 1 || count == 0 ||
                       c->ext.broadcast(buf, count, t, root, c->ext.user) == 0
                   ? GPL_OK
                   : ext_failed(c);
    if (c->backend == GPL_BACKEND_NCCL && gpl_nccl_is_device_ptr(buf))
        return gpl_nccl_broadcast(c, buf, count, t, root, stream);
    return gpl_cpu_broadcast(c, buf, count, t, root);
}

static gpl_result_t allgather_impl(gpl_comm_t c, const void *s, void *r, size_t count,
                                   gpl_dtype_t t, void *stream) {
    gpl_result_t rc = check_args(c, "allgather", r, count, t, -1);
    if (rc != GPL_OK)
        return rc;
    if (c->backend == GPL_BACKEND_EXTERNAL && c->world > 1)
        return gb_seterr(&c->err, GPL_ERR_UNSUPPORTED,
                         "allgather is not among the caller's collectives "
                         "(gpl_init_external); use the framework's own");
    if (c->backend == GPL_BACKEND_EXTERNAL) { /* a world of one */
        if (count && s != r)
            memmove(r, s, count * gpl_dtype_size(t));
        return GPL_OK;
    }
    if (c->backend == GPL_BACKEND_NCCL && gpl_nccl_is_device_ptr(r))
        return gpl_nccl_allgather(c, s, r, count, t, stream);
    return gpl_cpu_allgather(c, s, r, count, t);
}

static gpl_result_t barrier_impl(gpl_comm_t c) {
    gpl_result_t rc = check_args(c, "barrier", NULL, 0, GPL_INT32, -1);
    if (rc != GPL_OK)
        return rc;
    if (c->backend == GPL_BACKEND_EXTERNAL)
        return c->world == 1 || c->ext.barrier(c->ext.user) == 0 ? GPL_OK : ext_failed(c);
    return gpl_cpu_barrier(c);
}

gpl_result_t gpl_broadcast(gpl_comm_t c, void *buf, size_t count, gpl_dtype_t t, int root,
                           void *stream) {
    gb_progress_coll_begin();
    gpl_result_t rc = broadcast_impl(c, buf, count, t, root, stream);
    gb_progress_coll_end();
    return rc;
}

gpl_result_t gpl_allgather(gpl_comm_t c, const void *s, void *r, size_t count, gpl_dtype_t t,
                           void *stream) {
    gb_progress_coll_begin();
    gpl_result_t rc = allgather_impl(c, s, r, count, t, stream);
    gb_progress_coll_end();
    return rc;
}

gpl_result_t gpl_barrier(gpl_comm_t c) {
    gb_progress_coll_begin();
    gpl_result_t rc = barrier_impl(c);
    gb_progress_coll_end();
    return rc;
}

void gpl_progress(int64_t step) { gb_progress_step(step); }

void gpl_progress_stack_signal(int sig) { gb_progress_set_stack_signal(sig); }

void gpl_progress_wait_begin(void) { gb_progress_coll_begin(); }

void gpl_progress_wait_end(void) { gb_progress_coll_end(); }
