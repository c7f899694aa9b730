/* What every decision of stage doctor uses (dr_impl.h): the frames it
 * writes (a check line, its advice, its figures for --json), figures as
 * text, and medians. */
#include "daemon/doctor/dr_impl.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct msg *dr_frame(struct dr_out *o, uint16_t type)
{
	if (o->n == o->cap) {
		size_t cap = o->cap ? 2 * o->cap : 32;
		struct msg *v = realloc(o->v, cap * sizeof(*v));

		if (!v) {
			o->err = -ENOMEM;
			return NULL;
		}
		o->v = v;
		o->cap = cap;
	}
	msg_init(&o->v[o->n], type);
	return &o->v[o->n++];
}

__attribute__((format(printf, 5, 6)))
struct msg *dr_check(struct dr_out *o, const char *what, const char *subject, bool ok,
			 const char *fmt, ...)
{
	struct msg *m = dr_frame(o, MSG_CHECK);
	char text[1024];
	va_list ap;

	if (!m) {
		msg_free(&o->scratch);
		msg_init(&o->scratch, MSG_CHECK);
		return &o->scratch;
	}
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	msg_put_str(m, K_CHECK, what);
	msg_put_str(m, K_SUBJECT, subject);
	msg_put_u64(m, K_CODE, ok ? 0 : 1);
	msg_put_str(m, K_TEXT, text);
	o->problems += !ok;
	return m;
}

__attribute__((format(printf, 2, 3)))
void dr_advice(struct msg *m, const char *fmt, ...)
{
	char text[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	msg_put_str(m, K_ADVICE, text);
}

void dr_num(struct msg *m, const char *name, double v)
{
	char s[160];

	snprintf(s, sizeof(s), "%s=%.6g", name, isfinite(v) ? v : 0);
	msg_put_str(m, K_NUM, s);
}

void dr_flag(struct msg *m, const char *name, bool v)
{
	char s[160];

	snprintf(s, sizeof(s), "%s=%s", name, v ? "true" : "false");
	msg_put_str(m, K_NUM, s);
}

__attribute__((format(printf, 3, 4)))
void dr_attr(struct msg *m, const char *name, const char *fmt, ...)
{
	char s[1400];
	va_list ap;
	int k = snprintf(s, sizeof(s), "%s=", name);

	va_start(ap, fmt);
	vsnprintf(s + k, sizeof(s) - (size_t)k, fmt, ap);
	va_end(ap);
	msg_put_str(m, K_ATTR, s);
}

const char *dr_fmt_rate(double Bps, char *buf, size_t len)
{
	if (Bps >= 1e9)
		snprintf(buf, len, "%.2f GB/s", Bps / 1e9);
	else
		snprintf(buf, len, "%.0f MB/s", Bps / 1e6);
	return buf;
}

const char *dr_fmt_bytes(double b, char *buf, size_t len)
{
	const char *u[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	int i = 0;

	while (b >= 1024 && i < 5) {
		b /= 1024;
		i++;
	}
	snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", b, u[i]);
	return buf;
}

size_t dr_nodes_up(const struct dr_in *in)
{
	size_t up = 0;

	for (size_t i = 0; i < in->nnodes; i++)
		up += in->nodes[i].up;
	return up;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double dr_median(double *v, size_t n)
{
	if (!n)
		return 0;
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void dr_frames_free(struct msg *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		msg_free(&v[i]);
	free(v);
}
