/* A job's key-value store (rdzv_kv.c) on its own: each request's reply, the
 * byte limit, growth past many keys, and waiters woken once their keys are
 * all set. test_rdzv.c covers the same store through a real server. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "rdzv_kv.h"

static rdzv_kv kv;
static rdzv_buf scratch;
static rdzv_msg r;

static void init(void) {
    rdzv_kv_init(&kv, 4096);
    rdzv_buf_init(&scratch, RDZV_MAX_FRAME - 64);
}

static void fini(void) {
    rdzv_waiter *w;
    while ((w = LIST_FIRST(&kv.waiters)) != NULL)
        rdzv_kv_waiter_free(w);
    rdzv_kv_clear(&kv);
    rdzv_buf_free(&scratch);
}

TestSuite(kv, .init = init, .fini = fini, .timeout = 30);

static rdzv_bytes b(const char *s) { return (rdzv_bytes){(const uint8_t *)s, (uint32_t)strlen(s)}; }

static int set(const char *k, const char *v) {
    rdzv_msg m = {.type = RDZV_KV_SET, .req_id = 1};
    m.u.kv_set.key = b(k);
    m.u.kv_set.value = b(v);
    return rdzv_kv_request(&kv, "j", &m, &r, &scratch);
}

static const char *get(const char *k) {
    static char out[256];
    rdzv_msg m = {.type = RDZV_KV_GET, .req_id = 2};
    m.u.kv_key.key = b(k);
    rdzv_kv_request(&kv, "j", &m, &r, &scratch);
    cr_assert_eq(r.type, RDZV_VALUE);
    if (!r.u.value.found)
        return NULL;
    snprintf(out, sizeof out, "%.*s", (int)r.u.value.value.len, (const char *)r.u.value.value.p);
    return out;
}

Test(kv, set_get_add_cas_del) {
    cr_assert_eq(set("a", "1"), 1);
    cr_assert_eq(r.type, RDZV_OK);
    cr_assert_eq(r.req_id, 1);
    cr_assert_str_eq(get("a"), "1");
    cr_assert_null(get("b"));
    rdzv_msg add = {.type = RDZV_KV_ADD};
    add.u.kv_add.key = b("a");
    add.u.kv_add.delta = 41;
    cr_assert_eq(rdzv_kv_request(&kv, "j", &add, &r, &scratch), 1);
    cr_assert(r.type == RDZV_INT && r.u.int_.ok && r.u.int_.value == 42);
    add.u.kv_add.key = b("fresh");
    add.u.kv_add.delta = -3;
    rdzv_kv_request(&kv, "j", &add, &r, &scratch);
    cr_assert_eq(r.u.int_.value, -3);
    set("text", "abc");
    add.u.kv_add.key = b("text");
    cr_assert_eq(rdzv_kv_request(&kv, "j", &add, &r, &scratch), 0);
    cr_assert(r.type == RDZV_ERROR && strstr(r.u.error.message, "'abc', not a decimal integer"),
              "%s", r.u.error.message);
    rdzv_msg cas = {.type = RDZV_KV_CAS};
    cas.u.kv_cas.key = b("a");
    cas.u.kv_cas.expected = b("41");
    cas.u.kv_cas.desired = b("x");
    cr_assert_eq(rdzv_kv_request(&kv, "j", &cas, &r, &scratch), 0);
    cr_assert(r.type == RDZV_INT && !r.u.int_.ok);
    cas.u.kv_cas.expected = b("42");
    cr_assert_eq(rdzv_kv_request(&kv, "j", &cas, &r, &scratch), 1);
    cr_assert_str_eq(get("a"), "x");
    cas.u.kv_cas.key = b("new");
    cas.u.kv_cas.expect_absent = 1;
    cr_assert_eq(rdzv_kv_request(&kv, "j", &cas, &r, &scratch), 1);
    cr_assert_eq(rdzv_kv_request(&kv, "j", &cas, &r, &scratch), 0, "present now");
    rdzv_msg del = {.type = RDZV_KV_DEL};
    del.u.kv_key.key = b("a");
    rdzv_kv_request(&kv, "j", &del, &r, &scratch);
    cr_assert_null(get("a"));
    cr_assert_eq(kv.count, 3); /* fresh, text, new */
}

Test(kv, the_byte_limit_and_many_keys) {
    char k[32], v[8];
    for (int i = 0; i < 200; i++) {
        snprintf(k, sizeof k, "key-%03d", i);
        snprintf(v, sizeof v, "%d", i);
        cr_assert_eq(set(k, v), 1, "%d: %s", i, r.u.error.message);
    }
    cr_assert_eq(kv.count, 200);
    cr_assert_str_eq(get("key-137"), "137");
    uint64_t used = kv.bytes;
    char big[4096];
    memset(big, 'v', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cr_assert_eq(set("big", big), 0);
    cr_assert(r.type == RDZV_ERROR && r.u.error.code == GPL_ERR_LIMIT &&
                  strstr(r.u.error.message, "limit 4096") &&
                  strstr(r.u.error.message, "--max-job-kv-bytes"),
              "%s", r.u.error.message);
    cr_assert_eq(kv.bytes, used, "a refused set changes nothing");
    rdzv_kv_clear(&kv);
    cr_assert(kv.count == 0 && kv.bytes == 0 && get("key-001") == NULL);
}

static LIST_HEAD(, rdzv_waiter) owners = LIST_HEAD_INITIALIZER(owners);
static int woken[4];
static void ready(rdzv_waiter *w, void *ctx) {
    (void)ctx;
    woken[(intptr_t)w->owner]++;
    rdzv_kv_waiter_free(w);
}

static rdzv_waiter *wait_for(int owner, const char *k1, const char *k2) {
    rdzv_buf keys;
    rdzv_buf_init(&keys, 4096);
    cr_assert_eq(rdzv_list_add(&keys, k1, (uint32_t)strlen(k1)), GPL_OK);
    uint32_t n = 1;
    if (k2) {
        cr_assert_eq(rdzv_list_add(&keys, k2, (uint32_t)strlen(k2)), GPL_OK);
        n++;
    }
    rdzv_msg m = {.type = RDZV_KV_WAIT, .req_id = 9};
    m.u.kv_keys.nkeys = n;
    m.u.kv_keys.timeout_ms = 500;
    m.u.kv_keys.keys = (rdzv_bytes){keys.data, (uint32_t)keys.len};
    rdzv_waiter *w = rdzv_kv_waiter_new(&kv, (void *)(intptr_t)owner, &m, 1000);
    rdzv_buf_free(&keys); /* the waiter keeps its own copy */
    cr_assert_not_null(w);
    LIST_INSERT_HEAD(&owners, w, olink); /* the owning connection's list */
    return w;
}

Test(kv, waiters_wake_when_all_their_keys_are_set_and_multi_get) {
    rdzv_waiter *w1 = wait_for(1, "x", "y");
    wait_for(2, "y", NULL);
    cr_assert_eq(w1->deadline_ms, 1500);
    rdzv_bytes first;
    cr_assert_eq(rdzv_kv_missing(&kv, w1, &first), 2);
    cr_assert(first.len == 1 && first.p[0] == 'x');
    set("y", "1");
    rdzv_kv_wake(&kv, ready, NULL);
    cr_assert(woken[1] == 0 && woken[2] == 1);
    set("x", "2");
    rdzv_kv_wake(&kv, ready, NULL);
    cr_assert(woken[1] == 1 && woken[2] == 1 && LIST_EMPTY(&kv.waiters));
    rdzv_buf keys;
    rdzv_buf_init(&keys, 4096);
    rdzv_list_add(&keys, "x", 1);
    rdzv_list_add(&keys, "nope", 4);
    rdzv_msg mg = {.type = RDZV_KV_MGET};
    mg.u.kv_keys.nkeys = 2;
    mg.u.kv_keys.keys = (rdzv_bytes){keys.data, (uint32_t)keys.len};
    rdzv_kv_request(&kv, "j", &mg, &r, &scratch);
    cr_assert(r.type == RDZV_VALUES && r.u.values.count == 2);
    rdzv_bytes walk = r.u.values.items, v;
    int found;
    cr_assert(rdzv_values_next(&walk, &found, &v) && found && v.len == 1 && v.p[0] == '2');
    cr_assert(rdzv_values_next(&walk, &found, &v) && !found);
    rdzv_buf_free(&keys);
}
