/* One S3 request: curl's callbacks, signing at a corrected time, one
 * attempt, and the retries around it (s3_do). */
#define GB_COMPONENT "s3"

#include "s3_int.h"

/* ---- curl callbacks ------------------------------------------------------ */

static size_t s3_on_header(char *b, size_t size, size_t n, void *u) {
    s3_req *r = u;
    size_t len = size * n;
    char line[512];
    size_t l = len < sizeof line - 1 ? len : sizeof line - 1;
    memcpy(line, b, l);
    line[l] = '\0';
    while (l > 0 && (line[l - 1] == '\r' || line[l - 1] == '\n' || line[l - 1] == ' '))
        line[--l] = '\0';
    if (strncmp(line, "HTTP/", 5) == 0) { /* a new response (after 100 Continue) */
        const char *sp = strchr(line, ' ');
        r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        r->etag[0] = r->date[0] = r->bucket_region[0] = '\0';
        r->have_clen = 0;
        return len;
    }
    char *colon = strchr(line, ':');
    if (colon == NULL)
        return len;
    *colon = '\0';
    const char *v = colon + 1;
    while (*v == ' ' || *v == '\t')
        v++;
    if (strcasecmp(line, "ETag") == 0)
        snprintf(r->etag, sizeof r->etag, "%s", v);
    else if (strcasecmp(line, "Date") == 0)
        snprintf(r->date, sizeof r->date, "%s", v);
    else if (strcasecmp(line, "x-amz-bucket-region") == 0)
        snprintf(r->bucket_region, sizeof r->bucket_region, "%s", v);
    else if (strcasecmp(line, "Content-Length") == 0) {
        char *end = NULL;
        errno = 0;
        unsigned long long c = strtoull(v, &end, 10);
        r->have_clen = errno == 0 && end != v && *end == '\0';
        r->clen = c;
    }
    return len;
}

static size_t s3_on_body(char *b, size_t size, size_t n, void *u) {
    s3_req *r = u;
    size_t len = size * n;
    if (r->status == 0 || r->status >= 300) { /* an error reply: keep its start */
        size_t room = sizeof r->errbody - 1 - r->errlen;
        size_t k = len < room ? len : room;
        memcpy(r->errbody + r->errlen, b, k);
        r->errlen += k;
        r->errbody[r->errlen] = '\0';
        return len;
    }
    if (r->out_fd >= 0) {
        for (size_t done = 0; done < len;) {
            ssize_t w =
                pwrite(r->out_fd, b + done, len - done, (off_t)(r->out_off + r->out_len + done));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                r->io_errno = w < 0 ? errno : EIO;
                r->io_what = "writing the file";
                return 0;
            }
            done += (size_t)w;
        }
    } else if (r->out) {
        if (r->out_len + len > r->out_cap) {
            r->overflow = 1;
            return 0;
        }
        memcpy(r->out + r->out_len, b, len);
    }
    r->out_len += len;
    return len;
}

static size_t s3_on_read(char *b, size_t size, size_t n, void *u) {
    s3_req *r = u;
    size_t want = size * n;
    if (r->pos >= r->len)
        return 0;
    if (want > r->len - r->pos)
        want = (size_t)(r->len - r->pos);
    if (r->mem) {
        memcpy(b, r->mem + r->pos, want);
        r->pos += want;
        return want;
    }
    for (;;) {
        ssize_t got = pread(r->fd, b, want, (off_t)(r->off + r->pos));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            r->io_errno = got < 0 ? errno : EIO;
            r->io_what = got < 0 ? "reading the file" : "reading the file (it ended early)";
            return CURL_READFUNC_ABORT;
        }
        r->pos += (uint64_t)got;
        return (size_t)got;
    }
}

static int s3_on_seek(void *u, curl_off_t offset, int origin) {
    s3_req *r = u;
    if (origin != SEEK_SET || offset < 0 || (uint64_t)offset > r->len)
        return CURL_SEEKFUNC_CANTSEEK;
    r->pos = (uint64_t)offset;
    return CURL_SEEKFUNC_OK;
}

void s3_report(s3_xfer *x, int force) {
    if (x->fn == NULL)
        return;
    uint64_t now = gb_now_ms();
    if (!force && now - x->last_ms < S3_PROGRESS_MS)
        return;
    x->last_ms = now;
    uint64_t d = atomic_load(&x->done);
    if (x->fn(d > x->total ? x->total : d, x->total, x->user) != 0)
        atomic_store(&x->abort, 1);
}

static int s3_on_progress(void *u, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                          curl_off_t ulnow) {
    s3_req *r = u;
    s3_xfer *x = r->x;
    if (x == NULL)
        return 0;
    uint64_t now = (uint64_t)(r->has_body ? ulnow : dlnow);
    if (now > r->counted) {
        atomic_fetch_add(&x->done, now - r->counted);
        r->counted = now;
    }
    if (x->direct)
        s3_report(x, 0);
    return atomic_load(&x->abort) || atomic_load(&x->stop);
}

/* ---- signing at a corrected time ---------------------------------------- */

typedef struct s3_sigcap {
    char *auth;
    size_t cap;
} s3_sigcap;

static int s3_sig_debug(CURL *c, curl_infotype t, char *data, size_t n, void *u) {
    s3_sigcap *k = u;
    static const char name[] = "\nAuthorization: ";
    if (t != CURLINFO_HEADER_OUT || k->auth[0])
        return 0;
    const char *p = memmem(data, n, name, sizeof name - 1);
    if (p == NULL)
        return 0;
    p += 1;
    const char *e = memchr(p, '\r', n - (size_t)(p - data));
    size_t l = e ? (size_t)(e - p) : 0;
    if (l > 0 && l < k->cap) {
        memcpy(k->auth, p, l);
        k->auth[l] = '\0';
    }
    return 0;
}

/* Has curl sign method path_query with headers (which hold Host and
 * X-Amz-Date) by sending it to a loopback listener that never accepts (the
 * kernel completes the connection; the request sits unread) and keeping the
 * "Authorization: ..." line it sent. See the file's header comment. (7.88
 * ignores CURL_SOCKOPT_ALREADY_CONNECTED, so a socket pair cannot stand in.) */
static gpl_result_t s3_sign_at(const ckpt_s3 *s, const ckpt_s3_creds *cr, const char *method,
                               const char *path_query, struct curl_slist *headers, char *auth,
                               size_t cap, gb_err *err) {
    char url[S3_URL_MAX];
    gpl_result_t rc = GPL_OK;
    s3_sigcap k = {.auth = auth, .cap = cap};
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    CURL *c = NULL;
    CURLM *m = NULL;
    int added = 0, running = 1;
    auth[0] = '\0';
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 4) != 0 ||
        getsockname(ls, (struct sockaddr *)&sa, &sl) != 0) {
        rc = gb_seterr(err, GPL_ERR_SYSTEM, "S3: a loopback socket to sign a request: %s",
                       strerror(errno));
        goto out;
    }
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", ntohs(sa.sin_port), path_query);
    c = curl_easy_init();
    m = curl_multi_init();
    if (c == NULL || m == NULL) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: no curl handle to sign a request");
        goto out;
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method); /* no body: its hash is a header */
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, s->sigv4);
    curl_easy_setopt(c, CURLOPT_USERNAME, cr->key_id);
    curl_easy_setopt(c, CURLOPT_PASSWORD, cr->secret);
    curl_easy_setopt(c, CURLOPT_VERBOSE, 1L); /* the debug function sees the headers sent */
    curl_easy_setopt(c, CURLOPT_DEBUGFUNCTION, s3_sig_debug);
    curl_easy_setopt(c, CURLOPT_DEBUGDATA, &k);
    if (curl_multi_add_handle(m, c) != CURLM_OK) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: curl_multi_add_handle to sign a request");
        goto out;
    }
    added = 1;
    for (uint64_t end = gb_now_ms() + S3_SIGN_TIMEOUT_MS;
         !auth[0] && running && gb_now_ms() < end;) {
        if (curl_multi_perform(m, &running) != CURLM_OK)
            break;
        if (!auth[0] && running)
            curl_multi_poll(m, NULL, 0, 20, NULL);
    }
    if (auth[0] == '\0')
        rc = gb_seterr(err, GPL_ERR_SYSTEM,
                       "S3: curl did not sign the request at the corrected time");
out:
    if (added)
        curl_multi_remove_handle(m, c);
    if (c)
        curl_easy_cleanup(c);
    if (m)
        curl_multi_cleanup(m);
    if (ls >= 0)
        close(ls);
    return rc;
}

/* ---- one attempt --------------------------------------------------------- */

/* The request's URL into url and its "/path?query" into *pq (inside url). */
static int s3_url(const ckpt_s3 *s, const char *key, const char *query, char *url, size_t cap,
                  const char **pq, char *host, size_t hcap) {
    char enc[3 * S3_KEY_MAX];
    int n;
    if (s3_enc(key ? key : "", 1, enc, sizeof enc) != 0)
        return -1;
    const char *q = query && query[0] ? "?" : "";
    if (s->path_style)
        n = snprintf(url, cap, "%s/%s%s%s%s%s", s->endpoint, s->bucket, key ? "/" : "", enc, q,
                     query ? query : "");
    else
        n = snprintf(url, cap, "https://%s.s3.%s.amazonaws.com/%s%s%s", s->bucket, s->region, enc,
                     q, query ? query : "");
    if (n < 0 || (size_t)n >= cap)
        return -1;
    const char *auth = strstr(url, "://") + 3;
    const char *slash = strchr(auth, '/');
    *pq = slash;
    snprintf(host, hcap, "%.*s", (int)(slash - auth), auth);
    return 0;
}

static int s3_hadd(struct curl_slist **h, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int s3_hadd(struct curl_slist **h, const char *fmt, ...) {
    char line[S3_HDR_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line)
        return -1;
    struct curl_slist *t = curl_slist_append(*h, line);
    if (t == NULL)
        return -1;
    *h = t;
    return 0;
}

/* The credentials to sign with now, renewed when they are about to expire. */
static gpl_result_t s3_creds_now(ckpt_s3 *s, ckpt_s3_creds *out, int force, gb_err *err) {
    gpl_result_t rc = GPL_OK;
    pthread_mutex_lock(&s->mu);
    double now = gb_wall_s();
    if ((force && s->creds.expires > 0) || ckpt_s3_creds_stale(&s->creds, now)) {
        ckpt_s3_creds *fresh = malloc(sizeof *fresh);
        gb_err e = GB_ERR_INIT;
        if (fresh == NULL) {
            rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory renewing credentials");
            goto out;
        }
        *fresh = s->creds;
        if (ckpt_s3_creds_refresh(s->region, fresh, &e) == GPL_OK) {
            s->creds = *fresh;
            GB_INFO("credentials from %s renewed", s->creds.source);
        } else if (s->creds.expires > now && !force) {
            GB_WARN("renewing the credentials failed (using them until they expire): %s",
                    gb_errmsg(&e));
        } else {
            rc = gb_seterr(err, e.code, "%s", gb_errmsg(&e));
        }
        explicit_bzero(fresh, sizeof *fresh);
        free(fresh);
    }
out:
    if (rc == GPL_OK)
        *out = s->creds;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int s3_retryable_curl(CURLcode cc) {
    switch (cc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
        return 1;
    default:
        return 0;
    }
}

/* Prepares r for another attempt: what the last one wrote is forgotten. */
static void s3_req_rewind(s3_req *r) {
    if (r->x && r->counted)
        atomic_fetch_sub(&r->x->done, r->counted);
    r->counted = 0;
    r->pos = 0;
    r->status = 0;
    r->out_len = 0;
    r->overflow = r->io_errno = 0;
    r->io_what = NULL;
    r->etag[0] = r->date[0] = r->bucket_region[0] = r->code[0] = r->msg[0] = '\0';
    r->curl_err[0] = r->errbody[0] = '\0';
    r->errlen = 0;
    r->have_clen = 0;
}

/* The error reply's Code and Message (a HEAD has none: the status names it). */
static void s3_parse_error(s3_req *r) {
    if (ckpt_s3_xml_get(r->errbody, r->errlen, "Code", r->code, sizeof r->code) < 0) {
        const char *c = r->status == 404   ? "NotFound"
                        : r->status == 403 ? "Forbidden"
                        : r->status == 301 ? "PermanentRedirect"
                        : r->status == 412 ? "PreconditionFailed"
                        : r->status == 503 ? "ServiceUnavailable"
                        : r->status >= 500 ? "InternalError"
                                           : "HTTPError";
        snprintf(r->code, sizeof r->code, "%s", c);
    }
    if (ckpt_s3_xml_get(r->errbody, r->errlen, "Message", r->msg, sizeof r->msg) < 0)
        r->msg[0] = '\0';
}

/* One HTTP exchange of r on c. Returns S3_DONE (2xx), S3_RETRY, S3_SKEW,
 * S3_EXPIRED, or S3_FAIL with err set for failures that are not the
 * server's answer (s3_do words those). why: the failure, for logs. */
static int s3_attempt(ckpt_s3 *s, CURL *c, s3_req *r, char *why, size_t whycap, gb_err *err) {
    char url[S3_URL_MAX], host[S3_ENDPOINT_MAX], auth[S3_AUTH_MAX];
    const char *pq = NULL;
    struct curl_slist *h = NULL;
    ckpt_s3_creds *cr = malloc(sizeof *cr);
    int k = S3_FAIL;
    why[0] = '\0';
    s3_req_rewind(r);
    if (cr == NULL) {
        gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
        goto out;
    }
    if (s3_creds_now(s, cr, 0, err) != GPL_OK)
        goto out;
    snprintf(r->cred_source, sizeof r->cred_source, "%s", cr->source);
    if (s3_url(s, r->key, r->query, url, sizeof url, &pq, host, sizeof host) != 0) {
        gb_seterr(err, GPL_ERR_LIMIT, "S3: the URL of '%s' is longer than %d bytes",
                  r->key ? r->key : s->bucket, S3_URL_MAX);
        goto out;
    }
    int64_t off = s->clock_hook_s + atomic_load(&s->skew_s);
    const char *sha = r->sha256[0] ? r->sha256 : r->has_body ? "UNSIGNED-PAYLOAD" : S3_EMPTY_SHA256;
    int bad = s3_hadd(&h, "x-amz-content-sha256: %s", sha);
    if (cr->token[0])
        bad |= s3_hadd(&h, "x-amz-security-token: %s", cr->token);
    for (int i = 0; i < 2; i++)
        if (r->extra[i][0])
            bad |= s3_hadd(&h, "%s", r->extra[i]);
    if (off != 0) {
        time_t t = time(NULL) + (time_t)off;
        struct tm tm;
        char stamp[32];
        gmtime_r(&t, &tm);
        strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
        bad |= s3_hadd(&h, "Host: %s", host);
        bad |= s3_hadd(&h, "X-Amz-Date: %s", stamp);
    }
    if (bad) {
        gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory for request headers");
        goto out;
    }
    if (off != 0) {
        if (s3_sign_at(s, cr, r->method, pq, h, auth, sizeof auth, err) != GPL_OK)
            goto out;
        if (s3_hadd(&h, "%s", auth) != 0) {
            gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory for request headers");
            goto out;
        }
    }

    curl_easy_reset(c); /* keeps the connection, DNS and TLS session caches */
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "gpulaunch-s3");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)S3_CONNECT_TIMEOUT_MS);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, (long)S3_STALL_BYTES);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)S3_STALL_S);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->curl_err);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    if (off == 0) {
        curl_easy_setopt(c, CURLOPT_AWS_SIGV4, s->sigv4);
        curl_easy_setopt(c, CURLOPT_USERNAME, cr->key_id);
        curl_easy_setopt(c, CURLOPT_PASSWORD, cr->secret);
    }
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, s3_on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, s3_on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, s3_on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, r);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    if (r->has_body) {
        /* PUT and POST both as uploads: a Content-Length even when empty */
        curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(c, CURLOPT_READFUNCTION, s3_on_read);
        curl_easy_setopt(c, CURLOPT_READDATA, r);
        curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, s3_on_seek);
        curl_easy_setopt(c, CURLOPT_SEEKDATA, r);
        curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->len);
        if (strcmp(r->method, "PUT") != 0)
            curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, r->method);
    } else if (strcmp(r->method, "HEAD") == 0) {
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (strcmp(r->method, "GET") != 0) {
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, r->method);
    }
    /* the status is known before the body: the write callback routes error replies */
    CURLcode cc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    curl_off_t up = 0, down = 0;
    curl_easy_getinfo(c, CURLINFO_SIZE_UPLOAD_T, &up);
    curl_easy_getinfo(c, CURLINFO_SIZE_DOWNLOAD_T, &down);
    atomic_fetch_add(&s->requests, 1);
    atomic_fetch_add(&s->bytes_up, (uint64_t)(up > 0 ? up : 0));
    atomic_fetch_add(&s->bytes_down, (uint64_t)(down > 0 ? down : 0));

    if (r->io_errno) {
        gb_seterr(err, GPL_ERR_SYSTEM, "S3 %s '%s': %s at offset %" PRIu64 ": %s", r->op,
                  r->key ? r->key : "", r->io_what, r->off + r->pos, strerror(r->io_errno));
        goto out;
    }
    if (cc == CURLE_ABORTED_BY_CALLBACK && r->x && atomic_load(&r->x->abort)) {
        gb_seterr(err, GPL_ERR_TIMEOUT, "S3 %s '%s' aborted by the caller's progress function",
                  r->op, r->key ? r->key : "");
        goto out;
    }
    if (cc == CURLE_ABORTED_BY_CALLBACK && r->x && atomic_load(&r->x->stop)) {
        gb_seterr(err, GPL_ERR_STATE, "S3 %s '%s' stopped: another part failed", r->op,
                  r->key ? r->key : "");
        goto out;
    }
    if (r->overflow) {
        gb_seterr(err, GPL_ERR_LIMIT,
                  "S3 object '%s' in bucket '%s' is larger than the %zu bytes it was read into",
                  r->key ? r->key : "", s->bucket, r->out_cap);
        goto out;
    }
    if (cc != CURLE_OK) {
        snprintf(why, whycap, "%s", r->curl_err[0] ? r->curl_err : curl_easy_strerror(cc));
        if (s3_retryable_curl(cc)) {
            k = S3_RETRY;
        } else {
            gb_seterr(err, GPL_ERR_CONFIG, "S3 %s '%s' at %s: %s; check the endpoint", r->op,
                      r->key ? r->key : "", s->endpoint, why);
        }
        goto out;
    }
    if (r->status >= 200 && r->status < 300) {
        k = S3_DONE;
        goto out;
    }
    s3_parse_error(r);
    snprintf(why, whycap, "%s (%ld)%s%s", r->code, r->status, r->msg[0] ? ": " : "", r->msg);
    /* a body damaged on its way (the server's hash of it differs from the
     * one signed) is sent again from the file, like a reset connection */
    if (r->status >= 500 || r->status == 408 || r->status == 429 ||
        (r->status == 400 &&
         (strcmp(r->code, "RequestTimeout") == 0 || strcmp(r->code, "BadDigest") == 0 ||
          strcmp(r->code, "XAmzContentSHA256Mismatch") == 0))) {
        k = S3_RETRY;
    } else if (r->status == 403 && strcmp(r->code, "RequestTimeTooSkewed") == 0) {
        time_t server = r->date[0] ? curl_getdate(r->date, NULL) : (time_t)-1;
        if (server != (time_t)-1) {
            int64_t skew = (int64_t)server - (int64_t)time(NULL) - s->clock_hook_s;
            atomic_store(&s->skew_s, skew);
            GB_WARN("%s at %s: this machine's clock is %+" PRId64
                    " s off the server's (RequestTimeTooSkewed): signing with the server's time",
                    s->bucket, s->endpoint, -skew);
            k = S3_SKEW;
        }
    } else if ((r->status == 400 || r->status == 403) &&
               (strcmp(r->code, "ExpiredToken") == 0 ||
                strcmp(r->code, "TokenRefreshRequired") == 0)) {
        k = S3_EXPIRED;
    }
out:
    curl_slist_free_all(h); /* (curl copied the secret; this copy goes now) */
    if (cr)
        explicit_bzero(cr, sizeof *cr);
    free(cr);
    return k;
}

/* The message for a final error reply r: what, where and what to do. */
static gpl_result_t s3_http_error(ckpt_s3 *s, const s3_req *r, gb_err *err) {
    char w[S3_ENDPOINT_MAX + S3_BUCKET_MAX + 32];
    const char *key = r->key ? r->key : "";
    const char *code = r->code;
    s3_where(s, w, sizeof w);
    if (strcmp(code, "RequestTimeTooSkewed") == 0)
        return gb_seterr(err, GPL_ERR_AUTH,
                         "%s: RequestTimeTooSkewed (%ld) though signed with the server's time: "
                         "set this machine's clock (NTP)",
                         w, r->status);
    if (r->status == 404 && strcmp(code, "NoSuchBucket") == 0)
        return gb_seterr(err, GPL_ERR_NOT_FOUND,
                         "%s: NoSuchBucket (404): create it or fix the checkpoint's durable URL %s",
                         w, s->url);
    if (r->status == 404 && strcmp(code, "NoSuchUpload") == 0)
        return gb_seterr(err, GPL_ERR_NOT_FOUND,
                         "%s: the multipart upload of '%s' is gone (NoSuchUpload, 404): the "
                         "server lost it (restarted?) or it was aborted",
                         w, key);
    if (r->status == 404)
        return gb_seterr(err, GPL_ERR_NOT_FOUND, "%s: no object '%s' (%s, 404)", w, key, code);
    if (r->status == 301 || strcmp(code, "PermanentRedirect") == 0 ||
        strcmp(code, "AuthorizationHeaderMalformed") == 0 || r->bucket_region[0]) {
        if (r->bucket_region[0] && strcmp(r->bucket_region, s->region) != 0)
            return gb_seterr(err, GPL_ERR_CONFIG,
                             "%s: the bucket is in region %s, not %s (%s, %ld): set AWS_REGION=%s",
                             w, r->bucket_region, s->region, code, r->status, r->bucket_region);
    }
    if (r->status == 403 || r->status == 401) {
        const char *todo = strcmp(code, "AccessDenied") == 0 || strcmp(code, "Forbidden") == 0
                               ? "check them and that their policy allows it"
                               : "check them";
        return gb_seterr(err, GPL_ERR_AUTH,
                         "%s: %s (%ld) for %s '%s': the credentials came from %s; %s", w, code,
                         r->status, r->op, key, r->cred_source, todo);
    }
    if (r->status == 412)
        return gb_seterr(err, GPL_ERR_STATE,
                         "%s: object '%s' changed while it was read (%s, 412): read it again", w,
                         key, code);
    return gb_seterr(err, GPL_ERR_PROTOCOL, "%s: %s '%s' failed: %s (%ld)%s%s", w, r->op, key, code,
                     r->status, r->msg[0] ? ": " : "", r->msg);
}

/* r, retried as the header comment says; err holds why it failed. */
gpl_result_t s3_do(ckpt_s3 *s, CURL *c, s3_req *r, gb_err *err) {
    char why[CURL_ERROR_SIZE + S3_MSG_MAX + S3_CODE_MAX];
    int retries = 0, skews = 0, renewed = 0;
    uint64_t t0 = gb_now_ms();
    for (;;) {
        gb_err e = GB_ERR_INIT;
        int k = s3_attempt(s, c, r, why, sizeof why, &e);
        if (k == S3_DONE)
            return GPL_OK;
        if (k == S3_FAIL && e.code != GPL_OK)
            return gb_seterr(err, e.code, "%s", e.msg);
        int stopped = r->x && (atomic_load(&r->x->abort) || atomic_load(&r->x->stop));
        if (k == S3_RETRY && retries < s->retries && !stopped) {
            uint64_t cap = (uint64_t)S3_BACKOFF_BASE_MS << (retries < 16 ? retries : 16);
            if (cap > S3_BACKOFF_CAP_MS)
                cap = S3_BACKOFF_CAP_MS;
            uint64_t ms = cap / 2 + s3_rand() % (cap / 2 + 1); /* half fixed, half jitter */
            retries++;
            atomic_fetch_add(&s->retries_done, 1);
            GB_INFO("%s '%s': %s; retry %d of %d in %" PRIu64 " ms", r->op,
                    r->key ? r->key : s->bucket, why, retries, s->retries, ms);
            s3_sleep_ms(ms, r->x);
            continue;
        }
        if (k == S3_SKEW && skews < S3_SKEW_RETRIES) {
            skews++;
            atomic_fetch_add(&s->retries_done, 1);
            continue;
        }
        if (k == S3_EXPIRED && !renewed) {
            ckpt_s3_creds *cr = malloc(sizeof *cr);
            gb_err ce = GB_ERR_INIT;
            gpl_result_t rc = cr ? s3_creds_now(s, cr, 1, &ce) : GPL_ERR_NOMEM;
            free(cr);
            renewed = 1;
            atomic_fetch_add(&s->retries_done, 1);
            if (rc == GPL_OK)
                continue;
        }
        if (k == S3_RETRY) {
            char w[S3_ENDPOINT_MAX + S3_BUCKET_MAX + 32];
            gpl_result_t code = r->status ? GPL_ERR_PROTOCOL
                                : strstr(why, "imeout") || strstr(why, "timed out")
                                    ? GPL_ERR_TIMEOUT
                                    : GPL_ERR_CLOSED;
            return gb_seterr(err, code,
                             "%s: %s '%s' failed %d times in %.1f s, the last: %s; check that "
                             "the server is up (GPULAUNCH_S3_RETRIES=%d)",
                             s3_where(s, w, sizeof w), r->op, r->key ? r->key : "", retries + 1,
                             (double)(gb_now_ms() - t0) / 1000.0, why, s->retries);
        }
        return s3_http_error(s, r, err);
    }
}

void s3_req_init(s3_req *r, const char *op, const char *method, const char *key) {
    memset(r, 0, sizeof *r);
    r->op = op;
    r->method = method;
    r->key = key;
    r->fd = -1;
    r->out_fd = -1;
}
