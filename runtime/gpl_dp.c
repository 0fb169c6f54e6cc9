/* Data-parallel gradient sync: gradients are packed into buckets (reverse
 * registration order, the first bucket smaller), and a bucket is averaged on
 * a communication thread as soon as it and every bucket before it are full,
 * while the caller's backward pass goes on. Buckets are always reduced in
 * the same order on every rank, whatever order gradients become ready in.
 * A bucket whose gradients tile one contiguous range of memory (a model that
 * keeps its gradients in one allocation) is reduced in place: no copy in, no
 * copy out (an element-wise reduction does not care about their order). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gb_progress.h"
#include "gb_thread.h"
#include "gpl_int.h"

typedef struct dp_grad {
    void *ptr;
    size_t count;
    gpl_dtype_t dtype;
    int bucket;
    size_t offset; /* bytes into the bucket */
    int ready;
    int on_device;
} dp_grad;

typedef struct dp_bucket {
    gpl_dtype_t dtype;
    size_t bytes, count;
    uint8_t *flat;
    int ngrads, nready;
    int on_device; /* the flat buffer lives on the GPU (NCCL path) */
    int in_place;  /* flat is the caller's memory: its gradients tile it */
} dp_bucket;

struct gpl_dp {
    gpl_comm_t comm;
    gpl_dp_options o;
    dp_grad *g;
    int ng, gcap;
    dp_bucket *b;
    int nb;
    int built;
    /* the communication thread */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int next_launch; /* first bucket not yet handed to the thread */
    int next_done;   /* buckets finished by the thread */
    int stop;
    int enqueued; /* device buckets handed to NCCL this step, not yet waited for */
    gpl_result_t rc;
};

static void *comm_thread(void *arg) {
    gpl_dp_t dp = arg;
    gb_thread_name("gpl-dp-comm");  /* the step waits on it: full priority */
    gpl_nccl_bind_thread(dp->comm); /* NCCL calls from here go to the comm's device */
    pthread_mutex_lock(&dp->mu);
    for (;;) {
        while (!dp->stop && dp->next_done >= dp->next_launch)
            pthread_cond_wait(&dp->cv, &dp->mu);
        if (dp->stop)
            break;
        int i = dp->next_done;
        pthread_mutex_unlock(&dp->mu);
        dp_bucket *b = &dp->b[i];
        gpl_result_t rc = GPL_OK;
        int enqueued = 0;
        /* a device bucket is only enqueued: gpl_dp_wait waits for them all at once */
        if (dp->rc == GPL_OK)
            rc = gpl_allreduce_deferred(dp->comm, b->flat, b->count, b->dtype, GPL_AVG, &enqueued);
        pthread_mutex_lock(&dp->mu);
        dp->enqueued |= enqueued;
        if (rc != GPL_OK && dp->rc == GPL_OK)
            dp->rc = rc;
        dp->next_done++;
        pthread_cond_broadcast(&dp->cv);
    }
    pthread_mutex_unlock(&dp->mu);
    return NULL;
}

gpl_result_t gpl_dp_create(gpl_comm_t comm, const gpl_dp_options *o, gpl_dp_t *out) {
    *out = NULL;
    gpl_dp_options def = GPL_DP_OPTIONS_INIT;
    if (o == NULL)
        o = &def;
    if (comm == NULL || o->version != GPL_DP_OPTIONS_VERSION || o->size < sizeof(gpl_dp_options))
        return GPL_ERR_INVALID_ARG;
    gpl_dp_t dp = calloc(1, sizeof *dp);
    if (dp == NULL)
        return GPL_ERR_NOMEM;
    dp->comm = comm;
    dp->o = *o;
    if (dp->o.bucket_cap_bytes == 0)
        dp->o.bucket_cap_bytes = def.bucket_cap_bytes;
    if (dp->o.first_bucket_bytes == 0)
        dp->o.first_bucket_bytes = def.first_bucket_bytes;
    pthread_mutex_init(&dp->mu, NULL);
    pthread_cond_init(&dp->cv, NULL);
    if (pthread_create(&dp->th, NULL, comm_thread, dp) != 0) {
        free(dp);
        return gb_seterr(&comm->err, GPL_ERR_SYSTEM, "cannot start the gradient-sync thread");
    }
    *out = dp;
    return GPL_OK;
}

gpl_result_t gpl_dp_register(gpl_dp_t dp, void *grad, size_t count, gpl_dtype_t dtype, int *index) {
    if (dp->built)
        return gb_seterr(&dp->comm->err, GPL_ERR_STATE,
                         "gpl_dp_register after the first step: register every gradient first");
    if ((unsigned)dtype >= GPL_DTYPE_COUNT || (count && grad == NULL))
        return gb_seterr(&dp->comm->err, GPL_ERR_INVALID_ARG, "gpl_dp_register: bad buffer");
    if (dp->ng == dp->gcap) {
        int cap = dp->gcap ? dp->gcap * 2 : 64;
        dp_grad *g = realloc(dp->g, (size_t)cap * sizeof *g);
        if (g == NULL)
            return GPL_ERR_NOMEM;
        dp->g = g;
        dp->gcap = cap;
    }
    dp->g[dp->ng] = (dp_grad){
        .ptr = grad, .count = count, .dtype = dtype, .on_device = gpl_nccl_is_device_ptr(grad)};
    if (index)
        *index = dp->ng;
    dp->ng++;
    return GPL_OK;
}

static int by_address(const void *a, const void *b) {
    const dp_grad *x = *(dp_grad *const *)a, *y = *(dp_grad *const *)b;
    return (uintptr_t)x->ptr < (uintptr_t)y->ptr ? -1 : (uintptr_t)x->ptr > (uintptr_t)y->ptr;
}

/* Whether bucket k's gradients, sorted by address, follow each other with no
 * gap and no overlap; if so the bucket is their range and each gradient's
 * offset is its place in it. */
static int tile_in_place(gpl_dp_t dp, int k) {
    dp_bucket *b = &dp->b[k];
    if (b->bytes == 0)
        return 0;
    dp_grad **v = malloc((size_t)b->ngrads * sizeof *v);
    if (v == NULL)
        return 0;
    int n = 0;
    for (int i = 0; i < dp->ng; i++)
        if (dp->g[i].bucket == k && dp->g[i].count)
            v[n++] = &dp->g[i];
    qsort(v, (size_t)n, sizeof *v, by_address);
    uint8_t *start = v[0]->ptr, *end = start;
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        ok = (uint8_t *)v[i]->ptr == end;
        end += v[i]->count * gpl_dtype_size(v[i]->dtype);
    }
    if (ok) {
        for (int i = 0; i < n; i++)
            v[i]->offset = (size_t)((uint8_t *)v[i]->ptr - start);
        b->flat = start;
        b->in_place = 1;
    }
    free(v);
    return ok;
}

static gpl_result_t build(gpl_dp_t dp) {
    dp->b = calloc((size_t)dp->ng + 1, sizeof *dp->b);
    if (dp->b == NULL)
        return GPL_ERR_NOMEM;
    int nb = -1;
    for (int i = dp->ng - 1; i >= 0; i--) {
        dp_grad *g = &dp->g[i];
        size_t bytes = g->count * gpl_dtype_size(g->dtype);
        size_t cap = nb <= 0 ? dp->o.first_bucket_bytes : dp->o.bucket_cap_bytes;
        if (nb < 0 || dp->b[nb].dtype != g->dtype || dp->b[nb].on_device != g->on_device ||
            (dp->b[nb].bytes > 0 && dp->b[nb].bytes + bytes > cap)) {
            dp->b[++nb].dtype = g->dtype;
            dp->b[nb].on_device = g->on_device;
        }
        g->bucket = nb;
        g->offset = dp->b[nb].bytes;
        dp->b[nb].bytes += bytes;
        dp->b[nb].count += g->count;
        dp->b[nb].ngrads++;
    }
    dp->nb = nb + 1;
    for (int i = 0; i < dp->nb; i++) {
        if (tile_in_place(dp, i))
            continue;
        size_t bytes = dp->b[i].bytes ? dp->b[i].bytes : 1;
        dp->b[i].flat = dp->b[i].on_device ? gpl_dev_alloc(bytes) : malloc(bytes);
        if (dp->b[i].flat == NULL)
            return gb_seterr(&dp->comm->err, GPL_ERR_NOMEM,
                             "cannot allocate a %zu-byte gradient bucket%s", bytes,
                             dp->b[i].on_device ? " on the GPU" : "");
    }
    dp->built = 1;
    return GPL_OK;
}

/* Hands every full bucket, in order, to the thread. Called with mu held. */
static void launch_ready(gpl_dp_t dp) {
    while (dp->next_launch < dp->nb &&
           dp->b[dp->next_launch].nready == dp->b[dp->next_launch].ngrads)
        dp->next_launch++;
    pthread_cond_broadcast(&dp->cv);
}

gpl_result_t gpl_dp_ready(gpl_dp_t dp, int index) {
    if (!dp->built) {
        gpl_result_t rc = build(dp);
        if (rc != GPL_OK)
            return rc;
    }
    if (index < 0 || index >= dp->ng)
        return gb_seterr(&dp->comm->err, GPL_ERR_INVALID_ARG, "gpl_dp_ready: no gradient #%d",
                         index);
    dp_grad *g = &dp->g[index];
    if (g->ready)
        return gb_seterr(&dp->comm->err, GPL_ERR_STATE,
                         "gradient #%d marked ready twice in one step", index);
    g->ready = 1;
    dp_bucket *b = &dp->b[g->bucket];
    size_t bytes = g->count * gpl_dtype_size(g->dtype);
    if (b->in_place) {
        /* reduced where it is */
    } else if (g->on_device) {
        if (gpl_dev_copy(b->flat + g->offset, g->ptr, bytes) != 0)
            return gb_seterr(&dp->comm->err, GPL_ERR_CUDA, "copying gradient #%d: CUDA error",
                             index);
    } else {
        memcpy(b->flat + g->offset, g->ptr, bytes);
    }
    pthread_mutex_lock(&dp->mu);
    b->nready++;
    launch_ready(dp);
    pthread_mutex_unlock(&dp->mu);
    return GPL_OK;
}

gpl_result_t gpl_dp_wait(gpl_dp_t dp) {
    if (!dp->built) {
        gpl_result_t rc = build(dp);
        if (rc != GPL_OK)
            return rc;
    }
    for (int i = 0; i < dp->ng; i++)
        if (!dp->g[i].ready)
            return gb_seterr(&dp->comm->err, GPL_ERR_STATE,
                             "gpl_dp_wait: gradient #%d (%zu elements) was never marked ready "
                             "this step; every rank must mark every gradient",
                             i, dp->g[i].count);
    /* Each bucket's gradients go back as soon as its all-reduce is done (on
     * the host) or enqueued (on the device: the copy follows it on the same
     * stream), while the thread reduces the next buckets. Device gradients
     * are copied on the device (a host memcpy of device memory would fault). */
    gpl_result_t rc = GPL_OK;
    for (int k = 0; k < dp->nb; k++) {
        pthread_mutex_lock(&dp->mu);
        while (dp->next_done <= k)
            pthread_cond_wait(&dp->cv, &dp->mu);
        rc = dp->rc;
        pthread_mutex_unlock(&dp->mu);
        if (rc != GPL_OK)
            break;
        if (dp->b[k].in_place)
            continue;
        for (int i = 0; i < dp->ng; i++) {
            dp_grad *g = &dp->g[i];
            if (g->bucket != k)
                continue;
            size_t bytes = g->count * gpl_dtype_size(g->dtype);
            const uint8_t *src = dp->b[k].flat + g->offset;
            if (!g->on_device)
                memcpy(g->ptr, src, bytes);
            else if (gpl_dev_copy(g->ptr, src, bytes) != 0)
                rc = gb_seterr(&dp->comm->err, GPL_ERR_CUDA,
                               "copying gradient #%d back from its bucket: CUDA error", i);
        }
    }
    pthread_mutex_lock(&dp->mu);
    while (dp->next_done < dp->nb)
        pthread_cond_wait(&dp->cv, &dp->mu);
    if (rc == GPL_OK)
        rc = dp->rc;
    int enqueued = dp->enqueued;
    dp->rc = GPL_OK;
    dp->enqueued = 0;
    dp->next_launch = dp->next_done = 0;
    pthread_mutex_unlock(&dp->mu);
    /* The device buckets and their copies back went to the GPU in order on one
     * stream; their end is waited for here, errors and deadline watched. */
    if (enqueued) {
        gb_progress_coll_begin();
        gpl_result_t src = gpl_nccl_wait(dp->comm, NULL, "gradient sync");
        gb_progress_coll_end();
        if (rc == GPL_OK)
            rc = src;
    }
    for (int i = 0; i < dp->ng; i++)
        dp->g[i].ready = 0;
    for (int i = 0; i < dp->nb; i++)
        dp->b[i].nready = 0;
    return rc;
}

void gpl_dp_destroy(gpl_dp_t dp) {
    if (dp == NULL)
        return;
    pthread_mutex_lock(&dp->mu);
    dp->stop = 1;
    pthread_cond_broadcast(&dp->cv);
    pthread_mutex_unlock(&dp->mu);
    pthread_join(dp->th, NULL);
    for (int i = 0; i < dp->nb; i++) {
        if (dp->b[i].in_place)
            continue;
        if (dp->b[i].on_device)
            gpl_dev_free(dp->b[i].flat);
        else
            free(dp->b[i].flat);
    }
    free(dp->b);
    free(dp->g);
    pthread_mutex_destroy(&dp->mu);
    pthread_cond_destroy(&dp->cv);
    free(dp);
}

gpl_result_t gpl_dp_info(gpl_dp_t dp, int *buckets, int *in_place) {
    if (dp == NULL)
        return GPL_ERR_INVALID_ARG;
    if (!dp->built) {
        gpl_result_t rc = build(dp);
        if (rc != GPL_OK)
            return rc;
    }
    int n = 0;
    for (int i = 0; i < dp->nb; i++)
        n += dp->b[i].in_place;
    if (buckets)
        *buckets = dp->nb;
    if (in_place)
        *in_place = n;
    return GPL_OK;
}
