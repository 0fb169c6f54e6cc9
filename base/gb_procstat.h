/* What a process holds of the machine, as /proc gives it: resident memory,
 * threads, open descriptors, CPU time, its start, its children. Read by a
 * process about itself for its /metrics (Prometheus' standard process_*
 * figures) and by the soaks about another one from outside. */
#ifndef GPULAUNCH_GB_PROCSTAT_H
#define GPULAUNCH_GB_PROCSTAT_H

#include <sys/types.h>

typedef struct gb_procstat {
    long long rss_bytes; /* VmRSS of /proc/PID/status */
    long long vm_bytes;  /* VmSize */
    long threads;        /* Threads */
    long fds;            /* entries of /proc/PID/fd */
    double cpu_s;        /* user + system time (/proc/PID/stat) */
    double start_unix_s; /* when it started, seconds since the epoch */
} gb_procstat;

/* Fills out for pid (0: this process); a figure that cannot be read is -1.
 * 0 when the process was found, -1 when not (gone, or /proc not mounted). */
int gb_procstat_read(pid_t pid, gb_procstat *out);
/* The open descriptors of pid (0: this process, the one this call opens to
 * count them left out), -1 when /proc/PID/fd cannot be read (another user's). */
long gb_procstat_fds(pid_t pid);
/* The processes whose parent is pid (0: this process), zombies included;
 * -1 when /proc cannot be read. */
long gb_procstat_children(pid_t pid);
/* The CPU time of every thread of pid (0: this process) from the scheduler's
 * nanosecond counts (/proc/PID/task/T/schedstat), where cpu_s's clock ticks
 * are too coarse (a quiet server's heartbeats); -1 when it cannot be read. */
double gb_procstat_cpu_exact_s(pid_t pid);

#endif
