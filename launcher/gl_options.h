/* The launcher's one option table: every option resolves through it from
 * the command line, the PET_* environment, an srun job step's SLURM_*
 * (gl_slurm.c) and the YAML file, in that order of precedence, and remembers
 * where its value came from. */
#ifndef GPULAUNCH_GL_OPTIONS_H
#define GPULAUNCH_GL_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Sources in rising precedence: a value replaces one of a lower source only. */
enum gl_src {
    GL_SRC_DEFAULT = 0,
    GL_SRC_FILE = 1,
    GL_SRC_SLURM = 2,
    GL_SRC_ENV = 3,
    GL_SRC_CLI = 4
};

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
    GL_START_METHOD,
    GL_EVENT_LOG_HANDLER,
    GL_RUN_PATH,
    GL_DUPLICATE_STDOUT_FILTERS,
    GL_DUPLICATE_STDERR_FILTERS,
    GL_LOGS_SPECS,
    GL_NUMA_BINDING,
    GL_SIGNALS_TO_HANDLE,
    GL_VIRTUAL_LOCAL_RANK,
    GL_LOG_LINE_PREFIX_TEMPLATE,
    GL_PRINT_COMPLETION,
    GL_SLURM,
    GL_PROGRESS_TIMEOUT,
    GL_STATS_INTERVAL,
    GL_WARM_START_TIMEOUT,
    GL_GPU_HEALTH,
    GL_GPU_MONITOR_INTERVAL,
    GL_GPU_IDLE_ALERT,
    GL_METRICS,
    GL_DCGM_JOB_MAPPING_DIR,
    GL_CHECKPOINT_DURABLE,
    GL_CHECKPOINT_ASYNC,
    GL_OPT_COUNT
};

#define GL_MAX_SIGNALS 16             /* --signals-to-handle entries */
#define GL_AUTO_FLOOR_DEFAULT_S 300.0 /* --progress-timeout auto: the least timeout */

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
    int rdzv_is_host; /* --rdzv-conf is_host: -1 auto (the endpoint names this machine), 0, 1 */
    int standalone, no_python, module, check, print_config, bind_gpus, nccl_ifname_auto;
    int preemption_source; /* GL_CLOUD_* */
    double preemption_poll_s;
    enum { GL_MODE_STANDALONE, GL_MODE_STATIC, GL_MODE_DYNAMIC } mode;
    /* torchrun 2.4+ options */
    int run_path, virtual_local_rank;
    int numa_binding;                      /* GL_NUMA_* (gl_numa.h) */
    int signals[GL_MAX_SIGNALS], nsignals; /* --signals-to-handle */
    int slurm; /* options were read from an srun job step's SLURM_* (--slurm auto) */
    /* job health (docs/health.md) */
    double progress_timeout_s; /* --progress-timeout S; 0: auto or off */
    int progress_auto;         /* --progress-timeout auto[:FLOOR] */
    double progress_floor_s;   /* auto's floor */
    double stats_interval_s;   /* --stats-interval; 0: off */
    double warm_start_s;       /* --warm-start-timeout; 0: no warm join (gl_warm.h) */
    int ckpt_async;            /* --checkpoint-async on (1) / off (0): GPULAUNCH_CKPT_ASYNC */
    /* GPU health (docs/gpu-health.md) */
    int gpu_health;        /* GL_GPU_HEALTH_* (gl_nvml.h) */
    double gpu_interval_s; /* --gpu-monitor-interval; 0: no sampling */
    int gpu_idle_pct;      /* --gpu-idle-alert PCT:DURATION */
    double gpu_idle_s;     /* its DURATION; 0: off */
} gl_config;

/* Resolves argv, the environment and the YAML file into cfg. Returns 0, or 2
 * with a message naming the option and its accepted forms in err. */
int gl_config_load(gl_config *cfg, int argc, char **argv, char *err, size_t errlen);
void gl_config_free(gl_config *cfg);
/* Prints every option's effective value and its source. */
void gl_config_print(const gl_config *cfg, FILE *out);
const char *gl_opt_name(int id);
/* the option takes no value (--flag) */
int gl_opt_is_flag(int id);
/* "--NAME: 'V' is not valid; expected FORMS" into err; returns 2 */
int gl_opt_bad(char *err, size_t errlen, int id, const char *v);
/* The values as the launcher uses them, each checked (gl_resolve.c): 0, or
 * 2 with err naming the option. */
int gl_config_resolve(gl_config *cfg, char *err, size_t errlen);
/* The --help text. */
extern const char gl_usage[];
/* --print-completion SHELL: a completion script for bash, zsh or tcsh. */
void gl_print_completion(const char *shell, FILE *out);

/* GPUs visible to this node (gl_gpus.c). */
int gpl_visible_gpu_count(void);

/* "64g", "512M", "1048576" -> bytes; -1 when malformed. */
int64_t gl_parse_size(const char *s);

#endif
