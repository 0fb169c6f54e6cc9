/* Internal error plumbing: the last-error buffer convention.
 *
 * Every fallible internal call returns a gpl_result_t and, when it fails,
 * writes a message that says what failed, where and what to do into a
 * gb_err the caller owns (a handle keeps one as its last error). The first
 * error recorded wins: cleanup paths may record more without hiding the cause. */
#ifndef GPULAUNCH_GB_ERROR_H
#define GPULAUNCH_GB_ERROR_H

#include <stddef.h>

#include "gpulaunch/gpl_error.h"

#define GB_ERRMSG_MAX 512 /* bytes of one error message, NUL included */

typedef struct gb_err {
    gpl_result_t code;
    char msg[GB_ERRMSG_MAX];
} gb_err;

#define GB_ERR_INIT                                                                                \
    {                                                                                              \
        GPL_OK, { 0 }                                                                              \
    }

/* Records code and the formatted message in e unless e already holds an
 * error. Returns code so that `return gb_seterr(e, ...)` reads naturally.
 * e may be NULL. */
gpl_result_t gb_seterr(gb_err *e, gpl_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Forgets a recorded error. */
void gb_clearerr(gb_err *e);

/* The message to show: e->msg when set, else the generic text of e->code. */
const char *gb_errmsg(const gb_err *e);

/* Jump to `out` with rc set when call fails (the goto-out cleanup idiom). */
#define GB_CHECK_GOTO(call, rc, label)                                                             \
    do {                                                                                           \
        (rc) = (call);                                                                             \
        if ((rc) != GPL_OK)                                                                        \
            goto label;                                                                            \
    } while (0)

#endif
