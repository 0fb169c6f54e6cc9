/* Runtime test harness: a real rendezvous server, a job round opened by
 * fake node agents, and N forked ranks with the launcher's environment. */
#ifndef GPULAUNCH_TEST_RT_HARNESS_H
#define GPULAUNCH_TEST_RT_HARNESS_H

#include "gpulaunch/gpulaunch.h"
#include "harness.h"

typedef int (*rank_fn)(gpl_comm_t c, void *arg, char *msg, size_t msglen);

typedef struct rt_result {
    int status[16];
    char msg[16][1024];
} rt_result;

/* Runs fn on nnodes x per_node ranks; extra_env "K=V" strings (NULL-terminated)
 * are added to every rank. Returns 0 when every rank exited 0. */
int rt_run(int nnodes, int per_node, rank_fn fn, void *arg, const char *const *extra_env,
           rt_result *res, int timeout_ms);
/* The same with per_node[n] ranks on node n (nodes of different sizes). */
int rt_run_nodes(int nnodes, const int *per_node, rank_fn fn, void *arg,
                 const char *const *extra_env, rt_result *res, int timeout_ms);
/* The rendezvous server and the node agents of the last rt_run, for tests
 * that end the round mid-run (rt_drop_node). */
void rt_drop_node_after(int node, int ms);

#endif
