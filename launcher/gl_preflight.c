/* Preflight checks and interface selection: see gl_preflight.h. */
#include "gl_preflight.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "gl_nvml.h"
#include "gl_options.h"

int gl_ifname_match(const char *spec, const char *ifname) {
    if (spec == NULL || *spec == '\0')
        return 1;
    int exclude = spec[0] == '^';
    if (exclude)
        spec++;
    int exact = spec[0] == '=';
    if (exact)
        spec++;
    int hit = 0;
    const char *p = spec;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n && (exact ? strlen(ifname) == n && strncmp(ifname, p, n) == 0
                        : strncmp(ifname, p, n) == 0))
            hit = 1;
        p += n + (comma ? 1 : 0);
    }
    return exclude ? !hit : hit;
}

int gl_list_ifaces(char names[][32], int max) {
    struct ifaddrs *ifa;
    if (getifaddrs(&ifa) != 0)
        return 0;
    int n = 0;
    for (struct ifaddrs *i = ifa; i && n < max; i = i->ifa_next) {
        if (!i->ifa_addr || (i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP))
            continue;
        if (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)
            continue;
        int dup = 0;
        for (int k = 0; k < n; k++)
            if (strcmp(names[k], i->ifa_name) == 0)
                dup = 1;
        if (!dup)
            snprintf(names[n++], 32, "%s", i->ifa_name);
    }
    freeifaddrs(ifa);
    return n;
}

int gl_route_iface(const char *host, char *ifname, size_t len) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM}, *res;
    if (getaddrinfo(host, "9", &hints, &res) != 0)
        return -1;
    int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage me;
    socklen_t ml = sizeof me;
    int ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
             getsockname(fd, (struct sockaddr *)&me, &ml) == 0;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    if (!ok)
        return -1;
    struct ifaddrs *ifa;
    if (getifaddrs(&ifa) != 0)
        return -1;
    int found = -1;
    for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != me.ss_family)
            continue;
        int same = me.ss_family == AF_INET
                       ? ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr ==
                             ((struct sockaddr_in *)&me)->sin_addr.s_addr
                       : memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
                                &((struct sockaddr_in6 *)&me)->sin6_addr, 16) == 0;
        if (same) {
            snprintf(ifname, len, "%s", i->ifa_name);
            found = 0;
            break;
        }
    }
    freeifaddrs(ifa);
    return found;
}

static void check_shm(const gl_preflight_env *e, FILE *out, int verbose, int *fails) {
    struct statvfs sv;
    struct stat st;
    if (stat(e->shm_path, &st) != 0 || !S_ISDIR(st.st_mode) || statvfs(e->shm_path, &sv) != 0) {
        fprintf(out,
                "FAIL %s is not mounted: NCCL and the CPU backend need it. Kubernetes: "
                "mount an emptyDir {medium: Memory, sizeLimit: 16Gi} at /dev/shm; Docker: "
                "--shm-size=16g\n",
                e->shm_path);
        (*fails)++;
        return;
    }
    double total = (double)sv.f_blocks * sv.f_frsize, avail = (double)sv.f_bavail * sv.f_frsize;
    if (total < (double)e->shm_min) {
        fprintf(out,
                "FAIL %s is %.0f MiB, under --shm-min %.0f MiB: NCCL fails with \"failed to "
                "extend /dev/shm\". Kubernetes: mount an emptyDir {medium: Memory, sizeLimit: "
                "16Gi} at /dev/shm (Docker's default is 64 MiB; use --shm-size=16g)\n",
                e->shm_path, total / 1048576.0, (double)e->shm_min / 1048576.0);
        (*fails)++;
    } else if (avail < (double)e->shm_min) {
        fprintf(out,
                "FAIL %s has %.0f MiB free of %.0f MiB, under --shm-min %.0f MiB: it is full. "
                "Remove stale segments of dead jobs or enlarge it\n",
                e->shm_path, avail / 1048576.0, total / 1048576.0, (double)e->shm_min / 1048576.0);
        (*fails)++;
    } else if (verbose) {
        fprintf(out, "ok   %s: %.0f MiB, %.0f MiB free\n", e->shm_path, total / 1048576.0,
                avail / 1048576.0);
    }
    DIR *d = opendir(e->shm_path);
    if (d == NULL)
        return;
    int n = 0;
    double bytes = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, "nccl-", 5) != 0)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", e->shm_path, de->d_name);
        if (stat(path, &st) == 0)
            bytes += (double)st.st_size;
        n++;
    }
    closedir(d);
    if (n)
        fprintf(out,
                "warn %d nccl-* segment(s) in %s hold %.0f MiB; when no NCCL job runs on this "
                "node they are left by dead jobs: rm %s/nccl-*\n",
                n, e->shm_path, bytes / 1048576.0, e->shm_path);
}

static void check_ifname(const gl_preflight_env *e, FILE *out, int verbose, int *fails) {
    if (e->nccl_ifname == NULL || *e->nccl_ifname == '\0')
        return;
    char have[GL_MAX_IFACES][32];
    int n = 0;
    if (e->ifaces) {
        for (int i = 0; i < e->nifaces && i < GL_MAX_IFACES; i++)
            snprintf(have[n++], 32, "%s", e->ifaces[i]);
    } else {
        n = gl_list_ifaces(have, GL_MAX_IFACES);
    }
    int hit = 0;
    char list[1024] = "";
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (gl_ifname_match(e->nccl_ifname, have[i]))
            hit++;
        int w = snprintf(list + off, sizeof list - off, "%s%s", i ? ", " : "", have[i]);
        if (w > 0 && (size_t)w < sizeof list - off)
            off += (size_t)w;
    }
    if (!hit) {
        fprintf(out,
                "FAIL NCCL_SOCKET_IFNAME=%s matches no interface of this node (it has: %s); "
                "NCCL would fail or hang. Set it to one of them, or unset it\n",
                e->nccl_ifname, n ? list : "none");
        (*fails)++;
    } else if (verbose) {
        fprintf(out, "ok   NCCL_SOCKET_IFNAME=%s matches %d interface(s)\n", e->nccl_ifname, hit);
    }
}

int gl_preflight(const gl_preflight_env *e, FILE *out, int verbose) {
    int fails = 0;
    check_shm(e, out, verbose, &fails);
    check_ifname(e, out, verbose, &fails);
    int gpus = e->gpus_visible >= 0 ? e->gpus_visible : gpl_visible_gpu_count();
    if (e->gpus_needed > 0) {
        if (gpus < e->gpus_needed) {
            fprintf(out,
                    "FAIL %d worker(s) need one GPU each but this node exposes %d; request "
                    "nvidia.com/gpu: %d in the pod, check CUDA_VISIBLE_DEVICES, or lower "
                    "--nproc-per-node\n",
                    e->gpus_needed, gpus, e->gpus_needed);
            fails++;
        } else if (verbose) {
            fprintf(out, "ok   %d GPU(s) for %d worker(s)\n", gpus, e->gpus_needed);
        }
    } else if (verbose) {
        fprintf(out, "ok   %d GPU(s) visible (CPU workers)\n", gpus);
    }
    /* no GPU, no NVML: a CPU node never loads it */
    if (gpus > 0 && e->gpu_health != GL_GPU_HEALTH_OFF)
        fails += gl_nvml_preflight(e->gpu_health, out, verbose);
    if (e->memlock_min) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
            rl.rlim_cur < e->memlock_min)
            fprintf(out,
                    "warn memlock limit is %llu KiB: InfiniBand/RDMA needs it unlimited "
                    "(ulimit -l unlimited; in containers: --ulimit memlock=-1)\n",
                    (unsigned long long)rl.rlim_cur / 1024);
        else if (verbose)
            fprintf(out, "ok   memlock limit\n");
    }
    return fails;
}
