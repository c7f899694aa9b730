/* Numbers for people: sizes in binary units, counts with thousands
 * separators, durations, and the progress line built from them. Pure
 * functions: each writes into buf, always NUL-terminated, cut to len. */
#ifndef STAGE_CLI_FMT_H
#define STAGE_CLI_FMT_H

#include <stddef.h>
#include <stdint.h>

/* The numbers of a progress line; totals of 0 are unknown. */
struct cli_progress {
	const char *phase;
	uint64_t files_done, files_total;
	uint64_t bytes_done, bytes_total;
	uint64_t rate;              /* bytes per second, 0: unknown */
	const char *slowest;        /* pull --cluster: the node furthest behind, or NULL */
};

/* 512 -> "512 B", 1536 -> "1.5 KiB", 150 << 20 -> "150 MiB" */
void cli_fmt_size(char *buf, size_t len, uint64_t bytes);
/* 1234567 -> "1,234,567" */
void cli_fmt_count(char *buf, size_t len, uint64_t n);
/* 63 -> "1:03", 3723 -> "1:02:03" */
void cli_fmt_eta(char *buf, size_t len, uint64_t seconds);
/* "copy  1,234/20,000 files  1.2/4.0 GiB  850 MiB/s  ETA 0:03"; unknown
 * totals, rate and ETA are left out. */
void cli_fmt_progress(char *buf, size_t len, const struct cli_progress *p);

#endif
