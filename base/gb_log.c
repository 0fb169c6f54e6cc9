/* Logging implementation: see gb_log.h. */
#include "gb_log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = -1;
static atomic_int log_fd = 2;

int gb_log_parse_level(const char *s) {
    static const char *const names[] = {"error", "warn", "info", "debug"};
    if (s == NULL)
        return -1;
    for (int i = 0; i < 4; i++)
        if (strcasecmp(s, names[i]) == 0)
            return i;
    if (strcasecmp(s, "warning") == 0)
        return GB_LOG_WARN;
    if (s[0] >= '0' && s[0] <= '3' && s[1] == '\0')
        return s[0] - '0';
    return -1;
}

int gb_log_level(void) {
    int l = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (l >= 0)
        return l;
    l = gb_log_parse_level(getenv("GPULAUNCH_LOG_LEVEL"));
    if (l < 0)
        l = GB_LOG_WARN;
    atomic_store(&log_level, l);
    return l;
}

void gb_log_set_level(int level) {
    if (level < GB_LOG_ERROR)
        level = GB_LOG_ERROR;
    if (level > GB_LOG_DEBUG)
        level = GB_LOG_DEBUG;
    atomic_store(&log_level, level);
}

void gb_log_set_fd(int fd) { atomic_store(&log_fd, fd); }

void gb_log_write(int level, const char *component, const char *fmt, ...) {
    static const char tag[] = "EWID";
    char line[GB_LOG_LINE_MAX];
    int saved = errno;
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %d %s %c ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (int)(tv.tv_usec / 1000), (int)getpid(), component,
                     tag[level < 0   ? 0
                         : level > 3 ? 3
                                     : level]);
    if (n < 0)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2) {
        len = sizeof line - 2;
        memcpy(line + len - 3, "...", 3);
    }
    line[len++] = '\n';
    /* One write: lines of concurrent processes never interleave mid-line. */
    ssize_t w;
    do
        w = write(atomic_load(&log_fd), line, len);
    while (w < 0 && errno == EINTR);
    errno = saved;
}
