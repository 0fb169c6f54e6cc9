/* Where this node's rendezvous is (see gl_endpoint.h): whether an endpoint
 * names this machine, and --check's look at it. */
#include "gl_endpoint.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gb_time.h"
#include "gpulaunch/rdzv.h"

static int is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    return 0;
}

static int same_addr(const struct sockaddr *a, const struct sockaddr *b) {
    if (a->sa_family != b->sa_family)
        return 0;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return 0;
}

/* Whether sa is an address of one of this machine's interfaces. */
static int is_ours(const struct sockaddr *sa) {
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        return 0;
    int found = 0;
    for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next)
        found = i->ifa_addr && same_addr(i->ifa_addr, sa);
    freeifaddrs(ifs);
    return found;
}

int gl_endpoint_locality(const char *host) {
    if (strcasecmp(host, "localhost") == 0)
        return GL_EP_LOOPBACK;
    char me[256] = "";
    if (gethostname(me, sizeof me - 1) == 0 && strcasecmp(host, me) == 0)
        return GL_EP_HERE;
    /* the FQDN, as the resolver names this host */
    struct addrinfo hints = {.ai_flags = AI_CANONNAME, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (me[0] && getaddrinfo(me, NULL, &hints, &res) == 0) {
        int same = res->ai_canonname && strcasecmp(res->ai_canonname, host) == 0;
        freeaddrinfo(res);
        if (same)
            return GL_EP_HERE;
    }
    /* a name or address: every address it resolves to is looked at */
    struct addrinfo h2 = {.ai_socktype = SOCK_STREAM};
    if (getaddrinfo(host, NULL, &h2, &res) != 0)
        return GL_EP_REMOTE;
    int loop = 0, here = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        if (is_loopback(a->ai_addr))
            loop = 1;
        else if (is_ours(a->ai_addr))
            here = 1;
    }
    freeaddrinfo(res);
    return here ? GL_EP_HERE : loop ? GL_EP_LOOPBACK : GL_EP_REMOTE;
}

const char *gl_endpoint_loopback_listen(const char *host) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return "127.0.0.1";
    int v4 = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next)
        v4 |= a->ai_family == AF_INET && is_loopback(a->ai_addr);
    freeaddrinfo(res);
    return v4 ? "127.0.0.1" : "::1";
}

/* --check: the rendezvous this node would join resolves and answers. Retries
 * with backoff (a pod's DNS name appears late) within the join timeout, at
 * most 10 s. Returns the number of FAILs. */
int gl_endpoint_check(const gl_config *cfg) {
    char host[256];
    int port;
    if (cfg->mode == GL_MODE_STANDALONE || (cfg->mode == GL_MODE_STATIC && cfg->node_rank == 0))
        return 0; /* this node hosts it */
    if (cfg->mode == GL_MODE_STATIC) {
        snprintf(host, sizeof host, "%s", cfg->val[GL_MASTER_ADDR]);
        port = cfg->master_port;
    } else if (rdzv_parse_endpoint(cfg->val[GL_RDZV_ENDPOINT], RDZV_DEFAULT_PORT, host, sizeof host,
                                   &port) != GPL_OK) {
        return 1;
    } else if (cfg->rdzv_is_host == 1 ||
               (cfg->rdzv_is_host == -1 && gl_endpoint_locality(host) != GL_EP_REMOTE)) {
        /* this node would host it, unless the port is held here already */
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
        char ps[16];
        snprintf(ps, sizeof ps, "%d", port);
        int held = 0;
        if (getaddrinfo(host, ps, &hints, &res) == 0) {
            int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            held = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
            if (fd >= 0)
                close(fd);
            freeaddrinfo(res);
        }
        if (held)
            printf("ok   rendezvous %s:%d resolves and answers (the port is held on this "
                   "machine: this node joins whoever holds it)\n",
                   host, port);
        else
            printf("ok   rendezvous %s:%d names this machine and nothing holds the port: "
                   "this launcher will host it\n",
                   host, port);
        return 0;
    }
    uint64_t budget = cfg->join_timeout_ms < 10000 ? cfg->join_timeout_ms : 10000;
    uint64_t deadline = gb_now_ms() + budget;
    unsigned backoff = 100;
    int resolved = 0;
    char why[256] = "";
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
        char ps[16];
        snprintf(ps, sizeof ps, "%d", port);
        int g = getaddrinfo(host, ps, &hints, &res);
        if (g == 0) {
            resolved = 1;
            int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            int ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
            snprintf(why, sizeof why, "%s", ok ? "" : strerror(errno));
            if (fd >= 0)
                close(fd);
            freeaddrinfo(res);
            if (ok) {
                printf("ok   rendezvous %s:%d resolves and answers\n", host, port);
                return 0;
            }
        } else {
            snprintf(why, sizeof why, "%s", gai_strerror(g));
        }
        if (gb_now_ms() + backoff > deadline)
            break;
        usleep(backoff * 1000);
        backoff = backoff < 2000 ? backoff * 2 : 2000;
    }
    if (!resolved)
        printf("FAIL the rendezvous host %s does not resolve (%s) after %.1f s: check "
               "--master-addr / --rdzv-endpoint; in Kubernetes the master pod's DNS name "
               "appears only once it is scheduled\n",
               host, why, budget / 1000.0);
    else
        printf("FAIL nothing answers at %s:%d (%s) after %.1f s: is node rank 0 / the "
               "gpulaunch-rdzv server up, and the port open?\n",
               host, port, why, budget / 1000.0);
    return 1;
}

void gl_endpoint_fqdn(const char *hostname, char *out, size_t len) {
    snprintf(out, len, "%s", hostname);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_flags = AI_CANONNAME}, *res = NULL;
    if (getaddrinfo(hostname, NULL, &hints, &res) != 0)
        return;
    const char *cn = res ? res->ai_canonname : NULL;
    if (cn && strchr(cn, '.') != NULL && strncasecmp(cn, hostname, strlen(hostname)) == 0 &&
        cn[strlen(hostname)] == '.' && strncasecmp(cn, "localhost", 9) != 0 && strlen(cn) < len)
        snprintf(out, len, "%s", cn);
    freeaddrinfo(res);
}

/* Whether port is free to listen on now (any address, no SO_REUSEADDR). */
static int port_free(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

int gl_free_port(void) {
    /* below the kernel's ephemeral range, which bind(0) and connect() draw
     * from: no socket made on the machine between this check and the
     * workers' bind can be given the port (one drawn from the range could:
     * EADDRINUSE in the worker that hosts the store) */
    int lo = 32768; /* the range's first port; Linux's default */
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d", &lo) != 1)
            lo = 32768;
        fclose(f);
    }
    /* from the kernel's random pool: launchers started together (the pid and the clock
     * differ by a few units) drew the same port from pid ^ ms */
    unsigned seed;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed)
        seed = (unsigned)getpid() * 2654435761u ^ (unsigned)gb_now_ms() * 40503u;
    for (int i = 0; i < GL_PORT_TRIES && lo - GL_PORT_FLOOR >= GL_PORT_TRIES; i++) {
        int port = GL_PORT_FLOOR + (int)(rand_r(&seed) % (unsigned)(lo - GL_PORT_FLOOR));
        if (port_free(port))
            return port;
    }
    /* no room below the range (or every try taken): the kernel's pick */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t len = sizeof sa;
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}
