/* A worker's error file (TORCHELASTIC_ERROR_FILE): what torch.distributed's
 * @record, or any program, wrote about its failure, read back for the
 * failure report as a message and a traceback instead of raw JSON. */
#ifndef GPULAUNCH_GL_ERRFILE_H
#define GPULAUNCH_GL_ERRFILE_H

#include <stddef.h>

#define GL_ERRFILE_MAX (1 << 20) /* bytes of an error file read; a larger one is not parsed */

typedef struct gl_errfile {
    char message[1024]; /* "FileNotFoundError: ...", or "" */
    char trace[8192];   /* the Python traceback, lines with their newlines, or "" */
    char raw[1024];     /* the file's start when it is not the expected JSON */
} gl_errfile;

/* 0 when path could be read (ef filled: message and trace from the JSON that
 * @record writes, {"message": {"message": M, "extraInfo": {"py_callstack": T}}}
 * or {"message": M}; otherwise the raw text), -1 when there is no such file. */
int gl_errfile_read(const char *path, gl_errfile *ef);

#endif
