/* The rendezvous codec: every message round-trips, every malformed input is
 * refused. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rdzv_auth.h"
#include "rdzv_codec.h"

static rdzv_buf keylist_buf, values_buf, stats_buf;

static rdzv_bytes B(const char *s) { return (rdzv_bytes){(const uint8_t *)s, (uint32_t)strlen(s)}; }

/* A message of the given type with every field set to something non-zero. */
static void sample(uint16_t type, rdzv_msg *m) {
    memset(m, 0, sizeof *m);
    m->type = type;
    m->req_id = 0x01020304u + type;
    m->flags = 0x8001;
    switch (type) {
    case RDZV_HELLO:
        m->u.hello.magic = RDZV_MAGIC;
        m->u.hello.version = RDZV_VERSION;
        break;
    case RDZV_CHALLENGE:
        memset(m->u.challenge.nonce, 0xab, RDZV_NONCE_LEN);
        m->u.challenge.auth_required = 1;
        m->u.challenge.version = 7;
        break;
    case RDZV_AUTH:
        memset(m->u.auth.mac, 0xcd, RDZV_MAC_LEN);
        break;
    case RDZV_WELCOME:
        m->u.welcome.server_epoch = 0x1122334455667788ull;
        break;
    case RDZV_JOIN:
        memcpy(m->u.join.run_id, "job-7", 6);
        memcpy(m->u.join.hostname, "gpu-node-1", 11);
        memcpy(m->u.join.addr, "10.0.0.2", 9);
        memcpy(m->u.join.instance, "i-abc", 6);
        m->u.join.master_port = 29501;
        m->u.join.nproc = 8;
        m->u.join.ngpus = 8;
        m->u.join.static_rank = -1;
        m->u.join.min_nodes = 2;
        m->u.join.max_nodes = 4;
        m->u.join.last_call_ms = 30000;
        m->u.join.join_timeout_ms = 600000;
        m->u.join.heartbeat_timeout_ms = 3000;
        m->u.join.round = 3;
        m->u.join.node_rank = 1;
        m->u.join.base_rank = 8;
        m->u.join.world_size = 32;
        m->u.join.nnodes = 4;
        break;
    case RDZV_ASSIGNED:
        m->u.assigned.round = 2;
        m->u.assigned.node_rank = 3;
        m->u.assigned.nnodes = 4;
        m->u.assigned.base_rank = 24;
        m->u.assigned.world_size = 32;
        m->u.assigned.master_port = 40000;
        memcpy(m->u.assigned.master_addr, "10.0.0.1", 9);
        break;
    case RDZV_ATTACH:
        memcpy(m->u.attach.run_id, "job-7", 6);
        m->u.attach.round = 9;
        break;
    case RDZV_KV_SET:
        m->u.kv_set.key = B("nccl/uid");
        m->u.kv_set.value = B("\x01\x02 binary \xff");
        break;
    case RDZV_KV_GET:
    case RDZV_KV_DEL:
        m->u.kv_key.key = B("k");
        break;
    case RDZV_KV_WAIT:
    case RDZV_KV_MGET:
        rdzv_buf_free(&keylist_buf);
        rdzv_buf_init(&keylist_buf, 1 << 20);
        rdzv_list_add(&keylist_buf, "a", 1);
        rdzv_list_add(&keylist_buf, "", 0);
        rdzv_list_add(&keylist_buf, "barrier/3", 9);
        m->u.kv_keys.timeout_ms = 1500;
        m->u.kv_keys.nkeys = 3;
        m->u.kv_keys.keys = (rdzv_bytes){keylist_buf.data, (uint32_t)keylist_buf.len};
        break;
    case RDZV_KV_ADD:
        m->u.kv_add.key = B("counter");
        m->u.kv_add.delta = -5;
        break;
    case RDZV_KV_CAS:
        m->u.kv_cas.key = B("leader");
        m->u.kv_cas.expected = B("old");
        m->u.kv_cas.desired = B("new");
        m->u.kv_cas.expect_absent = 1;
        break;
    case RDZV_ERROR:
        m->u.error.code = GPL_ERR_AUTH;
        memcpy(m->u.error.message, "wrong token", 12);
        break;
    case RDZV_VALUE:
        m->u.value.found = 1;
        m->u.value.value = B("v");
        break;
    case RDZV_VALUES:
        rdzv_buf_free(&values_buf);
        rdzv_buf_init(&values_buf, 1 << 20);
        rdzv_values_add(&values_buf, 1, "x", 1);
        rdzv_values_add(&values_buf, 0, "", 0);
        m->u.values.count = 2;
        m->u.values.items = (rdzv_bytes){values_buf.data, (uint32_t)values_buf.len};
        break;
    case RDZV_INT:
        m->u.int_.value = -1234567890123ll;
        m->u.int_.ok = 1;
        break;
    case RDZV_ROUND_OVER:
        m->u.round_over.round = 4;
        m->u.round_over.reason = RDZV_REASON_HEARTBEAT;
        m->u.round_over.node_rank = 2;
        memcpy(m->u.round_over.hostname, "n2", 3);
        memcpy(m->u.round_over.message, "no heartbeat for 3.0 s", 23);
        break;
    case RDZV_WAITING:
        m->u.waiting.waiting = 1;
        m->u.waiting.members = 3;
        break;
    case RDZV_EVENT:
        m->u.event.kind = RDZV_EVENT_CHECKPOINT;
        m->u.event.round = 5;
        m->u.event.deadline_unix_ms = 1700000000123ull;
        memcpy(m->u.event.node, "n1", 3);
        memcpy(m->u.event.reason, "aws spot terminate", 19);
        break;
    case RDZV_FAIL:
        memcpy(m->u.fail.message, "rank 3 exited 1", 16);
        m->u.fail.rank = 3; /* flags has RDZV_FAIL_HANG */
        break;
    case RDZV_STATS: {
        rdzv_buf_free(&stats_buf);
        rdzv_buf_init(&stats_buf, RDZV_MAX_FRAME);
        rdzv_rank_stats r = {.rank = 8,
                             .local_rank = 0,
                             .step = 1ull << 40,
                             .steps = 50,
                             .step_time_us = 98000,
                             .wait_us = UINT32_MAX,
                             .since_progress_ms = 40,
                             .gpu = "0",
                             .ckpt_local_step = -1,
                             .ckpt_durable_step = -1};
        rdzv_stats_add(&stats_buf, &r); /* no checkpoint group */
        r.rank = 9;
        r.local_rank = 1;
        r.wait_us = 1234;
        memcpy(r.gpu, "GPU-1f2e3d4c-aaaa-bbbb-cccc-0123456789ab", 41);
        r.ckpt_local_step = 1000;
        r.ckpt_durable_step = 900;
        r.ckpt_stall_ms = 250;
        r.ckpt_drain_left = 3ull << 32;
        rdzv_stats_add(&stats_buf, &r); /* with it */
        m->u.stats.window_ms = 5000;
        m->u.stats.count = 2;
        m->u.stats.ranks = (rdzv_bytes){stats_buf.data, (uint32_t)stats_buf.len};
        break;
    }
    case RDZV_HEARTBEAT:
        m->u.heartbeat.wait_ms = 750; /* flags has RDZV_HEARTBEAT_WAIT */
        break;
    case RDZV_PROGRESS:
        m->u.progress.joined = 3;
        m->u.progress.expected = 4;
        m->u.progress.waited_ms = 1200;
        memcpy(m->u.progress.missing, "node rank 2", 12);
        break;
    default:
        break;
    }
}

Test(codec, every_message_round_trips) {
    for (uint16_t t = 1; t < RDZV_TYPE_MAX_; t++) {
        rdzv_msg m, d;
        rdzv_buf b, b2;
        sample(t, &m);
        rdzv_buf_init(&b, RDZV_MAX_FRAME + 4);
        rdzv_buf_init(&b2, RDZV_MAX_FRAME + 4);
        cr_assert_eq(rdzv_encode(&m, &b), GPL_OK, "encode %s", rdzv_type_name(t));
        size_t flen = 0;
        cr_assert_eq(rdzv_frame_peek(b.data, b.len, &flen), GPL_OK);
        cr_assert_eq(flen, b.len);
        char err[128] = "";
        cr_assert_eq(rdzv_decode(b.data, b.len, &d, err, sizeof err), GPL_OK, "decode %s: %s",
                     rdzv_type_name(t), err);
        cr_expect_eq(d.type, t);
        cr_expect_eq(d.req_id, m.req_id);
        cr_expect_eq(d.flags, m.flags);
        /* Re-encoding the decoded message gives the same bytes. */
        cr_assert_eq(rdzv_encode(&d, &b2), GPL_OK);
        cr_expect_eq(b2.len, b.len, "%s", rdzv_type_name(t));
        cr_expect_eq(memcmp(b.data, b2.data, b.len), 0, "%s differs", rdzv_type_name(t));
        cr_expect_str_neq(rdzv_type_name(t), "UNKNOWN");
        rdzv_buf_free(&b);
        rdzv_buf_free(&b2);
    }
    rdzv_buf_free(&keylist_buf);
    rdzv_buf_free(&values_buf);
    rdzv_buf_free(&stats_buf);
}

Test(codec, decoded_fields_match) {
    rdzv_msg m, d;
    rdzv_buf b;
    sample(RDZV_JOIN, &m);
    rdzv_buf_init(&b, 1 << 16);
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    cr_assert_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK);
    cr_expect_str_eq(d.u.join.hostname, "gpu-node-1");
    cr_expect_eq(d.u.join.static_rank, -1);
    cr_expect_eq(d.u.join.master_port, 29501);
    cr_expect_eq(d.u.join.nnodes, 4);
    rdzv_buf_free(&b);

    sample(RDZV_KV_MGET, &m);
    rdzv_buf_init(&b, 1 << 16);
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    cr_assert_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK);
    rdzv_bytes walk = d.u.kv_keys.keys, k;
    const char *want[] = {"a", "", "barrier/3"};
    int i = 0;
    while (rdzv_list_next(&walk, &k)) {
        cr_assert_lt(i, 3);
        cr_expect_eq(k.len, strlen(want[i]));
        cr_expect_eq(memcmp(k.p, want[i], k.len), 0);
        i++;
    }
    cr_expect_eq(i, 3);
    rdzv_buf_free(&b);
    rdzv_buf_free(&keylist_buf);
}

Test(codec, every_truncation_is_refused) {
    for (uint16_t t = 1; t < RDZV_TYPE_MAX_; t++) {
        rdzv_msg m, d;
        rdzv_buf b;
        sample(t, &m);
        rdzv_buf_init(&b, RDZV_MAX_FRAME + 4);
        cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
        for (size_t cut = RDZV_HEADER_LEN; cut < b.len; cut++) {
            /* Rewrite the length so the frame is self-consistent but short. */
            uint8_t *copy = malloc(cut);
            memcpy(copy, b.data, cut);
            uint32_t body = (uint32_t)cut - 4;
            copy[0] = (uint8_t)(body >> 24);
            copy[1] = (uint8_t)(body >> 16);
            copy[2] = (uint8_t)(body >> 8);
            copy[3] = (uint8_t)body;
            cr_expect_neq(rdzv_decode(copy, cut, &d, NULL, 0), GPL_OK, "%s cut at %zu",
                          rdzv_type_name(t), cut);
            free(copy);
        }
        size_t flen;
        for (size_t cut = 0; cut < b.len; cut++)
            cr_expect_eq(rdzv_frame_peek(b.data, cut, &flen), GPL_ERR_STATE);
        rdzv_buf_free(&b);
    }
    rdzv_buf_free(&keylist_buf);
    rdzv_buf_free(&values_buf);
    rdzv_buf_free(&stats_buf);
}

static size_t frame(uint8_t *f, uint16_t type, const uint8_t *payload, size_t n) {
    uint32_t body = (uint32_t)(n + 8);
    f[0] = (uint8_t)(body >> 24);
    f[1] = (uint8_t)(body >> 16);
    f[2] = (uint8_t)(body >> 8);
    f[3] = (uint8_t)body;
    f[4] = (uint8_t)(type >> 8);
    f[5] = (uint8_t)type;
    memset(f + 6, 0, 6);
    if (n)
        memcpy(f + 12, payload, n);
    return n + 12;
}

Test(codec, malformed_frames_are_refused) {
    uint8_t f[256];
    rdzv_msg d;
    char err[128];
    size_t flen;

    /* unknown type */
    size_t n = frame(f, 999, NULL, 0);
    cr_expect_eq(rdzv_decode(f, n, &d, err, sizeof err), GPL_ERR_PROTOCOL);
    cr_expect(strstr(err, "unknown message type") != NULL, "%s", err);
    /* type 0 */
    n = frame(f, 0, NULL, 0);
    cr_expect_eq(rdzv_decode(f, n, &d, NULL, 0), GPL_ERR_PROTOCOL);
    /* trailing bytes */
    n = frame(f, RDZV_OK, (const uint8_t *)"xx", 2);
    cr_expect_eq(rdzv_decode(f, n, &d, err, sizeof err), GPL_ERR_PROTOCOL);
    cr_expect(strstr(err, "trailing") != NULL, "%s", err);
    /* oversized announced length */
    uint8_t big[4] = {0x7f, 0xff, 0xff, 0xff};
    cr_expect_eq(rdzv_frame_peek(big, 4, &flen), GPL_ERR_LIMIT);
    /* length under the header */
    uint8_t tiny[12] = {0, 0, 0, 3};
    cr_expect_eq(rdzv_frame_peek(tiny, 12, &flen), GPL_ERR_PROTOCOL);
    /* a key longer than RDZV_MAX_KEY */
    uint8_t p[8] = {0, 0, 0x04, 0x01}; /* key length 1025 */
    n = frame(f, RDZV_KV_GET, p, 4);
    cr_expect_eq(rdzv_decode(f, n, &d, NULL, 0), GPL_ERR_PROTOCOL);
    /* a NUL byte inside a string */
    uint8_t s[8] = {0, 0, 0, 3, 'a', 0, 'b'};
    uint8_t pl[32];
    memcpy(pl, s, 7);
    memset(pl + 7, 0, 4);
    n = frame(f, RDZV_ATTACH, pl, 11);
    cr_expect_eq(rdzv_decode(f, n, &d, err, sizeof err), GPL_ERR_PROTOCOL);
    cr_expect(strstr(err, "NUL") != NULL, "%s", err);
    /* a key list whose count lies */
    uint8_t kl[32] = {0, 0, 0, 0, /* timeout */ 0,    0, 0, 2, /* count 2 */
                      0, 0, 0, 5, /* list bytes */ 0, 0, 0, 1, 'k'};
    n = frame(f, RDZV_KV_MGET, kl, 17);
    cr_expect_eq(rdzv_decode(f, n, &d, err, sizeof err), GPL_ERR_PROTOCOL);
    /* a header-only frame of a type with fields */
    n = frame(f, RDZV_JOIN, NULL, 0);
    cr_expect_eq(rdzv_decode(f, n, &d, NULL, 0), GPL_ERR_PROTOCOL);
}

/* STATS: the entries come back field by field; an entry longer than the
 * fields this codec knows (a newer peer's) is read up to them; a count that
 * lies, a malformed entry or more than RDZV_MAX_STATS_RANKS are refused;
 * FAIL carries the hung rank only with RDZV_FAIL_HANG. */
Test(codec, stats_entries_and_hang) {
    rdzv_msg m, d;
    rdzv_buf b;
    sample(RDZV_STATS, &m);
    rdzv_buf_init(&b, RDZV_MAX_FRAME + 4);
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    cr_assert_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK);
    cr_expect_eq(d.u.stats.window_ms, 5000);
    rdzv_bytes walk = d.u.stats.ranks;
    rdzv_rank_stats r;
    cr_assert(rdzv_stats_next(&walk, &r));
    cr_expect_eq(r.rank, 8);
    cr_expect_eq(r.step, 1ull << 40);
    cr_expect_eq(r.steps, 50);
    cr_expect_eq(r.step_time_us, 98000);
    cr_expect_eq(r.wait_us, UINT32_MAX);
    cr_expect_eq(r.since_progress_ms, 40);
    cr_expect_str_eq(r.gpu, "0");
    cr_assert(rdzv_stats_next(&walk, &r));
    cr_expect_eq(r.rank, 9);
    cr_expect_eq(r.local_rank, 1);
    cr_expect_eq(r.wait_us, 1234);
    cr_expect_str_eq(r.gpu, "GPU-1f2e3d4c-aaaa-bbbb-cccc-0123456789ab");
    cr_expect_eq(r.ckpt_local_step, 1000);
    cr_expect_eq(r.ckpt_durable_step, 900);
    cr_expect_eq(r.ckpt_stall_ms, 250);
    cr_expect_eq(r.ckpt_drain_left, 3ull << 32);
    cr_expect_not(rdzv_stats_next(&walk, &r));
    cr_expect_eq(walk.len, 0);

    /* a newer peer's entry: 4 more bytes after the known fields */
    rdzv_buf list;
    rdzv_buf_init(&list, RDZV_MAX_FRAME);
    rdzv_buf item;
    rdzv_buf_init(&item, 4096);
    rdzv_rank_stats nr = {.rank = 5, .steps = 1, .step_time_us = 10, .gpu = "3"};
    rdzv_stats_add(&item, &nr);
    uint8_t extra[4] = {1, 2, 3, 4};
    uint8_t body[256];
    memcpy(body, item.data + 4, item.len - 4);
    memcpy(body + item.len - 4, extra, 4);
    rdzv_list_add(&list, body, (uint32_t)item.len); /* the fields + 4 bytes */
    m.u.stats.count = 1;
    m.u.stats.ranks = (rdzv_bytes){list.data, (uint32_t)list.len};
    b.len = 0;
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    cr_assert_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK, "a longer entry is taken");
    walk = d.u.stats.ranks;
    cr_assert(rdzv_stats_next(&walk, &r));
    cr_expect_eq(r.rank, 5);
    cr_expect_str_eq(r.gpu, "3");

    /* the count lies */
    m.u.stats.count = 2;
    b.len = 0;
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    char err[128] = "";
    cr_expect_eq(rdzv_decode(b.data, b.len, &d, err, sizeof err), GPL_ERR_PROTOCOL);
    cr_expect(strstr(err, "STATS") != NULL, "%s", err);
    /* an entry cut short of the known fields */
    list.len = 0;
    rdzv_list_add(&list, body, 20);
    m.u.stats.count = 1;
    m.u.stats.ranks = (rdzv_bytes){list.data, (uint32_t)list.len};
    b.len = 0;
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    cr_expect_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_ERR_PROTOCOL);
    /* more entries than RDZV_MAX_STATS_RANKS */
    list.len = 0;
    for (uint32_t i = 0; i <= RDZV_MAX_STATS_RANKS; i++) {
        nr.rank = i;
        cr_assert_eq(rdzv_stats_add(&list, &nr), GPL_OK);
    }
    m.u.stats.count = RDZV_MAX_STATS_RANKS + 1;
    m.u.stats.ranks = (rdzv_bytes){list.data, (uint32_t)list.len};
    b.len = 0;
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    cr_expect_eq(rdzv_decode(b.data, b.len, &d, err, sizeof err), GPL_ERR_PROTOCOL);
    /* ... and exactly that many fit in a frame */
    m.u.stats.count = RDZV_MAX_STATS_RANKS;
    list.len = 0;
    memset(nr.gpu, 'g', sizeof nr.gpu - 1);
    for (uint32_t i = 0; i < RDZV_MAX_STATS_RANKS; i++)
        cr_assert_eq(rdzv_stats_add(&list, &nr), GPL_OK);
    m.u.stats.ranks = (rdzv_bytes){list.data, (uint32_t)list.len};
    b.len = 0;
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK, "4096 ranks with 63-byte GPU ids fit one frame");
    cr_expect_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK);

    /* FAIL: the rank only with the hang flag */
    memset(&m, 0, sizeof m);
    m.type = RDZV_FAIL;
    memcpy(m.u.fail.message, "no progress for 60 s", 21);
    m.u.fail.rank = 12;
    b.len = 0;
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    size_t plain = b.len;
    cr_assert_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK);
    cr_expect_eq(d.u.fail.rank, 0, "a plain FAIL carries no rank");
    m.flags = RDZV_FAIL_HANG;
    b.len = 0;
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    cr_expect_eq(b.len, plain + 4);
    cr_assert_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK);
    cr_expect_eq(d.u.fail.rank, 12);
    cr_expect_str_eq(d.u.fail.message, "no progress for 60 s");

    rdzv_buf_free(&item);
    rdzv_buf_free(&list);
    rdzv_buf_free(&b);
    rdzv_buf_free(&stats_buf);
}

/* A heartbeat carries its wait only with RDZV_HEARTBEAT_WAIT: a plain one is
 * the bare header an older server takes; PING and PONG have no body and
 * keep their req id (the probe's). */
Test(codec, heartbeat_wait_and_probes) {
    rdzv_msg m = {.type = RDZV_HEARTBEAT}, d;
    rdzv_buf b;
    rdzv_buf_init(&b, 4096);
    m.u.heartbeat.wait_ms = 420;
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    cr_expect_eq(b.len, RDZV_HEADER_LEN, "a plain heartbeat has no body");
    cr_assert_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK);
    cr_expect_eq(d.u.heartbeat.wait_ms, 0);
    m.flags = RDZV_HEARTBEAT_WAIT;
    b.len = 0;
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    cr_expect_eq(b.len, RDZV_HEADER_LEN + 4);
    cr_assert_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK);
    cr_expect_eq(d.u.heartbeat.wait_ms, 420);
    /* the flag without its u32 is refused, not read as 0 */
    b.data[3] -= 4;
    cr_expect_eq(rdzv_decode(b.data, b.len - 4, &d, NULL, 0), GPL_ERR_PROTOCOL);
    for (uint16_t t = RDZV_PING; t <= RDZV_PONG; t++) {
        rdzv_msg p = {.type = t, .req_id = 77}, q;
        b.len = 0;
        cr_assert_eq(rdzv_encode(&p, &b), GPL_OK);
        cr_expect_eq(b.len, RDZV_HEADER_LEN);
        cr_assert_eq(rdzv_decode(b.data, b.len, &q, NULL, 0), GPL_OK);
        cr_expect_eq(q.req_id, 77);
        cr_expect_str_eq(rdzv_type_name(t), t == RDZV_PING ? "PING" : "PONG");
    }
    rdzv_buf_free(&b);
}

/* Peer probes: a JOIN's UDP port only behind RDZV_JOIN_PEER (an older
 * server's JOIN is byte for byte the same without it), PROBE_REQ and
 * PROBE_ACK round trip, and a request's address over its limit is refused. */
Test(codec, join_peer_port_and_probe_requests) {
    rdzv_msg m = {.type = RDZV_JOIN, .req_id = 5}, d;
    rdzv_buf b;
    rdzv_buf_init(&b, 4096);
    snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "job");
    m.u.join.peer_port = 40123;
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    size_t plain = b.len;
    cr_assert_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK);
    cr_expect_eq(d.u.join.peer_port, 0, "a port without the flag was read");
    m.flags = RDZV_JOIN_PROBE | RDZV_JOIN_PEER;
    b.len = 0;
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    cr_expect_eq(b.len, plain + 2);
    cr_assert_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK);
    cr_expect_eq(d.u.join.peer_port, 40123);
    b.data[3] -= 2; /* the flag without its port: refused */
    cr_expect_eq(rdzv_decode(b.data, b.len - 2, &d, NULL, 0), GPL_ERR_PROTOCOL);

    rdzv_msg q = {.type = RDZV_PROBE_REQ, .req_id = 99};
    snprintf(q.u.probe_req.addr, sizeof q.u.probe_req.addr, "::ffff:10.1.2.3");
    q.u.probe_req.port = 5555;
    q.u.probe_req.deadline_ms = 167;
    b.len = 0;
    cr_assert_eq(rdzv_encode(&q, &b), GPL_OK);
    cr_assert_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK);
    cr_expect_eq(d.req_id, 99);
    cr_expect_str_eq(d.u.probe_req.addr, "::ffff:10.1.2.3");
    cr_expect_eq(d.u.probe_req.port, 5555);
    cr_expect_eq(d.u.probe_req.deadline_ms, 167);
    cr_expect_str_eq(rdzv_type_name(RDZV_PROBE_REQ), "PROBE_REQ");

    rdzv_msg a = {.type = RDZV_PROBE_ACK, .req_id = 99};
    a.u.probe_ack.ok = 1;
    a.u.probe_ack.rtt_ms = 3;
    b.len = 0;
    cr_assert_eq(rdzv_encode(&a, &b), GPL_OK);
    cr_expect_eq(b.len, RDZV_HEADER_LEN + 5);
    cr_assert_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK);
    cr_expect_eq(d.u.probe_ack.ok, 1);
    cr_expect_eq(d.u.probe_ack.rtt_ms, 3);
    cr_expect_str_eq(rdzv_type_name(RDZV_PROBE_ACK), "PROBE_ACK");
    rdzv_buf_free(&b);
}

/* The checkpoint group of a STATS entry is optional: written only when it
 * says something, read when bytes follow the GPU; an older launcher's entry
 * (without it) reads -1, -1, 0, 0, a group cut short is refused, and a newer
 * peer's fields after it are ignored. */
Test(codec, stats_checkpoint_group_is_optional) {
    rdzv_buf with, without;
    rdzv_buf_init(&with, 4096);
    rdzv_buf_init(&without, 4096);
    rdzv_rank_stats r = RDZV_RANK_STATS_INIT, d;
    r.rank = 17;
    r.local_rank = 3;
    r.step = 4242;
    r.steps = 12;
    r.step_time_us = 51000;
    memcpy(r.gpu, "3", 2);
    cr_assert_eq(rdzv_stats_add(&without, &r), GPL_OK);
    r.ckpt_local_step = 1ll << 41;
    r.ckpt_durable_step = 0;
    r.ckpt_stall_ms = UINT32_MAX;
    r.ckpt_drain_left = UINT64_MAX - 1;
    cr_assert_eq(rdzv_stats_add(&with, &r), GPL_OK);
    cr_expect_eq(with.len, without.len + 28, "the group: two i64, a u32 and a u64");

    /* round trip */
    rdzv_bytes walk = {with.data, (uint32_t)with.len};
    cr_assert(rdzv_stats_next(&walk, &d));
    cr_expect_eq(walk.len, 0);
    cr_expect(d.rank == 17 && d.local_rank == 3 && d.step == 4242 && d.steps == 12 &&
              d.step_time_us == 51000 && d.wait_us == UINT32_MAX && strcmp(d.gpu, "3") == 0);
    cr_expect_eq(d.ckpt_local_step, 1ll << 41);
    cr_expect_eq(d.ckpt_durable_step, 0, "step 0 is a step");
    cr_expect_eq(d.ckpt_stall_ms, UINT32_MAX);
    cr_expect_eq(d.ckpt_drain_left, UINT64_MAX - 1);

    /* nothing to say: the entry is byte for byte an older launcher's, and an
     * older launcher's entry reads the defaults */
    walk = (rdzv_bytes){without.data, (uint32_t)without.len};
    memset(&d, 0x5a, sizeof d);
    cr_assert(rdzv_stats_next(&walk, &d));
    cr_expect(d.rank == 17 && d.step == 4242 && strcmp(d.gpu, "3") == 0);
    cr_expect_eq(d.ckpt_local_step, -1);
    cr_expect_eq(d.ckpt_durable_step, -1);
    cr_expect_eq(d.ckpt_stall_ms, 0);
    cr_expect_eq(d.ckpt_drain_left, 0);
    /* length 37; rank 17, local rank 3; step 4242; 12 steps; 51000 us per
     * step; wait not known; 0 ms since progress; gpu "3" */
    static const uint8_t old_entry[] = {0,   0,   0,   37,  0,  0,   0, 17, 0, 0,  0, 3, 0,   0,
                                        0,   0,   0,   0,   16, 146, 0, 0,  0, 12, 0, 0, 199, 56,
                                        255, 255, 255, 255, 0,  0,   0, 0,  0, 0,  0, 1, '3'};
    /* gpu */
    cr_expect_eq(without.len, sizeof old_entry);
    cr_expect_eq(memcmp(without.data, old_entry, sizeof old_entry), 0,
                 "the entry's layout before checkpoints");
    /* a group in which only the stall or the drain says something is sent */
    rdzv_rank_stats s2 = RDZV_RANK_STATS_INIT;
    s2.ckpt_drain_left = 1;
    rdzv_buf b2;
    rdzv_buf_init(&b2, 4096);
    cr_assert_eq(rdzv_stats_add(&b2, &s2), GPL_OK);
    walk = (rdzv_bytes){b2.data, (uint32_t)b2.len};
    cr_assert(rdzv_stats_next(&walk, &d));
    cr_expect(d.ckpt_local_step == -1 && d.ckpt_durable_step == -1 && d.ckpt_drain_left == 1);

    /* a group cut short is a malformed entry; a whole one with a newer
     * peer's 4 bytes after it is read up to the fields known */
    uint8_t body[256];
    size_t blen = with.len - 4;
    memcpy(body, with.data + 4, blen);
    rdzv_buf list;
    rdzv_buf_init(&list, 4096);
    for (size_t cut = 1; cut < 28; cut++) {
        list.len = 0;
        rdzv_list_add(&list, body, (uint32_t)(blen - cut));
        walk = (rdzv_bytes){list.data, (uint32_t)list.len};
        cr_expect_not(rdzv_stats_next(&walk, &d), "a group %zu bytes short is taken", cut);
    }
    memcpy(body + blen, "\x01\x02\x03\x04", 4);
    list.len = 0;
    rdzv_list_add(&list, body, (uint32_t)(blen + 4));
    walk = (rdzv_bytes){list.data, (uint32_t)list.len};
    cr_assert(rdzv_stats_next(&walk, &d));
    cr_expect(d.ckpt_local_step == 1ll << 41 && d.ckpt_drain_left == UINT64_MAX - 1);
    /* a negative step other than -1 reads as none */
    list.len = 0;
    memcpy(body, with.data + 4, blen);
    memset(body + blen - 28, 0xff, 7);
    body[blen - 28 + 7] = 0xf0; /* local step -16 */
    rdzv_list_add(&list, body, (uint32_t)blen);
    walk = (rdzv_bytes){list.data, (uint32_t)list.len};
    cr_assert(rdzv_stats_next(&walk, &d));
    cr_expect_eq(d.ckpt_local_step, -1);

    /* the whole STATS message with one entry of each kind */
    rdzv_buf entries, frame;
    rdzv_buf_init(&entries, RDZV_MAX_FRAME);
    rdzv_buf_init(&frame, RDZV_MAX_FRAME + 4);
    rdzv_buf_append(&entries, without.data, without.len);
    rdzv_buf_append(&entries, with.data, with.len);
    rdzv_msg m = {.type = RDZV_STATS}, dm;
    m.u.stats.window_ms = 2000;
    m.u.stats.count = 2;
    m.u.stats.ranks = (rdzv_bytes){entries.data, (uint32_t)entries.len};
    cr_assert_eq(rdzv_encode(&m, &frame), GPL_OK);
    cr_assert_eq(rdzv_decode(frame.data, frame.len, &dm, NULL, 0), GPL_OK);
    walk = dm.u.stats.ranks;
    cr_assert(rdzv_stats_next(&walk, &d));
    cr_expect_eq(d.ckpt_local_step, -1);
    cr_assert(rdzv_stats_next(&walk, &d));
    cr_expect_eq(d.ckpt_local_step, 1ll << 41);
    cr_expect_not(rdzv_stats_next(&walk, &d));

    rdzv_buf_free(&with);
    rdzv_buf_free(&without);
    rdzv_buf_free(&b2);
    rdzv_buf_free(&list);
    rdzv_buf_free(&entries);
    rdzv_buf_free(&frame);
}

Test(codec, encode_refuses_over_limit_fields) {
    rdzv_msg m;
    rdzv_buf b;
    rdzv_buf_init(&b, RDZV_MAX_FRAME * 2);
    memset(&m, 0, sizeof m);
    m.type = RDZV_KV_SET;
    uint8_t *v = calloc(1, RDZV_MAX_VALUE + 1);
    m.u.kv_set.key = B("k");
    m.u.kv_set.value = (rdzv_bytes){v, RDZV_MAX_VALUE + 1};
    cr_expect_eq(rdzv_encode(&m, &b), GPL_ERR_LIMIT);
    cr_expect_eq(b.len, 0, "a failed encode leaves the buffer unchanged");
    m.u.kv_set.value = (rdzv_bytes){v, RDZV_MAX_VALUE};
    cr_expect_eq(rdzv_encode(&m, &b), GPL_OK, "a 1 MiB value fits");
    /* a buffer's own maximum is respected */
    rdzv_buf small;
    rdzv_buf_init(&small, 16);
    cr_expect_eq(rdzv_encode(&m, &small), GPL_ERR_LIMIT);
    free(v);
    rdzv_buf_free(&b);
    rdzv_buf_free(&small);
}

/* Challenge nonces come from a pool: no two are equal, across refills and
 * between a process and the child it forks (the child must not replay the
 * parent's pool), and the HMAC is the one RFC 4231 fixes for HMAC-SHA256. */
Test(auth, nonces_are_unique_across_refills_and_fork) {
    enum { N = 1000 };
    static uint8_t seen[N][RDZV_NONCE_LEN];
    int repeats = 0, failed = 0;
    for (int i = 0; i < N; i++) {
        failed += rdzv_auth_nonce(seen[i]) != 0;
        for (int k = 0; k < i; k++)
            repeats += memcmp(seen[i], seen[k], RDZV_NONCE_LEN) == 0;
    }
    cr_assert_eq(failed, 0);
    cr_assert_eq(repeats, 0, "%d of %d nonces repeat an earlier one", repeats, N);
    uint8_t parent[RDZV_NONCE_LEN], child[RDZV_NONCE_LEN];
    rdzv_auth_nonce(parent); /* the pool now holds the parent's next nonces */
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        uint8_t n[RDZV_NONCE_LEN];
        _exit(rdzv_auth_nonce(n) == 0 && write(pfd[1], n, sizeof n) == (ssize_t)sizeof n ? 0 : 1);
    }
    close(pfd[1]);
    cr_assert_eq(read(pfd[0], child, sizeof child), (ssize_t)sizeof child);
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    rdzv_auth_nonce(parent);
    cr_assert_neq(memcmp(parent, child, RDZV_NONCE_LEN), 0,
                  "the forked child handed out the parent's next nonce");
    close(pfd[0]);
}

Test(auth, hmac_matches_a_reference_value) {
    /* HMAC-SHA256(key "k", 32 zero bytes || "gpulaunch-rdzv-auth-v1"), as
     * computed by `openssl dgst -sha256 -hmac k`. */
    uint8_t nonce[RDZV_NONCE_LEN] = {0}, mac[RDZV_MAC_LEN], again[RDZV_MAC_LEN];
    cr_assert_eq(rdzv_auth_mac("k", 1, nonce, mac), 0);
    cr_assert_eq(rdzv_auth_mac("k", 1, nonce, again), 0);
    cr_assert_eq(memcmp(mac, again, sizeof mac), 0);
    cr_assert(rdzv_auth_check("k", 1, nonce, mac));
    cr_assert_not(rdzv_auth_check("K", 1, nonce, mac));
    char hex[2 * RDZV_MAC_LEN + 1];
    for (int i = 0; i < RDZV_MAC_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", mac[i]);
    cr_assert_str_eq(hex, "788875a205c058d0c48f897a35f1c2709d071cb673ccaaacdecadb5365dab6cc");
}

/* STORY: how a node's workers began a round, every field round trip; a
 * server that takes it says so in its CHALLENGE. */
Test(codec, story_round_trip) {
    rdzv_msg m = {.type = RDZV_STORY, .req_id = 0}, d;
    m.u.story.round = 7;
    m.u.story.kind = RDZV_STORY_RESTART;
    m.u.story.pause_ms = 4210;
    m.u.story.redone = 48;
    m.u.story.nproc = 8;
    snprintf(m.u.story.why, sizeof m.u.story.why, "re-forming in place failed: rank 3 exited");
    m.u.story.source = RDZV_STATE_CHECKPOINT;
    m.u.story.state_step = 200;
    m.u.story.state_bytes = 5ull << 32;
    m.u.story.state_ms = 830;
    rdzv_buf b;
    rdzv_buf_init(&b, 4096);
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    cr_assert_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK);
    cr_expect_eq(d.u.story.round, 7);
    cr_expect_eq(d.u.story.kind, RDZV_STORY_RESTART);
    cr_expect_eq(d.u.story.pause_ms, 4210);
    cr_expect_eq(d.u.story.redone, 48);
    cr_expect_eq(d.u.story.nproc, 8);
    cr_expect_str_eq(d.u.story.why, "re-forming in place failed: rank 3 exited");
    cr_expect_eq(d.u.story.source, RDZV_STATE_CHECKPOINT);
    cr_expect_eq(d.u.story.state_step, 200);
    cr_expect_eq(d.u.story.state_bytes, 5ull << 32);
    cr_expect_eq(d.u.story.state_ms, 830);
    cr_expect_eq(rdzv_decode(b.data, b.len - 1, &d, NULL, 0), GPL_ERR_PROTOCOL, "cut short");
    cr_expect_str_eq(rdzv_type_name(RDZV_STORY), "STORY");
    cr_expect_eq(d.u.story.cause, RDZV_CAUSE_NONE, "no cause without RDZV_STORY_MORE");
    cr_expect_eq(d.u.story.state_root, -1, "no root without RDZV_STORY_MORE");
    /* with the cause and the root: 8 bytes more, read back; without the flag
     * they are bytes no field claims */
    size_t plain = b.len;
    m.flags = RDZV_STORY_MORE;
    m.u.story.cause = RDZV_CAUSE_REFORM_FAILED;
    m.u.story.state_root = 13;
    rdzv_buf_free(&b);
    rdzv_buf_init(&b, 4096);
    cr_assert_eq(rdzv_encode(&m, &b), GPL_OK);
    cr_expect_eq(b.len, plain + 8);
    cr_assert_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_OK);
    cr_expect_eq(d.u.story.cause, RDZV_CAUSE_REFORM_FAILED);
    cr_expect_eq(d.u.story.state_root, 13);
    cr_expect_str_eq(rdzv_restart_cause_name(d.u.story.cause), "reform_failed");
    cr_expect_str_eq(rdzv_restart_cause_name(RDZV_CAUSES), "unknown");
    /* the frame re-framed 4 bytes shorter: the root is missing, not the frame */
    uint32_t body = ((uint32_t)b.data[0] << 24) | ((uint32_t)b.data[1] << 16) |
                    ((uint32_t)b.data[2] << 8) | b.data[3];
    uint8_t cut[4096];
    memcpy(cut, b.data, b.len - 4);
    cut[0] = (uint8_t)((body - 4) >> 24);
    cut[1] = (uint8_t)((body - 4) >> 16);
    cut[2] = (uint8_t)((body - 4) >> 8);
    cut[3] = (uint8_t)(body - 4);
    char why[128] = "";
    cr_expect_eq(rdzv_decode(cut, b.len - 4, &d, why, sizeof why), GPL_ERR_PROTOCOL,
                 "the root cut");
    cr_expect(strstr(why, "bad frame length") == NULL, "refused as a short field, not a frame: %s",
              why);
    b.data[7] = 0; /* the flag cleared: 8 bytes no field claims */
    cr_expect_eq(rdzv_decode(b.data, b.len, &d, NULL, 0), GPL_ERR_PROTOCOL, "trailing bytes");
    rdzv_buf_free(&b);
}
