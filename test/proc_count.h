/* What a process holds, counted for the soaks (test/bench/launcher_soak.c,
 * test/test_netsoak.c): from outside (/proc/PID: descriptors by kind,
 * threads, child processes, RSS) and from a launcher's /metrics text (its
 * libuv handles by type, progress regions and pipes, workers, heap in use).
 * A soak compares the counts after its warm-up with those at its end. */
#ifndef GPULAUNCH_TEST_PROC_COUNT_H
#define GPULAUNCH_TEST_PROC_COUNT_H

#include <sys/types.h>

enum proc_count_index {
    PC_FDS,
    PC_FD_SOCKET,
    PC_FD_PIPE,
    PC_FD_MEMFD,
    PC_FD_ANON,
    PC_FD_FILE,
    PC_THREADS,
    PC_CHILDREN,
    PC_SHM,      /* the caller's: /dev/shm/gpulaunch-* (machine-wide) */
    PC_TMPFILES, /* the caller's: files in the launchers' TMPDIR */
    PC_HANDLES,
    PC_H_TIMER,
    PC_H_TCP,
    PC_H_PIPE,
    PC_H_SIGNAL,
    PC_H_ASYNC,
    PC_H_OTHER,
    PC_M_FDS,
    PC_M_THREADS,
    PC_M_CHILDREN,
    PC_M_WORKERS,
    PC_M_REGIONS,
    PC_M_PIPES,
    PC_M_HEAP,
    PC_N
};
extern const char *const proc_count_name[PC_N];

/* Entries of directory path whose names begin with prefix ("" all), -1 if
 * it cannot be read. */
long proc_count_dir(const char *path, const char *prefix);
/* Zeroes c, then counts pid's descriptors by kind, threads and children
 * into it and its RSS into *rss_kib: 0, or -1 when pid is gone. */
int proc_count(pid_t pid, long c[PC_N], long *rss_kib);
/* A launcher's /metrics text (gpulaunch_loop_handles{type}, process_open_fds,
 * gpulaunch_threads, ...) into c's PC_HANDLES.. entries: 0, or -1 when it
 * has no process figures. */
int proc_count_metrics(const char *body, long c[PC_N]);

#endif
