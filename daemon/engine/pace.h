/* A rate cap: a token bucket over bytes, for one thread. Whatever moves
 * bytes under a configured rate (a replication sender, a restore's holder,
 * the durable drain) takes them here before it moves them, and sleeps when
 * it is ahead; a burst of PACE_BURST_NS is allowed. */
#ifndef STAGE_PACE_H
#define STAGE_PACE_H

#include <stddef.h>
#include <stdint.h>

#define PACE_BURST_NS 50000000ull       /* 50 ms */

struct pace {
	uint64_t rate;                  /* bytes/s, 0: no cap */
	uint64_t tokens_t;              /* monotonic ns the bucket is drained to */
};

static inline void pace_init(struct pace *p, uint64_t rate)
{
	p->rate = rate;
	p->tokens_t = 0;
}

/* Takes n bytes, sleeping first as long as the cap asks. */
void pace_take(struct pace *p, size_t n);

#endif
