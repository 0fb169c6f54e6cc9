/* --numa-binding: each worker's CPUs and preferred memory node, worked out
 * from sysfs before the workers start and applied in the child between fork
 * and exec (no numactl). */
#ifndef GPULAUNCH_GL_NUMA_H
#define GPULAUNCH_GL_NUMA_H

#include <sched.h>
#include <stddef.h>

enum gl_numa_mode {
    GL_NUMA_NONE = 0,
    GL_NUMA_NODE,         /* every CPU of the GPU's NUMA node */
    GL_NUMA_SOCKET,       /* every CPU of the NUMA nodes of the GPU's socket */
    GL_NUMA_EXCLUSIVE,    /* the node's physical cores split among its GPUs */
    GL_NUMA_CORE_COMPLEX, /* one L3 cache's CPUs (a core complex) of the node per GPU */
};

/* "" or "none" -> GL_NUMA_NONE, "node", "socket", "exclusive",
 * "core-complex"; -1 when unknown. */
int gl_numa_parse_mode(const char *s);

typedef struct gl_numa_bind {
    cpu_set_t *cpus; /* CPU_ALLOC'd */
    size_t cpus_size;
    int node; /* memory preferred on this node (MPOL_PREFERRED) */
    int gpu;  /* the device it follows, -1 when spread by local rank */
} gl_numa_bind;

/* Works out each local rank's binding for mode into out[0..nproc): local
 * rank i follows the i-th visible GPU (CUDA_VISIBLE_DEVICES order, as
 * torch.cuda numbers them); with no GPU the local ranks are spread over the
 * NUMA nodes that have CPUs, in contiguous blocks. Reads sysfs under
 * $GPULAUNCH_SYSFS_ROOT (tests), else under /. 0, or -1 with what failed and
 * what to do in err. */
int gl_numa_plan(int mode, int nproc, gl_numa_bind *out, char *err, size_t errlen);
void gl_numa_free(gl_numa_bind *b, int n);

/* The launcher's plan, kept for the life of the process: prepared once
 * before the first round (0, or -1 with err), looked up per local rank at
 * spawn (NULL without --numa-binding). */
int gl_numa_prepare(int mode, int nproc, char *err, size_t errlen);
const gl_numa_bind *gl_numa_for(int local_rank);

/* In the child, between fork and exec (async-signal-safe): the CPU affinity
 * and the preferred memory node. 0, or -1 when the affinity could not be
 * set (a refused memory policy is not an error: it is a preference). */
int gl_numa_apply(const gl_numa_bind *b);

/* "0-3,8,10-11" */
void gl_cpuset_format(const cpu_set_t *s, size_t size, char *out, size_t len);

#endif
