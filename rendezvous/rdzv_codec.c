/* The rendezvous wire codec. Each message's fields are listed once, in
 * msg_fields(), which both encodes and decodes: the two directions cannot
 * drift apart. */
#include "rdzv_codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *rdzv_type_name(uint16_t type) {
    switch (type) {
#define RDZV_TYPE_NAME_(n, v)                                                                      \
    case n:                                                                                        \
        return &#n[5]; /* without "RDZV_" */
        RDZV_TYPES(RDZV_TYPE_NAME_)
#undef RDZV_TYPE_NAME_
    }
    return "UNKNOWN";
}

const char *rdzv_reason_name(uint32_t reason) {
    switch (reason) {
    case RDZV_REASON_DISCONNECT:
        return "connection lost";
    case RDZV_REASON_HEARTBEAT:
        return "heartbeat timeout";
    case RDZV_REASON_FAILED:
        return "worker failed";
    case RDZV_REASON_LEFT:
        return "node left";
    case RDZV_REASON_SCALE_UP:
        return "nodes waiting to join";
    case RDZV_REASON_HUNG:
        return "rank hung";
    }
    return "unknown";
}

const char *rdzv_restart_cause_name(uint32_t cause) {
    static const char *const names[RDZV_CAUSES] = {"unknown",       "worker_failed", "hang",
                                                   "reform_failed", "not_live",      "stopping"};
    return cause < RDZV_CAUSES ? names[cause] : "unknown";
}

void rdzv_buf_init(rdzv_buf *b, size_t max) {
    memset(b, 0, sizeof *b);
    b->max = max;
}

void rdzv_buf_free(rdzv_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

void rdzv_buf_consume(rdzv_buf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

static gpl_result_t buf_reserve(rdzv_buf *b, size_t extra) {
    if (extra > b->max || b->len > b->max - extra)
        return GPL_ERR_LIMIT;
    size_t need = b->len + extra;
    if (need <= b->cap)
        return GPL_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    if (cap > b->max)
        cap = b->max;
    uint8_t *d = realloc(b->data, cap);
    if (d == NULL)
        return GPL_ERR_NOMEM;
    b->data = d;
    b->cap = cap;
    return GPL_OK;
}

gpl_result_t rdzv_buf_append(rdzv_buf *b, const void *p, size_t n) {
    gpl_result_t rc = buf_reserve(b, n);
    if (rc != GPL_OK)
        return rc;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    return GPL_OK;
}

/* ---- the symmetric field walker ---- */

typedef struct codec {
    int enc;            /* 1 encode, 0 decode */
    rdzv_buf *out;      /* encode */
    const uint8_t *in;  /* decode */
    size_t in_len, off; /* decode */
    gpl_result_t rc;    /* first error */
    char why[128];      /* decode failure reason */
} codec;

static void fail(codec *c, gpl_result_t rc, const char *why) {
    if (c->rc == GPL_OK) {
        c->rc = rc;
        snprintf(c->why, sizeof c->why, "%s", why);
    }
}

static void raw(codec *c, void *p, size_t n) {
    if (c->rc != GPL_OK)
        return;
    if (c->enc) {
        gpl_result_t rc = rdzv_buf_append(c->out, p, n);
        if (rc != GPL_OK)
            fail(c, rc, "frame too large");
    } else {
        if (n > c->in_len - c->off) {
            fail(c, GPL_ERR_PROTOCOL, "truncated payload");
            return;
        }
        memcpy(p, c->in + c->off, n);
        c->off += n;
    }
}

static void u8(codec *c, uint8_t *v) { raw(c, v, 1); }

static void u16(codec *c, uint16_t *v) {
    uint8_t b[2] = {(uint8_t)(*v >> 8), (uint8_t)*v};
    raw(c, b, 2);
    if (!c->enc)
        *v = (uint16_t)((b[0] << 8) | b[1]);
}

static void u32(codec *c, uint32_t *v) {
    uint8_t b[4];
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(*v >> (24 - 8 * i));
    raw(c, b, 4);
    if (!c->enc) {
        *v = 0;
        for (int i = 0; i < 4; i++)
            *v = (*v << 8) | b[i];
    }
}

static void i32(codec *c, int32_t *v) {
    uint32_t u = (uint32_t)*v;
    u32(c, &u);
    *v = (int32_t)u;
}

static void u64(codec *c, uint64_t *v) {
    uint32_t hi = (uint32_t)(*v >> 32), lo = (uint32_t)*v;
    u32(c, &hi);
    u32(c, &lo);
    *v = ((uint64_t)hi << 32) | lo;
}

static void i64(codec *c, int64_t *v) {
    uint64_t u = (uint64_t)*v;
    u64(c, &u);
    *v = (int64_t)u;
}

/* A length-prefixed byte string of at most max bytes; zero-copy on decode. */
static void bytes(codec *c, rdzv_bytes *b, uint32_t max) {
    uint32_t len = b->len;
    if (c->enc && len > max) {
        fail(c, GPL_ERR_LIMIT, "field over its limit");
        return;
    }
    u32(c, &len);
    if (c->rc != GPL_OK)
        return;
    if (c->enc) {
        raw(c, (void *)b->p, len);
        return;
    }
    if (len > max) {
        fail(c, GPL_ERR_PROTOCOL, "byte string over its limit");
        return;
    }
    if (len > c->in_len - c->off) {
        fail(c, GPL_ERR_PROTOCOL, "truncated byte string");
        return;
    }
    b->p = c->in + c->off;
    b->len = len;
    c->off += len;
}

/* A string of at most max bytes into a char[max + 1]; no NUL bytes allowed. */
static void str(codec *c, char *s, uint32_t max) {
    rdzv_bytes b = {(const uint8_t *)s, 0};
    if (c->enc)
        b.len = (uint32_t)strnlen(s, (size_t)max + 1);
    bytes(c, &b, max);
    if (c->enc || c->rc != GPL_OK)
        return;
    if (memchr(b.p, 0, b.len) != NULL) {
        fail(c, GPL_ERR_PROTOCOL, "NUL byte in a string");
        return;
    }
    memcpy(s, b.p, b.len);
    s[b.len] = '\0';
}

/* A list payload: count, then the raw bytes of the list (validated on decode
 * by walking it with the given item walker). */
static void keylist(codec *c, uint32_t *count, rdzv_bytes *list) {
    u32(c, count);
    bytes(c, list, RDZV_MAX_FRAME);
    if (c->enc || c->rc != GPL_OK)
        return;
    if (*count > RDZV_MAX_KEYS) {
        fail(c, GPL_ERR_PROTOCOL, "too many keys");
        return;
    }
    rdzv_bytes walk = *list, k;
    uint32_t n = 0;
    while (rdzv_list_next(&walk, &k)) {
        if (k.len > RDZV_MAX_KEY) {
            fail(c, GPL_ERR_PROTOCOL, "key over its limit");
            return;
        }
        n++;
    }
    if (n != *count || walk.len != 0)
        fail(c, GPL_ERR_PROTOCOL, "key list does not match its count");
}

static void valuelist(codec *c, uint32_t *count, rdzv_bytes *list) {
    u32(c, count);
    bytes(c, list, RDZV_MAX_FRAME);
    if (c->enc || c->rc != GPL_OK)
        return;
    rdzv_bytes walk = *list, v;
    int found;
    uint32_t n = 0;
    while (rdzv_values_next(&walk, &found, &v))
        n++;
    if (n != *count || walk.len != 0)
        fail(c, GPL_ERR_PROTOCOL, "value list does not match its count");
}

/* Whether an entry carries the optional checkpoint group. A writer leaves it
 * out when it says nothing (no step, no stall, no drain), so an entry of a
 * rank without checkpoints is byte for byte an older launcher's; a reader
 * takes it when bytes follow the fields before it. */
static int stats_ckpt_present(const codec *c, const rdzv_rank_stats *r) {
    if (c->enc)
        return r->ckpt_local_step >= 0 || r->ckpt_durable_step >= 0 || r->ckpt_stall_ms != 0 ||
               r->ckpt_drain_left != 0;
    return c->rc == GPL_OK && c->off < c->in_len;
}

/* One STATS entry. New fields go at the end: a reader ignores what follows
 * the fields it knows. Optional groups are all or nothing, in order: a
 * writer that sends a later field sends every group before it. */
static void stats_fields(codec *c, rdzv_rank_stats *r) {
    u32(c, &r->rank);
    u32(c, &r->local_rank);
    u64(c, &r->step);
    u32(c, &r->steps);
    u32(c, &r->step_time_us);
    u32(c, &r->wait_us);
    u32(c, &r->since_progress_ms);
    str(c, r->gpu, sizeof r->gpu - 1);
    if (!c->enc) { /* an older launcher's entry ends here */
        r->ckpt_local_step = r->ckpt_durable_step = -1;
        r->ckpt_stall_ms = 0;
        r->ckpt_drain_left = 0;
    }
    if (!stats_ckpt_present(c, r))
        return;
    i64(c, &r->ckpt_local_step);
    i64(c, &r->ckpt_durable_step);
    u32(c, &r->ckpt_stall_ms);
    u64(c, &r->ckpt_drain_left);
    if (!c->enc) { /* one "none" for the readers */
        if (r->ckpt_local_step < 0)
            r->ckpt_local_step = -1;
        if (r->ckpt_durable_step < 0)
            r->ckpt_durable_step = -1;
    }
}

static void statslist(codec *c, uint32_t *count, rdzv_bytes *list) {
    u32(c, count);
    bytes(c, list, RDZV_MAX_FRAME);
    if (c->enc || c->rc != GPL_OK)
        return;
    if (*count > RDZV_MAX_STATS_RANKS) {
        fail(c, GPL_ERR_PROTOCOL, "too many ranks in STATS");
        return;
    }
    rdzv_bytes walk = *list;
    rdzv_rank_stats r;
    uint32_t n = 0;
    while (n <= *count && rdzv_stats_next(&walk, &r))
        n++;
    if (n != *count || walk.len != 0)
        fail(c, GPL_ERR_PROTOCOL, "STATS entries do not match their count");
}

static void msg_fields(codec *c, rdzv_msg *m) {
    switch (m->type) {
    case RDZV_HELLO:
        u32(c, &m->u.hello.magic);
        u16(c, &m->u.hello.version);
        break;
    case RDZV_CHALLENGE:
        raw(c, m->u.challenge.nonce, RDZV_NONCE_LEN);
        u8(c, &m->u.challenge.auth_required);
        u16(c, &m->u.challenge.version);
        break;
    case RDZV_AUTH:
        raw(c, m->u.auth.mac, RDZV_MAC_LEN);
        break;
    case RDZV_WELCOME:
        u64(c, &m->u.welcome.server_epoch);
        break;
    case RDZV_JOIN:
        str(c, m->u.join.run_id, RDZV_MAX_STR);
        str(c, m->u.join.hostname, RDZV_MAX_STR);
        str(c, m->u.join.addr, RDZV_MAX_STR);
        str(c, m->u.join.instance, RDZV_MAX_STR);
        u16(c, &m->u.join.master_port);
        u32(c, &m->u.join.nproc);
        u32(c, &m->u.join.ngpus);
        i32(c, &m->u.join.static_rank);
        u32(c, &m->u.join.min_nodes);
        u32(c, &m->u.join.max_nodes);
        u32(c, &m->u.join.last_call_ms);
        u32(c, &m->u.join.join_timeout_ms);
        u32(c, &m->u.join.heartbeat_timeout_ms);
        u32(c, &m->u.join.round);
        u32(c, &m->u.join.node_rank);
        u32(c, &m->u.join.base_rank);
        u32(c, &m->u.join.world_size);
        u32(c, &m->u.join.nnodes);
        if (m->flags & RDZV_JOIN_PEER)
            u16(c, &m->u.join.peer_port);
        break;
    case RDZV_ASSIGNED:
        u32(c, &m->u.assigned.round);
        u32(c, &m->u.assigned.node_rank);
        u32(c, &m->u.assigned.nnodes);
        u32(c, &m->u.assigned.base_rank);
        u32(c, &m->u.assigned.world_size);
        u16(c, &m->u.assigned.master_port);
        str(c, m->u.assigned.master_addr, RDZV_MAX_STR);
        break;
    case RDZV_ATTACH:
        str(c, m->u.attach.run_id, RDZV_MAX_STR);
        u32(c, &m->u.attach.round);
        break;
    case RDZV_KV_SET:
        bytes(c, &m->u.kv_set.key, RDZV_MAX_KEY);
        bytes(c, &m->u.kv_set.value, RDZV_MAX_VALUE);
        break;
    case RDZV_KV_GET:
    case RDZV_KV_DEL:
        bytes(c, &m->u.kv_key.key, RDZV_MAX_KEY);
        break;
    case RDZV_KV_WAIT:
    case RDZV_KV_MGET:
        u32(c, &m->u.kv_keys.timeout_ms);
        keylist(c, &m->u.kv_keys.nkeys, &m->u.kv_keys.keys);
        break;
    case RDZV_KV_ADD:
        bytes(c, &m->u.kv_add.key, RDZV_MAX_KEY);
        i64(c, &m->u.kv_add.delta);
        break;
    case RDZV_KV_CAS:
        bytes(c, &m->u.kv_cas.key, RDZV_MAX_KEY);
        u8(c, &m->u.kv_cas.expect_absent);
        bytes(c, &m->u.kv_cas.expected, RDZV_MAX_VALUE);
        bytes(c, &m->u.kv_cas.desired, RDZV_MAX_VALUE);
        break;
    case RDZV_HEARTBEAT:
        if (m->flags & RDZV_HEARTBEAT_WAIT)
            u32(c, &m->u.heartbeat.wait_ms);
        break;
    case RDZV_PROBE_REQ:
        str(c, m->u.probe_req.addr, RDZV_MAX_STR);
        u16(c, &m->u.probe_req.port);
        u32(c, &m->u.probe_req.deadline_ms);
        break;
    case RDZV_PROBE_ACK:
        u8(c, &m->u.probe_ack.ok);
        u32(c, &m->u.probe_ack.rtt_ms);
        break;
    case RDZV_STORY:
        u32(c, &m->u.story.round);
        u32(c, &m->u.story.kind);
        u32(c, &m->u.story.pause_ms);
        u32(c, &m->u.story.redone);
        u32(c, &m->u.story.nproc);
        str(c, m->u.story.why, RDZV_MAX_MSG);
        u32(c, &m->u.story.source);
        i64(c, &m->u.story.state_step);
        u64(c, &m->u.story.state_bytes);
        u32(c, &m->u.story.state_ms);
        if (m->flags & RDZV_STORY_MORE) {
            u32(c, &m->u.story.cause);
            i32(c, &m->u.story.state_root);
        } else if (!c->enc) {
            m->u.story.state_root = -1; /* not said */
        }
        break;
    case RDZV_OK:
    case RDZV_DONE:
    case RDZV_JOB_DONE:
    case RDZV_NODE:
    case RDZV_PING:
    case RDZV_PONG:
        break;
    case RDZV_ERROR:
        u32(c, &m->u.error.code);
        str(c, m->u.error.message, RDZV_MAX_MSG);
        break;
    case RDZV_VALUE:
        u8(c, &m->u.value.found);
        bytes(c, &m->u.value.value, RDZV_MAX_VALUE);
        break;
    case RDZV_VALUES:
        valuelist(c, &m->u.values.count, &m->u.values.items);
        break;
    case RDZV_INT:
        i64(c, &m->u.int_.value);
        u8(c, &m->u.int_.ok);
        break;
    case RDZV_ROUND_OVER:
        u32(c, &m->u.round_over.round);
        u32(c, &m->u.round_over.reason);
        u32(c, &m->u.round_over.node_rank);
        str(c, m->u.round_over.hostname, RDZV_MAX_STR);
        str(c, m->u.round_over.message, RDZV_MAX_MSG);
        break;
    case RDZV_WAITING:
        u32(c, &m->u.waiting.waiting);
        u32(c, &m->u.waiting.members);
        break;
    case RDZV_EVENT:
        u32(c, &m->u.event.kind);
        u32(c, &m->u.event.round);
        u64(c, &m->u.event.deadline_unix_ms);
        str(c, m->u.event.node, RDZV_MAX_STR);
        str(c, m->u.event.reason, RDZV_MAX_MSG);
        break;
    case RDZV_FAIL:
        str(c, m->u.fail.message, RDZV_MAX_MSG);
        if (m->flags & RDZV_FAIL_HANG)
            u32(c, &m->u.fail.rank);
        break;
    case RDZV_PROGRESS:
        u32(c, &m->u.progress.joined);
        u32(c, &m->u.progress.expected);
        u32(c, &m->u.progress.waited_ms);
        str(c, m->u.progress.missing, RDZV_MAX_MSG);
        break;
    case RDZV_STATS:
        u32(c, &m->u.stats.window_ms);
        statslist(c, &m->u.stats.count, &m->u.stats.ranks);
        break;
    default:
        fail(c, GPL_ERR_PROTOCOL, "unknown message type");
        break;
    }
}

static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get_u32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

gpl_result_t rdzv_encode(const rdzv_msg *m, rdzv_buf *b) {
    size_t start = b->len;
    uint8_t hdr[RDZV_HEADER_LEN] = {0};
    gpl_result_t rc = rdzv_buf_append(b, hdr, sizeof hdr);
    if (rc != GPL_OK)
        return rc;
    codec c = {.enc = 1, .out = b};
    msg_fields(&c, (rdzv_msg *)m);
    size_t body = b->len - start - 4;
    if (c.rc == GPL_OK && body > RDZV_MAX_FRAME)
        c.rc = GPL_ERR_LIMIT;
    if (c.rc != GPL_OK) {
        b->len = start;
        return c.rc;
    }
    uint8_t *h = b->data + start;
    put_u32(h, (uint32_t)body);
    h[4] = (uint8_t)(m->type >> 8);
    h[5] = (uint8_t)m->type;
    h[6] = (uint8_t)(m->flags >> 8);
    h[7] = (uint8_t)m->flags;
    put_u32(h + 8, m->req_id);
    return GPL_OK;
}

gpl_result_t rdzv_frame_peek(const uint8_t *p, size_t n, size_t *frame_len) {
    if (n < 4)
        return GPL_ERR_STATE;
    uint32_t body = get_u32(p);
    if (body > RDZV_MAX_FRAME)
        return GPL_ERR_LIMIT;
    if (body < RDZV_HEADER_LEN - 4)
        return GPL_ERR_PROTOCOL;
    if (n < (size_t)body + 4)
        return GPL_ERR_STATE;
    *frame_len = (size_t)body + 4;
    return GPL_OK;
}

gpl_result_t rdzv_decode(const uint8_t *p, size_t n, rdzv_msg *m, char *err, size_t errlen) {
    size_t flen;
    gpl_result_t rc = rdzv_frame_peek(p, n, &flen);
    if (rc != GPL_OK || flen != n) {
        if (err)
            snprintf(err, errlen, "bad frame length");
        return rc == GPL_ERR_LIMIT ? GPL_ERR_LIMIT : GPL_ERR_PROTOCOL;
    }
    memset(m, 0, sizeof *m);
    m->type = (uint16_t)((p[4] << 8) | p[5]);
    m->flags = (uint16_t)((p[6] << 8) | p[7]);
    m->req_id = get_u32(p + 8);
    codec c = {.enc = 0, .in = p + RDZV_HEADER_LEN, .in_len = n - RDZV_HEADER_LEN};
    msg_fields(&c, m);
    if (c.rc == GPL_OK && c.off != c.in_len)
        fail(&c, GPL_ERR_PROTOCOL, "trailing bytes after the payload");
    if (c.rc != GPL_OK) {
        if (err)
            snprintf(err, errlen, "%s (type %u)", c.why, (unsigned)m->type);
        return GPL_ERR_PROTOCOL;
    }
    return GPL_OK;
}

int rdzv_list_next(rdzv_bytes *list, rdzv_bytes *out) {
    if (list->len < 4)
        return 0;
    uint32_t len = get_u32(list->p);
    if (len > list->len - 4)
        return 0;
    out->p = list->p + 4;
    out->len = len;
    list->p += 4 + len;
    list->len -= 4 + len;
    return 1;
}

int rdzv_values_next(rdzv_bytes *list, int *found, rdzv_bytes *out) {
    if (list->len < 1)
        return 0;
    rdzv_bytes rest = {list->p + 1, list->len - 1};
    if (!rdzv_list_next(&rest, out) || out->len > RDZV_MAX_VALUE)
        return 0;
    *found = list->p[0] != 0;
    *list = rest;
    return 1;
}

gpl_result_t rdzv_list_add(rdzv_buf *list, const void *p, uint32_t len) {
    uint8_t h[4];
    put_u32(h, len);
    gpl_result_t rc = rdzv_buf_append(list, h, 4);
    if (rc == GPL_OK)
        rc = rdzv_buf_append(list, p, len);
    return rc;
}

gpl_result_t rdzv_values_add(rdzv_buf *list, int found, const void *p, uint32_t len) {
    uint8_t f = found ? 1 : 0;
    gpl_result_t rc = rdzv_buf_append(list, &f, 1);
    if (rc == GPL_OK)
        rc = rdzv_list_add(list, p, len);
    return rc;
}

int rdzv_stats_next(rdzv_bytes *list, rdzv_rank_stats *out) {
    rdzv_bytes walk = *list, item;
    if (!rdzv_list_next(&walk, &item))
        return 0;
    memset(out, 0, sizeof *out);
    codec c = {.enc = 0, .in = item.p, .in_len = item.len};
    stats_fields(&c, out);
    if (c.rc != GPL_OK)
        return 0;
    *list = walk;
    return 1;
}

gpl_result_t rdzv_stats_add(rdzv_buf *list, const rdzv_rank_stats *r) {
    size_t start = list->len;
    uint8_t h[4] = {0};
    gpl_result_t rc = rdzv_buf_append(list, h, 4);
    if (rc != GPL_OK)
        return rc;
    codec c = {.enc = 1, .out = list};
    stats_fields(&c, (rdzv_rank_stats *)r);
    if (c.rc != GPL_OK) {
        list->len = start;
        return c.rc;
    }
    put_u32(list->data + start, (uint32_t)(list->len - start - 4));
    return GPL_OK;
}
