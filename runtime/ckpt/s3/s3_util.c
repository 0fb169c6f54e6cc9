/* The S3 client's small helpers: URL encoding, query strings, digests and
 * their hex and base64 forms, sizes from the environment, backoff sleeps. */
#define GB_COMPONENT "s3"

#include "s3_int.h"

/* ---- small helpers ------------------------------------------------------ */

int s3_hex(int c) {
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
int s3_enc(const char *src, int keep_slash, char *out, size_t cap) {
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
int s3_qadd(char *q, size_t cap, const char *name, const char *value) {
    size_t n = strlen(q);
    int w = snprintf(q + n, cap - n, "%s%s=", n ? "&" : "", name);
    if (w < 0 || (size_t)w >= cap - n)
        return -1;
    n += (size_t)w;
    return s3_enc(value, 0, q + n, cap - n);
}

/* Digest of [buf, len) with md ("MD5", "SHA256") into out. */
int s3_digest(const EVP_MD *md, const void *buf, size_t len, unsigned char *out) {
    unsigned int n = 0;
    return EVP_Digest(buf, len, out, &n, md, NULL) == 1 ? 0 : -1;
}

void s3_hexstr(const unsigned char *d, size_t n, char *out) {
    static const char hexd[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hexd[d[i] >> 4];
        out[2 * i + 1] = hexd[d[i] & 15];
    }
    out[2 * n] = '\0';
}

void s3_b64(const unsigned char *d, int n, char *out) {
    EVP_EncodeBlock((unsigned char *)out, d, n); /* 16 bytes -> 24 chars + NUL */
}

/* SHA-256 of fd's [off, off+len) read in S3_IO_CHUNK pieces into buf, as hex. */
gpl_result_t s3_sha256_fd(int fd, uint64_t off, uint64_t len, unsigned char *buf, char hex[65],
                          gb_err *err) {
    gpl_result_t rc = GPL_OK;
    unsigned int n = 0;
    unsigned char d[32];
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        rc = gb_seterr(err, GPL_ERR_NOMEM, "S3: no SHA-256 from OpenSSL");
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
    EVP_DigestFinal_ex(ctx, d, &n);
    s3_hexstr(d, 32, hex);
out:
    EVP_MD_CTX_free(ctx);
    return rc;
}

/* A size from the environment: bytes with an optional k/m/g (KiB/MiB/GiB) suffix. */
int s3_env_size(const char *name, uint64_t def, uint64_t *out) {
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

int s3_env_long(const char *name, long def, long lo, long hi, long *out) {
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

uint64_t s3_rand(void) {
    static _Thread_local uint64_t st;
    if (st == 0)
        st = gb_now_ns() ^ ((uint64_t)(uintptr_t)&st << 17) ^ (uint64_t)getpid();
    st ^= st << 13; /* xorshift64: jitter, not secrets */
    st ^= st >> 7;
    st ^= st << 17;
    return st;
}

/* Sleeps ms, in short slices so that a stopped or aborted transfer ends soon. */
void s3_sleep_ms(uint64_t ms, const s3_xfer *x) {
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
const char *s3_where(const ckpt_s3 *s, char *buf, size_t cap) {
    snprintf(buf, cap, "S3 bucket '%s' at %s", s->bucket, s->endpoint);
    return buf;
}
