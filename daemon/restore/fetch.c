/* Serving a restore: the origin of a checkpoint fetches back, from the copy
 * this node holds, its manifest or a byte range of one file. Every piece
 * travels as a codec chunk frame carrying its XXH3-64; the origin also
 * checks each manifest chunk and whole file it rebuilds (restore.c), so a
 * copy damaged here is caught there, not trusted.
 *
 * Only the origin may fetch (its proven name must be the copy's ORIGIN), and
 * only from the very commit it asks for (the root must match), so a restore
 * never mixes two commits of a step. Paths are opened beneath the copy with
 * no symlink on the way and never inside .stage.
 */
#include "daemon/restore/restore.h"
#include "daemon/peers/peers.h"
#include "daemon/repl/repl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/codec.h"
#include "common/log.h"
#include "common/manifest.h"
#include "daemon/ckpt/ckpt.h"
#include "daemon/net/peer.h"
#include "daemon/fs/treeops.h"

/* The root of the copy at step_fd. A restore asks for thousands of ranges of
 * one copy on one connection (one thread): the manifest is read whole once,
 * and again only when it is another file or was changed. */
static int copy_root(int step_fd, digest_t *root)
{
	static __thread struct { dev_t dev; ino_t ino; struct timespec mtime; off_t size;
				 digest_t root; bool valid; } seen;
	struct stat st;
	int rc;

	if (fstatat(step_fd, MF_NAME, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (seen.valid && seen.dev == st.st_dev && seen.ino == st.st_ino &&
	    seen.size == st.st_size && seen.mtime.tv_sec == st.st_mtim.tv_sec &&
	    seen.mtime.tv_nsec == st.st_mtim.tv_nsec) {
		*root = seen.root;
		return 0;
	}
	rc = ckpt_manifest_root(step_fd, MF_NAME, root, NULL, NULL, 0);
	seen.valid = rc == 0;
	seen.dev = st.st_dev;
	seen.ino = st.st_ino;
	seen.size = st.st_size;
	seen.mtime = st.st_mtim;
	seen.root = *root;
	return rc;
}

static int send_manifest(struct xport *x, int step_fd, char *why, size_t whylen)
{
	int fd = openat(step_fd, MF_NAME, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	uint8_t *slice = malloc(REPL_MF_SLICE);
	uint64_t off = 0;
	struct msg m;
	int rc = 0;

	if (fd < 0 || !slice) {
		rc = fd < 0 ? -errno : -ENOMEM;
		snprintf(why, whylen, "the manifest: %s", strerror(-rc));
		goto out;
	}
	for (;;) {
		ssize_t n = pread(fd, slice, REPL_MF_SLICE, (off_t)off);

		if (n < 0) {
			rc = -errno;
			snprintf(why, whylen, "reading the manifest: %s", strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		if (off + (uint64_t)n > REPL_MF_MAX) {
			rc = -EFBIG;
			snprintf(why, whylen, "the manifest is larger than %llu bytes",
				 (unsigned long long)REPL_MF_MAX);
			goto out;
		}
		msg_init(&m, MSG_MANIFEST);
		msg_put_u64(&m, K_OFFSET, off);
		rc = x->ops->send_tail(x, &m, K_DATA, slice, (size_t)n);
		msg_free(&m);
		if (rc < 0)
			goto out;
		off += (uint64_t)n;
	}
	msg_init(&m, MSG_END);
	msg_put_u64(&m, K_SIZE, off);
	rc = x->ops->send(x, &m);
	msg_free(&m);
out:
	free(slice);
	if (fd >= 0)
		close(fd);
	return rc;
}

static int send_range(struct xport *x, const char *origin, int step_fd, const char *rel,
		      uint64_t off, uint64_t size, bool no_sum, char *why, size_t whylen)
{
	const char *base;
	struct stat st;
	int dir_fd, fd = -1, rc;

	dir_fd = treeops_open_parent(step_fd, rel, &base);
	if (dir_fd >= 0) {
		fd = openat(dir_fd, base, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		close(dir_fd);
	}
	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
	    off > (uint64_t)st.st_size || size > (uint64_t)st.st_size - off) {
		rc = fd < 0 && dir_fd < 0 ? dir_fd : fd < 0 ? -errno : -ERANGE;
		snprintf(why, whylen, "%s: %s", rel, rc == -ERANGE ?
			 "not a file of that size here" : strerror(-rc));
		goto out;
	}
	rc = peers_send_range(x, origin, fd, (uint64_t)st.st_size, off, size, no_sum, rel, why,
			      whylen);
out:
	if (fd >= 0)
		close(fd);
	return rc;
}

int restore_fetch_serve(struct xport *x, const char *peer, const struct msg *req)
{
	char origin[CKPT_NAME_MAX + 1], job[CKPT_NAME_MAX + 1], step[CKPT_NAME_MAX + 1];
	char rel[3 * (CKPT_NAME_MAX + 1)], why[1024] = "", *hex = NULL, *path = NULL;
	uint64_t off = 0, size = 0, uid = 0, frame_sum = 1;
	digest_t want, have;
	struct stat st = { 0 };
	int step_fd = -1, rc;

	int prc = msg_get_str(req, K_PATH, &path);
	const char *bad = NULL;   /* what is wrong, in our words: a peer's bytes are not logged */

	if (ckpt_get_name(req, K_ORIGIN, origin) < 0 || ckpt_get_name(req, K_JOB, job) < 0 ||
	    ckpt_get_name(req, K_STEP, step) < 0)
		bad = "no valid origin, job or step name";
	else if (msg_get_str(req, K_ROOT, &hex) < 0 || digest_from_hex(hex, strlen(hex), &want) < 0)
		bad = "no valid root";
	else if (prc < 0 && prc != -ENOENT)
		bad = prc == -EINVAL ? "a path with a NUL byte" : "a path not read (out of memory)";
	else if (prc == 0 && !treeops_rel_ok(path))
		bad = "a path that is absolute, has an empty, '.' or '..' component, or is in .stage";
	else if (prc == 0 && (msg_get_u64(req, K_OFFSET, &off) < 0 ||
			      msg_get_u64(req, K_SIZE, &size) < 0))
		bad = "a path without its offset and size";
	free(hex);
	if (bad) {
		free(path);
		log_warn("fetch from %s refused: %s", peer, bad);
		peer_send_error(x, EBADMSG, "%s: a malformed fetch: %s", peers.cfg->name, bad);
		return -EBADMSG;
	}
	if (strcmp(origin, peer) != 0) {
		free(path);
		log_warn("fetch from %s refused: it may fetch only its own checkpoints, not %s's",
			 peer, origin);
		peer_send_error(x, EACCES, "%s: node %s may fetch only its own checkpoints, not %s's",
				peers.cfg->name, peer, origin);
		return -EACCES;
	}
	snprintf(rel, sizeof(rel), "%s/%s/%s", origin, job, step);
	step_fd = treeops_open_beneath_path(peers.cfg->replica_root, rel);
	rc = step_fd < 0 ? step_fd : copy_root(step_fd, &have);
	if (rc == 0 && !digest_eq(have, want))
		rc = -ESTALE;
	if (rc < 0) {
		snprintf(why, sizeof(why), "%s/%s: %s", peers.cfg->replica_root, rel,
			 rc == -ESTALE ? "holds another commit of this step" :
			 rc == -ENOENT ? "no copy here" : strerror(-rc));
		log_warn("fetch from %s refused: %s", peer, why);
		peer_send_error(x, -rc, "%s: %s", peers.cfg->name, why);
		goto out;
	}
	if (msg_get_u64(req, K_UID, &uid) == 0 && uid != 0 &&
	    (fstatat(step_fd, MF_NAME, &st, AT_SYMLINK_NOFOLLOW) < 0 || st.st_uid != uid)) {
		/* The copy is its owner's (the manifest's uid): a user of the
		 * origin who is not its owner gets nothing of it. */
		rc = -EACCES;
		snprintf(why, sizeof(why), "%s/%s belongs to uid %u, not to uid %llu who asks",
			 peers.cfg->replica_root, rel, (unsigned)st.st_uid, (unsigned long long)uid);
		log_warn("fetch from %s refused: %s", peer, why);
		peer_send_error(x, EACCES, "%s: %s", peers.cfg->name, why);
		goto out;
	}
	x->ops->set_timeout(x, peers_io_ms());
	msg_get_u64(req, K_FRAME_SUM, &frame_sum);
	rc = path ? send_range(x, origin, step_fd, path, off, size, frame_sum == 0, why,
			       sizeof(why))
		  : send_manifest(x, step_fd, why, sizeof(why));
	if (rc < 0 && *why) {
		log_warn("restore of %s for %s: %s", rel, peer, why);
		peer_send_error(x, -rc, "%s: %s/%s: %s", peers.cfg->name, peers.cfg->replica_root, rel,
				why);
	}
out:
	if (step_fd >= 0)
		close(step_fd);
	free(path);
	return rc;
}
