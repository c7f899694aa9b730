#include "daemon/engine/bufpool.h"

#include <stdlib.h>

#define MIN_SHIFT 12

static unsigned class_of(uint64_t size)
{
	unsigned c = 0;

	while (((uint64_t)1 << (MIN_SHIFT + c)) < size)
		c++;
	return c;
}

static uint64_t class_size(unsigned c)
{
	return (uint64_t)1 << (MIN_SHIFT + c);
}

void bufpool_init(struct bufpool *bp, uint64_t budget)
{
	*bp = (struct bufpool){ .budget = budget };
}

/* Gives one cached buffer back to the system, the largest first. */
static bool evict(struct bufpool *bp)
{
	for (int c = BUFPOOL_CLASSES - 1; c >= 0; c--) {
		void *b = bp->cache[c];

		if (b) {
			bp->cache[c] = *(void **)b;
			free(b);
			bp->used -= class_size((unsigned)c);
			return true;
		}
	}
	return false;
}

bool bufpool_room(const struct bufpool *bp, uint64_t size)
{
	unsigned c = class_of(size);

	return bp->cache[c] || bp->live + class_size(c) <= bp->budget || bp->live == 0;
}

void *bufpool_get(struct bufpool *bp, uint64_t size, uint32_t *cap)
{
	unsigned c = class_of(size);
	uint64_t cs = class_size(c);
	void *b;

	if (c >= BUFPOOL_CLASSES)
		return NULL;
	b = bp->cache[c];
	if (b) {
		bp->cache[c] = *(void **)b;
	} else {
		/* One buffer may always be had, or a lone file could never start. */
		if (bp->live + cs > bp->budget && bp->live > 0)
			return NULL;
		while (bp->used + cs > bp->budget && evict(bp))
			;
		if (posix_memalign(&b, 4096, cs))
			return NULL;
		bp->used += cs;
	}
	bp->live += cs;
	*cap = (uint32_t)cs;
	return b;
}

void bufpool_put(struct bufpool *bp, void *buf, uint32_t cap)
{
	unsigned c = class_of(cap);

	*(void **)buf = bp->cache[c];
	bp->cache[c] = buf;
	bp->live -= cap;
}

void bufpool_destroy(struct bufpool *bp)
{
	while (evict(bp))
		;
}
