/* Large objects in parts: multipart uploads and ranged downloads, parts in
 * parallel on GPULAUNCH_S3_PARALLEL threads, a failed part retried alone. */
#define GB_COMPONENT "s3"

#include "gb_thread.h"
#include "s3_int.h"

/* ---- large objects in parts ------------------------------------------------- */

typedef struct s3_job s3_job;
typedef gpl_result_t (*s3_part_fn)(s3_job *j, CURL *c, int i, unsigned char *buf, gb_err *err);

struct s3_job {
    ckpt_s3 *s;
    const char *key; /* whole key */
    int fd;
    uint64_t size, part;
    int nparts;
    s3_part_fn part_fn;
    char upload_id[S3_UPLOAD_ID_MAX];
    char (*etag)[S3_ETAG_MAX];
    char if_match[S3_ETAG_MAX + 16];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int next, running, failed, lost;
    gb_err err;
    s3_xfer x;
};

static void s3_job_fail(s3_job *j, const gb_err *e, int lost) {
    pthread_mutex_lock(&j->mu);
    if (!j->failed) {
        j->failed = 1;
        j->lost = lost;
        j->err = *e;
    }
    pthread_mutex_unlock(&j->mu);
    atomic_store(&j->x.stop, 1); /* the other parts end at once */
}

static void *s3_worker(void *arg) {
    s3_job *j = arg;
    gb_thread_name("gpl-s3-part"); /* the drainer's priority, inherited */
    CURL *c = s3_easy_get(j->s);
    unsigned char *buf = malloc(S3_IO_CHUNK);
    if (c == NULL || buf == NULL) {
        gb_err e = GB_ERR_INIT;
        gb_seterr(&e, GPL_ERR_NOMEM, "S3: out of memory for a transfer thread");
        s3_job_fail(j, &e, 0);
    }
    while (c && buf) {
        pthread_mutex_lock(&j->mu);
        int i = j->failed || atomic_load(&j->x.abort) || j->next >= j->nparts ? -1 : j->next++;
        pthread_mutex_unlock(&j->mu);
        if (i < 0)
            break;
        gb_err e = GB_ERR_INIT;
        if (j->part_fn(j, c, i, buf, &e) != GPL_OK) {
            if (!atomic_load(&j->x.stop) && !atomic_load(&j->x.abort))
                s3_job_fail(j, &e, 0);
            break;
        }
    }
    free(buf);
    s3_easy_put(j->s, c);
    pthread_mutex_lock(&j->mu);
    j->running--;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* Runs j's parts on up to GPULAUNCH_S3_PARALLEL threads; this thread calls
 * the progress function meanwhile. */
static gpl_result_t s3_run_parts(s3_job *j, gb_err *err) {
    pthread_t th[S3_PARALLEL_MAX];
    int n = j->s->parallel < j->nparts ? j->s->parallel : j->nparts, started = 0;
    j->next = 0;
    j->failed = j->lost = 0;
    gb_clearerr(&j->err);
    atomic_store(&j->x.stop, 0);
    atomic_store(&j->x.done, 0);
    j->running = n;
    int perr = 0;
    for (int i = 0; i < n && perr == 0; i++)
        if ((perr = pthread_create(&th[started], NULL, s3_worker, j)) == 0)
            started++;
    pthread_mutex_lock(&j->mu);
    j->running -= n - started; /* threads that could not start */
    pthread_mutex_unlock(&j->mu);
    if (started == 0)
        return gb_seterr(err, GPL_ERR_SYSTEM, "S3 '%s': no thread could start: %s", j->key,
                         strerror(perr));
    pthread_mutex_lock(&j->mu);
    while (j->running > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += (long)S3_PROGRESS_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        pthread_mutex_unlock(&j->mu);
        s3_report(&j->x, 0);
        pthread_mutex_lock(&j->mu);
    }
    pthread_mutex_unlock(&j->mu);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (atomic_load(&j->x.abort))
        return gb_seterr(err, GPL_ERR_TIMEOUT,
                         "S3 transfer of '%s' in bucket '%s' aborted by the caller's progress "
                         "function",
                         j->key, j->s->bucket);
    if (j->failed)
        return gb_seterr(err, j->err.code, "%s", j->err.msg);
    s3_report(&j->x, 1);
    return GPL_OK;
}

static void s3_job_init(s3_job *j, ckpt_s3 *s, const char *key, int fd, uint64_t size,
                        ckpt_s3_progress_fn fn, void *user) {
    memset(j, 0, sizeof *j);
    j->s = s;
    j->key = key;
    j->fd = fd;
    j->size = size;
    j->x.total = size;
    j->x.fn = fn;
    j->x.user = user;
    j->x.last_ms = gb_now_ms();
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&j->mu, NULL);
    /* S3 allows 10000 parts: larger files get larger parts (whole MiB) */
    j->part = s->part_bytes;
    if (size > j->part * S3_PARTS_MAX)
        j->part = ((size + S3_PARTS_MAX - 1) / S3_PARTS_MAX + (1u << 20) - 1) & ~((1ull << 20) - 1);
    j->nparts = size ? (int)((size + j->part - 1) / j->part) : 1;
}

static void s3_job_fini(s3_job *j) {
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j->etag);
}

static gpl_result_t s3_up_part(s3_job *j, CURL *c, int i, unsigned char *buf, gb_err *err) {
    uint64_t off = (uint64_t)i * j->part;
    uint64_t len = j->size - off < j->part ? j->size - off : j->part;
    char num[16];
    gpl_result_t rc = GPL_OK;
    s3_req *r = malloc(sizeof *r);
    if (r == NULL)
        return gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
    s3_req_init(r, "UploadPart", "PUT", j->key);
    GB_CHECK_GOTO(s3_sha256_fd(j->fd, off, len, buf, r->sha256, err), rc, out);
    snprintf(num, sizeof num, "%d", i + 1);
    if (s3_qadd(r->query, sizeof r->query, "partNumber", num) ||
        s3_qadd(r->query, sizeof r->query, "uploadId", j->upload_id)) {
        rc = gb_seterr(err, GPL_ERR_LIMIT, "S3: the upload id of '%s' is too long", j->key);
        goto out;
    }
    r->has_body = 1;
    r->fd = j->fd;
    r->off = off;
    r->len = len;
    r->x = &j->x;
    rc = s3_do(j->s, c, r, err);
    if (rc != GPL_OK) {
        if (r->status == 404 && strcmp(r->code, "NoSuchUpload") == 0) {
            s3_job_fail(j, err, 1);
        }
        goto out;
    }
    if (r->etag[0] == '\0') {
        rc = gb_seterr(err, GPL_ERR_PROTOCOL, "S3 UploadPart %d of '%s': the reply has no ETag",
                       i + 1, j->key);
        goto out;
    }
    snprintf(j->etag[i], S3_ETAG_MAX, "%s", r->etag);
out:
    free(r);
    return rc;
}

/* Starts a multipart upload: j->upload_id. */
static gpl_result_t s3_mpu_create(s3_job *j, CURL *c, s3_req *r, char *xml, gb_err *err) {
    gpl_result_t rc;
    s3_req_init(r, "CreateMultipartUpload", "POST", j->key);
    snprintf(r->query, sizeof r->query, "uploads=");
    r->has_body = 1; /* empty, with a Content-Length */
    r->mem = (const unsigned char *)"";
    snprintf(r->sha256, sizeof r->sha256, "%s", S3_EMPTY_SHA256);
    r->out = xml;
    r->out_cap = S3_XML_MAX - 1;
    if ((rc = s3_do(j->s, c, r, err)) != GPL_OK)
        return rc;
    if (ckpt_s3_xml_get(xml, (size_t)r->out_len, "UploadId", j->upload_id, sizeof j->upload_id) <=
        0)
        return gb_seterr(err, GPL_ERR_PROTOCOL,
                         "S3 CreateMultipartUpload of '%s' in bucket '%s': no usable <UploadId> "
                         "in the reply",
                         j->key, j->s->bucket);
    return GPL_OK;
}

/* The ETag S3 gives a multipart object: MD5 of the parts' MD5s, "-" parts;
 * the parts' MD5s are their ETags as the server answered them. "" when an
 * ETag is not a plain MD5 (e.g. SSE-KMS): nothing to compare then. */
static void s3_mpu_etag(const s3_job *j, char *out, size_t cap) {
    unsigned char *all = malloc((size_t)j->nparts * 16), d[16];
    char hex[40];
    out[0] = '\0';
    if (all == NULL)
        return;
    for (int i = 0; i < j->nparts; i++) {
        const char *t = j->etag[i] + (j->etag[i][0] == '"');
        for (int b = 0; b < 16; b++) {
            int hi = s3_hex(t[2 * b]), lo = hi < 0 ? -1 : s3_hex(t[2 * b + 1]);
            if (lo < 0)
                goto out;
            all[16 * i + b] = (unsigned char)(hi << 4 | lo);
        }
    }
    if (s3_digest(EVP_md5(), all, (size_t)j->nparts * 16, d) == 0) {
        s3_hexstr(d, 16, hex);
        snprintf(out, cap, "\"%s-%d\"", hex, j->nparts);
    }
out:
    free(all);
}

/* Completes the upload. *lost: the server no longer knows it. */
static gpl_result_t s3_mpu_complete(s3_job *j, CURL *c, s3_req *r, char *xml, int *lost,
                                    gb_err *err) {
    size_t cap = (size_t)j->nparts * S3_COMPLETE_PART_MAX + 128, n = 0;
    unsigned char d[32];
    gpl_result_t rc = GPL_OK;
    char *body = malloc(cap);
    *lost = 0;
    if (body == NULL)
        return gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
    n += (size_t)snprintf(body + n, cap - n, "<CompleteMultipartUpload>");
    for (int i = 0; i < j->nparts; i++) {
        /* ETags are "hex" (or opaque with quotes): no & or < to escape */
        n += (size_t)snprintf(body + n, cap - n,
                              "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>", i + 1,
                              j->etag[i]);
    }
    n += (size_t)snprintf(body + n, cap - n, "</CompleteMultipartUpload>");
    for (int attempt = 0;; attempt++) {
        gb_err e = GB_ERR_INIT;
        s3_req_init(r, "CompleteMultipartUpload", "POST", j->key);
        if (s3_qadd(r->query, sizeof r->query, "uploadId", j->upload_id)) {
            rc = gb_seterr(err, GPL_ERR_LIMIT, "S3: the upload id of '%s' is too long", j->key);
            goto out;
        }
        r->has_body = 1;
        r->mem = (const unsigned char *)body;
        r->len = n;
        if (s3_digest(EVP_sha256(), body, n, d) == 0)
            s3_hexstr(d, 32, r->sha256);
        r->out = xml;
        r->out_cap = S3_XML_MAX - 1;
        rc = s3_do(j->s, c, r, &e);
        if (rc == GPL_OK) {
            /* S3 may answer 200 and put an error in the body (the reply is
             * streamed while it assembles the parts) */
            char code[S3_CODE_MAX];
            xml[r->out_len] = '\0';
            if (strstr(xml, "<Error>") &&
                ckpt_s3_xml_get(xml, (size_t)r->out_len, "Code", code, sizeof code) > 0) {
                if (attempt < j->s->retries &&
                    (strcmp(code, "InternalError") == 0 || strcmp(code, "SlowDown") == 0 ||
                     strcmp(code, "ServiceUnavailable") == 0)) {
                    atomic_fetch_add(&j->s->retries_done, 1);
                    s3_sleep_ms(S3_BACKOFF_BASE_MS << (attempt < 6 ? attempt : 6), NULL);
                    continue;
                }
                rc = gb_seterr(err, GPL_ERR_PROTOCOL,
                               "S3 CompleteMultipartUpload of '%s' in bucket '%s': %s", j->key,
                               j->s->bucket, code);
            }
            goto out;
        }
        if (r->status == 404 && strcmp(r->code, "NoSuchUpload") == 0) {
            /* gone: completed by an earlier attempt whose reply was lost, or
             * lost by the server; the object's ETag tells which */
            char want[S3_ETAG_MAX];
            s3_mpu_etag(j, want, sizeof want);
            s3_req_init(r, "HeadObject", "HEAD", j->key);
            if (s3_do(j->s, c, r, &e) == GPL_OK && r->have_clen && r->clen == j->size && want[0] &&
                strcmp(r->etag, want) == 0) {
                rc = GPL_OK;
                goto out;
            }
            *lost = 1;
        }
        gb_seterr(err, e.code, "%s", e.msg);
        goto out;
    }
out:
    free(body);
    return rc;
}

/* Aborts the upload so that no parts stay billed; failures only logged. A
 * part still in flight when the abort arrives may yet be stored (S3's
 * documentation of AbortMultipartUpload), so the abort is checked with
 * ListParts and sent again until the server no longer knows the upload. */
static void s3_mpu_abort(s3_job *j, CURL *c, s3_req *r, char *xml) {
    gb_err e = GB_ERR_INIT;
    for (int attempt = 0; attempt < S3_ABORT_TRIES; attempt++) {
        if (attempt > 0)
            s3_sleep_ms((uint64_t)S3_BACKOFF_BASE_MS << attempt, NULL);
        gb_clearerr(&e);
        s3_req_init(r, "AbortMultipartUpload", "DELETE", j->key);
        if (s3_qadd(r->query, sizeof r->query, "uploadId", j->upload_id))
            return;
        if (s3_do(j->s, c, r, &e) != GPL_OK && r->status != 404)
            continue;
        gb_clearerr(&e);
        s3_req_init(r, "ListParts", "GET", j->key);
        if (s3_qadd(r->query, sizeof r->query, "max-parts", "1") ||
            s3_qadd(r->query, sizeof r->query, "uploadId", j->upload_id))
            return;
        r->out = xml;
        r->out_cap = S3_XML_MAX - 1;
        if (s3_do(j->s, c, r, &e) != GPL_OK && r->status == 404)
            return; /* NoSuchUpload: gone with its parts */
        if (e.code == GPL_OK)
            gb_seterr(&e, GPL_ERR_STATE, "the upload was still listed after it was aborted");
    }
    GB_WARN("could not abort the multipart upload of '%s' in bucket '%s' (its parts stay billed "
            "until a lifecycle rule removes them): %s",
            j->key, j->s->bucket, gb_errmsg(&e));
}

/* The whole fd by one PUT (below the part size). */
static gpl_result_t s3_put_single(ckpt_s3 *s, const char *full, int fd, uint64_t size,
                                  ckpt_s3_progress_fn fn, void *user, gb_err *err) {
    gpl_result_t rc = GPL_OK;
    s3_xfer x = {.total = size, .fn = fn, .user = user, .direct = 1, .last_ms = gb_now_ms()};
    CURL *c = s3_easy_get(s);
    s3_req *r = malloc(sizeof *r);
    unsigned char *buf = malloc(S3_IO_CHUNK);
    if (c == NULL || r == NULL || buf == NULL) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
        goto out;
    }
    s3_req_init(r, "PUT", "PUT", full);
    GB_CHECK_GOTO(s3_sha256_fd(fd, 0, size, buf, r->sha256, err), rc, out);
    r->has_body = 1;
    r->fd = fd;
    r->len = size;
    r->x = &x;
    GB_CHECK_GOTO(s3_do(s, c, r, err), rc, out);
    s3_report(&x, 1);
out:
    s3_easy_put(s, c);
    free(buf);
    free(r);
    return rc;
}

gpl_result_t ckpt_s3_put_file(ckpt_s3 *s, const char *key, int fd, uint64_t size,
                              ckpt_s3_progress_fn fn, void *user, gb_err *err) {
    char full[S3_KEY_MAX];
    gpl_result_t rc = GPL_OK;
    s3_job *j = NULL;
    s3_req *r = NULL;
    char *xml = NULL;
    CURL *c = NULL;
    GB_CHECK_GOTO(s3_key(s, key, full, err), rc, out);
    if (size > S3_OBJECT_MAX) {
        rc = gb_seterr(err, GPL_ERR_LIMIT,
                       "S3 upload of '%s': %" PRIu64 " bytes is over S3's 5 TiB for one object",
                       full, size);
        goto out;
    }
    if (size < s->part_bytes) {
        rc = s3_put_single(s, full, fd, size, fn, user, err);
        goto out;
    }
    j = malloc(sizeof *j);
    r = malloc(sizeof *r);
    xml = malloc(S3_XML_MAX);
    c = s3_easy_get(s);
    if (j == NULL || r == NULL || xml == NULL || c == NULL) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
        goto out;
    }
    s3_job_init(j, s, full, fd, size, fn, user);
    j->part_fn = s3_up_part;
    j->etag = calloc((size_t)j->nparts, sizeof *j->etag);
    if (j->etag == NULL) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory for %d parts", j->nparts);
        goto out;
    }
    for (int restart = 0;; restart++) {
        gb_err e = GB_ERR_INIT;
        int lost = 0;
        GB_CHECK_GOTO(s3_mpu_create(j, c, r, xml, err), rc, out);
        uint64_t t0 = gb_now_ms();
        rc = s3_run_parts(j, &e);
        lost = j->lost;
        if (rc == GPL_OK) {
            uint64_t t1 = gb_now_ms();
            rc = s3_mpu_complete(j, c, r, xml, &lost, &e);
            GB_DEBUG("'%s': %d parts in %" PRIu64 " ms, completed in %" PRIu64 " ms", full,
                     j->nparts, t1 - t0, gb_now_ms() - t1);
            if (rc == GPL_OK)
                break;
        }
        s3_mpu_abort(j, c, r, xml);
        if (!lost || restart >= S3_RESTARTS || atomic_load(&j->x.abort)) {
            rc = gb_seterr(err, e.code, "%s", e.msg);
            goto out;
        }
        GB_WARN("the multipart upload of '%s' in bucket '%s' was lost by the server (%s): "
                "starting it again",
                full, s->bucket, gb_errmsg(&e));
    }
out:
    if (j) {
        s3_job_fini(j);
        free(j);
    }
    s3_easy_put(s, c);
    free(xml);
    free(r);
    return rc;
}

static gpl_result_t s3_down_part(s3_job *j, CURL *c, int i, unsigned char *buf, gb_err *err) {
    uint64_t off = (uint64_t)i * j->part;
    uint64_t len = j->size - off < j->part ? j->size - off : j->part;
    gpl_result_t rc = GPL_OK;
    s3_req *r = malloc(sizeof *r);
    if (r == NULL)
        return gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
    s3_req_init(r, "GET", "GET", j->key);
    snprintf(r->extra[0], sizeof r->extra[0], "Range: bytes=%" PRIu64 "-%" PRIu64, off,
             off + len - 1);
    snprintf(r->extra[1], sizeof r->extra[1], "%s", j->if_match);
    r->out_fd = j->fd;
    r->out_off = off;
    r->x = &j->x;
    GB_CHECK_GOTO(s3_do(j->s, c, r, err), rc, out);
    if (r->status != 206 || r->out_len != len)
        rc = gb_seterr(err, GPL_ERR_PROTOCOL,
                       "S3 ranged GET of '%s' bytes %" PRIu64 "-%" PRIu64
                       ": status %ld with %" PRIu64 " bytes (a server without Range support?)",
                       j->key, off, off + len - 1, r->status, r->out_len);
out:
    free(r);
    return rc;
}

gpl_result_t ckpt_s3_get_file(ckpt_s3 *s, const char *key, int fd, uint64_t *size,
                              ckpt_s3_progress_fn fn, void *user, gb_err *err) {
    char full[S3_KEY_MAX];
    gpl_result_t rc = GPL_OK;
    s3_job *j = NULL;
    CURL *c = NULL;
    struct stat st;
    s3_req *r = malloc(sizeof *r);
    *size = 0;
    if (r == NULL)
        return gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
    GB_CHECK_GOTO(s3_key(s, key, full, err), rc, out);
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || (fl & O_APPEND)) { /* pwrite would append, not place, the parts */
        rc = gb_seterr(err, GPL_ERR_INVALID_ARG,
                       "S3 GET '%s': the file descriptor is %s; open it without O_APPEND", full,
                       fl < 0 ? "not open" : "O_APPEND");
        goto out;
    }
    c = s3_easy_get(s);
    if (c == NULL) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: no curl handle");
        goto out;
    }
    s3_req_init(r, "HeadObject", "HEAD", full);
    GB_CHECK_GOTO(s3_do(s, c, r, err), rc, out);
    if (!r->have_clen) {
        rc = gb_seterr(err, GPL_ERR_PROTOCOL, "S3 HEAD '%s' in bucket '%s': no Content-Length",
                       full, s->bucket);
        goto out;
    }
    uint64_t total = r->clen;
    char etag[S3_ETAG_MAX];
    snprintf(etag, sizeof etag, "%s", r->etag);
    if (total < s->part_bytes) {
        s3_xfer x = {.total = total, .fn = fn, .user = user, .direct = 1, .last_ms = gb_now_ms()};
        s3_req_init(r, "GET", "GET", full);
        if (etag[0]) /* the version the HEAD saw */
            snprintf(r->extra[0], sizeof r->extra[0], "If-Match: %s", etag);
        r->out_fd = fd;
        r->x = &x;
        GB_CHECK_GOTO(s3_do(s, c, r, err), rc, out);
        if (r->out_len != total) {
            rc = gb_seterr(err, GPL_ERR_PROTOCOL,
                           "S3 GET '%s' in bucket '%s': %" PRIu64 " bytes, the HEAD said %" PRIu64,
                           full, s->bucket, r->out_len, total);
            goto out;
        }
        s3_report(&x, 1);
    } else {
        j = malloc(sizeof *j);
        if (j == NULL) {
            rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
            goto out;
        }
        s3_job_init(j, s, full, fd, total, fn, user);
        j->part_fn = s3_down_part;
        if (etag[0])
            snprintf(j->if_match, sizeof j->if_match, "If-Match: %s", etag);
        GB_CHECK_GOTO(s3_run_parts(j, err), rc, out);
    }
    /* a file that was longer keeps no stale tail */
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size != total &&
        ftruncate(fd, (off_t)total) != 0) {
        rc = gb_seterr(err, GPL_ERR_SYSTEM, "S3 GET '%s': cutting the file to %" PRIu64 ": %s",
                       full, total, strerror(errno));
        goto out;
    }
    *size = total;
out:
    if (j) {
        s3_job_fini(j);
        free(j);
    }
    s3_easy_put(s, c);
    free(r);
    return rc;
}
