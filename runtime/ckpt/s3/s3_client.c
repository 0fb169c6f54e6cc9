/* The S3 handle (open, close, the pool of curl handles, statistics) and
 * whole objects: put, get, head, delete, list. */
#define GB_COMPONENT "s3"

#include "s3_int.h"

static pthread_once_t s3_once = PTHREAD_ONCE_INIT;
static CURLcode s3_init_rc = CURLE_OK;

static void s3_global_init(void) { s3_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

/* ---- the handle ----------------------------------------------------------- */

CURL *s3_easy_get(ckpt_s3 *s) {
    CURL *c = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->npool > 0)
        c = s->pool[--s->npool];
    pthread_mutex_unlock(&s->mu);
    return c ? c : curl_easy_init();
}

void s3_easy_put(ckpt_s3 *s, CURL *c) {
    if (c == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    if (s->npool < S3_POOL_MAX) {
        s->pool[s->npool++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    if (c)
        curl_easy_cleanup(c);
}

/* The whole key of name under the handle's prefix into out. */
gpl_result_t s3_key(const ckpt_s3 *s, const char *name, char *out, gb_err *err) {
    if (name == NULL || *name == '\0')
        return gb_seterr(err, GPL_ERR_INVALID_ARG, "S3: an empty key in bucket '%s'", s->bucket);
    int n = snprintf(out, S3_KEY_MAX, "%s%s", s->prefix, name);
    if (n < 0 || n >= S3_KEY_MAX)
        return gb_seterr(err, GPL_ERR_LIMIT, "S3 key '%s%s' is longer than S3's %d bytes",
                         s->prefix, name, S3_KEY_MAX - 1);
    return GPL_OK;
}

static const char *s3_first_env(const char *const *names, const char **which) {
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) {
            *which = names[i];
            return v;
        }
    }
    return NULL;
}

/* Bucket names as S3 and S3-compatible servers accept them. */
static int s3_bucket_ok(const char *b, size_t n) {
    if (n < 1 || n >= S3_BUCKET_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= 'A' && b[i] <= 'Z') ||
              (b[i] >= '0' && b[i] <= '9') || b[i] == '.' || b[i] == '-' || b[i] == '_'))
            return 0;
    return 1;
}

gpl_result_t ckpt_s3_open(const char *url, ckpt_s3 **out, gb_err *err) {
    static const char *const endpoint_env[] = {"GPULAUNCH_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3",
                                               "AWS_ENDPOINT_URL", NULL};
    static const char *const region_env[] = {"AWS_REGION", "AWS_DEFAULT_REGION", NULL};
    gpl_result_t rc = GPL_OK;
    ckpt_s3 *s = NULL;
    CURL *c = NULL;
    s3_req *r = NULL;
    const char *which = NULL;
    *out = NULL;
    pthread_once(&s3_once, s3_global_init);
    if (s3_init_rc != CURLE_OK)
        return gb_seterr(err, GPL_ERR_SYSTEM, "S3: curl_global_init failed: %s",
                         curl_easy_strerror(s3_init_rc));
    if (url == NULL || strncmp(url, "s3://", 5) != 0)
        return gb_seterr(err, GPL_ERR_INVALID_ARG,
                         "S3 URL '%s' does not start with s3:// (s3://bucket/prefix)",
                         url ? url : "(null)");
    s = calloc(1, sizeof *s);
    if (s == NULL)
        return gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
    pthread_mutex_init(&s->mu, NULL);
    snprintf(s->url, sizeof s->url, "%s", url);
    const char *b = url + 5;
    size_t bl = strcspn(b, "/");
    if (!s3_bucket_ok(b, bl)) {
        rc = gb_seterr(err, GPL_ERR_INVALID_ARG,
                       "S3 URL '%s': '%.*s' is not a bucket name (1-63 of a-z 0-9 . - _)", url,
                       (int)bl, b);
        goto out;
    }
    snprintf(s->bucket, sizeof s->bucket, "%.*s", (int)bl, b);
    const char *p = b + bl;
    while (*p == '/')
        p++;
    size_t pl = strlen(p);
    while (pl > 0 && p[pl - 1] == '/')
        pl--;
    if (pl + 2 > sizeof s->prefix) {
        rc = gb_seterr(err, GPL_ERR_LIMIT, "S3 URL '%s': the prefix is longer than %d bytes", url,
                       S3_KEY_MAX - 2);
        goto out;
    }
    snprintf(s->prefix, sizeof s->prefix, "%.*s%s", (int)pl, p, pl ? "/" : "");

    const char *rg = s3_first_env(region_env, &which);
    snprintf(s->region, sizeof s->region, "%s", rg ? rg : "us-east-1");
    snprintf(s->sigv4, sizeof s->sigv4, "aws:amz:%s:s3", s->region);
    const char *ep = s3_first_env(endpoint_env, &which);
    if (ep) {
        size_t el = strlen(ep);
        while (el > 0 && ep[el - 1] == '/')
            el--;
        const char *host = strstr(ep, "://");
        if ((strncmp(ep, "http://", 7) != 0 && strncmp(ep, "https://", 8) != 0) ||
            el + 1 > sizeof s->endpoint || host == NULL ||
            memchr(host + 3, '/', el - (size_t)(host + 3 - ep)) != NULL || host + 3 == ep + el) {
            rc = gb_seterr(err, GPL_ERR_CONFIG,
                           "%s='%s' is not an endpoint URL (http[s]://host[:port])", which, ep);
            goto out;
        }
        snprintf(s->endpoint, sizeof s->endpoint, "%.*s", (int)el, ep);
        s->path_style = 1; /* S3-compatible servers: path-style URLs */
    } else {
        snprintf(s->endpoint, sizeof s->endpoint, "https://s3.%s.amazonaws.com", s->region);
        /* a name that is not a DNS label (a dot would not match the *.s3 TLS
         * certificate) goes in the path */
        s->path_style = strspn(s->bucket, "abcdefghijklmnopqrstuvwxyz0123456789-") != bl;
    }

    long parallel, retries, hook;
    if (s3_env_size("GPULAUNCH_S3_PART_BYTES", S3_PART_DEFAULT, &s->part_bytes) != 0 ||
        s->part_bytes < S3_PART_MIN || s->part_bytes > S3_PART_LIMIT) {
        rc = gb_seterr(err, GPL_ERR_CONFIG,
                       "GPULAUNCH_S3_PART_BYTES='%s': give bytes (k/m/g suffixes allowed) from "
                       "5 MiB (S3's smallest part) to 5 GiB",
                       getenv("GPULAUNCH_S3_PART_BYTES"));
        goto out;
    }
    if (s3_env_long("GPULAUNCH_S3_PARALLEL", S3_PARALLEL_DEFAULT, 1, S3_PARALLEL_MAX, &parallel) ||
        s3_env_long("GPULAUNCH_S3_RETRIES", S3_RETRIES_DEFAULT, 0, S3_RETRIES_MAX, &retries) ||
        s3_env_long("GPULAUNCH_S3_CLOCK_OFFSET_S", 0, -86400L * 365, 86400L * 365, &hook)) {
        rc = gb_seterr(err, GPL_ERR_CONFIG,
                       "GPULAUNCH_S3_PARALLEL (1-%d), GPULAUNCH_S3_RETRIES (0-%d) or "
                       "GPULAUNCH_S3_CLOCK_OFFSET_S (seconds) is not a number in range",
                       S3_PARALLEL_MAX, S3_RETRIES_MAX);
        goto out;
    }
    s->parallel = (int)parallel;
    s->retries = (int)retries;
    s->clock_hook_s = hook;
    GB_CHECK_GOTO(ckpt_s3_creds_resolve(s->region, &s->creds, err), rc, out);

    /* one request that proves bucket, credentials and region now, not at the
     * first checkpoint: ListObjectsV2 of one key under the prefix */
    c = s3_easy_get(s);
    r = malloc(sizeof *r);
    if (c == NULL || r == NULL) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
        goto out;
    }
    if (curl_easy_setopt(c, CURLOPT_AWS_SIGV4, s->sigv4) != CURLE_OK) {
        rc = gb_seterr(err, GPL_ERR_UNSUPPORTED,
                       "S3: this libcurl (%s) cannot sign for AWS (CURLOPT_AWS_SIGV4, 7.75+)",
                       curl_version());
        goto out;
    }
    s3_req_init(r, "ListObjectsV2", "GET", NULL);
    if (s3_qadd(r->query, sizeof r->query, "list-type", "2") ||
        s3_qadd(r->query, sizeof r->query, "max-keys", "1") ||
        s3_qadd(r->query, sizeof r->query, "prefix", s->prefix)) {
        rc = gb_seterr(err, GPL_ERR_LIMIT, "S3: the prefix of '%s' is too long", url);
        goto out;
    }
    GB_CHECK_GOTO(s3_do(s, c, r, err), rc, out);
    GB_INFO("%s at %s (region %s, %s-style), credentials from %s", url, s->endpoint, s->region,
            s->path_style ? "path" : "virtual-hosted", s->creds.source);
out:
    free(r);
    if (rc == GPL_OK) {
        s3_easy_put(s, c);
        *out = s;
    } else {
        if (c)
            curl_easy_cleanup(c);
        ckpt_s3_close(s);
    }
    return rc;
}

void ckpt_s3_close(ckpt_s3 *s) {
    if (s == NULL)
        return;
    for (int i = 0; i < s->npool; i++)
        curl_easy_cleanup(s->pool[i]);
    pthread_mutex_destroy(&s->mu);
    /* the secret does not linger in freed memory */
    memset(&s->creds, 0, sizeof s->creds);
    free(s);
}

void ckpt_s3_stats_get(ckpt_s3 *s, ckpt_s3_stats *out) {
    out->requests = atomic_load(&s->requests);
    out->retries = atomic_load(&s->retries_done);
    out->bytes_up = atomic_load(&s->bytes_up);
    out->bytes_down = atomic_load(&s->bytes_down);
}

/* ---- whole objects ---------------------------------------------------------- */

/* A request of op (also its method) on name's whole key, and a curl handle to
 * send it: the caller gives both back (s3_easy_put, free) whatever the result. */
static gpl_result_t begin(ckpt_s3 *s, const char *op, const char *name, char *full, s3_req **r,
                          CURL **c, gb_err *err) {
    *c = NULL;
    if ((*r = malloc(sizeof **r)) == NULL)
        return gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
    gpl_result_t rc = s3_key(s, name, full, err);
    if (rc != GPL_OK)
        return rc;
    s3_req_init(*r, op, op, full);
    if ((*c = s3_easy_get(s)) == NULL)
        return gb_seterr(err, GPL_ERR_NOMEM, "S3: no curl handle");
    return GPL_OK;
}

gpl_result_t ckpt_s3_put(ckpt_s3 *s, const char *key, const void *buf, size_t len, gb_err *err) {
    char full[S3_KEY_MAX];
    unsigned char d[32];
    gpl_result_t rc = GPL_OK;
    CURL *c = NULL;
    s3_req *r = NULL;
    GB_CHECK_GOTO(begin(s, "PUT", key, full, &r, &c, err), rc, out);
    if (len > S3_PART_LIMIT) {
        rc = gb_seterr(err, GPL_ERR_LIMIT, "S3 PUT '%s': %zu bytes is over S3's 5 GiB for one PUT",
                       full, len);
        goto out;
    }
    r->has_body = 1;
    r->mem = buf ? buf : (const unsigned char *)"";
    r->len = len;
    if (s3_digest(EVP_sha256(), r->mem, len, d) != 0) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: no SHA-256 from OpenSSL");
        goto out;
    }
    s3_hexstr(d, 32, r->sha256);
    rc = s3_do(s, c, r, err);
out:
    s3_easy_put(s, c);
    free(r);
    return rc;
}

gpl_result_t ckpt_s3_get(ckpt_s3 *s, const char *key, void *buf, size_t cap, size_t *len,
                         gb_err *err) {
    char full[S3_KEY_MAX];
    gpl_result_t rc = GPL_OK;
    CURL *c = NULL;
    s3_req *r = NULL;
    *len = 0;
    GB_CHECK_GOTO(begin(s, "GET", key, full, &r, &c, err), rc, out);
    r->out = buf;
    r->out_cap = cap;
    GB_CHECK_GOTO(s3_do(s, c, r, err), rc, out);
    *len = (size_t)r->out_len;
out:
    s3_easy_put(s, c);
    free(r);
    return rc;
}

gpl_result_t ckpt_s3_delete(ckpt_s3 *s, const char *key, gb_err *err) {
    char full[S3_KEY_MAX];
    gb_err e = GB_ERR_INIT;
    gpl_result_t rc = GPL_OK;
    CURL *c = NULL;
    s3_req *r = NULL;
    GB_CHECK_GOTO(begin(s, "DELETE", key, full, &r, &c, err), rc, out);
    rc = s3_do(s, c, r, &e);
    if (rc == GPL_ERR_NOT_FOUND && strcmp(r->code, "NoSuchBucket") != 0)
        rc = GPL_OK; /* some S3-compatible servers answer 404 for a missing key */
    else if (rc != GPL_OK)
        gb_seterr(err, rc, "%s", e.msg);
out:
    s3_easy_put(s, c);
    free(r);
    return rc;
}

gpl_result_t ckpt_s3_list(ckpt_s3 *s, const char *prefix, const char *delim, ckpt_s3_list_fn fn,
                          void *user, gb_err *err) {
    char full[S3_KEY_MAX], name[S3_KEY_MAX], num[32];
    char *token = NULL, *xml = NULL;
    gpl_result_t rc = GPL_OK;
    CURL *c = NULL;
    s3_req *r = malloc(sizeof *r);
    size_t pl = strlen(s->prefix);
    xml = malloc(S3_XML_MAX);
    token = malloc(S3_CONT_TOKEN_MAX);
    c = s3_easy_get(s);
    if (r == NULL || xml == NULL || token == NULL || c == NULL) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
        goto out;
    }
    token[0] = '\0';
    /* test hook: keys a page (S3's default and most: 1000) */
    long page_env = 0;
    char page_keys[16] = "";
    if (s3_env_long("GPULAUNCH_S3_LIST_PAGE", 0, 1, 1000, &page_env) == 0 && page_env > 0)
        snprintf(page_keys, sizeof page_keys, "%ld", page_env);
    int n = snprintf(full, sizeof full, "%s%s", s->prefix, prefix ? prefix : "");
    if (n < 0 || (size_t)n >= sizeof full) {
        rc = gb_seterr(err, GPL_ERR_LIMIT, "S3 list: the prefix '%s%s' is too long", s->prefix,
                       prefix);
        goto out;
    }
    for (int page = 0;; page++) {
        if (page >= S3_LIST_PAGES_MAX) {
            rc = gb_seterr(err, GPL_ERR_LIMIT,
                           "S3 list of '%s' in bucket '%s': over %d pages; list a longer prefix",
                           full, s->bucket, S3_LIST_PAGES_MAX);
            goto out;
        }
        s3_req_init(r, "ListObjectsV2", "GET", NULL);
        r->out = xml;
        r->out_cap = S3_XML_MAX - 1;
        /* sorted by name: SigV4's canonical query is the query as sent */
        int bad = token[0] ? s3_qadd(r->query, sizeof r->query, "continuation-token", token) : 0;
        if (delim && *delim)
            bad |= s3_qadd(r->query, sizeof r->query, "delimiter", delim);
        bad |= s3_qadd(r->query, sizeof r->query, "list-type", "2");
        if (page_keys[0])
            bad |= s3_qadd(r->query, sizeof r->query, "max-keys", page_keys);
        bad |= s3_qadd(r->query, sizeof r->query, "prefix", full);
        if (bad) {
            rc = gb_seterr(err, GPL_ERR_LIMIT, "S3 list of '%s': the query is too long", full);
            goto out;
        }
        GB_CHECK_GOTO(s3_do(s, c, r, err), rc, out);
        size_t len = (size_t)r->out_len;
        xml[len] = '\0';
        const char *p = xml, *end = xml + len, *in, *in_end, *after;
        for (const char *q = p; ckpt_s3_xml_find(q, end, "Contents", &in, &in_end, &after) == 0;
             q = after) {
            char *e = NULL;
            if (ckpt_s3_xml_get(in, (size_t)(in_end - in), "Key", name, sizeof name) < 0 ||
                ckpt_s3_xml_get(in, (size_t)(in_end - in), "Size", num, sizeof num) < 0) {
                rc = gb_seterr(err, GPL_ERR_PROTOCOL,
                               "S3 list of '%s' in bucket '%s': a <Contents> without a readable "
                               "<Key> or <Size>",
                               full, s->bucket);
                goto out;
            }
            unsigned long long size = strtoull(num, &e, 10);
            if (strncmp(name, s->prefix, pl) != 0 || name[pl] == '\0')
                continue; /* outside the prefix, or the prefix's own "folder" key */
            if (fn(name + pl, (uint64_t)size, user) != 0)
                goto out;
        }
        for (const char *q = p;
             ckpt_s3_xml_find(q, end, "CommonPrefixes", &in, &in_end, &after) == 0; q = after) {
            if (ckpt_s3_xml_get(in, (size_t)(in_end - in), "Prefix", name, sizeof name) < 0) {
                rc = gb_seterr(err, GPL_ERR_PROTOCOL,
                               "S3 list of '%s' in bucket '%s': a <CommonPrefixes> without a "
                               "readable <Prefix>",
                               full, s->bucket);
                goto out;
            }
            if (strncmp(name, s->prefix, pl) != 0)
                continue;
            if (fn(name + pl, 0, user) != 0)
                goto out;
        }
        char trunc[16];
        if (ckpt_s3_xml_get(xml, len, "IsTruncated", trunc, sizeof trunc) < 0 ||
            strcmp(trunc, "true") != 0)
            break;
        if (ckpt_s3_xml_get(xml, len, "NextContinuationToken", token, S3_CONT_TOKEN_MAX) <= 0) {
            rc = gb_seterr(err, GPL_ERR_PROTOCOL,
                           "S3 list of '%s' in bucket '%s': truncated without a usable "
                           "NextContinuationToken (at most %d bytes)",
                           full, s->bucket, S3_CONT_TOKEN_MAX - 1);
            goto out;
        }
    }
out:
    s3_easy_put(s, c);
    free(token);
    free(xml);
    free(r);
    return rc;
}
