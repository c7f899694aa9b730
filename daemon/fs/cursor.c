#include "daemon/fs/cursor.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"

static void step(struct cursor *c)
{
	int ret;

	mf_entry_free(&c->cur);
	c->have = false;
	if (!c->r || c->err)
		return;
	ret = mf_reader_next(c->r, &c->cur);
	if (ret == 1) {
		c->have = true;
	} else if (ret < 0) {
		c->err = ret;
		log_warn("%s", mf_reader_why(c->r));
	}
}

int cursor_open(struct cursor *c, int dirfd, const char *name, enum mf_read_mode mode,
		char *why, size_t whylen)
{
	int ret;

	memset(c, 0, sizeof(*c));
	ret = mf_reader_open(&c->r, dirfd, name, mode);
	if (ret == -ENOENT) {
		c->r = NULL;
		return 0;
	}
	if (ret < 0) {
		if (why)
			snprintf(why, whylen, "%s: %s", name,
				 c->r ? mf_reader_why(c->r) : strerror(-ret));
		if (c->r)
			mf_reader_close(c->r);
		c->r = NULL;
		return ret;
	}
	step(c);
	return 0;
}

const struct mf_entry *cursor_peek(struct cursor *c)
{
	return c->have ? &c->cur : NULL;
}

void cursor_advance(struct cursor *c)
{
	step(c);
}

const struct mf_entry *cursor_find(struct cursor *c, const char *path)
{
	while (c->have) {
		int cmp = mf_path_cmp(c->cur.path, path);

		if (cmp == 0)
			return &c->cur;
		if (cmp > 0)
			return NULL;
		step(c);
	}
	return NULL;
}

uint64_t cursor_chunk_size(const struct cursor *c)
{
	return c->r ? mf_reader_chunk_size(c->r) : 0;
}

void cursor_close(struct cursor *c)
{
	mf_entry_free(&c->cur);
	if (c->r)
		mf_reader_close(c->r);
	memset(c, 0, sizeof(*c));
}
