/* The calling thread's name and CPU share: what `top -H` and `ps -L` show of
 * gpulaunch's threads, and background work (a checkpoint's write and drain, a
 * shard copy to a buddy) kept from taking the CPU from training. */
#ifndef GPULAUNCH_GB_THREAD_H
#define GPULAUNCH_GB_THREAD_H

/* How many nice steps a background thread runs below the process (Linux:
 * nice is per thread); GPULAUNCH_BACKGROUND_NICE (0 to 19) sets another. On a machine with idle
 * cores it changes nothing; on one whose cores are busy (data loaders, CPU ranks) the training
 * thread's wake-ups preempt the background work instead of waiting behind it, and the background
 * work still gets about a tenth of a contended core (CFS weights 1024 against 110). */
#define GB_BACKGROUND_NICE 10

/* Names the calling thread (at most 15 characters are kept). */
void gb_thread_name(const char *name);

/* Names the calling thread and lowers its priority by GB_BACKGROUND_NICE or
 * the environment's value (never above 19); threads it starts inherit both. Failures are ignored: a
 * name and a priority change nothing the thread does. */
void gb_thread_background(const char *name);

#endif
