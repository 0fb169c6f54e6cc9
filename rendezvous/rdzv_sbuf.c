/* The HTTP side's text buffer (rdzv_sbuf.h). */
#include "rdzv_sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (q == NULL) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

void sb_json_str(sbuf *b, const char *s) {
    sb_printf(b, "\"");
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            sb_printf(b, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            sb_printf(b, "\\u%04x", ch);
        else
            sb_printf(b, "%c", ch);
    }
    sb_printf(b, "\"");
}

void sb_label(sbuf *b, const char *s) {
    sb_printf(b, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            sb_printf(b, "\\%c", *s);
        else if (*s == '\n')
            sb_printf(b, "\\n");
        else
            sb_printf(b, "%c", *s);
    }
    sb_printf(b, "\"");
}
