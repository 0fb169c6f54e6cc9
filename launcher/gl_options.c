/* The option table and its sources, as the user gave them: the command line,
 * PET_* and GPULAUNCH_* variables, Slurm's SLURM_* and the YAML file, each value
 * with where it came from; printing them (--print-config, --print-completion).
 * What the values mean is gl_resolve.c's. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "gl_cloud.h"
#include "gl_numa.h"
#include "gl_nvml.h"
#include "gl_options.h"
#include "gl_slurm.h"
#include "gpulaunch/rdzv.h"

typedef struct gl_opt {
    int id;
    const char *name; /* dashes; the underscore spelling is accepted too */
    char shortopt;
    int flag; /* takes no value */
    const char *def;
    const char *forms; /* accepted forms, for messages */
} gl_opt;

static const gl_opt table[GL_OPT_COUNT] = {
    {GL_NNODES, "nnodes", 0, 0, "1:1", "N or MIN:MAX with 1 <= MIN <= MAX"},
    {GL_NPROC_PER_NODE, "nproc-per-node", 0, 0, "1", "a positive integer, auto, gpu or cpu"},
    {GL_NODE_RANK, "node-rank", 0, 0, "0", "an integer from 0 to nnodes-1"},
    {GL_MASTER_ADDR, "master-addr", 0, 0, "127.0.0.1", "a host name or IP address"},
    {GL_MASTER_PORT, "master-port", 0, 0, "29500", "a port from 1 to 65535"},
    {GL_STANDALONE, "standalone", 0, 1, "0", "a flag"},
    {GL_RDZV_BACKEND, "rdzv-backend", 0, 0, "static", "static, c10d or gpulaunch"},
    {GL_RDZV_ENDPOINT, "rdzv-endpoint", 0, 0, "", "HOST[:PORT] of a gpulaunch-rdzv server"},
    {GL_RDZV_ID, "rdzv-id", 0, 0, "none", "a job id shared by every node"},
    {GL_RDZV_CONF, "rdzv-conf", 0, 0, "",
     "k=v,... with join_timeout, last_call_timeout, heartbeat_timeout (seconds)"},
    {GL_MAX_RESTARTS, "max-restarts", 0, 0, "0", "a non-negative integer"},
    {GL_MONITOR_INTERVAL, "monitor-interval", 0, 0, "0.1",
     "seconds (accepted for torchrun compatibility; exits are event-driven)"},
    {GL_ROLE, "role", 0, 0, "default", "a name"},
    {GL_LOG_DIR, "log-dir", 0, 0, "", "a directory"},
    {GL_REDIRECTS, "redirects", 'r', 0, "0", "0, 1, 2, 3 or per rank 0:1,1:2"},
    {GL_TEE, "tee", 't', 0, "0", "0, 1, 2, 3 or per rank 0:1,1:2"},
    {GL_LOCAL_RANKS_FILTER, "local-ranks-filter", 0, 0, "", "a comma list of local ranks"},
    {GL_LOCAL_ADDR, "local-addr", 0, 0, "", "the address other nodes reach this one at"},
    {GL_SHUTDOWN_TIMEOUT, "shutdown-timeout", 0, 0, "30", "seconds > 0"},
    {GL_MODULE, "module", 'm', 1, "0", "a flag"},
    {GL_NO_PYTHON, "no-python", 0, 1, "0", "a flag"},
    {GL_CONFIG, "config", 0, 0, "", "a YAML file"},
    {GL_RDZV_TOKEN_FILE, "rdzv-token-file", 0, 0, "", "a file holding the shared token"},
    {GL_BIND_GPUS, "bind-gpus", 0, 1, "0", "a flag"},
    {GL_SHM_MIN, "shm-min", 0, 0, "1g", "a size such as 512m or 8g"},
    {GL_CHECK, "check", 0, 1, "0", "a flag"},
    {GL_PRINT_CONFIG, "print-config", 0, 1, "0", "a flag"},
    {GL_NCCL_IFNAME_AUTO, "nccl-ifname-auto", 0, 0, "1", "1 or 0"},
    {GL_PREEMPTION_SOURCE, "preemption-source", 0, 0, "auto", "auto, aws, gcp, azure or none"},
    {GL_PREEMPTION_ENDPOINT, "preemption-endpoint", 0, 0, "",
     "the metadata service's base URL (default: the cloud's)"},
    {GL_PREEMPTION_POLL, "preemption-poll", 0, 0, "5", "seconds between polls (> 0)"},
    {GL_START_METHOD, "start-method", 0, 0, "spawn",
     "spawn, fork or forkserver (accepted for torchrun compatibility; workers are exec'd)"},
    {GL_EVENT_LOG_HANDLER, "event-log-handler", 0, 0, "null",
     "null or console (torchrun's Python event handlers are not loaded)"},
    {GL_RUN_PATH, "run-path", 0, 1, "0", "a flag"},
    {GL_DUPLICATE_STDOUT_FILTERS, "duplicate-stdout-filters", 0, 0, "",
     "a comma list of substrings (,, for a comma)"},
    {GL_DUPLICATE_STDERR_FILTERS, "duplicate-stderr-filters", 0, 0, "",
     "a comma list of substrings (,, for a comma)"},
    {GL_LOGS_SPECS, "logs-specs", 0, 0, "",
     "nothing: a Python LogsSpecs plugin cannot run in gpulaunch"},
    {GL_NUMA_BINDING, "numa-binding", 0, 0, "", "node, socket, exclusive or core-complex"},
    {GL_SIGNALS_TO_HANDLE, "signals-to-handle", 0, 0,
     "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2",
     "a comma list of signal names such as SIGTERM,SIGUSR1"},
    {GL_VIRTUAL_LOCAL_RANK, "virtual-local-rank", 0, 1, "0", "a flag"},
    {GL_LOG_LINE_PREFIX_TEMPLATE, "log-line-prefix-template", 0, 0, "",
     "a template with ${role_name}, ${rank}, ${local_rank}, ${pid}, ${hostname}"},
    {GL_PRINT_COMPLETION, "print-completion", 0, 0, "", "bash, zsh or tcsh"},
    [GL_SLURM] = {GL_SLURM, "slurm", 0, 0, "auto", "auto or off"},
    [GL_PROGRESS_TIMEOUT] = {GL_PROGRESS_TIMEOUT, "progress-timeout", 0, 0, "auto",
                             "seconds, auto, auto:FLOOR_SECONDS or 0 (off)"},
    [GL_STATS_INTERVAL] = {GL_STATS_INTERVAL, "stats-interval", 0, 0, "5",
                           "seconds between per-rank summaries to the rendezvous (0: off)"},
    [GL_WARM_START_TIMEOUT] = {GL_WARM_START_TIMEOUT, "warm-start-timeout", 0, 0, "120",
                               "seconds, at most 3600 (0: no warm join)"},
    [GL_GPU_HEALTH] = {GL_GPU_HEALTH, "gpu-health", 0, 0, "refuse", "refuse, warn or off"},
    [GL_GPU_MONITOR_INTERVAL] = {GL_GPU_MONITOR_INTERVAL, "gpu-monitor-interval", 0, 0, "10",
                                 "seconds between GPU samples (0: none), at least 0.1"},
    [GL_GPU_IDLE_ALERT] = {GL_GPU_IDLE_ALERT, "gpu-idle-alert", 0, 0, "50:30m",
                           "PCT:DURATION (e.g. 50:30m, 30:90s, 20:1h) or off"},
    [GL_METRICS] = {GL_METRICS, "metrics", 0, 0, "", "HOST:PORT for the launcher's /metrics"},
    [GL_DCGM_JOB_MAPPING_DIR] = {GL_DCGM_JOB_MAPPING_DIR, "dcgm-job-mapping-dir", 0, 0, "",
                                 "a directory (dcgm-exporter's --hpc-job-mapping-dir)"},
    [GL_CHECKPOINT_DURABLE] = {GL_CHECKPOINT_DURABLE, "checkpoint-durable", 0, 0, "",
                               "a shared directory or s3://BUCKET/PREFIX"},
    [GL_CHECKPOINT_ASYNC] = {GL_CHECKPOINT_ASYNC, "checkpoint-async", 0, 0, "on", "on or off"},
};

const char gl_usage[] =
    "usage: gpulaunch [options] PROGRAM [ARGS...]\n"
    "\n"
    "Starts nproc-per-node workers of PROGRAM on this node as one node of a\n"
    "distributed job, with the environment torchrun gives (RANK, LOCAL_RANK,\n"
    "WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...). A .py PROGRAM runs with python3\n"
    "(installed with pip: the environment's own); -m runs python3 -m PROGRAM;\n"
    "--no-python runs PROGRAM directly.\n"
    "\n"
    "Every option is spelled --a-b or --a_b, and also read from PET_A_B in the\n"
    "environment and from the --config YAML file; under srun, SLURM_* give the\n"
    "node count, node rank, master, job id and GPUs (CLI > PET_* > SLURM_* > file).\n"
    "\n"
    "  --nnodes N|MIN:MAX          nodes in the job (default 1:1)\n"
    "  --nproc-per-node N|auto|gpu|cpu   workers on this node (default 1)\n"
    "  --node-rank N               this node's rank in static mode (default 0)\n"
    "  --master-addr HOST          rank-0 node (static mode; default 127.0.0.1)\n"
    "  --master-port PORT          rendezvous port on the rank-0 node (default 29500)\n"
    "  --standalone                one node, embedded rendezvous on a free port\n"
    "  --rdzv-backend B            static (default), c10d or gpulaunch: dynamic\n"
    "  --rdzv-endpoint HOST[:PORT] gpulaunch-rdzv server (dynamic mode)\n"
    "  --rdzv-id ID                job id shared by every node\n"
    "  --rdzv-conf K=V,...         join_timeout, last_call_timeout, heartbeat_timeout (s)\n"
    "  --rdzv-token-file FILE      shared token (also GPULAUNCH_RDZV_TOKEN)\n"
    "  --max-restarts N            worker-group restarts before failing (default 0)\n"
    "  --shutdown-timeout S        SIGTERM to SIGKILL grace (default 30)\n"
    "  --role NAME, --monitor-interval S, --local-addr ADDR\n"
    "  --log-dir DIR               per-rank stdout/stderr files and the failure report\n"
    "  -r/--redirects, -t/--tee, --local-ranks-filter LIST   output routing\n"
    "  --bind-gpus                 give each worker its own GPU in CUDA_VISIBLE_DEVICES\n"
    "  --shm-min SIZE              smallest acceptable /dev/shm (default 1g)\n"
    "  --nccl-ifname-auto 0|1      set NCCL_SOCKET_IFNAME to the route to the master\n"
    "  --preemption-source S       auto (default), aws, gcp, azure or none: poll the\n"
    "                              cloud's spot/preemption notice; a notice (or SIGTERM)\n"
    "                              checkpoints every rank and exits 143\n"
    "  --preemption-endpoint URL   metadata base URL (IMDS proxies, tests)\n"
    "  --preemption-poll S         seconds between polls (default 5)\n"
    "  --slurm auto|off            auto (default): under srun, options from SLURM_*, and\n"
    "                              SIGUSR1/SIGUSR2 are preemption notices like SIGTERM;\n"
    "                              off: ignore Slurm (docs/slurm.md)\n"
    "  --progress-timeout S|auto[:FLOOR]|0   a rank without progress (steps, collectives)\n"
    "                              for S seconds is hung: named, stacks dumped, the job\n"
    "                              restarts (auto, default: 10x the slowest step after 5\n"
    "                              steps, at least FLOOR = 300 s; docs/health.md)\n"
    "  --stats-interval S          per-rank step time summaries to the rendezvous (default 5)\n"
    "  --warm-start-timeout S      a new node of an elastic job whose workers re-form in place\n"
    "                              starts them before its round; given up after S s (default\n"
    "                              120; 0: start them in their round, as torchrun does)\n"
    "  --gpu-health refuse|warn|off   NVML checks of each bound GPU before workers start\n"
    "                              (retired pages, row remapping, uncorrectable ECC, lost\n"
    "                              GPU, NVLink down, clock slowdowns, MIG layout); refuse\n"
    "                              (default) exits 3 naming the GPU (docs/gpu-health.md)\n"
    "  --gpu-monitor-interval S    sample each worker's GPU every S s (default 10; 0: off)\n"
    "  --gpu-idle-alert PCT:DUR    warn when a GPU stays under PCT % utilisation for DUR\n"
    "                              (default 50:30m; off)\n"
    "  --metrics HOST:PORT         serve the GPUs' and the launcher's own figures at\n"
    "                              http://HOST:PORT/metrics\n"
    "  --dcgm-job-mapping-dir DIR  dcgm-exporter job-mapping files for the job's GPUs\n"
    "  --checkpoint-durable DIR|s3://BUCKET/PREFIX   the workers' checkpoints (libgpulaunch,\n"
    "                              gpulaunch.Checkpointer) drain there from their local\n"
    "                              directory in the background (docs/checkpoints.md)\n"
    "  --checkpoint-async on|off   on (default): a checkpoint stalls training only for the\n"
    "                              copy into host memory; off: until written\n"
    "  --config FILE.yaml          options from a YAML mapping\n"
    "  --check                     run the preflight checks only\n"
    "  --print-config              print every effective option and its source\n"
    "  -m/--module, --no-python    how PROGRAM runs\n"
    "  --run-path                  run PROGRAM (a .py) with python3 -u, before --no-python\n"
    "\n"
    "torchrun 2.4+ options (docs/torchrun.md):\n"
    "  --numa-binding MODE         bind each worker's CPUs (and prefer its memory) to\n"
    "                              its GPU's NUMA node, read from sysfs; without GPUs\n"
    "                              local ranks are spread over the nodes in blocks:\n"
    "                              node: every CPU of the node; socket: every CPU of\n"
    "                              the node's socket; exclusive: the node's physical\n"
    "                              cores split among its GPUs; core-complex: one L3\n"
    "                              cache's cores per GPU\n"
    "  --signals-to-handle LIST    signals forwarded to the workers, which then stop\n"
    "                              (default SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2;\n"
    "                              SIGTERM also checkpoints every node, exit 143; in\n"
    "                              a Slurm job SIGUSR1/SIGUSR2 do that instead: --slurm)\n"
    "  --virtual-local-rank        LOCAL_RANK=0 for every worker, CUDA_VISIBLE_DEVICES\n"
    "                              narrowed to its own GPU\n"
    "  --log-line-prefix-template T   console prefix of worker lines, default\n"
    "                              [${role_name}${local_rank}]: ; also ${rank}, ${pid},\n"
    "                              ${hostname} (also TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)\n"
    "  --duplicate-stdout-filters A,B   copy --tee'd stdout lines containing A or B to\n"
    "                              LOG_DIR/RUN_ID/attempt_N/filtered_stdout.log\n"
    "  --duplicate-stderr-filters A,B   the same for stderr (filtered_stderr.log)\n"
    "  --print-completion SHELL    print a bash, zsh or tcsh completion script\n"
    "  --start-method M            accepted (spawn, fork, forkserver): workers are exec'd\n"
    "  --event-log-handler H       null or console: events are gpulaunch's stderr lines\n"
    "  --logs-specs NAME           refused: a Python plugin; the options above do its work\n"
    "\n"
    "Exit codes: 0 success; 2 usage or configuration; 3 preflight failed;\n"
    "1-127 a worker's own exit code once restarts are exhausted; 128+N a worker\n"
    "killed by signal N; 143 after SIGTERM (retryable under PyTorchJob\n"
    "restartPolicy: ExitCode); 200 rendezvous failed (unreachable, timed out);\n"
    "201 a rank hung (--progress-timeout) and no restarts were left.\n";

const char *gl_opt_name(int id) { return table[id].name; }

static const gl_opt *find_long(const char *name, size_t len) {
    char norm[64];
    if (len >= sizeof norm)
        return NULL;
    for (size_t i = 0; i < len; i++)
        norm[i] = name[i] == '_' ? '-' : name[i];
    norm[len] = '\0';
    if (strcmp(norm, "nproc-per-node") == 0 || strcmp(norm, "nproc") == 0)
        return &table[GL_NPROC_PER_NODE];
    for (int i = 0; i < GL_OPT_COUNT; i++)
        if (strcmp(table[i].name, norm) == 0)
            return &table[i];
    return NULL;
}

static void set_val(gl_config *c, int id, const char *v, int src) {
    if (c->src[id] > src)
        return;
    free(c->val[id]);
    c->val[id] = strdup(v);
    c->src[id] = src;
}

static int load_yaml(gl_config *c, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "--config: cannot read %s: %s", path, strerror(errno));
        return 2;
    }
    yaml_parser_t p;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_file(&p, f);
    int rc = 0, depth = 0, root = 1; /* root: the next node is the document's top */
    char key[128] = "";
    int have_key = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            snprintf(err, errlen, "--config %s: YAML error at line %zu: %s", path,
                     p.problem_mark.line + 1, p.problem ? p.problem : "?");
            rc = 2;
            break;
        }
        int done = ev.type == YAML_STREAM_END_EVENT;
        if (root && (ev.type == YAML_SCALAR_EVENT || ev.type == YAML_SEQUENCE_START_EVENT ||
                     ev.type == YAML_ALIAS_EVENT)) {
            /* a file of options is a mapping; anything else would be ignored */
            snprintf(err, errlen,
                     "--config %s: the file holds a %s at line %zu, not a mapping of options; "
                     "write one option per line as `name: value` (e.g. `nproc-per-node: 8`)",
                     path, ev.type == YAML_SEQUENCE_START_EVENT ? "list" : "scalar",
                     ev.start_mark.line + 1);
            rc = 2;
        } else if (ev.type == YAML_MAPPING_START_EVENT)
            depth++;
        else if (ev.type == YAML_MAPPING_END_EVENT)
            depth--;
        else if (ev.type == YAML_SEQUENCE_START_EVENT) {
            snprintf(err, errlen, "--config %s: option '%s' takes a scalar, not a list", path, key);
            rc = 2;
        } else if (ev.type == YAML_SCALAR_EVENT && depth == 1) {
            const char *s = (const char *)ev.data.scalar.value;
            if (!have_key) {
                snprintf(key, sizeof key, "%s", s);
                have_key = 1;
            } else {
                const gl_opt *o = find_long(key, strlen(key));
                if (o == NULL || o->id == GL_CONFIG) {
                    snprintf(err, errlen, "--config %s: unknown option '%s' (line %zu)", path, key,
                             ev.start_mark.line + 1);
                    rc = 2;
                } else {
                    const char *v = s;
                    if (o->flag)
                        v = (strcmp(s, "true") == 0 || strcmp(s, "1") == 0) ? "1" : "0";
                    set_val(c, o->id, v, GL_SRC_FILE);
                }
                have_key = 0;
            }
        } else if (depth > 1) {
            snprintf(err, errlen, "--config %s: option '%s' takes a scalar, not a mapping", path,
                     key);
            rc = 2;
        }
        if (ev.type == YAML_MAPPING_START_EVENT || ev.type == YAML_SCALAR_EVENT ||
            ev.type == YAML_SEQUENCE_START_EVENT || ev.type == YAML_ALIAS_EVENT)
            root = 0;
        else if (ev.type == YAML_DOCUMENT_END_EVENT)
            root = 1;
        yaml_event_delete(&ev);
        if (done || rc)
            break;
    }
    yaml_parser_delete(&p);
    fclose(f);
    return rc;
}

int gl_opt_bad(char *err, size_t errlen, int id, const char *v) {
    snprintf(err, errlen, "--%s: '%s' is not valid; expected %s", table[id].name, v,
             table[id].forms);
    return 2;
}

int gl_opt_is_flag(int id) { return table[id].flag; }

static const char *env_get(const char *name) { return getenv(name); }

/* --slurm auto: inside a job, SIGUSR1/SIGUSR2 become preemption notices; in
 * an srun step (not --standalone) its SLURM_* give options (gl_slurm.c). */
static int load_slurm(gl_config *c, char *err, size_t errlen) {
    const char *mode = c->val[GL_SLURM];
    if (strcmp(mode, "auto") && strcmp(mode, "off"))
        return gl_opt_bad(err, errlen, GL_SLURM, mode);
    const char *job = getenv("SLURM_JOB_ID");
    c->slurm = strcmp(mode, "auto") == 0 && job && *job;
    const char *sa = c->val[GL_STANDALONE];
    if (!c->slurm || strcmp(sa, "1") == 0 || strcmp(sa, "true") == 0)
        return 0;
    gl_slurm s;
    int rc = gl_slurm_read(env_get, &s, err, errlen);
    if (rc || !s.active)
        return rc;
    set_val(c, GL_NNODES, s.nnodes, GL_SRC_SLURM);
    set_val(c, GL_NODE_RANK, s.node_rank, GL_SRC_SLURM);
    set_val(c, GL_MASTER_ADDR, s.master_addr, GL_SRC_SLURM);
    set_val(c, GL_MASTER_PORT, s.master_port, GL_SRC_SLURM);
    set_val(c, GL_RDZV_ID, s.rdzv_id, GL_SRC_SLURM);
    if (s.nproc[0])
        set_val(c, GL_NPROC_PER_NODE, s.nproc, GL_SRC_SLURM);
    return 0;
}

int gl_config_load(gl_config *c, int argc, char **argv, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < GL_OPT_COUNT; i++) {
        c->val[i] = strdup(table[i].def);
        c->src[i] = GL_SRC_DEFAULT;
    }
    /* 1. command line, up to PROGRAM */
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0')
            break;
        const gl_opt *o = NULL;
        const char *val = NULL;
        if (a[1] == '-') {
            const char *eq = strchr(a + 2, '=');
            size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            o = find_long(a + 2, len);
            if (eq)
                val = eq + 1;
        } else if (a[2] == '\0') {
            for (int k = 0; k < GL_OPT_COUNT; k++)
                if (table[k].shortopt == a[1])
                    o = &table[k];
        }
        if (o == NULL) {
            snprintf(err, errlen, "unknown option '%s' (see gpulaunch --help)", a);
            return 2;
        }
        if (o->flag) {
            if (val && strcmp(val, "1") && strcmp(val, "0") && strcmp(val, "true") &&
                strcmp(val, "false"))
                return gl_opt_bad(err, errlen, o->id, val);
            set_val(c, o->id, val ? val : "1", GL_SRC_CLI);
            if (o->id == GL_MODULE) {
                i++;
                break; /* -m MODULE: the module is the program */
            }
            continue;
        }
        if (val == NULL) {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "--%s needs a value: %s", o->name, o->forms);
                return 2;
            }
            val = argv[++i];
        }
        set_val(c, o->id, val, GL_SRC_CLI);
    }
    c->prog_argv = argv + i;
    c->prog_argc = argc - i;
    /* 2. torchrun's own variables for two options, below PET_* */
    static const struct {
        int id;
        const char *env;
    } alias[] = {{GL_LOG_LINE_PREFIX_TEMPLATE, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"},
                 {GL_SHUTDOWN_TIMEOUT, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"}};
    for (size_t k = 0; k < sizeof alias / sizeof alias[0]; k++) {
        const char *e = getenv(alias[k].env);
        if (e && *e)
            set_val(c, alias[k].id, e, GL_SRC_ENV);
    }
    /* 2. PET_* environment */
    for (int k = 0; k < GL_OPT_COUNT; k++) {
        char env[64] = "PET_";
        size_t l = 4;
        for (const char *p = table[k].name; *p && l < sizeof env - 1; p++)
            env[l++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
        env[l] = '\0';
        const char *e = getenv(env);
        if (e && *e)
            set_val(c, k, e, GL_SRC_ENV);
    }
    /* 3. the YAML file */
    if (c->val[GL_CONFIG][0]) {
        int rc = load_yaml(c, c->val[GL_CONFIG], err, errlen);
        if (rc)
            return rc;
    }
    /* 4. an srun job step's SLURM_*: ranked between PET_* and the file by
     * set_val, so it may come last (the file may say slurm: off) */
    int rc = load_slurm(c, err, errlen);
    return rc ? rc : gl_config_resolve(c, err, errlen);
}

void gl_config_free(gl_config *c) {
    for (int i = 0; i < GL_OPT_COUNT; i++)
        free(c->val[i]);
}

void gl_config_print(const gl_config *c, FILE *out) {
    static const char *const src[] = {"default", "file", "slurm", "env", "cli"};
    for (int i = 0; i < GL_OPT_COUNT; i++)
        fprintf(out, "%-20s %-24s (%s)\n", table[i].name, c->val[i], src[c->src[i]]);
    fprintf(out, "%-20s %d\n", "nproc (resolved)", c->nproc);
    fprintf(out, "%-20s %s\n", "mode",
            c->mode == GL_MODE_STANDALONE ? "standalone"
            : c->mode == GL_MODE_STATIC   ? "static"
                                          : "dynamic");
}

void gl_print_completion(const char *shell, FILE *out) {
    char opts[4096];
    size_t off = 0;
    for (int i = 0; i < GL_OPT_COUNT && off < sizeof opts; i++) {
        int k = snprintf(opts + off, sizeof opts - off, "%s--%s", off ? " " : "", table[i].name);
        if (k > 0)
            off += (size_t)k;
    }
    if (off < sizeof opts)
        snprintf(opts + off, sizeof opts - off, " --help -m -r -t");
    if (strcmp(shell, "tcsh") == 0) {
        fprintf(out, "complete gpulaunch 'c/--/(");
        for (int i = 0; i < GL_OPT_COUNT; i++)
            fprintf(out, "%s%s", i ? " " : "", table[i].name);
        fprintf(out, " help)/' 'p/*/f/'\n");
        return;
    }
    if (strcmp(shell, "zsh") == 0)
        fprintf(out, "#compdef gpulaunch\nautoload -U +X bashcompinit && bashcompinit\n");
    fprintf(out,
            "_gpulaunch() {\n"
            "    local cur=\"${COMP_WORDS[COMP_CWORD]}\"\n"
            "    if [[ \"$cur\" == -* ]]; then\n"
            "        COMPREPLY=($(compgen -W \"%s\" -- \"$cur\"))\n"
            "    else\n"
            "        COMPREPLY=($(compgen -f -- \"$cur\"))\n"
            "    fi\n"
            "}\n"
            "complete -o default -F _gpulaunch gpulaunch\n",
            opts);
}
