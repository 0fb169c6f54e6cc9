/* Logging: one whole line per write(2), with UTC millisecond timestamp, pid,
 * component and level. The level comes from GPULAUNCH_LOG_LEVEL
 * (error|warn|info|debug, default warn). Arguments are not evaluated below the
 * active level. Each .c file defines GB_COMPONENT before using the macros. */
#ifndef GPULAUNCH_GB_LOG_H
#define GPULAUNCH_GB_LOG_H

enum gb_log_level { GB_LOG_ERROR = 0, GB_LOG_WARN = 1, GB_LOG_INFO = 2, GB_LOG_DEBUG = 3 };

#define GB_LOG_LINE_MAX 2048 /* bytes of one log line; longer ones are cut with "..." */

/* The active level, read from the environment on first use. */
int gb_log_level(void);
/* Overrides the level (tests, --log-level options). */
void gb_log_set_level(int level);
/* Parses "error", "warn", "info", "debug" (or 0-3); -1 when s is none of them. */
int gb_log_parse_level(const char *s);
/* Redirects log lines to fd (default 2). */
void gb_log_set_fd(int fd);

void gb_log_write(int level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define GB_LOG(level, ...)                                                                         \
    do {                                                                                           \
        if ((level) <= gb_log_level())                                                             \
            gb_log_write((level), GB_COMPONENT, __VA_ARGS__);                                      \
    } while (0)
#define GB_ERROR(...) GB_LOG(GB_LOG_ERROR, __VA_ARGS__)
#define GB_WARN(...) GB_LOG(GB_LOG_WARN, __VA_ARGS__)
#define GB_INFO(...) GB_LOG(GB_LOG_INFO, __VA_ARGS__)
#define GB_DEBUG(...) GB_LOG(GB_LOG_DEBUG, __VA_ARGS__)

#endif
