/* The probe tests' bed (probe_bed.h). */
#include "probe_bed.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

proc bed_srv;
int bed_port, bed_hport;
peer *P;
int pong_delay_ms[PROBE_BED_NODES];
void (*probe_bed_on_probe)(int i, const rdzv_msg *m);

static void start_server(const char *const *extra) {
    const char *args[8] = {"--http", "127.0.0.1:0"};
    int n = 2;
    for (int i = 0; extra && extra[i] && n < 7; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    cr_assert_eq(rdzv_start(&bed_srv, &bed_port, args), 0, "server did not start: %s", bed_srv.out);
    cr_assert(proc_expect(&bed_srv, " http 127.0.0.1:", 2000), "%s", bed_srv.out);
    bed_hport = (int)strtol(strstr(bed_srv.out, " http 127.0.0.1:") + 16, NULL, 10);
}

void probe_bed_start(const char *const *extra) {
    P = calloc(PROBE_BED_NODES, sizeof *P);
    cr_assert(P != NULL);
    start_server(extra);
}

void probe_bed_stop(void) {
    memset(pong_delay_ms, 0, sizeof pong_delay_ms);
    for (int i = 0; i < PROBE_BED_NODES; i++)
        peer_close(&P[i]);
    free(P);
    proc_kill(&bed_srv, SIGTERM);
    int st = proc_wait(&bed_srv, 5000);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "server exit status %d: %s", st, bed_srv.out);
}

void restart_with_probes_udp(void) {
    proc_kill(&bed_srv, SIGTERM);
    proc_wait(&bed_srv, 5000);
    const char *extra[] = {"--probes", "udp", NULL};
    start_server(extra);
}

void await_assigned(int i, int answers) {
    int assigned = 0, pinged = 0;
    uint64_t until = now_ms() + 3000;
    while ((!assigned || (answers && !pinged)) && now_ms() < until) {
        if (peer_recv(&P[i], 100) != 0)
            continue;
        if (P[i].last.type == RDZV_ASSIGNED)
            assigned = 1;
        if (P[i].last.type == RDZV_PING) {
            pinged = 1;
            if (pong_delay_ms[i])
                usleep((useconds_t)pong_delay_ms[i] * 1000u);
            rdzv_msg pong = {.type = RDZV_PONG, .req_id = P[i].last.req_id};
            peer_send(&P[i], &pong);
        }
        if (P[i].last.type == RDZV_PROBE_REQ && probe_bed_on_probe) /* once the round runs */
            probe_bed_on_probe(i, &P[i].last);
    }
    cr_assert(assigned, "node %d not assigned", i);
    cr_assert_eq(pinged, answers, "node %d: calibration ping %s", i,
                 pinged ? "sent to a node that does not answer" : "missing");
}

void probe_bed_join(int i, const char *run, int n, uint16_t flags, uint16_t peer_port) {
    cr_assert_eq(peer_open(&P[i], bed_port, NULL), 0);
    rdzv_msg m = {.type = RDZV_JOIN, .req_id = 9, .flags = flags};
    snprintf(m.u.join.run_id, sizeof m.u.join.run_id, "%s", run);
    snprintf(m.u.join.hostname, sizeof m.u.join.hostname, "%s-%d", run, i);
    snprintf(m.u.join.addr, sizeof m.u.join.addr, "10.0.0.%d", i + 1);
    m.u.join.nproc = 1;
    m.u.join.static_rank = i;
    m.u.join.min_nodes = m.u.join.max_nodes = (uint32_t)n;
    m.u.join.peer_port = peer_port;
    peer_send(&P[i], &m);
}

double metric_of(const char *name) {
    static char body[65536];
    cr_assert_eq(http_get_local(bed_hport, "/metrics", body, sizeof body), 200);
    return prom_value(body, name);
}
