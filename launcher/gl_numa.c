/* --numa-binding (see gl_numa.h). The topology comes from sysfs, as
 * torch.numa.binding reads it: a GPU's NUMA node from
 * /sys/bus/pci/devices/<bus id>/numa_node, a node's CPUs from
 * /sys/devices/system/node/nodeN/cpulist, a CPU's socket, hyperthread
 * siblings and caches from /sys/devices/system/cpu/cpuN/. The GPUs and their
 * bus ids come from /proc/driver/nvidia/gpus/ (what a container sees), in
 * PCI order, which is CUDA's order on a node of one GPU model. Every CPU
 * set is cut to the CPUs the launcher itself may use (its cpuset). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gl_numa.h"

#define NUMA_CPUS 4096     /* CPU ids handled (CPU_ALLOC size) */
#define NUMA_MAX_NODES 256 /* NUMA nodes considered */
#define NUMA_MAX_GPUS 256  /* GPUs listed by the driver */
#define NUMA_MPOL_PREFERRED 1
#define NUMA_MASK_BITS 1024

int gl_numa_parse_mode(const char *s) {
    static const char *const names[] = {"", "node", "socket", "exclusive", "core-complex"};
    if (strcmp(s, "none") == 0)
        return GL_NUMA_NONE;
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

/* ---- sysfs reading ---- */

static const char *sys_root(void) {
    const char *r = getenv("GPULAUNCH_SYSFS_ROOT");
    return r ? r : "";
}

/* Reads ROOT + the formatted path into buf, trailing white space cut; 0 or -1. */
static int read_at(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int read_at(char *buf, size_t len, const char *fmt, ...) {
    char rel[512], path[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof rel, fmt, ap);
    va_end(ap);
    snprintf(path, sizeof path, "%s%s", sys_root(), rel);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = '\0';
    while (n > 0 && isspace((unsigned char)buf[n - 1]))
        buf[--n] = '\0';
    return 0;
}

static cpu_set_t *set_new(void) {
    cpu_set_t *s = CPU_ALLOC(NUMA_CPUS);
    if (s)
        CPU_ZERO_S(CPU_ALLOC_SIZE(NUMA_CPUS), s);
    return s;
}

#define SZ CPU_ALLOC_SIZE(NUMA_CPUS)

/* "0-3,8,10-11" into s (added); 0, or -1 when malformed. */
static int parse_cpulist(const char *p, cpu_set_t *s) {
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p || a < 0)
            return -1;
        if (*end == '-') {
            p = end + 1;
            b = strtol(p, &end, 10);
            if (end == p || b < a)
                return -1;
        }
        for (long c = a; c <= b && c < NUMA_CPUS; c++)
            CPU_SET_S((size_t)c, SZ, s);
        p = end;
        if (*p == ',')
            p++;
        else if (*p && !isspace((unsigned char)*p))
            return -1;
        while (isspace((unsigned char)*p))
            p++;
    }
    return 0;
}

void gl_cpuset_format(const cpu_set_t *s, size_t size, char *out, size_t len) {
    size_t off = 0;
    int n = (int)(size * 8);
    out[0] = '\0';
    for (int c = 0; c < n;) {
        if (!CPU_ISSET_S((size_t)c, size, s)) {
            c++;
            continue;
        }
        int e = c;
        while (e + 1 < n && CPU_ISSET_S((size_t)(e + 1), size, s))
            e++;
        int k = e > c ? snprintf(out + off, len - off, "%s%d-%d", off ? "," : "", c, e)
                      : snprintf(out + off, len - off, "%s%d", off ? "," : "", c);
        if (k < 0 || (size_t)k >= len - off)
            return;
        off += (size_t)k;
        c = e + 1;
    }
}

static int lowest_cpu(const cpu_set_t *s) {
    for (int c = 0; c < NUMA_CPUS; c++)
        if (CPU_ISSET_S((size_t)c, SZ, s))
            return c;
    return -1;
}

/* The lowest CPU of the list in ROOT/sys/devices/system/cpu/cpuC/<file>, or
 * c itself when the file is missing. */
static int cpu_group_key(int c, const char *file) {
    char buf[4096];
    if (read_at(buf, sizeof buf, "/sys/devices/system/cpu/cpu%d/%s", c, file) != 0)
        return c;
    cpu_set_t *s = set_new();
    int k = s && parse_cpulist(buf, s) == 0 ? lowest_cpu(s) : -1;
    CPU_FREE(s);
    return k >= 0 ? k : c;
}

/* The socket of cpu c (0 when sysfs does not say). */
static int package_of(int c) {
    char buf[32];
    if (read_at(buf, sizeof buf, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c))
        return 0;
    return (int)strtol(buf, NULL, 10);
}

/* The lowest CPU sharing cpu c's largest data or unified cache; -1 without
 * cache information. */
static int cache_key(int c) {
    int best_level = -1, key = -1;
    for (int i = 0; i < 16; i++) {
        char type[32], lvl[16], shared[4096];
        if (read_at(type, sizeof type, "/sys/devices/system/cpu/cpu%d/cache/index%d/type", c, i))
            break;
        if (strcmp(type, "Unified") && strcmp(type, "Data"))
            continue;
        if (read_at(lvl, sizeof lvl, "/sys/devices/system/cpu/cpu%d/cache/index%d/level", c, i) ||
            read_at(shared, sizeof shared,
                    "/sys/devices/system/cpu/cpu%d/cache/index%d/shared_cpu_list", c, i))
            continue;
        int level = (int)strtol(lvl, NULL, 10);
        if (level <= best_level)
            continue;
        cpu_set_t *s = set_new();
        if (s && parse_cpulist(shared, s) == 0) {
            best_level = level;
            key = lowest_cpu(s);
        }
        CPU_FREE(s);
    }
    return key;
}

/* ---- the topology ---- */

typedef struct topo {
    int nnodes;
    int node_id[NUMA_MAX_NODES];
    cpu_set_t *node_cpus[NUMA_MAX_NODES]; /* allowed CPUs only */
    int ngpus;
    char gpu_bus[NUMA_MAX_GPUS][32];
    int gpu_node[NUMA_MAX_GPUS];
    int nvis;
    int vis[NUMA_MAX_GPUS]; /* visible position -> index into gpu_* */
} topo;

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int cmp_bus(const void *a, const void *b) {
    return strcmp((const char *)a, (const char *)b);
}

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static int load_nodes(topo *t, char *err, size_t errlen) {
    char path[1024];
    snprintf(path, sizeof path, "%s/sys/devices/system/node", sys_root());
    DIR *d = opendir(path);
    if (d == NULL)
        return fail(err, errlen,
                    "--numa-binding: cannot list the NUMA nodes (%s: %s); this kernel or "
                    "container shows no NUMA topology: drop --numa-binding",
                    path, strerror(errno));
    int ids[NUMA_MAX_NODES] = {0}, n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < NUMA_MAX_NODES) {
        const char *s = e->d_name;
        if (strncmp(s, "node", 4) == 0 && s[4] && strspn(s + 4, "0123456789") == strlen(s + 4))
            ids[n++] = (int)strtol(s + 4, NULL, 10);
    }
    closedir(d);
    qsort(ids, (size_t)n, sizeof ids[0], cmp_int);
    cpu_set_t *allowed = set_new();
    if (allowed == NULL || sched_getaffinity(0, SZ, allowed) != 0) {
        CPU_FREE(allowed);
        return fail(err, errlen, "--numa-binding: sched_getaffinity: %s", strerror(errno));
    }
    for (int i = 0; i < n; i++) {
        char buf[8192];
        cpu_set_t *s = set_new();
        if (s == NULL)
            break;
        if (read_at(buf, sizeof buf, "/sys/devices/system/node/node%d/cpulist", ids[i]) != 0 ||
            parse_cpulist(buf, s) != 0) {
            CPU_FREE(s);
            continue;
        }
        CPU_AND_S(SZ, s, s, allowed);
        t->node_id[t->nnodes] = ids[i];
        t->node_cpus[t->nnodes++] = s;
    }
    CPU_FREE(allowed);
    if (t->nnodes == 0)
        return fail(err, errlen, "--numa-binding: no NUMA node with a readable cpulist under %s",
                    path);
    return 0;
}

static const cpu_set_t *node_cpus(const topo *t, int node) {
    for (int i = 0; i < t->nnodes; i++)
        if (t->node_id[i] == node)
            return t->node_cpus[i];
    return NULL;
}

static void load_gpus(topo *t) {
    char path[1024];
    snprintf(path, sizeof path, "%s/proc/driver/nvidia/gpus", sys_root());
    DIR *d = opendir(path);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && t->ngpus < NUMA_MAX_GPUS)
        if (e->d_name[0] != '.')
            snprintf(t->gpu_bus[t->ngpus++], sizeof t->gpu_bus[0], "%s", e->d_name);
    closedir(d);
    qsort(t->gpu_bus, (size_t)t->ngpus, sizeof t->gpu_bus[0], cmp_bus);
    for (int i = 0; i < t->ngpus; i++) {
        char buf[32];
        /* one NUMA node: often -1, meaning node 0 */
        t->gpu_node[i] = 0;
        if (read_at(buf, sizeof buf, "/sys/bus/pci/devices/%s/numa_node", t->gpu_bus[i]) == 0 &&
            strtol(buf, NULL, 10) > 0)
            t->gpu_node[i] = (int)strtol(buf, NULL, 10);
    }
}

/* The GPU with this UUID (or UUID prefix, as CUDA accepts); -1 if none. */
static int gpu_by_uuid(const topo *t, const char *uuid, size_t len) {
    for (int i = 0; i < t->ngpus; i++) {
        char info[4096];
        if (read_at(info, sizeof info, "/proc/driver/nvidia/gpus/%s/information", t->gpu_bus[i]))
            continue;
        const char *u = strstr(info, "GPU UUID:");
        if (u == NULL)
            continue;
        u += 9;
        while (*u == ' ' || *u == '\t')
            u++;
        if (strncmp(u, uuid, len) == 0)
            return i;
    }
    return -1;
}

/* The visible GPUs, in the order CUDA numbers them. */
static int load_visible(topo *t, char *err, size_t errlen) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v == NULL) {
        v = getenv("NVIDIA_VISIBLE_DEVICES");
        if (v && strcmp(v, "all") == 0)
            v = NULL;
    }
    if (v == NULL) {
        for (int i = 0; i < t->ngpus; i++)
            t->vis[t->nvis++] = i;
        return 0;
    }
    if (*v == '\0' || strcmp(v, "none") == 0 || strcmp(v, "void") == 0)
        return 0;
    for (const char *p = v; *p && t->nvis < NUMA_MAX_GPUS;) {
        size_t n = strcspn(p, ",");
        int g = -1;
        if (n > 0 && strspn(p, "0123456789") >= n) {
            long idx = strtol(p, NULL, 10);
            g = idx < t->ngpus ? (int)idx : -1;
        } else if (n > 4 && strncmp(p, "GPU-", 4) == 0) {
            g = gpu_by_uuid(t, p, n);
        }
        if (g < 0)
            return fail(err, errlen,
                        "--numa-binding: cannot tell which PCI device '%.*s' of the visible "
                        "devices is (the driver lists %d GPU(s); indices and GPU-UUIDs are "
                        "mapped, MIG instances are not); list the GPUs by index or drop "
                        "--numa-binding",
                        (int)n, p, t->ngpus);
        t->vis[t->nvis++] = g;
        p += n;
        if (*p == ',')
            p++;
    }
    return 0;
}

static void topo_free(topo *t) {
    for (int i = 0; i < t->nnodes; i++)
        CPU_FREE(t->node_cpus[i]);
    t->nnodes = 0;
}

/* Groups the CPUs of s by key(cpu): the groups' lowest keys and members. */
typedef struct groups {
    int n;
    int key[NUMA_CPUS / 8];
    cpu_set_t *cpus[NUMA_CPUS / 8];
} groups;

static void groups_free(groups *g) {
    for (int i = 0; i < g->n; i++)
        CPU_FREE(g->cpus[i]);
    g->n = 0;
}

static int group_by(const cpu_set_t *s, int (*keyf)(int, const void *), const void *arg,
                    groups *g) {
    g->n = 0;
    for (int c = 0; c < NUMA_CPUS; c++) {
        if (!CPU_ISSET_S((size_t)c, SZ, s))
            continue;
        int k = keyf(c, arg);
        int i = 0;
        while (i < g->n && g->key[i] != k)
            i++;
        if (i == g->n) {
            if (g->n == (int)(sizeof g->key / sizeof g->key[0]))
                return -1;
            g->cpus[i] = set_new();
            if (g->cpus[i] == NULL)
                return -1;
            g->key[i] = k;
            g->n++;
        }
        CPU_SET_S((size_t)c, SZ, g->cpus[i]);
    }
    return 0;
}

static int core_key(int c, const void *arg) {
    return cpu_group_key(c, "topology/thread_siblings_list");
}

static int l3_key(int c, const void *arg) {
    int k = cache_key(c);
    return k >= 0 ? k : -1; /* no cache information: the whole node is one complex */
}

/* Sorts groups by key (ascending) or, with by_size, by size (descending) then key. */
static void groups_sort(groups *g, int by_size) {
    for (int i = 1; i < g->n; i++)
        for (int j = i; j > 0; j--) {
            int ca = CPU_COUNT_S(SZ, g->cpus[j - 1]), cb = CPU_COUNT_S(SZ, g->cpus[j]);
            int swap = by_size ? (cb > ca || (cb == ca && g->key[j] < g->key[j - 1]))
                               : g->key[j] < g->key[j - 1];
            if (!swap)
                break;
            int k = g->key[j];
            g->key[j] = g->key[j - 1];
            g->key[j - 1] = k;
            cpu_set_t *s = g->cpus[j];
            g->cpus[j] = g->cpus[j - 1];
            g->cpus[j - 1] = s;
        }
}

static int bind_one(const topo *t, int mode, int node, int rel, int gsize, cpu_set_t *out,
                    char *err, size_t errlen) {
    const cpu_set_t *nc = node_cpus(t, node);
    if (nc == NULL || CPU_COUNT_S(SZ, nc) == 0)
        return fail(err, errlen,
                    "--numa-binding: NUMA node %d has no CPU this process may use (its cpuset); "
                    "widen the container's CPUs or drop --numa-binding",
                    node);
    if (mode == GL_NUMA_NODE) {
        CPU_OR_S(SZ, out, out, nc);
        return 0;
    }
    if (mode == GL_NUMA_SOCKET) {
        int pkg = package_of(lowest_cpu(nc));
        for (int i = 0; i < t->nnodes; i++) {
            int c = lowest_cpu(t->node_cpus[i]);
            if (c >= 0 && package_of(c) == pkg)
                CPU_OR_S(SZ, out, out, t->node_cpus[i]);
        }
        return 0;
    }
    groups g;
    if (group_by(nc, mode == GL_NUMA_EXCLUSIVE ? core_key : l3_key, NULL, &g) != 0) {
        groups_free(&g);
        return fail(err, errlen, "--numa-binding: out of memory grouping NUMA node %d's CPUs",
                    node);
    }
    int rc = 0;
    if (mode == GL_NUMA_EXCLUSIVE) {
        groups_sort(&g, 0);
        int per = g.n / gsize, extra = g.n % gsize;
        if (per < 1) {
            rc = fail(err, errlen,
                      "--numa-binding exclusive: NUMA node %d has %d physical core(s) for %d "
                      "GPU(s) or workers; use --numa-binding node",
                      node, g.n, gsize);
        } else {
            int start = rel * per + (rel < extra ? rel : extra);
            int end = start + per + (rel < extra ? 1 : 0);
            for (int i = start; i < end; i++)
                CPU_OR_S(SZ, out, out, g.cpus[i]);
        }
    } else {
        groups_sort(&g, 1);
        CPU_OR_S(SZ, out, out, g.cpus[rel % g.n]);
    }
    groups_free(&g);
    return rc;
}

int gl_numa_plan(int mode, int nproc, gl_numa_bind *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out * (size_t)nproc);
    if (mode == GL_NUMA_NONE)
        return 0;
    topo *t = calloc(1, sizeof *t);
    int rc = 0;
    if (t == NULL) {
        rc = fail(err, errlen, "--numa-binding: out of memory");
        goto out;
    }
    if ((rc = load_nodes(t, err, errlen)) != 0)
        goto out;
    load_gpus(t);
    if ((rc = load_visible(t, err, errlen)) != 0)
        goto out;
    /* NUMA nodes with CPUs, for spreading */
    int cpu_nodes[NUMA_MAX_NODES], k = 0;
    for (int i = 0; i < t->nnodes; i++)
        if (CPU_COUNT_S(SZ, t->node_cpus[i]) > 0)
            cpu_nodes[k++] = t->node_id[i];
    if (k == 0) {
        rc = fail(err, errlen,
                  "--numa-binding: no NUMA node has a CPU this process may use; drop "
                  "--numa-binding");
        goto out;
    }
    for (int lr = 0; lr < nproc; lr++) {
        int node, rel = 0, gsize = 0;
        if (t->nvis > 0) {
            if (lr >= t->nvis) {
                rc = fail(err, errlen,
                          "--numa-binding: local rank %d has no GPU of its own (%d visible); "
                          "local rank i follows GPU i: lower --nproc-per-node or drop "
                          "--numa-binding",
                          lr, t->nvis);
                goto out;
            }
            node = t->gpu_node[t->vis[lr]];
            for (int j = 0; j < t->nvis; j++)
                if (t->gpu_node[t->vis[j]] == node) {
                    rel += j < lr;
                    gsize++;
                }
            out[lr].gpu = lr;
        } else {
            node = cpu_nodes[(int)((long)lr * k / nproc)];
            for (int j = 0; j < nproc; j++)
                if (cpu_nodes[(int)((long)j * k / nproc)] == node) {
                    rel += j < lr;
                    gsize++;
                }
            out[lr].gpu = -1;
        }
        out[lr].node = node;
        out[lr].cpus = set_new();
        out[lr].cpus_size = SZ;
        if (out[lr].cpus == NULL) {
            rc = fail(err, errlen, "--numa-binding: out of memory");
            goto out;
        }
        if ((rc = bind_one(t, mode, node, rel, gsize, out[lr].cpus, err, errlen)) != 0)
            goto out;
    }
out:
    if (t)
        topo_free(t);
    free(t);
    if (rc != 0)
        gl_numa_free(out, nproc);
    return rc;
}

void gl_numa_free(gl_numa_bind *b, int n) {
    for (int i = 0; i < n; i++) {
        CPU_FREE(b[i].cpus);
        b[i].cpus = NULL;
    }
}

static gl_numa_bind *plan;
static int plan_n;

int gl_numa_prepare(int mode, int nproc, char *err, size_t errlen) {
    if (plan) {
        gl_numa_free(plan, plan_n);
        free(plan);
        plan = NULL;
    }
    plan_n = 0;
    if (mode == GL_NUMA_NONE)
        return 0;
    plan = calloc((size_t)nproc, sizeof *plan);
    if (plan == NULL)
        return fail(err, errlen, "--numa-binding: out of memory");
    if (gl_numa_plan(mode, nproc, plan, err, errlen) != 0) {
        free(plan);
        plan = NULL;
        return -1;
    }
    plan_n = nproc;
    return 0;
}

const gl_numa_bind *gl_numa_for(int local_rank) {
    return plan && local_rank >= 0 && local_rank < plan_n ? &plan[local_rank] : NULL;
}

int gl_numa_apply(const gl_numa_bind *b) {
    if (b == NULL || b->cpus == NULL)
        return 0;
    if (sched_setaffinity(0, b->cpus_size, b->cpus) != 0)
        return -1;
    if (b->node >= 0 && b->node < NUMA_MASK_BITS) {
        unsigned long mask[NUMA_MASK_BITS / (8 * sizeof(unsigned long))] = {0};
        mask[(size_t)b->node / (8 * sizeof(unsigned long))] |=
            1UL << ((size_t)b->node % (8 * sizeof(unsigned long)));
        /* maxnode counts one past the mask's bits, as numactl passes it */
        (void)syscall(SYS_set_mempolicy, NUMA_MPOL_PREFERRED, mask,
                      (unsigned long)NUMA_MASK_BITS + 1);
    }
    return 0;
}
