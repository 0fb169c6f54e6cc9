/* Test helpers: see harness.h. */
#include "harness.h"
#include "browser.h"

#include <dirent.h>
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int proc_start(proc *p, char *const argv[], char *const envp[]) {
    memset(p, 0, sizeof *p);
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return -1;
    p->pid = fork();
    if (p->pid < 0)
        return -1;
    if (p->pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        setpgid(0, 0);
        execve(argv[0], argv, envp ? envp : environ);
        _exit(127);
    }
    close(fds[1]);
    p->out_fd = fds[0];
    return 0;
}

int proc_expect(proc *p, const char *needle, int timeout_ms) {
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        p->out[p->out_len] = '\0';
        if (strstr(p->out, needle))
            return 1;
        uint64_t now = now_ms();
        if (now >= deadline)
            return 0;
        struct pollfd pfd = {.fd = p->out_fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)(deadline - now)) <= 0)
            return 0;
        ssize_t r = read(p->out_fd, p->out + p->out_len, sizeof p->out - 1 - p->out_len);
        if (r <= 0) {
            p->out[p->out_len] = '\0';
            return strstr(p->out, needle) != NULL;
        }
        p->out_len += (size_t)r;
        if (p->out_len >= sizeof p->out - 1) { /* keep the tail */
            memmove(p->out, p->out + sizeof p->out / 2, p->out_len - sizeof p->out / 2);
            p->out_len -= sizeof p->out / 2;
        }
    }
}

int proc_wait(proc *p, int timeout_ms) {
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    int st;
    for (;;) {
        /* keep draining the output so the child never blocks on a full pipe */
        proc_expect(p, "\x01never\x01", 20);
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid) {
            proc_expect(p, "\x01never\x01", 50);
            close(p->out_fd);
            p->pid = 0;
            return st;
        }
        if (now_ms() >= deadline) {
            kill(-p->pid, SIGKILL);
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &st, 0);
            close(p->out_fd);
            p->pid = 0;
            return -1;
        }
    }
}

void proc_kill(proc *p, int sig) {
    if (p->pid > 0)
        kill(p->pid, sig);
}

int rdzv_start(proc *p, int *port, const char *const *extra) {
    char *argv[32];
    int n = 0;
    argv[n++] = GPL_BUILD_DIR "/rendezvous/gpulaunch-rdzv";
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    for (int i = 0; extra && extra[i] && n < 30; i++)
        argv[n++] = (char *)extra[i];
    argv[n] = NULL;
    if (proc_start(p, argv, NULL) != 0)
        return -1;
    if (!proc_expect(p, "listening on 127.0.0.1:", 5000))
        return -1;
    const char *s = strstr(p->out, "listening on 127.0.0.1:");
    *port = (int)strtol(s + strlen("listening on 127.0.0.1:"), NULL, 10);
    return 0;
}

int peer_open(peer *p, int port, const char *token) {
    memset(p, 0, sizeof *p);
    char err[256];
    if (rdzv_bclient_connect("127.0.0.1", port, token, token ? strlen(token) : 0, 3000, &p->bc, err,
                             sizeof err) != GPL_OK)
        return -1;
    p->fd = rdzv_bclient_fd(p->bc);
    return 0;
}

void peer_close(peer *p) {
    if (p->bc)
        rdzv_bclient_close(p->bc);
    p->bc = NULL;
}

int peer_send(peer *p, const rdzv_msg *m) {
    rdzv_buf b;
    rdzv_buf_init(&b, RDZV_MAX_FRAME + 4);
    if (rdzv_encode(m, &b) != GPL_OK)
        return -1;
    size_t len = b.len;
    ssize_t w = send(p->fd, b.data, len, MSG_NOSIGNAL);
    rdzv_buf_free(&b);
    return w == (ssize_t)len ? 0 : -1;
}

int peer_recv(peer *p, int timeout_ms) {
    if (p->consumed) {
        memmove(p->buf, p->buf + p->consumed, p->len - p->consumed);
        p->len -= p->consumed;
        p->consumed = 0;
    }
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        size_t flen;
        if (rdzv_frame_peek(p->buf, p->len, &flen) == GPL_OK) {
            if (rdzv_decode(p->buf, flen, &p->last, NULL, 0) != GPL_OK)
                return -1;
            p->consumed = flen;
            return 0;
        }
        uint64_t now = now_ms();
        if (now >= deadline)
            return -1;
        struct pollfd pfd = {.fd = p->fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)(deadline - now)) <= 0)
            return -1;
        ssize_t r = recv(p->fd, p->buf + p->len, sizeof p->buf - p->len, 0);
        if (r <= 0)
            return -1;
        p->len += (size_t)r;
    }
}

int peer_recv_type(peer *p, uint16_t type, int timeout_ms) {
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        uint64_t now = now_ms();
        if (now >= deadline)
            return -1;
        if (peer_recv(p, (int)(deadline - now)) != 0)
            return -1;
        if (p->last.type == type)
            return 0;
    }
}

int peer_join(peer *p, const char *run, const char *host, int static_rank, uint32_t nproc,
              uint32_t min, uint32_t max, uint32_t last_call_ms) {
    rdzv_msg m = {.type = RDZV_JOIN, .req_id = 77};
    snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "%s", run);
    snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "%s", host);
    snprintf(m.u.join.addr, sizeof m.u.join.addr, "10.0.0.%d", static_rank + 10);
    snprintf(m.u.join.instance, sizeof m.u.join.instance, "%s-i", host);
    m.u.join.master_port = (uint16_t)(30000 + (static_rank < 0 ? 0 : static_rank));
    m.u.join.nproc = nproc;
    m.u.join.static_rank = static_rank;
    m.u.join.min_nodes = min;
    m.u.join.max_nodes = max;
    m.u.join.last_call_ms = last_call_ms;
    m.u.join.join_timeout_ms = 60000;
    return peer_send(p, &m);
}

int rdzv_stop_with_peers(proc *srv, peer *peers, int n) {
    for (int i = 0; i < n; i++)
        peer_close(&peers[i]);
    proc_kill(srv, SIGTERM);
    return proc_wait(srv, 5000);
}

int raw_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int fd_closed_within(int fd, int ms, size_t *read) {
    uint64_t t0 = now_ms();
    char b[4096];
    size_t total = 0;
    int closed = 0;
    do {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 10) > 0) {
            ssize_t r = recv(fd, b, sizeof b, 0);
            if (r <= 0) {
                closed = 1;
                break;
            }
            total += (size_t)r;
        }
    } while (now_ms() - t0 < (uint64_t)ms);
    if (read)
        *read = total;
    return closed;
}

int free_tcp_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t l = sizeof sa;
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &l) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* The Markdown files of docs/ in the source tree in one string, read once
 * a process (a test looks metrics up many times); NULL when unread. */
static const char *docs_text(void) {
    static char *all;
    if (all)
        return all;
    DIR *d = opendir(GPL_SOURCE_DIR "/docs");
    if (d == NULL)
        return NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l < 4 || strcmp(e->d_name + l - 3, ".md") != 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/docs/%s", GPL_SOURCE_DIR, e->d_name);
        char *t = browser_slurp(path);
        size_t tl = t ? strlen(t) : 0;
        char *p = t ? realloc(all, n + tl + 1) : NULL;
        if (p) {
            memcpy(p + n, t, tl + 1);
            all = p;
            n += tl;
        }
        free(t);
    }
    closedir(d);
    return all;
}

int prom_documented(const char *text, char *why, size_t len) {
    const char *docs = docs_text();
    if (docs == NULL) {
        snprintf(why, len, "could not read %s/docs", GPL_SOURCE_DIR);
        return -1;
    }
    size_t w = 0;
    why[0] = 0;
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, "# HELP ", 7) != 0)
            continue;
        char name[128], a[140], b[140];
        size_t k = 0;
        for (const char *c = l + 7; *c && *c != ' ' && *c != '\n' && k + 1 < sizeof name; c++)
            name[k++] = *c;
        name[k] = 0;
        snprintf(a, sizeof a, "`%s`", name);
        snprintf(b, sizeof b, "`%s{", name);
        if (strstr(docs, a) == NULL && strstr(docs, b) == NULL && w + 1 < len)
            w += (size_t)snprintf(why + w, len - w, "%s%s", w ? ", " : "", name);
        if (w >= len)
            w = len - 1;
    }
    return why[0] ? -1 : 0;
}

void tmpdir_make(char *buf, size_t len, const char *prefix) {
    snprintf(buf, len, "/tmp/%s-XXXXXX", prefix);
    if (mkdtemp(buf) == NULL)
        buf[0] = '\0';
}

static void (*skip_fini)(void);

void skip_cleanup(void (*fini)(void)) { skip_fini = fini; }

void skip_cleanup_run(void) {
    void (*fini)(void) = skip_fini;
    skip_fini = NULL;
    if (fini)
        fini();
}

void tmpdir_remove(const char *dir) {
    if (dir[0] == '\0' || strncmp(dir, "/tmp/", 5) != 0)
        return;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

int proc_ignores(pid_t pid, int sig) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    unsigned long long mask = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "SigIgn:", 7) == 0)
            mask = strtoull(line + 7, NULL, 16);
    fclose(f);
    return (int)((mask >> (sig - 1)) & 1);
}

long proc_read_long(pid_t pid, const char *file, const char *fmt) {
    char path[96], line[256];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
    FILE *f = fopen(path, "r");
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, fmt, &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

static int read_floats(const char *path, float *out, int max) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    int n = (int)fread(out, sizeof(float), (size_t)max, f);
    fclose(f);
    return n;
}

double params_worst_rel_diff(const char *a, const char *b, int *n) {
    static float xa[1 << 16], xb[1 << 16];
    int na = read_floats(a, xa, 1 << 16), nb = read_floats(b, xb, 1 << 16);
    *n = na;
    if (na < 100 || na != nb)
        return -1;
    double worst = 0;
    for (int i = 0; i < na; i++) {
        double rel = fabs((double)xa[i] - xb[i]) / (fabs((double)xa[i]) + 1e-3);
        if (rel > worst)
            worst = rel;
    }
    return worst;
}

static const char *either(const char *a, const char *b, const char *pat) {
    const char *s = a ? strstr(a, pat) : NULL;
    return s ? s : b ? strstr(b, pat) : NULL;
}

int params_sha_lines(const char *a, const char *b, char sha[][65], int n) {
    int found = 0;
    for (int r = 0; r < n; r++) {
        char pat[64];
        snprintf(pat, sizeof pat, "rank %d params_sha256 ", r);
        const char *s = either(a, b, pat);
        if (s) {
            snprintf(sha[r], 65, "%.64s", s + strlen(pat));
            found++;
        }
    }
    return found;
}

long preempted_step_line(const char *a, const char *b, int rank) {
    char pat[64];
    snprintf(pat, sizeof pat, "rank %d preempted after step ", rank);
    const char *s = either(a, b, pat);
    return s ? strtol(s + strlen(pat), NULL, 10) : -1;
}

/* Whether the NUL-separated environment env[0..n) holds the entry e. */
static int env_has(const char *env, size_t n, const char *e) {
    for (size_t i = 0; i < n; i += strlen(env + i) + 1)
        if (strcmp(env + i, e) == 0)
            return 1;
    return 0;
}

pid_t proc_find(pid_t parent, const char *a, const char *b) {
    DIR *d = opendir("/proc");
    pid_t found = 0;
    struct dirent *e;
    while (d && found == 0 && (e = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        char path[64];
        if (parent > 0) {
            snprintf(path, sizeof path, "/proc/%ld/stat", pid);
            FILE *f = fopen(path, "r");
            int ppid = 0;
            if (f == NULL)
                continue;
            if (fscanf(f, "%*d (%*[^)]) %*c %d", &ppid) != 1)
                ppid = 0;
            fclose(f);
            if (ppid != parent)
                continue;
        }
        snprintf(path, sizeof path, "/proc/%ld/environ", pid);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        static char env[1 << 16];
        size_t n = fread(env, 1, sizeof env - 1, f);
        fclose(f);
        env[n] = '\0';
        if (env_has(env, n, a) && (b == NULL || env_has(env, n, b)))
            found = (pid_t)pid;
    }
    if (d)
        closedir(d);
    return found;
}

/* One pass over the lines, the families seen in a table (see harness.h). */
int prom_check(const char *text, char *why, size_t len) {
    enum { MAXF = 512 };
    static char fam[MAXF][128], series[4096][256];
    static int typed[MAXF], helped[MAXF], sampled[MAXF], hist[MAXF]; /* hist: 1 histogram,
                                                                         2 summary */
    int nf = 0, ns = 0, cur = -1, bad = 0;
    char line[1024] = "";
    for (const char *l = text; *l && !bad;) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l);
        char name[128];
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), l);
        l = e ? e + 1 : l + n;
        const char *p = line;
        int help = strncmp(p, "# HELP ", 7) == 0, type = strncmp(p, "# TYPE ", 7) == 0;
        if (line[0] == '#' && !help && !type)
            continue; /* a comment */
        if (help || type)
            p += 7;
        size_t k = 0;
        while ((p[k] >= 'a' && p[k] <= 'z') || (p[k] >= 'A' && p[k] <= 'Z') || p[k] == '_' ||
               p[k] == ':' || (k && p[k] >= '0' && p[k] <= '9'))
            k++;
        if (k == 0 || k >= sizeof name) {
            bad = 1;
            break;
        }
        snprintf(name, sizeof name, "%.*s", (int)k, p);
        p += k;
        if (!help && !type) { /* a histogram's or summary's samples belong to its family */
            static const char *const sfx[] = {"_bucket", "_sum", "_count"};
            for (size_t x = 0; x < 3; x++) {
                size_t nl = strlen(name), sl = strlen(sfx[x]);
                if (nl <= sl || strcmp(name + nl - sl, sfx[x]) != 0)
                    continue;
                for (int g = 0; g < nf; g++)
                    if (strlen(fam[g]) == nl - sl && strncmp(fam[g], name, nl - sl) == 0 &&
                        (hist[g] == 1 || (hist[g] == 2 && x > 0)))
                        name[nl - sl] = '\0';
            }
        }
        int f = 0;
        while (f < nf && strcmp(fam[f], name) != 0)
            f++;
        if (f == nf) {
            if (nf == MAXF) {
                bad = 1;
                break;
            }
            snprintf(fam[nf], sizeof fam[nf], "%s", name);
            typed[nf] = helped[nf] = sampled[nf] = hist[nf] = 0;
            nf++;
        }
        if (help || type) {
            int *seen = help ? &helped[f] : &typed[f];
            bad = *seen || sampled[f] || *p != ' ' ||
                  (type && strcmp(p + 1, "gauge") && strcmp(p + 1, "counter") &&
                   strcmp(p + 1, "untyped") && strcmp(p + 1, "summary") &&
                   strcmp(p + 1, "histogram"));
            *seen = 1;
            if (type)
                hist[f] = strcmp(p + 1, "histogram") == 0 ? 1
                          : strcmp(p + 1, "summary") == 0 ? 2
                                                          : 0;
            continue;
        }
        bad = !typed[f] || (sampled[f] && cur != f);
        sampled[f] = 1;
        cur = f;
        if (*p == '{') {
            p++;
            while (!bad && *p != '}') {
                size_t q = 0;
                while ((p[q] >= 'a' && p[q] <= 'z') || (p[q] >= 'A' && p[q] <= 'Z') ||
                       p[q] == '_' || (q && p[q] >= '0' && p[q] <= '9'))
                    q++;
                if (q == 0 || p[q] != '=' || p[q + 1] != '"') {
                    bad = 1;
                    break;
                }
                p += q + 2;
                while (*p && *p != '"')
                    p += *p == '\\' && p[1] ? 2 : 1;
                if (*p != '"') {
                    bad = 1;
                    break;
                }
                p++;
                if (*p == ',')
                    p++;
                else if (*p != '}')
                    bad = 1;
            }
            if (bad)
                break;
            p++;
        }
        size_t slen = (size_t)(p - line);
        for (int i = 0; i < ns && !bad; i++)
            bad = strlen(series[i]) == slen && strncmp(series[i], line, slen) == 0;
        if (ns < 4096)
            snprintf(series[ns++], sizeof series[0], "%.*s", (int)slen, line);
        char *end = (char *)p;
        if (!bad && *p == ' ')
            strtod(p + 1, &end);
        bad = bad || end == p || end == p + 1 || *end != '\0';
    }
    if (bad)
        snprintf(why, len, "not promtool-clean at: %s", line);
    return bad ? -1 : 0;
}

int http_get_local(int port, const char *path, char *out, size_t len) {
    out[0] = 0;
    int fd = raw_connect(port);
    if (fd < 0)
        return 0;
    struct timeval tv = {.tv_sec = 3};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char req[300];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\n\r\n", path);
    size_t got = 0;
    if (write(fd, req, (size_t)n) == n) {
        ssize_t r;
        while (got < len - 1 && (r = read(fd, out + got, len - 1 - got)) > 0)
            got += (size_t)r;
    }
    close(fd);
    out[got] = 0;
    int code = 0;
    if (sscanf(out, "HTTP/%*s %d", &code) != 1)
        return 0;
    char *body = strstr(out, "\r\n\r\n");
    if (body)
        memmove(out, body + 4, strlen(body + 4) + 1);
    return code;
}

double prom_value(const char *text, const char *name) {
    size_t nl = strlen(name);
    for (const char *p = text; (p = strstr(p, name)) != NULL; p += nl)
        if ((p == text || p[-1] == '\n') && p[nl] == ' ')
            return strtod(p + nl + 1, NULL);
    return -1;
}
