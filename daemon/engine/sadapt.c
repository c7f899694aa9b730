/* The stream count's climb; the states are in sadapt.h. */
#include "daemon/engine/sadapt.h"

#include <stdio.h>
#include <string.h>

static void rate_str(double r, char *b, size_t len)
{
	if (r >= 1e9)
		snprintf(b, len, "%.2f GB/s", r / 1e9);
	else
		snprintf(b, len, "%.0f MB/s", r / 1e6);
}

void sadapt_init(struct sadapt *a, unsigned cap, unsigned start)
{
	memset(a, 0, sizeof(*a));
	a->cap = cap < 1 ? 1 : cap > SADAPT_MAX ? SADAPT_MAX : cap;
	a->n = start < 1 ? 1 : start > a->cap ? a->cap : start;
	a->base = a->n;
	a->phase = a->cap > 1 ? SA_FIRST : SA_HOLD;
	a->next_up = true;
	snprintf(a->why, sizeof(a->why), "%s", a->cap > 1 ? "no copy measured yet" : "a cap of 1");
}

static void hold(struct sadapt *a, unsigned n)
{
	a->n = n;
	a->base = n;
	a->phase = SA_HOLD;
	a->held = 0;
	a->slow = 0;
}

/* A step from a->n: up where asked and there is room, else down. */
static void probe(struct sadapt *a, bool up)
{
	if (up && a->n >= a->cap)
		up = false;
	else if (!up && a->n <= 1)
		up = true;
	a->base = a->n;
	a->n = up ? (a->n * 2 > a->cap ? a->cap : a->n * 2) : a->n / 2;
	a->phase = SA_PROBE;
	if (!up)
		a->down_tried = true;
}

/* A probe at n measured r against base b's rb. */
static void judge(struct sadapt *a, unsigned n, double r, unsigned b, double rb)
{
	char rs[32], bs[32];
	int k;

	rate_str(r, rs, sizeof(rs));
	rate_str(rb, bs, sizeof(bs));
	if (n > b && r >= rb * SADAPT_MORE) {
		k = snprintf(a->why, sizeof(a->why), "%u moved %s, %u %s", n, rs, b, bs);
		if (n < a->cap)
			probe(a, true);
		else
			hold(a, n);
		snprintf(a->why + k, sizeof(a->why) - (size_t)k, "%s",
			 a->phase == SA_HOLD ? ": each doubling moved 10 % more, up to the cap" : "");
	} else if (n > b) {
		k = snprintf(a->why, sizeof(a->why), "%u moved less than 10 %% more than %u (%s "
			     "against %s)", n, b, rs, bs);
		hold(a, b);
		if (b > 1 && !a->down_tried)
			probe(a, false);
	} else if (r >= rb * SADAPT_ASGOOD) {
		k = snprintf(a->why, sizeof(a->why), "%u moved as much as %u (%s against %s)", n, b,
			     rs, bs);
		if (n > 1)
			probe(a, false);
		else
			hold(a, n);
	} else {
		k = snprintf(a->why, sizeof(a->why), "%u moved less than %u (%s against %s)", n, b,
			     rs, bs);
		hold(a, b);
	}
	if (a->phase == SA_PROBE && (size_t)k < sizeof(a->why))
		snprintf(a->why + k, sizeof(a->why) - (size_t)k, ": trying %u", a->n);
}

bool sadapt_measured(struct sadapt *a, unsigned n, uint64_t raw, uint64_t ns)
{
	unsigned before = a->n;
	enum sadapt_phase was = a->phase;
	double r;
	char rs[32], hs[32];

	if (raw < SADAPT_MIN_BYTES || ns < SADAPT_MIN_NS || n < 1 || n > a->cap)
		return false;
	r = (double)raw * 1e9 / (double)ns;
	a->measured++;
	if (n != a->n) {
		a->rate[n] = r;         /* not what was asked: sadapt_opened said so */
		return false;
	}
	switch (a->phase) {
	case SA_FIRST:
		a->rate[n] = r;
		rate_str(r, rs, sizeof(rs));
		a->down_tried = false;
		probe(a, true);
		snprintf(a->why, sizeof(a->why), "%u moved %s: trying %u", n, rs, a->n);
		break;
	case SA_PROBE: {
		unsigned b = a->base;

		a->rate[n] = r;
		judge(a, n, r, b, a->rate[b]);
		break;
	}
	case SA_HOLD:
		if (a->cap > 1 && a->rate[n] && r < a->rate[n] * SADAPT_DROP) {
			if (a->slow++ == 0) {
				a->slow_r = r;  /* one slow copy: wait for the next */
				break;
			}
			rate_str((a->slow_r + r) / 2, rs, sizeof(rs));
			rate_str(a->rate[n], hs, sizeof(hs));
			a->rate[n] = (a->slow_r + r) / 2;
			a->down_tried = false;
			probe(a, true);
			snprintf(a->why, sizeof(a->why), "%u moved %s in 2 copies, less than 70 %% of "
				 "its %s before: trying %u", n, rs, hs, a->n);
			break;
		}
		a->slow = 0;
		a->rate[n] = a->rate[n] ? (a->rate[n] + r) / 2 : r;
		if (a->cap > 1 && ++a->held >= SADAPT_HOLD) {
			probe(a, a->next_up);
			a->next_up = !a->next_up;
			a->down_tried = true;   /* one probe: a failed step up goes back */
			snprintf(a->why, sizeof(a->why), "%u copies on %u: trying %u again",
				 SADAPT_HOLD, n, a->n);
		}
		break;
	}
	return a->n != before || a->phase != was;
}

bool sadapt_opened(struct sadapt *a, unsigned got)
{
	unsigned asked = a->n;

	if (got < 1 || got >= asked)
		return false;
	hold(a, got);
	snprintf(a->why, sizeof(a->why), "only %u of %u streams could be opened", got, asked);
	return true;
}

void sadapt_describe(const struct sadapt *a, char *buf, size_t len)
{
	size_t k = (size_t)snprintf(buf, len, "%s", a->why);
	const char *sep = "; measured: ";

	for (unsigned c = 1; c <= a->cap && k < len; c++) {
		char rs[32];

		if (!a->rate[c])
			continue;
		rate_str(a->rate[c], rs, sizeof(rs));
		k += (size_t)snprintf(buf + k, len - k, "%s%u at %s", sep, c, rs);
		sep = ", ";
	}
}
