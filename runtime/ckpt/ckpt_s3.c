/* The S3 client behind durable checkpoints: one bucket and prefix per
 * handle; objects put and got whole from memory or a file, large files in
 * parallel parts (multipart upload, ranged GETs); listing and deleting.
 *
 * Signing is libcurl's (CURLOPT_AWS_SIGV4 "aws:amz:<region>:s3"); what this
 * file adds is what curl 7.88.1 (Debian 12) leaves to the caller:
 * - curl adds no x-amz-content-sha256 (S3 requires it) but signs with the
 *   value of one the caller sends: bodies from files go UNSIGNED-PAYLOAD with
 *   a Content-MD5 the server checks, memory bodies up to S3_SHA256_BODY_MAX
 *   with their SHA-256, empty ones with the empty string's.
 * - curl signs every header of CURLOPT_HTTPHEADER (x-amz-security-token,
 *   Content-MD5, Range, If-Match): so no header is sent "empty to remove
 *   it" (an "Expect:" would be signed yet not sent).
 * - The canonical query and path are taken as written: queries are built
 *   here sorted by name, every value percent-encoded (RFC 3986 unreserved
 *   kept), keys percent-encoded but for '/'; CURLOPT_PATH_AS_IS keeps them.
 * - Clock skew: curl signs with time(), or with an X-Amz-Date the caller
 *   sends, but 7.88 then sends that header twice (curl issue 11738, fixed in
 *   8.x), which S3 and moto read as "d,d": SignatureDoesNotMatch. So when the
 *   clock must be corrected (a 403 RequestTimeTooSkewed gave the server's
 *   Date), curl signs the request against a socket pair instead of the
 *   server (s3_sign_at) and the real request carries the Authorization header
 *   curl computed there (curl leaves a given one alone) and one X-Amz-Date.
 *   The signature is still curl's; no hand-written crypto.
 *
 * XML: S3's replies are read for a handful of known elements (UploadId,
 * ETag, Contents/Key/Size, CommonPrefixes/Prefix, IsTruncated,
 * NextContinuationToken, Error/Code/Message) by a bounded extractor with XML
 * entity decoding (ckpt_s3_xml_*), not libxml2: Debian's libxml2 links ICU
 * (libicudata alone is ~30 MB) that auditwheel would graft into every wheel,
 * and S3's replies use no namespaces, attributes, CDATA or nesting of a name
 * inside itself that these elements would need. Every reply is read into a
 * buffer of a named size first (S3_XML_MAX, S3_ERR_BODY_MAX).
 *
 * Retries: exponential backoff with jitter (S3_BACKOFF_BASE_MS doubling to
 * S3_BACKOFF_CAP_MS, GPULAUNCH_S3_RETRIES times) on connection errors,
 * timeouts, 5xx (503 SlowDown), 408, 429 and 400 RequestTimeout; a
 * RequestTimeTooSkewed is re-signed at once with the server's time; expired
 * temporary credentials are renewed once. A part is retried alone. */
#define GB_COMPONENT "s3"

#include "ckpt_s3.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gb_log.h"
#include "gb_time.h"

#define S3_BUCKET_MAX 64                    /* bytes of a bucket name, NUL included (S3: 3-63) */
#define S3_KEY_MAX 1025                     /* bytes of a whole key, NUL included (S3: 1024) */
#define S3_ENDPOINT_MAX 512                 /* bytes of the endpoint URL */
#define S3_REGION_MAX 64                    /* bytes of a region name */
#define S3_URL_MAX 8192                     /* bytes of a request URL (a key encodes to 3x) */
#define S3_QUERY_MAX 4096                   /* bytes of a request's query string */
#define S3_HDR_MAX (CKPT_S3_TOKEN_MAX + 64) /* bytes of one request header line */
#define S3_AUTH_MAX 1024                    /* bytes of the Authorization header curl computes */
#define S3_ERR_BODY_MAX 16384               /* bytes of an error reply kept (S3's are < 1 KB) */
#define S3_XML_MAX (4u << 20)    /* bytes of a list/initiate/complete reply (1000 keys) */
#define S3_CODE_MAX 64           /* bytes of an error code ("RequestTimeTooSkewed") */
#define S3_MSG_MAX 256           /* bytes of an error message kept */
#define S3_ETAG_MAX 136          /* bytes of an ETag, quotes included */
#define S3_UPLOAD_ID_MAX 1024    /* bytes of a multipart upload id */
#define S3_CONT_TOKEN_MAX 2048   /* bytes of a ListObjectsV2 continuation token */
#define S3_LIST_PAGES_MAX 100000 /* pages of one listing (1000 keys each) */
#define S3_PARTS_MAX 10000       /* S3's most parts of one upload */
#define S3_PART_MIN (5ull << 20) /* S3's smallest part but the last */
#define S3_PART_DEFAULT (64ull << 20)
#define S3_PART_LIMIT (5ull << 30) /* S3's largest part, and largest single PUT */
#define S3_OBJECT_MAX (5ull << 40) /* S3's largest object */
#define S3_PARALLEL_DEFAULT 8
#define S3_PARALLEL_MAX 64
#define S3_RETRIES_DEFAULT 8
#define S3_RETRIES_MAX 30
#define S3_BACKOFF_BASE_MS 100
#define S3_BACKOFF_CAP_MS 5000
#define S3_SKEW_RETRIES 2             /* re-signings with the server's time in a row */
#define S3_RESTARTS 1                 /* whole uploads started again after NoSuchUpload */
#define S3_ABORT_TRIES 3              /* attempts at AbortMultipartUpload */
#define S3_POOL_MAX 16                /* idle curl handles kept (their connections stay open) */
#define S3_IO_CHUNK (1u << 20)        /* bytes read at once to hash a body */
#define S3_SHA256_BODY_MAX (1u << 20) /* memory bodies up to this are signed with their SHA-256 */
#define S3_CONNECT_TIMEOUT_MS 10000
#define S3_STALL_BYTES 1024     /* a transfer under this many bytes/s ... */
#define S3_STALL_S 60           /* ... for this long is cut and retried */
#define S3_PROGRESS_MS 200      /* the caller's progress function at most this often */
#define S3_SIGN_TIMEOUT_MS 5000 /* signing at a corrected time (loopback only) */
/* bytes of one <Part> of the CompleteMultipartUpload body */
#define S3_COMPLETE_PART_MAX (64 + S3_ETAG_MAX)

/* x-amz-content-sha256 of an empty body */
#define S3_EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

struct ckpt_s3 {
    char url[S3_ENDPOINT_MAX + S3_KEY_MAX]; /* as given, for messages */
    char bucket[S3_BUCKET_MAX];
    char prefix[S3_KEY_MAX];        /* "" or ending in '/' */
    char endpoint[S3_ENDPOINT_MAX]; /* scheme://authority, no trailing '/' */
    char region[S3_REGION_MAX];
    char sigv4[S3_REGION_MAX + 16]; /* "aws:amz:<region>:s3" */
    int path_style;
    uint64_t part_bytes;
    int parallel, retries;
    int64_t clock_hook_s;   /* GPULAUNCH_S3_CLOCK_OFFSET_S */
    _Atomic int64_t skew_s; /* the server's clock minus ours (hook included), learnt */
    pthread_mutex_t mu;     /* creds, pool */
    ckpt_s3_creds creds;
    CURL *pool[S3_POOL_MAX];
    int npool;
    _Atomic uint64_t requests, retries_done, bytes_up, bytes_down;
};

/* One transfer's progress and cancellation, shared by its parts. */
typedef struct s3_xfer {
    _Atomic uint64_t done;
    uint64_t total;
    _Atomic int abort; /* the caller's progress function asked to stop */
    _Atomic int stop;  /* another part failed: stop this one */
    ckpt_s3_progress_fn fn;
    void *user;
    int direct;       /* the request runs on the caller's thread: call fn from curl */
    uint64_t last_ms; /* when fn was last called (caller's thread only) */
} s3_xfer;

/* One request, retried as a whole by s3_do. */
typedef struct s3_req {
    const char *op;     /* for messages: "PUT", "UploadPart", ... */
    const char *method; /* GET HEAD PUT POST DELETE */
    const char *key;    /* whole key (prefix included); NULL: the bucket */
    char query[S3_QUERY_MAX];
    /* body: mem, or fd at off; has_body also for an empty PUT/POST */
    int has_body;
    const unsigned char *mem;
    int fd;
    uint64_t off, len, pos;
    char md5_b64[32];                /* Content-MD5, "" for none */
    char sha256[72];                 /* x-amz-content-sha256, "" for UNSIGNED-PAYLOAD */
    char extra[2][S3_ETAG_MAX + 48]; /* "Range: ...", "If-Match: ..." */
    /* where a 2xx body goes: out (bounded), out_fd at out_off, or nowhere */
    char *out;
    size_t out_cap;
    int out_fd;
    uint64_t out_off;
    s3_xfer *x;
    /* filled by the last attempt */
    long status;
    uint64_t out_len;
    int overflow, io_errno;
    const char *io_what;
    uint64_t counted; /* bytes of this attempt added to x->done */
    char etag[S3_ETAG_MAX];
    char date[64];
    char bucket_region[S3_REGION_MAX];
    uint64_t clen;
    int have_clen;
    char code[S3_CODE_MAX];
    char msg[S3_MSG_MAX];
    char curl_err[CURL_ERROR_SIZE];
    char cred_source[CKPT_S3_CRED_SOURCE_MAX]; /* of the credentials this attempt signed with */
    char errbody[S3_ERR_BODY_MAX];
    size_t errlen;
} s3_req;

enum { S3_DONE = 0, S3_RETRY = 1, S3_SKEW = 2, S3_EXPIRED = 3, S3_FAIL = 4 };

static pthread_once_t s3_once = PTHREAD_ONCE_INIT;
static CURLcode s3_init_rc = CURLE_OK;

static void s3_global_init(void) { s3_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

/* ---- small helpers ------------------------------------------------------ */

static int s3_hex(int c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-encodes src for a URL as SigV4 canonicalizes it: RFC 3986
 * unreserved kept, and '/' too when keep_slash (paths). -1 if it does not fit. */
static int s3_enc(const char *src, int keep_slash, char *out, size_t cap) {
    static const char hexd[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)src; *p; p++) {
        int keep = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
                   (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.' || *p == '~' ||
                   (keep_slash && *p == '/');
        if (o + (keep ? 1 : 3) >= cap)
            return -1;
        if (keep) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hexd[*p >> 4];
            out[o++] = hexd[*p & 15];
        }
    }
    out[o] = '\0';
    return 0;
}

/* Appends "name=enc(value)" to q ("&" first unless empty). */
static int s3_qadd(char *q, size_t cap, const char *name, const char *value) {
    size_t n = strlen(q);
    int w = snprintf(q + n, cap - n, "%s%s=", n ? "&" : "", name);
    if (w < 0 || (size_t)w >= cap - n)
        return -1;
    n += (size_t)w;
    return s3_enc(value, 0, q + n, cap - n);
}

/* Digest of [buf, len) with md ("MD5", "SHA256") into out. */
static int s3_digest(const EVP_MD *md, const void *buf, size_t len, unsigned char *out) {
    unsigned int n = 0;
    return EVP_Digest(buf, len, out, &n, md, NULL) == 1 ? 0 : -1;
}

static void s3_hexstr(const unsigned char *d, size_t n, char *out) {
    static const char hexd[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hexd[d[i] >> 4];
        out[2 * i + 1] = hexd[d[i] & 15];
    }
    out[2 * n] = '\0';
}

static void s3_b64(const unsigned char *d, int n, char *out) {
    EVP_EncodeBlock((unsigned char *)out, d, n); /* 16 bytes -> 24 chars + NUL */
}

/* MD5 of fd's [off, off+len) read in S3_IO_CHUNK pieces into buf. */
static gpl_result_t s3_md5_fd(int fd, uint64_t off, uint64_t len, unsigned char *buf,
                              unsigned char md5[16], gb_err *err) {
    gpl_result_t rc = GPL_OK;
    unsigned int n = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL || EVP_DigestInit_ex(ctx, EVP_md5(), NULL) != 1) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: no MD5 from OpenSSL (a FIPS-only build?)");
        goto out;
    }
    for (uint64_t done = 0; done < len;) {
        size_t want = len - done < S3_IO_CHUNK ? (size_t)(len - done) : S3_IO_CHUNK;
        ssize_t got = pread(fd, buf, want, (off_t)(off + done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            rc = gb_seterr(err, GPL_ERR_SYSTEM,
                           "S3 upload: reading the file at offset %" PRIu64 ": %s", off + done,
                           got < 0 ? strerror(errno) : "it ended early (did it shrink?)");
            goto out;
        }
        EVP_DigestUpdate(ctx, buf, (size_t)got);
        done += (uint64_t)got;
    }
    EVP_DigestFinal_ex(ctx, md5, &n);
out:
    EVP_MD_CTX_free(ctx);
    return rc;
}

/* A size from the environment: bytes with an optional k/m/g (KiB/MiB/GiB) suffix. */
static int s3_env_size(const char *name, uint64_t def, uint64_t *out) {
    const char *v = getenv(name);
    *out = def;
    if (v == NULL || *v == '\0')
        return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno || end == v)
        return -1;
    int shift = 0;
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    default:
        break;
    }
    if (shift && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0 || strcmp(end, "b") == 0))
        end += strlen(end);
    if (*end != '\0' || n > (UINT64_MAX >> shift))
        return -1;
    *out = (uint64_t)n << shift;
    return 0;
}

static int s3_env_long(const char *name, long def, long lo, long hi, long *out) {
    const char *v = getenv(name);
    *out = def;
    if (v == NULL || *v == '\0')
        return 0;
    char *end = NULL;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end != '\0' || n < lo || n > hi)
        return -1;
    *out = n;
    return 0;
}

static uint64_t s3_rand(void) {
    static _Thread_local uint64_t st;
    if (st == 0)
        st = gb_now_ns() ^ ((uint64_t)(uintptr_t)&st << 17) ^ (uint64_t)getpid();
    st ^= st << 13; /* xorshift64: jitter, not secrets */
    st ^= st >> 7;
    st ^= st << 17;
    return st;
}

/* Sleeps ms, in short slices so that a stopped or aborted transfer ends soon. */
static void s3_sleep_ms(uint64_t ms, const s3_xfer *x) {
    uint64_t end = gb_now_ms() + ms;
    for (uint64_t now = gb_now_ms(); now < end; now = gb_now_ms()) {
        if (x && (atomic_load(&x->abort) || atomic_load(&x->stop)))
            return;
        uint64_t left = end - now < 50 ? end - now : 50;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(left * 1000000)};
        nanosleep(&ts, NULL);
    }
}

/* "S3 bucket 'b' at http://host" for messages */
static const char *s3_where(const ckpt_s3 *s, char *buf, size_t cap) {
    snprintf(buf, cap, "S3 bucket '%s' at %s", s->bucket, s->endpoint);
    return buf;
}

/* ---- the XML extractor -------------------------------------------------- */

#define S3_XML_TAG_MAX 64 /* bytes of an element name looked for */

int ckpt_s3_xml_find(const char *p, const char *end, const char *tag, const char **in,
                     const char **in_end, const char **after) {
    size_t tl = strlen(tag);
    char close[S3_XML_TAG_MAX + 4];
    if (tl == 0 || tl >= S3_XML_TAG_MAX)
        return -1;
    int cl = snprintf(close, sizeof close, "</%s>", tag);
    while (p < end) {
        const char *lt = memchr(p, '<', (size_t)(end - p));
        if (lt == NULL || (size_t)(end - lt) < tl + 2)
            return -1;
        const char *r = lt + 1 + tl;
        p = lt + 1;
        if (memcmp(lt + 1, tag, tl) != 0)
            continue;
        const char *start;
        if (*r == '>') {
            start = r + 1;
        } else if (*r == '/' || *r == ' ' || *r == '\t' || *r == '\n' || *r == '\r') {
            const char *gt = memchr(r, '>', (size_t)(end - r)); /* attributes (xmlns) */
            if (gt == NULL)
                return -1;
            if (gt[-1] == '/') { /* <tag/>: empty */
                *in = *in_end = *after = gt + 1;
                return 0;
            }
            start = gt + 1;
        } else {
            continue; /* a longer name: <KeyCount> when looking for <Key> */
        }
        const char *c = memmem(start, (size_t)(end - start), close, (size_t)cl);
        if (c == NULL)
            return -1;
        *in = start;
        *in_end = c;
        *after = c + cl;
        return 0;
    }
    return -1;
}

/* UTF-8 of code point cp into o; its length, 0 if not a character. */
static size_t s3_utf8(unsigned long cp, char *o) {
    if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

long ckpt_s3_xml_decode(const char *in, size_t len, char *out, size_t cap) {
    static const struct {
        const char *name;
        char ch;
    } ents[] = {{"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
    size_t o = 0;
    if (cap == 0)
        return -1;
    for (size_t i = 0; i < len;) {
        char buf[4];
        size_t n = 1;
        buf[0] = in[i];
        if (in[i] == '\0' || in[i] == '<')
            return -1; /* markup inside a leaf's text: not what S3 sends */
        if (in[i] != '&') {
            i++;
        } else {
            const char *semi = memchr(in + i, ';', len - i < 12 ? len - i : 12);
            if (semi == NULL)
                return -1;
            const char *name = in + i + 1;
            size_t nl = (size_t)(semi - name);
            n = 0;
            if (nl >= 2 && name[0] == '#') {
                unsigned long cp = 0;
                int base = (name[1] == 'x' || name[1] == 'X') ? 16 : 10;
                size_t k = base == 16 ? 2 : 1;
                if (k >= nl)
                    return -1;
                for (; k < nl; k++) {
                    int d = s3_hex((unsigned char)name[k]);
                    if (d < 0 || d >= base)
                        return -1;
                    cp = cp * (unsigned long)base + (unsigned long)d;
                    if (cp > 0x10FFFF)
                        return -1;
                }
                n = s3_utf8(cp, buf);
            } else {
                for (size_t e = 0; e < sizeof ents / sizeof ents[0]; e++)
                    if (strlen(ents[e].name) == nl && memcmp(ents[e].name, name, nl) == 0) {
                        buf[0] = ents[e].ch;
                        n = 1;
                    }
            }
            if (n == 0)
                return -1;
            i = (size_t)(semi - in) + 1;
        }
        if (o + n >= cap)
            return -1;
        memcpy(out + o, buf, n);
        o += n;
    }
    out[o] = '\0';
    return (long)o;
}

long ckpt_s3_xml_get(const char *xml, size_t len, const char *tag, char *out, size_t cap) {
    const char *in, *in_end, *after;
    if (ckpt_s3_xml_find(xml, xml + len, tag, &in, &in_end, &after) != 0)
        return -1;
    return ckpt_s3_xml_decode(in, (size_t)(in_end - in), out, cap);
}

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

static void s3_report(s3_xfer *x, int force) {
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
    if (r->md5_b64[0])
        bad |= s3_hadd(&h, "Content-MD5: %s", r->md5_b64);
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
    if (r->status >= 500 || r->status == 408 || r->status == 429 ||
        (r->status == 400 && strcmp(r->code, "RequestTimeout") == 0)) {
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
static gpl_result_t s3_do(ckpt_s3 *s, CURL *c, s3_req *r, gb_err *err) {
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

static void s3_req_init(s3_req *r, const char *op, const char *method, const char *key) {
    memset(r, 0, sizeof *r);
    r->op = op;
    r->method = method;
    r->key = key;
    r->fd = -1;
    r->out_fd = -1;
}

/* ---- the handle ----------------------------------------------------------- */

static CURL *s3_easy_get(ckpt_s3 *s) {
    CURL *c = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->npool > 0)
        c = s->pool[--s->npool];
    pthread_mutex_unlock(&s->mu);
    return c ? c : curl_easy_init();
}

static void s3_easy_put(ckpt_s3 *s, CURL *c) {
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
static gpl_result_t s3_key(const ckpt_s3 *s, const char *name, char *out, gb_err *err) {
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

gpl_result_t ckpt_s3_put(ckpt_s3 *s, const char *key, const void *buf, size_t len, gb_err *err) {
    char full[S3_KEY_MAX];
    unsigned char d[32];
    gpl_result_t rc = GPL_OK;
    CURL *c = NULL;
    s3_req *r = malloc(sizeof *r);
    if (r == NULL)
        return gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
    GB_CHECK_GOTO(s3_key(s, key, full, err), rc, out);
    if (len > S3_PART_LIMIT) {
        rc = gb_seterr(err, GPL_ERR_LIMIT, "S3 PUT '%s': %zu bytes is over S3's 5 GiB for one PUT",
                       full, len);
        goto out;
    }
    s3_req_init(r, "PUT", "PUT", full);
    r->has_body = 1;
    r->mem = buf ? buf : (const unsigned char *)"";
    r->len = len;
    if (s3_digest(EVP_md5(), r->mem, len, d) != 0) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: no MD5 from OpenSSL");
        goto out;
    }
    s3_b64(d, 16, r->md5_b64);
    if (len <= S3_SHA256_BODY_MAX && s3_digest(EVP_sha256(), r->mem, len, d) == 0)
        s3_hexstr(d, 32, r->sha256);
    c = s3_easy_get(s);
    if (c == NULL) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: no curl handle");
        goto out;
    }
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
    s3_req *r = malloc(sizeof *r);
    *len = 0;
    if (r == NULL)
        return gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
    GB_CHECK_GOTO(s3_key(s, key, full, err), rc, out);
    s3_req_init(r, "GET", "GET", full);
    r->out = buf;
    r->out_cap = cap;
    c = s3_easy_get(s);
    if (c == NULL) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: no curl handle");
        goto out;
    }
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
    s3_req *r = malloc(sizeof *r);
    if (r == NULL)
        return gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
    GB_CHECK_GOTO(s3_key(s, key, full, err), rc, out);
    s3_req_init(r, "DELETE", "DELETE", full);
    c = s3_easy_get(s);
    if (c == NULL) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: no curl handle");
        goto out;
    }
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
    unsigned char (*md5)[16];
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
    free(j->md5);
}

static gpl_result_t s3_up_part(s3_job *j, CURL *c, int i, unsigned char *buf, gb_err *err) {
    uint64_t off = (uint64_t)i * j->part;
    uint64_t len = j->size - off < j->part ? j->size - off : j->part;
    char num[16];
    gpl_result_t rc = GPL_OK;
    s3_req *r = malloc(sizeof *r);
    if (r == NULL)
        return gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
    GB_CHECK_GOTO(s3_md5_fd(j->fd, off, len, buf, j->md5[i], err), rc, out);
    s3_req_init(r, "UploadPart", "PUT", j->key);
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
    s3_b64(j->md5[i], 16, r->md5_b64);
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

/* The ETag S3 gives a multipart object: MD5 of the parts' MD5s, "-" parts. */
static void s3_mpu_etag(const s3_job *j, char *out, size_t cap) {
    unsigned char *all = malloc((size_t)j->nparts * 16), d[16];
    char hex[40];
    out[0] = '\0';
    if (all == NULL)
        return;
    for (int i = 0; i < j->nparts; i++)
        memcpy(all + 16 * i, j->md5[i], 16);
    if (s3_digest(EVP_md5(), all, (size_t)j->nparts * 16, d) == 0) {
        s3_hexstr(d, 16, hex);
        snprintf(out, cap, "\"%s-%d\"", hex, j->nparts);
    }
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

/* Aborts the upload so that no parts stay billed; failures only logged. */
static void s3_mpu_abort(s3_job *j, CURL *c, s3_req *r) {
    gb_err e = GB_ERR_INIT;
    for (int attempt = 0; attempt < S3_ABORT_TRIES; attempt++) {
        gb_clearerr(&e);
        s3_req_init(r, "AbortMultipartUpload", "DELETE", j->key);
        if (s3_qadd(r->query, sizeof r->query, "uploadId", j->upload_id))
            return;
        if (s3_do(j->s, c, r, &e) == GPL_OK || r->status == 404)
            return;
    }
    GB_WARN("could not abort the multipart upload of '%s' in bucket '%s' (its parts stay billed "
            "until a lifecycle rule removes them): %s",
            j->key, j->s->bucket, gb_errmsg(&e));
}

/* The whole fd by one PUT (below the part size). */
static gpl_result_t s3_put_single(ckpt_s3 *s, const char *full, int fd, uint64_t size,
                                  ckpt_s3_progress_fn fn, void *user, gb_err *err) {
    unsigned char md5[16];
    gpl_result_t rc = GPL_OK;
    s3_xfer x = {.total = size, .fn = fn, .user = user, .direct = 1, .last_ms = gb_now_ms()};
    CURL *c = s3_easy_get(s);
    s3_req *r = malloc(sizeof *r);
    unsigned char *buf = malloc(S3_IO_CHUNK);
    if (c == NULL || r == NULL || buf == NULL) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory");
        goto out;
    }
    GB_CHECK_GOTO(s3_md5_fd(fd, 0, size, buf, md5, err), rc, out);
    s3_req_init(r, "PUT", "PUT", full);
    r->has_body = 1;
    r->fd = fd;
    r->len = size;
    s3_b64(md5, 16, r->md5_b64);
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
    j->md5 = calloc((size_t)j->nparts, sizeof *j->md5);
    if (j->etag == NULL || j->md5 == NULL) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: out of memory for %d parts", j->nparts);
        goto out;
    }
    for (int restart = 0;; restart++) {
        gb_err e = GB_ERR_INIT;
        int lost = 0;
        GB_CHECK_GOTO(s3_mpu_create(j, c, r, xml, err), rc, out);
        rc = s3_run_parts(j, &e);
        lost = j->lost;
        if (rc == GPL_OK) {
            rc = s3_mpu_complete(j, c, r, xml, &lost, &e);
            if (rc == GPL_OK)
                break;
        }
        s3_mpu_abort(j, c, r);
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
