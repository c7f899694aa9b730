/* The two clocks, read in one place.
 *
 * Monotonic for every duration, deadline and rate (it never jumps, and a
 * clock under libfaketime or an NTP step cannot stretch a timeout); the
 * wall clock only where a time is compared with file times or shown to a
 * person. */
#ifndef STAGE_CLOCK_H
#define STAGE_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Nanoseconds on CLOCK_MONOTONIC. */
static inline uint64_t mono_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}

/* Milliseconds on CLOCK_MONOTONIC, signed for deadline arithmetic. */
static inline int64_t mono_ms(void)
{
	return (int64_t)(mono_ns() / 1000000u);
}

/* A CLOCK_MONOTONIC time in ns as the deadline pthread_cond_timedwait
 * takes, for a condition made by mono_cond_init. */
static inline struct timespec mono_timespec(uint64_t ns)
{
	return (struct timespec){ .tv_sec = (time_t)(ns / 1000000000ull),
				  .tv_nsec = (long)(ns % 1000000000ull) };
}

/* A condition variable whose timed waits run on CLOCK_MONOTONIC: a wall
 * clock set back (or under libfaketime) cannot stretch them. */
static inline void mono_cond_init(pthread_cond_t *c)
{
	pthread_condattr_t ca;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(c, &ca);
	pthread_condattr_destroy(&ca);
}

/* Nanoseconds since the epoch (CLOCK_REALTIME): comparable with mtimes. */
static inline uint64_t wall_ns(void)
{
	return clock_ns(CLOCK_REALTIME);
}

#endif
