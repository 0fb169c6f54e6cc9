/* The hang watchdog (--progress-timeout): a local worker that shows no
 * progress on the channel (gl_progress.h) for the timeout is named, its
 * stacks are dumped when it registered a signal for that, and the whole job
 * restarts its workers through the rendezvous. */
#ifndef GPULAUNCH_GL_WATCHDOG_H
#define GPULAUNCH_GL_WATCHDOG_H

#define GL_WATCH_TICK_MS 100 /* how often the slots are looked at */
#define GL_HANG_VICTIM_GRACE_MS                                                                    \
    500 /* ranks all blocked in a collective: time for the                                         \
           node of the rank they wait for to name it first */
#define GL_WAIT_ALIVE_MS                                                                           \
    1000 /* a rank waiting in libgpulaunch's collective says so every 100 ms                       \
          */
#define GL_SAVE_TIMEOUT_FACTOR 10 /* a rank in checkpoint I/O is hung after 10x the timeout */
#define GL_STACK_DUMP_MS 300      /* from the stack signal to stopping the worker */
#define GL_AUTO_WARMUP_STEPS 5    /* auto: steps before the step time is learned */
#define GL_AUTO_FACTOR 10         /* auto: timeout = factor x the slowest step seen ... */
/* ... and at least GL_AUTO_FLOOR_DEFAULT_S (gl_options.h), or auto:FLOOR */
#define GL_EXIT_HUNG 201 /* a rank hung and no restarts were left */

/* Starts watching the round's workers (called after each spawn). */
void gl_watchdog_round(void);

#endif
