/* The launcher's option table: every spelling, every source, precedence,
 * every refusal; and the preflight checks with injected node facts. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gl_numa.h"
#include "gl_options.h"
#include "gl_preflight.h"

static gl_config cfg;
static char err[1024];

static int load(int argc, const char **argv) {
    return gl_config_load(&cfg, argc, (char **)argv, err, sizeof err);
}

static void clean_env(void) {
    const char *vars[] = {"PET_NNODES",
                          "PET_NPROC_PER_NODE",
                          "PET_NODE_RANK",
                          "PET_MASTER_ADDR",
                          "PET_MASTER_PORT",
                          "PET_MAX_RESTARTS",
                          "PET_RDZV_BACKEND",
                          "PET_RDZV_ENDPOINT",
                          "PET_STANDALONE",
                          "PET_CONFIG",
                          "PET_SHM_MIN",
                          "PET_PREEMPTION_SOURCE",
                          NULL};
    for (int i = 0; vars[i]; i++)
        unsetenv(vars[i]);
    unsetenv("CUDA_VISIBLE_DEVICES");
}

TestSuite(options, .init = clean_env, .fini = NULL);

Test(options, the_seed_command_line) {
    const char *argv[] = {"gpulaunch",     "--nproc_per_node=8",         "--nnodes=4",
                          "--node_rank=2", "--master_addr=job-master-0", "--master_port=23456",
                          "train_llm.py",  "--model=llama-7b",           NULL};
    cr_assert_eq(load(8, argv), 0, "%s", err);
    cr_expect_eq(cfg.nproc, 8);
    cr_expect_eq(cfg.min_nodes, 4);
    cr_expect_eq(cfg.max_nodes, 4);
    cr_expect_eq(cfg.node_rank, 2);
    cr_expect_str_eq(cfg.val[GL_MASTER_ADDR], "job-master-0");
    cr_expect_eq(cfg.master_port, 23456);
    cr_expect_eq(cfg.mode, GL_MODE_STATIC);
    cr_expect_eq(cfg.prog_argc, 2);
    cr_expect_str_eq(cfg.prog_argv[0], "train_llm.py");
    cr_expect_str_eq(cfg.prog_argv[1], "--model=llama-7b", "program options are not ours");
    gl_config_free(&cfg);
}

Test(options, both_spellings_and_separate_values) {
    const char *a[] = {"gpulaunch", "--nproc-per-node",       "3",           "--max_restarts",
                       "2",         "--shutdown-timeout=1.5", "--no_python", "/bin/true",
                       NULL};
    cr_assert_eq(load(8, a), 0, "%s", err);
    cr_expect_eq(cfg.nproc, 3);
    cr_expect_eq(cfg.max_restarts, 2);
    cr_expect_float_eq(cfg.shutdown_timeout_s, 1.5, 1e-9);
    cr_expect(cfg.no_python);
    cr_expect_eq(cfg.src[GL_NPROC_PER_NODE], GL_SRC_CLI);
    gl_config_free(&cfg);
}

Test(options, module_flag_takes_the_module_as_program) {
    const char *a[] = {"gpulaunch", "-m", "torch.utils.collect_env", "--x", NULL};
    cr_assert_eq(load(4, a), 0, "%s", err);
    cr_expect(cfg.module);
    cr_expect_str_eq(cfg.prog_argv[0], "torch.utils.collect_env");
    cr_expect_eq(cfg.prog_argc, 2);
    gl_config_free(&cfg);
}

Test(options, environment_and_precedence) {
    setenv("PET_NPROC_PER_NODE", "5", 1);
    setenv("PET_NNODES", "2", 1);
    setenv("PET_NODE_RANK", "1", 1);
    setenv("PET_MASTER_PORT", "40000", 1);
    const char *a[] = {"gpulaunch", "--master-port", "41000", "prog", NULL};
    cr_assert_eq(load(4, a), 0, "%s", err);
    cr_expect_eq(cfg.nproc, 5);
    cr_expect_eq(cfg.src[GL_NPROC_PER_NODE], GL_SRC_ENV);
    cr_expect_eq(cfg.master_port, 41000, "CLI beats the environment");
    cr_expect_eq(cfg.node_rank, 1);
    gl_config_free(&cfg);
}

Test(options, yaml_file_is_the_lowest_source) {
    char path[] = "/tmp/gpl-cfg-XXXXXX";
    int fd = mkstemp(path);
    const char *y = "nnodes: 3\nnproc_per_node: 7\nmax-restarts: 4\nmaster_port: 12345\n"
                    "bind_gpus: false\n";
    cr_assert(write(fd, y, strlen(y)) == (ssize_t)strlen(y));
    close(fd);
    setenv("PET_MAX_RESTARTS", "9", 1);
    const char *a[] = {"gpulaunch", "--config", path, "--node-rank", "2", "prog", NULL};
    cr_assert_eq(load(6, a), 0, "%s", err);
    cr_expect_eq(cfg.max_nodes, 3);
    cr_expect_eq(cfg.nproc, 7);
    cr_expect_eq(cfg.src[GL_NPROC_PER_NODE], GL_SRC_FILE);
    cr_expect_eq(cfg.max_restarts, 9, "environment beats the file");
    cr_expect_eq(cfg.master_port, 12345);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    gl_config_print(&cfg, m);
    fclose(m);
    cr_expect(strstr(buf, "nproc-per-node       7") && strstr(buf, "(file)"), "%s", buf);
    cr_expect(strstr(buf, "max-restarts         9                        (env)"), "%s", buf);
    free(buf);
    gl_config_free(&cfg);
    /* an unknown key in the file is refused with its line */
    fd = open(path, O_WRONLY | O_TRUNC);
    cr_assert(write(fd, "nnodes: 1\nbogus: 3\n", 19) == 19);
    close(fd);
    cr_expect_eq(load(6, a), 2);
    cr_expect(strstr(err, "unknown option 'bogus' (line 2)") != NULL, "%s", err);
    gl_config_free(&cfg);
    /* a file that is not a mapping would be ignored: refused, saying what it holds */
    const char *notmap[] = {"nproc-per-node 8\n", "- nnodes: 2\n", "--- just text\n"};
    for (size_t i = 0; i < sizeof notmap / sizeof notmap[0]; i++) {
        fd = open(path, O_WRONLY | O_TRUNC);
        cr_assert(write(fd, notmap[i], strlen(notmap[i])) == (ssize_t)strlen(notmap[i]));
        close(fd);
        cr_expect_eq(load(6, a), 2, "%s accepted", notmap[i]);
        cr_expect(strstr(err, "not a mapping of options") && strstr(err, "name: value") &&
                      strstr(err, i == 1 ? "holds a list" : "holds a scalar"),
                  "%s", err);
        gl_config_free(&cfg);
    }
    /* an empty file holds no options */
    fd = open(path, O_WRONLY | O_TRUNC);
    close(fd);
    const char *e[] = {"gpulaunch", "--config", path, "prog", NULL};
    cr_expect_eq(load(4, e), 0, "%s", err);
    gl_config_free(&cfg);
    unlink(path);
}

Test(options, checkpoint_tiers_from_the_command_line_environment_and_file) {
    char path[] = "/tmp/gpl-cfg-XXXXXX";
    int fd = mkstemp(path);
    const char *y = "checkpoint-durable: /mnt/pvc/ckpt\ncheckpoint-async: off\n";
    cr_assert(write(fd, y, strlen(y)) == (ssize_t)strlen(y));
    close(fd);
    const char *a[] = {"gpulaunch", "--config", path, "prog", NULL};
    cr_assert_eq(load(4, a), 0, "%s", err);
    cr_expect_str_eq(cfg.val[GL_CHECKPOINT_DURABLE], "/mnt/pvc/ckpt");
    cr_expect_eq(cfg.ckpt_async, 0);
    gl_config_free(&cfg);
    setenv("PET_CHECKPOINT_DURABLE", "s3://ckpts/job7", 1);
    cr_assert_eq(load(4, a), 0, "%s", err);
    cr_expect_str_eq(cfg.val[GL_CHECKPOINT_DURABLE], "s3://ckpts/job7");
    cr_expect_eq(cfg.src[GL_CHECKPOINT_DURABLE], GL_SRC_ENV, "the environment beats the file");
    gl_config_free(&cfg);
    const char *b[] = {"gpulaunch", "--config", path, "--checkpoint-async", "on", "prog", NULL};
    cr_assert_eq(load(6, b), 0, "%s", err);
    cr_expect_eq(cfg.ckpt_async, 1);
    gl_config_free(&cfg);
    unsetenv("PET_CHECKPOINT_DURABLE");
    unlink(path);
}

Test(options, rdzv_conf_is_host_and_a_static_endpoint) {
    const char *a[] = {"gpulaunch",
                       "--nnodes",
                       "1:2",
                       "--rdzv-backend",
                       "c10d",
                       "--rdzv-endpoint",
                       "h:1",
                       "--rdzv-conf",
                       "is_host=false,join_timeout=3",
                       "prog",
                       NULL};
    cr_assert_eq(load(10, a), 0, "%s", err);
    cr_expect_eq(cfg.rdzv_is_host, 0);
    cr_expect_eq(cfg.join_timeout_ms, 3000);
    gl_config_free(&cfg);
    a[8] = "is_host=True";
    cr_assert_eq(load(10, a), 0, "%s", err);
    cr_expect_eq(cfg.rdzv_is_host, 1);
    gl_config_free(&cfg);
    a[8] = "is_host=maybe";
    cr_expect_eq(load(10, a), 2);
    cr_expect(strstr(err, "'maybe' is not valid") != NULL, "%s", err);
    gl_config_free(&cfg);
    /* torchrun's static backend takes the master's address from the endpoint */
    const char *s[] = {
        "gpulaunch",       "--nnodes",       "2",    "--node-rank", "1", "--rdzv-backend", "static",
        "--rdzv-endpoint", "master-0:23456", "prog", NULL};
    cr_assert_eq(load(10, s), 0, "%s", err);
    cr_expect_eq(cfg.mode, GL_MODE_STATIC);
    cr_expect_str_eq(cfg.val[GL_MASTER_ADDR], "master-0");
    cr_expect_eq(cfg.master_port, 23456);
    gl_config_free(&cfg);
    /* etcd is refused saying what to use */
    const char *e[] = {"gpulaunch", "--nnodes", "2", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint",
                       "etcd:2379", "prog",     NULL};
    cr_expect_eq(load(8, e), 2);
    cr_expect(strstr(err, "etcd server") && strstr(err, "--rdzv-backend c10d"), "%s", err);
    gl_config_free(&cfg);
}

Test(options, elastic_dynamic_mode) {
    const char *a[] = {"gpulaunch",
                       "--nnodes=2:4",
                       "--rdzv-backend=c10d",
                       "--rdzv-endpoint=rdzv.svc:29400",
                       "--rdzv-id=job7",
                       "--rdzv-conf=join_timeout=5,last_call_timeout=1.5,heartbeat_timeout=3",
                       "prog",
                       NULL};
    cr_assert_eq(load(7, a), 0, "%s", err);
    cr_expect_eq(cfg.mode, GL_MODE_DYNAMIC);
    cr_expect_eq(cfg.min_nodes, 2);
    cr_expect_eq(cfg.max_nodes, 4);
    cr_expect_eq(cfg.join_timeout_ms, 5000);
    cr_expect_eq(cfg.last_call_ms, 1500);
    cr_expect_eq(cfg.hb_timeout_ms, 3000);
    gl_config_free(&cfg);
}

Test(options, nproc_keywords) {
    const char *a[] = {"gpulaunch", "--nproc-per-node", "cpu", "prog", NULL};
    cr_assert_eq(load(4, a), 0, "%s", err);
    cr_expect_eq(cfg.nproc, (int)sysconf(_SC_NPROCESSORS_ONLN));
    gl_config_free(&cfg);
    setenv("CUDA_VISIBLE_DEVICES", "MIG-1c2d,MIG-3e4f,MIG-5a6b", 1);
    const char *b[] = {"gpulaunch", "--nproc-per-node", "gpu", "prog", NULL};
    cr_assert_eq(load(4, b), 0, "%s", err);
    cr_expect_eq(cfg.nproc, 3, "each MIG instance counts as one GPU");
    gl_config_free(&cfg);
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    cr_expect_eq(load(4, b), 2);
    cr_expect(strstr(err, "no GPU") != NULL, "%s", err);
    gl_config_free(&cfg);
}

/* Every refusal names the option and its accepted forms. */
Test(options, refusals) {
    struct {
        const char *args[6];
        const char *needle;
    } cases[] = {
        {{"--bogus", "prog"}, "unknown option '--bogus'"},
        {{"--nnodes", "0", "prog"}, "--nnodes: '0' is not valid; expected N or MIN:MAX"},
        {{"--nnodes", "4:2", "prog"}, "--nnodes: '4:2'"},
        {{"--nproc-per-node", "many", "prog"}, "positive integer, auto, gpu or cpu"},
        {{"--master-port", "70000", "prog"}, "a port from 1 to 65535"},
        {{"--node-rank", "4", "--nnodes", "4", "prog"}, "--node-rank: '4'"},
        {{"--max-restarts", "-1", "prog"}, "--max-restarts"},
        {{"--shutdown-timeout", "0", "prog"}, "--shutdown-timeout"},
        {{"--shm-min", "lots", "prog"}, "a size such as 512m"},
        {{"--standalone", "--nnodes", "2", "prog"}, "--standalone runs one node"},
        {{"--nnodes", "1:2", "prog"}, "needs --rdzv-backend c10d"},
        {{"--rdzv-backend", "c10d", "prog"}, "needs --rdzv-endpoint"},
        {{"--rdzv-backend", "etcd", "prog"}, "does not speak"},
        {{"--rdzv-conf", "join_timeout", "prog"}, "--rdzv-conf"},
        {{"--redirects", "9", "prog"}, "--redirects"},
        {{"--standalone=maybe", "prog"}, "--standalone: 'maybe'"},
        {{"--master-port"}, "--master-port needs a value"},
        {{"--nproc-per-node", "2"}, "no PROGRAM"},
        {{"--progress-timeout", "soon", "prog"}, "seconds, auto, auto:FLOOR_SECONDS or 0"},
        {{"--progress-timeout", "-1", "prog"}, "--progress-timeout: '-1'"},
        {{"--progress-timeout", "auto:0", "prog"}, "--progress-timeout: 'auto:0'"},
        {{"--progress-timeout", "autox", "prog"}, "--progress-timeout: 'autox'"},
        {{"--stats-interval", "0.01", "prog"}, "--stats-interval: '0.01'"},
        {{"--stats-interval", "3601", "prog"}, "--stats-interval: '3601'"},
        {{"--warm-start-timeout", "-1", "prog"}, "--warm-start-timeout: '-1'"},
        {{"--warm-start-timeout", "3601", "prog"}, "--warm-start-timeout: '3601'"},
        {{"--checkpoint-durable", "ckpts", "prog"}, "a shared directory or s3://BUCKET/PREFIX"},
        {{"--checkpoint-durable", "s3://", "prog"}, "--checkpoint-durable: 's3://'"},
        {{"--checkpoint-async", "maybe", "prog"}, "on or off"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *argv[8] = {"gpulaunch"};
        int argc = 1;
        for (int k = 0; k < 6 && cases[i].args[k]; k++)
            argv[argc++] = cases[i].args[k];
        argv[argc] = NULL;
        err[0] = 0;
        cr_expect_eq(load(argc, argv), 2, "case %zu accepted", i);
        cr_expect(strstr(err, cases[i].needle) != NULL, "case %zu: '%s' lacks '%s'", i, err,
                  cases[i].needle);
        gl_config_free(&cfg);
    }
}

Test(options, sizes) {
    cr_expect_eq(gl_parse_size("512m"), 512ll << 20);
    cr_expect_eq(gl_parse_size("8G"), 8ll << 30);
    cr_expect_eq(gl_parse_size("16GiB"), 16ll << 30);
    cr_expect_eq(gl_parse_size("4096"), 4096);
    cr_expect_eq(gl_parse_size("x"), -1);
    cr_expect_eq(gl_parse_size("5q"), -1);
}

Test(preflight, ifname_matching) {
    cr_expect(gl_ifname_match("eth", "eth0"));
    cr_expect(gl_ifname_match("ib,eth", "eth1"));
    cr_expect(!gl_ifname_match("ib", "eth0"));
    cr_expect(gl_ifname_match("^docker,lo", "eth0"));
    cr_expect(!gl_ifname_match("^docker,lo", "docker0"));
    cr_expect(gl_ifname_match("=eth0", "eth0"));
    cr_expect(!gl_ifname_match("=eth0", "eth01"));
    cr_expect(!gl_ifname_match("^=eth0", "eth0"));
}

static char out[8192];

static int run_pf(gl_preflight_env *e) {
    FILE *f = fmemopen(out, sizeof out, "w");
    int n = gl_preflight(e, f, 1);
    fclose(f);
    return n;
}

Test(preflight, shm_missing_small_full_and_stale) {
    char dir[] = "/tmp/gpl-shm-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    gl_preflight_env e = {.shm_path = "/nonexistent/shm", .gpus_visible = 0};
    cr_expect_eq(run_pf(&e), 1);
    cr_expect(strstr(out, "FAIL /nonexistent/shm is not mounted") && strstr(out, "emptyDir"), "%s",
              out);
    e.shm_path = dir;
    e.shm_min = 1ull << 50;
    cr_expect_eq(run_pf(&e), 1);
    cr_expect(strstr(out, "under --shm-min") && strstr(out, "medium: Memory"), "%s", out);
    e.shm_min = 1;
    char seg[256];
    snprintf(seg, sizeof seg, "%s/nccl-AbCdEf", dir);
    FILE *f = fopen(seg, "w");
    fputs("x", f);
    fclose(f);
    cr_expect_eq(run_pf(&e), 0);
    cr_expect(strstr(out, "warn 1 nccl-* segment(s)") != NULL, "%s", out);
    unlink(seg);
    rmdir(dir);
}

Test(preflight, ifname_and_gpus_injected) {
    const char *ifs[] = {"eth0", "ib0"};
    gl_preflight_env e = {.shm_path = "/dev/shm",
                          .nccl_ifname = "ens",
                          .ifaces = ifs,
                          .nifaces = 2,
                          .gpus_visible = 4,
                          .gpus_needed = 8};
    cr_expect_eq(run_pf(&e), 2);
    cr_expect(strstr(out, "NCCL_SOCKET_IFNAME=ens matches no interface") &&
                  strstr(out, "eth0, ib0"),
              "%s", out);
    cr_expect(strstr(out, "8 worker(s) need one GPU each but this node exposes 4"), "%s", out);
    e.nccl_ifname = "^docker";
    e.gpus_needed = 4;
    cr_expect_eq(run_pf(&e), 0, "%s", out);
}

/* ---- torchrun 2.4+ options (docs/torchrun.md) ---- */

static void clean_torchrun_env(void) {
    clean_env();
    const char *vars[] = {"PET_NUMA_BINDING",
                          "PET_SIGNALS_TO_HANDLE",
                          "PET_VIRTUAL_LOCAL_RANK",
                          "PET_LOG_LINE_PREFIX_TEMPLATE",
                          "PET_SHUTDOWN_TIMEOUT",
                          "PET_START_METHOD",
                          "PET_LOG_DIR",
                          "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
                          "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
                          "GPULAUNCH_SYSFS_ROOT",
                          "NVIDIA_VISIBLE_DEVICES",
                          NULL};
    for (int i = 0; vars[i]; i++)
        unsetenv(vars[i]);
}

TestSuite(torchrun_options, .init = clean_torchrun_env, .fini = NULL);

Test(torchrun_options, defaults_match_torchrun_plus_slurm_signals) {
    const char *a[] = {"gpulaunch", "prog", NULL};
    cr_assert_eq(load(2, a), 0, "%s", err);
    cr_expect_eq(cfg.numa_binding, GL_NUMA_NONE);
    cr_expect_eq(cfg.virtual_local_rank, 0);
    cr_expect_eq(cfg.run_path, 0);
    cr_expect_str_eq(cfg.val[GL_START_METHOD], "spawn");
    cr_expect_str_eq(cfg.val[GL_EVENT_LOG_HANDLER], "null");
    cr_expect_str_eq(cfg.val[GL_LOG_LINE_PREFIX_TEMPLATE], "");
    int want[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    cr_assert_eq(cfg.nsignals, 6);
    for (int i = 0; i < 6; i++)
        cr_expect_eq(cfg.signals[i], want[i], "signal %d", i);
    gl_config_free(&cfg);
}

Test(torchrun_options, both_spellings) {
    const char *a[] = {"gpulaunch",
                       "--numa_binding",
                       "socket",
                       "--signals-to-handle=SIGUSR1, TERM ,SIGUSR1",
                       "--virtual_local_rank",
                       "--start_method",
                       "forkserver",
                       "--event-log-handler",
                       "console",
                       "--run_path",
                       "--log_line_prefix_template",
                       "[${rank}]",
                       "--log-dir",
                       "/tmp/x",
                       "--duplicate_stdout_filters",
                       "a,,b,c",
                       "--duplicate-stderr-filters=err",
                       "--nproc-per-node",
                       "2",
                       "train.py",
                       NULL};
    cr_assert_eq(load(20, a), 0, "%s", err);
    cr_expect_eq(cfg.numa_binding, GL_NUMA_SOCKET);
    cr_expect_eq(cfg.nsignals, 2, "duplicates dropped, names with or without SIG, spaces");
    cr_expect_eq(cfg.signals[0], SIGUSR1);
    cr_expect_eq(cfg.signals[1], SIGTERM);
    cr_expect(cfg.virtual_local_rank);
    cr_expect(cfg.run_path);
    cr_expect_str_eq(cfg.val[GL_START_METHOD], "forkserver");
    cr_expect_str_eq(cfg.val[GL_LOG_LINE_PREFIX_TEMPLATE], "[${rank}]");
    cr_expect_str_eq(cfg.val[GL_DUPLICATE_STDOUT_FILTERS], "a,,b,c");
    cr_expect_str_eq(cfg.val[GL_DUPLICATE_STDERR_FILTERS], "err");
    for (int id = GL_START_METHOD; id <= GL_LOG_LINE_PREFIX_TEMPLATE; id++)
        if (id != GL_LOGS_SPECS)
            cr_expect_eq(cfg.src[id], GL_SRC_CLI, "--%s", gl_opt_name(id));
    gl_config_free(&cfg);
}

Test(torchrun_options, pet_and_torchelastic_environment) {
    setenv("PET_NUMA_BINDING", "core-complex", 1);
    setenv("PET_SIGNALS_TO_HANDLE", "SIGUSR2", 1);
    setenv("PET_VIRTUAL_LOCAL_RANK", "1", 1);
    setenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${hostname}:", 1);
    setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7", 1);
    const char *a[] = {"gpulaunch", "prog", NULL};
    cr_assert_eq(load(2, a), 0, "%s", err);
    cr_expect_eq(cfg.numa_binding, GL_NUMA_CORE_COMPLEX);
    cr_expect_eq(cfg.src[GL_NUMA_BINDING], GL_SRC_ENV);
    cr_expect_eq(cfg.nsignals, 1);
    cr_expect_eq(cfg.signals[0], SIGUSR2);
    cr_expect(cfg.virtual_local_rank);
    cr_expect_str_eq(cfg.val[GL_LOG_LINE_PREFIX_TEMPLATE], "${hostname}:");
    cr_expect_float_eq(cfg.shutdown_timeout_s, 7.0, 1e-9);
    gl_config_free(&cfg);
    /* PET_* beats torchrun's own variable, the command line beats both */
    setenv("PET_LOG_LINE_PREFIX_TEMPLATE", "pet:", 1);
    setenv("PET_SHUTDOWN_TIMEOUT", "9", 1);
    cr_assert_eq(load(2, a), 0, "%s", err);
    cr_expect_str_eq(cfg.val[GL_LOG_LINE_PREFIX_TEMPLATE], "pet:");
    cr_expect_float_eq(cfg.shutdown_timeout_s, 9.0, 1e-9);
    gl_config_free(&cfg);
    const char *b[] = {
        "gpulaunch", "--log-line-prefix-template", "cli:", "--shutdown-timeout", "3", "prog", NULL};
    cr_assert_eq(load(6, b), 0, "%s", err);
    cr_expect_str_eq(cfg.val[GL_LOG_LINE_PREFIX_TEMPLATE], "cli:");
    cr_expect_eq(cfg.src[GL_LOG_LINE_PREFIX_TEMPLATE], GL_SRC_CLI);
    cr_expect_float_eq(cfg.shutdown_timeout_s, 3.0, 1e-9);
    gl_config_free(&cfg);
}

Test(torchrun_options, print_completion_needs_no_program) {
    const char *a[] = {"gpulaunch", "--print-completion", "bash", NULL};
    cr_assert_eq(load(3, a), 0, "%s", err);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    gl_print_completion("bash", f);
    fclose(f);
    cr_expect(strstr(buf, "complete -o default -F _gpulaunch gpulaunch") &&
                  strstr(buf, "--numa-binding") && strstr(buf, "--signals-to-handle"),
              "%s", buf);
    free(buf);
    gl_config_free(&cfg);
}

/* Each refusal exits 2 and says what to do. */
static void refused(const char *const *argv, int argc, const char *needle) {
    cr_expect_eq(load(argc, (const char **)argv), 2, "accepted: %s", argv[1]);
    cr_expect(strstr(err, needle) != NULL, "'%s' not in: %s", needle, err);
    gl_config_free(&cfg);
}

Test(torchrun_options, refusals) {
    const char *a1[] = {"gpulaunch", "--numa-binding", "numa", "p", NULL};
    refused(a1, 4, "node, socket, exclusive or core-complex");
    const char *a2[] = {"gpulaunch", "--signals-to-handle", "SIGTERM,SIGKILL", "p", NULL};
    refused(a2, 4, "'SIGKILL' is not a signal gpulaunch can forward");
    const char *a3[] = {"gpulaunch", "--signals-to-handle", "SIGNOPE", "p", NULL};
    refused(a3, 4, "'SIGNOPE'");
    const char *a4[] = {"gpulaunch", "--signals-to-handle", "SIGCHLD", "p", NULL};
    refused(a4, 4, "'SIGCHLD'");
    const char *a5[] = {"gpulaunch", "--logs-specs", "mine", "p", NULL};
    refused(a5, 4, "Python LogsSpecs plugin");
    const char *a6[] = {"gpulaunch", "--event-log-handler", "scuba", "p", NULL};
    refused(a6, 4, "use null or console");
    const char *a7[] = {"gpulaunch", "--start-method", "thread", "p", NULL};
    refused(a7, 4, "spawn, fork or forkserver");
    const char *a8[] = {"gpulaunch", "--print-completion", "fish", NULL};
    refused(a8, 3, "bash, zsh or tcsh");
    const char *a9[] = {"gpulaunch", "--duplicate-stdout-filters", "x", "p", NULL};
    refused(a9, 4, "give --log-dir");
    const char *a10[] = {"gpulaunch", "--no-python", "-m", "mod", NULL};
    refused(a10, 4, "contradict");
    const char *a11[] = {"gpulaunch", "--virtual-local-rank=maybe", "p", NULL};
    refused(a11, 3, "a flag");
    setenv("CUDA_VISIBLE_DEVICES", "3", 1);
    const char *a12[] = {"gpulaunch", "--virtual-local-rank", "--nproc-per-node", "2", "p", NULL};
    refused(a12, 5, "lists 1 for 2 workers");
}

/* A fake sysfs: GPUs on NUMA nodes, nodes' CPUs, cores and caches. */
static char sysroot[64];

static void put(const char *rel, const char *text) {
    char path[512], cmd[600];
    snprintf(path, sizeof path, "%s/%s", sysroot, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    cr_assert_eq(system(cmd), 0);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

static void fake_gpu(const char *bus, int node, const char *uuid) {
    char rel[128], text[128];
    snprintf(rel, sizeof rel, "proc/driver/nvidia/gpus/%s/information", bus);
    snprintf(text, sizeof text, "Model: Fake\nGPU UUID: %s\n", uuid);
    put(rel, text);
    snprintf(rel, sizeof rel, "sys/bus/pci/devices/%s/numa_node", bus);
    snprintf(text, sizeof text, "%d\n", node);
    put(rel, text);
}

static const char *cpus(const gl_numa_bind *b) {
    static char s[4][64];
    static int k;
    char *o = s[k++ % 4];
    gl_cpuset_format(b->cpus, b->cpus_size, o, 64);
    return o;
}

static void need_two_cpus(void) {
    cpu_set_t s;
    CPU_ZERO(&s);
    if (sched_getaffinity(0, sizeof s, &s) != 0 || !CPU_ISSET(0, &s) || !CPU_ISSET(1, &s))
        cr_skip_test("the fake topology uses CPUs 0 and 1; this process may not run on both");
    snprintf(sysroot, sizeof sysroot, "/tmp/gpl-sysfs-XXXXXX");
    cr_assert_not_null(mkdtemp(sysroot));
    setenv("GPULAUNCH_SYSFS_ROOT", sysroot, 1);
}

static void drop_sysroot(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", sysroot);
    cr_expect_eq(system(cmd), 0);
}

Test(numa, gpus_on_two_nodes_node_socket_and_uuids) {
    need_two_cpus();
    put("sys/devices/system/node/node0/cpulist", "0\n");
    put("sys/devices/system/node/node1/cpulist", "1\n");
    put("sys/devices/system/cpu/cpu0/topology/physical_package_id", "0\n");
    put("sys/devices/system/cpu/cpu1/topology/physical_package_id", "0\n");
    fake_gpu("0000:17:00.0", 0, "GPU-1111aaaa");
    fake_gpu("0000:b3:00.0", 1, "GPU-2222bbbb");
    gl_numa_bind b[2];
    char e[512];
    cr_assert_eq(gl_numa_plan(GL_NUMA_NODE, 2, b, e, sizeof e), 0, "%s", e);
    cr_expect_str_eq(cpus(&b[0]), "0");
    cr_expect_str_eq(cpus(&b[1]), "1");
    cr_expect_eq(b[0].node, 0);
    cr_expect_eq(b[1].node, 1);
    gl_numa_free(b, 2);
    /* one socket holds both nodes */
    cr_assert_eq(gl_numa_plan(GL_NUMA_SOCKET, 2, b, e, sizeof e), 0, "%s", e);
    cr_expect_str_eq(cpus(&b[0]), "0-1");
    cr_expect_str_eq(cpus(&b[1]), "0-1");
    cr_expect_eq(b[1].node, 1, "memory still on the GPU's node");
    gl_numa_free(b, 2);
    /* local rank i follows the i-th visible device, by UUID prefix or index */
    setenv("CUDA_VISIBLE_DEVICES", "GPU-2222,0", 1);
    cr_assert_eq(gl_numa_plan(GL_NUMA_NODE, 2, b, e, sizeof e), 0, "%s", e);
    cr_expect_str_eq(cpus(&b[0]), "1");
    cr_expect_str_eq(cpus(&b[1]), "0");
    gl_numa_free(b, 2);
    setenv("CUDA_VISIBLE_DEVICES", "MIG-abc", 1);
    cr_expect_eq(gl_numa_plan(GL_NUMA_NODE, 1, b, e, sizeof e), -1);
    cr_expect(strstr(e, "MIG instances are not"), "%s", e);
    setenv("CUDA_VISIBLE_DEVICES", "1", 1);
    cr_expect_eq(gl_numa_plan(GL_NUMA_NODE, 2, b, e, sizeof e), -1);
    cr_expect(strstr(e, "local rank 1 has no GPU of its own (1 visible)"), "%s", e);
    drop_sysroot();
}

Test(numa, exclusive_and_core_complex_split_one_node) {
    need_two_cpus();
    put("sys/devices/system/node/node0/cpulist", "0-1\n");
    put("sys/devices/system/cpu/cpu0/topology/thread_siblings_list", "0\n");
    put("sys/devices/system/cpu/cpu1/topology/thread_siblings_list", "1\n");
    for (int c = 0; c < 2; c++) {
        char rel[128];
        snprintf(rel, sizeof rel, "sys/devices/system/cpu/cpu%d/cache/index0/type", c);
        put(rel, "Instruction\n");
        snprintf(rel, sizeof rel, "sys/devices/system/cpu/cpu%d/cache/index0/level", c);
        put(rel, "1\n");
        snprintf(rel, sizeof rel, "sys/devices/system/cpu/cpu%d/cache/index0/shared_cpu_list", c);
        put(rel, "0-1\n"); /* an instruction cache: ignored */
        snprintf(rel, sizeof rel, "sys/devices/system/cpu/cpu%d/cache/index1/type", c);
        put(rel, "Unified\n");
        snprintf(rel, sizeof rel, "sys/devices/system/cpu/cpu%d/cache/index1/level", c);
        put(rel, "3\n");
        snprintf(rel, sizeof rel, "sys/devices/system/cpu/cpu%d/cache/index1/shared_cpu_list", c);
        put(rel, c == 0 ? "0\n" : "1\n");
    }
    fake_gpu("0000:17:00.0", 0, "GPU-1111aaaa");
    fake_gpu("0000:18:00.0", -1, "GPU-3333cccc"); /* -1: the one node */
    gl_numa_bind b[2];
    char e[512];
    cr_assert_eq(gl_numa_plan(GL_NUMA_EXCLUSIVE, 2, b, e, sizeof e), 0, "%s", e);
    cr_expect_str_eq(cpus(&b[0]), "0");
    cr_expect_str_eq(cpus(&b[1]), "1");
    gl_numa_free(b, 2);
    cr_assert_eq(gl_numa_plan(GL_NUMA_CORE_COMPLEX, 2, b, e, sizeof e), 0, "%s", e);
    cr_expect_str_eq(cpus(&b[0]), "0");
    cr_expect_str_eq(cpus(&b[1]), "1");
    gl_numa_free(b, 2);
    /* hyperthreads of one core cannot be split among two GPUs */
    put("sys/devices/system/cpu/cpu0/topology/thread_siblings_list", "0-1\n");
    put("sys/devices/system/cpu/cpu1/topology/thread_siblings_list", "0-1\n");
    cr_expect_eq(gl_numa_plan(GL_NUMA_EXCLUSIVE, 2, b, e, sizeof e), -1);
    cr_expect(strstr(e, "1 physical core(s) for 2 GPU(s)"), "%s", e);
    drop_sysroot();
}

Test(numa, without_gpus_local_ranks_spread_over_nodes) {
    need_two_cpus();
    put("sys/devices/system/node/node0/cpulist", "0\n");
    put("sys/devices/system/node/node1/cpulist", "1\n");
    put("sys/devices/system/node/node2/cpulist", "\n"); /* memory only: not used */
    gl_numa_bind b[4];
    char e[512];
    cr_assert_eq(gl_numa_plan(GL_NUMA_NODE, 4, b, e, sizeof e), 0, "%s", e);
    const char *want[] = {"0", "0", "1", "1"};
    for (int i = 0; i < 4; i++) {
        cr_expect_str_eq(cpus(&b[i]), want[i], "local rank %d", i);
        cr_expect_eq(b[i].gpu, -1);
    }
    gl_numa_free(b, 4);
    cr_expect_eq(gl_numa_parse_mode("core-complex"), GL_NUMA_CORE_COMPLEX);
    cr_expect_eq(gl_numa_parse_mode("numa"), -1);
    setenv("GPULAUNCH_SYSFS_ROOT", "/nonexistent-root", 1);
    cr_expect_eq(gl_numa_plan(GL_NUMA_NODE, 1, b, e, sizeof e), -1);
    cr_expect(strstr(e, "cannot list the NUMA nodes"), "%s", e);
    drop_sysroot();
}

/* --progress-timeout: seconds, auto (floor 300 s), auto:FLOOR, 0 (off). */
Test(options, progress_timeout_forms) {
    const char *a[] = {"gpulaunch", "prog"};
    cr_assert_eq(load(2, a), 0, "%s", err);
    cr_expect(cfg.progress_auto && cfg.progress_floor_s == 300.0 && cfg.progress_timeout_s == 0);
    cr_expect(cfg.stats_interval_s == 5.0);
    gl_config_free(&cfg);
    const char *b[] = {"gpulaunch", "--progress-timeout", "auto:20", "prog"};
    cr_assert_eq(load(4, b), 0, "%s", err);
    cr_expect(cfg.progress_auto && cfg.progress_floor_s == 20.0);
    gl_config_free(&cfg);
    const char *c[] = {"gpulaunch", "--progress_timeout=45", "--stats-interval", "0", "prog"};
    cr_assert_eq(load(5, c), 0, "%s", err);
    cr_expect(!cfg.progress_auto && cfg.progress_timeout_s == 45.0 && cfg.stats_interval_s == 0);
    gl_config_free(&cfg);
    const char *d[] = {"gpulaunch", "--progress-timeout", "0", "prog"};
    cr_assert_eq(load(4, d), 0, "%s", err);
    cr_expect(!cfg.progress_auto && cfg.progress_timeout_s == 0);
    gl_config_free(&cfg);
}
