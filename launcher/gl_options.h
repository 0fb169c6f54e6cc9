/* The launcher's one option table: every option resolves through it from
 * the command line, the PET_* environment and the YAML file, in that order of
 * precedence, and remembers where its value came from. */
#ifndef GPULAUNCH_GL_OPTIONS_H
#define GPULAUNCH_GL_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum gl_src { GL_SRC_DEFAULT = 0, GL_SRC_FILE = 1, GL_SRC_ENV = 2, GL_SRC_CLI = 3 };

enum gl_opt_id {
    GL_NNODES,
    GL_NPROC_PER_NODE,
    GL_NODE_RANK,
    GL_MASTER_ADDR,
    GL_MASTER_PORT,
    GL_STANDALONE,
    GL_RDZV_BACKEND,
    GL_RDZV_ENDPOINT,
    GL_RDZV_ID,
    GL_RDZV_CONF,
    GL_MAX_RESTARTS,
    GL_MONITOR_INTERVAL,
    GL_ROLE,
    GL_LOG_DIR,
    GL_REDIRECTS,
    GL_TEE,
    GL_LOCAL_RANKS_FILTER,
    GL_LOCAL_ADDR,
    GL_SHUTDOWN_TIMEOUT,
    GL_MODULE,
    GL_NO_PYTHON,
    GL_CONFIG,
    GL_RDZV_TOKEN_FILE,
    GL_BIND_GPUS,
    GL_SHM_MIN,
    GL_CHECK,
    GL_PRINT_CONFIG,
    GL_NCCL_IFNAME_AUTO,
    GL_PREEMPTION_SOURCE,
    GL_PREEMPTION_ENDPOINT,
    GL_PREEMPTION_POLL,
    GL_OPT_COUNT
};

typedef struct gl_config {
    /* raw values and their sources, indexed by gl_opt_id */
    char *val[GL_OPT_COUNT];
    int src[GL_OPT_COUNT];
    /* the program and its arguments */
    char **prog_argv;
    int prog_argc;
    /* parsed */
    uint32_t min_nodes, max_nodes;
    int nproc; /* resolved count */
    int node_rank;
    int master_port;
    int max_restarts;
    double shutdown_timeout_s;
    uint64_t shm_min;
    uint32_t join_timeout_ms, last_call_ms, hb_timeout_ms;
    int standalone, no_python, module, check, print_config, bind_gpus, nccl_ifname_auto;
    int preemption_source; /* GL_CLOUD_* */
    double preemption_poll_s;
    enum { GL_MODE_STANDALONE, GL_MODE_STATIC, GL_MODE_DYNAMIC } mode;
} gl_config;

/* Resolves argv, the environment and the YAML file into cfg. Returns 0, or 2
 * with a message naming the option and its accepted forms in err. */
int gl_config_load(gl_config *cfg, int argc, char **argv, char *err, size_t errlen);
void gl_config_free(gl_config *cfg);
/* Prints every option's effective value and its source. */
void gl_config_print(const gl_config *cfg, FILE *out);
const char *gl_opt_name(int id);
/* The --help text. */
extern const char gl_usage[];

/* GPUs visible to this node (gl_gpus.c). */
int gpl_visible_gpu_count(void);

/* "64g", "512M", "1048576" -> bytes; -1 when malformed. */
int64_t gl_parse_size(const char *s);

#endif
