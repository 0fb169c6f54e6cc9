/* The rendezvous soak's hostile connections (rdzv_soak.c): garbage, a frame
 * longer than any the server takes, a wrong token, and silence; each must be
 * closed by the server (the last by its handshake timeout), or it is a
 * violation. */
#ifndef GPULAUNCH_SOAK_HOSTILE_H
#define GPULAUNCH_SOAK_HOSTILE_H

#include <stdint.h>
#include <uv.h>

#define SOAK_HOSTILE_MAX 64 /* hostile connections open at once */

/* How the soak draws (its seeded generator) and says a violation. */
typedef uint32_t (*soak_rnd_fn)(void);
typedef void (*soak_violation_fn)(const char *text);

/* Connections go to 127.0.0.1:port on loop; one still open handshake_ms +
 * answer_ms after it began is a violation. */
void soak_hostile_init(uv_loop_t *loop, int port, uint32_t handshake_ms, uint32_t answer_ms,
                       soak_rnd_fn rnd, soak_violation_fn violation);
/* Opens one of a kind drawn at random (none when SOAK_HOSTILE_MAX are open). */
void soak_hostile_start(uint64_t now);
/* Connections the server should have closed by now. */
void soak_hostile_check(uint64_t now);
/* Closes every one still open (the soak's end, and before a server restart:
 * one connecting while the server is killed is reset, rightly). */
void soak_hostile_close_all(void);
int soak_hostile_open(void);        /* open now */
uint64_t soak_hostile_closed(void); /* closed by the server so far */

#endif
