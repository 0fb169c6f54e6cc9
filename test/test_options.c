/* The launcher's option table: every spelling, every source, precedence,
 * every refusal; and the preflight checks with injected node facts. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    unlink(path);
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
        {{"--rdzv-backend", "etcd", "prog"}, "not supported"},
        {{"--rdzv-conf", "join_timeout", "prog"}, "--rdzv-conf"},
        {{"--redirects", "9", "prog"}, "--redirects"},
        {{"--standalone=maybe", "prog"}, "--standalone: 'maybe'"},
        {{"--master-port"}, "--master-port needs a value"},
        {{"--nproc-per-node", "2"}, "no PROGRAM"},
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
