/* Fan-out: one push (a round's assignments, a round-over notice) written to
 * many sockets, shared with helper threads when there are many. */
#ifndef GPULAUNCH_RDZV_FANOUT_H
#define GPULAUNCH_RDZV_FANOUT_H

#include <stddef.h>
#include <stdint.h>

/* Below this many sockets the loop thread writes alone. */
#define RDZV_FANOUT_PARALLEL_MIN 256
/* Helper threads at most (fewer on machines with fewer CPUs: online CPUs - 1). */
#define RDZV_FANOUT_MAX_HELPERS 3

typedef struct rdzv_fan_item {
    int fd;            /* -1: not written here (the caller queues it) */
    uint32_t off, len; /* the frame's bytes in the shared data */
    uint32_t sent;     /* set by rdzv_fanout_run: bytes the socket took */
} rdzv_fan_item;

typedef struct rdzv_fanout rdzv_fanout;

/* The helpers start on the first parallel run; NULL only when out of memory. */
rdzv_fanout *rdzv_fanout_new(void);
/* Stops and joins the helpers. */
void rdzv_fanout_free(rdzv_fanout *f);
/* Sends every item's frame with non-blocking send(2) (no SIGPIPE) and records
 * what each socket took; returns when all are done. Only the kernel call runs
 * on helpers; the caller handles what a socket did not take. */
void rdzv_fanout_run(rdzv_fanout *f, rdzv_fan_item *items, size_t n, const uint8_t *data);
/* Helper threads running (0 before the first parallel run or on one CPU). */
int rdzv_fanout_helpers(const rdzv_fanout *f);

#endif
