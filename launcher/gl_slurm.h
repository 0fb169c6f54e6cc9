/* Slurm: the hostlist syntax (parsed here: containers have no scontrol) and
 * the options a job step started by srun gives the launcher from SLURM_*
 * (docs/slurm.md). Nothing here talks to Slurm's daemons. */
#ifndef GPULAUNCH_GL_SLURM_H
#define GPULAUNCH_GL_SLURM_H

#include <stddef.h>

/* Limits of a hostlist such as "gpu[01-04,07],cpu5" or "rack[1-2]-n[001-128]".
 * Each, exceeded, is an error that names it. */
#define GL_HOSTLIST_MAX_LEN 65536   /* bytes of the list */
#define GL_HOSTLIST_MAX_HOSTS 65536 /* hosts it expands to (the launcher's --nnodes bound) */
#define GL_HOSTLIST_MAX_NAME 255    /* bytes of one host name (DNS's limit) */
#define GL_HOSTLIST_MAX_GROUPS 8    /* bracket groups in one name: rack[1-2]-n[01-04] has 2 */
#define GL_HOSTLIST_MAX_DIGITS 9    /* digits of a number in brackets */

/* Called for each host in order (index from 0); a non-zero return stops the
 * walk. */
typedef int (*gl_hostlist_cb)(void *data, long index, const char *host);

/* Checks the whole list, then calls cb (may be NULL) for each host, in
 * Slurm's order: entries left to right, and within an entry the first group
 * varies slowest; a number keeps the width of its range's lower bound
 * ("[08-10]" -> 08 09 10, "[8-10]" -> 8 9 10). Returns the number of hosts
 * in the list (also when cb stopped the walk early), or -1 with a message in
 * err saying what is malformed and where. */
long gl_hostlist_expand(const char *list, gl_hostlist_cb cb, void *data, char *err, size_t errlen);

/* The n-th host (from 0) of list into out. 0, or -1 with a message in err
 * (malformed, fewer than n+1 hosts, or out too small). */
int gl_hostlist_nth(const char *list, long n, char *out, size_t outlen, char *err, size_t errlen);

/* Job steps' port for the rendezvous when Slurm chooses it: 15000 + the last
 * four digits of the job id, as PyTorch Lightning does, so that two jobs
 * sharing a node do not both take 29500. */
#define GL_SLURM_PORT_BASE 15000

/* Step ids above this are Slurm's own steps (interactive 0xfffffffa, extern,
 * batch), not srun's; Slurm calls it SLURM_MAX_NORMAL_STEP_ID. */
#define GL_SLURM_MAX_NORMAL_STEP 0xfffffff0ul

/* What a Slurm job step says about this node, as option values; "" where
 * it says nothing. */
typedef struct gl_slurm {
    int active;         /* 1 inside an srun job step, 0 elsewhere (values all "") */
    char nnodes[16];    /* SLURM_STEP_NUM_NODES, else SLURM_JOB_NUM_NODES / SLURM_NNODES */
    char node_rank[16]; /* SLURM_NODEID, else SLURM_PROCID */
    char master_addr[GL_HOSTLIST_MAX_NAME + 1]; /* MASTER_ADDR, else the nodelist's first host */
    char master_port[8]; /* MASTER_PORT, else GL_SLURM_PORT_BASE + job id % 10000 */
    char rdzv_id[64];    /* slurm-JOBID.STEPID */
    char nproc[16];    /* GPUs on this node (SLURM_GPUS_ON_NODE, SLURM_STEP_GPUS, SLURM_JOB_GPUS) */
    char nodelist[64]; /* the variable the master came from, for messages */
} gl_slurm;

/* A getenv: tests pass their own. */
typedef const char *(*gl_getenv_fn)(const char *name);

/* Reads the job step's variables through env. Outside an srun step (no
 * SLURM_JOB_ID, no SLURM_STEP_ID or one of Slurm's own steps: the batch
 * script itself, salloc's shell, no Slurm) returns 0 with active 0. Returns 2 with a message in err
 * when a variable is malformed or the step runs several tasks on a node (gpulaunch is one task per
 * node and starts the workers itself). */
int gl_slurm_read(gl_getenv_fn env, gl_slurm *out, char *err, size_t errlen);

#endif
