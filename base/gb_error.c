/* The error table (names and messages) and the last-error buffer. */
#include "gb_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *gpl_result_name(gpl_result_t r) {
    switch (r) {
#define GPL_RESULT_NAME_(name, value, msg)                                                         \
    case name:                                                                                     \
        return #name;
        GPL_RESULTS(GPL_RESULT_NAME_)
#undef GPL_RESULT_NAME_
    }
    return "GPL_ERR_UNKNOWN";
}

const char *gpl_strerror(gpl_result_t r) {
    switch (r) {
#define GPL_RESULT_MSG_(name, value, msg)                                                          \
    case name:                                                                                     \
        return msg;
        GPL_RESULTS(GPL_RESULT_MSG_)
#undef GPL_RESULT_MSG_
    }
    return "unknown error";
}

gpl_result_t gb_seterr(gb_err *e, gpl_result_t code, const char *fmt, ...) {
    if (e == NULL || e->code != GPL_OK || code == GPL_OK)
        return code;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return code;
}

void gb_clearerr(gb_err *e) {
    if (e == NULL)
        return;
    e->code = GPL_OK;
    e->msg[0] = '\0';
}

const char *gb_errmsg(const gb_err *e) {
    if (e == NULL)
        return "";
    return e->msg[0] ? e->msg : gpl_strerror(e->code);
}
