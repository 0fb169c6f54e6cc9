/* Slurm: the hostlist parser (every form and every refusal), the SLURM_*
 * variables of an srun job step as launcher options, their precedence in the
 * option table; and, as root where Slurm is installed, a real cluster
 * (test/slurm_real.sh): a 2-node job preempted with SIGUSR1, requeued and
 * resumed to the parameters of an uninterrupted run. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gl_options.h"
#include "gl_slurm.h"

/* ---- the hostlist ---- */

typedef struct hosts {
    char all[4096];
    long n;
} hosts;

static int collect(void *data, long index, const char *host) {
    hosts *h = data;
    size_t l = strlen(h->all);
    snprintf(h->all + l, sizeof h->all - l, "%s%s", index ? " " : "", host);
    h->n++;
    return 0;
}

static char err[1024];

/* The expansion of list, space-separated ("" and err set when refused). */
static const char *expand(const char *list, long *count) {
    static hosts h;
    memset(&h, 0, sizeof h);
    err[0] = '\0';
    long n = gl_hostlist_expand(list, collect, &h, err, sizeof err);
    if (count)
        *count = n;
    if (n >= 0)
        cr_expect_eq(n, h.n, "%s: returned %ld, walked %ld", list, n, h.n);
    return n < 0 ? "" : h.all;
}

Test(hostlist, the_forms_slurm_writes) {
    cr_expect_str_eq(expand("gpu[01-04,07],cpu5", NULL), "gpu01 gpu02 gpu03 gpu04 gpu07 cpu5");
    cr_expect_str_eq(expand("node[1-3]-ib", NULL), "node1-ib node2-ib node3-ib");
    cr_expect_str_eq(expand("a,b", NULL), "a b");
    cr_expect_str_eq(expand("single", NULL), "single");
    cr_expect_str_eq(expand("n[7]", NULL), "n7");
    cr_expect_str_eq(expand("gpu-a100.example.org", NULL), "gpu-a100.example.org");
    cr_expect_str_eq(expand("x[1-2],y[3,5-6]z,w", NULL), "x1 x2 y3z y5z y6z w");
}

Test(hostlist, zero_padding_is_the_lower_bounds_width) {
    cr_expect_str_eq(expand("gpu[8-10]", NULL), "gpu8 gpu9 gpu10");
    cr_expect_str_eq(expand("gpu[08-10]", NULL), "gpu08 gpu09 gpu10");
    cr_expect_str_eq(expand("n[098-101]", NULL), "n098 n099 n100 n101");
    cr_expect_str_eq(expand("n[0000-0002]", NULL), "n0000 n0001 n0002");
}

Test(hostlist, several_groups_in_a_name_first_varies_slowest) {
    cr_expect_str_eq(expand("rack[1-2]-n[01-02]", NULL), "rack1-n01 rack1-n02 rack2-n01 rack2-n02");
    cr_expect_str_eq(expand("r[0-1]c[0-1]n[1,3]", NULL),
                     "r0c0n1 r0c0n3 r0c1n1 r0c1n3 r1c0n1 r1c0n3 r1c1n1 r1c1n3");
    long n;
    expand("pod[01-16]-rack[1-4]-gpu[001-128]", &n);
    cr_expect_eq(n, 16 * 4 * 128);
}

Test(hostlist, nth_and_an_early_stop) {
    char h[64];
    cr_assert_eq(gl_hostlist_nth("gpu[01-04,07],cpu5", 0, h, sizeof h, err, sizeof err), 0, "%s",
                 err);
    cr_expect_str_eq(h, "gpu01");
    cr_assert_eq(gl_hostlist_nth("gpu[01-04,07],cpu5", 4, h, sizeof h, err, sizeof err), 0);
    cr_expect_str_eq(h, "gpu07");
    cr_assert_eq(gl_hostlist_nth("gpu[01-04,07],cpu5", 5, h, sizeof h, err, sizeof err), 0);
    cr_expect_str_eq(h, "cpu5");
    cr_expect_eq(gl_hostlist_nth("gpu[01-04,07],cpu5", 6, h, sizeof h, err, sizeof err), -1);
    cr_expect(strstr(err, "has 6 hosts, not 7"), "%s", err);
    char tiny[4];
    cr_expect_eq(gl_hostlist_nth("gpu01", 0, tiny, sizeof tiny, err, sizeof err), -1);
    cr_expect(strstr(err, "does not fit"), "%s", err);
    /* the first host of a long list does not walk the rest, but the count
     * is still the whole list's, and a bad tail still refuses it */
    cr_expect_eq(gl_hostlist_nth("n[00001-60000]", 0, h, sizeof h, err, sizeof err), 0);
    cr_expect_str_eq(h, "n00001");
    cr_expect_eq(gl_hostlist_nth("a,b,c[1-", 0, h, sizeof h, err, sizeof err), -1);
    cr_expect(strstr(err, "never closed"), "%s", err);
}

/* Each refusal names what is wrong and where. */
static void refused(const char *list, const char *why) {
    long n;
    expand(list, &n);
    cr_expect_eq(n, -1, "'%s' was accepted", list);
    cr_expect(strstr(err, why) != NULL, "'%s': expected \"%s\" in: %s", list, why, err);
}

Test(hostlist, malformed_lists_are_refused_with_the_reason) {
    refused("", "empty");
    refused("a,,b", "empty host name at offset 2");
    refused("a,", "empty host name at offset 2");
    refused(",a", "empty host name at offset 0");
    refused("gpu[1-", "never closed");
    refused("gpu[1-2", "the '[' at offset 3 is never closed");
    refused("gpu1-2]", "']' at offset 6 closes no '['");
    refused("gpu[1[2]]", "groups do not nest");
    refused("gpu[a-b]", "malformed range at offset 4");
    refused("gpu[]", "malformed range at offset 4");
    refused("gpu[1,]", "malformed range at offset 6");
    refused("gpu[1-2-3]", "malformed range");
    refused("gpu[-2]", "malformed range");
    refused("gpu[3-1]", "goes down (3 > 1)");
    refused("n[1234567890]", "at most 9 digits");
    refused("a b", "character 0x20 at offset 1");
    refused("a\tb", "character 0x09");
    refused("n[1-2] ", "character 0x20");
}

Test(hostlist, limits_are_named) {
    refused("n[0-70000]", "GL_HOSTLIST_MAX_HOSTS");
    refused("a[0-40000],b[0-40000]", "GL_HOSTLIST_MAX_HOSTS");
    refused("a[0-999]b[0-999]", "GL_HOSTLIST_MAX_HOSTS");
    refused("a[1-2]b[1]c[1]d[1]e[1]f[1]g[1]h[1]i[1]", "GL_HOSTLIST_MAX_GROUPS");
    char name[300];
    memset(name, 'x', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    refused(name, "GL_HOSTLIST_MAX_NAME");
    /* 250 letters and 5 digits fit; 6 digits do not */
    char ok[300];
    memset(ok, 'y', 250);
    snprintf(ok + 250, sizeof ok - 250, "[10000-10001]");
    long n;
    expand(ok, &n);
    cr_expect_eq(n, 2, "%s", err);
    snprintf(ok + 250, sizeof ok - 250, "[100000]");
    refused(ok, "GL_HOSTLIST_MAX_NAME");
    char *big = malloc(GL_HOSTLIST_MAX_LEN + 2);
    memset(big, 'z', GL_HOSTLIST_MAX_LEN + 1);
    big[GL_HOSTLIST_MAX_LEN + 1] = '\0';
    refused(big, "GL_HOSTLIST_MAX_LEN");
    free(big);
}

/* ---- SLURM_* of a job step ---- */

static const char *fake[64][2];

static void fake_set(const char *k, const char *v) {
    for (int i = 0; i < 63; i++)
        if (fake[i][0] == NULL || strcmp(fake[i][0], k) == 0) {
            fake[i][0] = k;
            fake[i][1] = v;
            return;
        }
}

static const char *fake_get(const char *k) {
    for (int i = 0; i < 64 && fake[i][0]; i++)
        if (strcmp(fake[i][0], k) == 0)
            return fake[i][1];
    return NULL;
}

/* What srun -N2 --ntasks-per-node=1 gave node 2 of job 1234567 step 0 on
 * Slurm 22.05 (batch step variables included). */
static void two_node_step(void) {
    memset(fake, 0, sizeof fake);
    fake_set("SLURM_JOB_ID", "1234567");
    fake_set("SLURM_JOBID", "1234567");
    fake_set("SLURM_STEP_ID", "0");
    fake_set("SLURM_STEPID", "0");
    fake_set("SLURM_JOB_NUM_NODES", "2");
    fake_set("SLURM_NNODES", "2");
    fake_set("SLURM_STEP_NUM_NODES", "2");
    fake_set("SLURM_STEP_NUM_TASKS", "2");
    fake_set("SLURM_NTASKS", "2");
    fake_set("SLURM_NTASKS_PER_NODE", "1");
    fake_set("SLURM_STEP_TASKS_PER_NODE", "1(x2)");
    fake_set("SLURM_NODEID", "1");
    fake_set("SLURM_PROCID", "1");
    fake_set("SLURM_LOCALID", "0");
    fake_set("SLURM_JOB_NODELIST", "gpu[07-08]");
    fake_set("SLURM_NODELIST", "gpu[07-08]");
    fake_set("SLURM_STEP_NODELIST", "gpu[07-08]");
    fake_set("SLURM_CPUS_ON_NODE", "16");
}

TestSuite(slurm_env, .init = two_node_step);

Test(slurm_env, an_srun_step_gives_the_options) {
    gl_slurm s;
    cr_assert_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 0, "%s", err);
    cr_expect_eq(s.active, 1);
    cr_expect_str_eq(s.nnodes, "2");
    cr_expect_str_eq(s.node_rank, "1");
    cr_expect_str_eq(s.master_addr, "gpu07");
    cr_expect_str_eq(s.nodelist, "SLURM_STEP_NODELIST");
    cr_expect_str_eq(s.master_port, "19567", "15000 + the job id's last four digits");
    cr_expect_str_eq(s.rdzv_id, "slurm-1234567.0");
    cr_expect_str_eq(s.nproc, "", "no GPUs: nproc-per-node is left alone");
}

Test(slurm_env, outside_srun_nothing_is_read) {
    gl_slurm s;
    fake_set("SLURM_STEP_ID", "");
    fake_set("SLURM_STEPID", ""); /* the batch script's own shell */
    cr_assert_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 0, "%s", err);
    cr_expect_eq(s.active, 0);
    cr_expect_str_eq(s.nnodes, "");
    memset(fake, 0, sizeof fake);
    cr_assert_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 0);
    cr_expect_eq(s.active, 0);
    /* salloc's interactive step (use_interactive_step) is not an srun step */
    two_node_step();
    fake_set("SLURM_STEP_ID", "4294967290");
    cr_assert_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 0, "%s", err);
    cr_expect_eq(s.active, 0);
}

Test(slurm_env, the_step_wins_over_the_job) {
    gl_slurm s;
    /* srun -N1 inside a 2-node job: a one-node step on the second node */
    fake_set("SLURM_STEP_NUM_NODES", "1");
    fake_set("SLURM_STEP_NUM_TASKS", "1");
    fake_set("SLURM_NODEID", "0");
    fake_set("SLURM_STEP_NODELIST", "gpu08");
    fake_set("SLURM_STEP_ID", "3");
    cr_assert_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(s.nnodes, "1");
    cr_expect_str_eq(s.node_rank, "0");
    cr_expect_str_eq(s.master_addr, "gpu08");
    cr_expect_str_eq(s.rdzv_id, "slurm-1234567.3");
}

Test(slurm_env, older_variables_still_serve) {
    memset(fake, 0, sizeof fake);
    fake_set("SLURM_JOBID", "42");
    fake_set("SLURM_STEPID", "1");
    fake_set("SLURM_NNODES", "3");
    fake_set("SLURM_PROCID", "2");
    fake_set("SLURM_NODELIST", "cn[100-102]");
    gl_slurm s;
    cr_assert_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(s.nnodes, "3");
    cr_expect_str_eq(s.node_rank, "2");
    cr_expect_str_eq(s.master_addr, "cn100");
    cr_expect_str_eq(s.nodelist, "SLURM_NODELIST");
    cr_expect_str_eq(s.master_port, "15042");
}

Test(slurm_env, gpus_give_the_worker_count) {
    gl_slurm s;
    fake_set("SLURM_GPUS_ON_NODE", "4");
    cr_assert_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(s.nproc, "4");
    fake_set("SLURM_GPUS_ON_NODE", "");
    fake_set("SLURM_STEP_GPUS", "0,1,3");
    cr_assert_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(s.nproc, "3");
    fake_set("SLURM_STEP_GPUS", "");
    fake_set("SLURM_JOB_GPUS", "6");
    cr_assert_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(s.nproc, "1");
    fake_set("SLURM_JOB_GPUS", "0,x");
    cr_expect_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 2);
    cr_expect(strstr(err, "SLURM_JOB_GPUS='0,x' is not a comma list of GPU indices"), "%s", err);
    fake_set("SLURM_JOB_GPUS", "");
    fake_set("SLURM_GPUS_ON_NODE", "four");
    cr_expect_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 2);
    cr_expect(strstr(err, "SLURM_GPUS_ON_NODE"), "%s", err);
}

Test(slurm_env, master_addr_and_port_exported_by_the_script_win) {
    gl_slurm s;
    fake_set("MASTER_ADDR", "10.0.0.7");
    fake_set("MASTER_PORT", "23456");
    cr_assert_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(s.master_addr, "10.0.0.7");
    cr_expect_str_eq(s.nodelist, "MASTER_ADDR");
    cr_expect_str_eq(s.master_port, "23456");
    fake_set("MASTER_PORT", "70000");
    cr_expect_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 2);
    cr_expect(strstr(err, "MASTER_PORT='70000' is not a port"), "%s", err);
}

Test(slurm_env, several_tasks_per_node_are_refused_with_what_to_do) {
    gl_slurm s;
    fake_set("SLURM_STEP_NUM_TASKS", "16");
    fake_set("SLURM_STEP_TASKS_PER_NODE", "8(x2)");
    cr_expect_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 2);
    cr_expect(strstr(err, "runs 16 tasks on 2 node(s)"), "%s", err);
    cr_expect(strstr(err, "--ntasks-per-node=1"), "%s", err);
    cr_expect(strstr(err, "--slurm off"), "%s", err);
    /* no step counts: the job's tasks per node tell */
    fake_set("SLURM_STEP_NUM_TASKS", "");
    fake_set("SLURM_NTASKS", "");
    fake_set("SLURM_STEP_TASKS_PER_NODE", "");
    fake_set("SLURM_NTASKS_PER_NODE", "4");
    cr_expect_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 2);
    cr_expect(strstr(err, "runs 8 tasks on 2 node(s) (SLURM_NTASKS_PER_NODE"), "%s", err);
}

Test(slurm_env, malformed_variables_are_named) {
    gl_slurm s;
    fake_set("SLURM_STEP_NODELIST", "gpu[07-08");
    cr_expect_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 2);
    cr_expect(strstr(err, "SLURM_STEP_NODELIST: hostlist 'gpu[07-08': the '[' at offset 3"), "%s",
              err);
    cr_expect(strstr(err, "--master-addr"), "%s", err);
    two_node_step();
    fake_set("SLURM_NODEID", "2");
    cr_expect_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 2);
    cr_expect(strstr(err, "SLURM_NODEID='2' is not a node index from 0 to 1"), "%s", err);
    two_node_step();
    fake_set("SLURM_STEP_NUM_NODES", "0");
    cr_expect_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 2);
    cr_expect(strstr(err, "SLURM_STEP_NUM_NODES='0'"), "%s", err);
    two_node_step();
    fake_set("SLURM_JOB_ID", "12ab");
    cr_expect_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 2);
    cr_expect(strstr(err, "SLURM_JOB_ID='12ab' is not a job number"), "%s", err);
    two_node_step();
    fake_set("SLURM_STEP_NODELIST", "");
    fake_set("SLURM_JOB_NODELIST", "");
    fake_set("SLURM_NODELIST", "");
    cr_expect_eq(gl_slurm_read(fake_get, &s, err, sizeof err), 2);
    cr_expect(strstr(err, "sets no SLURM_STEP_NODELIST"), "%s", err);
}

/* ---- through the option table: CLI > PET_* > SLURM_* > file > default ---- */

static gl_config cfg;

static int load(int argc, const char **argv) {
    return gl_config_load(&cfg, argc, (char **)argv, err, sizeof err);
}

static void clean_env(void) {
    extern char **environ;
    /* every SLURM_*, PET_* and MASTER_* this process was given */
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; *e; e++)
            if (!strncmp(*e, "SLURM_", 6) || !strncmp(*e, "PET_", 4) ||
                !strncmp(*e, "MASTER_", 7)) {
                char name[128];
                snprintf(name, sizeof name, "%.*s", (int)strcspn(*e, "="), *e);
                unsetenv(name);
                again = 1;
                break;
            }
    }
    unsetenv("CUDA_VISIBLE_DEVICES");
    setenv("PET_SHM_MIN", "16m", 1);
}

static void srun_env(void) {
    clean_env();
    setenv("SLURM_JOB_ID", "77", 1);
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_STEP_NUM_NODES", "3", 1);
    setenv("SLURM_STEP_NUM_TASKS", "3", 1);
    setenv("SLURM_NODEID", "2", 1);
    setenv("SLURM_STEP_NODELIST", "trn[3-5]", 1);
    setenv("SLURM_GPUS_ON_NODE", "2", 1);
}

TestSuite(slurm_options, .init = srun_env);

Test(slurm_options, no_options_but_the_program) {
    const char *a[] = {"gpulaunch", "train.py", NULL};
    cr_assert_eq(load(2, a), 0, "%s", err);
    cr_expect_eq(cfg.slurm, 1);
    cr_expect_eq(cfg.mode, GL_MODE_STATIC);
    cr_expect_eq(cfg.min_nodes, 3);
    cr_expect_eq(cfg.max_nodes, 3);
    cr_expect_eq(cfg.node_rank, 2);
    cr_expect_str_eq(cfg.val[GL_MASTER_ADDR], "trn3");
    cr_expect_eq(cfg.master_port, 15077);
    cr_expect_str_eq(cfg.val[GL_RDZV_ID], "slurm-77.0");
    cr_expect_eq(cfg.nproc, 2);
    int ids[] = {GL_NNODES,      GL_NODE_RANK, GL_MASTER_ADDR,
                 GL_MASTER_PORT, GL_RDZV_ID,   GL_NPROC_PER_NODE};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        cr_expect_eq(cfg.src[ids[i]], GL_SRC_SLURM, "%s", gl_opt_name(ids[i]));
    cr_expect_eq(cfg.src[GL_MAX_RESTARTS], GL_SRC_DEFAULT);
    /* --print-config names the source */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    gl_config_print(&cfg, f);
    fclose(f);
    cr_expect(strstr(buf, "trn3") && strstr(buf, "(slurm)"), "%s", buf);
    const char *line = strstr(buf, "\nnode-rank");
    cr_assert(line, "%s", buf);
    cr_expect(strncmp(strstr(line, "("), "(slurm)", 7) == 0, "%.60s", line);
    free(buf);
    gl_config_free(&cfg);
}

Test(slurm_options, the_command_line_and_pet_win_the_file_loses) {
    char yaml[] = "/tmp/gl-slurm-yaml-XXXXXX";
    int fd = mkstemp(yaml);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "nnodes: 5\nmaster-addr: from-file\nmax-restarts: 4\n");
    fclose(f);
    setenv("PET_NODE_RANK", "1", 1);
    const char *a[] = {"gpulaunch", "--config", yaml, "--nproc-per-node", "1", "train.py", NULL};
    int rc = load(6, a);
    unlink(yaml);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_eq(cfg.nproc, 1, "CLI over SLURM_GPUS_ON_NODE");
    cr_expect_eq(cfg.src[GL_NPROC_PER_NODE], GL_SRC_CLI);
    cr_expect_eq(cfg.node_rank, 1, "PET_NODE_RANK over SLURM_NODEID");
    cr_expect_eq(cfg.src[GL_NODE_RANK], GL_SRC_ENV);
    cr_expect_eq(cfg.min_nodes, 3, "SLURM_* over the file");
    cr_expect_str_eq(cfg.val[GL_MASTER_ADDR], "trn3");
    cr_expect_eq(cfg.src[GL_MASTER_ADDR], GL_SRC_SLURM);
    cr_expect_eq(cfg.max_restarts, 4, "what Slurm does not say, the file still does");
    cr_expect_eq(cfg.src[GL_MAX_RESTARTS], GL_SRC_FILE);
    gl_config_free(&cfg);
}

Test(slurm_options, slurm_off_from_any_source) {
    const char *a[] = {"gpulaunch", "--slurm", "off", "train.py", NULL};
    cr_assert_eq(load(4, a), 0, "%s", err);
    cr_expect_eq(cfg.slurm, 0);
    cr_expect_eq(cfg.min_nodes, 1);
    cr_expect_str_eq(cfg.val[GL_MASTER_ADDR], "127.0.0.1");
    cr_expect_eq(cfg.src[GL_NNODES], GL_SRC_DEFAULT);
    gl_config_free(&cfg);
    setenv("PET_SLURM", "off", 1);
    const char *b[] = {"gpulaunch", "train.py", NULL};
    cr_assert_eq(load(2, b), 0, "%s", err);
    cr_expect_eq(cfg.slurm, 0);
    cr_expect_eq(cfg.min_nodes, 1);
    gl_config_free(&cfg);
    unsetenv("PET_SLURM");
    char yaml[] = "/tmp/gl-slurm-yaml-XXXXXX";
    int fd = mkstemp(yaml);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "slurm: off\n");
    fclose(f);
    const char *c[] = {"gpulaunch", "--config", yaml, "train.py", NULL};
    int rc = load(4, c);
    unlink(yaml);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_eq(cfg.slurm, 0);
    cr_expect_eq(cfg.min_nodes, 1);
    gl_config_free(&cfg);
    const char *d[] = {"gpulaunch", "--slurm", "on", "train.py", NULL};
    cr_expect_eq(load(4, d), 2);
    cr_expect(strstr(err, "--slurm: 'on' is not valid; expected auto or off"), "%s", err);
    gl_config_free(&cfg);
}

Test(slurm_options, standalone_is_one_node_whatever_slurm_says) {
    const char *a[] = {"gpulaunch", "--standalone", "train.py", NULL};
    cr_assert_eq(load(3, a), 0, "%s", err);
    cr_expect_eq(cfg.mode, GL_MODE_STANDALONE);
    cr_expect_eq(cfg.slurm, 1, "SIGUSR1 is still a preemption notice");
    cr_expect_eq(cfg.src[GL_NNODES], GL_SRC_DEFAULT);
    gl_config_free(&cfg);
}

Test(slurm_options, the_batch_script_itself_reads_no_options) {
    unsetenv("SLURM_STEP_ID");
    const char *a[] = {"gpulaunch", "train.py", NULL};
    cr_assert_eq(load(2, a), 0, "%s", err);
    cr_expect_eq(cfg.slurm, 1);
    cr_expect_eq(cfg.min_nodes, 1);
    cr_expect_eq(cfg.src[GL_MASTER_ADDR], GL_SRC_DEFAULT);
    gl_config_free(&cfg);
}

Test(slurm_options, a_bad_step_refuses_to_start) {
    setenv("SLURM_STEP_NUM_TASKS", "24", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "8(x3)", 1);
    const char *a[] = {"gpulaunch", "train.py", NULL};
    cr_expect_eq(load(2, a), 2);
    cr_expect(strstr(err, "--ntasks-per-node=1"), "%s", err);
    gl_config_free(&cfg);
    const char *b[] = {"gpulaunch", "--slurm=off", "train.py", NULL};
    cr_expect_eq(load(3, b), 0, "%s", err);
    gl_config_free(&cfg);
}

/* ---- a real Slurm ---- */

#ifdef GPL_SLURM_REAL
/* slurm_real.sh starts munged, slurmctld and two slurmd in a private mount
 * namespace, runs a 2-node job of dp_train under srun gpulaunch beside an
 * uninterrupted one, sends scancel --signal=USR1, and checks the checkpoint,
 * the requeue, the resume and the final parameters; it prints why it
 * fails. */
Test(slurm_real, usr1_checkpoints_requeues_and_resumes_bitwise, .timeout = 170) {
    if (geteuid() != 0)
        cr_skip_test("not root: a real Slurm (slurmctld, slurmd, munged) needs root");
    if (access("/usr/sbin/slurmctld", X_OK) != 0 || access("/usr/sbin/slurmd", X_OK) != 0 ||
        access("/usr/sbin/munged", X_OK) != 0 || access("/usr/bin/sbatch", X_OK) != 0)
        cr_skip_test("Slurm is not installed (scripts/deps.sh installs slurmctld, slurmd, "
                     "slurm-client and munge)");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/test/slurm_real.sh %s 2>&1", GPL_SOURCE_DIR, GPL_BUILD_DIR);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    char line[1024];
    while (fgets(line, sizeof line, p))
        fputs(line, stderr);
    int st = pclose(p);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "slurm_real.sh failed (status %d), see above",
              st);
}
#endif
