/* The S3 tests' fixture: s3_fixture.h. */
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
#include "s3_fixture.h"

char dir[64];
const char *py;
child moto, proxy, imds;
int moto_port, proxy_port, imds_port;
char key_id[128], secret[128], role_arn[256], sts_key[128], sts_secret[128];
char sts_token[CKPT_S3_TOKEN_MAX];

/* ---- processes ------------------------------------------------------------ */

/* Starts argv with its output in dir/<name>.log; it dies with this process. */
void spawn(child *c, const char *name, char *const argv[]) {
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

void stop(child *c) {
    if (c->pid > 0) {
        kill(-c->pid, SIGKILL);
        kill(c->pid, SIGKILL);
        waitpid(c->pid, NULL, 0);
    }
    c->pid = 0;
}

size_t slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    return n;
}

void show_log(const child *c) {
    static char buf[4096];
    size_t n = slurp(c->log, buf, sizeof buf);
    fprintf(stderr, "--- %s (%zu bytes) ---\n%s\n", c->log, n, buf);
}

/* The port in "listening on 127.0.0.1:PORT" once c printed it. */
int wait_listening(child *c) {
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

void moto_start(void) {
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
void moto_setup(int enforce, int free_actions) {
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
void servers(int enforce, int free_actions, const char *proxy_clock) {
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

void setup(void) {
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

void teardown(void) {
    stop(&proxy);
    stop(&imds);
    stop(&moto);
    curl_global_cleanup();
    tmpdir_remove(dir);
}

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

long http(const char *method, const char *url, const char *const *hdrs, char *out, size_t cap) {
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

void ctl(const char *what) {
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/__proxy/%s", proxy_port, what);
    cr_assert_eq(http("POST", url, NULL, NULL, 0), 200, "proxy control %s", what);
}

json_t *stats_of(int port, const char *path) {
    char url[128], buf[8192];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    cr_assert_eq(http("GET", url, NULL, buf, sizeof buf), 200);
    json_error_t e;
    json_t *j = json_loads(buf, 0, &e);
    cr_assert_not_null(j, "%s", buf);
    return j;
}

/* stats["a"]["b"] (b NULL: stats["a"]), 0 when absent */
long stat_of(const char *a, const char *b) {
    json_t *j = stats_of(proxy_port, "/__proxy/stats");
    json_t *v = json_object_get(j, a);
    if (b)
        v = json_object_get(v, b);
    long n = (long)json_integer_value(v);
    json_decref(j);
    return n;
}

/* ---- data ------------------------------------------------------------------------ */

unsigned char *pattern(size_t n, unsigned seed) {
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

int file_with(const char *name, const unsigned char *b, size_t n) {
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
int same_as(ckpt_s3 *s, const char *key, const unsigned char *b, size_t n) {
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

ckpt_s3 *open_ok(const char *url) {
    ckpt_s3 *s = NULL;
    gb_err e = GB_ERR_INIT;
    gpl_result_t rc = ckpt_s3_open(url, &s, &e);
    cr_assert_eq(rc, GPL_OK, "open %s: %s", url, gb_errmsg(&e));
    return s;
}
