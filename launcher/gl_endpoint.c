/* Whether a rendezvous endpoint names this machine (see gl_endpoint.h). */
#include "gl_endpoint.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

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
