/* Point-to-point TCP between chosen ranks (gpl_chain.c), for the state copy
 * of a re-formed round (gpl_copy_state): the rank that has the state feeds
 * the first rank that needs it, which forwards each byte to the next as soon
 * as it has it, and so on (a pipelined chain). Each link is CHAIN_FLOWS TCP
 * connections (for states of CHAIN_FLOW_MIN or more), each with its own
 * thread and its share of the state: one connection is bound by the one
 * core that runs its sender. Only the ranks in the chain take part; the
 * node ring and shared memory are not used. A rank on the
 * same node as the one that feeds it reads the state from that rank's
 * memory (one copy instead of a socket's two) where the kernel allows. */
#ifndef GPULAUNCH_GPL_CHAIN_H
#define GPULAUNCH_GPL_CHAIN_H

#include <stddef.h>
#include <stdint.h>

#include "gpl_int.h"

/* One link of the chain as this rank sees it. */
typedef struct gpl_chain {
    void *const *bufs; /* the state: n buffers, sent back to back */
    const size_t *bytes;
    int n;
    int prev;              /* the rank that feeds this one; -1 at the head (the state's owner) */
    int listen_fd;         /* where prev connects (gpl_chain_listen); -1 at the head */
    int next;              /* the rank this one feeds; -1 at the tail */
    const char *next_host; /* where next listens */
    int next_port;
    int next_local; /* next is on this node: it may read bufs itself (process_vm_readv) */
} gpl_chain;

/* A listening socket for this rank's feeder: *fd, and the port it got. */
gpl_result_t gpl_chain_listen(gpl_comm_t c, int *fd, int *port);
/* Receives the state from prev (if any) into bufs while sending what has
 * arrived on to next (if any); returns once every rank after this one has
 * all of it (their acknowledgements come back up the chain), so a sender's
 * buffers may change after. Closes ch->listen_fd. GPL_ERR_ROUND_OVER when
 * the round ends meanwhile (also when a link drops because it did),
 * GPL_ERR_PEER_FAILED when a link drops otherwise, GPL_ERR_INVALID_ARG when
 * prev sends another size than bufs hold. */
gpl_result_t gpl_chain_copy(gpl_comm_t c, const gpl_chain *ch, uint64_t deadline_ms);

#endif
