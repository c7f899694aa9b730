#include "daemon/pull/dirstack.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/fs/treeops.h"

void dirstack_init(struct dirstack *ds, int root_fd, bool chown, const char *label)
{
	*ds = (struct dirstack){ .root_fd = root_fd, .chown = chown, .label = label };
}

void dirstack_close_until(struct dirstack *ds, const char *rel)
{
	while (ds->n) {
		struct dir_meta *d = &ds->v[ds->n - 1];
		size_t len = strlen(d->path);
		const char *what;
		int ret;

		if (rel && strncmp(rel, d->path, len) == 0 && rel[len] == '/')
			return;
		if (d->fd >= 0) {
			ret = treeops_set_meta(d->fd, ds->chown, d->uid, d->gid, d->mode,
					       d->mtime_ns, &what);
			if (ret < 0)
				log_warn("%s: %s of '%s': %s", ds->label, what, d->path,
					 strerror(-ret));
			close(d->fd);
		}
		free(d->path);
		ds->n--;
	}
}

int dirstack_push(struct dirstack *ds, const char *rel, uint32_t mode, int64_t mtime_ns,
		  uid_t uid, gid_t gid)
{
	const char *slash = strrchr(rel, '/');
	size_t plen = slash ? (size_t)(slash - rel) : 0;
	const struct dir_meta *top = ds->n ? &ds->v[ds->n - 1] : NULL;
	struct dir_meta *d;

	if (ds->n == ds->cap) {
		size_t cap = ds->cap ? 2 * ds->cap : 16;
		struct dir_meta *v = realloc(ds->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		ds->v = v;
		ds->cap = cap;
		top = ds->n ? &ds->v[ds->n - 1] : NULL;
	}
	d = &ds->v[ds->n];
	d->path = strdup(rel);
	if (!d->path)
		return -ENOMEM;
	if (top && top->fd >= 0 && strlen(top->path) == plen && strncmp(top->path, rel, plen) == 0)
		d->fd = openat(top->fd, slash + 1, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	else if (!slash)
		d->fd = openat(ds->root_fd, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	else
		d->fd = treeops_open_beneath(ds->root_fd, rel);
	if (d->fd < 0)
		log_warn("%s: cannot open '%s' to set its metadata", ds->label, rel);
	d->mode = mode;
	d->mtime_ns = mtime_ns;
	d->uid = uid;
	d->gid = gid;
	ds->n++;
	return 0;
}

void dirstack_destroy(struct dirstack *ds)
{
	dirstack_close_until(ds, NULL);
	free(ds->v);
	ds->v = NULL;
	ds->cap = 0;
}
