/* Another process's state (see gb_proc.h). */
#include <stdio.h>
#include <stdlib.h>
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

int gb_proc_catches(pid_t pid, int sig) {
    char path[64], line[256];
    int r = -1;
    if (sig < 1 || sig > 64)
        return -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "SigCgt:", 7) != 0)
            continue;
        char *end;
        unsigned long long mask = strtoull(line + 7, &end, 16);
        if (end != line + 7)
            r = (int)((mask >> (sig - 1)) & 1u);
        break;
    }
    fclose(f);
    return r;
}
