/* Cloud preemption notices: AWS IMDSv2 spot/instance-action, GCP
 * instance/preempted and maintenance-event, Azure Scheduled Events (Preempt,
 * Terminate). A thread of its own polls with libcurl (loaded with dlopen on
 * first use, so that launches that never poll do not pay for it; a wheel's
 * launcher links it instead, see load_curl), with short
 * timeouts; the launcher's loop hears of a notice through a uv_async and is
 * never blocked. Errors are logged once per streak, not per poll. */
#include "gl_cloud.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "gb_log.h"
#include "gb_time.h"

#define GB_COMPONENT "launcher"

#define CLOUD_BODY_MAX 65536  /* bytes of a metadata reply kept */
#define CLOUD_CONNECT_MS 500  /* metadata services answer locally or not at all */
#define CLOUD_TIMEOUT_MS 2000 /* per request */
#define AWS_WARNING_S 120     /* notice to termination, when the reply has no time */
#define GCP_AZURE_WARNING_S 30

/* The few libcurl entry points used, resolved at run time. */
typedef void CURL;
struct curl_slist;
static struct {
    CURL *(*easy_init)(void);
    int (*easy_setopt)(CURL *, int, ...);
    int (*easy_perform)(CURL *);
    int (*easy_getinfo)(CURL *, int, ...);
    void (*easy_cleanup)(CURL *);
    struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
    void (*slist_free_all)(struct curl_slist *);
} cu;

/* libcurl's option numbers (stable ABI, curl/curl.h) */
enum {
    O_URL = 10002,
    O_HTTPHEADER = 10023,
    O_CUSTOMREQUEST = 10036,
    O_WRITEFUNCTION = 20011,
    O_WRITEDATA = 10001,
    O_TIMEOUT_MS = 155,
    O_CONNECTTIMEOUT_MS = 156,
    O_NOSIGNAL = 99,
    O_NOPROXY = 10177,
    O_HEADERFUNCTION = 20079,
    O_HEADERDATA = 10029,
    I_RESPONSE_CODE = 0x200002
};

struct gl_cloud {
    uv_async_t async;
    pthread_t th;
    atomic_int stop;
    int source;
    char base[512];
    double interval_s;
    gl_cloud_cb cb;
    void *data;
    pthread_mutex_t mu;
    int have_notice;
    char why[512];
    uint64_t deadline_unix_ms;
    int error_logged;
    char gcp_etag[128];
};

typedef struct body {
    char buf[CLOUD_BODY_MAX];
    size_t len;
    char etag[128];  /* the ETag header of the reply, when it had one */
    long timeout_ms; /* 0: CLOUD_TIMEOUT_MS */
} body;

static size_t on_header(char *p, size_t size, size_t n, void *ud) {
    body *b = ud;
    size_t len = size * n;
    if (len > 6 && strncasecmp(p, "ETag:", 5) == 0) {
        const char *v = p + 5;
        while (*v == ' ' && v < p + len)
            v++;
        size_t vl = (size_t)(p + len - v);
        while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n'))
            vl--;
        snprintf(b->etag, sizeof b->etag, "%.*s", (int)vl, v);
    }
    return len;
}

static size_t on_data(char *p, size_t size, size_t n, void *ud) {
    body *b = ud;
    size_t take = size * n;
    if (take > sizeof b->buf - 1 - b->len)
        take = sizeof b->buf - 1 - b->len;
    memcpy(b->buf + b->len, p, take);
    b->len += take;
    b->buf[b->len] = '\0';
    return size * n;
}

static int resolve_curl(void *h) {
    *(void **)&cu.easy_init = dlsym(h, "curl_easy_init");
    *(void **)&cu.easy_setopt = dlsym(h, "curl_easy_setopt");
    *(void **)&cu.easy_perform = dlsym(h, "curl_easy_perform");
    *(void **)&cu.easy_getinfo = dlsym(h, "curl_easy_getinfo");
    *(void **)&cu.easy_cleanup = dlsym(h, "curl_easy_cleanup");
    *(void **)&cu.slist_append = dlsym(h, "curl_slist_append");
    *(void **)&cu.slist_free_all = dlsym(h, "curl_slist_free_all");
    return cu.easy_init && cu.easy_setopt && cu.easy_perform && cu.easy_getinfo &&
                   cu.easy_cleanup && cu.slist_append && cu.slist_free_all
               ? 0
               : -1;
}

static int load_curl(void) {
    /* A launcher built with GPULAUNCH_LINK_CURL (the wheel's: auditwheel only
     * carries the libraries it sees linked) has libcurl loaded already. */
    if (resolve_curl(RTLD_DEFAULT) == 0)
        return 0;
    void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        h = dlopen("libcurl.so", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return -1;
    return resolve_curl(h);
}

/* One request. Returns the HTTP status, or -1 when none came. */
static long http(const char *method, const char *url, const char *h1, const char *h2, body *b,
                 char *err, size_t errlen) {
    CURL *c = cu.easy_init();
    if (c == NULL)
        return -1;
    struct curl_slist *hs = NULL;
    if (h1)
        hs = cu.slist_append(hs, h1);
    if (h2)
        hs = cu.slist_append(hs, h2);
    b->len = 0;
    b->buf[0] = '\0';
    b->etag[0] = '\0';
    cu.easy_setopt(c, O_URL, url);
    cu.easy_setopt(c, O_HEADERFUNCTION, on_header);
    cu.easy_setopt(c, O_HEADERDATA, b);
    cu.easy_setopt(c, O_CUSTOMREQUEST, method);
    cu.easy_setopt(c, O_HTTPHEADER, hs);
    cu.easy_setopt(c, O_WRITEFUNCTION, on_data);
    cu.easy_setopt(c, O_WRITEDATA, b);
    cu.easy_setopt(c, O_TIMEOUT_MS, b->timeout_ms ? b->timeout_ms : (long)CLOUD_TIMEOUT_MS);
    cu.easy_setopt(c, O_CONNECTTIMEOUT_MS, (long)CLOUD_CONNECT_MS);
    cu.easy_setopt(c, O_NOSIGNAL, 1L);
    cu.easy_setopt(c, O_NOPROXY, "*"); /* metadata services are never behind a proxy */
    long code = -1;
    int rc = cu.easy_perform(c);
    if (rc == 0)
        cu.easy_getinfo(c, I_RESPONSE_CODE, &code);
    else
        snprintf(err, errlen, "curl error %d on %s", rc, url);
    cu.slist_free_all(hs);
    cu.easy_cleanup(c);
    return code;
}

static void notice(gl_cloud *g, uint64_t deadline_ms, const char *fmt, const char *detail) {
    pthread_mutex_lock(&g->mu);
    g->have_notice = 1;
    g->deadline_unix_ms = deadline_ms;
    snprintf(g->why, sizeof g->why, fmt, detail);
    pthread_mutex_unlock(&g->mu);
    uv_async_send(&g->async);
}

static uint64_t now_ms_wall(void) { return (uint64_t)(gb_wall_s() * 1000.0); }

/* "2017-09-18T08:22:00Z" -> unix ms; 0 when unparseable. */
static uint64_t parse_iso(const char *s) {
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    if (s == NULL || strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) == NULL)
        return 0;
    return (uint64_t)timegm(&tm) * 1000;
}

/* The string value of "key" in a flat JSON object, into out; NULL if absent. */
static const char *json_str(const char *json, const char *key, char *out, size_t len) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(json, pat);
    if (p == NULL)
        return NULL;
    p = strchr(p + strlen(pat), ':');
    if (p == NULL)
        return NULL;
    p = strchr(p, '"');
    if (p == NULL)
        return NULL;
    const char *e = strchr(p + 1, '"');
    if (e == NULL)
        return NULL;
    snprintf(out, len, "%.*s", (int)(e - p - 1), p + 1);
    return out;
}

static void error_once(gl_cloud *g, const char *what) {
    if (g->error_logged)
        return;
    g->error_logged = 1;
    GB_WARN("preemption notices: %s (logged once; polling goes on)", what);
}

/* One poll of the chosen source: 1 when a notice was found. */
static int poll_once(gl_cloud *g, char *aws_token, size_t toklen) {
    body *b = malloc(sizeof *b);
    if (b == NULL)
        return 0;
    char url[700], err[300] = "", hdr[600];
    int found = 0;
    long code;
    switch (g->source) {
    case GL_CLOUD_AWS:
        if (aws_token[0] == '\0') {
            snprintf(url, sizeof url, "%s/latest/api/token", g->base);
            code = http("PUT", url, "X-aws-ec2-metadata-token-ttl-seconds: 21600", NULL, b, err,
                        sizeof err);
            if (code != 200 || b->len == 0 || b->len >= toklen) {
                error_once(g, err[0] ? err : "AWS IMDSv2 refused a token");
                break;
            }
            snprintf(aws_token, toklen, "%s", b->buf);
        }
        snprintf(url, sizeof url, "%s/latest/meta-data/spot/instance-action", g->base);
        snprintf(hdr, sizeof hdr, "X-aws-ec2-metadata-token: %s", aws_token);
        code = http("GET", url, hdr, NULL, b, err, sizeof err);
        if (code == 401) {
            aws_token[0] = '\0'; /* expired: a new one next time */
        } else if (code == 200) {
            char action[64] = "terminate", when[64] = "";
            json_str(b->buf, "action", action, sizeof action);
            json_str(b->buf, "time", when, sizeof when);
            if (strstr(b->buf, "\"action\"") == NULL) {
                error_once(g, "AWS spot/instance-action answered without an action");
                break;
            }
            uint64_t d = parse_iso(when);
            char detail[160];
            snprintf(detail, sizeof detail, "%s at %s", action, when[0] ? when : "?");
            notice(g, d ? d : now_ms_wall() + AWS_WARNING_S * 1000ull,
                   "AWS spot instance-action %s", detail);
            found = 1;
        } else if (code != 404) {
            error_once(g, err[0] ? err : "AWS spot/instance-action answered oddly");
        } else {
            g->error_logged = 0;
        }
        break;
    case GL_CLOUD_GCP:
        /* a long poll: the reply comes when the value changes, or after the
         * poll interval; the first request learns the current ETag */
        if (g->gcp_etag[0])
            snprintf(url, sizeof url,
                     "%s/computeMetadata/v1/instance/preempted?wait_for_change=true&last_etag=%s"
                     "&timeout_sec=%d",
                     g->base, g->gcp_etag, (int)(g->interval_s < 1 ? 1 : g->interval_s));
        else
            snprintf(url, sizeof url, "%s/computeMetadata/v1/instance/preempted", g->base);
        b->timeout_ms = (long)(g->interval_s * 1000) + CLOUD_TIMEOUT_MS;
        code = http("GET", url, "Metadata-Flavor: Google", NULL, b, err, sizeof err);
        b->timeout_ms = 0;
        snprintf(g->gcp_etag, sizeof g->gcp_etag, "%s", code == 200 ? b->etag : "");
        if (code == 200 && strncmp(b->buf, "TRUE", 4) == 0) {
            notice(g, now_ms_wall() + GCP_AZURE_WARNING_S * 1000ull, "GCP %s",
                   "instance/preempted TRUE");
            found = 1;
            break;
        }
        if (code != 200 || strncmp(b->buf, "FALSE", 5) != 0) {
            error_once(g, err[0] ? err : "GCP instance/preempted answered oddly");
            break;
        }
        snprintf(url, sizeof url, "%s/computeMetadata/v1/instance/maintenance-event", g->base);
        code = http("GET", url, "Metadata-Flavor: Google", NULL, b, err, sizeof err);
        if (code == 200 && strncmp(b->buf, "TERMINATE_ON_HOST_MAINTENANCE", 29) == 0) {
            notice(g, now_ms_wall() + GCP_AZURE_WARNING_S * 1000ull, "GCP %s",
                   "maintenance-event TERMINATE_ON_HOST_MAINTENANCE");
            found = 1;
        } else {
            g->error_logged = 0;
        }
        break;
    case GL_CLOUD_AZURE:
        snprintf(url, sizeof url, "%s/metadata/scheduledevents?api-version=2019-01-01", g->base);
        code = http("GET", url, "Metadata: true", NULL, b, err, sizeof err);
        if (code != 200 || strstr(b->buf, "\"Events\"") == NULL) {
            error_once(g, err[0] ? err : "Azure Scheduled Events answered oddly");
            break;
        }
        g->error_logged = 0;
        const char *kind = strstr(b->buf, "\"Preempt\"")     ? "Preempt"
                           : strstr(b->buf, "\"Terminate\"") ? "Terminate"
                                                             : NULL;
        if (kind) {
            char nb[64] = "";
            json_str(b->buf, "NotBefore", nb, sizeof nb);
            struct tm tm;
            memset(&tm, 0, sizeof tm);
            uint64_t d = 0;
            if (nb[0] && strptime(nb, "%a, %d %b %Y %H:%M:%S", &tm))
                d = (uint64_t)timegm(&tm) * 1000;
            notice(g, d ? d : now_ms_wall() + GCP_AZURE_WARNING_S * 1000ull,
                   "Azure scheduled event %s", kind);
            found = 1;
        }
        break;
    default:
        break;
    }
    free(b);
    return found;
}

/* Which metadata service answers at base (auto); GL_CLOUD_NONE when none. */
static int detect(const char *aws_base, const char *gcp_base) {
    body *b = malloc(sizeof *b);
    if (b == NULL)
        return GL_CLOUD_NONE;
    char url[700], err[300];
    int found = GL_CLOUD_NONE;
    snprintf(url, sizeof url, "%s/latest/api/token", aws_base);
    if (http("PUT", url, "X-aws-ec2-metadata-token-ttl-seconds: 60", NULL, b, err, sizeof err) ==
        200)
        found = GL_CLOUD_AWS;
    if (found == GL_CLOUD_NONE) {
        snprintf(url, sizeof url, "%s/metadata/scheduledevents?api-version=2019-01-01", aws_base);
        if (http("GET", url, "Metadata: true", NULL, b, err, sizeof err) == 200 &&
            strstr(b->buf, "\"Events\""))
            found = GL_CLOUD_AZURE;
    }
    if (found == GL_CLOUD_NONE) {
        snprintf(url, sizeof url, "%s/computeMetadata/v1/instance/preempted", gcp_base);
        if (http("GET", url, "Metadata-Flavor: Google", NULL, b, err, sizeof err) == 200)
            found = GL_CLOUD_GCP;
    }
    free(b);
    return found;
}

static const char *source_name(int s) {
    return s == GL_CLOUD_AWS     ? "AWS"
           : s == GL_CLOUD_GCP   ? "GCP"
           : s == GL_CLOUD_AZURE ? "Azure"
                                 : "none";
}

static void *poller(void *arg) {
    gl_cloud *g = arg;
    if (load_curl() != 0) {
        GB_WARN("preemption notices: libcurl could not be loaded; they come as SIGTERM only");
        return NULL;
    }
    if (g->source == GL_CLOUD_AUTO) {
        int explicit_base = g->base[0] != '\0';
        g->source = detect(explicit_base ? g->base : "http://169.254.169.254",
                           explicit_base ? g->base : "http://metadata.google.internal");
        if (g->source == GL_CLOUD_NONE) {
            GB_INFO("preemption notices: no cloud metadata service answers; they come as "
                    "SIGTERM only");
            return NULL;
        }
    }
    if (g->base[0] == '\0')
        snprintf(g->base, sizeof g->base, "%s",
                 g->source == GL_CLOUD_GCP ? "http://metadata.google.internal"
                                           : "http://169.254.169.254");
    GB_INFO("preemption notices: polling %s metadata at %s every %.1f s", source_name(g->source),
            g->base, g->interval_s);
    char token[4096] = "";
    while (!atomic_load(&g->stop)) {
        if (poll_once(g, token, sizeof token))
            return NULL;
        /* GCP's long poll waited already, when the service gave an ETag */
        if (g->source == GL_CLOUD_GCP && g->gcp_etag[0])
            continue;
        for (double t = 0; t < g->interval_s && !atomic_load(&g->stop); t += 0.05)
            usleep(50000);
    }
    return NULL;
}

static void on_async(uv_async_t *a) {
    gl_cloud *g = a->data;
    pthread_mutex_lock(&g->mu);
    int have = g->have_notice;
    g->have_notice = 0;
    char why[512];
    snprintf(why, sizeof why, "%s", g->why);
    uint64_t d = g->deadline_unix_ms;
    pthread_mutex_unlock(&g->mu);
    if (have && g->cb)
        g->cb(g->data, d, why);
}

int gl_cloud_parse_source(const char *s) {
    static const char *const names[] = {"none", "auto", "aws", "gcp", "azure"};
    for (int i = 0; i < 5; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

gl_cloud *gl_cloud_start(uv_loop_t *loop, int source, const char *endpoint, double interval_s,
                         gl_cloud_cb cb, void *data) {
    if (source == GL_CLOUD_NONE)
        return NULL;
    gl_cloud *g = calloc(1, sizeof *g);
    if (g == NULL)
        return NULL;
    g->source = source;
    g->interval_s = interval_s > 0 ? interval_s : 5;
    g->cb = cb;
    g->data = data;
    if (endpoint && *endpoint) {
        snprintf(g->base, sizeof g->base, "%s", endpoint);
        size_t n = strlen(g->base);
        while (n && g->base[n - 1] == '/')
            g->base[--n] = '\0';
    }
    pthread_mutex_init(&g->mu, NULL);
    uv_async_init(loop, &g->async, on_async);
    g->async.data = g;
    if (pthread_create(&g->th, NULL, poller, g) != 0) {
        uv_close((uv_handle_t *)&g->async, NULL);
        return NULL; /* g leaks with the handle until exit: the launcher goes on */
    }
    pthread_detach(g->th);
    return g;
}
