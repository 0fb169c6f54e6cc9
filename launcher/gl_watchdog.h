/* The hang watchdog (--progress-timeout): a local worker that shows no
 * progress on the channel (gl_progress.h) for the timeout is named and its
 * stacks are dumped when it registered a signal for that. A gl_watchdog is
 * embedded by its owner (gl_main.c), reads the worker group it was given and
 * reports the hang through on_hang: restarting the job's workers through the
 * rendezvous is the owner's to do. */
#ifndef GPULAUNCH_GL_WATCHDOG_H
#define GPULAUNCH_GL_WATCHDOG_H

#include <stdint.h>
#include <uv.h>

#include "gl_options.h"
#include "gl_workers.h"

#define GL_WATCH_TICK_MS 100 /* how often the slots are looked at */
#define GL_HANG_VICTIM_GRACE_MS                                                                    \
    500                           /* ranks all blocked in a collective: time for the               \
                                     node of the rank they wait for to name it first */
#define GL_SAVE_TIMEOUT_FACTOR 10 /* a rank in checkpoint I/O is hung after 10x the timeout */
#define GL_STACK_DUMP_MS 300      /* from the stack signal to stopping the worker */
#define GL_AUTO_WARMUP_STEPS 5    /* auto: steps before the step time is learned */
#define GL_AUTO_FACTOR 10         /* auto: timeout = factor x the slowest step seen ... */
/* ... and at least GL_AUTO_FLOOR_DEFAULT_S (gl_options.h), or auto:FLOOR */
#define GL_EXIT_HUNG 201 /* a rank hung and no restarts were left */

typedef struct gl_watchdog gl_watchdog;
/* Whether the round already ends for reasons the group does not know (over
 * at the rendezvous, failed, the launcher exiting): nobody is judged then. */
typedef int (*gl_watchdog_ending_cb)(gl_watchdog *wd);
/* culprit hung (detail: for how long, behind what; the rendezvous names rank
 * and node itself), its stacks dumped. The owner stops what it must and calls
 * gl_watchdog_kill_hung, in the order it wants. */
typedef void (*gl_watchdog_hang_cb)(gl_watchdog *wd, const worker *culprit, const char *detail);

typedef struct gl_watch gl_watch;

struct gl_watchdog {
    void *data; /* the owner's */
    /* private */
    uv_loop_t *loop;
    const gl_config *cfg;
    const char *hostname;
    const gl_group *group;
    gl_watchdog_ending_cb ending;
    gl_watchdog_hang_cb on_hang;
    uv_timer_t tick, dump;
    int inited;
    gl_watch *w;
    int n;
    int fired;
    uint64_t victims_since; /* every silent rank waits in a collective: since when */
    double learned_s;       /* auto: the timeout learned (0: still warming up) */
    double said_s;          /* auto: the timeout last said */
    int culprit;            /* local rank named */
    int *kill;              /* per local rank: SIGKILL it after the stack dump */
    int *silent;            /* per local rank: no progress for the timeout */
    char detail[768];
    char msg[1024];
};

/* Sets wd up; nothing runs before the first gl_watchdog_round. cfg, hostname
 * and group must outlive it. */
void gl_watchdog_init(gl_watchdog *wd, uv_loop_t *loop, const gl_config *cfg, const char *hostname,
                      const gl_group *group, gl_watchdog_ending_cb ending,
                      gl_watchdog_hang_cb on_hang);
/* Starts watching the round's workers (called after each spawn). */
void gl_watchdog_round(gl_watchdog *wd);
/* 1 while hung ranks print their stacks (from the hang found to on_hang). */
int gl_watchdog_dumping(const gl_watchdog *wd);
/* SIGKILLs the ranks found hung that still run. */
void gl_watchdog_kill_hung(gl_watchdog *wd);

#endif
