/* A budgeted pool of aligned I/O buffers, in power-of-two classes from 4 KiB
 * up. A freed buffer is kept for reuse: a fresh one costs a page fault per
 * 4 KiB on first touch, and at tens of thousands of small files a second
 * those faults were a tenth of the copier's CPU. Cached buffers count
 * against the budget and are given back when another class needs room, so
 * the pool never holds more than the budget. One thread owns a pool. */
#ifndef STAGE_BUFPOOL_H
#define STAGE_BUFPOOL_H

#include <stdbool.h>
#include <stdint.h>

#define BUFPOOL_CLASSES 20      /* 4 KiB .. 2 GiB */

struct bufpool {
	uint64_t budget;         /* bytes, live plus cached */
	uint64_t used;           /* bytes allocated: live plus cached */
	uint64_t live;           /* bytes handed out */
	void *cache[BUFPOOL_CLASSES]; /* free lists; the link is in the buffer */
};

void bufpool_init(struct bufpool *bp, uint64_t budget);
/* A buffer of at least size bytes, 4096-aligned; *cap is its real size.
 * NULL when the budget is spent (wait for a put) or memory is short. */
void *bufpool_get(struct bufpool *bp, uint64_t size, uint32_t *cap);
void bufpool_put(struct bufpool *bp, void *buf, uint32_t cap);
/* Whether a buffer of size could be had now. */
bool bufpool_room(const struct bufpool *bp, uint64_t size);
void bufpool_destroy(struct bufpool *bp);

#endif
