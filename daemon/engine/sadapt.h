/* How many streams a copy to one partner goes on, when [transfer] streams
 * is 0: a climb on what the copies themselves moved. No I/O here: the
 * sender tells it what each copy moved and in how long, and asks it how
 * many streams the next copy takes.
 *
 * States (a->phase), each transition made by sadapt_measured unless said:
 *   SA_FIRST  nothing measured at the start count yet (a quarter of the
 *             CPUs, within the cap). Measured: a step up (twice as many,
 *             within the cap), or down at the cap -> SA_PROBE, a whole
 *             round (below); with a cap of 1 -> SA_HOLD.
 *   SA_PROBE  n moved from a->base to try it. Measured at n:
 *             up:   at least SADAPT_MORE of base's rate: n is the new base,
 *                   on up (SA_PROBE) or, at the cap, SA_HOLD; less: back
 *                   to base, then in a whole round a step down from it
 *                   (SA_PROBE), else SA_HOLD;
 *             down: at least SADAPT_ASGOOD of base's rate (fewer streams,
 *                   fewer threads and buffers, for as much): n is the new
 *                   base, on down or at 1 SA_HOLD; less: back to base,
 *                   SA_HOLD.
 *   SA_HOLD   n is the choice. After SADAPT_HOLD measured copies a step up
 *             or down, in turn (one probe: a step up that fails goes back
 *             to n) -> SA_PROBE; after two copies in a row that moved less
 *             than SADAPT_DROP of n's mean (the link, the partner or this
 *             node changed: one slow copy is not enough) a whole round
 *             from n, their mean its base -> SA_PROBE.
 *   any       sadapt_opened: fewer streams could be opened than n ->
 *             SA_HOLD at that many (tried again at the next probe).
 *
 * Invariants: 1 <= n <= cap <= SADAPT_MAX; rate[k] is what k streams moved
 * when last measured (at the held count, a running mean); a probe's base
 * has been measured. A copy too small to measure (SADAPT_MIN_BYTES,
 * SADAPT_MIN_NS: a small copy measures the round trips, not the streams)
 * moves no state. The caller serializes the calls, and leaves out copies
 * whose time was not the streams' (a hand-off, held chunks, a pause). */
#ifndef STAGE_SADAPT_H
#define STAGE_SADAPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SADAPT_MAX 16
#define SADAPT_MIN_BYTES (32ull << 20)  /* raw bytes a measured copy sent at least */
#define SADAPT_MIN_NS 200000000ull      /* ... in at least 200 ms */
#define SADAPT_MORE 1.10                /* twice the streams must move 10 % more */
#define SADAPT_ASGOOD 0.95              /* half the streams may move 5 % less */
#define SADAPT_DROP 0.70                /* a held count moving 30 % less is probed again */
#define SADAPT_HOLD 16                  /* measured copies between probes */

enum sadapt_phase { SA_FIRST, SA_PROBE, SA_HOLD };

struct sadapt {
	unsigned cap;                   /* the most streams: 1..SADAPT_MAX */
	unsigned n;                     /* the next copy's streams */
	unsigned base;                  /* SA_PROBE: the count n is compared with */
	enum sadapt_phase phase;
	unsigned held;                  /* SA_HOLD: measured copies since the choice */
	bool down_tried;                /* SA_PROBE: no step down in this round */
	bool next_up;                   /* SA_HOLD: the next probe's way, when there is room */
	unsigned slow;                  /* SA_HOLD: copies in a row under SADAPT_DROP */
	double slow_r;                  /* ... the first one's rate */
	double rate[SADAPT_MAX + 1];    /* bytes/s k streams moved; 0: never measured */
	uint64_t measured;              /* copies measured, ever */
	char why[200];                  /* the last decision, for status and the log */
};

/* Starts at start streams (clamped to 1..cap), cap clamped to 1..SADAPT_MAX. */
void sadapt_init(struct sadapt *a, unsigned cap, unsigned start);
/* A copy sent raw bytes on n streams in ns (its pieces, from the first
 * to the last delivered). Returns whether it decided something: the next
 * count, or holding it (a->why says what and why). */
bool sadapt_measured(struct sadapt *a, unsigned n, uint64_t raw, uint64_t ns);
/* Only got (1..) of the a->n streams asked for could be opened. Returns
 * whether the count changed. */
bool sadapt_opened(struct sadapt *a, unsigned got);
/* a->why and every count measured, for `stage status`. */
void sadapt_describe(const struct sadapt *a, char *buf, size_t len);

#endif
