/* Slurm's hostlist syntax and the SLURM_* variables of an srun job step
 * (see gl_slurm.h, docs/slurm.md). A list is checked whole before any host
 * is given out, so that a malformed tail never passes unnoticed behind a
 * good first host. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gl_slurm.h"

/* One "lo[-hi]" inside brackets; width is the digits of lo (zero padding). */
typedef struct range {
    unsigned long lo, hi;
    int width;
} range;

typedef struct walk {
    gl_hostlist_cb cb;
    void *data;
    long index;
    int stopped;
} walk;

static int name_char(char c) {
    /* anything printable but the syntax's own characters and spaces */
    return c > 0x20 && c < 0x7f && c != '[' && c != ']' && c != ',';
}

/* Reads digits at *p into *v; the count of digits, or -1 (none, too many). */
static int read_number(const char **p, unsigned long *v) {
    int n = 0;
    unsigned long x = 0;
    while (**p >= '0' && **p <= '9') {
        if (++n > GL_HOSTLIST_MAX_DIGITS)
            return -1;
        x = x * 10 + (unsigned long)(**p - '0');
        (*p)++;
    }
    if (n == 0)
        return -1;
    *v = x;
    return n;
}

/* Parses the range at *p (just after '[' or ','), leaving *p on the ',' or
 * ']' that ends it. 0, or -1 with err naming the offset in list. */
static int read_range(const char *list, const char **p, range *r, char *err, size_t errlen) {
    const char *start = *p;
    int w = read_number(p, &r->lo);
    if (w < 0)
        goto bad;
    r->width = w;
    r->hi = r->lo;
    if (**p == '-') {
        (*p)++;
        if (read_number(p, &r->hi) < 0)
            goto bad;
    }
    if (**p != ',' && **p != ']')
        goto bad;
    if (r->hi < r->lo) {
        snprintf(err, errlen,
                 "hostlist '%.64s': range '%.*s' at offset %ld goes down (%lu > %lu); write "
                 "it low-high",
                 list, (int)(*p - start), start, (long)(start - list), r->lo, r->hi);
        return -1;
    }
    return 0;
bad:
    snprintf(err, errlen,
             "hostlist '%.64s': malformed range at offset %ld: expected N or N-M with at most %d "
             "digits each, then ',' or ']'",
             list, (long)(start - list), GL_HOSTLIST_MAX_DIGITS);
    return -1;
}

static int decimal_width(unsigned long v) {
    int w = 1;
    while (v >= 10) {
        v /= 10;
        w++;
    }
    return w;
}

/* Checks one entry [s, e) of list: its characters, its groups, the length
 * of its longest name; adds its host count to *total. 0 or -1. */
static int check_entry(const char *list, const char *s, const char *e, long *total, char *err,
                       size_t errlen) {
    if (s == e) {
        snprintf(err, errlen,
                 "hostlist '%.64s': empty host name at offset %ld (two commas, or a comma at "
                 "an end)",
                 list, (long)(s - list));
        return -1;
    }
    long hosts = 1;
    size_t longest = 0;
    int groups = 0;
    for (const char *p = s; p < e;) {
        if (*p != '[') {
            if (!name_char(*p)) {
                snprintf(err, errlen,
                         "hostlist '%.64s': character 0x%02x at offset %ld cannot be in a host "
                         "name",
                         list, (unsigned char)*p, (long)(p - list));
                return -1;
            }
            longest++;
            p++;
            continue;
        }
        if (++groups > GL_HOSTLIST_MAX_GROUPS) {
            snprintf(err, errlen,
                     "hostlist '%.64s': more than %d bracket groups in one name (offset %ld; "
                     "limit GL_HOSTLIST_MAX_GROUPS)",
                     list, GL_HOSTLIST_MAX_GROUPS, (long)(p - list));
            return -1;
        }
        long n = 0;
        int widest = 0;
        p++;
        for (;;) {
            range r;
            if (read_range(list, &p, &r, err, errlen) != 0)
                return -1;
            n += (long)(r.hi - r.lo + 1);
            int w = decimal_width(r.hi) > r.width ? decimal_width(r.hi) : r.width;
            if (w > widest)
                widest = w;
            if (n > GL_HOSTLIST_MAX_HOSTS)
                break;
            if (*p++ == ']')
                break;
        }
        if (n > GL_HOSTLIST_MAX_HOSTS || hosts > GL_HOSTLIST_MAX_HOSTS / n)
            goto too_many;
        longest += (size_t)widest;
        hosts *= n;
    }
    if (longest > GL_HOSTLIST_MAX_NAME) {
        snprintf(err, errlen,
                 "hostlist '%.64s': a host name of %zu bytes at offset %ld (limit %d, "
                 "GL_HOSTLIST_MAX_NAME)",
                 list, longest, (long)(s - list), GL_HOSTLIST_MAX_NAME);
        return -1;
    }
    *total += hosts;
    if (*total > GL_HOSTLIST_MAX_HOSTS)
        goto too_many;
    return 0;
too_many:
    snprintf(err, errlen,
             "hostlist '%.64s': expands to more than %d hosts (GL_HOSTLIST_MAX_HOSTS, the "
             "launcher's node limit)",
             list, GL_HOSTLIST_MAX_HOSTS);
    return -1;
}

/* Gives out the names of the checked entry [p, e) after the prefix already
 * in name[0, len): the literal up to the next group, then each number of
 * that group followed by the rest. Depth is bounded by the group limit. */
static void emit(const char *p, const char *e, char *name, size_t len, walk *w) {
    while (p < e && *p != '[' && !w->stopped)
        name[len++] = *p++;
    if (w->stopped)
        return;
    if (p == e) {
        name[len] = '\0';
        if (w->cb && w->cb(w->data, w->index, name) != 0)
            w->stopped = 1;
        w->index++;
        return;
    }
    const char *close = memchr(p, ']', (size_t)(e - p));
    const char *q = p + 1;
    while (q < close && !w->stopped) {
        range r;
        char unused[8];
        read_range(p, &q, &r, unused, sizeof unused); /* checked before */
        for (unsigned long v = r.lo; v <= r.hi && !w->stopped; v++) {
            int n = snprintf(name + len, GL_HOSTLIST_MAX_NAME + 1 - len, "%0*lu", r.width, v);
            emit(close + 1, e, name, len + (size_t)n, w);
        }
        q++; /* the ',' or ']' */
    }
}

long gl_hostlist_expand(const char *list, gl_hostlist_cb cb, void *data, char *err, size_t errlen) {
    if (list == NULL || list[0] == '\0') {
        snprintf(err, errlen, "hostlist is empty");
        return -1;
    }
    size_t len = strnlen(list, GL_HOSTLIST_MAX_LEN + 1);
    if (len > GL_HOSTLIST_MAX_LEN) {
        snprintf(err, errlen, "hostlist of more than %d bytes (GL_HOSTLIST_MAX_LEN)",
                 GL_HOSTLIST_MAX_LEN);
        return -1;
    }
    /* pass 1: brackets matched and not nested, every entry well formed */
    long total = 0;
    const char *s = list;
    int depth = 0;
    const char *open = NULL;
    for (const char *p = list;; p++) {
        if (*p == '[') {
            if (depth) {
                snprintf(err, errlen,
                         "hostlist '%.64s': '[' at offset %ld inside the group opened at offset "
                         "%ld (groups do not nest)",
                         list, (long)(p - list), (long)(open - list));
                return -1;
            }
            depth = 1;
            open = p;
        } else if (*p == ']') {
            if (!depth) {
                snprintf(err, errlen, "hostlist '%.64s': ']' at offset %ld closes no '['", list,
                         (long)(p - list));
                return -1;
            }
            depth = 0;
        } else if (*p == '\0' || (*p == ',' && !depth)) {
            if (depth) {
                snprintf(err, errlen,
                         "hostlist '%.64s': the '[' at offset %ld is never closed with ']'", list,
                         (long)(open - list));
                return -1;
            }
            if (check_entry(list, s, p, &total, err, errlen) != 0)
                return -1;
            if (*p == '\0')
                break;
            s = p + 1;
        }
    }
    /* pass 2: the hosts */
    walk w = {.cb = cb, .data = data};
    char name[GL_HOSTLIST_MAX_NAME + 1];
    s = list;
    for (const char *p = list; !w.stopped; p++) {
        if (*p == '[')
            depth = 1;
        else if (*p == ']')
            depth = 0;
        else if (*p == '\0' || (*p == ',' && !depth)) {
            emit(s, p, name, 0, &w);
            if (*p == '\0')
                break;
            s = p + 1;
        }
    }
    return total;
}

typedef struct nth {
    long n;
    char *out;
    size_t outlen;
    int found, fits;
} nth;

static int take_nth(void *data, long index, const char *host) {
    nth *t = data;
    if (index != t->n)
        return 0;
    t->found = 1;
    t->fits = snprintf(t->out, t->outlen, "%s", host) < (int)t->outlen;
    return 1;
}

int gl_hostlist_nth(const char *list, long n, char *out, size_t outlen, char *err, size_t errlen) {
    nth t = {.n = n, .out = out, .outlen = outlen};
    long total = gl_hostlist_expand(list, take_nth, &t, err, errlen);
    if (total < 0)
        return -1;
    if (!t.found) {
        snprintf(err, errlen, "hostlist '%.64s' has %ld hosts, not %ld", list, total, n + 1);
        return -1;
    }
    if (!t.fits) {
        snprintf(err, errlen, "hostlist '%.64s': host %ld does not fit in %zu bytes", list, n,
                 outlen);
        return -1;
    }
    return 0;
}

/* ---- the job step's variables ---- */

/* The first of names that is set and not empty; *which names it. */
static const char *first_var(gl_getenv_fn env, const char *const *names, const char **which) {
    for (int i = 0; names[i]; i++) {
        const char *v = env(names[i]);
        if (v && *v) {
            *which = names[i];
            return v;
        }
    }
    *which = names[0];
    return NULL;
}

static int parse_ulong(const char *s, unsigned long lo, unsigned long hi, unsigned long *out) {
    if (s[0] < '0' || s[0] > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int bad_var(char *err, size_t errlen, const char *name, const char *v, const char *want) {
    snprintf(err, errlen,
             "Slurm: %s='%.64s' is not %s (run gpulaunch with --slurm off to ignore SLURM_*)", name,
             v, want);
    return 2;
}

/* "0,1,3" -> 3; -1 when not a comma list of GPU indices. */
static long count_gpu_list(const char *s) {
    long n = 0;
    for (const char *p = s; *p;) {
        if (*p < '0' || *p > '9')
            return -1;
        while (*p >= '0' && *p <= '9')
            p++;
        n++;
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return n;
}

int gl_slurm_read(gl_getenv_fn env, gl_slurm *o, char *err, size_t errlen) {
    static const char *const job_v[] = {"SLURM_JOB_ID", "SLURM_JOBID", NULL};
    static const char *const step_v[] = {"SLURM_STEP_ID", "SLURM_STEPID", NULL};
    static const char *const nodes_v[] = {"SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES",
                                          "SLURM_NNODES", NULL};
    static const char *const tasks_v[] = {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS",
                                          NULL};
    static const char *const rank_v[] = {"SLURM_NODEID", "SLURM_PROCID", NULL};
    static const char *const list_v[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                         "SLURM_NODELIST", NULL};
    static const char *const gpus_v[] = {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS", NULL};
    memset(o, 0, sizeof *o);
    const char *jn, *sn, *nn, *tn, *rn, *ln, *gn;
    const char *job = first_var(env, job_v, &jn);
    const char *step = first_var(env, step_v, &sn);
    if (job == NULL || step == NULL)
        return 0; /* not inside srun: the batch script, salloc's shell, no Slurm */
    unsigned long jobid, stepid, nodes, tasks, rank, port, n;
    if (parse_ulong(job, 0, 4294967295ul, &jobid))
        return bad_var(err, errlen, jn, job, "a job number");
    if (parse_ulong(step, 0, 4294967295ul, &stepid))
        return bad_var(err, errlen, sn, step, "a step number");
    if (stepid > GL_SLURM_MAX_NORMAL_STEP)
        return 0; /* salloc's interactive step, the batch or extern step: not srun's */
    const char *v = first_var(env, nodes_v, &nn);
    if (v == NULL) {
        snprintf(err, errlen,
                 "Slurm: job %lu step %lu sets none of SLURM_STEP_NUM_NODES, "
                 "SLURM_JOB_NUM_NODES, SLURM_NNODES; give --nnodes, or --slurm off",
                 jobid, stepid);
        return 2;
    }
    if (parse_ulong(v, 1, GL_HOSTLIST_MAX_HOSTS, &nodes))
        return bad_var(err, errlen, nn, v, "a node count from 1 to 65536");
    /* several tasks on a node would each start a launcher for the same node
     * rank: refused (docs/slurm.md) */
    const char *tpn = env("SLURM_STEP_TASKS_PER_NODE");
    if (tpn == NULL || !*tpn)
        tpn = env("SLURM_NTASKS_PER_NODE");
    v = first_var(env, tasks_v, &tn);
    tasks = nodes;
    if (v && parse_ulong(v, 1, 1ul << 30, &tasks))
        return bad_var(err, errlen, tn, v, "a task count");
    if (v == NULL && tpn && parse_ulong(tpn, 1, 1ul << 20, &n) == 0) {
        tn = "SLURM_NTASKS_PER_NODE";
        tasks = n * nodes;
    }
    if (tasks > nodes) {
        snprintf(err, errlen,
                 "Slurm: this step runs %lu tasks on %lu node(s) (%s; tasks per node %s); "
                 "gpulaunch is one task per node and starts the workers itself: use srun "
                 "--ntasks-per-node=1 (or #SBATCH --ntasks-per-node=1) and --nproc-per-node "
                 "for the workers, or --slurm off to ignore SLURM_*",
                 tasks, nodes, tn, tpn && *tpn ? tpn : "not set");
        return 2;
    }
    v = first_var(env, rank_v, &rn);
    if (v == NULL) {
        snprintf(err, errlen,
                 "Slurm: job %lu step %lu sets neither SLURM_NODEID nor SLURM_PROCID; give "
                 "--node-rank, or --slurm off",
                 jobid, stepid);
        return 2;
    }
    if (parse_ulong(v, 0, nodes - 1, &rank)) {
        char want[64];
        snprintf(want, sizeof want, "a node index from 0 to %lu", nodes - 1);
        return bad_var(err, errlen, rn, v, want);
    }
    /* the master: a MASTER_ADDR the batch script exported (the torchrun
     * habit), else the first node of the step */
    v = env("MASTER_ADDR");
    if (v && *v) {
        if (strlen(v) >= sizeof o->master_addr)
            return bad_var(err, errlen, "MASTER_ADDR", v, "a host name of at most 255 bytes");
        snprintf(o->master_addr, sizeof o->master_addr, "%s", v);
        snprintf(o->nodelist, sizeof o->nodelist, "MASTER_ADDR");
    } else {
        v = first_var(env, list_v, &ln);
        if (v == NULL) {
            snprintf(err, errlen,
                     "Slurm: job %lu step %lu sets no SLURM_STEP_NODELIST or "
                     "SLURM_JOB_NODELIST; give --master-addr, or --slurm off",
                     jobid, stepid);
            return 2;
        }
        char why[384];
        if (gl_hostlist_nth(v, 0, o->master_addr, sizeof o->master_addr, why, sizeof why)) {
            snprintf(err, errlen, "Slurm: %s: %s; give --master-addr, or --slurm off", ln, why);
            return 2;
        }
        snprintf(o->nodelist, sizeof o->nodelist, "%s", ln);
    }
    v = env("MASTER_PORT");
    if (v && *v) {
        if (parse_ulong(v, 1, 65535, &port))
            return bad_var(err, errlen, "MASTER_PORT", v, "a port from 1 to 65535");
    } else {
        port = GL_SLURM_PORT_BASE + jobid % 10000;
    }
    snprintf(o->nnodes, sizeof o->nnodes, "%lu", nodes);
    snprintf(o->node_rank, sizeof o->node_rank, "%lu", rank);
    snprintf(o->master_port, sizeof o->master_port, "%lu", port);
    snprintf(o->rdzv_id, sizeof o->rdzv_id, "slurm-%lu.%lu", jobid, stepid);
    /* the GPUs Slurm gave this node, when it gave any */
    v = env("SLURM_GPUS_ON_NODE");
    if (v && *v) {
        if (parse_ulong(v, 0, 4096, &n))
            return bad_var(err, errlen, "SLURM_GPUS_ON_NODE", v, "a GPU count");
    } else if ((v = first_var(env, gpus_v, &gn)) != NULL) {
        long c = count_gpu_list(v);
        if (c < 0 || c > 4096)
            return bad_var(err, errlen, gn, v, "a comma list of GPU indices");
        n = (unsigned long)c;
    } else {
        n = 0;
    }
    if (n > 0)
        snprintf(o->nproc, sizeof o->nproc, "%lu", n);
    o->active = 1;
    return 0;
}
