/* A forward-only cursor over a manifest, for merging it with a walk that
 * visits paths in the same (component) order. */
#ifndef STAGE_CURSOR_H
#define STAGE_CURSOR_H

#include <stdbool.h>

#include "common/manifest.h"

struct cursor {
	struct mf_reader *r;     /* NULL: an empty cursor */
	struct mf_entry cur;     /* valid when have */
	bool have;
	int err;                 /* the reader's error, if it stopped on one */
};

/* Opens NAME in dirfd; a missing file gives an empty cursor and 0. Other
 * errors: -errno, and *why (if not NULL) says what. */
int cursor_open(struct cursor *c, int dirfd, const char *name, enum mf_read_mode mode,
		char *why, size_t whylen);
/* The entry at exactly `path`, or NULL; skips entries before it. */
const struct mf_entry *cursor_find(struct cursor *c, const char *path);
/* Steps to the next entry: the current one or NULL at the end. */
const struct mf_entry *cursor_peek(struct cursor *c);
void cursor_advance(struct cursor *c);
uint64_t cursor_chunk_size(const struct cursor *c);
void cursor_close(struct cursor *c);

#endif
