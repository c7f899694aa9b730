/* compress = auto: whether to compress the pieces of a transfer, chosen by
 * what each choice is measured to deliver on this data and this path.
 *
 * The pieces go out in windows of ZP_WINDOW. Each window runs one way
 * (compressed or raw) and is measured as raw bytes delivered per second:
 * the window's wire bytes, plus what the transport had queued at its start,
 * minus what it still has queued at its end (xport queued(): the time send
 * takes says nothing, it returns once bytes are queued), scaled back to raw
 * bytes by the window's own ratio, over the window's wall time (reading,
 * coding and sending, all of it). So a link that drains slower than the
 * codec makes bytes favours compressing, and a path faster than the codec
 * favours raw, without a model of either.
 *
 * The better way runs in windows of ZP_WINDOW pieces; the other is tried
 * again in a short window of ZP_PROBE pieces now and then, so that a change
 * in the data or the path is followed: as often as costs ZP_COST of the
 * time at the rates measured (every ZP_PROBE_MIN to ZP_PROBE_MAX windows;
 * the closer the two, the more often). The first window is raw, the second
 * a short one compressed. So what auto loses against the better fixed
 * choice is about ZP_COST, plus one short window at the start; a change is
 * followed within ZP_PROBE_MAX + 1 windows (1 GiB) at worst, within a few
 * when the two ways were close.
 *
 * Pure: time and queue depth come from the caller, so tests can drive it.
 */
#ifndef STAGE_ZPOLICY_H
#define STAGE_ZPOLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/codec.h"

#define ZP_WINDOW 16          /* pieces per window of the better way */
#define ZP_PROBE 4            /* pieces per try of the other; and the fewest a
			       * window cut short by a pause is measured with */
#define ZP_PROBE_MIN 4
#define ZP_PROBE_MAX 64
#define ZP_COST 0.02         /* of the time, spent trying the losing way */

struct zpolicy {
	int mode;                 /* enum cfg_compress */
	bool on;                  /* this window compresses */
	bool best_on;             /* the better way so far */
	bool probing;             /* this window tries the other way */
	double rate[2];           /* raw bytes/s delivered, [raw, compressed]; 0: unknown */
	unsigned pieces, len;     /* in this window (0: none open), its length */
	uint64_t t0, q0;          /* window start: time (ns), transport queue */
	uint64_t raw, wire;       /* this window's bytes */
	unsigned since_probe, probe_every;
	uint64_t windows;         /* measured, for status and tests */
	unsigned taint;           /* windows still to drop (zp_gap) */
};

void zp_init(struct zpolicy *z, int mode);
/* The codec for the next piece: &codec_none_ops, &codec_zstd_ops, or NULL
 * (the best for the data: float where the dtype allows, else zstd, each
 * falling back per piece). now: monotonic ns; queued: xport queued(). */
const struct codec_ops *zp_pick(struct zpolicy *z, uint64_t now, uint64_t queued);
/* The piece went out: raw bytes as wire bytes. */
void zp_sent(struct zpolicy *z, size_t raw, size_t wire, uint64_t now, uint64_t queued);
/* The stream stops for a while (the end of a copy, a failure): a window
 * of at least ZP_PROBE pieces is measured, a shorter one dropped. */
void zp_pause(struct zpolicy *z, uint64_t now, uint64_t queued);
/* The stream broke: the open window is dropped unmeasured. */
static inline void zp_drop(struct zpolicy *z)
{
	z->pieces = 0;
}
/* The receiver stops reading for a while (it copies held chunks from its
 * disk): the open window and the next are dropped unmeasured. */
static inline void zp_gap(struct zpolicy *z)
{
	z->pieces = 0;
	z->taint = 2;
}

#endif
