/* The S3 client's private parts, shared by its files:
 *   s3_client.c   the handle and whole objects
 *   s3_parts.c    large objects in parallel parts
 *   s3_request.c  one request: callbacks, signing, an attempt, retries
 *   s3_xml.c      the replies' few elements
 *   s3_util.c     encoding, digests, environment sizes, sleeps
 *   s3_creds.c    AWS credentials
 *
 * The S3 client behind durable checkpoints: one bucket and prefix per
 * handle; objects put and got whole from memory or a file, large files in
 * parallel parts (multipart upload, ranged GETs); listing and deleting.
 *
 * Signing is libcurl's (CURLOPT_AWS_SIGV4 "aws:amz:<region>:s3"); what this
 * file adds is what curl 7.88.1 (Debian 12) leaves to the caller:
 * - curl adds no x-amz-content-sha256 (S3 requires it) but signs with the
 *   value of one the caller sends: every body goes with its SHA-256 (the
 *   server checks it against the bytes it got: XAmzContentSHA256Mismatch),
 *   which is also the signature's payload hash. SHA-256 rather than
 *   Content-MD5: one pass, and OpenSSL's SHA-256 (SHA-NI) runs at twice
 *   MD5's speed.
 * - curl signs every header of CURLOPT_HTTPHEADER (x-amz-security-token,
 *   Range, If-Match): so no header is sent "empty to remove
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
#ifndef GPULAUNCH_S3_INT_H
#define GPULAUNCH_S3_INT_H

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
#define S3_SKEW_RETRIES 2      /* re-signings with the server's time in a row */
#define S3_RESTARTS 1          /* whole uploads started again after NoSuchUpload */
#define S3_ABORT_TRIES 3       /* attempts at AbortMultipartUpload */
#define S3_POOL_MAX 16         /* idle curl handles kept (their connections stay open) */
#define S3_IO_CHUNK (1u << 20) /* bytes read at once to hash a body */
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

/* what one attempt asks of s3_do */
enum { S3_DONE = 0, S3_RETRY = 1, S3_SKEW = 2, S3_EXPIRED = 3, S3_FAIL = 4 };

/* ---- shared between the files (each defined where its comment says) ---- */

/* s3_util.c */
/* The value of hex digit c, -1 if it is none. */
int s3_hex(int c);
/* Percent-encodes src for a URL as SigV4 canonicalizes it: RFC 3986
 * unreserved kept, and '/' too when keep_slash (paths). -1 if it does not fit. */
int s3_enc(const char *src, int keep_slash, char *out, size_t cap);
/* Appends "name=enc(value)" to q ("&" first unless empty). */
int s3_qadd(char *q, size_t cap, const char *name, const char *value);
/* Digest of [buf, len) with md (EVP_md5(), EVP_sha256()) into out. */
int s3_digest(const EVP_MD *md, const void *buf, size_t len, unsigned char *out);
/* d as lowercase hex (2n + 1 bytes of out), and as base64. */
void s3_hexstr(const unsigned char *d, size_t n, char *out);
void s3_b64(const unsigned char *d, int n, char *out);
/* SHA-256 of fd's [off, off+len) read in S3_IO_CHUNK pieces into buf, as hex. */
gpl_result_t s3_sha256_fd(int fd, uint64_t off, uint64_t len, unsigned char *buf, char hex[65],
                          gb_err *err);
/* A size from the environment: bytes with an optional k/m/g (KiB/MiB/GiB) suffix. */
int s3_env_size(const char *name, uint64_t def, uint64_t *out);
/* An integer from the environment within [lo, hi]. */
int s3_env_long(const char *name, long def, long lo, long hi, long *out);
/* Jitter for backoff. */
uint64_t s3_rand(void);
/* Sleeps ms, in short slices so that a stopped or aborted transfer ends soon. */
void s3_sleep_ms(uint64_t ms, const s3_xfer *x);
/* "S3 bucket 'b' at http://host" for messages */
const char *s3_where(const ckpt_s3 *s, char *buf, size_t cap);

/* s3_request.c */
/* Calls the transfer's progress function (at most every S3_PROGRESS_MS unless force). */
void s3_report(s3_xfer *x, int force);
/* r, retried as the header comment says; err holds why it failed. */
gpl_result_t s3_do(ckpt_s3 *s, CURL *c, s3_req *r, gb_err *err);
/* r emptied for one op ("PUT", "UploadPart") with method on key. */
void s3_req_init(s3_req *r, const char *op, const char *method, const char *key);

/* s3_client.c */
/* A curl handle from the handle's pool (its connection kept open), and back. */
CURL *s3_easy_get(ckpt_s3 *s);
void s3_easy_put(ckpt_s3 *s, CURL *c);
/* The whole key of name under the handle's prefix into out. */
gpl_result_t s3_key(const ckpt_s3 *s, const char *name, char *out, gb_err *err);

#endif
