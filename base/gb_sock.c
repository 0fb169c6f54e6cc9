/* Socket options the rendezvous's server and its clients share (gb_sock.h). */
#include "gb_sock.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

void gb_sock_thin_stream(int fd) {
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, &one, sizeof one);
}
