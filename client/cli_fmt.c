#include "client/cli_fmt.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
#define MAX_UNIT 6

/* The unit v is shown in: the largest whose value is at least 1 once
 * rounded, so 1023.9 KiB shows as "1.0 MiB", never "1024 KiB". */
static int unit_of(uint64_t v)
{
	double x = (double)v / 1024;
	int k = 1;

	if (v < 1024)
		return 0;
	for (; x >= 1023.5 && k < MAX_UNIT; k++)
		x /= 1024;
	return k;
}

/* v in unit k, without the unit's name: three significant digits or so. */
static void number_in(char *buf, size_t len, uint64_t v, int k)
{
	double x = (double)v / (double)(UINT64_C(1) << (10 * k));

	if (k == 0)
		snprintf(buf, len, "%" PRIu64, v);
	else
		snprintf(buf, len, x < 99.95 ? "%.1f" : "%.0f", x);
}

void cli_fmt_size(char *buf, size_t len, uint64_t bytes)
{
	char num[32];
	int k = unit_of(bytes);

	number_in(num, sizeof(num), bytes, k);
	snprintf(buf, len, "%s %s", num, units[k]);
}

void cli_fmt_count(char *buf, size_t len, uint64_t n)
{
	char digits[24], out[32];
	int nd = snprintf(digits, sizeof(digits), "%" PRIu64, n);
	size_t o = 0;

	for (int i = 0; i < nd; i++) {
		if (i && (nd - i) % 3 == 0)
			out[o++] = ',';
		out[o++] = digits[i];
	}
	out[o] = '\0';
	snprintf(buf, len, "%s", out);
}

void cli_fmt_eta(char *buf, size_t len, uint64_t s)
{
	if (s >= 3600)
		snprintf(buf, len, "%" PRIu64 ":%02u:%02u", s / 3600, (unsigned)(s / 60 % 60),
			 (unsigned)(s % 60));
	else
		snprintf(buf, len, "%u:%02u", (unsigned)(s / 60), (unsigned)(s % 60));
}

/* Appends to buf at *at, keeping the NUL; truncation just stops growth. */
__attribute__((format(printf, 4, 5)))
static void append(char *buf, size_t len, size_t *at, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (*at + 1 >= len)
		return;
	va_start(ap, fmt);
	n = vsnprintf(buf + *at, len - *at, fmt, ap);
	va_end(ap);
	if (n > 0)
		*at = *at + (size_t)n < len ? *at + (size_t)n : len - 1;
}

void cli_fmt_progress(char *buf, size_t len, const struct cli_progress *p)
{
	char a[32], b[32];
	size_t at = 0;
	int k;

	if (!len)
		return;
	buf[0] = '\0';
	append(buf, len, &at, "%s", p->phase);
	cli_fmt_count(a, sizeof(a), p->files_done);
	if (p->files_total) {
		cli_fmt_count(b, sizeof(b), p->files_total);
		append(buf, len, &at, "  %s/%s files", a, b);
	} else {
		append(buf, len, &at, "  %s files", a);
	}
	if (p->bytes_total) {
		k = unit_of(p->bytes_total);
		number_in(a, sizeof(a), p->bytes_done, k);
		number_in(b, sizeof(b), p->bytes_total, k);
		append(buf, len, &at, "  %s/%s %s", a, b, units[k]);
	} else {
		cli_fmt_size(a, sizeof(a), p->bytes_done);
		append(buf, len, &at, "  %s", a);
	}
	if (p->slowest && *p->slowest)
		append(buf, len, &at, "  slowest %s", p->slowest);
	if (!p->rate)
		return;
	cli_fmt_size(a, sizeof(a), p->rate);
	append(buf, len, &at, "  %s/s", a);
	if (p->bytes_total && p->bytes_done <= p->bytes_total) {
		cli_fmt_eta(a, sizeof(a), (p->bytes_total - p->bytes_done + p->rate - 1) / p->rate);
		append(buf, len, &at, "  ETA %s", a);
	}
}
