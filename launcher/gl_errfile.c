/* A worker's error file (see gl_errfile.h), parsed with jansson. */
#include "gl_errfile.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void copy(char *dst, size_t len, const char *src) {
    snprintf(dst, len, "%s", src ? src : "");
}

int gl_errfile_read(const char *path, gl_errfile *ef) {
    memset(ef, 0, sizeof *ef);
    /* a regular file only: another user's FIFO or link at the path must not
     * hang or mislead the failure report */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -1;
    }
    size_t cap = st.st_size > GL_ERRFILE_MAX ? sizeof ef->raw - 1 : (size_t)st.st_size;
    char *buf = malloc(cap + 1);
    size_t n = 0;
    while (buf && n < cap) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (buf == NULL)
        return -1;
    buf[n] = '\0';
    copy(ef->raw, sizeof ef->raw, buf);
    json_error_t jerr;
    json_t *root =
        st.st_size > GL_ERRFILE_MAX ? NULL : json_loadb(buf, n, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    if (root == NULL)
        return 0; /* not JSON, or too large: its start is shown */
    json_t *m = json_object_get(root, "message");
    if (json_is_string(m)) {
        copy(ef->message, sizeof ef->message, json_string_value(m));
    } else if (json_is_object(m)) {
        copy(ef->message, sizeof ef->message, json_string_value(json_object_get(m, "message")));
        json_t *extra = json_object_get(m, "extraInfo");
        copy(ef->trace, sizeof ef->trace,
             json_string_value(json_object_get(extra, "py_callstack")));
    }
    json_decref(root);
    if (ef->message[0] || ef->trace[0])
        ef->raw[0] = '\0';
    return 0;
}
