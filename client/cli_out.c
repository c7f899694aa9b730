#include "client/cli_out.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>

#include "client/cli_cells.h"
#include "client/cli_doctor.h"
#include "client/cli_fmt.h"
#include "client/cli_json.h"
#include "common/clock.h"
#include "common/log.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
#define REDRAW_INTERVAL 0.1         /* seconds: ten redraws a second at most */
#define RATE_MIN_WINDOW 0.25        /* seconds of a phase before its rate means anything */

struct span {
	const char *p;
	size_t n;
};

static bool get_str(const struct msg *m, uint16_t key, struct span *s)
{
	const uint8_t *p;

	if (msg_get_bytes(m, key, &p, &s->n) != 0)
		return false;
	s->p = (const char *)p;
	return true;
}

static uint64_t get_u64(const struct msg *m, uint16_t key)
{
	uint64_t v = 0;

	return msg_get_u64(m, key, &v) == 0 ? v : 0;
}

static void put_span(FILE *f, struct span s)
{
	fwrite(s.p, 1, s.n, f);
}

/* A status frame is K_NAME/K_VALUE pairs in order; a name without a value
 * has an empty one. Returns false after the last pair. */
static bool next_pair(const struct msg *m, size_t *off, struct span *name, struct span *value)
{
	uint16_t key;
	const uint8_t *p;
	size_t n;

	while (msg_next_field(m, off, &key, &p, &n) == 1) {
		size_t peek = *off;

		if (key != K_NAME)
			continue;
		*name = (struct span){ (const char *)p, n };
		*value = (struct span){ "", 0 };
		if (msg_next_field(m, &peek, &key, &p, &n) == 1 && key == K_VALUE) {
			*value = (struct span){ (const char *)p, n };
			*off = peek;
		}
		return true;
	}
	return false;
}

static bool span_eq(struct span a, struct span b)
{
	return a.n == b.n && memcmp(a.p, b.p, a.n) == 0;
}

/* ---- JSON: a table per frame type maps keys to member names ---- */

enum jtype {
	J_STR,          /* str field as is */
	J_U64,          /* u64 field as is */
	J_MS,           /* u64 nanoseconds, written as milliseconds */
	J_LEVEL,        /* u64 log level, written as its name */
	J_CODE,         /* the exit code this client will return */
	J_RATE,         /* the rate this client measured */
	J_PAIRS,        /* every K_NAME/K_VALUE pair; repeated names become arrays */
};

struct jfield {
	uint16_t key;
	enum jtype type;
	const char *name;
};

static const struct jfield progress_fields[] = {
	{ K_PHASE, J_STR, "phase" },
	{ K_FILES_DONE, J_U64, "files_done" },
	{ K_FILES_TOTAL, J_U64, "files_total" },
	{ K_BYTES_DONE, J_U64, "bytes_done" },
	{ K_BYTES_TOTAL, J_U64, "bytes_total" },
	{ K_BYTES_FWD, J_U64, "bytes_forwarded" },    /* pull --cluster */
	{ K_HOLDER, J_STR, "slowest" },               /* pull --cluster */
	{ 0, J_RATE, "rate" },
};

static const struct jfield note_fields[] = {
	{ K_LEVEL, J_LEVEL, "level" },
	{ K_KIND, J_STR, "kind" },
	{ K_PATH, J_STR, "path" },
	{ K_TEXT, J_STR, "text" },
};

static const struct jfield result_fields[] = {
	{ K_CODE, J_CODE, "code" },
	{ K_TEXT, J_STR, "text" },
	{ K_PATH, J_STR, "path" },
	{ K_FILES_TOTAL, J_U64, "files" },
	{ K_BYTES_TOTAL, J_U64, "bytes" },
	{ K_FILES_COPIED, J_U64, "files_copied" },
	{ K_BYTES_COPIED, J_U64, "bytes_copied" },
	{ K_FILES_REMOVED, J_U64, "files_removed" },
	{ K_ELAPSED_NS, J_MS, "elapsed_ms" },
	{ K_ROOT, J_STR, "root" },
};

static const struct jfield status_fields[] = {
	{ 0, J_PAIRS, NULL },
};

/* A slice of the Prometheus text: with --json, {"event":"metrics","text":...}. */
static const struct jfield metrics_fields[] = {
	{ K_DATA, J_STR, "text" },
};

static void json_pairs(struct cli_json *j, const struct msg *m)
{
	struct span name, value, n2, v2;
	size_t off = 0;

	for (size_t at = 0; next_pair(m, &off, &name, &value); at = off) {
		size_t scan = 0, count = 0;
		bool earlier = false;

		while (scan < at && next_pair(m, &scan, &n2, &v2))
			earlier |= span_eq(name, n2);
		if (earlier)
			continue;       /* its array was written at its first occurrence */
		for (scan = at; next_pair(m, &scan, &n2, &v2);)
			count += span_eq(name, n2);
		cli_json_key(j, name.p, name.n);
		if (count > 1)
			fputc('[', j->f);
		for (scan = at, count = 0; next_pair(m, &scan, &n2, &v2);)
			if (span_eq(name, n2)) {
				if (count++)
					fputc(',', j->f);
				cli_json_string(j->f, v2.p, v2.n);
			}
		if (count > 1)
			fputc(']', j->f);
	}
}

static void json_field(struct cli_out *o, struct cli_json *j, const struct jfield *f,
		       const struct msg *m)
{
	struct span s;
	uint64_t v;

	switch (f->type) {
	case J_STR:
		if (get_str(m, f->key, &s))
			cli_json_strn(j, f->name, s.p, s.n);
		break;
	case J_U64:
	case J_MS:
	case J_LEVEL:
		if (msg_get_u64(m, f->key, &v) != 0)
			break;
		if (f->type == J_U64)
			cli_json_u64(j, f->name, v);
		else if (f->type == J_MS)
			cli_json_u64(j, f->name, v / 1000000);
		else if (v <= LOG_DEBUG)
			cli_json_str(j, f->name, log_level_name((enum log_level)v));
		break;
	case J_CODE:
		cli_json_u64(j, f->name, (uint64_t)o->code);
		break;
	case J_RATE:
		cli_json_u64(j, f->name, o->rate);
		break;
	case J_PAIRS:
		json_pairs(j, m);
		break;
	}
}

/* ---- state kept across frames ---- */

static int progress_update(struct cli_out *o, const struct msg *m)
{
	uint64_t bytes = get_u64(m, K_BYTES_DONE);
	double t = o->now();
	struct span s = { "", 0 };
	char phase[sizeof(o->phase)];
	size_t n;

	get_str(m, K_PHASE, &s);
	n = s.n < sizeof(phase) - 1 ? s.n : sizeof(phase) - 1;
	for (size_t i = 0; i < n; i++)
		phase[i] = s.p[i] >= 0x20 && s.p[i] < 0x7f ? s.p[i] : '?';
	phase[n] = '\0';

	if (strcmp(phase, o->phase) != 0 || bytes < o->phase_bytes0) {
		memcpy(o->phase, phase, n + 1);
		o->phase_t0 = t;
		o->phase_bytes0 = bytes;
		o->rate = 0;
		o->drawn_at = -1e9;     /* a new phase shows at once */
	} else if (t - o->phase_t0 >= RATE_MIN_WINDOW) {
		o->rate = (uint64_t)((double)(bytes - o->phase_bytes0) / (t - o->phase_t0));
	}
	return 0;
}

static int result_update(struct cli_out *o, const struct msg *m)
{
	uint64_t code;

	if (msg_get_u64(m, K_CODE, &code) != 0)
		return -EBADMSG;
	o->code = code > 2 ? 2 : (int)code;
	return 0;
}

/* ---- for a person ---- */

static int progress_human(struct cli_out *o, const struct msg *m)
{
	struct cli_progress p = {
		.phase = o->phase,
		.files_done = get_u64(m, K_FILES_DONE),
		.files_total = get_u64(m, K_FILES_TOTAL),
		.bytes_done = get_u64(m, K_BYTES_DONE),
		.bytes_total = get_u64(m, K_BYTES_TOTAL),
		.rate = o->rate,
	};
	char line[160], slowest[64] = "";
	double t = o->now();
	struct span s;
	int n;

	if (!o->progress || t - o->drawn_at < REDRAW_INTERVAL)
		return 0;
	if (get_str(m, K_HOLDER, &s)) {
		size_t k = s.n < sizeof(slowest) - 1 ? s.n : sizeof(slowest) - 1;

		for (size_t i = 0; i < k; i++)
			slowest[i] = s.p[i] >= 0x20 && s.p[i] < 0x7f ? s.p[i] : '?';
		slowest[k] = '\0';
		p.slowest = slowest;
	}
	/* Short of the last column: a line that wraps cannot be redrawn by '\r'. */
	cli_fmt_progress(line, o->cols > 0 && o->cols < (int)sizeof(line) ? (size_t)o->cols
									 : sizeof(line), &p);
	n = (int)strlen(line);
	/* Pad over the tail of a longer previous line. */
	fprintf(o->err, "\r%-*s", n > o->drawn ? n : o->drawn, line);
	fflush(o->err);
	o->drawn = n;
	o->drawn_at = t;
	return 0;
}

/* What a finding's text says after its path: its cause, when it gives one
 * (": Input/output error", " (read): No space left on device", ": chunk 3
 * differs"), else nothing (the result gives the advice). */
static struct span cause_of(struct span text, struct span path)
{
	const char *p = text.p, *end = text.p + text.n, *at;
	struct span found = { "", 0 };

	/* The path stands in the text as ROOT/PATH (or opens it); the last
	 * such place is it, since ROOT itself may hold "/PATH (" (a root
	 * named "/stage/x (2)" of a file "x"). */
	while (path.n && (at = memmem(p, (size_t)(end - p), path.p, path.n)) != NULL) {
		struct span rest = { at + path.n, (size_t)(end - at - path.n) };

		if ((at == text.p || at[-1] == '/') && rest.n >= 2 &&
		    (memcmp(rest.p, ": ", 2) == 0 || memcmp(rest.p, " (", 2) == 0))
			found = rest;
		p = at + 1;
	}
	return found;
}

static int note_human(struct cli_out *o, const struct msg *m)
{
	struct span kind, path, text;

	if (get_str(m, K_KIND, &kind)) {
		put_span(o->out, kind);
		if (get_str(m, K_PATH, &path)) {
			fputc(' ', o->out);
			put_span(o->out, path);
			if (get_str(m, K_TEXT, &text))
				put_span(o->out, cause_of(text, path));
		}
		fputc('\n', o->out);
	} else if (get_str(m, K_TEXT, &text)) {
		fputs("stage: ", o->err);
		put_span(o->err, text);
		fputc('\n', o->err);
	}
	return 0;
}

static int result_human(struct cli_out *o, const struct msg *m)
{
	struct span text, path;
	bool has_text = get_str(m, K_TEXT, &text) && text.n;

	if (o->code != 0) {
		fputs("stage: ", o->err);
		if (has_text)
			put_span(o->err, text);
		else
			fputs("failed", o->err);
		fputc('\n', o->err);
		return 0;
	}
	if (has_text) {
		put_span(o->err, text);
		fputc('\n', o->err);
	}
	if (o->path_last && get_str(m, K_PATH, &path)) {
		put_span(o->out, path);
		fputc('\n', o->out);
	}
	return 0;
}

static int status_human(struct cli_out *o, const struct msg *m)
{
	struct span name, value;
	size_t off = 0, width = 0;

	while (next_pair(m, &off, &name, &value))
		if (name.n > width)
			width = name.n;
	for (off = 0; next_pair(m, &off, &name, &value);) {
		put_span(o->out, name);
		fprintf(o->out, ":%*s", (int)(width - name.n + 1), "");
		put_span(o->out, value);
		fputc('\n', o->out);
	}
	return 0;
}

/* The daemon's text as it is: the slices join into one exposition. */
static int metrics_human(struct cli_out *o, const struct msg *m)
{
	struct span s;

	if (get_str(m, K_DATA, &s))
		fwrite(s.p, 1, s.n, o->out);
	return 0;
}

static int cells_human(struct cli_out *o, const struct msg *m)
{
	return cli_cells_human(o->out, m);
}

static void cells_json(struct cli_out *o, const struct msg *m, const char *event)
{
	cli_cells_json(o->out, m, event);
}

static int check_human(struct cli_out *o, const struct msg *m)
{
	return cli_check_human(o->out, m);
}

static void check_json(struct cli_out *o, const struct msg *m, const char *event)
{
	cli_check_json(o->out, m, event);
}

static int matrix_human(struct cli_out *o, const struct msg *m)
{
	return cli_matrix_human(o->out, m);
}

static void matrix_json(struct cli_out *o, const struct msg *m, const char *event)
{
	cli_matrix_json(o->out, m, event);
}

static const struct frame_kind {
	uint16_t type;
	const char *event;                      /* JSON "event" */
	const struct jfield *fields;
	size_t nfields;
	int (*update)(struct cli_out *, const struct msg *);   /* both modes; may be NULL */
	int (*human)(struct cli_out *, const struct msg *);    /* 0 or -errno */
	/* Writes the objects itself, in place of one from fields; may be NULL. */
	void (*json)(struct cli_out *, const struct msg *, const char *event);
} frame_kinds[] = {
	{ MSG_PROGRESS, "progress", progress_fields, COUNT(progress_fields), progress_update,
	  progress_human, NULL },
	{ MSG_NOTE, "note", note_fields, COUNT(note_fields), NULL, note_human, NULL },
	{ MSG_RESULT, "result", result_fields, COUNT(result_fields), result_update,
	  result_human, NULL },
	{ MSG_STATUS, "status", status_fields, COUNT(status_fields), NULL, status_human, NULL },
	{ MSG_LS, "ls", status_fields, COUNT(status_fields), NULL, status_human, NULL },
	{ MSG_CELLS, "copy", NULL, 0, NULL, cells_human, cells_json },
	{ MSG_CHECK, "check", NULL, 0, NULL, check_human, check_json },
	{ MSG_MATRIX, "matrix", NULL, 0, NULL, matrix_human, matrix_json },
	{ MSG_METRICS, "metrics", metrics_fields, COUNT(metrics_fields), NULL, metrics_human, NULL },
};

int cli_out_frame(struct cli_out *o, const struct msg *m)
{
	const struct frame_kind *k = NULL;
	struct cli_json j;
	int rc;

	for (size_t i = 0; i < COUNT(frame_kinds); i++)
		if (frame_kinds[i].type == m->type)
			k = &frame_kinds[i];
	if (!k)
		return 0;
	if (k->update && (rc = k->update(o, m)) < 0)
		return rc;
	if (!o->json) {
		if (m->type != MSG_PROGRESS)
			cli_out_clear(o);
		rc = k->human(o, m);
		/* stdout and stderr interleave in frame order when they share a
		 * terminal or a file (the table before the verdict). */
		fflush(o->out);
		return rc;
	}
	if (k->json) {
		k->json(o, m, k->event);
	} else {
		cli_json_begin(&j, o->out, k->event);
		for (size_t i = 0; i < k->nfields; i++)
			json_field(o, &j, &k->fields[i], m);
		cli_json_end(&j);
	}
	/* A line per event as it happens: a script reading a pipe watches a
	 * long command's progress, not everything at its exit. */
	fflush(o->out);
	return 0;
}

void cli_out_clear(struct cli_out *o)
{
	if (!o->drawn)
		return;
	fprintf(o->err, "\r%*s\r", o->drawn, "");
	fflush(o->err);
	o->drawn = 0;
}

void cli_out_fail(struct cli_out *o, int code, const char *fmt, ...)
{
	char text[1024];
	struct cli_json j;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	cli_out_clear(o);
	fprintf(o->err, "stage: %s\n", text);
	if (!o->json)
		return;
	cli_json_begin(&j, o->out, "result");
	cli_json_u64(&j, "code", (uint64_t)code);
	cli_json_str(&j, "text", text);
	cli_json_end(&j);
}

static double monotonic_now(void)
{
	return (double)mono_ns() / 1e9;
}

void cli_out_init(struct cli_out *o, FILE *out, FILE *err, bool json, bool progress)
{
	struct winsize ws;

	memset(o, 0, sizeof(*o));
	o->out = out;
	o->err = err;
	o->json = json;
	o->progress = progress && !json;
	o->now = monotonic_now;
	o->drawn_at = -1e9;
	if (o->progress && ioctl(fileno(err), TIOCGWINSZ, &ws) == 0)
		o->cols = ws.ws_col;
}
