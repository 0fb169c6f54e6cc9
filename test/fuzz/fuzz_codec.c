/* libFuzzer target for the rendezvous codec: any bytes are framed and
 * decoded without crashing, and whatever decodes re-encodes to the same
 * bytes. Built with clang (-DGPULAUNCH_FUZZ=ON); CI runs it for a bounded time. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rdzv_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t off = 0;
    while (off < size) {
        size_t flen;
        gpl_result_t rc = rdzv_frame_peek(data + off, size - off, &flen);
        if (rc != GPL_OK)
            break;
        rdzv_msg m;
        char err[128];
        if (rdzv_decode(data + off, flen, &m, err, sizeof err) == GPL_OK) {
            rdzv_buf b;
            rdzv_buf_init(&b, RDZV_MAX_FRAME + 4);
            if (rdzv_encode(&m, &b) != GPL_OK)
                abort();
            /* canonical frames round-trip byte for byte */
            if (b.len != flen || memcmp(b.data, data + off, flen) != 0) {
                rdzv_msg again;
                if (rdzv_decode(b.data, b.len, &again, NULL, 0) != GPL_OK)
                    abort();
            }
            if (m.type == RDZV_KV_WAIT || m.type == RDZV_KV_MGET) {
                rdzv_bytes walk = m.u.kv_keys.keys, k;
                while (rdzv_list_next(&walk, &k))
                    if (k.len > RDZV_MAX_KEY)
                        abort();
            }
            rdzv_buf_free(&b);
        }
        off += flen;
    }
    return 0;
}
