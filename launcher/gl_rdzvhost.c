/* The job's rendezvous as this node sees it (docs/architecture.md): its run
 * id and where it is, by the mode (standalone, static: node rank 0's host,
 * dynamic: the endpoint), whether this launcher hosts it (standalone, static
 * node rank 0, or the c10d endpoint's own host by torchrun's rule:
 * gl_endpoint.h) and then its server started on this loop, the endpoint the
 * workers are given, and this node's address. */
#include "gl_rdzvhost.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gb_time.h"
#include "gl_endpoint.h"

int gl_rdzvhost_start(uv_loop_t *loop, const gl_config *cfg, const char *hostname,
                      const char *token, size_t token_len, gl_rdzvhost *p) {
    char err[1024] = "";
    const char *rid = cfg->val[GL_RDZV_ID];
    char *rhost = p->host;
    int rport = 0;
    if (cfg->mode == GL_MODE_STANDALONE) {
        snprintf(p->run_id, sizeof p->run_id, "standalone-%d-%llu", (int)getpid(),
                 (unsigned long long)(gb_now_ns() % 1000000));
        snprintf(p->addr, sizeof p->addr, "127.0.0.1");
        snprintf(rhost, sizeof p->host, "127.0.0.1");
    } else if (cfg->mode == GL_MODE_STATIC) {
        if (strcmp(rid, "none") == 0)
            snprintf(p->run_id, sizeof p->run_id, "static-%s-%d", cfg->val[GL_MASTER_ADDR],
                     cfg->master_port);
        else
            snprintf(p->run_id, sizeof p->run_id, "%s", rid);
        snprintf(rhost, sizeof p->host, "%s", cfg->val[GL_MASTER_ADDR]);
        rport = cfg->master_port;
    } else {
        snprintf(p->run_id, sizeof p->run_id, "%s", strcmp(rid, "none") ? rid : "default");
        rdzv_parse_endpoint(cfg->val[GL_RDZV_ENDPOINT], RDZV_DEFAULT_PORT, rhost, sizeof p->host,
                            &rport);
    }
    if (p->addr[0] == '\0' && cfg->val[GL_LOCAL_ADDR][0])
        snprintf(p->addr, sizeof p->addr, "%s", cfg->val[GL_LOCAL_ADDR]);
    else if (p->addr[0] == '\0')
        gl_endpoint_fqdn(hostname, p->addr, sizeof p->addr);
    int hosts =
        cfg->mode == GL_MODE_STANDALONE || (cfg->mode == GL_MODE_STATIC && cfg->node_rank == 0);
    const char *listen = cfg->mode == GL_MODE_STANDALONE ? "127.0.0.1" : "0.0.0.0";
    /* torchrun's c10d: the launcher on the endpoint's host hosts the
     * rendezvous, a second one there finds the port taken and joins it */
    int self_host = 0, loop_only = 0;
    if (cfg->mode == GL_MODE_DYNAMIC && cfg->rdzv_is_host != 0) {
        int where = cfg->rdzv_is_host == 1 ? GL_EP_HERE : gl_endpoint_locality(rhost);
        self_host = where != GL_EP_REMOTE;
        loop_only = where == GL_EP_LOOPBACK;
        /* every address of this host, IPv6 and IPv4 (a name may resolve to
         * either first); loopback names: the IPv4 one, which clients reach
         * after ::1 (they try each address) */
        listen = loop_only ? gl_endpoint_loopback_listen(rhost) : "::";
        hosts = self_host;
    }
    if (hosts) {
        rdzv_server_options so = RDZV_SERVER_OPTIONS_INIT;
        so.listen_addr = listen;
        so.listen_port = rport;
        so.token = token;
        so.token_len = token_len;
        so.heartbeat_timeout_ms = cfg->hb_timeout_ms;
        gpl_result_t rc = rdzv_server_start(loop, &so, &p->srv, err, sizeof err);
        if (rc == GPL_ERR_SYSTEM && self_host && strcmp(listen, "::") == 0) {
            so.listen_addr = listen = "0.0.0.0"; /* a kernel without IPv6 */
            rc = rdzv_server_start(loop, &so, &p->srv, err, sizeof err);
        }
        if (rc == GPL_ERR_EXISTS && self_host) {
            fprintf(stderr,
                    "gpulaunch: rendezvous %s:%d: the port is taken on this machine; joining "
                    "whoever holds it\n",
                    rhost, rport);
            hosts = 0;
        } else if (rc != GPL_OK) {
            fprintf(stderr, "gpulaunch: %s hosts the rendezvous: %s\n",
                    self_host ? "this launcher (the --rdzv-endpoint names this machine)"
                              : "node rank 0",
                    err);
            return GL_EXIT_RDZV;
        } else {
            rport = rdzv_server_port(p->srv);
            if (self_host)
                fprintf(stderr,
                        "gpulaunch: hosting the rendezvous of job %s at %s:%d (the "
                        "--rdzv-endpoint names this machine)\n",
                        p->run_id, rhost, rport);
        }
    }
    snprintf(p->ep, sizeof p->ep, "%s:%d",
             !hosts                            ? rhost
             : cfg->mode == GL_MODE_STANDALONE ? "127.0.0.1"
             : self_host && loop_only          ? rhost
                                               : p->addr,
             rport);
    p->port = rport;
    return 0;
}
