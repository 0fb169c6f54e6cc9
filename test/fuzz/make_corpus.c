/* Writes one valid frame of every message type into the seed corpus. */
#include <stdio.h>
#include <string.h>

#include "rdzv_codec.h"

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    for (uint16_t t = 1; t < RDZV_TYPE_MAX_; t++) {
        rdzv_msg m;
        memset(&m, 0, sizeof m);
        m.type = t;
        m.req_id = t;
        rdzv_buf keys;
        rdzv_buf_init(&keys, 4096);
        rdzv_list_add(&keys, "key", 3);
        switch (t) {
        case RDZV_HELLO:
            m.u.hello.magic = RDZV_MAGIC;
            m.u.hello.version = RDZV_VERSION;
            break;
        case RDZV_JOIN:
            memcpy(m.u.join.run_id, "job", 4);
            memcpy(m.u.join.hostname, "node", 5);
            m.u.join.nproc = 8;
            m.u.join.static_rank = -1;
            m.u.join.min_nodes = m.u.join.max_nodes = 2;
            m.flags = RDZV_JOIN_PROBE | RDZV_JOIN_PEER;
            m.u.join.peer_port = 40000;
            break;
        case RDZV_HEARTBEAT:
            m.flags = RDZV_HEARTBEAT_WAIT;
            m.u.heartbeat.wait_ms = 300;
            break;
        case RDZV_PROBE_REQ:
            memcpy(m.u.probe_req.addr, "10.0.0.3", 9);
            m.u.probe_req.port = 40000;
            m.u.probe_req.deadline_ms = 200;
            break;
        case RDZV_PROBE_ACK:
            m.u.probe_ack.ok = 1;
            m.u.probe_ack.rtt_ms = 2;
            break;
        case RDZV_STORY:
            m.u.story.round = 3;
            m.u.story.kind = RDZV_STORY_RESTART;
            m.u.story.pause_ms = 120;
            m.u.story.redone = 14;
            m.u.story.nproc = 8;
            memcpy(m.u.story.why, "rank 1 exited", 14);
            m.u.story.source = RDZV_STATE_PEER;
            m.u.story.state_step = 106;
            m.u.story.state_bytes = 2308;
            m.u.story.state_ms = 14;
            m.flags = RDZV_STORY_MORE;
            m.u.story.cause = RDZV_CAUSE_WORKER_FAILED;
            m.u.story.state_root = 0;
            break;
        case RDZV_KV_SET:
            m.u.kv_set.key = (rdzv_bytes){(const uint8_t *)"k", 1};
            m.u.kv_set.value = (rdzv_bytes){(const uint8_t *)"v", 1};
            break;
        case RDZV_KV_WAIT:
        case RDZV_KV_MGET:
            m.u.kv_keys.nkeys = 1;
            m.u.kv_keys.keys = (rdzv_bytes){keys.data, (uint32_t)keys.len};
            break;
        case RDZV_FAIL:
            m.flags = RDZV_FAIL_HANG;
            memcpy(m.u.fail.message, "hung", 5);
            m.u.fail.rank = 3;
            break;
        case RDZV_STATS: {
            rdzv_rank_stats r = RDZV_RANK_STATS_INIT;
            r.rank = 1;
            r.steps = 10;
            r.step_time_us = 1000;
            r.wait_us = 0;
            memcpy(r.gpu, "0", 2);
            keys.len = 0;
            rdzv_stats_add(&keys, &r); /* an older launcher's entry */
            r.rank = 2;
            r.wait_us = UINT32_MAX;
            r.ckpt_local_step = 100;
            r.ckpt_durable_step = 50;
            r.ckpt_stall_ms = 12;
            r.ckpt_drain_left = 1 << 20;
            rdzv_stats_add(&keys, &r); /* with the checkpoint group */
            m.u.stats.window_ms = 5000;
            m.u.stats.count = 2;
            m.u.stats.ranks = (rdzv_bytes){keys.data, (uint32_t)keys.len};
            break;
        }
        default:
            break;
        }
        /* with its flags' fields, and (NAME-plain.bin) as an older peer sends it */
        for (int plain = 0; plain < 2 && (plain == 0 || m.flags != 0); plain++) {
            if (plain)
                m.flags = 0;
            rdzv_buf b;
            rdzv_buf_init(&b, RDZV_MAX_FRAME + 4);
            if (rdzv_encode(&m, &b) == GPL_OK) {
                char path[512];
                snprintf(path, sizeof path, "%s/%s%s.bin", dir, rdzv_type_name(t),
                         plain ? "-plain" : "");
                FILE *f = fopen(path, "wb");
                if (f) {
                    fwrite(b.data, 1, b.len, f);
                    fclose(f);
                }
            }
            rdzv_buf_free(&b);
        }
        rdzv_buf_free(&keys);
    }
    return 0;
}
