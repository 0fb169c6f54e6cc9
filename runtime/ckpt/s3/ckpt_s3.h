/* The S3 client that durable checkpoints go through (s3_client.c,
 * s3_parts.c) and the AWS credentials it signs with (s3_creds.c).
 *
 * A handle is one bucket and prefix ("s3://bucket/prefix"); every function
 * may be called from any thread, and two threads may use one handle at once.
 * Requests are signed by libcurl (SigV4), retried with backoff on the errors
 * S3 asks clients to retry, and re-signed with the server's time when the
 * clock here is off. Messages say what failed, where (bucket, endpoint, key)
 * and what to do.
 *
 * Environment (read by ckpt_s3_open):
 *   GPULAUNCH_S3_ENDPOINT, else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL:
 *     an S3-compatible server (path-style URLs); none: AWS
 *     (https://<bucket>.s3.<region>.amazonaws.com, virtual-hosted style)
 *   AWS_REGION, else AWS_DEFAULT_REGION, else us-east-1
 *   GPULAUNCH_S3_PART_BYTES  part size of uploads and ranged downloads
 *                            (default 64 MiB, at least 5 MiB; k/m/g suffixes)
 *   GPULAUNCH_S3_PARALLEL    parts in flight at once (default 8, 1..64)
 *   GPULAUNCH_S3_RETRIES     retries of one request (default 8, 0..30)
 *   GPULAUNCH_S3_CLOCK_OFFSET_S  test hook: seconds added to this machine's
 *                            clock when signing (tests of the skew correction)
 *   GPULAUNCH_S3_LIST_PAGE   test hook: keys per ListObjectsV2 page (1..1000)
 *   credentials: see ckpt_s3_creds_resolve below. */
#ifndef GPULAUNCH_CKPT_S3_H
#define GPULAUNCH_CKPT_S3_H

#include <stddef.h>
#include <stdint.h>

#include "gb_error.h"

typedef struct ckpt_s3 ckpt_s3;

/* progress: bytes done so far of this transfer; return non-zero to abort it
 * (GPL_ERR_TIMEOUT, message says aborted). Called on the caller's thread. */
typedef int (*ckpt_s3_progress_fn)(uint64_t done, uint64_t total, void *user);

/* url: "s3://bucket/optional/prefix". Resolves the endpoint, region and
 * credentials, then checks the bucket with one GET (ListObjectsV2, one key):
 * a bucket that does not exist (GPL_ERR_NOT_FOUND), credentials that are
 * refused (GPL_ERR_AUTH) or a bucket in another region (GPL_ERR_CONFIG) are
 * reported here, naming the bucket, the endpoint and what to do. */
gpl_result_t ckpt_s3_open(const char *url, ckpt_s3 **out, gb_err *err);
void ckpt_s3_close(ckpt_s3 *s);

/* keys are relative to the URL's prefix ("step-000000000120/r0-params") */
gpl_result_t ckpt_s3_put(ckpt_s3 *s, const char *key, const void *buf, size_t len, gb_err *err);

/* The whole file open at fd (pread; never read whole into memory): one PUT
 * below the part size, else a multipart upload with up to
 * GPULAUNCH_S3_PARALLEL parts in flight, each signed with its SHA-256. A failed
 * multipart upload is aborted (no parts left billed); one whose upload the
 * server lost (NoSuchUpload, e.g. a restarted server) is started again once. */
gpl_result_t ckpt_s3_put_file(ckpt_s3 *s, const char *key, int fd, uint64_t size,
                              ckpt_s3_progress_fn fn, void *user, gb_err *err);

/* Small objects into buf (cap bytes at most; GPL_ERR_LIMIT when larger);
 * GPL_ERR_NOT_FOUND on 404 / NoSuchKey. */
gpl_result_t ckpt_s3_get(ckpt_s3 *s, const char *key, void *buf, size_t cap, size_t *len,
                         gb_err *err);

/* The object into the file open at fd (pwrite from offset 0; a regular file
 * is cut to the object's length), ranged GETs of a part's size in parallel
 * for large objects, all of one version (If-Match its ETag); *size its
 * length; GPL_ERR_NOT_FOUND on 404. */
gpl_result_t ckpt_s3_get_file(ckpt_s3 *s, const char *key, int fd, uint64_t *size,
                              ckpt_s3_progress_fn fn, void *user, gb_err *err);

/* ListObjectsV2 under prefix (relative to the URL's prefix), all pages:
 * fn(name relative to the URL's prefix, size, user) for each key, or with
 * delim "/" for each common prefix (size 0, name ending in "/") too; fn
 * returns non-zero to stop (then GPL_OK). */
typedef int (*ckpt_s3_list_fn)(const char *name, uint64_t size, void *user);
gpl_result_t ckpt_s3_list(ckpt_s3 *s, const char *prefix, const char *delim, ckpt_s3_list_fn fn,
                          void *user, gb_err *err);

/* GPL_OK also when the key did not exist (S3 answers 204 either way). */
gpl_result_t ckpt_s3_delete(ckpt_s3 *s, const char *key, gb_err *err);

/* what the handle did, for logs and metrics: HTTP requests sent (retries
 * included), retries, payload bytes sent and received */
typedef struct ckpt_s3_stats {
    uint64_t requests, retries, bytes_up, bytes_down;
} ckpt_s3_stats;
void ckpt_s3_stats_get(ckpt_s3 *s, ckpt_s3_stats *out);

/* ---- Internal to the s3/ files (and test_s3.c) --------------------------- */

#define CKPT_S3_KEY_ID_MAX 128      /* bytes of an access key id, NUL included */
#define CKPT_S3_SECRET_MAX 128      /* bytes of a secret access key, NUL included */
#define CKPT_S3_TOKEN_MAX 8192      /* bytes of a session token (STS: ~1-2 KB, more with tags) */
#define CKPT_S3_CRED_SOURCE_MAX 320 /* bytes of "where the credentials came from" */
#define CKPT_S3_REFRESH_S 300       /* temporary credentials are renewed this long before expiry */

enum ckpt_s3_cred_kind {
    CKPT_S3_CRED_ENV = 0,          /* AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY */
    CKPT_S3_CRED_WEB_IDENTITY = 1, /* AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN via STS */
    CKPT_S3_CRED_IMDS = 2          /* the EC2 instance role, IMDSv2 */
};

typedef struct ckpt_s3_creds {
    int kind; /* enum ckpt_s3_cred_kind */
    char key_id[CKPT_S3_KEY_ID_MAX];
    char secret[CKPT_S3_SECRET_MAX];
    char token[CKPT_S3_TOKEN_MAX];        /* "" for long-term keys */
    double expires;                       /* wall-clock seconds since the epoch; 0: never */
    char source[CKPT_S3_CRED_SOURCE_MAX]; /* e.g. "AWS_ACCESS_KEY_ID (environment)" */
} ckpt_s3_creds;

/* Credentials as the AWS SDKs find them, in their order: the environment
 * (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN); a web
 * identity (AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN, AWS_ROLE_SESSION_NAME:
 * STS AssumeRoleWithWebIdentity at AWS_ENDPOINT_URL_STS, else
 * AWS_ENDPOINT_URL, else https://sts.<region>.amazonaws.com, as EKS IRSA sets
 * them); the instance role through IMDSv2 (AWS_EC2_METADATA_SERVICE_ENDPOINT,
 * default http://169.254.169.254; AWS_EC2_METADATA_DISABLED=true skips it).
 * GPL_ERR_AUTH listing what was tried when none is found. */
gpl_result_t ckpt_s3_creds_resolve(const char *region, ckpt_s3_creds *out, gb_err *err);
/* Renews temporary credentials from the source they came from. */
gpl_result_t ckpt_s3_creds_refresh(const char *region, ckpt_s3_creds *c, gb_err *err);
/* Whether c should be renewed at wall-clock time now (within CKPT_S3_REFRESH_S of expiry). */
int ckpt_s3_creds_stale(const ckpt_s3_creds *c, double now);
/* "2024-05-01T12:34:56Z" (fractions of a second allowed) as seconds since the epoch; -1 if not
 * that. */
double ckpt_s3_parse_iso8601(const char *s);

/* The XML replies' few known elements (see s3_int.h for why not a parser
 * library). ckpt_s3_xml_find: the first <tag>...</tag> (or <tag/>) in
 * [p, end): its inner text in [*in, *in_end) and *after past its end tag;
 * 0, or -1 when there is none. ckpt_s3_xml_decode: the text with the five
 * XML entities and numeric character references decoded into out (cap bytes,
 * NUL included); its length, or -1 when it does not fit or is malformed.
 * ckpt_s3_xml_get: both, on the first <tag> of xml[0, len). */
int ckpt_s3_xml_find(const char *p, const char *end, const char *tag, const char **in,
                     const char **in_end, const char **after);
long ckpt_s3_xml_decode(const char *in, size_t len, char *out, size_t cap);
long ckpt_s3_xml_get(const char *xml, size_t len, const char *tag, char *out, size_t cap);

#endif
