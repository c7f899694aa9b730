/* A restore's source: this node's part of the step on the durable tier
 * (durable/tier.h), read from the shared storage beneath [durable] root with
 * no symlink followed on the way, each piece handed to the builder, which
 * checks every chunk against the manifest. */
#include "daemon/restore/rsrc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/durable/tier.h"
#include "daemon/engine/uio.h"
#include "daemon/fs/treeops.h"
#include "daemon/repl/repl.h"
#include "daemon/peers/peers.h"

static int d_open(struct rsrc *s)
{
	char rel[2 * 256 + 2];

	snprintf(rel, sizeof(rel), "%s/%s", s->job, s->step);
	s->stepfd = durable_open(peers.cfg, rel);
	if (s->stepfd < 0) {
		snprintf(s->why, s->whylen, "%s: %s", s->label, s->stepfd == -ENOTSUP ?
			 "this node has no [durable] root" : strerror(-s->stepfd));
		return s->stepfd;
	}
	return 0;
}

/* A regular file beneath the step: its fd, or -errno with why. */
static int open_file(struct rsrc *s, const char *rel, uint64_t need)
{
	int fd = treeops_open_file_beneath(s->stepfd, rel), rc = fd < 0 ? fd : 0;
	struct stat st;

	if (rc == 0 && (fstat(fd, &st) < 0 || (uint64_t)st.st_size < need))
		rc = -ENODATA;
	if (rc < 0) {
		snprintf(s->why, s->whylen, "%s/%s on the durable tier: %s", s->label, rel,
			 rc == -EINVAL ? "not a regular file" : rc == -ENODATA ?
			 "shorter than its manifest says" : strerror(-rc));
		if (fd >= 0)
			close(fd);
		return rc;
	}
	return fd;
}

static int d_manifest(struct rsrc *s, int out)
{
	char rel[DURABLE_MF_MAX + 16], mf[DURABLE_MF_MAX];
	uint8_t buf[64 * 1024];
	uint64_t off = 0;
	ssize_t n;
	int fd, rc = 0;

	durable_mf_name(peers_self_name(), mf);
	snprintf(rel, sizeof(rel), ".stage/%s", mf);
	fd = open_file(s, rel, 0);
	if (fd < 0)
		return fd;
	while (rc == 0 && (n = uio_pread(s->ring, fd, buf, sizeof(buf), off)) > 0) {
		rc = uio_pwrite(s->ring, out, buf, (size_t)n, off);
		off += (uint64_t)n;
	}
	if (rc == 0 && n < 0)
		rc = (int)n;
	if (rc < 0)
		snprintf(s->why, s->whylen, "copying %s/%s from the durable tier: %s", s->label, rel,
			 strerror(-rc));
	close(fd);
	return rc;
}

static int d_fetch(struct rsrc *s, struct cbuild *cb, const struct mf_entry *e, uint64_t off,
		   uint64_t end)
{
	int fd, rc = 0;

	if (cb->at != off)
		return -EINVAL;         /* the builder is where the run begins */
	if ((fd = open_file(s, e->path, end)) < 0)
		return fd;
	while (rc == 0 && cb->at < end) {
		uint64_t at = cb->at;
		size_t n = end - at < WQ_BUF ? (size_t)(end - at) : WQ_BUF;
		uint8_t *p;
		int b = cbuild_buf(cb, &p);
		ssize_t got = uio_pread(s->ring, fd, p, n, at);

		if (got != (ssize_t)n) {
			rc = got < 0 ? (int)got : -EIO;
			snprintf(s->why, s->whylen, "reading %s/%s on the durable tier at byte %llu: %s",
				 s->label, e->path, (unsigned long long)at,
				 got < 0 ? strerror(-rc) : "cut short");
			break;
		}
		rc = cbuild_put(cb, b, n);
		if (rc == -EBADMSG)
			snprintf(s->why, s->whylen, "chunk %llu of %s/%s on the durable tier does not "
				 "match the manifest", (unsigned long long)cb->bad_chunk, s->label,
				 e->path);
		else if (rc < 0)
			snprintf(s->why, s->whylen, "writing %s: %s", e->path, strerror(-rc));
		else
			s->bytes += n;
	}
	close(fd);
	return rc;
}

static void d_close(struct rsrc *s)
{
	if (s->stepfd >= 0)
		close(s->stepfd);
	s->stepfd = -1;
}

const struct rsrc_ops rsrc_durable_ops = {
	.open = d_open, .manifest = d_manifest, .fetch = d_fetch, .close = d_close,
};
