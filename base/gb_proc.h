/* Another process's state as /proc/PID/stat gives it. */
#ifndef GPULAUNCH_GB_PROC_H
#define GPULAUNCH_GB_PROC_H

#include <sys/types.h>

/* The state letter of pid (R, S, D, T, t, Z, X, ...), or 0 when it cannot be
 * read (gone, or /proc not mounted). */
char gb_proc_state(pid_t pid);

#endif
