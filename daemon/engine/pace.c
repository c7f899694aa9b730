#include "daemon/engine/pace.h"

#include <time.h>

#include "common/clock.h"

void pace_take(struct pace *p, size_t n)
{
	uint64_t now, d;

	if (!p->rate)
		return;
	now = mono_ns();
	if (p->tokens_t < now)
		p->tokens_t = now;
	p->tokens_t += (uint64_t)((double)n * 1e9 / (double)p->rate);
	if (p->tokens_t > now + PACE_BURST_NS) {
		d = p->tokens_t - now - PACE_BURST_NS;
		struct timespec ts = { .tv_sec = (time_t)(d / 1000000000ull),
				       .tv_nsec = (long)(d % 1000000000ull) };

		nanosleep(&ts, NULL);
	}
}
