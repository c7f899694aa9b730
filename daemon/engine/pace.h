/* A rate cap: a token bucket over bytes. Whatever moves bytes under a
 * configured rate (a replication sender, a restore's holder, the durable
 * drain) takes them here before it moves them, and sleeps when it is
 * ahead; a burst of PACE_BURST_NS is allowed. Several threads may take from
 * one bucket (a holder serving the lanes of one restore): the bucket is one
 * atomic word. */
#ifndef STAGE_PACE_H
#define STAGE_PACE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define PACE_BURST_NS 50000000ull       /* 50 ms */

struct pace {
	uint64_t rate;                  /* bytes/s, 0: no cap */
	_Atomic uint64_t tokens_t;      /* monotonic ns the bucket is drained to */
};

static inline void pace_init(struct pace *p, uint64_t rate)
{
	p->rate = rate;
	atomic_store(&p->tokens_t, 0);
}

/* Takes n bytes, sleeping first as long as the cap asks. */
void pace_take(struct pace *p, size_t n);

#endif
