/* What a process holds, counted (see proc_count.h). */
#include "proc_count.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gb_procstat.h"

const char *const proc_count_name[PC_N] = {
    [PC_FDS] = "descriptors (/proc/PID/fd)",
    [PC_FD_SOCKET] = "  sockets",
    [PC_FD_PIPE] = "  pipes",
    [PC_FD_MEMFD] = "  memfds (progress regions)",
    [PC_FD_ANON] = "  epoll, eventfd, signalfd, timerfd",
    [PC_FD_FILE] = "  files and devices",
    [PC_THREADS] = "threads (/proc/PID/task)",
    [PC_CHILDREN] = "child processes",
    [PC_SHM] = "/dev/shm/gpulaunch-<run>-* entries",
    [PC_TMPFILES] = "files in the launchers' TMPDIR",
    [PC_HANDLES] = "libuv handles (uv_walk)",
    [PC_H_TIMER] = "  timers",
    [PC_H_TCP] = "  tcp (the scrape's own included)",
    [PC_H_PIPE] = "  pipes",
    [PC_H_SIGNAL] = "  signals",
    [PC_H_ASYNC] = "  async",
    [PC_H_OTHER] = "  others",
    [PC_M_FDS] = "process_open_fds (scraping)",
    [PC_M_THREADS] = "gpulaunch_threads",
    [PC_M_CHILDREN] = "gpulaunch_child_processes",
    [PC_M_WORKERS] = "gpulaunch_workers",
    [PC_M_REGIONS] = "gpulaunch_progress_regions",
    [PC_M_PIPES] = "gpulaunch_progress_pipes",
    [PC_M_HEAP] = "gpulaunch_heap_bytes",
};

long proc_count_dir(const char *path, const char *prefix) {
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' && strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            n++;
    closedir(d);
    return n;
}

static void count_fds(pid_t pid, long *c) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char lp[PATH_MAX], to[PATH_MAX];
        snprintf(lp, sizeof lp, "%s/%s", path, e->d_name);
        ssize_t n = readlink(lp, to, sizeof to - 1);
        if (n < 0)
            continue;
        to[n] = '\0';
        c[PC_FDS]++;
        if (strncmp(to, "socket:", 7) == 0)
            c[PC_FD_SOCKET]++;
        else if (strncmp(to, "pipe:", 5) == 0)
            c[PC_FD_PIPE]++;
        else if (strncmp(to, "/memfd:", 7) == 0)
            c[PC_FD_MEMFD]++;
        else if (strncmp(to, "anon_inode:", 11) == 0)
            c[PC_FD_ANON]++;
        else
            c[PC_FD_FILE]++;
    }
    if (d)
        closedir(d);
}

int proc_count(pid_t pid, long c[PC_N], long *rss_kib) {
    memset(c, 0, PC_N * sizeof *c);
    gb_procstat ps;
    if (gb_procstat_read(pid, &ps) != 0)
        return -1;
    count_fds(pid, c);
    char task[64];
    snprintf(task, sizeof task, "/proc/%d/task", (int)pid);
    c[PC_THREADS] = proc_count_dir(task, "");
    c[PC_CHILDREN] = gb_procstat_children(pid);
    *rss_kib = (long)(ps.rss_bytes / 1024);
    return 0;
}

/* The value of the sample `name` (labels included), -1 if none. */
static long metric(const char *body, const char *name) {
    size_t l = strlen(name);
    for (const char *p = body; (p = strstr(p, name)) != NULL; p += l)
        if ((p == body || p[-1] == '\n') && p[l] == ' ')
            return strtol(p + l + 1, NULL, 10);
    return -1;
}

int proc_count_metrics(const char *body, long c[PC_N]) {
    static const struct {
        int c;
        const char *type;
    } h[] = {{PC_H_TIMER, "timer"},
             {PC_H_TCP, "tcp"},
             {PC_H_PIPE, "pipe"},
             {PC_H_SIGNAL, "signal"},
             {PC_H_ASYNC, "async"}};
    for (int i = PC_HANDLES; i < PC_N; i++)
        c[i] = 0;
    static const char key[] = "\ngpulaunch_loop_handles{type=\"";
    for (const char *p = body; (p = strstr(p, key)) != NULL;) {
        p += strlen(key);
        const char *q = strstr(p, "\"} ");
        if (q == NULL)
            break;
        long v = strtol(q + 3, NULL, 10);
        int slot = PC_H_OTHER;
        for (size_t i = 0; i < sizeof h / sizeof h[0]; i++)
            if ((size_t)(q - p) == strlen(h[i].type) && strncmp(p, h[i].type, (size_t)(q - p)) == 0)
                slot = h[i].c;
        c[slot] += v;
        c[PC_HANDLES] += v;
    }
    c[PC_M_FDS] = metric(body, "process_open_fds");
    c[PC_M_THREADS] = metric(body, "gpulaunch_threads");
    c[PC_M_CHILDREN] = metric(body, "gpulaunch_child_processes");
    c[PC_M_WORKERS] = metric(body, "gpulaunch_workers");
    c[PC_M_REGIONS] = metric(body, "gpulaunch_progress_regions");
    c[PC_M_PIPES] = metric(body, "gpulaunch_progress_pipes");
    c[PC_M_HEAP] = metric(body, "gpulaunch_heap_bytes");
    return c[PC_HANDLES] == 0 || c[PC_M_FDS] < 0 ? -1 : 0;
}
