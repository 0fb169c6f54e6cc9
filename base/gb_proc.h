/* Another process's state as /proc/PID/stat and /proc/PID/status give it. */
#ifndef GPULAUNCH_GB_PROC_H
#define GPULAUNCH_GB_PROC_H

#include <sys/types.h>

/* The state letter of pid (R, S, D, T, t, Z, X, ...), or 0 when it cannot be
 * read (gone, or /proc not mounted). */
char gb_proc_state(pid_t pid);

/* 1 when pid has a handler for sig installed now (SigCgt of /proc/PID/status),
 * 0 when not (its default action applies), -1 when it cannot be read. */
int gb_proc_catches(pid_t pid, int sig);

#endif
