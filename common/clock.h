/* The two clocks, read in one place.
 *
 * Monotonic for every duration, deadline and rate (it never jumps, and a
 * clock under libfaketime or an NTP step cannot stretch a timeout); the
 * wall clock only where a time is compared with file times or shown to a
 * person. */
#ifndef STAGE_CLOCK_H
#define STAGE_CLOCK_H

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

/* Nanoseconds since the epoch (CLOCK_REALTIME): comparable with mtimes. */
static inline uint64_t wall_ns(void)
{
	return clock_ns(CLOCK_REALTIME);
}

#endif
