/* A growable text buffer for the HTTP side's documents (/metrics, /status). */
#ifndef GPULAUNCH_RDZV_SBUF_H
#define GPULAUNCH_RDZV_SBUF_H

#include <stddef.h>

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom; /* an allocation failed: the document is dropped */
} sbuf;

void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as a JSON string, quotes included. */
void sb_json_str(sbuf *b, const char *s);
/* s as a Prometheus label value, quotes included. */
void sb_label(sbuf *b, const char *s);

#endif
