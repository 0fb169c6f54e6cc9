/* A worker's error file (see gl_errfile.h), parsed with jansson. */
#include "gl_errfile.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static void copy(char *dst, size_t len, const char *src) {
    snprintf(dst, len, "%s", src ? src : "");
}

int gl_errfile_read(const char *path, gl_errfile *ef) {
    memset(ef, 0, sizeof *ef);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    size_t n = fread(ef->raw, 1, sizeof ef->raw - 1, f);
    ef->raw[n] = '\0';
    struct stat st;
    int big = fstat(fileno(f), &st) != 0 || st.st_size > GL_ERRFILE_MAX;
    fclose(f);
    if (big)
        return 0; /* its start is shown */
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return 0; /* not JSON: the raw text is shown */
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
