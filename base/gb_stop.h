/* How a launcher tells its workers why it stops them. A preemption is a plain
 * SIGTERM (kill): a worker with a checkpoint handler saves the step and exits.
 * When the worker's round is over instead (a peer failed, a node left or
 * joined) its state is discarded, so a short grace after the SIGTERM the
 * launcher sends SIGTERM again, with sigqueue and this value: a checkpoint
 * handler then gives SIGTERM its default action at once, so that a worker
 * stuck in a framework's collective with a dead peer is not held until
 * --shutdown-timeout. */
#ifndef GPULAUNCH_GB_STOP_H
#define GPULAUNCH_GB_STOP_H

#define GB_SIGVAL_ROUND_OVER 0x676c5244 /* "glRD" */

#endif
