/* The soak's server under test: soak_server.h says what. */
#include "soak_server.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gb_procstat.h"
#include "gb_time.h"
#include "harness.h"

long soak_proc_fds(pid_t pid) { return gb_procstat_fds(pid); }

long soak_proc_rss_kib(pid_t pid) {
    gb_procstat st;
    return gb_procstat_read(pid, &st) == 0 && st.rss_bytes >= 0 ? (long)(st.rss_bytes / 1024) : -1;
}

double soak_proc_cpu_s(pid_t pid) {
    double s = gb_procstat_cpu_exact_s(pid);
    return s < 0 ? 0 : s;
}

/* Whether something listens on the port yet. */
static int port_open(int port) {
    int fd = raw_connect(port);
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

pid_t soak_server_start(const char *bin, int port, int http_port, const char *token,
                        int handshake_ms, const char *probes) {
    char listen[64], http[64], tf[] = "/tmp/rdzv-soak-token-XXXXXX";
    int fd = mkstemp(tf);
    if (fd < 0 || write(fd, token, strlen(token)) != (ssize_t)strlen(token)) {
        perror("rdzv_soak: token file");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(http, sizeof http, "127.0.0.1:%d", http_port);
    char hs[16];
    snprintf(hs, sizeof hs, "%d", handshake_ms);
    pid_t pid = fork();
    if (pid == 0) {
        /* malloc's per-thread cache holds freed chunks that mallinfo counts as
         * in use: without it gpulaunch_rdzv_heap_bytes is exact */
        setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0", 1);
        execl(bin, "gpulaunch-rdzv", "--listen", listen, "--http", http, "--token-file", tf,
              "--handshake-timeout-ms", hs, "--log-level", "error", "--probes",
              probes ? probes : "on", (char *)NULL);
        _exit(127);
    }
    uint64_t until = gb_now_ms() + 10000;
    while (!port_open(port) || !port_open(http_port)) {
        if (gb_now_ms() > until || waitpid(pid, NULL, WNOHANG) == pid) {
            fprintf(stderr, "rdzv_soak: the server did not start on %s\n", listen);
            unlink(tf);
            return -1;
        }
        usleep(10000);
    }
    unlink(tf);
    return pid;
}

double soak_server_metric(int http_port, const char *name) {
    static char body[1 << 20];
    return http_get_local(http_port, "/metrics", body, sizeof body) == 200 ? prom_value(body, name)
                                                                           : -1;
}
