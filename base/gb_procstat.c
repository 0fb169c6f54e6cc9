/* What a process holds of the machine (see gb_procstat.h). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gb_procstat.h"

/* "/proc/self" or "/proc/PID", then rest. */
static void proc_path(pid_t pid, const char *rest, char *buf, size_t len) {
    if (pid == 0)
        snprintf(buf, len, "/proc/self/%s", rest);
    else
        snprintf(buf, len, "/proc/%d/%s", (int)pid, rest);
}

/* The fields of /proc/PID/stat after the name ("S PPID ..."): the name may
 * hold spaces and parentheses, so they start after the last ')'. NULL when
 * the file cannot be read. */
static const char *stat_fields(pid_t pid, char *buf, size_t len) {
    char path[64];
    proc_path(pid, "stat", path, sizeof path);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return NULL;
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p + 2 : NULL;
}

/* The boot time, seconds since the epoch (btime of /proc/stat), -1 unknown. */
static double boot_time_s(void) {
    char line[256];
    double t = -1;
    FILE *f = fopen("/proc/stat", "re");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "btime ", 6) == 0) {
            t = strtod(line + 6, NULL);
            break;
        }
    if (f)
        fclose(f);
    return t;
}

long gb_procstat_fds(pid_t pid) {
    char path[64];
    proc_path(pid, "fd", path, sizeof path);
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    long n = 0;
    int own = pid == 0 ? dirfd(d) : -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (own >= 0 && strtol(e->d_name, NULL, 10) == own)
            continue; /* the descriptor this count reads through */
        n++;
    }
    closedir(d);
    return n;
}

long gb_procstat_children(pid_t pid) {
    pid_t parent = pid == 0 ? getpid() : pid;
    DIR *d = opendir("/proc");
    if (d == NULL)
        return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end, buf[512];
        long p = strtol(e->d_name, &end, 10);
        if (*end || p <= 0)
            continue;
        const char *s = stat_fields((pid_t)p, buf, sizeof buf);
        int ppid = 0;
        if (s && sscanf(s, "%*c %d", &ppid) == 1 && ppid == (int)parent)
            n++;
    }
    closedir(d);
    return n;
}

int gb_procstat_read(pid_t pid, gb_procstat *out) {
    char path[64], line[256], buf[1024];
    *out = (gb_procstat){
        .rss_bytes = -1, .vm_bytes = -1, .threads = -1, .fds = -1, .cpu_s = -1, .start_unix_s = -1};
    proc_path(pid, "status", path, sizeof path);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f)) {
        long long kib;
        long v;
        if (sscanf(line, "VmRSS: %lld kB", &kib) == 1)
            out->rss_bytes = kib * 1024;
        else if (sscanf(line, "VmSize: %lld kB", &kib) == 1)
            out->vm_bytes = kib * 1024;
        else if (sscanf(line, "Threads: %ld", &v) == 1)
            out->threads = v;
    }
    fclose(f);
    out->fds = gb_procstat_fds(pid);
    /* fields 14 and 15 (utime, stime) and 22 (starttime), in clock ticks;
     * the first one here is field 3 (the state) */
    const char *s = stat_fields(pid, buf, sizeof buf);
    unsigned long long ut, st, start;
    long tck = sysconf(_SC_CLK_TCK);
    if (s && tck > 0 &&
        sscanf(s,
               "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d "
               "%llu",
               &ut, &st, &start) == 3) {
        out->cpu_s = (double)(ut + st) / (double)tck;
        double boot = boot_time_s();
        if (boot >= 0)
            out->start_unix_s = boot + (double)start / (double)tck;
    }
    return 0;
}

double gb_procstat_cpu_exact_s(pid_t pid) {
    char path[64];
    proc_path(pid, "task", path, sizeof path);
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    unsigned long long total = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char f[320];
        snprintf(f, sizeof f, "%s/%s/schedstat", path, e->d_name);
        FILE *fp = fopen(f, "r");
        unsigned long long ns = 0;
        if (fp && fscanf(fp, "%llu", &ns) == 1)
            total += ns;
        if (fp)
            fclose(fp);
    }
    closedir(d);
    return (double)total / 1e9;
}
