/* The manifest reader: one pass over the lines, each checked as it arrives,
 * in memory bounded by one line buffer and the current entry's chunk list.
 *
 * States (r->state), and what moves between them:
 *   READING  the header was read (open); next() returns entries.
 *   DONE     next() returned 0: the trailer matched (read_trailer), or an
 *            MF_PARTIAL journal ended (at_end). Root and count are final.
 *   FAILED   next() returned r->err, and r->why says where (fail).
 * open() goes to DONE or FAILED at once when the header is missing or bad;
 * that result waits for the first next(). Neither DONE nor FAILED is ever
 * left: next() repeats r->err.
 *
 * Invariants while READING: the text digest has seen every byte of every
 * line taken so far except a trailer; the root has seen exactly the entries
 * returned, and prev is the last of them. An entry is returned only after
 * mf_entry_check and mf_entry_follows passed (the writer's own rules, so the
 * two cannot disagree) and all its chunk lines arrived; an MF_PARTIAL journal
 * that ends among them drops it.
 */
#include "common/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BUF_CAP (2 * MF_MAX_LINE)   /* an unfinished line plus a read always fit */
#define WHY_MAX 160                 /* a message, after "label:line: " */
#define MAX_FIELDS 7                /* an "l" line */

enum state { READING, DONE, FAILED };

/* What take_line and next_line return, besides -errno. */
enum { LINE_EOF, LINE_OK, LINE_TORN };

struct mf_reader {
	FILE *fp;             /* the input; closed by mf_reader_close if own_fp */
	bool own_fp;
	enum mf_read_mode mode;
	char *label;          /* owned copy; starts every message */
	char *why;            /* owned, why_cap bytes; "" until an error */
	size_t why_cap;
	char *buf;            /* BUF_CAP bytes of input; [start, end) not yet taken */
	size_t start, end;
	bool eof;             /* fread has reported the end */
	uint64_t lineno;      /* of the line last taken, from 1 */
	XXH3_state_t *text;   /* over the lines taken, the trailer excepted */
	struct mf_root root;  /* over the entries returned; st is NULL once final */
	digest_t root_final;  /* once DONE */
	uint64_t chunk_size;  /* from the header; 0 until it was read */
	struct mf_entry prev; /* last entry returned: type, path (MF_MAX_PATH + 1
	                       * bytes); type 0 before the first */
	enum state state;
	int err;              /* what next() returns once not READING */
};

struct fields {
	int n;
	char *s[MAX_FIELDS];
	size_t len[MAX_FIELDS];
	const char *bad;      /* why the line did not split, or NULL */
};

__attribute__((format(printf, 2, 3)))
static int fail(struct mf_reader *r, const char *fmt, ...)
{
	va_list ap;
	int n;

	n = snprintf(r->why, r->why_cap, "%s:%" PRIu64 ": ", r->label, r->lineno);
	va_start(ap, fmt);
	vsnprintf(r->why + n, r->why_cap - (size_t)n, fmt, ap);
	va_end(ap);
	r->state = FAILED;
	r->err = -EBADMSG;
	return r->err;
}

static int fail_errno(struct mf_reader *r, int err)
{
	fail(r, "%s", strerror(-err));
	r->err = err;
	return err;
}

static int finish(struct mf_reader *r)
{
	if (r->root.st)
		r->root_final = mf_root_final(&r->root);
	r->state = DONE;
	r->err = 0;
	return 0;
}

/* The input ended (LINE_EOF) or ended inside a line (LINE_TORN) before the
 * trailer: the end of a journal, or a truncated manifest. */
static int at_end(struct mf_reader *r, int how)
{
	if (r->mode == MF_PARTIAL)
		return finish(r);
	if (how == LINE_TORN)
		return fail(r, "truncated (last line has no newline)");
	r->lineno++;
	return fail(r, "truncated (no end line)");
}

/* Lines */

static int take_line(struct mf_reader *r, char **line, size_t *len)
{
	size_t scanned = 0;

	for (;;) {
		char *s = r->buf + r->start;
		size_t have = r->end - r->start;
		char *nl = memchr(s + scanned, '\n', have - scanned);
		size_t n;

		if (nl) {
			*line = s;
			*len = (size_t)(nl - s);
			r->start += *len + 1;
			r->lineno++;
			if (*len > MF_MAX_LINE)
				return fail(r, "line longer than %d bytes", MF_MAX_LINE);
			return LINE_OK;
		}
		scanned = have;
		if (have > MF_MAX_LINE) {
			r->lineno++;
			return fail(r, "line longer than %d bytes", MF_MAX_LINE);
		}
		if (r->eof) {
			if (have)
				r->lineno++;
			return have ? LINE_TORN : LINE_EOF;
		}
		if (r->start) {
			memmove(r->buf, s, have);
			r->start = 0;
			r->end = have;
		}
		errno = 0;
		n = fread(r->buf + r->end, 1, BUF_CAP - r->end, r->fp);
		if (n == 0 && ferror(r->fp))
			return fail_errno(r, errno ? -errno : -EIO);
		r->eof = n == 0;
		r->end += n;
	}
}

static const char *split(char *line, size_t len, struct fields *f)
{
	char *p = line, *end = line + len;

	if (len == 0)
		return "empty line";
	for (f->n = 0;; f->n++) {
		char *sp = memchr(p, ' ', (size_t)(end - p));
		char *stop = sp ? sp : end;

		if (stop == p)
			return "empty field (a double space, or a space at an end)";
		if (f->n == MAX_FIELDS)
			return "too many fields";
		f->s[f->n] = p;
		f->len[f->n] = (size_t)(stop - p);
		if (!sp) {
			f->n++;
			return NULL;
		}
		p = sp + 1;
	}
}

static bool is(const struct fields *f, int i, const char *word)
{
	size_t n = strlen(word);

	return i < f->n && f->len[i] == n && !memcmp(f->s[i], word, n);
}

/* Takes and splits the next line, and hashes it unless it is the trailer. */
static int next_line(struct mf_reader *r, struct fields *f)
{
	char *line = NULL;
	size_t len = 0;
	int rc = take_line(r, &line, &len);

	if (rc != LINE_OK)
		return rc;
	f->bad = split(line, len, f);
	if (!is(f, 0, "end"))
		XXH3_128bits_update(r->text, line, len + 1);
	return LINE_OK;
}

/* Fields: one canonical spelling each, so a file is a function of its
 * entries (docs/MANIFEST.md). */

static bool parse_u64(const char *s, size_t n, uint64_t *v)
{
	uint64_t x = 0;

	if (n == 0 || (s[0] == '0' && n > 1))
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned d = (unsigned)(unsigned char)s[i] - '0';

		if (d > 9 || x > (UINT64_MAX - d) / 10)
			return false;
		x = x * 10 + d;
	}
	*v = x;
	return true;
}

static bool parse_i64(const char *s, size_t n, int64_t *v)
{
	size_t neg = n > 0 && s[0] == '-';
	uint64_t m;

	if (!parse_u64(s + neg, n - neg, &m) || m > (uint64_t)INT64_MAX + neg || (neg && m == 0))
		return false;
	*v = neg ? -(int64_t)(m - 1) - 1 : (int64_t)m;
	return true;
}

/* "0" and the octal digits without leading zeros: 00, 0644, 04755, 07777. */
static bool parse_mode(const char *s, size_t n, uint32_t *v)
{
	uint32_t x = 0;

	if (n < 2 || n > 5 || s[0] != '0' || (n > 2 && s[1] == '0'))
		return false;
	for (size_t i = 1; i < n; i++) {
		unsigned d = (unsigned)(unsigned char)s[i] - '0';

		if (d > 7)
			return false;
		x = x * 8 + d;
	}
	*v = x;
	return true;
}

static int take_name(struct mf_reader *r, char *s, size_t n, char **out, const char *what)
{
	int len = mf_unescape(s, n);

	if (len < 0)
		return fail(r, "bad escape in the %s", what);
	*out = malloc((size_t)len + 1);
	if (!*out)
		return fail_errno(r, -ENOMEM);
	memcpy(*out, s, (size_t)len);
	(*out)[len] = '\0';
	return 0;
}

/* Entries */

/* "d PATH MODE MTIME", "f PATH SIZE MODE MTIME DIGEST",
 * "l PATH SIZE MODE MTIME DIGEST TARGET". */
static int parse_entry(struct mf_reader *r, struct fields *f, struct mf_entry *e)
{
	char type = f->s[0][0];
	int want = type == MF_DIR ? 4 : type == MF_FILE ? 6 : 7, rc;
	int m = type == MF_DIR ? 2 : 3;    /* the mode's field; the mtime's is next */

	if (f->n != want)
		return fail(r, "a '%c' line has %d fields, not %d", type, want, f->n);
	e->type = type;
	rc = take_name(r, f->s[1], f->len[1], &e->path, "path");
	if (rc)
		return rc;
	if (type != MF_DIR && !parse_u64(f->s[2], f->len[2], &e->size))
		return fail(r, "bad size");
	if (!parse_mode(f->s[m], f->len[m], &e->mode))
		return fail(r, "bad mode (want 0 and octal digits, at most 07777)");
	if (!parse_i64(f->s[m + 1], f->len[m + 1], &e->mtime_ns))
		return fail(r, "bad mtime");
	if (type != MF_DIR && digest_from_hex(f->s[5], f->len[5], &e->digest))
		return fail(r, "bad digest");
	if (type == MF_LINK && (rc = take_name(r, f->s[6], f->len[6], &e->target, "link target")))
		return rc;
	if (type == MF_FILE)
		e->nchunks = mf_nchunks(e->size, r->chunk_size);
	return 0;
}

/* Fills e->chunks from the e->nchunks lines that follow its line, growing the
 * array as they arrive, never on the size's word. 1 when all came, 0 when a
 * journal ends among them (the caller drops e), or -errno. */
static int read_chunks(struct mf_reader *r, struct mf_entry *e)
{
	uint64_t cap = 0, fline = r->lineno;

	for (uint64_t i = 0; i < e->nchunks; i++) {
		struct fields f;
		int rc = next_line(r, &f);

		if (rc != LINE_OK)
			return rc < 0 ? rc : at_end(r, rc);
		if (f.bad || f.n != 2 || !is(&f, 0, "c"))
			return fail(r, "expected chunk line %" PRIu64 " of %" PRIu64 " for line %" PRIu64,
				    i + 1, e->nchunks, fline);
		if (i == cap) {
			digest_t *p;

			cap = cap ? 2 * cap : 64;
			cap = cap < e->nchunks ? cap : e->nchunks;
			p = realloc(e->chunks, cap * sizeof(*p));
			if (!p)
				return fail_errno(r, -ENOMEM);
			e->chunks = p;
		}
		if (digest_from_hex(f.s[1], f.len[1], &e->chunks[i]))
			return fail(r, "bad digest");
	}
	return 1;
}

static int read_trailer(struct mf_reader *r, const struct fields *f)
{
	struct fields after;
	digest_t root, text;
	uint64_t count;
	int rc;

	if (f->n != 4 || digest_from_hex(f->s[1], f->len[1], &root) ||
	    !parse_u64(f->s[2], f->len[2], &count) || digest_from_hex(f->s[3], f->len[3], &text))
		return fail(r, "bad end line (want \"end ROOT COUNT TEXT\")");
	/* The text first: it is what an edit or damage to the entries breaks. */
	if (!digest_eq(text, XXH3_128bits_digest(r->text)))
		return fail(r, "text digest mismatch: the manifest was edited or damaged");
	if (count != r->root.count)
		return fail(r, "entry count mismatch: the end line says %" PRIu64 ", found %" PRIu64,
			    count, r->root.count);
	r->root_final = mf_root_final(&r->root);
	if (!digest_eq(root, r->root_final))
		return fail(r, "root digest mismatch");
	rc = next_line(r, &after);
	if (rc < 0)
		return rc;
	if (rc != LINE_EOF)
		return fail(r, "data after the end line");
	return finish(r);
}

static int read_entry(struct mf_reader *r, struct mf_entry *e)
{
	const char *why;
	struct fields f;
	char t;
	int rc = next_line(r, &f);

	if (rc != LINE_OK)
		return rc < 0 ? rc : at_end(r, rc);
	if (f.bad)
		return fail(r, "%s", f.bad);
	if (is(&f, 0, "end"))
		return read_trailer(r, &f);
	t = f.s[0][0];
	if (f.len[0] != 1 || (t != MF_DIR && t != MF_FILE && t != MF_LINK))
		return fail(r, is(&f, 0, "c") ? "chunk line where none is due" : "unknown line type");
	rc = parse_entry(r, &f, e);
	if (rc)
		return rc;
	if (mf_entry_check(e, r->chunk_size, &why) ||
	    mf_entry_follows(r->prev.type ? &r->prev : NULL, e, &why))
		return fail(r, "%s", why);
	if (e->nchunks && (rc = read_chunks(r, e)) <= 0)
		return rc;
	mf_root_add(&r->root, e);
	r->prev.type = e->type;
	strcpy(r->prev.path, e->path);    /* fits: mf_entry_check bounds it */
	return 1;
}

/* "stage-manifest 1", "chunk N". */
static int read_header(struct mf_reader *r)
{
	struct fields f;
	uint64_t v;
	int rc;

	rc = next_line(r, &f);
	if (rc != LINE_OK)
		return rc < 0 ? rc : at_end(r, rc);
	if (f.bad || f.n != 2 || !is(&f, 0, "stage-manifest"))
		return fail(r, "not a stage manifest");
	if (!parse_u64(f.s[1], f.len[1], &v) || v != MF_VERSION)
		return fail(r, "unsupported manifest version (this build reads %d)", MF_VERSION);
	rc = next_line(r, &f);
	if (rc != LINE_OK)
		return rc < 0 ? rc : at_end(r, rc);
	if (f.bad || f.n != 2 || !is(&f, 0, "chunk") || !parse_u64(f.s[1], f.len[1], &v) ||
	    !mf_chunk_size_ok(v))
		return fail(r, "bad chunk line (want \"chunk N\", N a power of two from %u to %u)",
			    MF_CHUNK_MIN, MF_CHUNK_MAX);
	r->chunk_size = v;
	return 0;
}

/* Life cycle */

static void reader_free(struct mf_reader *r)
{
	free(r->prev.path);
	if (r->root.st)
		XXH3_freeState(r->root.st);
	XXH3_freeState(r->text);
	free(r->buf);
	free(r->why);
	free(r->label);
	free(r);
}

int mf_reader_open_fp(struct mf_reader **rp, FILE *fp, const char *label, enum mf_read_mode mode)
{
	struct mf_reader *r = calloc(1, sizeof(*r));

	if (!r)
		return -ENOMEM;
	r->fp = fp;
	r->mode = mode;
	r->label = strdup(label);
	r->why_cap = strlen(label) + sizeof(": 18446744073709551615: ") + WHY_MAX;
	r->why = calloc(1, r->why_cap);
	r->buf = malloc(BUF_CAP);
	r->text = XXH3_createState();
	r->prev.path = malloc(MF_MAX_PATH + 1);
	if (!r->label || !r->why || !r->buf || !r->text || !r->prev.path || mf_root_init(&r->root)) {
		reader_free(r);
		return -ENOMEM;
	}
	XXH3_128bits_reset(r->text);
	read_header(r);    /* an error or the end waits for the first next() */
	*rp = r;
	return 0;
}

int mf_reader_open(struct mf_reader **rp, int dirfd, const char *name, enum mf_read_mode mode)
{
	struct stat st;
	FILE *fp;
	int fd, rc;

	/* A manifest may lie in a tree a user owns, read by the daemon as
	 * root: a link in its place is not followed, a fifo does not hang it. */
	fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		goto out_close_fd;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
		goto out_close_fd;
	}
	fp = fdopen(fd, "r");
	if (!fp) {
		rc = -errno;
		goto out_close_fd;
	}
	rc = mf_reader_open_fp(rp, fp, name, mode);
	if (rc)
		goto out_fclose;
	(*rp)->own_fp = true;
	return 0;
out_fclose:
	fclose(fp);
	return rc;
out_close_fd:
	close(fd);
	return rc;
}

void mf_reader_close(struct mf_reader *r)
{
	if (r->own_fp)
		fclose(r->fp);
	reader_free(r);
}

int mf_reader_next(struct mf_reader *r, struct mf_entry *e)
{
	int rc;

	memset(e, 0, sizeof(*e));
	if (r->state != READING)
		return r->err;
	rc = read_entry(r, e);
	if (rc != 1)
		mf_entry_free(e);
	return rc;
}

uint64_t mf_reader_chunk_size(const struct mf_reader *r)
{
	return r->chunk_size;
}

digest_t mf_reader_root(const struct mf_reader *r)
{
	return r->root_final;
}

uint64_t mf_reader_count(const struct mf_reader *r)
{
	return r->root.count;
}

const char *mf_reader_why(const struct mf_reader *r)
{
	return r->why;
}
