/* AWS credentials for the S3 client, found as the AWS SDKs find them: the
 * environment, then a web identity token exchanged at STS (EKS IRSA), then
 * the EC2 instance role through IMDSv2; and renewed from the same source
 * before temporary ones expire. Each result records where it came from, so
 * that an S3 error can say which credentials were refused.
 *
 * Not here (yet): the shared files (~/.aws/credentials, ~/.aws/config
 * profiles, SSO, credential_process) and the ECS container endpoint. */
#define GB_COMPONENT "s3"

#include "ckpt_s3.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gb_log.h"
#include "gb_time.h"

#define CREDS_REPLY_MAX 65536     /* bytes of an STS or IMDS reply */
#define CREDS_WEB_TOKEN_MAX 16384 /* bytes of a web identity token (a JWT: ~1 KB) */
#define CREDS_URL_MAX 1024        /* bytes of an STS or IMDS URL */
#define CREDS_FORM_MAX (3 * CREDS_WEB_TOKEN_MAX + 4096) /* the STS request body */
#define CREDS_ROLE_MAX 256         /* bytes of an instance role name (IAM: 64) */
#define CREDS_TRIED_MAX 400        /* bytes of "what was tried" in messages */
#define CREDS_STS_TIMEOUT_MS 10000 /* one STS exchange */
#define CREDS_IMDS_CONNECT_MS 1000 /* the SDKs' 1 s: off EC2 nothing answers */
#define CREDS_IMDS_TIMEOUT_MS 2000
#define CREDS_IMDS_TOKEN_TTL_S 21600 /* the IMDSv2 session token's life (6 h, the SDKs') */

typedef struct creds_buf {
    char *p;
    size_t len, cap;
    int overflow;
} creds_buf;

static size_t creds_on_body(char *b, size_t size, size_t n, void *u) {
    creds_buf *o = u;
    size_t len = size * n;
    if (o->len + len >= o->cap) {
        o->overflow = 1;
        return 0;
    }
    memcpy(o->p + o->len, b, len);
    o->len += len;
    o->p[o->len] = '\0';
    return len;
}

/* One small HTTP exchange: method url with headers and body (NULL: none);
 * the reply into out. Returns the HTTP status, 0 when nothing answered (why
 * says what curl saw), -1 when the reply is over its bound. */
static long creds_http(const char *method, const char *url, const char *const *headers,
                       const char *body, long connect_ms, long timeout_ms, creds_buf *out,
                       char *why, size_t whycap) {
    struct curl_slist *h = NULL;
    long status = 0;
    char cerr[CURL_ERROR_SIZE] = "";
    CURL *c = curl_easy_init();
    out->len = 0;
    out->overflow = 0;
    out->p[0] = '\0';
    why[0] = '\0';
    if (c == NULL) {
        snprintf(why, whycap, "no curl handle");
        return 0;
    }
    for (int i = 0; headers && headers[i]; i++) {
        struct curl_slist *t = curl_slist_append(h, headers[i]);
        if (t == NULL) {
            snprintf(why, whycap, "out of memory");
            goto out;
        }
        h = t;
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "gpulaunch-s3");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, creds_on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
    if (strstr(url, "/latest/")) /* the metadata service is link-local: never through a proxy */
        curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "POST") != 0)
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    CURLcode cc = curl_easy_perform(c);
    if (out->overflow) {
        snprintf(why, whycap, "a reply over %zu bytes", out->cap - 1);
        status = -1;
    } else if (cc != CURLE_OK) {
        snprintf(why, whycap, "%s", cerr[0] ? cerr : curl_easy_strerror(cc));
    } else {
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    }
out:
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return status;
}

double ckpt_s3_parse_iso8601(const char *s) {
    struct tm tm;
    int y, mo, d, h, mi, se, n = 0;
    if (s == NULL || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &se, &n) != 6)
        return -1;
    const char *p = s + n;
    if (*p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++)
            ;
    if (strcmp(p, "Z") != 0 && strcmp(p, "+00:00") != 0)
        return -1;
    memset(&tm, 0, sizeof tm);
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = se;
    time_t t = timegm(&tm);
    return t == (time_t)-1 ? -1 : (double)t;
}

int ckpt_s3_creds_stale(const ckpt_s3_creds *c, double now) {
    return c->expires > 0 && now >= c->expires - CKPT_S3_REFRESH_S;
}

/* Copies v into dst (cap bytes); -1 when it is empty or does not fit. */
static int creds_copy(char *dst, size_t cap, const char *v) {
    if (v == NULL || *v == '\0' || strlen(v) >= cap)
        return -1;
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

/* ---- the environment ---------------------------------------------------- */

/* 1 found, 0 not set, -1 half set or unusable (err set) */
static int creds_env(ckpt_s3_creds *c, gb_err *err) {
    const char *id = getenv("AWS_ACCESS_KEY_ID"), *sec = getenv("AWS_SECRET_ACCESS_KEY");
    const char *tok = getenv("AWS_SESSION_TOKEN");
    int has_id = id && *id, has_sec = sec && *sec;
    if (!has_id && !has_sec)
        return 0;
    if (!has_id || !has_sec) {
        gb_seterr(err, GPL_ERR_CONFIG,
                  "AWS credentials in the environment: %s is set but %s is not; set both or "
                  "neither",
                  has_id ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                  has_id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
        return -1;
    }
    if (creds_copy(c->key_id, sizeof c->key_id, id) ||
        creds_copy(c->secret, sizeof c->secret, sec) ||
        (tok && *tok && creds_copy(c->token, sizeof c->token, tok))) {
        gb_seterr(err, GPL_ERR_LIMIT,
                  "AWS credentials in the environment: a key id, secret or session token over "
                  "%d, %d or %d bytes",
                  CKPT_S3_KEY_ID_MAX - 1, CKPT_S3_SECRET_MAX - 1, CKPT_S3_TOKEN_MAX - 1);
        return -1;
    }
    c->kind = CKPT_S3_CRED_ENV;
    c->expires = 0;
    snprintf(c->source, sizeof c->source, "AWS_ACCESS_KEY_ID%s (environment)",
             c->token[0] ? " and AWS_SESSION_TOKEN" : "");
    return 1;
}

/* ---- web identity (EKS IRSA) ---------------------------------------------- */

static int creds_form_add(char *form, size_t cap, CURL *esc, const char *name, const char *v) {
    char *e = curl_easy_escape(esc, v, 0);
    size_t n = strlen(form);
    int w = e ? snprintf(form + n, cap - n, "%s%s=%s", n ? "&" : "", name, e) : -1;
    curl_free(e);
    return w < 0 || (size_t)w >= cap - n ? -1 : 0;
}

/* 1 found, 0 not configured, -1 configured but failed (err set) */
static int creds_web_identity(const char *region, ckpt_s3_creds *c, gb_err *err) {
    const char *file = getenv("AWS_WEB_IDENTITY_TOKEN_FILE"), *role = getenv("AWS_ROLE_ARN");
    const char *session = getenv("AWS_ROLE_SESSION_NAME");
    char url[CREDS_URL_MAX], why[CURL_ERROR_SIZE + 64], sess[64], code[64], msg[256];
    char *token = NULL, *form = NULL, *reply = NULL;
    int found = -1, fd = -1;
    CURL *esc = NULL;
    if (!(file && *file) || !(role && *role))
        return 0;
    token = malloc(CREDS_WEB_TOKEN_MAX);
    form = malloc(CREDS_FORM_MAX);
    reply = malloc(CREDS_REPLY_MAX);
    esc = curl_easy_init();
    if (token == NULL || form == NULL || reply == NULL || esc == NULL) {
        gb_seterr(err, GPL_ERR_NOMEM, "AWS web identity: out of memory");
        goto out;
    }
    fd = open(file, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, token, CREDS_WEB_TOKEN_MAX) : -1;
    if (n <= 0 || n >= CREDS_WEB_TOKEN_MAX) {
        gb_seterr(err, GPL_ERR_AUTH,
                  "AWS web identity: cannot read the token AWS_WEB_IDENTITY_TOKEN_FILE=%s: %s",
                  file,
                  n < 0    ? strerror(errno)
                  : n == 0 ? "it is empty"
                           : "it is over 16 KiB");
        goto out;
    }
    while (n > 0 && (token[n - 1] == '\n' || token[n - 1] == '\r' || token[n - 1] == ' '))
        n--;
    token[n] = '\0';
    /* the SDKs' default session name: unique enough per process */
    snprintf(sess, sizeof sess, "%s", session && *session ? session : "");
    if (sess[0] == '\0')
        snprintf(sess, sizeof sess, "gpulaunch-%ld-%d", (long)time(NULL), (int)getpid());
    form[0] = '\0';
    if (creds_form_add(form, CREDS_FORM_MAX, esc, "Action", "AssumeRoleWithWebIdentity") ||
        creds_form_add(form, CREDS_FORM_MAX, esc, "RoleArn", role) ||
        creds_form_add(form, CREDS_FORM_MAX, esc, "RoleSessionName", sess) ||
        creds_form_add(form, CREDS_FORM_MAX, esc, "Version", "2011-06-15") ||
        creds_form_add(form, CREDS_FORM_MAX, esc, "WebIdentityToken", token)) {
        gb_seterr(err, GPL_ERR_LIMIT, "AWS web identity: the STS request is over %d bytes",
                  CREDS_FORM_MAX);
        goto out;
    }
    const char *ep = getenv("AWS_ENDPOINT_URL_STS");
    if (!(ep && *ep))
        ep = getenv("AWS_ENDPOINT_URL");
    if (ep && *ep)
        snprintf(url, sizeof url, "%s", ep);
    else
        snprintf(url, sizeof url, "https://sts.%s.amazonaws.com/", region);
    /* AssumeRoleWithWebIdentity is not signed: the token is the proof */
    static const char *const hdrs[] = {"Content-Type: application/x-www-form-urlencoded",
                                       "Accept: application/xml", NULL};
    creds_buf b = {.p = reply, .cap = CREDS_REPLY_MAX};
    long st = creds_http("POST", url, hdrs, form, CREDS_STS_TIMEOUT_MS, CREDS_STS_TIMEOUT_MS, &b,
                         why, sizeof why);
    if (st != 200) {
        if (st > 0 && ckpt_s3_xml_get(reply, b.len, "Code", code, sizeof code) > 0) {
            if (ckpt_s3_xml_get(reply, b.len, "Message", msg, sizeof msg) < 0)
                msg[0] = '\0';
            snprintf(why, sizeof why, "%s (%ld)%s%s", code, st, msg[0] ? ": " : "", msg);
        } else if (st > 0) {
            snprintf(why, sizeof why, "HTTP %ld", st);
        }
        gb_seterr(err, GPL_ERR_AUTH,
                  "AWS web identity: STS AssumeRoleWithWebIdentity at %s for %s (token %s): %s; "
                  "check the role's trust policy and the service account",
                  url, role, file, why);
        goto out;
    }
    char exp[64];
    if (ckpt_s3_xml_get(reply, b.len, "AccessKeyId", c->key_id, sizeof c->key_id) <= 0 ||
        ckpt_s3_xml_get(reply, b.len, "SecretAccessKey", c->secret, sizeof c->secret) <= 0 ||
        ckpt_s3_xml_get(reply, b.len, "SessionToken", c->token, sizeof c->token) <= 0 ||
        ckpt_s3_xml_get(reply, b.len, "Expiration", exp, sizeof exp) <= 0 ||
        (c->expires = ckpt_s3_parse_iso8601(exp)) < 0) {
        gb_seterr(err, GPL_ERR_PROTOCOL,
                  "AWS web identity: the STS reply at %s has no usable Credentials "
                  "(AccessKeyId, SecretAccessKey, SessionToken, Expiration)",
                  url);
        goto out;
    }
    c->kind = CKPT_S3_CRED_WEB_IDENTITY;
    snprintf(c->source, sizeof c->source, "web identity (role %s, token %s, STS %s)", role, file,
             url);
    found = 1;
out:
    if (fd >= 0)
        close(fd);
    if (esc)
        curl_easy_cleanup(esc);
    if (token)
        memset(token, 0, CREDS_WEB_TOKEN_MAX);
    free(token);
    free(form);
    free(reply);
    return found;
}

/* ---- the instance role (IMDSv2) ------------------------------------------- */

/* 1 found, 0 no metadata service answered (why says so), -1 it answered
 * but gave no credentials (err set) */
static int creds_imds(ckpt_s3_creds *c, char *why, size_t whycap, gb_err *err) {
    const char *ep = getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    char base[CREDS_URL_MAX], url[CREDS_URL_MAX], tok[128], role[CREDS_ROLE_MAX];
    char cwhy[CURL_ERROR_SIZE + 64], hdr[sizeof tok + 48], ttl[64];
    int found = -1;
    json_t *root = NULL;
    char *reply = malloc(CREDS_REPLY_MAX);
    creds_buf b = {.p = reply, .cap = CREDS_REPLY_MAX};
    if (reply == NULL) {
        gb_seterr(err, GPL_ERR_NOMEM, "AWS instance metadata: out of memory");
        goto out;
    }
    snprintf(base, sizeof base, "%s", ep && *ep ? ep : "http://169.254.169.254");
    size_t bl = strlen(base);
    while (bl > 0 && base[bl - 1] == '/')
        base[--bl] = '\0';
    /* IMDSv2: a session token first (a PUT, which a container's hop limit
     * or a v1-only proxy would refuse), then the token on every GET */
    snprintf(url, sizeof url, "%s/latest/api/token", base);
    snprintf(ttl, sizeof ttl, "X-aws-ec2-metadata-token-ttl-seconds: %d", CREDS_IMDS_TOKEN_TTL_S);
    const char *const put_h[] = {ttl, NULL};
    long st = creds_http("PUT", url, put_h, NULL, CREDS_IMDS_CONNECT_MS, CREDS_IMDS_TIMEOUT_MS, &b,
                         cwhy, sizeof cwhy);
    if (st == 0) {
        snprintf(why, whycap, "IMDSv2 at %s: %s", base, cwhy);
        found = 0;
        goto out;
    }
    if (st != 200 || b.len == 0 || b.len >= sizeof tok) {
        gb_seterr(err, GPL_ERR_AUTH,
                  "AWS instance metadata at %s: the IMDSv2 token PUT answered %ld%s; check the "
                  "instance's metadata options (HttpTokens, HttpPutResponseHopLimit >= 2 in "
                  "containers)",
                  base, st, st < 0 ? " (too long)" : "");
        goto out;
    }
    snprintf(tok, sizeof tok, "%s", reply);
    snprintf(hdr, sizeof hdr, "X-aws-ec2-metadata-token: %s", tok);
    const char *const get_h[] = {hdr, NULL};
    snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/", base);
    st = creds_http("GET", url, get_h, NULL, CREDS_IMDS_CONNECT_MS, CREDS_IMDS_TIMEOUT_MS, &b, cwhy,
                    sizeof cwhy);
    size_t rl = strcspn(reply, "\r\n");
    if (st != 200 || rl == 0 || rl >= sizeof role) {
        gb_seterr(err, GPL_ERR_AUTH,
                  "AWS instance metadata at %s: no instance role (%s answered %ld%s%s); attach "
                  "an IAM role to the instance or give credentials another way",
                  base, url, st, st == 0 ? ": " : "", st == 0 ? cwhy : "");
        goto out;
    }
    snprintf(role, sizeof role, "%.*s", (int)rl, reply);
    snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/%s", base, role);
    st = creds_http("GET", url, get_h, NULL, CREDS_IMDS_CONNECT_MS, CREDS_IMDS_TIMEOUT_MS, &b, cwhy,
                    sizeof cwhy);
    json_error_t je;
    root = st == 200 ? json_loadb(reply, b.len, 0, &je) : NULL;
    const char *code = json_string_value(json_object_get(root, "Code"));
    const char *exp = json_string_value(json_object_get(root, "Expiration"));
    if (root == NULL || (code && strcmp(code, "Success") != 0) ||
        creds_copy(c->key_id, sizeof c->key_id,
                   json_string_value(json_object_get(root, "AccessKeyId"))) ||
        creds_copy(c->secret, sizeof c->secret,
                   json_string_value(json_object_get(root, "SecretAccessKey"))) ||
        creds_copy(c->token, sizeof c->token, json_string_value(json_object_get(root, "Token"))) ||
        (c->expires = ckpt_s3_parse_iso8601(exp)) < 0) {
        gb_seterr(err, GPL_ERR_AUTH,
                  "AWS instance metadata at %s: the credentials of role '%s' are not usable "
                  "(HTTP %ld, Code %s): check the instance profile",
                  base, role, st, code ? code : "missing");
        goto out;
    }
    c->kind = CKPT_S3_CRED_IMDS;
    snprintf(c->source, sizeof c->source, "instance role '%s' (IMDSv2 at %s)", role, base);
    found = 1;
out:
    json_decref(root);
    if (reply)
        memset(reply, 0, CREDS_REPLY_MAX);
    free(reply);
    return found;
}

/* ---- resolution ------------------------------------------------------------- */

gpl_result_t ckpt_s3_creds_resolve(const char *region, ckpt_s3_creds *out, gb_err *err) {
    char tried[CREDS_TRIED_MAX], why[CURL_ERROR_SIZE + CREDS_URL_MAX];
    gpl_result_t rc = GPL_OK;
    ckpt_s3_creds *c = calloc(1, sizeof *c);
    int r;
    if (c == NULL)
        return gb_seterr(err, GPL_ERR_NOMEM, "AWS credentials: out of memory");
    if ((r = creds_env(c, err)) != 0)
        goto done;
    if ((r = creds_web_identity(region, c, err)) != 0)
        goto done;
    const char *off = getenv("AWS_EC2_METADATA_DISABLED");
    if (off && strcasecmp(off, "true") == 0) {
        snprintf(why, sizeof why, "instance metadata (AWS_EC2_METADATA_DISABLED=true)");
        r = 0;
    } else {
        r = creds_imds(c, why, sizeof why, err);
    }
    if (r != 0)
        goto done;
    snprintf(tried, sizeof tried,
             "the environment (AWS_ACCESS_KEY_ID unset), a web identity "
             "(AWS_WEB_IDENTITY_TOKEN_FILE or AWS_ROLE_ARN unset), %s",
             why);
    rc = gb_seterr(err, GPL_ERR_AUTH,
                   "no AWS credentials found; tried %s: set AWS_ACCESS_KEY_ID and "
                   "AWS_SECRET_ACCESS_KEY, or run with an IAM role",
                   tried);
    goto out;
done:
    if (r < 0) {
        rc = err && err->code != GPL_OK ? err->code : GPL_ERR_AUTH;
        gb_seterr(err, rc, "AWS credentials could not be found");
        goto out;
    }
    *out = *c;
    if (c->expires > 0)
        GB_INFO("AWS credentials from %s, valid for %.0f s", c->source, c->expires - gb_wall_s());
out:
    memset(c, 0, sizeof *c);
    free(c);
    return rc;
}

gpl_result_t ckpt_s3_creds_refresh(const char *region, ckpt_s3_creds *c, gb_err *err) {
    char why[CURL_ERROR_SIZE + CREDS_URL_MAX];
    gpl_result_t rc = GPL_OK;
    ckpt_s3_creds *n = calloc(1, sizeof *n);
    int r = -1;
    if (n == NULL)
        return gb_seterr(err, GPL_ERR_NOMEM, "AWS credentials: out of memory");
    switch (c->kind) {
    case CKPT_S3_CRED_WEB_IDENTITY:
        r = creds_web_identity(region, n, err); /* the token file is read again: EKS rotates it */
        break;
    case CKPT_S3_CRED_IMDS:
        r = creds_imds(n, why, sizeof why, err);
        if (r == 0)
            gb_seterr(err, GPL_ERR_AUTH, "renewing the instance role's credentials: %s", why);
        break;
    default:
        r = creds_env(n, err);
        if (r == 0)
            gb_seterr(err, GPL_ERR_AUTH,
                      "renewing AWS credentials: AWS_ACCESS_KEY_ID is no longer set");
        break;
    }
    if (r == 1) {
        *c = *n;
    } else {
        rc = gb_seterr(err, GPL_ERR_AUTH, "renewing AWS credentials from %s: not found there now",
                       c->source);
        rc = err && err->code != GPL_OK ? err->code : rc;
    }
    memset(n, 0, sizeof *n);
    free(n);
    return rc;
}
