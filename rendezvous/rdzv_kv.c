/* A job's key-value store (rdzv_kv.h): an open hash table bounded by bytes,
 * the semantics of each request, and the waiters of KV_WAIT. */
#include "rdzv_kv.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rdzv_kv_entry {
    rdzv_kv_entry *next;
    uint32_t hash, klen, vlen;
    uint8_t data[]; /* key, then value */
};

static uint32_t hash_bytes(const uint8_t *p, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

void rdzv_kv_init(rdzv_kv *kv, uint64_t max_bytes) {
    memset(kv, 0, sizeof *kv);
    kv->max_bytes = max_bytes;
    LIST_INIT(&kv->waiters);
}

static rdzv_kv_entry **kv_slot(const rdzv_kv *kv, const rdzv_bytes *k, uint32_t h) {
    if (kv->buckets == 0)
        return NULL;
    rdzv_kv_entry **e = &kv->b[h & (kv->buckets - 1)];
    while (*e &&
           !((*e)->hash == h && (*e)->klen == k->len && memcmp((*e)->data, k->p, k->len) == 0))
        e = &(*e)->next;
    return e;
}

static rdzv_kv_entry *kv_find(const rdzv_kv *kv, const rdzv_bytes *k) {
    rdzv_kv_entry **e = kv_slot(kv, k, hash_bytes(k->p, k->len));
    return e ? *e : NULL;
}

void rdzv_kv_clear(rdzv_kv *kv) {
    for (uint32_t i = 0; i < kv->buckets; i++) {
        rdzv_kv_entry *e = kv->b[i];
        while (e) {
            rdzv_kv_entry *n = e->next;
            free(e);
            e = n;
        }
    }
    free(kv->b);
    kv->b = NULL;
    kv->buckets = kv->count = 0;
    kv->bytes = 0;
}

static gpl_result_t kv_grow(rdzv_kv *kv) {
    uint32_t nb = kv->buckets ? kv->buckets * 2 : 64;
    rdzv_kv_entry **t = calloc(nb, sizeof *t);
    if (t == NULL)
        return GPL_ERR_NOMEM;
    for (uint32_t i = 0; i < kv->buckets; i++) {
        rdzv_kv_entry *e = kv->b[i];
        while (e) {
            rdzv_kv_entry *n = e->next;
            e->next = t[e->hash & (nb - 1)];
            t[e->hash & (nb - 1)] = e;
            e = n;
        }
    }
    free(kv->b);
    kv->b = t;
    kv->buckets = nb;
    return GPL_OK;
}

/* Sets key to value, replacing any old value. */
static gpl_result_t kv_put(rdzv_kv *kv, const rdzv_bytes *k, const void *v, uint32_t vlen) {
    uint32_t h = hash_bytes(k->p, k->len);
    rdzv_kv_entry **slot = kv_slot(kv, k, h);
    uint64_t old = (slot && *slot) ? (uint64_t)(*slot)->klen + (*slot)->vlen : 0;
    uint64_t add = (uint64_t)k->len + vlen;
    if (kv->bytes - old + add > kv->max_bytes)
        return GPL_ERR_LIMIT;
    if (!(slot && *slot) && kv->count + 1 > kv->buckets) {
        if (kv_grow(kv) != GPL_OK)
            return GPL_ERR_NOMEM;
        slot = kv_slot(kv, k, h);
    }
    rdzv_kv_entry *e = malloc(sizeof *e + k->len + vlen);
    if (e == NULL)
        return GPL_ERR_NOMEM;
    e->hash = h;
    e->klen = k->len;
    e->vlen = vlen;
    memcpy(e->data, k->p, k->len);
    if (vlen)
        memcpy(e->data + k->len, v, vlen);
    if (*slot) {
        e->next = (*slot)->next;
        free(*slot);
    } else {
        e->next = NULL;
        kv->count++;
    }
    *slot = e;
    kv->bytes = kv->bytes - old + add;
    return GPL_OK;
}

static void kv_del(rdzv_kv *kv, const rdzv_bytes *k) {
    rdzv_kv_entry **slot = kv_slot(kv, k, hash_bytes(k->p, k->len));
    if (slot == NULL || *slot == NULL)
        return;
    rdzv_kv_entry *e = *slot;
    *slot = e->next;
    kv->bytes -= (uint64_t)e->klen + e->vlen;
    kv->count--;
    free(e);
}

static void reply_error(rdzv_msg *r, gpl_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void reply_error(rdzv_msg *r, gpl_result_t code, const char *fmt, ...) {
    r->type = RDZV_ERROR;
    r->u.error.code = (uint32_t)code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->u.error.message, sizeof r->u.error.message, fmt, ap);
    va_end(ap);
}

/* KV_ADD: the key's decimal value (0 when unset) plus delta. */
static int kv_add(rdzv_kv *kv, const char *run_id, const rdzv_msg *msg, rdzv_msg *r) {
    rdzv_kv_entry *e = kv_find(kv, &msg->u.kv_add.key);
    int64_t v = 0;
    if (e) {
        char tmp[32];
        if (e->vlen == 0 || e->vlen >= sizeof tmp) {
            reply_error(r, GPL_ERR_INVALID_ARG, "key holds %u bytes, not a decimal integer",
                        e->vlen);
            return 0;
        }
        memcpy(tmp, e->data + e->klen, e->vlen);
        tmp[e->vlen] = '\0';
        char *end;
        errno = 0;
        v = strtoll(tmp, &end, 10);
        if (errno || *end) {
            reply_error(r, GPL_ERR_INVALID_ARG, "key holds '%s', not a decimal integer", tmp);
            return 0;
        }
    }
    v = (int64_t)((uint64_t)v + (uint64_t)msg->u.kv_add.delta);
    char out[32];
    int n = snprintf(out, sizeof out, "%lld", (long long)v);
    gpl_result_t rc = kv_put(kv, &msg->u.kv_add.key, out, (uint32_t)n);
    if (rc != GPL_OK) {
        reply_error(r, rc, "job %s key-value store is full", run_id);
        return 0;
    }
    r->type = RDZV_INT;
    r->u.int_.value = v;
    r->u.int_.ok = 1;
    return 1;
}

static int kv_cas(rdzv_kv *kv, const char *run_id, const rdzv_msg *msg, rdzv_msg *r) {
    rdzv_kv_entry *e = kv_find(kv, &msg->u.kv_cas.key);
    int match = msg->u.kv_cas.expect_absent
                    ? e == NULL
                    : (e && e->vlen == msg->u.kv_cas.expected.len &&
                       memcmp(e->data + e->klen, msg->u.kv_cas.expected.p, e->vlen) == 0);
    r->type = RDZV_INT;
    if (!match)
        return 0;
    gpl_result_t rc =
        kv_put(kv, &msg->u.kv_cas.key, msg->u.kv_cas.desired.p, msg->u.kv_cas.desired.len);
    if (rc != GPL_OK) {
        reply_error(r, rc, "job %s key-value store is full", run_id);
        return 0;
    }
    r->u.int_.ok = 1;
    return 1;
}

static void kv_mget(rdzv_kv *kv, const rdzv_msg *msg, rdzv_msg *r, rdzv_buf *items) {
    items->len = 0;
    rdzv_bytes walk = msg->u.kv_keys.keys, k;
    while (rdzv_list_next(&walk, &k)) {
        rdzv_kv_entry *e = kv_find(kv, &k);
        gpl_result_t rc = e ? rdzv_values_add(items, 1, e->data + e->klen, e->vlen)
                            : rdzv_values_add(items, 0, NULL, 0);
        if (rc != GPL_OK) {
            reply_error(r, GPL_ERR_LIMIT,
                        "the values of these %u keys exceed one %u-byte reply; ask for fewer",
                        msg->u.kv_keys.nkeys, (unsigned)RDZV_MAX_FRAME);
            return;
        }
    }
    r->type = RDZV_VALUES;
    r->u.values.count = msg->u.kv_keys.nkeys;
    r->u.values.items = (rdzv_bytes){items->data, (uint32_t)items->len};
}

int rdzv_kv_request(rdzv_kv *kv, const char *run_id, const rdzv_msg *msg, rdzv_msg *r,
                    rdzv_buf *scratch) {
    memset(r, 0, sizeof *r);
    r->req_id = msg->req_id;
    r->type = RDZV_OK;
    switch (msg->type) {
    case RDZV_KV_SET: {
        gpl_result_t rc =
            kv_put(kv, &msg->u.kv_set.key, msg->u.kv_set.value.p, msg->u.kv_set.value.len);
        if (rc != GPL_OK) {
            reply_error(r, rc,
                        "job %s key-value store is full (%llu bytes, limit %llu); delete keys or "
                        "raise --max-job-kv-bytes",
                        run_id, (unsigned long long)kv->bytes, (unsigned long long)kv->max_bytes);
            return 0;
        }
        return 1;
    }
    case RDZV_KV_GET: {
        rdzv_kv_entry *e = kv_find(kv, &msg->u.kv_key.key);
        r->type = RDZV_VALUE;
        if (e) {
            r->u.value.found = 1;
            r->u.value.value = (rdzv_bytes){e->data + e->klen, e->vlen};
        }
        return 0;
    }
    case RDZV_KV_DEL:
        kv_del(kv, &msg->u.kv_key.key);
        return 0;
    case RDZV_KV_ADD:
        return kv_add(kv, run_id, msg, r);
    case RDZV_KV_CAS:
        return kv_cas(kv, run_id, msg, r);
    case RDZV_KV_MGET:
        kv_mget(kv, msg, r, scratch);
        return 0;
    default:
        reply_error(r, GPL_ERR_PROTOCOL, "message %s is not a key-value request",
                    rdzv_type_name(msg->type));
        return 0;
    }
}

rdzv_waiter *rdzv_kv_waiter_new(rdzv_kv *kv, void *owner, const rdzv_msg *msg, uint64_t now) {
    rdzv_waiter *w = malloc(sizeof *w + msg->u.kv_keys.keys.len);
    if (w == NULL)
        return NULL;
    w->owner = owner;
    w->req = msg->req_id;
    w->nkeys = msg->u.kv_keys.nkeys;
    w->len = msg->u.kv_keys.keys.len;
    if (w->len)
        memcpy(w->keys, msg->u.kv_keys.keys.p, w->len);
    w->deadline_ms = now + msg->u.kv_keys.timeout_ms;
    LIST_INSERT_HEAD(&kv->waiters, w, klink);
    return w;
}

uint32_t rdzv_kv_missing(const rdzv_kv *kv, const rdzv_waiter *w, rdzv_bytes *first) {
    rdzv_bytes walk = {w->keys, w->len}, k;
    uint32_t missing = 0;
    while (rdzv_list_next(&walk, &k))
        if (kv_find(kv, &k) == NULL && missing++ == 0 && first)
            *first = k;
    return missing;
}

void rdzv_kv_waiter_free(rdzv_waiter *w) {
    LIST_REMOVE(w, klink);
    LIST_REMOVE(w, olink);
    free(w);
}

void rdzv_kv_wake(rdzv_kv *kv, void (*ready)(rdzv_waiter *w, void *ctx), void *ctx) {
    rdzv_waiter *w = LIST_FIRST(&kv->waiters), *n;
    for (; w; w = n) {
        n = LIST_NEXT(w, klink);
        if (rdzv_kv_missing(kv, w, NULL) == 0)
            ready(w, ctx);
    }
}
