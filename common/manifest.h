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

#include "common/digest.h"

#define MF_VERSION 1
#define MF_DIRNAME ".stage"         /* beneath the tree's top directory */
#define MF_NAME ".stage/manifest"
#define MF_MAX_LINE (64 * 1024)     /* longest line a reader accepts */
#define MF_MAX_PATH 4096            /* longest raw relative path */

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

/* Escaping of names in the text: bytes 0x21..0x7e stand for themselves except
 * '%'; every other byte (space, newline, '%', controls, 0x7f..0xff) is
 * written %XX with upper-case hex. mf_escape returns the length written (not
 * counting the NUL) or -ENOSPC; cap of 3*n+1 always suffices. mf_unescape
 * decodes in place, returns the new length or -EINVAL (bad %XX, or a byte
 * that should have been escaped, or an escaped NUL). */
int mf_escape(const char *raw, size_t n, char *out, size_t cap);
int mf_unescape(char *s, size_t n);

/* Root digest: XXH3-128 over, for each entry in order: the type byte, the
 * path length as u64 little-endian, the raw path bytes, the size as u64
 * little-endian, and the 16 canonical bytes of the content digest (zero for
 * directories). Not modes, not mtimes. */
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
int mf_reader_open_fp(struct mf_reader **r, FILE *fp, const char *label, enum mf_read_mode mode);
/* 1 and *e filled (caller frees with mf_entry_free), 0 at the end (trailer
 * checked in MF_COMPLETE mode), or -errno with mf_reader_why() set to a
 * message that names the file and line. */
int mf_reader_next(struct mf_reader *r, struct mf_entry *e);
uint64_t mf_reader_chunk_size(const struct mf_reader *r);
/* After next() returned 0 in MF_COMPLETE mode: the trailer's root and count. */
digest_t mf_reader_root(const struct mf_reader *r);
uint64_t mf_reader_count(const struct mf_reader *r);
const char *mf_reader_why(const struct mf_reader *r);
void mf_reader_close(struct mf_reader *r);

#endif
