/* Socket options the rendezvous's server and its clients share. */
#ifndef GPULAUNCH_GB_SOCK_H
#define GPULAUNCH_GB_SOCK_H

/* A heartbeat connection is a thin stream (a frame a second, few segments
 * in flight): a segment lost on a slow link is retransmitted at a steady
 * interval instead of one that doubles each time (TCP_THIN_LINEAR_TIMEOUTS,
 * for up to 6 retransmissions), so that two losses in a row on a 2 s round
 * trip stall it for 2 retransmission timeouts, not 3. Ignored where the
 * kernel lacks it. */
void gb_sock_thin_stream(int fd);

#endif
