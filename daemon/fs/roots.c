#include "daemon/fs/roots.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/manifest.h"
#include "common/paths.h"
#include "daemon/fs/cred.h"
#include "daemon/fs/treeops.h"

/* fsync of the directory that holds PATH: a new name in it is durable. */
static int sync_parent(const char *path)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	size_t n = slash ? (size_t)(slash - path) : 0;
	int fd, rc;

	if (n >= sizeof(dir))
		return -ENAMETOOLONG;
	memcpy(dir, path, n);
	dir[n] = '\0';
	fd = open(n ? dir : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	rc = treeops_sync_dir(fd);
	close(fd);
	return rc;
}

int roots_mkdirs(const char *path, unsigned mode)
{
	char buf[PATH_MAX];
	size_t n = strlen(path);

	if (n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1;; p++) {
		if (*p == '/' || *p == '\0') {
			char c = *p;

			*p = '\0';
			if (mkdir(buf, mode) == 0) {
				int rc = sync_parent(buf);

				if (rc < 0)
					return rc;
			} else if (errno != EEXIST) {
				return -errno;
			}
			*p = c;
			if (!c)
				break;
		}
	}
	return 0;
}

int roots_resolve(const char *abs, char **out)
{
	char buf[PATH_MAX], *real;
	size_t n = strlen(abs);
	char *cut;

	if (n >= sizeof(buf))
		return -ENAMETOOLONG;
	if (abs[0] != '/')
		return -EINVAL;
	memcpy(buf, abs, n + 1);
	for (;;) {
		real = realpath(buf, NULL);
		if (real)
			break;
		if (errno != ENOENT)
			return -errno;
		cut = strrchr(buf, '/');
		if (!cut || cut == buf)
			return -ENOENT;
		*cut = '\0';
	}
	{
		const char *rest = abs + strlen(buf);
		size_t rl = strlen(real), tl = strlen(rest);
		char *res;

		for (const char *p = rest; (p = strstr(p, "/..")); p += 3)
			if (p[3] == '/' || p[3] == '\0') {
				free(real);
				return -EINVAL;
			}
		res = malloc(rl + tl + 1);
		if (!res) {
			free(real);
			return -ENOMEM;
		}
		memcpy(res, real, rl);
		memcpy(res + rl, rest, tl + 1);
		free(real);
		/* realpath("/") + "/x" gives "//x". */
		paths_normalize(res, true);
		*out = res;
	}
	return 0;
}

/* Opens PATH (resolved, beneath the resolved ROOT) from ROOT's fd with no
 * symlink anywhere on the way. realpath checked a path that may have changed
 * since: a component swapped for a symlink in between fails here, -EPERM,
 * instead of leading outside. A directory fd, or -errno. */
static int open_beneath(const char *root, const char *path)
{
	const char *rel = paths_rel(path, root);
	int fd = rel ? treeops_open_beneath_path(root, rel) : -EXDEV;

	return fd == -ELOOP || fd == -EXDEV ? -EPERM : fd;
}

static const char *open_error(int err)
{
	return err == -EPERM
		? "it changed while being opened (a symlink on the way); nothing was read"
		: strerror(-err);
}

int roots_exit_code(int err)
{
	switch (err) {
	case -ENOMEM: case -EMFILE: case -ENFILE: case -EIO:
		return 1;
	default:
		return 2;
	}
}

bool roots_source_by_text(const struct stage_config *cfg, const char *src_arg)
{
	char p[PATH_MAX];

	if (snprintf(p, sizeof(p), "%s", src_arg) >= (int)sizeof(p) || paths_normalize(p, false) < 0)
		return false;
	for (int i = 0; i < cfg->n_source_roots; i++)
		if (paths_under(p, cfg->source_roots[i]))
			return true;
	return false;
}

int roots_pull(const struct stage_config *cfg, const char *src_arg, const char *dest_arg,
	       char **src, char **dst, int *src_fd, char *why, size_t whylen)
{
	char *s = NULL, *d = NULL, *stage = NULL, *root = NULL;
	const char *rel = NULL;
	int ret, fd = -1;

	*src = *dst = NULL;
	*src_fd = -1;
	s = realpath(src_arg, NULL);
	if (!s) {
		ret = -errno;
		snprintf(why, whylen, "source '%s': %s", src_arg, strerror(errno));
		return ret;
	}
	/* s is resolved (no link in it), so a root it lies beneath by its
	 * text is the directory it names: taken without asking that root's
	 * file system, which may be a mount that hangs. Only a root that is
	 * itself a link, or under one, needs resolving, each in turn. */
	for (int i = 0; i < cfg->n_source_roots && !rel; i++)
		if (paths_rel(s, cfg->source_roots[i]) && (root = strdup(cfg->source_roots[i])))
			rel = paths_rel(s, root);
	for (int i = 0; i < cfg->n_source_roots && !rel; i++) {
		free(root);
		root = realpath(cfg->source_roots[i], NULL);
		if (root)
			rel = paths_rel(s, root);
	}
	if (!rel) {
		char list[2048] = "";
		size_t n = 0;

		for (int i = 0; i < cfg->n_source_roots && n < sizeof(list); i++)
			n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "",
					      cfg->source_roots[i]);
		snprintf(why, whylen, "source '%s' (%s) is not under a source root (source_roots = %s); "
			 "add its mount to [paths] source_roots", src_arg, s, list);
		ret = -EPERM;
		goto out_free;
	}
	fd = open_beneath(root, s);
	if (fd < 0) {
		ret = fd;
		snprintf(why, whylen, "source '%s': %s", src_arg, fd == -ENOTDIR
			 ? "not a directory" : open_error(fd));
		goto out_free;
	}
	ret = roots_mkdirs(cfg->stage_root, 0755);
	stage = ret ? NULL : realpath(cfg->stage_root, NULL);
	if (!stage) {
		ret = ret ? ret : -errno;
		snprintf(why, whylen, "stage_root '%s': %s", cfg->stage_root, strerror(-ret));
		goto out_free;
	}
	if (dest_arg) {
		ret = roots_resolve(dest_arg, &d);
		if (ret < 0) {
			snprintf(why, whylen, "destination '%s': %s", dest_arg,
				 ret != -EINVAL ? strerror(-ret) : dest_arg[0] != '/'
				 ? "not an absolute path" : "'..' below what exists");
			goto out_free;
		}
	} else {
		const char *leaf = *rel ? rel : (strrchr(root, '/')[1] ? strrchr(root, '/') + 1 : "root");

		if (asprintf(&d, "%s/%s", stage, leaf) < 0) {
			d = NULL;
			ret = -ENOMEM;
			goto out_free;
		}
		paths_normalize(d, true);
	}
	if (!paths_under(d, stage) || strcmp(d, stage) == 0) {
		snprintf(why, whylen, "destination '%s' is not beneath stage_root '%s'",
			 dest_arg ? dest_arg : d, cfg->stage_root);
		ret = -EPERM;
		goto out_free;
	}
	if (paths_under(d, s) || paths_under(s, d)) {
		snprintf(why, whylen, "destination '%s' and source '%s' overlap", d, s);
		ret = -EINVAL;
		goto out_free;
	}
	*src = s;
	*dst = d;
	*src_fd = fd;
	free(stage);
	free(root);
	return 0;

out_free:
	if (fd >= 0)
		close(fd);
	free(s);
	free(d);
	free(stage);
	free(root);
	return ret;
}

int roots_local(const struct stage_config *cfg, const char *arg, char **path, int *fd,
		char *why, size_t whylen)
{
	const char *roots[] = { cfg->stage_root, cfg->ckpt_root, cfg->replica_root };
	char *p = realpath(arg, NULL);

	if (!p) {
		int ret = -errno;

		snprintf(why, whylen, "'%s': %s", arg, strerror(errno));
		return ret;
	}
	for (size_t i = 0; i < sizeof(roots) / sizeof(roots[0]); i++) {
		char *r = realpath(roots[i], NULL);
		int ret;

		if (!r || !paths_under(p, r) || strcmp(p, r) == 0) {
			free(r);
			continue;
		}
		ret = open_beneath(r, p);
		free(r);
		if (ret < 0) {
			snprintf(why, whylen, "'%s': %s", arg, open_error(ret));
			free(p);
			return ret;
		}
		*path = p;
		*fd = ret;
		return 0;
	}
	snprintf(why, whylen, "'%s' is not beneath stage_root %s, ckpt_root %s or replica_root %s: "
		 "only trees stage pulled and checkpoints are verified", arg, cfg->stage_root,
		 cfg->ckpt_root, cfg->replica_root);
	free(p);
	return -EPERM;
}

/* The first n components of rel ("a/b/c", n 2: "a/b") into out. 0, or
 * -ENOENT when rel has fewer. */
static int first_components(const char *rel, int n, char *out, size_t len)
{
	const char *p = rel;

	for (int i = 0; i < n; i++) {
		if (!*p || *p == '/')
			return -ENOENT;
		p = strchrnul(p, '/');
		if (i < n - 1 && *p)
			p++;
	}
	if ((size_t)(p - rel) >= len)
		return -ENAMETOOLONG;
	memcpy(out, rel, (size_t)(p - rel));
	out[p - rel] = '\0';
	return 0;
}

/* The owner of the directory rel beneath root, reached with no symbolic
 * link on the way or at its end (what a request then opens by name is this
 * or nothing), or of leaf in it (not followed) when leaf is not NULL. 0 and
 * *uid, or -errno (-ENOENT: not there). As the daemon. */
static int owner_beneath(const char *root, const char *rel, const char *leaf, uid_t *uid)
{
	int fd = treeops_open_beneath_path(root, rel);
	struct stat st;
	int rc = 0;

	if (fd < 0)
		return fd;
	if (leaf ? fstatat(fd, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0 : fstat(fd, &st) < 0)
		rc = -errno;
	else
		*uid = st.st_uid;
	close(fd);
	return rc;
}

static int refuse(const char *kind, const char *root, const char *rel, uid_t uid, uid_t me,
		  const char *verb, char *why, size_t whylen)
{
	char owner[128];

	if (uid == me)
		return 0;
	snprintf(why, whylen, "%s %s/%s belongs to %s: only its owner (or root) may %s it", kind,
		 root, rel, cred_name(uid, owner, sizeof(owner)), verb);
	return -EPERM;
}

int roots_job_owner_check(const struct stage_config *cfg, const char *job, const char *verb,
			  char *why, size_t whylen)
{
	uid_t uid = 0, me = cred_uid();
	int rc;

	if (cred_is_root())
		return 0;
	cred_daemon_begin();
	rc = owner_beneath(cfg->ckpt_root, job, NULL, &uid);
	cred_daemon_end();
	if (rc == -ENOENT)
		return 0;       /* restored onto an empty disk: the holders judge (PROTOCOL.md) */
	if (rc < 0) {
		snprintf(why, whylen, "checkpoint job %s/%s: %s", cfg->ckpt_root, job,
			 rc == -ELOOP || rc == -EXDEV ? "not a directory of its own (a link?)" :
			 strerror(-rc));
		return rc == -ELOOP || rc == -EXDEV ? -EPERM : rc;
	}
	return refuse("checkpoint job", cfg->ckpt_root, job, uid, me, verb, why, whylen);
}

int roots_owner_check(const struct stage_config *cfg, const char *abs, const char *verb,
		      bool *replica, char *why, size_t whylen)
{
	char *full = NULL, *croot = NULL, *rroot = NULL, part[PATH_MAX];
	const char *rel;
	uid_t uid = 0, me = cred_uid();
	int rc = 0;

	if (replica)
		*replica = false;
	if (cred_is_root())
		return 0;
	/* Metadata only, and the owner must be named even to a user who cannot
	 * search the tree: looked at as the daemon. The path is resolved here
	 * only to learn which job or replica it is about; that one is then
	 * looked at with no link followed, and the request checks the job it
	 * ends up with once more (roots_job_owner_check). */
	cred_daemon_begin();
	rc = roots_resolve(abs, &full);
	croot = realpath(cfg->ckpt_root, NULL);
	rroot = realpath(cfg->replica_root, NULL);
	cred_daemon_end();
	if (rc < 0) {
		snprintf(why, whylen, "%s: %s", abs, strerror(-rc));
		goto out;
	}
	if (croot && (rel = paths_rel(full, croot)) && *rel &&
	    first_components(rel, 1, part, sizeof(part)) == 0) {
		rc = roots_job_owner_check(cfg, part, verb, why, whylen);
	} else if (rroot && (rel = paths_rel(full, rroot)) && *rel) {
		/* A replica is its manifest's owner's (repl_build.c); above a
		 * step, replica_root holds every user's: root's business. */
		rc = first_components(rel, 3, part, sizeof(part));
		if (rc == 0) {
			cred_daemon_begin();
			rc = owner_beneath(rroot, part, MF_NAME, &uid);
			cred_daemon_end();
		} else {
			snprintf(part, sizeof(part), "%s", rel);
		}
		if (rc < 0) {
			snprintf(why, whylen, "%s/%s is not a replica with a manifest (%s): only root "
				 "may %s it", rroot, part, strerror(-rc), verb);
			rc = -EPERM;
		} else {
			rc = refuse("replica", rroot, part, uid, me, verb, why, whylen);
		}
		if (rc == 0 && replica)
			*replica = true;
	}
out:
	free(full);
	free(croot);
	free(rroot);
	return rc;
}
