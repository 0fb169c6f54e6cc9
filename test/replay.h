/* The restart arm of the live re-formation scenarios (test_reform_live.c,
 * test_churn.c): what the live job did (its re-formations, as its ranks said
 * them, and the per-step trace of rank 0's parameters) replayed as the same
 * job restarted from checkpoints of the steps it re-formed after, into the
 * same worlds, on the bed of faultbed.h; live and restart must agree bit for
 * bit. */
#ifndef GPULAUNCH_TEST_REPLAY_H
#define GPULAUNCH_TEST_REPLAY_H

#include "faultbed.h"

#define TRACE_STEPS 65536 /* steps a trace may hold (the churn scenario's longest run) */
#define MAX_SEGS 512      /* re-formations replayed (the churn scenario: one a change) */

extern int replay_pytorch; /* the restart arm runs train_ddp.py, not dp_train */

/* A job of nhosts dp_train nodes, fixed size, into ckdir (the restart arm). */
void run_fixed(int nhosts, const char *steps, const char *ck_every, const char *ckdir,
               const char *state_mib);
/* The logs of a restart-arm run of nhosts nodes, under <tag>-host<i>. */
void save_run_logs(const char *tag, int nhosts);
/* dp_train's rank 0 (and train_ddp.py's) appends its parameters' hash after
 * every step to <dir>/trace-<name>. */
void trace_to(const char *name);
/* The step rank 0 of the first nhosts nodes resumed from, -1 when none did. */
long resumed_step(int nhosts);
/* The job's re-formations in round order: the world each went on in and the
 * step it went on after. */
int reformations(int world[MAX_SEGS], long after[MAX_SEGS]);
/* The same job restarted at each of the n steps after[] into world[], from a
 * start in a world of world0 to `steps`: its parameters must equal live. */
void replay_agrees(const char *tag, int world0, const char *steps, const char *state_mib,
                   const char *live, int n, const int *world, const long *after);
/* replay_agrees with the re-formations the live job's ranks reported. */
void expect_restart_agrees(const char *tag, int world0, const char *steps, const char *state_mib,
                           const char *live);

#endif
