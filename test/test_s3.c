/* The S3 client (runtime/ckpt/s3/) against a real
 * S3-compatible server: moto's server, started per test from the Python that
 * scripts/s3server.sh makes (GPL_S3_PYTHON), with SigV4 enforced through IAM
 * users, roles and STS, behind test/s3_proxy.py, which counts requests by
 * kind and injects the faults real S3 has (503 SlowDown, 500, a connection
 * reset inside a part, a server gone and back, a clock 20 minutes off).
 * Without GPL_S3_PYTHON the server tests skip, saying how to run them. */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_s3.h"
#include "harness.h"

#define PROXY_PY GPL_SOURCE_DIR "/test/s3_proxy.py"
#define BUCKET "ckpts"
#define MiB (1u << 20)

typedef struct child {
    pid_t pid;
    char log[128];
} child;

static char dir[64];
static const char *py;
static child moto, proxy, imds;
static int moto_port, proxy_port, imds_port;
static char key_id[128], secret[128], role_arn[256], sts_key[128], sts_secret[128];
static char sts_token[CKPT_S3_TOKEN_MAX];

/* ---- processes ------------------------------------------------------------ */

/* Starts argv with its output in dir/<name>.log; it dies with this process. */
static void spawn(child *c, const char *name, char *const argv[]) {
    pid_t parent = getpid();
    snprintf(c->log, sizeof c->log, "%s/%s.log", dir, name);
    c->pid = fork();
    if (c->pid == 0) { /* no Criterion calls here: the runner counts only its own child */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        int fd = open(c->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        setpgid(0, 0);
        execv(argv[0], argv);
        _exit(127);
    }
    cr_assert_gt(c->pid, 0, "fork: %s", strerror(errno));
}

static void stop(child *c) {
    if (c->pid > 0) {
        kill(-c->pid, SIGKILL);
        kill(c->pid, SIGKILL);
        waitpid(c->pid, NULL, 0);
    }
    c->pid = 0;
}

static size_t slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    return n;
}

static void show_log(const child *c) {
    static char buf[4096];
    size_t n = slurp(c->log, buf, sizeof buf);
    fprintf(stderr, "--- %s (%zu bytes) ---\n%s\n", c->log, n, buf);
}

/* The port in "listening on 127.0.0.1:PORT" once c printed it. */
static int wait_listening(child *c) {
    char buf[4096];
    for (int i = 0; i < 200; i++) {
        slurp(c->log, buf, sizeof buf);
        const char *s = strstr(buf, "listening on 127.0.0.1:");
        if (s)
            return (int)strtol(s + strlen("listening on 127.0.0.1:"), NULL, 10);
        usleep(50 * 1000);
    }
    show_log(c);
    cr_assert_fail("%s did not start", c->log);
    return 0;
}

static long http(const char *method, const char *url, const char *const *hdrs, char *out,
                 size_t cap);

static void moto_start(void) {
    char port[16];
    snprintf(port, sizeof port, "%d", moto_port);
    char *const argv[] = {(char *)py, "-m", "moto.server", "-p", port, NULL};
    spawn(&moto, "moto", argv);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/moto-api/", moto_port);
    for (int i = 0; i < 300; i++) {
        if (http("GET", url, NULL, NULL, 0) == 200)
            return;
        usleep(50 * 1000);
    }
    show_log(&moto);
    cr_assert_fail("moto did not answer on port %d", moto_port);
}

static void field(const char *out, const char *name, char *dst, size_t cap) {
    char pat[32];
    snprintf(pat, sizeof pat, "\n%s=", name);
    const char *s = strstr(out, pat);
    cr_assert_not_null(s, "setup printed no %s", name);
    s += strlen(pat);
    size_t n = strcspn(s, "\n");
    cr_assert_lt(n, cap);
    snprintf(dst, cap, "%.*s", (int)n, s);
}

/* IAM user, role, STS credentials and the bucket; then SigV4 enforced. */
static void moto_setup(int enforce, int free_actions) {
    char url[64], nfree[16];
    static char out[16384];
    child c = {0};
    snprintf(url, sizeof url, "http://127.0.0.1:%d", moto_port);
    snprintf(nfree, sizeof nfree, "%d", free_actions);
    char *argv[] = {(char *)py, PROXY_PY, "setup",  "--moto", url,
                    "--bucket", BUCKET,   "--free", nfree,    enforce ? NULL : "--no-enforce",
                    NULL};
    spawn(&c, "setup", argv);
    int st = 0;
    waitpid(c.pid, &st, 0);
    out[0] = '\n';
    slurp(c.log, out + 1, sizeof out - 1);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0 && strstr(out, "SETUP=ok"), "setup: %s", out);
    if (enforce) {
        field(out, "KEY", key_id, sizeof key_id);
        field(out, "SECRET", secret, sizeof secret);
        field(out, "ROLE_ARN", role_arn, sizeof role_arn);
        field(out, "STS_KEY", sts_key, sizeof sts_key);
        field(out, "STS_SECRET", sts_secret, sizeof sts_secret);
        field(out, "STS_TOKEN", sts_token, sizeof sts_token);
    } else {
        snprintf(key_id, sizeof key_id, "AKIAANYTHINGGOES");
        snprintf(secret, sizeof secret, "anything");
    }
    unlink(c.log);
}

/* moto (SigV4 enforced unless !enforce) behind the proxy, and the
 * environment pointing the client at them with the IAM user's key. */
static void servers(int enforce, int free_actions, const char *proxy_clock) {
    char up[16];
    moto_port = free_tcp_port();
    moto_start();
    moto_setup(enforce, free_actions);
    snprintf(up, sizeof up, "%d", moto_port);
    char *const argv[] = {(char *)py,          PROXY_PY, "proxy",
                          "--upstream",        up,       "--clock-offset",
                          (char *)proxy_clock, NULL};
    spawn(&proxy, "proxy", argv);
    proxy_port = wait_listening(&proxy);
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", proxy_port);
    setenv("GPULAUNCH_S3_ENDPOINT", ep, 1);
    setenv("AWS_ACCESS_KEY_ID", key_id, 1);
    setenv("AWS_SECRET_ACCESS_KEY", secret, 1);
}

static const char *const clean_env[] = {"GPULAUNCH_S3_ENDPOINT",
                                        "AWS_ENDPOINT_URL_S3",
                                        "AWS_ENDPOINT_URL",
                                        "AWS_ENDPOINT_URL_STS",
                                        "AWS_ACCESS_KEY_ID",
                                        "AWS_SECRET_ACCESS_KEY",
                                        "AWS_SESSION_TOKEN",
                                        "AWS_WEB_IDENTITY_TOKEN_FILE",
                                        "AWS_ROLE_ARN",
                                        "AWS_ROLE_SESSION_NAME",
                                        "AWS_EC2_METADATA_SERVICE_ENDPOINT",
                                        "GPULAUNCH_S3_PART_BYTES",
                                        "GPULAUNCH_S3_PARALLEL",
                                        "GPULAUNCH_S3_RETRIES",
                                        "GPULAUNCH_S3_CLOCK_OFFSET_S",
                                        "GPULAUNCH_S3_LIST_PAGE",
                                        "AWS_DEFAULT_REGION",
                                        "HTTP_PROXY",
                                        "HTTPS_PROXY",
                                        "ALL_PROXY",
                                        "https_proxy",
                                        "all_proxy",
                                        "http_proxy",
                                        NULL};

static void setup(void) {
    tmpdir_make(dir, sizeof dir, "gpl-s3");
    cr_assert(dir[0]);
    for (int i = 0; clean_env[i]; i++)
        unsetenv(clean_env[i]);
    setenv("AWS_REGION", "us-east-1", 1);
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1); /* no test waits for 169.254.169.254 */
    py = getenv("GPL_S3_PYTHON");
    if (py && (*py == '\0' || access(py, X_OK) != 0))
        py = NULL;
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void teardown(void) {
    stop(&proxy);
    stop(&imds);
    stop(&moto);
    curl_global_cleanup();
    tmpdir_remove(dir);
}

#define NEED_SERVER()                                                                              \
    do {                                                                                           \
        if (py == NULL)                                                                            \
            cr_skip_test("GPL_S3_PYTHON is not set: configure with "                               \
                         "-DGPULAUNCH_S3_PYTHON=$(scripts/s3server.sh | tail -n 1) to test the "   \
                         "S3 client against moto");                                                \
    } while (0)

TestSuite(s3, .init = setup, .fini = teardown, .timeout = 60);

/* ---- HTTP to the helpers ---------------------------------------------------- */

typedef struct sink {
    char *p;
    size_t len, cap;
} sink;

static size_t on_data(char *b, size_t size, size_t n, void *u) {
    sink *s = u;
    size_t len = size * n;
    if (s->p && s->len + len < s->cap) {
        memcpy(s->p + s->len, b, len);
        s->len += len;
        s->p[s->len] = '\0';
    }
    return len;
}

static long http(const char *method, const char *url, const char *const *hdrs, char *out,
                 size_t cap) {
    CURL *c = curl_easy_init();
    struct curl_slist *h = NULL;
    sink s = {.p = out, .cap = cap};
    long code = 0;
    if (out)
        out[0] = '\0';
    for (int i = 0; hdrs && hdrs[i]; i++)
        h = curl_slist_append(h, hdrs[i]);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return code;
}

static void ctl(const char *what) {
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/__proxy/%s", proxy_port, what);
    cr_assert_eq(http("POST", url, NULL, NULL, 0), 200, "proxy control %s", what);
}

static json_t *stats_of(int port, const char *path) {
    char url[128], buf[8192];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    cr_assert_eq(http("GET", url, NULL, buf, sizeof buf), 200);
    json_error_t e;
    json_t *j = json_loads(buf, 0, &e);
    cr_assert_not_null(j, "%s", buf);
    return j;
}

/* stats["a"]["b"] (b NULL: stats["a"]), 0 when absent */
static long stat_of(const char *a, const char *b) {
    json_t *j = stats_of(proxy_port, "/__proxy/stats");
    json_t *v = json_object_get(j, a);
    if (b)
        v = json_object_get(v, b);
    long n = (long)json_integer_value(v);
    json_decref(j);
    return n;
}

/* ---- data ------------------------------------------------------------------------ */

static unsigned char *pattern(size_t n, unsigned seed) {
    unsigned char *b = malloc(n);
    uint64_t x = 0x9E3779B97F4A7C15ull ^ seed;
    cr_assert_not_null(b);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b[i] = (unsigned char)x;
    }
    return b;
}

static int file_with(const char *name, const unsigned char *b, size_t n) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0);
    for (size_t done = 0; done < n;) {
        ssize_t w = write(fd, b + done, n - done);
        cr_assert_gt(w, 0);
        done += (size_t)w;
    }
    return fd;
}

/* Downloads key into a fresh file; 1 when it is b[0, n) bit for bit. */
static int same_as(ckpt_s3 *s, const char *key, const unsigned char *b, size_t n) {
    char path[128];
    gb_err e = GB_ERR_INIT;
    uint64_t size = 0;
    snprintf(path, sizeof path, "%s/back-%s", dir, key);
    for (char *p = path + strlen(dir) + 1; *p; p++)
        if (*p == '/')
            *p = '_';
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "stale tail that must go", 23), 23);
    gpl_result_t rc = ckpt_s3_get_file(s, key, fd, &size, NULL, NULL, &e);
    cr_assert_eq(rc, GPL_OK, "%s", gb_errmsg(&e));
    cr_assert_eq(size, n);
    unsigned char *got = malloc(n + 1);
    ssize_t r = pread(fd, got, n + 1, 0);
    int same = r == (ssize_t)n && memcmp(got, b, n) == 0;
    free(got);
    close(fd);
    unlink(path);
    return same;
}

static ckpt_s3 *open_ok(const char *url) {
    ckpt_s3 *s = NULL;
    gb_err e = GB_ERR_INIT;
    gpl_result_t rc = ckpt_s3_open(url, &s, &e);
    cr_assert_eq(rc, GPL_OK, "open %s: %s", url, gb_errmsg(&e));
    return s;
}

typedef struct prog {
    int calls;
    uint64_t last, total;
    int abort_at; /* return 1 on this call (0: never) */
    void (*hook)(void);
    int hooked;
} prog;

static int on_progress(uint64_t done, uint64_t total, void *user) {
    prog *p = user;
    p->calls++;
    p->last = done;
    p->total = total;
    if (p->hook && !p->hooked && done > 0) {
        p->hooked = 1;
        p->hook();
    }
    return p->abort_at && p->calls >= p->abort_at;
}

typedef struct names {
    int n;
    char name[32][128];
    uint64_t size[32];
} names;

static int on_name(const char *name, uint64_t size, void *user) {
    names *l = user;
    if (l->n < 32) {
        snprintf(l->name[l->n], sizeof l->name[0], "%s", name);
        l->size[l->n++] = size;
    }
    return 0;
}

static int has_name(const names *l, const char *name, uint64_t size) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->name[i], name) == 0 && l->size[i] == size)
            return 1;
    return 0;
}

/* ---- no server needed --------------------------------------------------------------- */

Test(s3, xml_extractor) {
    char out[64];
    const char *x = "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"http://s3\"><KeyCount>2"
                    "</KeyCount><Contents><Key>a&amp;b &lt;c&gt; &quot;d&quot; &apos;e&apos; "
                    "&#233;&#x20AC;</Key><Size>7</Size></Contents><Prefix/>"
                    "<Code>X</Code></ListBucketResult>";
    cr_assert_eq(ckpt_s3_xml_get(x, strlen(x), "Key", out, sizeof out), 21);
    cr_assert_str_eq(out, "a&b <c> \"d\" 'e' \xc3\xa9\xe2\x82\xac");
    cr_assert_eq(ckpt_s3_xml_get(x, strlen(x), "KeyCount", out, sizeof out), 1);
    cr_assert_eq(ckpt_s3_xml_get(x, strlen(x), "Prefix", out, sizeof out), 0); /* <Prefix/> */
    cr_assert_eq(ckpt_s3_xml_get(x, strlen(x), "Size", out, sizeof out), 1);
    cr_assert_eq(ckpt_s3_xml_get(x, strlen(x), "Missing", out, sizeof out), -1);
    /* bounded: what does not fit is refused, not cut */
    cr_assert_eq(ckpt_s3_xml_get(x, strlen(x), "Key", out, 10), -1);
    /* malformed entities, markup in text, an unclosed element */
    static const char *const bad[] = {"<C>a&bogus;b</C>",
                                      "<C>a&#0;</C>",
                                      "<C>&#xD800;</C>",
                                      "<C>a&amp</C>",
                                      "<C>a<b/></C>",
                                      "<C>open",
                                      NULL};
    for (int i = 0; bad[i]; i++)
        cr_assert_eq(ckpt_s3_xml_get(bad[i], strlen(bad[i]), "C", out, sizeof out), -1, "%s",
                     bad[i]);
    /* iteration over repeated elements, as the list reply is read */
    const char *l = "<R><Contents><Key>k1</Key></Contents><Contents><Key>k2</Key></Contents></R>";
    const char *in, *in_end, *after, *p = l;
    int n = 0;
    while (ckpt_s3_xml_find(p, l + strlen(l), "Contents", &in, &in_end, &after) == 0) {
        cr_assert_gt(ckpt_s3_xml_get(in, (size_t)(in_end - in), "Key", out, sizeof out), 0);
        cr_assert_eq(out[1], '1' + n++);
        p = after;
    }
    cr_assert_eq(n, 2);
    cr_assert_eq(ckpt_s3_parse_iso8601("2026-12-02T20:51:17.228758Z"), 1796244677.0);
    cr_assert_eq(ckpt_s3_parse_iso8601("1970-01-01T00:01:00Z"), 60.0);
    cr_assert_lt(ckpt_s3_parse_iso8601("yesterday"), 0);
}

Test(s3, no_credentials_says_what_was_tried) {
    ckpt_s3 *s = NULL;
    gb_err e = GB_ERR_INIT;
    setenv("GPULAUNCH_S3_ENDPOINT", "http://127.0.0.1:9", 1);
    cr_assert_eq(ckpt_s3_open("s3://" BUCKET "/job7", &s, &e), GPL_ERR_AUTH);
    cr_assert_null(s);
    cr_assert(strstr(e.msg, "AWS_ACCESS_KEY_ID") && strstr(e.msg, "AWS_WEB_IDENTITY_TOKEN_FILE") &&
                  strstr(e.msg, "AWS_EC2_METADATA_DISABLED"),
              "%s", e.msg);
    gb_clearerr(&e);
    setenv("AWS_ACCESS_KEY_ID", "AKIAHALF", 1);
    cr_assert_eq(ckpt_s3_open("s3://" BUCKET, &s, &e), GPL_ERR_CONFIG);
    cr_assert(strstr(e.msg, "AWS_SECRET_ACCESS_KEY is not"), "%s", e.msg);
    gb_clearerr(&e);
    setenv("AWS_SECRET_ACCESS_KEY", "x", 1);
    setenv("GPULAUNCH_S3_PART_BYTES", "4MiB", 1);
    cr_assert_eq(ckpt_s3_open("s3://" BUCKET, &s, &e), GPL_ERR_CONFIG);
    cr_assert(strstr(e.msg, "5 MiB"), "%s", e.msg);
    gb_clearerr(&e);
    cr_assert_eq(ckpt_s3_open("s3://bad!bucket/x", &s, &e), GPL_ERR_INVALID_ARG);
    cr_assert_eq(ckpt_s3_open("s3:///x", &s, &e), GPL_ERR_INVALID_ARG);
    cr_assert_eq(ckpt_s3_open("https://bucket/x", &s, &e), GPL_ERR_INVALID_ARG);
}

/* ---- against moto ------------------------------------------------------------------ */

Test(s3, round_trip_put_get_list_delete) {
    NEED_SERVER();
    servers(1, 0, "0");
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7/");
    gb_err e = GB_ERR_INIT;
    char buf[64];
    size_t len = 0;
    const char *odd = "step-000000000120/r0 params+x=1&y;é.bin"; /* encoded in path and query */
    cr_assert_eq(ckpt_s3_put(s, "step-000000000120/manifest", "{\"step\":120}", 12, &e), GPL_OK,
                 "%s", e.msg);
    cr_assert_eq(ckpt_s3_put(s, odd, "odd", 3, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(ckpt_s3_put(s, "step-000000000130/manifest", "", 0, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(ckpt_s3_get(s, "step-000000000120/manifest", buf, sizeof buf, &len, &e), GPL_OK,
                 "%s", e.msg);
    cr_assert_eq(len, 12);
    cr_assert_eq(memcmp(buf, "{\"step\":120}", 12), 0);
    cr_assert_eq(ckpt_s3_get(s, odd, buf, sizeof buf, &len, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(len, 3);
    cr_assert_eq(ckpt_s3_get(s, "step-000000000130/manifest", buf, sizeof buf, &len, &e), GPL_OK);
    cr_assert_eq(len, 0);
    /* a buffer too small is a limit, not a silent cut */
    cr_assert_eq(ckpt_s3_get(s, "step-000000000120/manifest", buf, 5, &len, &e), GPL_ERR_LIMIT);
    cr_assert(strstr(e.msg, "larger than the 5 bytes"), "%s", e.msg);
    gb_clearerr(&e);

    names l = {0};
    cr_assert_eq(ckpt_s3_list(s, "step-", "/", on_name, &l, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(l.n, 2);
    cr_assert(has_name(&l, "step-000000000120/", 0) && has_name(&l, "step-000000000130/", 0));
    memset(&l, 0, sizeof l);
    cr_assert_eq(ckpt_s3_list(s, "step-000000000120/", NULL, on_name, &l, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(l.n, 2);
    cr_assert(has_name(&l, "step-000000000120/manifest", 12) && has_name(&l, odd, 3));
    /* pages: 2 keys a page (GPULAUNCH_S3_LIST_PAGE is the test hook), all 3 seen */
    setenv("GPULAUNCH_S3_LIST_PAGE", "2", 1);
    memset(&l, 0, sizeof l);
    long lists = stat_of("kinds", "ListObjectsV2");
    cr_assert_eq(ckpt_s3_list(s, "", NULL, on_name, &l, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(l.n, 3);
    cr_assert_eq(stat_of("kinds", "ListObjectsV2") - lists, 2);
    unsetenv("GPULAUNCH_S3_LIST_PAGE");

    cr_assert_eq(ckpt_s3_delete(s, odd, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(ckpt_s3_delete(s, odd, &e), GPL_OK, "%s", e.msg); /* gone already: fine */
    cr_assert_eq(ckpt_s3_get(s, odd, buf, sizeof buf, &len, &e), GPL_ERR_NOT_FOUND);
    cr_assert(strstr(e.msg, "NoSuchKey") && strstr(e.msg, "job7/step-000000000120"), "%s", e.msg);
    gb_clearerr(&e);
    uint64_t size = 0;
    cr_assert_eq(ckpt_s3_get_file(s, "nothing-here", 1, &size, NULL, NULL, &e), GPL_ERR_NOT_FOUND);
    ckpt_s3_stats st;
    ckpt_s3_stats_get(s, &st);
    cr_assert_geq(st.requests, 12);
    cr_assert_eq(st.retries, 0);
    cr_assert_geq(st.bytes_up, 12 + 3);
    ckpt_s3_close(s);
}

Test(s3, multipart_in_parallel_and_back_bit_for_bit) {
    NEED_SERVER();
    servers(1, 0, "0");
    setenv("GPULAUNCH_S3_PART_BYTES", "5MiB", 1);
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    size_t n = 40 * MiB;
    unsigned char *b = pattern(n, 1);
    int fd = file_with("params", b, n);
    prog p = {0};
    gb_err e = GB_ERR_INIT;
    ctl("delay-part?ms=100"); /* each part takes long enough to overlap the others */
    cr_assert_eq(ckpt_s3_put_file(s, "step-1/r0-params", fd, n, on_progress, &p, &e), GPL_OK, "%s",
                 e.msg);
    cr_assert_eq(stat_of("kinds", "CreateMultipartUpload"), 1);
    cr_assert_eq(stat_of("kinds", "UploadPart"), 8);
    cr_assert_eq(stat_of("kinds", "CompleteMultipartUpload"), 1);
    /* every request's payload SHA-256 (the bucket check at open, create, 8 parts,
     * complete), as S3 checks it */
    long shas = stat_of("sha_checked", NULL);
    cr_assert_eq(shas, 11, "%ld payload hashes checked", shas);
    cr_assert_eq(stat_of("sha_bad", NULL), 0);
    long inflight = stat_of("max_inflight", "UploadPart");
    cr_assert_gt(inflight, 1, "parts went one at a time");
    cr_assert_gt(p.calls, 0);
    cr_assert_eq(p.last, n);
    cr_assert_eq(p.total, n);
    cr_assert(same_as(s, "step-1/r0-params", b, n));
    cr_assert_eq(stat_of("kinds", "GetObject"), 8); /* ranged GETs of a part each */
    cr_assert_gt(stat_of("max_inflight", "GetObject"), 1);
    ckpt_s3_stats st;
    ckpt_s3_stats_get(s, &st);
    cr_assert_geq(st.bytes_up, n);
    cr_assert_geq(st.bytes_down, n);
    cr_assert_eq(st.retries, 0);
    cr_log_info("40 MiB in 8 parts, %ld at once at most", inflight);
    close(fd);
    free(b);
    ckpt_s3_close(s);
}

Test(s3, slowdown_and_internal_errors_are_retried) {
    NEED_SERVER();
    servers(1, 0, "0");
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    gb_err e = GB_ERR_INIT;
    char buf[16];
    size_t len = 0;
    ctl("fail?code=503&n=3");
    cr_assert_eq(ckpt_s3_put(s, "k", "value", 5, &e), GPL_OK, "%s", e.msg);
    ckpt_s3_stats st;
    ckpt_s3_stats_get(s, &st);
    cr_assert_eq(st.retries, 3);
    cr_assert_eq(stat_of("injected", NULL), 3);
    ctl("fail?code=500&n=2");
    cr_assert_eq(ckpt_s3_get(s, "k", buf, sizeof buf, &len, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(len, 5);
    ckpt_s3_stats_get(s, &st);
    cr_assert_eq(st.retries, 5);
    /* more failures than retries: a clear error, not a hang */
    setenv("GPULAUNCH_S3_RETRIES", "2", 1);
    ckpt_s3 *s2 = open_ok("s3://" BUCKET "/job7");
    ctl("fail?code=503&n=10");
    cr_assert_eq(ckpt_s3_put(s2, "k", "value", 5, &e), GPL_ERR_PROTOCOL);
    cr_assert(strstr(e.msg, "SlowDown (503)") && strstr(e.msg, "failed 3 times"), "%s", e.msg);
    ckpt_s3_close(s2);
    ckpt_s3_close(s);
}

/* A 12 MiB upload in parts of 5, 5 and 2 MiB with one part's fault made by
 * the proxy (control, counted under counter): that part alone is sent again,
 * and the object reads back bit for bit. */
static void one_part_sent_again(const char *control, const char *counter, unsigned seed) {
    NEED_SERVER();
    servers(1, 0, "0");
    setenv("GPULAUNCH_S3_PART_BYTES", "5MiB", 1);
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    size_t n = 12 * MiB;
    unsigned char *b = pattern(n, seed);
    int fd = file_with("opt", b, n);
    gb_err e = GB_ERR_INIT;
    ctl(control);
    cr_assert_eq(ckpt_s3_put_file(s, "step-1/r0-opt", fd, n, NULL, NULL, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(stat_of(counter, NULL), 1);
    cr_assert_eq(stat_of("kinds", "UploadPart"), 4); /* 3 parts, one of them twice */
    cr_assert_eq(stat_of("kinds", "CreateMultipartUpload"), 1);
    ckpt_s3_stats st;
    ckpt_s3_stats_get(s, &st);
    cr_assert_eq(st.retries, 1);
    cr_assert(same_as(s, "step-1/r0-opt", b, n));
    close(fd);
    free(b);
    ckpt_s3_close(s);
}

Test(s3, connection_reset_inside_a_part) { one_part_sent_again("reset-part?n=1", "resets", 2); }

/* A part damaged on its way: the server's hash of the body differs from the
 * signed one (XAmzContentSHA256Mismatch). */
Test(s3, a_part_damaged_on_its_way_is_refused_and_sent_again) {
    one_part_sent_again("corrupt-part?n=1", "corrupted", 4);
    cr_assert_eq(stat_of("sha_bad", NULL), 1);
}

/* CompleteMultipartUpload done by the server but its reply lost: the retry
 * finds no upload (NoSuchUpload), and the object's ETag (MD5 of the parts'
 * ETags) shows it is this upload's: success, nothing uploaded again. */
Test(s3, a_completion_whose_reply_is_lost_is_recognised_by_its_etag) {
    NEED_SERVER();
    servers(1, 0, "0");
    setenv("GPULAUNCH_S3_PART_BYTES", "5MiB", 1);
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    size_t n = 12 * MiB;
    unsigned char *b = pattern(n, 5);
    int fd = file_with("opt", b, n);
    gb_err e = GB_ERR_INIT;
    ctl("lose-complete?n=1");
    cr_assert_eq(ckpt_s3_put_file(s, "step-1/r0-opt", fd, n, NULL, NULL, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(stat_of("replies_lost", NULL), 1);
    cr_assert_eq(stat_of("kinds", "CompleteMultipartUpload"), 2);
    cr_assert_geq(stat_of("kinds", "HeadObject"), 1);
    cr_assert_eq(stat_of("kinds", "CreateMultipartUpload"), 1); /* not started again */
    cr_assert_eq(stat_of("kinds", "UploadPart"), 3);
    cr_assert(same_as(s, "step-1/r0-opt", b, n));
    close(fd);
    free(b);
    ckpt_s3_close(s);
}

/* moto in memory loses everything when it dies: the bucket is made again
 * (as an operator would), the upload id is gone, and the client must start
 * the upload over once, not hang and not claim success. */
static void restart_moto(void) {
    ctl("down");
    stop(&moto);
    moto_start();
    moto_setup(0, 0);
    ctl("up");
}

Test(s3, server_restarted_mid_upload) {
    NEED_SERVER();
    servers(0, 0, "0");
    setenv("GPULAUNCH_S3_PART_BYTES", "5MiB", 1);
    setenv("GPULAUNCH_S3_PARALLEL", "2", 1);
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    size_t n = 20 * MiB;
    unsigned char *b = pattern(n, 3);
    int fd = file_with("params", b, n);
    gb_err e = GB_ERR_INIT;
    prog p = {.hook = restart_moto};
    ctl("delay-part?ms=300"); /* still uploading when the progress function restarts moto */
    gpl_result_t rc = ckpt_s3_put_file(s, "step-1/r0-params", fd, n, on_progress, &p, &e);
    cr_assert(p.hooked, "the upload ended before moto was restarted");
    cr_assert_eq(rc, GPL_OK, "%s", e.msg);
    cr_assert_eq(stat_of("kinds", "CreateMultipartUpload"), 2); /* the second after NoSuchUpload */
    cr_assert_gt(stat_of("down_resets", NULL), 0);
    ctl("delay-part?ms=0");
    cr_assert(same_as(s, "step-1/r0-params", b, n));
    close(fd);
    free(b);
    ckpt_s3_close(s);
}

Test(s3, missing_bucket_is_reported_at_open) {
    NEED_SERVER();
    servers(1, 0, "0");
    ckpt_s3 *s = NULL;
    gb_err e = GB_ERR_INIT;
    cr_assert_eq(ckpt_s3_open("s3://no-such-bucket/job7", &s, &e), GPL_ERR_NOT_FOUND);
    cr_assert_null(s);
    cr_assert(strstr(e.msg, "'no-such-bucket'") && strstr(e.msg, "NoSuchBucket") &&
                  strstr(e.msg, "127.0.0.1") && strstr(e.msg, "s3://no-such-bucket/job7"),
              "%s", e.msg);
}

Test(s3, refused_credentials_name_their_source) {
    NEED_SERVER();
    servers(1, 0, "0");
    ckpt_s3 *s = NULL;
    gb_err e = GB_ERR_INIT;
    setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret", 1);
    cr_assert_eq(ckpt_s3_open("s3://" BUCKET "/job7", &s, &e), GPL_ERR_AUTH);
    cr_assert(strstr(e.msg, "SignatureDoesNotMatch") &&
                  strstr(e.msg, "AWS_ACCESS_KEY_ID (environment)"),
              "%s", e.msg);
    gb_clearerr(&e);
    setenv("AWS_ACCESS_KEY_ID", "AKIANOTAKEYATALL000", 1);
    cr_assert_eq(ckpt_s3_open("s3://" BUCKET "/job7", &s, &e), GPL_ERR_AUTH);
    cr_assert(strstr(e.msg, "InvalidAccessKeyId") && strstr(e.msg, "(environment)"), "%s", e.msg);
    cr_assert_null(s);
}

/* The client's clock 20 minutes slow (the test hook): one refusal, then
 * every request signed with the server's time. */
Test(s3, clock_twenty_minutes_off) {
    NEED_SERVER();
    servers(1, 0, "0");
    setenv("GPULAUNCH_S3_CLOCK_OFFSET_S", "-1200", 1);
    setenv("GPULAUNCH_S3_PART_BYTES", "5MiB", 1);
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    ckpt_s3_stats st;
    ckpt_s3_stats_get(s, &st);
    cr_assert_eq(st.retries, 1);
    cr_assert_eq(stat_of("skew_refused", NULL), 1);
    size_t n = 12 * MiB;
    unsigned char *b = pattern(n, 4);
    int fd = file_with("params", b, n);
    gb_err e = GB_ERR_INIT;
    cr_assert_eq(ckpt_s3_put_file(s, "step-1/r0-params", fd, n, NULL, NULL, &e), GPL_OK, "%s",
                 e.msg);
    cr_assert(same_as(s, "step-1/r0-params", b, n));
    cr_assert_eq(stat_of("skew_refused", NULL), 1);
    ckpt_s3_stats_get(s, &st);
    cr_assert_eq(st.retries, 1);
    cr_assert_eq(stat_of("dup_date", NULL), 0);
    close(fd);
    free(b);
    ckpt_s3_close(s);
}

/* The server's clock 20 minutes ahead: every request is signed at a time
 * that is not this machine's (curl signs through s3_sign_at), which moto
 * checks with SigV4 enforced; one X-Amz-Date header each. */
Test(s3, server_clock_twenty_minutes_ahead) {
    NEED_SERVER();
    servers(1, 0, "1200");
    setenv("GPULAUNCH_S3_PART_BYTES", "5MiB", 1);
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    gb_err e = GB_ERR_INIT;
    size_t n = 11 * MiB, len = 0;
    unsigned char *b = pattern(n, 5);
    int fd = file_with("params", b, n);
    char buf[16];
    cr_assert_eq(ckpt_s3_put(s, "small", "abc", 3, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(ckpt_s3_get(s, "small", buf, sizeof buf, &len, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(ckpt_s3_put_file(s, "big", fd, n, NULL, NULL, &e), GPL_OK, "%s", e.msg);
    cr_assert(same_as(s, "big", b, n));
    names l = {0};
    cr_assert_eq(ckpt_s3_list(s, "", NULL, on_name, &l, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(l.n, 2);
    cr_assert_eq(ckpt_s3_delete(s, "small", &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(stat_of("skew_refused", NULL), 1);
    cr_assert_eq(stat_of("dup_date", NULL), 0);
    ckpt_s3_stats st;
    ckpt_s3_stats_get(s, &st);
    cr_assert_eq(st.retries, 1);
    close(fd);
    free(b);
    ckpt_s3_close(s);
}

/* EKS IRSA: a token file and a role, exchanged at moto's STS (unsigned; the
 * one request moto lets through unauthenticated), then S3 with the role's
 * temporary credentials and session token, checked by moto. */
Test(s3, web_identity_through_sts) {
    NEED_SERVER();
    servers(1, 1, "0");
    char tokfile[128], sts[64];
    snprintf(tokfile, sizeof tokfile, "%s/token", dir);
    FILE *f = fopen(tokfile, "w");
    cr_assert_not_null(f);
    fputs("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6ZGVmYXVsdDpja3B0In0.c2ln\n",
          f);
    fclose(f);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    snprintf(sts, sizeof sts, "http://127.0.0.1:%d", moto_port);
    setenv("AWS_WEB_IDENTITY_TOKEN_FILE", tokfile, 1);
    setenv("AWS_ROLE_ARN", role_arn, 1);
    setenv("AWS_ENDPOINT_URL_STS", sts, 1);
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    gb_err e = GB_ERR_INIT;
    char buf[16];
    size_t len = 0;
    cr_assert_eq(ckpt_s3_put(s, "k", "irsa", 4, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(ckpt_s3_get(s, "k", buf, sizeof buf, &len, &e), GPL_OK, "%s", e.msg);
    cr_assert_eq(len, 4);
    cr_assert_geq(stat_of("with_token", NULL), 3);
    ckpt_s3_close(s);
    /* a role STS does not know: the message names the role and the token file */
    setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/nobody", 1);
    setenv("AWS_WEB_IDENTITY_TOKEN_FILE", "/nonexistent/token", 1);
    s = NULL;
    cr_assert_eq(ckpt_s3_open("s3://" BUCKET "/job7", &s, &e), GPL_ERR_AUTH);
    cr_assert(strstr(e.msg, "/nonexistent/token"), "%s", e.msg);
}

/* The instance role through IMDSv2 from a metadata server that refuses
 * IMDSv1; the credentials claim to expire in 302 s, so 2 s later (inside
 * the 300 s margin) the client fetches them again. */
Test(s3, instance_role_through_imdsv2) {
    NEED_SERVER();
    servers(1, 0, "0");
    char *const argv[] = {(char *)py, PROXY_PY,  "imds",    "--key",        sts_key, "--secret",
                          sts_secret, "--token", sts_token, "--expires-in", "302",   NULL};
    spawn(&imds, "imds", argv);
    imds_port = wait_listening(&imds);
    char ep[64], url[128];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", imds_port);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_EC2_METADATA_DISABLED");
    setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", ep, 1);
    /* IMDSv1 is refused */
    snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/", ep);
    cr_assert_eq(http("GET", url, NULL, NULL, 0), 401);
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    gb_err e = GB_ERR_INIT;
    cr_assert_eq(ckpt_s3_put(s, "k", "imds", 4, &e), GPL_OK, "%s", e.msg);
    json_t *j = stats_of(imds_port, "/__imds/stats");
    cr_assert_eq(json_integer_value(json_object_get(j, "creds_gets")), 1);
    cr_assert_eq(json_integer_value(json_object_get(j, "v1_refused")), 1); /* ours above */
    json_decref(j);
    sleep(3);
    cr_assert_eq(ckpt_s3_put(s, "k", "imds", 4, &e), GPL_OK, "%s", e.msg);
    j = stats_of(imds_port, "/__imds/stats");
    cr_assert_eq(json_integer_value(json_object_get(j, "creds_gets")), 2, "not renewed");
    cr_assert_eq(json_integer_value(json_object_get(j, "v1_refused")), 1);
    json_decref(j);
    cr_assert_geq(stat_of("with_token", NULL), 3);
    ckpt_s3_close(s);
}

typedef struct side {
    ckpt_s3 *s;
    int ok;
    char msg[GB_ERRMSG_MAX];
} side;

static void *small_ops(void *arg) {
    side *t = arg;
    gb_err e = GB_ERR_INIT;
    char key[32], buf[32];
    size_t len = 0;
    t->ok = 1;
    for (int i = 0; i < 10 && t->ok; i++) {
        snprintf(key, sizeof key, "small-%d", i);
        names l = {0};
        t->ok = ckpt_s3_put(t->s, key, key, strlen(key), &e) == GPL_OK &&
                ckpt_s3_get(t->s, key, buf, sizeof buf, &len, &e) == GPL_OK && len == strlen(key) &&
                memcmp(buf, key, len) == 0 &&
                ckpt_s3_list(t->s, "small-", NULL, on_name, &l, &e) == GPL_OK && l.n == i + 1;
    }
    snprintf(t->msg, sizeof t->msg, "%s", gb_errmsg(&e));
    return NULL;
}

Test(s3, one_handle_two_threads) {
    NEED_SERVER();
    servers(1, 0, "0");
    setenv("GPULAUNCH_S3_PART_BYTES", "5MiB", 1);
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    size_t n = 16 * MiB;
    unsigned char *b = pattern(n, 6);
    int fd = file_with("params", b, n);
    side t = {.s = s};
    pthread_t th;
    gb_err e = GB_ERR_INIT;
    cr_assert_eq(pthread_create(&th, NULL, small_ops, &t), 0);
    gpl_result_t rc = ckpt_s3_put_file(s, "big", fd, n, NULL, NULL, &e);
    pthread_join(th, NULL);
    cr_assert_eq(rc, GPL_OK, "%s", e.msg);
    cr_assert(t.ok, "%s", t.msg);
    cr_assert(same_as(s, "big", b, n));
    close(fd);
    free(b);
    ckpt_s3_close(s);
}

Test(s3, aborted_upload_leaves_no_parts) {
    NEED_SERVER();
    servers(0, 0, "0"); /* unsigned requests: the listing below goes to moto directly */
    setenv("GPULAUNCH_S3_PART_BYTES", "5MiB", 1);
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    size_t n = 20 * MiB;
    unsigned char *b = pattern(n, 7);
    int fd = file_with("params", b, n);
    gb_err e = GB_ERR_INIT;
    prog p = {.abort_at = 1};
    ctl("delay-part?ms=200");
    cr_assert_eq(ckpt_s3_put_file(s, "big", fd, n, on_progress, &p, &e), GPL_ERR_TIMEOUT);
    cr_assert(strstr(e.msg, "aborted"), "%s", e.msg);
    /* a part in flight at the abort may be stored after it: checked, sent again */
    cr_assert_geq(stat_of("kinds", "AbortMultipartUpload"), 1);
    cr_assert_geq(stat_of("kinds", "ListParts"), 1);
    cr_assert_eq(stat_of("kinds", "CompleteMultipartUpload"), 0);
    char url[128], *listing = malloc(64 * 1024);
    cr_assert_not_null(listing);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/" BUCKET "?uploads", moto_port);
    /* moto routes a request to its S3 by the credential scope's service */
    const char *const auth[] = {"Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/"
                                "us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0",
                                NULL};
    long code = http("GET", url, auth, listing, 64 * 1024);
    cr_assert_eq(code, 200, "ListMultipartUploads: %ld %s", code, listing);
    cr_assert(strstr(listing, "ListMultipartUploadsResult") && !strstr(listing, "<UploadId>"),
              "an upload is left behind: %s", listing);
    free(listing);
    char buf[4];
    size_t len = 0;
    gb_clearerr(&e);
    cr_assert_eq(ckpt_s3_get(s, "big", buf, sizeof buf, &len, &e), GPL_ERR_NOT_FOUND);
    close(fd);
    free(b);
    ckpt_s3_close(s);
}

/* ---- a training job with S3 as its durable tier -------------------------------- */

#define GL GPL_BUILD_DIR "/launcher/gpulaunch"
#define DP GPL_BUILD_DIR "/examples/dp_train"

/* 2 workers of dp_train with 8 MiB of state each, a checkpoint every 20 steps
 * into `local`, drained to s3://ckpts/job7 (none when !durable). */
/* dp_train, 2 ranks, checkpointing every 20 steps to local and, when durable,
 * draining to s3://BUCKET/job7; grace: the launcher's --shutdown-timeout (NULL:
 * its default). */
static void start_job_grace(proc *p, const char *local, const char *steps, const char *sleep_ms,
                            int durable, const char *grace) {
    char *argv[32];
    int n = 0;
    argv[n++] = GL;
    argv[n++] = "--standalone";
    argv[n++] = "--nproc-per-node";
    argv[n++] = "2";
    if (grace) {
        argv[n++] = "--shutdown-timeout";
        argv[n++] = (char *)grace;
    }
    char *job[] = {DP,   "--steps",          (char *)steps,    "--global-batch",
                   "32", "--print-every",    "100000",         "--state-mib",
                   "8",  "--checkpoint-dir", (char *)local,    "--checkpoint-every",
                   "20", "--step-sleep-ms",  (char *)sleep_ms, NULL};
    for (int i = 0; job[i]; i++)
        argv[n++] = job[i];
    if (durable) {
        argv[n++] = "--checkpoint-durable";
        argv[n++] = "s3://" BUCKET "/job7";
    }
    argv[n] = NULL;
    cr_assert_eq(proc_start(p, argv, NULL), 0);
}

static void start_job(proc *p, const char *local, const char *steps, const char *sleep_ms,
                      int durable) {
    start_job_grace(p, local, steps, sleep_ms, durable, NULL);
}

static void rank0_sha(const proc *p, char out[65]) {
    const char *s = strstr(p->out, "rank 0 params_sha256 ");
    cr_assert_not_null(s, "%s", p->out);
    cr_assert_eq(sscanf(s, "rank 0 params_sha256 %64s", out), 1);
}

Test(s3, a_job_drains_to_s3_goes_on_through_an_outage_and_restores_from_s3_alone, .timeout = 180) {
    NEED_SERVER();
    servers(1, 0, "0");
    setenv("GPULAUNCH_S3_PART_BYTES", "5242880", 1); /* 8 MiB a rank: a multipart upload */
    setenv("GPULAUNCH_S3_RETRIES", "2", 1);
    char local[128], ref[128], cmd[300];
    snprintf(local, sizeof local, "%s/nvme", dir);
    snprintf(ref, sizeof ref, "%s/ref", dir);
    ctl("fail?code=503&n=3"); /* SlowDown at first: retried */
    proc p;
    start_job(&p, local, "150", "30", 1);
    cr_assert(proc_expect(&p, "durable: every rank", 30000), "%s", p.out);
    ctl("down"); /* S3 gone for a second while the job trains: drains fail, training goes on */
    usleep(1200000);
    ctl("up");
    int st = proc_wait(&p, 90000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "drain to the durable tier of step") != NULL &&
                  strstr(p.out, "training goes on") != NULL,
              "a drain failed during the outage, said with the tier: %s", p.out);
    /* the last checkpoint (step 140), made complete in S3 by gpl_ckpt_wait */
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    char buf[128];
    size_t len = 0;
    gb_err e = GB_ERR_INIT;
    cr_assert_eq(ckpt_s3_get(s, "step-000000000140/COMPLETE", buf, sizeof buf, &len, &e), GPL_OK,
                 "%s", e.msg);
    ckpt_s3_close(s);
    /* every local disk gone: the job restores from S3 alone, bitwise */
    snprintf(cmd, sizeof cmd, "rm -rf %s", local);
    cr_assert_eq(system(cmd), 0);
    start_job(&p, local, "140", "0", 1);
    st = proc_wait(&p, 60000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "resumed from the checkpoint of step 140") != NULL, "%s", p.out);
    cr_expect(strstr(p.out, "fetched from the durable tier s3://" BUCKET "/job7") != NULL, "%s",
              p.out);
    char got[65], want[65];
    rank0_sha(&p, got);
    start_job(&p, ref, "140", "0", 0); /* the same 140 steps, never interrupted */
    st = proc_wait(&p, 60000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    rank0_sha(&p, want);
    cr_expect_str_eq(got, want, "restored from S3 %s, uninterrupted %s", got, want);
}

/* A notice whose drain to S3 cannot finish before the deadline (every part
 * held up at the server): the launcher still exits 143 within the grace, says
 * which step is the newest durable one, and S3 holds no COMPLETE marker of the
 * preempted step: a job without its disks restores that older step. */
Test(s3, a_notice_whose_drain_outlasts_the_deadline_names_the_newest_durable_step, .timeout = 180) {
    NEED_SERVER();
    servers(1, 0, "0");
    setenv("GPULAUNCH_S3_PART_BYTES", "5242880", 1);
    setenv("GPULAUNCH_S3_RETRIES", "2", 1);
    char local[128], cmd[300];
    snprintf(local, sizeof local, "%s/nvme", dir);
    proc p;
    start_job_grace(&p, local, "100000", "30", 1, "6");
    cr_assert(proc_expect(&p, "durable: every rank", 30000), "%s", p.out);
    ctl("delay-part?ms=30000"); /* from now on no part reaches S3 in time */
    usleep(1500000);
    uint64_t t0 = now_ms();
    kill(p.pid, SIGTERM);
    int st = proc_wait(&p, 30000);
    uint64_t took = now_ms() - t0;
    ctl("delay-part?ms=0");
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 143, "status %d after %llu ms: %s", st,
              (unsigned long long)took, p.out);
    /* the workers end themselves: the drain in flight is dropped at the deadline */
    cr_expect(took < 6000 && strstr(p.out, "sending SIGKILL") == NULL,
              "exit %llu ms after the notice (grace 6 s): %s", (unsigned long long)took, p.out);
    const char *w = strstr(p.out, " written on this node but not durable before the deadline");
    cr_assert_not_null(w, "%s", p.out);
    long written = -1, durable = -1;
    while (w > p.out && strncmp(w, "checkpoint: step ", 17) != 0)
        w--;
    sscanf(w, "checkpoint: step %ld", &written);
    const char *d = strstr(p.out, "the newest durable step is ");
    cr_assert_not_null(d, "%s", p.out);
    sscanf(d, "the newest durable step is %ld", &durable);
    cr_assert(written > durable && durable >= 20, "written %ld, durable %ld: %s", written, durable,
              p.out);
    cr_log_info("notice with S3 held up: exit 143 after %llu ms (grace 6 s), step %ld written "
                "locally, newest durable step %ld",
                (unsigned long long)took, written, durable);
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    char key[96], buf[128];
    size_t len = 0;
    gb_err e = GB_ERR_INIT;
    snprintf(key, sizeof key, "step-%012ld/COMPLETE", written);
    cr_expect_neq(ckpt_s3_get(s, key, buf, sizeof buf, &len, &e), GPL_OK,
                  "the undrained step %ld is marked COMPLETE in S3", written);
    snprintf(key, sizeof key, "step-%012ld/COMPLETE", durable);
    cr_expect_eq(ckpt_s3_get(s, key, buf, sizeof buf, &len, &e), GPL_OK, "%s", e.msg);
    ckpt_s3_close(s);
    /* every local disk gone: the newest durable step is what comes back */
    snprintf(cmd, sizeof cmd, "rm -rf %s", local);
    cr_assert_eq(system(cmd), 0);
    char steps[32], want[96];
    snprintf(steps, sizeof steps, "%ld", durable);
    start_job(&p, local, steps, "0", 1);
    st = proc_wait(&p, 60000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    snprintf(want, sizeof want, "resumed from the checkpoint of step %ld", durable);
    cr_expect(strstr(p.out, want) != NULL, "%s", p.out);
}
