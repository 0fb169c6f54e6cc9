/* Token authentication through OpenSSL's libcrypto. */
#include "rdzv_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpulaunch/rdzv.h"

static const char auth_label[] = "gpulaunch-rdzv-auth-v1";

/* A keyed HMAC context is set up once per token and copied per message:
 * the one-shot HMAC() looks the digest up again on every call, which at tens
 * of thousands of connections is most of the handshake's cost. */
static __thread EVP_MAC_CTX *cached;
static __thread char *cached_key;
static __thread size_t cached_len;

static EVP_MAC_CTX *keyed(const char *token, size_t len) {
    if (cached && cached_len == len && memcmp(cached_key, token, len) == 0)
        return cached;
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
    EVP_MAC_free(mac);
    char digest[] = "SHA256";
    OSSL_PARAM params[2] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                            OSSL_PARAM_construct_end()};
    char *key = malloc(len ? len : 1);
    if (ctx == NULL || key == NULL ||
        !EVP_MAC_init(ctx, (const unsigned char *)token, len, params)) {
        EVP_MAC_CTX_free(ctx);
        free(key);
        return NULL;
    }
    memcpy(key, token, len);
    EVP_MAC_CTX_free(cached);
    free(cached_key);
    cached = ctx;
    cached_key = key;
    cached_len = len;
    return ctx;
}

int rdzv_auth_mac(const char *token, size_t token_len, const uint8_t nonce[RDZV_NONCE_LEN],
                  uint8_t mac[RDZV_MAC_LEN]) {
    EVP_MAC_CTX *base = keyed(token, token_len);
    EVP_MAC_CTX *ctx = base ? EVP_MAC_CTX_dup(base) : NULL;
    size_t len = 0;
    int ok = ctx && EVP_MAC_update(ctx, nonce, RDZV_NONCE_LEN) &&
             EVP_MAC_update(ctx, (const unsigned char *)auth_label, sizeof auth_label - 1) &&
             EVP_MAC_final(ctx, mac, &len, RDZV_MAC_LEN) && len == RDZV_MAC_LEN;
    EVP_MAC_CTX_free(ctx);
    return ok ? 0 : -1;
}

int rdzv_auth_check(const char *token, size_t token_len, const uint8_t nonce[RDZV_NONCE_LEN],
                    const uint8_t mac[RDZV_MAC_LEN]) {
    uint8_t want[RDZV_MAC_LEN];
    if (rdzv_auth_mac(token, token_len, nonce, want) != 0)
        return 0;
    return CRYPTO_memcmp(want, mac, RDZV_MAC_LEN) == 0;
}

/* Nonces come from a pool that one RAND_bytes call fills for 128
 * connections: per call, OpenSSL's generator costs more than the 32 bytes
 * (locks and a fork check). The pool is per thread and emptied in a forked
 * child, so no two processes hand out the same bytes. */
#define NONCE_POOL (128 * RDZV_NONCE_LEN)
static __thread uint8_t pool[NONCE_POOL];
static __thread size_t pool_left;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void pool_forget(void) {
    OPENSSL_cleanse(pool, sizeof pool);
    pool_left = 0;
}

static void pool_register(void) { pthread_atfork(NULL, NULL, pool_forget); }

int rdzv_auth_nonce(uint8_t nonce[RDZV_NONCE_LEN]) {
    pthread_once(&atfork_once, pool_register);
    if (pool_left < RDZV_NONCE_LEN) {
        if (RAND_bytes(pool, NONCE_POOL) != 1)
            return -1;
        pool_left = NONCE_POOL;
    }
    pool_left -= RDZV_NONCE_LEN;
    memcpy(nonce, pool + pool_left, RDZV_NONCE_LEN);
    OPENSSL_cleanse(pool + pool_left, RDZV_NONCE_LEN);
    return 0;
}

gpl_result_t rdzv_load_token(const char *file, char **tok, size_t *len, char *err, size_t errlen) {
    *tok = NULL;
    *len = 0;
    char *buf = NULL;
    size_t n = 0;
    if (file == NULL) {
        const char *e = getenv("GPULAUNCH_RDZV_TOKEN");
        if (e == NULL || *e == '\0')
            return GPL_OK;
        n = strlen(e);
        if (n > RDZV_MAX_TOKEN) {
            snprintf(err, errlen, "GPULAUNCH_RDZV_TOKEN is %zu bytes; the limit is %d", n,
                     RDZV_MAX_TOKEN);
            return GPL_ERR_LIMIT;
        }
        buf = malloc(n);
        if (buf == NULL)
            return GPL_ERR_NOMEM;
        memcpy(buf, e, n);
    } else {
        FILE *f = fopen(file, "rb");
        if (f == NULL) {
            snprintf(err, errlen, "cannot read token file %s: %s", file, strerror(errno));
            return GPL_ERR_CONFIG;
        }
        buf = malloc(RDZV_MAX_TOKEN + 1);
        if (buf == NULL) {
            fclose(f);
            return GPL_ERR_NOMEM;
        }
        n = fread(buf, 1, RDZV_MAX_TOKEN + 1, f);
        fclose(f);
        if (n > RDZV_MAX_TOKEN) {
            free(buf);
            snprintf(err, errlen, "token file %s is over the %d-byte limit", file, RDZV_MAX_TOKEN);
            return GPL_ERR_LIMIT;
        }
    }
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    if (n == 0) {
        free(buf);
        snprintf(err, errlen, "token %s is empty", file ? file : "GPULAUNCH_RDZV_TOKEN");
        return GPL_ERR_CONFIG;
    }
    *tok = buf;
    *len = n;
    return GPL_OK;
}
