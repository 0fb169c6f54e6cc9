/* Another process's state (see gb_proc.h). */
#include <stdio.h>
#include <string.h>

#include "gb_proc.h"

char gb_proc_state(pid_t pid) {
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* "PID (NAME) S ...": the name may hold spaces and parentheses */
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : 0;
}
