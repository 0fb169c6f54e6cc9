/* The job page in headless Chromium (Debian's package, scripts/deps.sh), for
 * the tests that check it: the browser's path, a DOM dump after the page's
 * scripts ran, and the page's width drawn in a 1280 px frame. Each runs
 * Chromium through `run` (a shell command line and a timeout in ms, its wait
 * status back): a test whose own loop serves the page's server pumps it
 * meanwhile. */
#ifndef GPULAUNCH_TEST_BROWSER_H
#define GPULAUNCH_TEST_BROWSER_H

#include <stddef.h>

typedef int (*browser_run_fn)(const char *cmd, int timeout_ms);

/* Flags every headless run takes. */
#define BROWSER_FLAGS                                                                              \
    "--headless --no-sandbox --disable-gpu --no-first-run --disable-dev-shm-usage "                \
    "--virtual-time-budget=4000"

/* A file's bytes, NUL-terminated (malloc'd; "" when it cannot be read). */
char *browser_slurp(const char *path);
/* Chromium's path, NULL when it is not installed. */
const char *browser_path(void);
/* Runs cmd with sh, at most timeout_ms, calling idle (NULL: sleeping) about
 * every 20 ms meanwhile: its wait status, -1 when killed. */
int browser_run_idle(const char *cmd, int timeout_ms, void (*idle)(void));
/* browser_run_idle without an idle function. */
int browser_run_plain(const char *cmd, int timeout_ms);
/* The DOM of http://127.0.0.1:http_port/#job=JOB after its scripts ran
 * (malloc'd, "" on failure; *status: the browser's wait status). dir: a
 * scratch directory (its profile and logs). */
char *browser_dom(const char *dir, int http_port, const char *job, browser_run_fn run, int *status);
/* The page of job drawn in a 1280 px frame: the content's scroll width and
 * the frame's client width, and whether element drawn_id was there. 0, or -1
 * with the frame's DOM in why. */
int browser_width_1280(const char *dir, int http_port, const char *job, const char *drawn_id,
                       browser_run_fn run, unsigned *scroll_w, unsigned *client_w, int *drawn,
                       char *why, size_t len);

#endif
