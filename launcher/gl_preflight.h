/* Node checks before anything is spawned, and the network-interface logic
 * (NCCL_SOCKET_IFNAME matching, the interface that routes to the master). */
#ifndef GPULAUNCH_GL_PREFLIGHT_H
#define GPULAUNCH_GL_PREFLIGHT_H

#include <stdint.h>
#include <stdio.h>

#define GL_MAX_IFACES 64

typedef struct gl_preflight_env {
    const char *shm_path; /* "/dev/shm" */
    uint64_t shm_min;
    const char *nccl_ifname;   /* NCCL_SOCKET_IFNAME or NULL */
    const char *const *ifaces; /* NULL: the node's interfaces (getifaddrs) */
    int nifaces;
    int gpus_visible;     /* -1: detect */
    int gpus_needed;      /* 0 when not running one worker per GPU */
    uint64_t memlock_min; /* 0: skip */
    int gpu_health;       /* GL_GPU_HEALTH_* (gl_nvml.h): NVML checks of the bound GPUs */
} gl_preflight_env;

/* Prints one ok / warn / FAIL line per check (ok lines only when verbose);
 * returns the number of FAILs. */
int gl_preflight(const gl_preflight_env *e, FILE *out, int verbose);

/* NCCL_SOCKET_IFNAME semantics: comma list of prefixes, '^' excludes, '='
 * matches exactly. */
int gl_ifname_match(const char *spec, const char *ifname);

/* The node's interfaces that are up, not loopback, with an address. */
int gl_list_ifaces(char names[][32], int max);

/* The interface whose address routes to host; 0 on success. */
int gl_route_iface(const char *host, char *ifname, size_t len);

#endif
