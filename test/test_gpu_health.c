/* GPU health on real launchers against a fake NVML (fake_nvml.c, loaded
 * through GPULAUNCH_NVML_LIBRARY and scripted per test): a faulty GPU refused
 * by name before any worker starts, warn mode, every preflight fault, the MIG
 * layout against the binding, the idle alert and its metric on the
 * launcher's /metrics, an XID named with the rank on that GPU and in the
 * failure report, dcgm-exporter's job-mapping files appearing and vanishing
 * (also on SIGTERM), a missing NVML function said once. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define GL GPL_BUILD_DIR "/launcher/gpulaunch"
#define FAKE GPL_BUILD_DIR "/test/libfake_nvml.so"
#define FAKE_OLD GPL_BUILD_DIR "/test/libfake_nvml_old.so"

extern char **environ;

static char dir[64];

static void setup(void) {
    tmpdir_make(dir, sizeof dir, "gpl-gpuhealth");
    cr_assert(dir[0]);
}

static void teardown(void) { tmpdir_remove(dir); }

TestSuite(gpu_health, .init = setup, .fini = teardown, .timeout = 60);

/* The environment of a launcher on fake GPUs: the script, the library and
 * CUDA_VISIBLE_DEVICES; the caller's own variables otherwise. */
static char **fake_env(const char *script, const char *lib, const char *cvd) {
    static char *env[256];
    static char s[3][512];
    int n = 0;
    for (char **e = environ; *e && n < 240; e++)
        if (strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) &&
            strncmp(*e, "NVIDIA_VISIBLE_DEVICES=", 23) &&
            strncmp(*e, "GPULAUNCH_NVML_LIBRARY=", 23) && strncmp(*e, "FAKE_NVML_SCRIPT=", 17) &&
            strncmp(*e, "PET_", 4))
            env[n++] = *e;
    char path[256];
    snprintf(path, sizeof path, "%s/nvml.script", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(script, f);
    fclose(f);
    snprintf(s[0], sizeof s[0], "FAKE_NVML_SCRIPT=%s", path);
    snprintf(s[1], sizeof s[1], "GPULAUNCH_NVML_LIBRARY=%s", lib);
    /* "nv:LIST": a container's NVIDIA_VISIBLE_DEVICES instead */
    if (strncmp(cvd, "nv:", 3) == 0)
        snprintf(s[2], sizeof s[2], "NVIDIA_VISIBLE_DEVICES=%s", cvd + 3);
    else
        snprintf(s[2], sizeof s[2], "CUDA_VISIBLE_DEVICES=%s", cvd);
    env[n++] = s[0];
    env[n++] = s[1];
    env[n++] = s[2];
    env[n++] = "PET_SHM_MIN=16m";
    env[n++] = "PET_PREEMPTION_SOURCE=none";
    env[n] = NULL;
    return env;
}

static int has_thread(pid_t pid, const char *name);

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static int exit_code(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

/* Workers that leave a mark, so that a test can tell whether any ran. */
static void marker_prog(char *buf, size_t len, const char *then) {
    snprintf(buf, len, "touch %s/ran.$LOCAL_RANK; %s", dir, then);
}

static int ran_count(void) {
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        n += strncmp(e->d_name, "ran.", 4) == 0;
    if (d)
        closedir(d);
    return n;
}

Test(gpu_health, faulty_gpu_refused_by_name_before_workers_start) {
    char prog[256];
    marker_prog(prog, sizeof prog, "exit 0");
    char *argv[] = {GL,        "--standalone", "--nproc-per-node",
                    "2",       "--bind-gpus",  "--no-python",
                    "/bin/sh", "-c",           prog,
                    NULL};
    proc p;
    uint64_t t0 = now_ms();
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 2\nretired_pending 1\n", FAKE, "0,1")), 0);
    int st = proc_wait(&p, 20000);
    double took = (double)(now_ms() - t0) / 1000.0;
    cr_expect_eq(exit_code(st), 3, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "FAIL GPU 1 (GPU-fake-1, PCI 00000000:11:00.0): retired memory pages "
                            "are pending") != NULL,
              "%s", p.out);
    cr_expect(strstr(p.out, "nvidia-smi -r -i 1") != NULL, "no remedy: %s", p.out);
    cr_expect(strstr(p.out, "GPU 0 (") == NULL, "the healthy GPU was named: %s", p.out);
    cr_expect(strstr(p.out, "nothing was started") != NULL, "%s", p.out);
    cr_expect_eq(ran_count(), 0, "a worker ran");
    cr_log_info("refused %.1f ms after the launcher started (it exited)", took * 1000.0);
}

/* A driver that hangs on a GPU: the preflight gives up on NVML after its
 * deadline instead of holding the node's start forever. */
Test(gpu_health, hung_driver_fails_the_preflight_at_its_deadline) {
    setenv("GPULAUNCH_NVML_TIMEOUT_S", "1", 1);
    char prog[256];
    marker_prog(prog, sizeof prog, "exit 0");
    char *argv[] = {GL,        "--standalone", "--nproc-per-node",
                    "2",       "--bind-gpus",  "--no-python",
                    "/bin/sh", "-c",           prog,
                    NULL};
    proc p;
    uint64_t t0 = now_ms();
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 2\nhang 1\n", FAKE, "0,1")), 0);
    int st = proc_wait(&p, 20000);
    double took = (double)(now_ms() - t0) / 1000.0;
    cr_expect_eq(exit_code(st), 3, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "FAIL NVML did not answer within 1 s: the driver hangs"), "%s", p.out);
    cr_expect(took >= 1.0 && took < 2.5, "refused %.2f s after start (deadline 1 s)", took);
    cr_expect_eq(ran_count(), 0, "a worker ran");
    /* warn: the job runs, without NVML (no monitor thread to hang) */
    char *warn[] = {GL,  "--standalone", "--gpu-health", "warn", "--no-python", "/bin/sleep", "0.6",
                    NULL};
    cr_assert_eq(proc_start(&p, warn, fake_env("gpus 2\nhang 1\n", FAKE, "0,1")), 0);
    cr_assert(proc_expect(&p, "round 1", 10000), "%s", p.out);
    cr_expect_eq(has_thread(p.pid, "gpulaunch-gpu"), 0, "%s", p.out);
    st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "warn NVML did not answer within 1 s"), "%s", p.out);
    cr_log_info("a hung driver refused %.2f s after start (deadline 1 s)", took);
}

Test(gpu_health, warn_mode_names_it_and_runs) {
    char prog[512], then[256];
    /* NVML's descriptors stay with the launcher */
    snprintf(then, sizeof then,
             "ls -l /proc/$$/fd | grep -c nvml.script > %s/fds.$LOCAL_RANK; exit 0", dir);
    marker_prog(prog, sizeof prog, then);
    char *argv[] = {GL,     "--standalone", "--nproc-per-node", "2",  "--bind-gpus", "--gpu-health",
                    "warn", "--no-python",  "/bin/sh",          "-c", prog,          NULL};
    proc p;
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 2\nretired_pending 1\n", FAKE, "0,1")), 0);
    int st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "warn GPU 1 (GPU-fake-1, PCI 00000000:11:00.0): retired memory") !=
                  NULL,
              "%s", p.out);
    cr_expect_eq(ran_count(), 2, "%s", p.out);
    char fds[128], line[64];
    snprintf(fds, sizeof fds, "%s/fds.0", dir);
    FILE *f = fopen(fds, "r");
    cr_assert_not_null(f);
    cr_expect(fgets(line, sizeof line, f) && strcmp(line, "0\n") == 0,
              "a worker holds NVML's descriptor: %s", line);
    fclose(f);
    /* --check in warn mode: the faulty GPU is not also said to be ok */
    char *check[] = {GL, "--standalone", "--check", "--gpu-health", "warn", NULL};
    cr_assert_eq(proc_start(&p, check, fake_env("gpus 2\nretired_pending 1\n", FAKE, "0,1")), 0);
    st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "ok   GPU 0 (") && !strstr(p.out, "ok   GPU 1 ("), "%s", p.out);
    /* off: no NVML at all */
    char *off[] = {GL, "--standalone", "--gpu-health", "off", "--no-python", "/bin/true", NULL};
    cr_assert_eq(proc_start(&p, off, fake_env("gpus 2\nretired_pending 1\n", FAKE, "0,1")), 0);
    st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "retired") == NULL, "%s", p.out);
}

Test(gpu_health, every_fault_named_by_check) {
    char *argv[] = {GL, "--standalone", "--check", NULL};
    proc p;
    const char *script = "gpus 8\n"
                         "remap_failure 1\n"
                         "remap_pending 2\n"
                         "ecc 3 5\n"
                         "lost 4\n"
                         "nvlink 5 4 0xb\n"
                         "nvlink 0 4 0xf\n"
                         "reasons 6 0x40\n"
                         "nvlink 7 20 0x7ffff\n"; /* NVML 13: up to 36 links */
    cr_assert_eq(proc_start(&p, argv, fake_env(script, FAKE, "0,1,2,3,4,5,6,7")), 0);
    int st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 3, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "ok   GPU 0 (GPU-fake-0, PCI 00000000:10:00.0)"), "%s", p.out);
    cr_expect(strstr(p.out, "FAIL GPU 1 (GPU-fake-1, PCI 00000000:11:00.0): a memory row "
                            "remapping failed"),
              "%s", p.out);
    cr_expect(strstr(p.out, "FAIL GPU 2 (GPU-fake-2, PCI 00000000:12:00.0): a memory row "
                            "remapping is pending"),
              "%s", p.out);
    cr_expect(strstr(p.out, "FAIL GPU 3 (GPU-fake-3, PCI 00000000:13:00.0): 5 uncorrectable ECC"),
              "%s", p.out);
    cr_expect(strstr(p.out, "FAIL GPU 4 (GPU-fake-4, PCI 00000000:14:00.0): NVML cannot reach "
                            "it (GPU is lost"),
              "%s", p.out);
    cr_expect(strstr(p.out, "FAIL GPU 5 (GPU-fake-5, PCI 00000000:15:00.0): NVLink link(s) 2 "
                            "down (3 of 4 up)"),
              "%s", p.out);
    cr_expect(strstr(p.out, "FAIL GPU 6 (GPU-fake-6, PCI 00000000:16:00.0): clocks are slowed "
                            "(hw thermal)"),
              "%s", p.out);
    cr_expect(strstr(p.out, "FAIL GPU 7 (GPU-fake-7, PCI 00000000:17:00.0): NVLink link(s) 19 "
                            "down (19 of 20 up)"),
              "%s", p.out);
    cr_expect_eq(count(p.out, "FAIL"), 7, "%s", p.out);
    /* a UUID binding and an index NVML does not have */
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 2\n", FAKE, "GPU-fake-1,GPU-nope")), 0);
    st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 3, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "ok   GPU 1 (GPU-fake-1, PCI 00000000:11:00.0)"), "%s", p.out);
    cr_expect(strstr(p.out, "FAIL GPU GPU-nope (CUDA_VISIBLE_DEVICES entry GPU-nope): NVML does "
                            "not find this UUID"),
              "%s", p.out);
    /* another GPU of the node is lost: NVML's lookup by UUID then fails for
     * every GPU; the bound one is healthy and passes, the lost one is named */
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 2\nlost 0\n", FAKE, "GPU-fake-1")), 0);
    st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "ok   GPU 1 (GPU-fake-1, PCI 00000000:11:00.0)"), "%s", p.out);
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 2\nlost 0\n", FAKE, "GPU-fake-0")), 0);
    st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 3, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "FAIL GPU 0 (GPU-fake-0, PCI 00000000:10:00.0): NVML cannot reach it"),
              "%s", p.out);
}

Test(gpu_health, mig_layout_against_the_binding) {
    char *argv[] = {GL, "--standalone", "--check", NULL};
    proc p;
    /* the whole GPU bound while MIG is on */
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 1\nmig 0 2\n", FAKE, "0")), 0);
    int st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 3, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "FAIL GPU 0 (GPU-fake-0, PCI 00000000:10:00.0): MIG mode is on but "
                            "the binding names the whole GPU"),
              "%s", p.out);
    /* its instances bound: fine; one that is not there: refused */
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 1\nmig 0 2\n", FAKE, "MIG-fake-0-1")), 0);
    st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "ok   GPU 0 MIG 2/0 (MIG-fake-0-1, PCI 00000000:10:00.0)"), "%s",
              p.out);
    /* the same instance by the older MIG-GPU-<uuid>/<gi>/<ci> name, and by a
     * prefix of its UUID (CUDA takes both) */
    static const char *const names[] = {"MIG-GPU-fake-0/2/0", "MIG-fake-0-1"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char cvd[64];
        snprintf(cvd, sizeof cvd, "%s", names[i]);
        if (i == 1)
            cvd[strlen(cvd) - 1] = '\0'; /* "MIG-fake-0-": the first instance, GI 1 */
        cr_assert_eq(proc_start(&p, argv, fake_env("gpus 1\nmig 0 2\n", FAKE, cvd)), 0);
        st = proc_wait(&p, 20000);
        cr_expect_eq(exit_code(st), 0, "%s: status %d: %s", cvd, st, p.out);
        cr_expect(strstr(p.out, i == 0 ? "ok   GPU 0 MIG 2/0 (MIG-fake-0-1, PCI 00000000:10:00.0)"
                                       : "ok   GPU 0 MIG 1/0 (MIG-fake-0-0, PCI 00000000:10:00.0)"),
                  "%s: %s", cvd, p.out);
    }
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 1\nmig 0 2\n", FAKE, "MIG-fake-0-5")), 0);
    st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 3, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "FAIL GPU MIG-fake-0-5 (CUDA_VISIBLE_DEVICES entry MIG-fake-0-5): "
                            "NVML does not find this MIG instance"),
              "%s", p.out);
    /* nothing bound (a container's NVIDIA_VISIBLE_DEVICES by index): every GPU
     * NVML lists; MIG on is a warning, not a contradiction */
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 2\nmig 0 2\n", FAKE, "nv:0,1")), 0);
    st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "warn GPU 0: MIG mode is on and nothing binds its instances"), "%s",
              p.out);
    cr_expect(strstr(p.out, "ok   GPU 1 (GPU-fake-1, PCI 00000000:11:00.0)"), "%s", p.out);
}

/* GET path from the launcher's endpoint; the body into out. 0 on a 200. */
static int http_get(int port, const char *path, char *out, size_t len) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t got = 0;
    ssize_t r;
    while (got + 1 < len && (r = read(fd, out + got, len - 1 - got)) > 0)
        got += (size_t)r;
    out[got] = '\0';
    close(fd);
    return strncmp(out, "HTTP/1.1 200", 12) == 0 ? 0 : 1;
}

Test(gpu_health, idle_alert_fires_and_the_metric_shows_it) {
    int port = free_tcp_port();
    char ms[64];
    snprintf(ms, sizeof ms, "127.0.0.1:%d", port);
    char *argv[] = {GL,
                    "--standalone",
                    "--nproc-per-node",
                    "1",
                    "--gpu-monitor-interval",
                    "0.2",
                    "--gpu-idle-alert",
                    "30:2s",
                    "--metrics",
                    ms,
                    "--no-python",
                    "/bin/sleep",
                    "8",
                    NULL};
    proc p;
    uint64_t t0 = now_ms();
    /* busy for 1 s, then 20 %: the alert is due 3 s after start */
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 1\nutil 0 90 1.0 20\n", FAKE, "0")), 0);
    cr_assert(proc_expect(&p, "round 1", 10000), "%s", p.out);
    static char body[65536];
    cr_expect_eq(http_get(port, "/metrics", body, sizeof body), 0, "%s", body);
    cr_expect(strstr(body, "gpulaunch_gpu_idle{") && strstr(body, "} 0\n"), "%s", body);
    int fired = proc_expect(&p,
                            "idle GPU: GPU 0 (GPU-fake-0, PCI 00000000:10:00.0) of rank 0 "
                            "(local rank 0, pid",
                            10000);
    double took = (double)(now_ms() - t0) / 1000.0;
    cr_assert(fired, "%s", p.out);
    cr_expect(strstr(p.out, "under 30 % utilisation for 2 s (now 20 %"), "%s", p.out);
    cr_expect(took >= 2.9 && took <= 4.0, "alert %.2f s after start; due at 3.0 s", took);
    cr_assert_eq(http_get(port, "/metrics", body, sizeof body), 0, "%s", body);
    cr_expect(strstr(body, "gpulaunch_gpu_idle{job=\"standalone-"), "%s", body);
    char *line = strstr(body, "\ngpulaunch_gpu_idle{");
    cr_assert_not_null(line, "%s", body);
    cr_expect(strstr(line, "gpu=\"0\",uuid=\"GPU-fake-0\",pci_bus_id=\"00000000:10:00.0\","
                           "rank=\"0\",local_rank=\"0\"} 1\n"),
              "%s", body);
    cr_expect(strstr(body, "gpulaunch_gpu_idle_alerts_total{") != NULL, "%s", body);
    cr_expect(strstr(body, ",local_rank=\"0\"} 20\n") != NULL, "no utilisation 20: %s", body);
    cr_expect(strstr(body, "gpulaunch_gpu_memory_used_bytes{") &&
                  strstr(body, "gpulaunch_gpu_temperature_celsius{") &&
                  strstr(body, "gpulaunch_gpu_power_watts{"),
              "%s", body);
    cr_expect_eq(http_get(port, "/nope", body, sizeof body), 1, "%s", body);
    cr_expect_eq(count(p.out, "gpulaunch: idle GPU"), 1, "said more than once: %s", p.out);
    /* and on the job's timeline at the rendezvous (here the embedded one, whose log this is) */
    cr_expect(proc_expect(&p, "GPU notice from", 2000) && strstr(p.out, ": idle GPU: GPU 0"),
              "the rendezvous was not told: %s", p.out);
    kill(p.pid, SIGINT);
    proc_wait(&p, 20000);
    cr_log_info("idle alert (30 %% for 2 s, utilisation 20 %% from 1.0 s) %.2f s after start",
                took);
}

Test(gpu_health, xid_named_with_the_rank_and_in_the_failure_report) {
    char prog[256], logs[128];
    snprintf(prog, sizeof prog, "if [ $LOCAL_RANK = 1 ]; then sleep 3; exit 7; fi; sleep 20");
    snprintf(logs, sizeof logs, "%s/logs", dir);
    char *argv[] = {GL,   "--standalone", "--nproc-per-node", "2",  "--bind-gpus", "--log-dir",
                    logs, "--no-python",  "/bin/sh",          "-c", prog,          NULL};
    proc p;
    uint64_t t0 = now_ms();
    /* and a storm of XID 13 on GPU 0 before it: 10 lines, then counted */
    char script[512];
    int off = snprintf(script, sizeof script, "gpus 2\nxid 1 79 1.5\n");
    for (int i = 0; i < 12; i++)
        off += snprintf(script + off, sizeof script - (size_t)off, "xid 0 13 1.0\n");
    cr_assert_eq(proc_start(&p, argv, fake_env(script, FAKE, "0,1")), 0);
    int named = proc_expect(&p,
                            "XID 79 on GPU 1 (GPU-fake-1, PCI 00000000:11:00.0), held by rank "
                            "1 (local rank 1, pid ",
                            10000);
    double took = (double)(now_ms() - t0) / 1000.0;
    cr_assert(named, "%s", p.out);
    cr_expect(strstr(p.out, "fallen off the bus"), "%s", p.out);
    int st = proc_wait(&p, 30000);
    cr_expect_eq(exit_code(st), 7, "status %d: %s", st, p.out);
    const char *rep = strstr(p.out, "job failed");
    cr_assert_not_null(rep, "%s", p.out);
    cr_expect(strstr(rep, "GPU errors :") &&
                  strstr(rep, "XID 79 on GPU 1 (GPU-fake-1, PCI 00000000:11:00.0), rank 1 (local "
                              "rank 1, pid "),
              "%s", rep);
    char path[256], js[4096] = "";
    snprintf(path, sizeof path, "%s/failure.json", logs);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    size_t n = fread(js, 1, sizeof js - 1, f);
    js[n] = '\0';
    fclose(f);
    cr_expect(strstr(js, "{\"xid\":79,\"gpu\":1,\"uuid\":\"GPU-fake-1\",\"rank\":1,"
                         "\"local_rank\":1,\"count\":1}]}"),
              "%s", js);
    cr_expect(strstr(js, "\"gpu_errors\":[{\"xid\":13,\"gpu\":0,\"uuid\":\"GPU-fake-0\",\"rank\":0,"
                         "\"local_rank\":0,\"count\":12}"),
              "%s", js);
    cr_expect_eq(count(p.out, "gpulaunch: XID 13 on GPU 0"), 10, "%s", p.out);
    cr_expect_eq(count(p.out, "further XIDs on GPU 0 (GPU-fake-0, PCI 00000000:10:00.0) are "
                              "counted"),
                 1, "%s", p.out);
    cr_expect(strstr(rep, "XID 13 on GPU 0 (GPU-fake-0, PCI 00000000:10:00.0), rank 0 (local rank "
                          "0, pid ") &&
                  strstr(rep, "(12 times from then)"),
              "%s", rep);
    cr_expect(took < 1.5 + 1.0, "XID at 1.5 s after NVML started, named %.2f s after start", took);
    cr_log_info("XID 79 (at 1.5 s after NVML started) named %.2f s after the launcher started",
                took);
}

/* An XID attributable to a MIG instance (NVML gives its GPU instance id) is
 * named with that instance and the rank on it, not the GPU's first. */
Test(gpu_health, mig_xid_named_with_its_instance) {
    char *argv[] = {GL,           "--standalone", "--nproc-per-node",
                    "2",          "--bind-gpus",  "--no-python",
                    "/bin/sleep", "2.5",          NULL};
    proc p;
    cr_assert_eq(proc_start(&p, argv,
                            fake_env("gpus 1\nmig 0 2\nxid 0 43 1.0 2\n", FAKE,
                                     "MIG-fake-0-0,MIG-fake-0-1")),
                 0);
    cr_expect(proc_expect(&p,
                          "XID 43 on GPU 0 MIG 2/0 (MIG-fake-0-1, PCI 00000000:10:00.0), held "
                          "by rank 1 (local rank 1, pid ",
                          10000),
              "%s", p.out);
    int st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 0, "status %d: %s", st, p.out);
}

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static void read_line(const char *path, char *buf, size_t len) {
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f) {
        if (fgets(buf, (int)len, f) == NULL)
            buf[0] = '\0';
        fclose(f);
    }
}

Test(gpu_health, dcgm_job_mapping_files_appear_and_vanish) {
    char map[128], f0[160], f1[160], line[256];
    snprintf(map, sizeof map, "%s/dcgm", dir);
    snprintf(f0, sizeof f0, "%s/0", map);
    snprintf(f1, sizeof f1, "%s/1.2", map); /* GPU 1's MIG instance with GI 2 */
    char *argv[] = {
        GL,  "--nproc-per-node",       "2", "--bind-gpus", "--rdzv-id",  "job-42", "--master-port",
        "0", "--dcgm-job-mapping-dir", map, "--no-python", "/bin/sleep", "2",      NULL};
    char port[16];
    snprintf(port, sizeof port, "%d", free_tcp_port());
    argv[7] = port;
    proc p;
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 2\nmig 1 2\n", FAKE, "0,MIG-fake-1-1")), 0);
    cr_assert(proc_expect(&p, "round 1", 10000), "%s", p.out);
    cr_expect(exists(f0) && exists(f1), "no mapping files: %s", p.out);
    read_line(f0, line, sizeof line);
    cr_expect_str_eq(line, "job-42\n");
    read_line(f1, line, sizeof line);
    cr_expect_str_eq(line, "job-42\n");
    int st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 0, "status %d: %s", st, p.out);
    cr_expect(!exists(f0) && !exists(f1), "left behind after exit");
    /* SIGTERM: the job checkpoints and stops; the files go too */
    argv[12] = "30";
    snprintf(port, sizeof port, "%d", free_tcp_port());
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 2\nmig 1 2\n", FAKE, "0,MIG-fake-1-1")), 0);
    cr_assert(proc_expect(&p, "round 1", 10000), "%s", p.out);
    cr_expect(exists(f0) && exists(f1), "no mapping files: %s", p.out);
    kill(p.pid, SIGTERM);
    st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 143, "status %d: %s", st, p.out);
    cr_expect(!exists(f0) && !exists(f1), "left behind after SIGTERM");
    /* a worker's failure */
    char *fail[] = {GL,  "--standalone", "--nproc-per-node", "1",  "--dcgm-job-mapping-dir",
                    map, "--no-python",  "/bin/sh",          "-c", "sleep 1; exit 3",
                    NULL};
    cr_assert_eq(proc_start(&p, fail, fake_env("gpus 1\n", FAKE, "0")), 0);
    cr_assert(proc_expect(&p, "round 1", 10000), "%s", p.out);
    cr_expect(exists(f0), "no mapping file: %s", p.out);
    st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 3, "status %d: %s", st, p.out);
    cr_expect(!exists(f0), "left behind after a failure");
}

/* Whether process pid has a thread named name; whether it maps a file whose
 * path contains lib. */
static int has_thread(pid_t pid, const char *name) {
    char path[128], comm[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d)) != NULL) {
        snprintf(path, sizeof path, "/proc/%d/task/%s/comm", (int)pid, e->d_name);
        FILE *f = fopen(path, "r");
        if (f && fgets(comm, sizeof comm, f))
            found = strncmp(comm, name, strlen(name)) == 0;
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    return found;
}

static int maps_lib(pid_t pid, const char *lib) {
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, lib) != NULL;
    if (f)
        fclose(f);
    return found;
}

/* NVML loaded: one thread for XIDs. Without the library: no thread. On a
 * node without GPUs: the library is not even opened. */
Test(gpu_health, no_cost_without_nvml_or_gpus) {
    char *argv[] = {GL, "--standalone", "--no-python", "/bin/sleep", "0.6", NULL};
    static const struct {
        const char *lib, *cvd;
        int thread, mapped;
    } c[] = {{FAKE, "0", 1, 1}, {"/nonexistent/libnvidia-ml.so.1", "0", 0, 0}, {FAKE, "", 0, 0}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        proc p;
        cr_assert_eq(proc_start(&p, argv, fake_env("gpus 1\n", c[i].lib, c[i].cvd)), 0);
        cr_assert(proc_expect(&p, "round 1", 10000), "%s", p.out);
        cr_expect_eq(has_thread(p.pid, "gpulaunch-gpu"), c[i].thread, "case %zu: %s", i, p.out);
        cr_expect_eq(maps_lib(p.pid, "libfake_nvml"), c[i].mapped, "case %zu", i);
        int st = proc_wait(&p, 10000);
        cr_expect_eq(exit_code(st), 0, "case %zu: status %d: %s", i, st, p.out);
    }
}

Test(gpu_health, missing_function_said_once_and_thermal_slowdown) {
    char *argv[] = {GL,    "--standalone", "--gpu-health", "warn", "--gpu-monitor-interval",
                    "0.2", "--no-python",  "/bin/sleep",   "1",    NULL};
    proc p;
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 1\nreasons 0 0x40\n", FAKE_OLD, "0")), 0);
    int st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 0, "status %d: %s", st, p.out);
    cr_expect_eq(count(p.out, "lacks nvmlDeviceGetRemappedRows"), 1, "%s", p.out);
    cr_expect(strstr(p.out, "the row-remapping check is off"), "%s", p.out);
    /* the older name of the clock reasons call stands in */
    cr_expect(strstr(p.out, "lacks nvmlDeviceGetCurrentClocks") == NULL, "%s", p.out);
    cr_expect(strstr(p.out, "warn GPU 0 (GPU-fake-0, PCI 00000000:10:00.0): clocks are slowed "
                            "(hw thermal)"),
              "%s", p.out);
    /* and while running: said once, not every sample */
    cr_expect_eq(count(p.out, "of rank 0 (local rank 0, pid"), 1, "%s", p.out);
    cr_expect(strstr(p.out, "clocks slowed (hw thermal): it holds every rank back"), "%s", p.out);
    /* a library that is not there: said, and the job runs */
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 1\n", "/nonexistent/libnvidia-ml.so.1", "0")),
                 0);
    st = proc_wait(&p, 20000);
    cr_expect_eq(exit_code(st), 0, "status %d: %s", st, p.out);
    cr_expect_eq(count(p.out, "cannot be loaded"), 1, "%s", p.out);
}

Test(gpu_health, bad_options_refused_before_anything_starts) {
    static const char *const bad[][2] = {
        {"--gpu-health", "maybe"},          {"--gpu-idle-alert", "50"},
        {"--gpu-idle-alert", "0:30m"},      {"--gpu-idle-alert", "50:30x"},
        {"--gpu-monitor-interval", "0.01"}, {"--metrics", "nowhere"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[] = {
            GL,  "--standalone", (char *)bad[i][0], (char *)bad[i][1], "--no-python", "/bin/true",
            NULL};
        proc p;
        cr_assert_eq(proc_start(&p, argv, fake_env("gpus 1\n", FAKE, "0")), 0);
        int st = proc_wait(&p, 10000);
        cr_expect_eq(exit_code(st), 2, "%s %s: status %d: %s", bad[i][0], bad[i][1], st, p.out);
        cr_expect(strstr(p.out, bad[i][0]) != NULL, "the option is not named: %s", p.out);
    }
    /* a --metrics port that is taken */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(fd, 1) == 0 &&
              getsockname(fd, (struct sockaddr *)&sa, &len) == 0);
    char ms[64];
    snprintf(ms, sizeof ms, "127.0.0.1:%d", ntohs(sa.sin_port));
    char *argv[] = {GL, "--standalone", "--metrics", ms, "--no-python", "/bin/true", NULL};
    proc p;
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 1\n", FAKE, "0")), 0);
    int st = proc_wait(&p, 10000);
    close(fd);
    cr_expect_eq(exit_code(st), 2, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "cannot listen") != NULL, "%s", p.out);
}

/* What is sent to the --metrics port, raw; the first line of the answer. */
static void http_raw(int port, const char *req, char *out, size_t len) {
    out[0] = '\0';
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (fd >= 0)
            close(fd);
        return;
    }
    size_t n = strlen(req);
    if (write(fd, req, n) == (ssize_t)n) {
        ssize_t r = read(fd, out, len - 1);
        out[r > 0 ? r : 0] = '\0';
    }
    close(fd);
    out[strcspn(out, "\r\n")] = '\0';
}

/* The endpoint answers HTTP as HTTP: a parsed request line and headers (a
 * request in pieces, a query string), 405 for other methods, 400 for what is
 * not HTTP or too long, without a GPU or NVML. */
Test(gpu_health, metrics_endpoint_speaks_http) {
    int port = free_tcp_port();
    char ms[64];
    snprintf(ms, sizeof ms, "127.0.0.1:%d", port);
    char *argv[] = {GL, "--standalone", "--metrics", ms, "--no-python", "/bin/sleep", "5", NULL};
    proc p;
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 0\n", FAKE, "")), 0);
    cr_assert(proc_expect(&p, "round 1", 10000), "%s", p.out);
    char line[256];
    http_raw(port, "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n", line,
             sizeof line);
    cr_expect_str_eq(line, "HTTP/1.1 200 OK");
    http_raw(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", line, sizeof line);
    cr_expect_str_eq(line, "HTTP/1.1 405 Method Not Allowed");
    http_raw(port, "garbage\r\n\r\n", line, sizeof line);
    cr_expect_str_eq(line, "HTTP/1.1 400 Bad Request");
    static char big[16384]; /* over GL_METRICS_REQUEST_MAX */
    memset(big, 'a', sizeof big - 1);
    memcpy(big, "GET /metrics HTTP/1.1\r\nX: ", 26);
    http_raw(port, big, line, sizeof line);
    cr_expect_str_eq(line, "HTTP/1.1 400 Bad Request", "a request over the limit");
    kill(p.pid, SIGINT);
    proc_wait(&p, 20000);
}

/* The value of the sample `name` (labels included) in a /metrics body, -1 if none. */
static double sample(const char *body, const char *name) {
    size_t l = strlen(name);
    for (const char *p = body; (p = strstr(p, name)) != NULL; p += l)
        if ((p == body || p[-1] == '\n') && p[l] == ' ')
            return strtod(p + l + 1, NULL);
    return -1;
}

static long count_entries(const char *path) {
    DIR *d = opendir(path);
    long n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return d ? n : -1;
}

/* The launcher's own figures on /metrics, against what /proc says of it
 * from outside: descriptors (the scrape's own connection one more), threads,
 * its two workers, its loop's handles by type, the progress channel, memory,
 * CPU and start time, all promtool-clean (docs/gpu-health.md; what the
 * launcher soak counts, docs/reliability.md). */
Test(gpu_health, metrics_show_what_the_launcher_holds) {
    int port = free_tcp_port();
    char ms[64];
    snprintf(ms, sizeof ms, "127.0.0.1:%d", port);
    char *argv[] = {GL, "--standalone", "--nproc-per-node", "2",  "--metrics",
                    ms, "--no-python",  "/bin/sleep",       "20", NULL};
    proc p;
    cr_assert_eq(proc_start(&p, argv, fake_env("gpus 0\n", FAKE, "")), 0);
    cr_assert(proc_expect(&p, "round 1", 10000), "%s", p.out);
    usleep(300000); /* both workers started, their pipes open */
    char fdir[64], tdir[64];
    snprintf(fdir, sizeof fdir, "/proc/%d/fd", (int)p.pid);
    snprintf(tdir, sizeof tdir, "/proc/%d/task", (int)p.pid);
    long fds = count_entries(fdir), threads = count_entries(tdir);
    long rss_kib = proc_read_long(p.pid, "status", "VmRSS: %ld");
    static char body[262144];
    cr_assert_eq(http_get(port, "/metrics", body, sizeof body), 0, "%s", body);
    char *text = strstr(body, "\r\n\r\n");
    cr_assert_not_null(text, "%s", body);
    text += 4;
    char why[1100];
    cr_expect_eq(prom_check(text, why, sizeof why), 0, "%s\n%s", why, text);
    cr_expect_eq(prom_documented(text, why, sizeof why), 0, "not in docs/*.md: %s", why);
    cr_expect_eq(sample(text, "process_open_fds"), (double)fds + 1, "outside %ld: %s", fds, text);
    cr_expect_eq(sample(text, "gpulaunch_threads"), (double)threads, "%s", text);
    cr_expect_eq(sample(text, "gpulaunch_workers"), 2, "%s", text);
    cr_expect_eq(sample(text, "gpulaunch_child_processes"), 2, "%s", text);
    cr_expect_eq(sample(text, "gpulaunch_progress_regions"), 1, "%s", text);
    cr_expect_gt(sample(text, "gpulaunch_progress_region_bytes"), 0, "%s", text);
    cr_expect_gt(sample(text, "gpulaunch_loop_handles{type=\"timer\"}"), 0, "%s", text);
    cr_expect_geq(sample(text, "gpulaunch_loop_handles{type=\"pipe\"}"), 4, "two per worker: %s",
                  text);
    cr_expect_geq(sample(text, "gpulaunch_loop_handles{type=\"tcp\"}"), 2,
                  "the listener and this scrape: %s", text);
#ifdef __SANITIZE_ADDRESS__ /* ASan's allocator, not malloc's: mallinfo2 says 0 */
    cr_expect_geq(sample(text, "gpulaunch_heap_bytes"), 0, "%s", text);
#else
    cr_expect_gt(sample(text, "gpulaunch_heap_bytes"), 0, "%s", text);
#endif
    double rss = sample(text, "process_resident_memory_bytes");
    cr_expect(rss > 0.5 * (double)rss_kib * 1024 && rss < 2.0 * (double)rss_kib * 1024,
              "RSS %.0f, /proc says %ld KiB", rss, rss_kib);
    double start = sample(text, "process_start_time_seconds"), now = (double)time(NULL);
    cr_expect(start > now - 60 && start <= now + 1, "started %.0f, now %.0f", start, now);
    cr_expect_geq(sample(text, "process_cpu_seconds_total"), 0, "%s", text);
    cr_expect_gt(sample(text, "process_max_fds"), 0, "%s", text);
    kill(p.pid, SIGINT);
    proc_wait(&p, 20000);
}
