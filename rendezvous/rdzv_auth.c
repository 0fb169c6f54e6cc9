/* Token authentication through OpenSSL's libcrypto. */
#include "rdzv_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpulaunch/rdzv.h"

static const char auth_label[] = "gpulaunch-rdzv-auth-v1";

int rdzv_auth_mac(const char *token, size_t token_len, const uint8_t nonce[RDZV_NONCE_LEN],
                  uint8_t mac[RDZV_MAC_LEN]) {
    uint8_t msg[RDZV_NONCE_LEN + sizeof auth_label];
    memcpy(msg, nonce, RDZV_NONCE_LEN);
    memcpy(msg + RDZV_NONCE_LEN, auth_label, sizeof auth_label);
    unsigned int len = 0;
    if (HMAC(EVP_sha256(), token, (int)token_len, msg, sizeof msg, mac, &len) == NULL ||
        len != RDZV_MAC_LEN)
        return -1;
    return 0;
}

int rdzv_auth_check(const char *token, size_t token_len, const uint8_t nonce[RDZV_NONCE_LEN],
                    const uint8_t mac[RDZV_MAC_LEN]) {
    uint8_t want[RDZV_MAC_LEN];
    if (rdzv_auth_mac(token, token_len, nonce, want) != 0)
        return 0;
    return CRYPTO_memcmp(want, mac, RDZV_MAC_LEN) == 0;
}

int rdzv_auth_nonce(uint8_t nonce[RDZV_NONCE_LEN]) {
    return RAND_bytes(nonce, RDZV_NONCE_LEN) == 1 ? 0 : -1;
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
