/* Monotonic and wall clocks in the units the code uses. */
#ifndef GPULAUNCH_GB_TIME_H
#define GPULAUNCH_GB_TIME_H

#include <stdint.h>

uint64_t gb_now_ns(void); /* CLOCK_MONOTONIC */
uint64_t gb_now_ms(void); /* CLOCK_MONOTONIC */
double gb_wall_s(void);   /* CLOCK_REALTIME, seconds since the epoch */

#endif
