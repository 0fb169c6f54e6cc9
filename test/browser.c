/* The job page in headless Chromium (see browser.h). */
#include "browser.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

const char *browser_path(void) {
    static const char *const paths[] = {"/usr/bin/chromium", "/usr/bin/chromium-browser"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if (access(paths[i], X_OK) == 0)
            return paths[i];
    return NULL;
}

int browser_run_plain(const char *cmd, int timeout_ms) {
    return browser_run_idle(cmd, timeout_ms, NULL);
}

int browser_run_idle(const char *cmd, int timeout_ms, void (*idle)(void)) {
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    int st = -1;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        if (idle)
            idle();
        else
            usleep(20000);
    }
    return st;
}

char *browser_slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = calloc(1, n > 0 ? (size_t)n + 1 : 1);
    if (p && n > 0 && fread(p, 1, (size_t)n, f) != (size_t)n)
        p[0] = 0;
    fclose(f);
    return p ? p : strdup("");
}

char *browser_dom(const char *dir, int http_port, const char *job, browser_run_fn run,
                  int *status) {
    const char *b = browser_path();
    char cmd[2048], path[512];
    snprintf(path, sizeof path, "%s/%s.html", dir, job);
    snprintf(cmd, sizeof cmd,
             "timeout 60 %s " BROWSER_FLAGS " --user-data-dir=%s/profile --dump-dom "
             "'http://127.0.0.1:%d/#job=%s' >%s 2>>%s/chromium.log",
             b ? b : "false", dir, http_port, job, path, dir);
    int st = run(cmd, 70000);
    if (status)
        *status = st;
    return browser_slurp(path);
}

int browser_width_1280(const char *dir, int http_port, const char *job, const char *drawn_id,
                       browser_run_fn run, unsigned *scroll_w, unsigned *client_w, int *drawn,
                       char *why, size_t len) {
    /* the page, fetched by a local file, drawn in a 1280 px frame of that
     * file's own (srcdoc, its base the server) and measured there; reading
     * the server from a file needs --disable-web-security, with the test's
     * own profile */
    const char *b = browser_path();
    char path[512], cmd[2048];
    snprintf(path, sizeof path, "%s/frame-%s.html", dir, job);
    FILE *fr = fopen(path, "w");
    if (fr == NULL) {
        snprintf(why, len, "cannot write %s", path);
        return -1;
    }
    fprintf(fr,
            "<!doctype html><body style=\"margin:0\"><iframe id=\"f\" style=\"width:1280px;"
            "height:900px;border:0\"></iframe><script>\n"
            "const srv = 'http://127.0.0.1:%d/', f = document.getElementById('f');\n"
            "const say = w => document.body.setAttribute('data-width', w);\n"
            "const measure = () => { const d = f.contentDocument.documentElement;\n"
            "  say(d.scrollWidth + ' ' + d.clientWidth + ' ' +\n"
            "      (f.contentDocument.getElementById('%s') ? 'drawn' : 'empty')); };\n"
            "fetch(srv).then(r => r.text()).then(t => {\n"
            "  f.onload = () => { f.onload = null; f.contentWindow.location.hash = 'job=%s';\n"
            "    setTimeout(measure, 2500); };\n"
            "  f.srcdoc = t.replace('<head>', '<head><base href=\"' + srv + '\">'); })\n"
            "  .catch(e => say('error ' + e));\n"
            "</script></body>\n",
            http_port, drawn_id, job);
    fclose(fr);
    snprintf(cmd, sizeof cmd,
             "timeout 60 %s " BROWSER_FLAGS " --disable-web-security --user-data-dir=%s/profile "
             "--dump-dom 'file://%s' >%s/frame.dom 2>>%s/chromium.log",
             b ? b : "false", dir, path, dir, dir);
    run(cmd, 70000);
    snprintf(path, sizeof path, "%s/frame.dom", dir);
    char *dom = browser_slurp(path);
    const char *dw = strstr(dom, "data-width=\"");
    char word[16] = "";
    int rc = dw && sscanf(dw + 12, "%u %u %15[a-z]", scroll_w, client_w, word) == 3 ? 0 : -1;
    *drawn = strcmp(word, "drawn") == 0;
    if (rc)
        snprintf(why, len, "%.2000s", dom);
    free(dom);
    return rc;
}
