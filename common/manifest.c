/* The manifest's rules and its writer; the reader is mf_read.c, the format
 * docs/MANIFEST.md.
 *
 * Invariants of every manifest, written by mf_writer_* and checked again by
 * the reader through the same two functions (mf_entry_check for an entry on
 * its own, mf_entry_follows for an entry after the one before it), so the
 * writer can never produce a file the reader rejects:
 *  - paths are relative, with no empty, "." or ".." component, and nothing
 *    under the reserved top-level ".stage";
 *  - entries are strictly increasing in component order, and nothing lies
 *    beneath a file or a link;
 *  - a directory has size 0 and a zero digest; a file carries exactly
 *    mf_nchunks(size) chunk digests; a link's size and digest are its
 *    target's length and XXH3-128;
 *  - every line, the longest link included, fits in MF_MAX_LINE, and there is
 *    one canonical text for each entry (numbers without leading zeros, %XX
 *    only where needed), so a file is a function of its entries.
 *
 * Writer states: open (mf_writer_open wrote the header) -> adding
 * (mf_writer_add, mf_writer_flush) -> closed, either by mf_writer_finish
 * (trailer, fsync) or by mf_writer_abort (no trailer: a journal). The root
 * and text digests cover exactly the entries added and the bytes handed to
 * stdio. The first write error is sticky: every later call returns it and
 * finish writes no trailer, so a short file never looks complete. A rejected
 * entry (-EINVAL) writes nothing and changes nothing.
 */
#include "common/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MF_IOBUF (1u << 20)        /* stdio buffer of a writer */
#define ESCAPED_MAX (3 * MF_MAX_PATH)

/* The longest line: "l", path, size, mode, mtime, digest, target. */
_Static_assert(2 + ESCAPED_MAX + 3 * 21 + 6 + DIGEST_HEX_LEN + 1 + ESCAPED_MAX + 1 < MF_MAX_LINE,
	       "an entry line must fit in MF_MAX_LINE");

/* Entries */

void mf_entry_free(struct mf_entry *e)
{
	free(e->path);
	free(e->target);
	free(e->chunks);
	memset(e, 0, sizeof(*e));
}

int mf_entry_copy(struct mf_entry *dst, const struct mf_entry *src)
{
	*dst = *src;
	dst->path = NULL;
	dst->target = NULL;
	dst->chunks = NULL;
	if (src->path && !(dst->path = strdup(src->path)))
		goto out_free;
	if (src->target && !(dst->target = strdup(src->target)))
		goto out_free;
	if (src->nchunks && src->chunks) {
		dst->chunks = malloc(src->nchunks * sizeof(*dst->chunks));
		if (!dst->chunks)
			goto out_free;
		memcpy(dst->chunks, src->chunks, src->nchunks * sizeof(*dst->chunks));
	}
	return 0;
out_free:
	mf_entry_free(dst);
	return -ENOMEM;
}

/* Order and rules */

/* The end of a string ranks lowest, then '/', then every other byte. */
static unsigned rank(unsigned char c)
{
	return c == '/' ? 1 : c == '\0' ? 0 : c + 1u;
}

int mf_path_cmp(const char *a, const char *b)
{
	const unsigned char *p = (const unsigned char *)a, *q = (const unsigned char *)b;

	while (*p && *p == *q)
		p++, q++;
	return (int)rank(*p) - (int)rank(*q);
}

bool mf_chunk_size_ok(uint64_t chunk_size)
{
	return chunk_size >= MF_CHUNK_MIN && chunk_size <= MF_CHUNK_MAX &&
	       !(chunk_size & (chunk_size - 1));
}

uint64_t mf_nchunks(uint64_t size, uint64_t chunk_size)
{
	return size > chunk_size ? (size - 1) / chunk_size + 1 : 0;
}

static const char *path_invalid(const char *p)
{
	size_t n = strlen(p);
	const char *c, *end = p + n;

	if (n == 0)
		return "empty path";
	if (n > MF_MAX_PATH)
		return "path too long";
	for (c = p; c <= end;) {
		const char *slash = memchr(c, '/', (size_t)(end - c));
		size_t len = (size_t)((slash ? slash : end) - c);

		if (len == 0)
			return "path has an empty component (leading, trailing or double '/')";
		if ((len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
			return "path has a '.' or '..' component";
		if (c == p && len == strlen(MF_DIRNAME) && !memcmp(c, MF_DIRNAME, len))
			return "path under " MF_DIRNAME " (reserved)";
		c += len + 1;
	}
	return NULL;
}

static const char *entry_invalid(const struct mf_entry *e, uint64_t chunk_size)
{
	static const digest_t zero;
	const char *why;

	if (e->type != MF_DIR && e->type != MF_FILE && e->type != MF_LINK)
		return "unknown entry type";
	if (!e->path)
		return "entry without a path";
	if ((why = path_invalid(e->path)))
		return why;
	if (e->mode & ~07777u)
		return "mode has bits beyond 07777";
	if ((e->type == MF_LINK) != (e->target != NULL))
		return e->target ? "only a link has a target" : "link without a target";
	if (e->nchunks != (e->type == MF_FILE ? mf_nchunks(e->size, chunk_size) : 0))
		return "wrong number of chunk digests for the size";
	if (e->type == MF_DIR && (e->size || !digest_eq(e->digest, zero)))
		return "directory with a size or a digest";
	if (e->type == MF_LINK) {
		size_t n = strlen(e->target);

		if (n == 0)
			return "link with an empty target";
		if (n > MF_MAX_PATH)
			return "link target too long";
		if (e->size != n)
			return "link size is not its target's length";
		if (!digest_eq(e->digest, digest_of(e->target, n)))
			return "link digest is not its target's digest";
	}
	return NULL;
}

int mf_entry_check(const struct mf_entry *e, uint64_t chunk_size, const char **why)
{
	*why = entry_invalid(e, chunk_size);
	return *why ? -EINVAL : 0;
}

int mf_entry_follows(const struct mf_entry *prev, const struct mf_entry *e, const char **why)
{
	size_t n;
	int c;

	*why = NULL;
	if (!prev)
		return 0;
	c = mf_path_cmp(prev->path, e->path);
	if (c >= 0)
		*why = c ? "entry out of order" : "duplicate entry";
	/* Any descendant of prev sorts right after prev, so the first one
	 * follows it directly: checking the previous entry is enough. */
	n = strlen(prev->path);
	if (c < 0 && prev->type != MF_DIR && !strncmp(prev->path, e->path, n) && e->path[n] == '/')
		*why = "entry beneath a file or a link";
	return *why ? -EINVAL : 0;
}

/* Escaping */

static bool plain(unsigned char c)
{
	return c > 0x20 && c < 0x7f && c != '%';
}

int mf_escape(const char *raw, size_t n, char *out, size_t cap)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;

	if (cap > INT_MAX)
		cap = INT_MAX;
	if (cap == 0)
		return -ENOSPC;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)raw[i];

		if (cap - o < (plain(c) ? 2u : 4u))   /* room for it and the NUL */
			return -ENOSPC;
		if (plain(c)) {
			out[o++] = (char)c;
		} else {
			out[o++] = '%';
			out[o++] = hex[c >> 4];
			out[o++] = hex[c & 15];
		}
	}
	out[o] = '\0';
	return (int)o;
}

int mf_unescape(char *s, size_t n)
{
	size_t o = 0;

	if (n > INT_MAX)
		return -EINVAL;
	for (size_t i = 0; i < n; o++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '%') {
			int hi = n - i >= 3 ? digest_hexval(s[i + 1], false) : -1;
			int lo = n - i >= 3 ? digest_hexval(s[i + 2], false) : -1;

			if (hi < 0 || lo < 0)
				return -EINVAL;
			c = (unsigned char)(hi << 4 | lo);
			if (c == '\0' || plain(c))
				return -EINVAL;
			i += 3;
		} else if (plain(c)) {
			i++;
		} else {
			return -EINVAL;
		}
		s[o] = (char)c;
	}
	return (int)o;
}

/* Root digest */

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

int mf_root_init(struct mf_root *r)
{
	r->count = 0;
	r->st = XXH3_createState();
	if (!r->st)
		return -ENOMEM;
	XXH3_128bits_reset(r->st);
	return 0;
}

void mf_root_add(struct mf_root *r, const struct mf_entry *e)
{
	static const digest_t zero;
	bool dir = e->type == MF_DIR;
	size_t n = strlen(e->path);
	uint8_t head[9], tail[24];

	head[0] = (uint8_t)e->type;
	put_le64(head + 1, n);
	put_le64(tail, dir ? 0 : e->size);
	digest_to_bytes(dir ? zero : e->digest, tail + 8);
	XXH3_128bits_update(r->st, head, sizeof(head));
	XXH3_128bits_update(r->st, e->path, n);
	XXH3_128bits_update(r->st, tail, sizeof(tail));
	r->count++;
}

digest_t mf_root_final(struct mf_root *r)
{
	digest_t d = XXH3_128bits_digest(r->st);

	XXH3_freeState(r->st);
	r->st = NULL;
	return d;
}

/* Writer */

struct mf_writer {
	FILE *fp;                 /* the file, owned; fully buffered on iobuf */
	char *iobuf;              /* MF_IOBUF bytes, stdio's until fclose */
	char *line;               /* MF_MAX_LINE + 1 bytes: the line being formatted */
	XXH3_state_t *text;       /* over every byte handed to stdio */
	struct mf_root root;      /* over every entry added */
	uint64_t chunk_size;      /* bytes, mf_chunk_size_ok */
	struct mf_entry prev;     /* last entry added: type and path only; type 0 before the first */
	int err;                  /* first write error (-errno), sticky */
};

static void writer_free(struct mf_writer *w)
{
	free(w->prev.path);
	if (w->root.st)
		XXH3_freeState(w->root.st);
	XXH3_freeState(w->text);
	free(w->line);
	free(w->iobuf);
	free(w);
}

static int writer_alloc(struct mf_writer **wp, uint64_t chunk_size)
{
	struct mf_writer *w = calloc(1, sizeof(*w));

	if (!w)
		return -ENOMEM;
	w->chunk_size = chunk_size;
	w->iobuf = malloc(MF_IOBUF);
	w->line = malloc(MF_MAX_LINE + 1);
	w->text = XXH3_createState();
	w->prev.path = malloc(MF_MAX_PATH + 1);
	if (!w->iobuf || !w->line || !w->text || !w->prev.path || mf_root_init(&w->root)) {
		writer_free(w);
		return -ENOMEM;
	}
	XXH3_128bits_reset(w->text);
	*wp = w;
	return 0;
}

static int put(struct mf_writer *w, const char *s, size_t n)
{
	if (w->err)
		return w->err;
	XXH3_128bits_update(w->text, s, n);
	errno = 0;
	if (fwrite(s, 1, n, w->fp) != n)
		w->err = errno ? -errno : -EIO;
	return w->err;
}

int mf_writer_open(struct mf_writer **wp, int dirfd, const char *name, uint64_t chunk_size)
{
	struct mf_writer *w;
	int fd, n, rc;

	if (!mf_chunk_size_ok(chunk_size))
		return -EINVAL;
	rc = writer_alloc(&w, chunk_size);
	if (rc)
		return rc;
	fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		goto out_free_writer;
	}
	w->fp = fdopen(fd, "w");
	if (!w->fp) {
		rc = -errno;
		goto out_close_fd;
	}
	setvbuf(w->fp, w->iobuf, _IOFBF, MF_IOBUF);
	n = snprintf(w->line, MF_MAX_LINE + 1, "stage-manifest %d\nchunk %" PRIu64 "\n",
		     MF_VERSION, chunk_size);
	rc = put(w, w->line, (size_t)n);
	if (rc) {
		mf_writer_abort(w);
		return rc;
	}
	*wp = w;
	return 0;
out_close_fd:
	close(fd);
out_free_writer:
	writer_free(w);
	return rc;
}

/* e is valid, so the line fits (see the _Static_assert). */
static size_t format_entry(char *out, const struct mf_entry *e)
{
	char *p = out, *end = out + MF_MAX_LINE + 1;
	char hex[DIGEST_HEX_LEN + 1];

	*p++ = e->type;
	*p++ = ' ';
	p += mf_escape(e->path, strlen(e->path), p, (size_t)(end - p));
	if (e->type == MF_DIR) {
		p += snprintf(p, (size_t)(end - p), " 0%o %" PRId64, (unsigned)e->mode, e->mtime_ns);
	} else {
		digest_to_hex(e->digest, hex);
		p += snprintf(p, (size_t)(end - p), " %" PRIu64 " 0%o %" PRId64 " %s",
			      e->size, (unsigned)e->mode, e->mtime_ns, hex);
	}
	if (e->type == MF_LINK) {
		*p++ = ' ';
		p += mf_escape(e->target, strlen(e->target), p, (size_t)(end - p));
	}
	*p++ = '\n';
	return (size_t)(p - out);
}

/* "c <hex>\n" lines, batched a line buffer at a time. */
static int put_chunks(struct mf_writer *w, const struct mf_entry *e)
{
	enum { CLINE = 2 + DIGEST_HEX_LEN + 1 };
	size_t n = 0;
	int rc = 0;

	for (uint64_t i = 0; i < e->nchunks && !rc; i++) {
		char *p = w->line + n;

		p[0] = 'c';
		p[1] = ' ';
		digest_to_hex(e->chunks[i], p + 2);
		p[CLINE - 1] = '\n';
		n += CLINE;
		if (n + CLINE > MF_MAX_LINE || i + 1 == e->nchunks) {
			rc = put(w, w->line, n);
			n = 0;
		}
	}
	return rc;
}

int mf_writer_add(struct mf_writer *w, const struct mf_entry *e)
{
	const char *why;
	int rc;

	if (w->err)
		return w->err;
	if (mf_entry_check(e, w->chunk_size, &why) || (e->nchunks && !e->chunks) ||
	    mf_entry_follows(w->prev.type ? &w->prev : NULL, e, &why))
		return -EINVAL;
	rc = put(w, w->line, format_entry(w->line, e));
	if (!rc)
		rc = put_chunks(w, e);
	if (rc)
		return rc;
	mf_root_add(&w->root, e);
	w->prev.type = e->type;
	strcpy(w->prev.path, e->path);    /* fits: mf_entry_check bounds it */
	return 0;
}

int mf_writer_flush(struct mf_writer *w)
{
	if (!w->err && fflush(w->fp))
		w->err = -errno;
	return w->err;
}

int mf_writer_finish(struct mf_writer *w, digest_t *root)
{
	char rhex[DIGEST_HEX_LEN + 1], thex[DIGEST_HEX_LEN + 1];
	digest_t r = mf_root_final(&w->root);
	int n, rc;

	digest_to_hex(r, rhex);
	digest_to_hex(XXH3_128bits_digest(w->text), thex);
	n = snprintf(w->line, MF_MAX_LINE + 1, "end %s %" PRIu64 " %s\n", rhex, w->root.count, thex);
	rc = put(w, w->line, (size_t)n);
	if (!rc && fflush(w->fp))
		rc = -errno;
	if (!rc && fsync(fileno(w->fp)))
		rc = -errno;
	if (fclose(w->fp) && !rc)
		rc = -errno;
	if (!rc && root)
		*root = r;
	writer_free(w);
	return rc;
}

void mf_writer_abort(struct mf_writer *w)
{
	fclose(w->fp);
	writer_free(w);
}
