/* What `stage` shows: the daemon's reply frames rendered for a person (a
 * progress line on stderr, findings and the local path on stdout) or for a
 * script (--json: one object per line on stdout, nothing else there).
 *
 * The progress line lives on the terminal's last line, redrawn in place with
 * '\r' at most ten times a second; every other output first clears it, so it
 * never ends up glued to a message. */
#ifndef STAGE_CLI_OUT_H
#define STAGE_CLI_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/proto.h"

struct cli_out {
	FILE *out, *err;            /* stdout and stderr; tests substitute memory streams */
	bool json;                  /* JSON lines on out, no progress line */
	bool progress;              /* draw the progress line on err (a terminal) */
	bool path_last;             /* pull: a successful result's K_PATH ends stdout */
	double (*now)(void);        /* monotonic clock, seconds; tests substitute one */
	int code;                   /* exit code of the result frame, clamped to 0..2 */

	/* The current phase, for its rate: bytes moved since it began over the
	 * wall time since then. */
	char phase[16];             /* NUL-terminated, printable */
	double phase_t0;            /* now() at the phase's first frame */
	uint64_t phase_bytes0;      /* bytes_done at that frame */
	uint64_t rate;              /* bytes per second, 0 until measurable */

	int cols;                   /* the terminal's width, 0: unknown */
	double drawn_at;            /* now() when the line was last drawn */
	int drawn;                  /* columns of the line on screen, 0: none */
};

void cli_out_init(struct cli_out *o, FILE *out, FILE *err, bool json, bool progress);

/* Renders one reply frame; unknown types are skipped (the protocol grows).
 * 0, -EBADMSG for a result without a valid K_CODE, or -ENOMEM. A MSG_CELLS
 * frame (verify --cluster) is a table for a person: a row per origin, a
 * column per holder, then a line per finding; with --json, an object per
 * copy group ("event":"copy"). */
int cli_out_frame(struct cli_out *o, const struct msg *m);

/* Erases the progress line, if one is drawn. */
void cli_out_clear(struct cli_out *o);

/* A failure of the client itself: "stage: MESSAGE" on stderr and, with
 * --json, a result object carrying code and text so a script always gets one. */
void cli_out_fail(struct cli_out *o, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
