/* The manifest: the text file PATH/.stage/manifest that names a staged tree's
 * content (docs/MANIFEST.md is the format a peer re-implements from).
 *
 * Entries are kept in component order (mf_path_cmp): paths compare byte by
 * byte with '/' ranking below every other byte, which is the order of a
 * depth-first walk that visits each directory's names sorted by memcmp. So a
 * walker can emit entries as it goes and a reader can merge two manifests (or
 * a manifest and a walk) in one streaming pass; nothing needs the whole list
 * in memory.
 *
 * A manifest is complete only when its trailer line is present and matches:
 * the root digest recomputed over the entries, the entry count, and the
 * XXH3-128 of every byte of the file before the trailer. A truncated or
 * edited manifest therefore fails to read (mf_reader_next returns -EBADMSG
 * with a message naming the line). A reader in MF_PARTIAL mode accepts a
 * file without trailer and stops silently at a torn last line: that is how a
 * pull reads the journal of an interrupted run.
 */
#ifndef STAGE_MANIFEST_H
#define STAGE_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

#include "common/digest.h"

/* A stat's mtime as manifests keep it: ns since the epoch. */
static inline int64_t mf_mtime_ns(const struct stat *st)
{
	return (int64_t)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
}

#define MF_VERSION 1
#define MF_DIRNAME ".stage"         /* beneath the tree's top directory */
#define MF_NAME ".stage/manifest"
#define MF_MAX_LINE (64 * 1024)     /* longest line a reader accepts */
#define MF_MAX_PATH 4096            /* longest raw relative path or link target */
#define MF_CHUNK_MIN 4096u          /* chunk sizes are powers of two in [MIN, MAX] */
#define MF_CHUNK_MAX (1u << 30)
#define MF_CHUNK_DEFAULT (4u << 20)

enum mf_type {
	MF_DIR = 'd',
	MF_FILE = 'f',
	MF_LINK = 'l',
};

/* One entry. Strings are raw bytes (never escaped) and NUL-terminated; a name
 * cannot contain NUL, so that is unambiguous. The top directory itself is not
 * an entry. */
struct mf_entry {
	char type;               /* enum mf_type */
	char *path;              /* relative, '/'-separated, no leading '/', owned */
	uint64_t size;           /* files: bytes; links: target length; dirs: 0 */
	uint32_t mode;           /* permission bits, 07777 */
	int64_t mtime_ns;        /* nanoseconds since the epoch */
	digest_t digest;         /* files: content; links: target; dirs: zero */
	char *target;            /* links only, owned; NULL otherwise */
	uint64_t nchunks;        /* files larger than one chunk: ceil(size/chunk), else 0 */
	digest_t *chunks;        /* nchunks digests, owned */
};

void mf_entry_free(struct mf_entry *e);            /* frees members, zeroes e */
int mf_entry_copy(struct mf_entry *dst, const struct mf_entry *src); /* 0 / -ENOMEM */

/* Component order: <0, 0, >0 like memcmp. */
int mf_path_cmp(const char *a, const char *b);

/* The rules every entry obeys, shared by the writer and the reader (and
 * useful to anyone handed entries from outside). The two checks return 0, or
 * -EINVAL with *why set to a static message. */
bool mf_chunk_size_ok(uint64_t chunk_size);    /* power of two, MIN..MAX */
/* Chunk digests a file of this size carries: 0 up to one chunk, else
 * ceil(size / chunk_size). chunk_size must satisfy mf_chunk_size_ok. */
uint64_t mf_nchunks(uint64_t size, uint64_t chunk_size);
/* One entry on its own: type, path (relative, no empty, ".", ".." component,
 * not under .stage), mode bits, and per type: dirs have size 0, zero digest;
 * files have nchunks == mf_nchunks(size); links have a non-empty target of
 * `size` bytes whose XXH3-128 is the digest. Does not look at e->chunks. */
int mf_entry_check(const struct mf_entry *e, uint64_t chunk_size, const char **why);
/* e may come right after prev (NULL: e is the first): strictly later in
 * component order, and not beneath prev unless prev is a directory. Reads
 * only the type and path of each. */
int mf_entry_follows(const struct mf_entry *prev, const struct mf_entry *e, const char **why);

/* Escaping of names in the text: bytes 0x21..0x7e stand for themselves except
 * '%'; every other byte (space, newline, '%', controls, 0x7f..0xff) is
 * written %XX with upper-case hex. mf_escape returns the length written (not
 * counting the NUL) or -ENOSPC; cap of 3*n+1 always suffices. mf_unescape
 * decodes in place, returns the new length or -EINVAL (bad %XX, or a byte
 * that should have been escaped, or an escaped NUL). The encoding is
 * canonical: %XX is upper-case and only for bytes that need it, so "%41" and
 * "%2f" are -EINVAL too. mf_unescape does not write a terminating NUL. */
int mf_escape(const char *raw, size_t n, char *out, size_t cap);
int mf_unescape(char *s, size_t n);

/* Root digest: XXH3-128 over, for each entry in order: the type byte, the
 * path length as u64 little-endian, the raw path bytes, the size as u64
 * little-endian, and the 16 canonical bytes of the content digest (zero for
 * directories). Not modes, not mtimes. For a directory the size and digest
 * are hashed as zero whatever the entry holds, so a walk's entries give the
 * same root as the manifest's. */
struct mf_root {
	XXH3_state_t *st;
	uint64_t count;
};
int mf_root_init(struct mf_root *r);
void mf_root_add(struct mf_root *r, const struct mf_entry *e);
digest_t mf_root_final(struct mf_root *r);       /* also frees the state */

/* Writer. Lines go to a temporary file that the caller names; fflush'd by
 * mf_writer_flush (a pull calls it so its journal survives kill -9). finish
 * appends the trailer, fsyncs and closes; it does not rename. Entries must
 * arrive in component order (-EINVAL otherwise). */
struct mf_writer;
int mf_writer_open(struct mf_writer **w, int dirfd, const char *name, uint64_t chunk_size);
int mf_writer_add(struct mf_writer *w, const struct mf_entry *e);
int mf_writer_flush(struct mf_writer *w);
int mf_writer_finish(struct mf_writer *w, digest_t *root);  /* closes w */
void mf_writer_abort(struct mf_writer *w);                  /* closes w, keeps the file */

/* Reader: streaming, one entry at a time, memory bounded by MF_MAX_LINE and
 * the largest entry's chunk list. */
enum mf_read_mode { MF_COMPLETE, MF_PARTIAL };
struct mf_reader;
int mf_reader_open(struct mf_reader **r, int dirfd, const char *name, enum mf_read_mode mode);
/* open_fp reads fp from its current position and does not close it (the
 * caller does, after mf_reader_close); the label is copied. Both return
 * -errno only when the reader cannot be set up (no file, no memory); a bad
 * header is reported by the first next(). */
int mf_reader_open_fp(struct mf_reader **r, FILE *fp, const char *label, enum mf_read_mode mode);
/* 1 and *e filled (caller frees with mf_entry_free), 0 at the end (trailer
 * checked in MF_COMPLETE mode), or -errno with mf_reader_why() set to a
 * message that names the file and line. *e is overwritten, not freed, and is
 * zeroed unless 1 is returned. Once next() has returned 0 or an error, it
 * returns the same again. */
int mf_reader_next(struct mf_reader *r, struct mf_entry *e);
/* 0 when no header was read: a torn or empty journal in MF_PARTIAL mode, or
 * an error the first next() reports. */
uint64_t mf_reader_chunk_size(const struct mf_reader *r);
/* After next() returned 0 in MF_COMPLETE mode: the trailer's root and count.
 * In MF_PARTIAL mode: the root and count of the entries returned (the
 * trailer's, when it was there). */
digest_t mf_reader_root(const struct mf_reader *r);
uint64_t mf_reader_count(const struct mf_reader *r);
const char *mf_reader_why(const struct mf_reader *r);   /* "" when no error */
void mf_reader_close(struct mf_reader *r);

#endif
