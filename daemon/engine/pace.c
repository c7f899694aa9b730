#include "daemon/engine/pace.h"

#include <time.h>

#include "common/clock.h"

void pace_take(struct pace *p, size_t n)
{
	uint64_t now, d, t, nt;

	if (!p->rate)
		return;
	now = mono_ns();
	t = atomic_load(&p->tokens_t);
	do
		nt = (t < now ? now : t) + (uint64_t)((double)n * 1e9 / (double)p->rate);
	while (!atomic_compare_exchange_weak(&p->tokens_t, &t, nt));
	if (nt > now + PACE_BURST_NS) {
		d = nt - now - PACE_BURST_NS;
		struct timespec ts = { .tv_sec = (time_t)(d / 1000000000ull),
				       .tv_nsec = (long)(d % 1000000000ull) };

		nanosleep(&ts, NULL);
	}
}
