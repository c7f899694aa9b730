/* compress = auto (zpolicy.h). */
#include "daemon/repl/zpolicy.h"

#include "common/config.h"

void zp_init(struct zpolicy *z, int mode)
{
	*z = (struct zpolicy){ .mode = mode, .probe_every = ZP_PROBE_MIN };
}

static void open_window(struct zpolicy *z, uint64_t now, uint64_t queued)
{
	if (z->rate[0] == 0)
		z->on = false;                  /* first: raw */
	else if (z->rate[1] == 0)
		z->on = true;                   /* then a short try compressed */
	else if (z->since_probe >= z->probe_every)
		z->on = !z->best_on;
	else
		z->on = z->best_on;
	z->probing = z->rate[0] != 0 && z->rate[1] != 0 && z->on != z->best_on;
	z->len = z->on == z->best_on ? ZP_WINDOW : ZP_PROBE;
	z->t0 = now;
	z->q0 = queued;
	z->raw = z->wire = 0;
}

static void close_window(struct zpolicy *z, uint64_t now, uint64_t queued)
{
	double t = (double)(now - z->t0) / 1e9, drained, r;
	int w = z->on;

	z->pieces = 0;
	if (z->taint) {
		z->taint--;
		return;
	}
	if (t <= 0 || z->wire == 0)
		return;
	/* Bytes that left this end during the window: what was queued at its
	 * start drained too, what is queued now has not. */
	drained = (double)z->wire + (double)z->q0 - (double)queued;
	if (drained < (double)z->wire / 4)
		drained = (double)z->wire / 4;  /* a queue that grew by more: bound it */
	r = drained * ((double)z->raw / (double)z->wire) / t;
	z->rate[w] = z->rate[w] > 0 ? (z->rate[w] + r) / 2 : r;
	z->windows++;
	if (z->rate[0] == 0 || z->rate[1] == 0)
		return;                         /* the first two windows: one of each */
	if (!z->probing && z->since_probe < z->probe_every) {
		z->since_probe++;
		if (z->windows > 2)
			return;
	}
	/* After the first pair and after each try of the other way: the better
	 * way runs, and the next try comes when its cost (ZP_PROBE pieces, as
	 * much slower as the other way was) is ZP_COST of the time between. */
	{
		bool on = z->rate[1] > z->rate[0];
		double lo = on ? z->rate[0] : z->rate[1], hi = on ? z->rate[1] : z->rate[0];
		double every = ZP_PROBE * (hi / lo - 1) / (ZP_COST * ZP_WINDOW);

		z->since_probe = 0;
		z->probe_every = on != z->best_on || every < ZP_PROBE_MIN ? ZP_PROBE_MIN :
				 every > ZP_PROBE_MAX ? ZP_PROBE_MAX : (unsigned)every;
		z->best_on = on;
	}
}

const struct codec_ops *zp_pick(struct zpolicy *z, uint64_t now, uint64_t queued)
{
	switch (z->mode) {
	case CFG_COMPRESS_OFF:
		return &codec_none_ops;
	case CFG_COMPRESS_ZSTD:
		return &codec_zstd_ops;
	case CFG_COMPRESS_FLOAT:
		return NULL;
	default:
		if (z->pieces == 0)
			open_window(z, now, queued);
		return z->on ? NULL : &codec_none_ops;
	}
}

void zp_sent(struct zpolicy *z, size_t raw, size_t wire, uint64_t now, uint64_t queued)
{
	if (z->mode != CFG_COMPRESS_AUTO)
		return;
	z->raw += raw;
	z->wire += wire;
	if (++z->pieces == z->len)
		close_window(z, now, queued);
}

void zp_pause(struct zpolicy *z, uint64_t now, uint64_t queued)
{
	if (z->mode != CFG_COMPRESS_AUTO || z->pieces == 0)
		return;
	if (z->pieces >= ZP_PROBE)
		close_window(z, now, queued);
	z->pieces = 0;
}
