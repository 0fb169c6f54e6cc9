/* Runtime test harness: see rt_harness.h. */
#include "rt_harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int drop_node = -1, drop_ms = 0;

void rt_drop_node_after(int node, int ms) {
    drop_node = node;
    drop_ms = ms;
}

int rt_run(int nnodes, int per_node, rank_fn fn, void *arg, const char *const *extra_env,
           rt_result *res, int timeout_ms) {
    int per[16] = {0};
    for (int n = 0; n < nnodes && n < 16; n++)
        per[n] = per_node;
    return rt_run_nodes(nnodes, per, fn, arg, extra_env, res, timeout_ms);
}

int rt_run_nodes(int nnodes, const int *per_node, rank_fn fn, void *arg,
                 const char *const *extra_env, rt_result *res, int timeout_ms) {
    memset(res, 0, sizeof *res);
    if (nnodes < 1 || nnodes > 16)
        return -1;
    int node_of[16], base[16], world = 0;
    for (int n = 0; n < nnodes && n < 16; n++) {
        base[n] = world;
        for (int k = 0; k < per_node[n] && world < 16; k++)
            node_of[world++] = n;
    }
    proc srv;
    int port;
    if (rdzv_start(&srv, &port, NULL) != 0)
        return -1;
    static char run[64];
    snprintf(run, sizeof run, "rt-%d", (int)getpid());
    peer *agents = calloc((size_t)nnodes, sizeof *agents);
    for (int n = 0; n < nnodes; n++) {
        char host[32];
        snprintf(host, sizeof host, "node%d", n);
        rdzv_msg m = {.type = RDZV_JOIN, .req_id = 1};
        snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "%s", run);
        snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "%s", host);
        snprintf(m.u.join.addr, sizeof m.u.join.addr, "127.0.0.1");
        m.u.join.nproc = (uint32_t)per_node[n];
        m.u.join.static_rank = n;
        m.u.join.min_nodes = m.u.join.max_nodes = (uint32_t)nnodes;
        m.u.join.heartbeat_timeout_ms = 3600000; /* the fake agents send none */
        if (peer_open(&agents[n], port, NULL) != 0 || peer_send(&agents[n], &m) != 0)
            return -1;
    }
    for (int n = 0; n < nnodes; n++)
        if (peer_recv_type(&agents[n], RDZV_ASSIGNED, 5000) != 0)
            return -1;
    pid_t pids[16];
    int fds[16];
    for (int r = 0; r < world; r++) {
        int p[2];
        if (pipe(p) != 0)
            return -1;
        pids[r] = fork();
        if (pids[r] == 0) {
            close(p[0]);
            for (int n = 0; n < nnodes; n++) /* the agents' sockets belong to the parent */
                close(agents[n].fd);
            char v[64];
            snprintf(v, sizeof v, "%d", r);
            setenv("RANK", v, 1);
            int node = node_of[r];
            snprintf(v, sizeof v, "%d", r - base[node]);
            setenv("LOCAL_RANK", v, 1);
            snprintf(v, sizeof v, "%d", world);
            setenv("WORLD_SIZE", v, 1);
            snprintf(v, sizeof v, "%d", per_node[node]);
            setenv("LOCAL_WORLD_SIZE", v, 1);
            snprintf(v, sizeof v, "%d", nnodes);
            setenv("GROUP_WORLD_SIZE", v, 1);
            snprintf(v, sizeof v, "%d", node);
            setenv("GROUP_RANK", v, 1);
            snprintf(v, sizeof v, "node%d", node);
            setenv("GPULAUNCH_HOSTNAME", v, 1);
            setenv("GPULAUNCH_NODE_ADDR", "127.0.0.1", 1);
            snprintf(v, sizeof v, "127.0.0.1:%d", port);
            setenv("GPULAUNCH_RDZV_ENDPOINT", v, 1);
            setenv("GPULAUNCH_RUN_ID", run, 1);
            setenv("GPULAUNCH_ROUND", "1", 1);
            setenv("GPULAUNCH_BACKEND", "cpu", 1);
            for (int i = 0; extra_env && extra_env[i]; i++)
                putenv((char *)extra_env[i]);
            char msg[1024] = "";
            gpl_comm_t c = NULL;
            int rc = 0;
            if (gpl_init(NULL, &c) != GPL_OK) {
                snprintf(msg, sizeof msg, "init: %s", gpl_last_error(c));
                rc = 90;
            } else {
                rc = fn(c, arg, msg, sizeof msg);
            }
            if (write(p[1], msg, strlen(msg)) < 0)
                rc = 91;
            gpl_finalize(c);
            _exit(rc);
        }
        close(p[1]);
        fds[r] = p[0];
    }
    if (drop_node >= 0) {
        usleep((useconds_t)drop_ms * 1000);
        peer_close(&agents[drop_node]);
        drop_node = -1;
    }
    int bad = 0;
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    for (int r = 0; r < world; r++) {
        int st = -1;
        for (;;) {
            pid_t w = waitpid(pids[r], &st, WNOHANG);
            if (w == pids[r])
                break;
            if (now_ms() > deadline) {
                for (int k = 0; k < world; k++)
                    kill(pids[k], SIGKILL);
                waitpid(pids[r], &st, 0);
                st = -1;
                break;
            }
            usleep(2000);
        }
        ssize_t n = read(fds[r], res->msg[r], sizeof res->msg[r] - 1);
        res->msg[r][n > 0 ? n : 0] = '\0';
        close(fds[r]);
        res->status[r] = st;
        if (!(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0))
            bad++;
    }
    for (int n = 0; n < nnodes; n++)
        peer_close(&agents[n]);
    free(agents);
    proc_kill(&srv, SIGTERM);
    proc_wait(&srv, 5000);
    if (getenv("RT_SHOW_SERVER"))
        fprintf(stderr, "server output:\n%s\n", srv.out);
    return bad ? -1 : 0;
}
