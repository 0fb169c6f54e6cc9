/* Token authentication: HMAC-SHA256 over the server's nonce (libcrypto). */
#ifndef GPULAUNCH_RDZV_AUTH_H
#define GPULAUNCH_RDZV_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "rdzv_codec.h"

/* mac = HMAC-SHA256(token, nonce || "gpulaunch-rdzv-auth-v1"). */
int rdzv_auth_mac(const char *token, size_t token_len, const uint8_t nonce[RDZV_NONCE_LEN],
                  uint8_t mac[RDZV_MAC_LEN]);
/* Constant-time comparison of a received mac with the expected one. */
int rdzv_auth_check(const char *token, size_t token_len, const uint8_t nonce[RDZV_NONCE_LEN],
                    const uint8_t mac[RDZV_MAC_LEN]);
int rdzv_auth_nonce(uint8_t nonce[RDZV_NONCE_LEN]);

#endif
