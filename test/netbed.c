/* The multi-node test bed: see netbed.h. */
#include "netbed.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NETBED_LINK GPL_BUILD_DIR "/test/netbed_link"

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    if (st != 0)
        fprintf(stderr, "netbed: '%s' failed (status %d)\n", cmd, st);
    return st == 0 ? 0 : -1;
}

static void ns_name(const netbed *b, int host, char *buf, size_t len) {
    if (host < 0)
        snprintf(buf, len, "%sbr", b->prefix);
    else
        snprintf(buf, len, "%sh%d", b->prefix, host);
}

void netbed_addr(int host, char *buf, size_t len) {
    snprintf(buf, len, NETBED_SUBNET "%d", NETBED_HOST_BASE + host);
}

int netbed_available(char *why, size_t len) {
    if (geteuid() != 0) {
        snprintf(why, len, "the test bed needs root (network namespaces)");
        return 0;
    }
    if (system("ip netns list >/dev/null 2>&1") != 0) {
        snprintf(why, len, "'ip netns' does not work here (iproute2 missing?)");
        return 0;
    }
    if (system("unshare --uts true >/dev/null 2>&1") != 0) {
        snprintf(why, len, "'unshare --uts' does not work here (util-linux missing?)");
        return 0;
    }
    return 1;
}

/* SIGKILLs every process in namespace ns; returns how many. */
static int signal_ns_pids(const char *ns, int sig) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ip netns pids %s 2>/dev/null", ns);
    FILE *f = popen(cmd, "r");
    int n = 0;
    if (f) {
        long pid;
        while (fscanf(f, "%ld", &pid) == 1)
            if (kill((pid_t)pid, sig) == 0)
                n++;
        pclose(f);
    }
    return n;
}

/* Kills what runs in a namespace (until nothing is left), then deletes it. */
static void ns_remove(const char *ns) {
    for (int round = 0; round < 20 && signal_ns_pids(ns, SIGKILL) > 0; round++)
        usleep(20000);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null; rm -rf /etc/netns/%s", ns, ns);
    if (system(cmd) != 0) { /* already gone */
    }
}

void netbed_reap_stale(void) {
    DIR *d = opendir("/var/run/netns");
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid;
        char rest[64];
        if (sscanf(e->d_name, "gplt%ld%63s", &pid, rest) != 2)
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* its test still runs */
        ns_remove(e->d_name);
    }
    closedir(d);
}

static int up_bridge(netbed *b) {
    char br[40], ns[40], ip[32];
    ns_name(b, -1, br, sizeof br);
    if (sh("ip netns add %s && ip -n %s link set lo up && ip -n %s link add br0 type bridge && "
           "ip -n %s link set br0 up",
           br, br, br, br))
        return -1;
    for (int i = 0; i < b->nhosts; i++) {
        ns_name(b, i, ns, sizeof ns);
        netbed_addr(i, ip, sizeof ip);
        if (sh("ip netns add %s && ip -n %s link set lo up && "
               "ip -n %s link add v%d type veth peer name eth0 netns %s && "
               "ip -n %s link set v%d master br0 && ip -n %s link set v%d up && "
               "ip -n %s addr add %s/24 dev eth0 && ip -n %s link set eth0 up",
               ns, ns, br, i, ns, br, i, br, i, ns, ip, ns))
            return -1;
    }
    return 0;
}

static int up_tun(netbed *b, int delay_ms, int loss_pct) {
    char *argv[8 + NETBED_MAX_HOSTS];
    char a1[16], a2[16], a3[16], names[NETBED_MAX_HOSTS][24];
    int n = 0;
    snprintf(a1, sizeof a1, "%d", delay_ms);
    snprintf(a2, sizeof a2, "%d", loss_pct);
    snprintf(a3, sizeof a3, "%d", (int)getpid());
    argv[n++] = NETBED_LINK;
    argv[n++] = a1;
    argv[n++] = a2;
    argv[n++] = a3;
    for (int i = 0; i < b->nhosts; i++) {
        snprintf(names[i], sizeof names[i], "%st%d", b->prefix, i);
        argv[n++] = names[i];
    }
    argv[n] = NULL;
    static proc link;
    if (proc_start(&link, argv, NULL) != 0 || !proc_expect(&link, "ready", 5000)) {
        fprintf(stderr, "netbed: netbed_link did not start: %s\n", link.out);
        return -1;
    }
    b->link_pid = link.pid;
    for (int i = 0; i < b->nhosts; i++) {
        char ns[40], ip[32];
        ns_name(b, i, ns, sizeof ns);
        netbed_addr(i, ip, sizeof ip);
        if (sh("ip netns add %s && ip -n %s link set lo up && ip link set %s netns %s && "
               "ip -n %s link set %s name eth0 && ip -n %s addr add %s/24 dev eth0 && "
               "ip -n %s link set eth0 up",
               ns, ns, names[i], ns, ns, names[i], ns, ip, ns))
            return -1;
    }
    return 0;
}

/* ip netns exec bind-mounts /etc/netns/<ns>/hosts over /etc/hosts: every
 * host resolves every other host's name, as in a cluster. */
static int write_hosts(netbed *b) {
    for (int i = 0; i < b->nhosts; i++) {
        char ns[40], path[128], ip[32];
        ns_name(b, i, ns, sizeof ns);
        snprintf(path, sizeof path, "/etc/netns/%s", ns);
        if (mkdir("/etc/netns", 0755) != 0 && errno != EEXIST)
            return -1;
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return -1;
        snprintf(path, sizeof path, "/etc/netns/%s/hosts", ns);
        FILE *f = fopen(path, "w");
        if (f == NULL)
            return -1;
        fprintf(f, "127.0.0.1 localhost\n");
        for (int h = 0; h < b->nhosts; h++) {
            netbed_addr(h, ip, sizeof ip);
            fprintf(f, "%s host%d\n", ip, h);
        }
        fclose(f);
    }
    return 0;
}

int netbed_up(netbed *b, int nhosts, int delay_ms, int loss_pct, const char *dir) {
    memset(b, 0, sizeof *b);
    netbed_reap_stale();
    if (nhosts < 2 || nhosts > NETBED_MAX_HOSTS)
        return -1;
    snprintf(b->prefix, sizeof b->prefix, "gplt%d", (int)getpid());
    snprintf(b->dir, sizeof b->dir, "%s", dir);
    b->nhosts = nhosts;
    int rc = delay_ms > 0 || loss_pct > 0 ? up_tun(b, delay_ms, loss_pct) : up_bridge(b);
    if (rc == 0)
        rc = write_hosts(b);
    if (rc != 0)
        netbed_down(b);
    return rc;
}

void netbed_down(netbed *b) {
    if (b->nhosts == 0)
        return;
    char ns[40];
    for (int i = 0; i < b->nhosts; i++) {
        ns_name(b, i, ns, sizeof ns);
        ns_remove(ns);
    }
    ns_name(b, -1, ns, sizeof ns);
    ns_remove(ns);
    if (b->link_pid > 0) {
        kill(b->link_pid, SIGTERM);
        waitpid(b->link_pid, NULL, 0);
        b->link_pid = 0;
    }
    b->nhosts = 0;
}

int netbed_spawn(netbed *b, int host, proc *p, char *const argv[]) {
    char ns[40], name[16];
    ns_name(b, host, ns, sizeof ns);
    snprintf(name, sizeof name, "host%d", host);
    char *full[64];
    int n = 0;
    full[n++] = "/usr/bin/env";
    full[n++] = "ip";
    full[n++] = "netns";
    full[n++] = "exec";
    full[n++] = ns;
    full[n++] = "unshare";
    full[n++] = "--uts";
    full[n++] = "--";
    full[n++] = "/bin/sh";
    full[n++] = "-c";
    full[n++] = "hostname \"$0\" && exec \"$@\"";
    full[n++] = name;
    for (int i = 0; argv[i] && n < 63; i++)
        full[n++] = argv[i];
    full[n] = NULL;
    return proc_start(p, full, NULL);
}

int netbed_http_get(netbed *b, int host, int port, const char *path, char *out, size_t len) {
    char ns[40], at[96];
    ns_name(b, host, ns, sizeof ns);
    snprintf(at, sizeof at, "/var/run/netns/%s", ns);
    int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int there = open(at, O_RDONLY | O_CLOEXEC);
    int code = 0;
    out[0] = '\0';
    if (self >= 0 && there >= 0 && setns(there, CLONE_NEWNET) == 0) {
        code = http_get_local(port, path, out, len);
        if (setns(self, CLONE_NEWNET) != 0) {
            perror("netbed_http_get: back to the test's own network namespace");
            abort(); /* every later socket would be on the host's network */
        }
    }
    if (self >= 0)
        close(self);
    if (there >= 0)
        close(there);
    return code;
}

/* On the TUN fabric the host's own device goes down: its packets go
 * nowhere (a process on it that sends between the cut and its kill sees an
 * error; netbed_cut is followed by the kill at once). */
int netbed_stall_tcp(netbed *b, int host, const char *comm, int to_host, int port, int flags) {
    char ns[40], to[40], back[160] = "", cmd[1024];
    ns_name(b, host, ns, sizeof ns);
    ns_name(b, to_host, to, sizeof to);
    if (flags & NETBED_STALL_BOTH)
        snprintf(back, sizeof back,
                 " && ip netns exec %s iptables -I INPUT -p tcp --sport %d --dport \"$p\" -j DROP",
                 ns, port);
    /* "ss -p" names the owner as users:(("comm",pid=..)); the local port is the third column;
     * with -i each connection's second line says bytes_acked (1: the SYN alone). Dropped where
     * they arrive, not as they leave: a packet dropped on its own host's output is never in
     * flight, and TCP does not back off for it. */
    snprintf(cmd, sizeof cmd,
             "ip netns exec %s ss -Htnpi state established '( dport = :%d )' | "
             "awk -v used=%d '/users:\\(\\(\"%s\",/ { n = split($3, a, \":\"); p = a[n]; "
             "getline; acked = 0; if (match($0, /bytes_acked:[0-9]+/)) "
             "acked = substr($0, RSTART + 12, RLENGTH - 12) + 0; "
             "if (!used || acked > 1) print p }' | "
             "while read p; do ip netns exec %s iptables -I INPUT -p tcp --sport \"$p\" "
             "--dport %d -j DROP%s && echo \"$p\"; done",
             ns, port, (flags & NETBED_STALL_USED) != 0, comm, to, port, back);
    FILE *f = popen(cmd, "r");
    if (f == NULL)
        return -1;
    int n = 0, p;
    while (fscanf(f, "%d", &p) == 1)
        n++;
    return pclose(f) == 0 ? n : -1;
}

int netbed_unstall_tcp(netbed *b, int host, int to_host) {
    char ns[40], to[40];
    ns_name(b, host, ns, sizeof ns);
    ns_name(b, to_host, to, sizeof to);
    return sh("ip netns exec %s iptables -F INPUT && ip netns exec %s iptables -F INPUT", ns, to);
}

int netbed_cut(netbed *b, int host) {
    char ns[40];
    ns_name(b, b->link_pid ? host : -1, ns, sizeof ns);
    if (b->link_pid)
        return sh("ip -n %s link set eth0 down", ns);
    return sh("ip -n %s link set v%d down", ns, host);
}

int netbed_restore(netbed *b, int host) {
    char ns[40];
    ns_name(b, b->link_pid ? host : -1, ns, sizeof ns);
    if (b->link_pid)
        return sh("ip -n %s link set eth0 up", ns);
    return sh("ip -n %s link set v%d up", ns, host);
}

int netbed_kill_host(netbed *b, int host) {
    char ns[40];
    ns_name(b, host, ns, sizeof ns);
    return signal_ns_pids(ns, SIGKILL);
}

int netbed_signal_host(netbed *b, int host, int sig) {
    char ns[40];
    ns_name(b, host, ns, sizeof ns);
    return signal_ns_pids(ns, sig);
}

int netbed_host_procs(netbed *b, int host) { return netbed_signal_host(b, host, 0); }

void netbed_save_log(netbed *b, const char *name, const proc *p) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s.log", b->dir, name);
    FILE *f = fopen(path, "a");
    if (f == NULL)
        return;
    fwrite(p->out, 1, p->out_len, f);
    fclose(f);
}
