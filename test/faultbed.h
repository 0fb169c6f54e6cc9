/* The fault matrix's bed (test_faults.c, test_reform_live.c): 4 nodes x 2
 * workers training the examples with checkpoints, on hosts that are network
 * namespaces (netbed.h), against a gpulaunch-rdzv on a host of its own; how a
 * node starts, dies and is waited for, and what every scenario checks at its
 * end. Per-node logs land in <build>/test/fault-logs/<scenario>/. */
#ifndef GPULAUNCH_TEST_FAULTBED_H
#define GPULAUNCH_TEST_FAULTBED_H

#include <stdint.h>

#include "harness.h"
#include "netbed.h"

#define GL GPL_BUILD_DIR "/launcher/gpulaunch"
#define DP GPL_BUILD_DIR "/examples/dp_train"
#define SHARD GPL_BUILD_DIR "/examples/shard_train"
#define TORCH_PYTHON ((char *)torch_python())
#define TRAIN_DDP GPL_SOURCE_DIR "/examples/train_ddp.py"
#define RDZV GPL_BUILD_DIR "/rendezvous/gpulaunch-rdzv"
#define HOSTILE GPL_BUILD_DIR "/test/netbed_hostile"
#define NODES 4
#define RDZV_HOST 0
#define HOSTILE_HOST (NODES + 1)
#define RDZV_PORT "29400"
#define HB_TIMEOUT_S 5 /* the default heartbeat timeout */

/* Debian's python3-torch, or GPL_TORCH_PYTHON (scripts/torch2.sh) */
const char *torch_python(void);

extern netbed bed;
extern char dir[64], logdir[256], token_file[128], endpoint[64];
extern proc server, nodes[NODES + 1];
extern const int all_nodes[NODES];

typedef struct job_args {
    const char *nnodes;      /* "4" or "3:4" */
    const char *steps;       /* training steps */
    const char *sleep_ms;    /* --step-sleep-ms */
    const char *ck_every;    /* --checkpoint-every */
    const char *preempt_ep;  /* a metadata endpoint on the node, or NULL */
    const char *ckdir;       /* default <dir>/ck */
    const char *dump;        /* --dump-params file, or NULL */
    int pytorch;             /* train_ddp.py (PyTorch DDP) instead of dp_train */
    int default_last_call;   /* leave out last_call_timeout=1: the default 30 s */
    const char *progress;    /* --progress-timeout, or NULL for the default */
    int reform;              /* the example's --reform: re-form in place, not restart */
    const char *state_mib;   /* dp_train's --state-mib, or NULL */
    const char *mirror;      /* shard_train --mirror-every K instead of dp_train, or NULL */
    const char *print_every; /* the example's --print-every, or NULL for 100000 */
    const char *metrics;     /* --metrics ADDR:PORT on each node, or NULL */
} job_args;

/* A bed of nhosts for scenario name (skips the test without namespaces). */
void setup_bed(const char *name, int nhosts, int delay_ms, int loss_pct);
void start_server(int verbose);
/* --probes for the next start_server ("on", "off"; NULL: the default). */
extern const char *server_probes;
/* --http ADDR:PORT for the next start_server (NULL: none). */
extern const char *server_http;
/* The suite's fini: spinners stopped, the bed down, the directory removed. */
void teardown(void);
/* n (at most 2) processes that keep a core busy each, beside the bed (on
 * this machine's namespace), until stop_spinners or teardown (a test that
 * fails half-way leaves none). */
void start_spinners(int n);
void stop_spinners(void);
void start_node(int host, const job_args *ja);
void save_logs(const char *tag);
uint64_t max_ms(const uint64_t *v, int n);
/* Waits until each listed node's output shows needle; ms[i] is when, after t0. */
int expect_all(const int *hosts, int n, const char *needle, uint64_t t0, int timeout_ms,
               uint64_t *ms);
/* Reads what every process of the bed has written so far. */
void drain_all(void);
/* Waits for the listed nodes to exit; fails the test unless each exits with code. */
void expect_exit(const int *hosts, int n, int code, int timeout_ms);
/* The final parameter hashes of ranks 0..world-1: all present and equal. */
void expect_same_params(const int *hosts, int n, int world, char out[65]);
/* The example's rank 0 resumed from a checkpoint. */
void expect_resumed(const int *hosts, int n);
/* Starts the four nodes and waits for round 1 everywhere. */
void start_job(const job_args *ja);
/* host vanishes (link cut, then kill -9 of everything on it); returns when
 * the last survivor was told, after *t_fault. */
uint64_t node_dies(int host, int survivors[NODES - 1], uint64_t *t_fault);
/* Waits (up to 30 s) until host runs its launcher and its 2 workers:
 * a round formed says nothing of the workers the launcher spawns next. */
void await_workers(int host);
/* Skips the test unless the interpreter imports torch. */
/* Skips the test unless TORCH_PYTHON imports torch; returns how long one
 * import took (ms): a program's own start, for bounds that include it. */
uint64_t require_torch(void);

#endif
