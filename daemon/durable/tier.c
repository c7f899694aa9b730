/* The durable tier's layout, for its readers (tier.h). */
#include "daemon/durable/tier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/manifest.h"
#include "daemon/fs/cred.h"
#include "daemon/fs/treeops.h"

int durable_open(const struct stage_config *cfg, const char *rel)
{
	char job[256];
	struct stat st;
	int fd, jfd;

	if (!durable_on(cfg))
		return -ENOTSUP;
	fd = treeops_open_beneath_path(cfg->durable_root, rel);
	if (fd < 0 || cred_is_root())
		return fd;
	/* Job names are not per user on the shared durable root: a job
	 * directory there that another user made is not this user's job. */
	snprintf(job, sizeof(job), "%.*s", (int)strcspn(rel, "/"), rel);
	jfd = treeops_open_beneath_path(cfg->durable_root, job);
	if (jfd < 0 || fstat(jfd, &st) < 0 || (st.st_uid != cred_uid() && st.st_uid != 0)) {
		if (jfd >= 0)
			close(jfd);
		close(fd);
		return -EACCES;
	}
	close(jfd);
	return fd;
}

void durable_mf_name(const char *origin, char out[DURABLE_MF_MAX])
{
	snprintf(out, DURABLE_MF_MAX, DURABLE_MF_PREFIX "%.255s", origin);
}

bool durable_has_part(int jobfd, const char *step, const void *origin)
{
	char rel[2 * DURABLE_MF_MAX + 16], mf[DURABLE_MF_MAX];
	int fd;
	bool any = false;

	if (origin) {
		durable_mf_name(origin, mf);
		snprintf(rel, sizeof(rel), "%.255s/" MF_DIRNAME "/%s", step, mf);
		return faccessat(jobfd, rel, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
	}
	snprintf(rel, sizeof(rel), "%.255s/" MF_DIRNAME, step);
	fd = openat(jobfd, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd >= 0) {
		DIR *d = fdopendir(fd);
		struct dirent *e;

		if (!d) {
			close(fd);
			return false;
		}
		while (!any && (e = readdir(d)))
			any = strncmp(e->d_name, DURABLE_MF_PREFIX, strlen(DURABLE_MF_PREFIX)) == 0 &&
			      e->d_name[strlen(DURABLE_MF_PREFIX)] != '\0';
		closedir(d);
	}
	return any;
}

int durable_each_origin(int stepfd, int (*fn)(const char *origin, void *arg), void *arg)
{
	int fd = openat(stepfd, MF_DIRNAME, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	const size_t np = strlen(DURABLE_MF_PREFIX);
	struct dirent *e;
	DIR *d;
	int rc = 0;

	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!(d = fdopendir(fd))) {
		rc = -errno;
		close(fd);
		return rc;
	}
	errno = 0;
	while (rc == 0 && (e = readdir(d))) {
		/* A drain's temporary starts with '.'; NAME is the caller's to
		 * check as a node name. */
		if (strncmp(e->d_name, DURABLE_MF_PREFIX, np) == 0 && e->d_name[np] &&
		    (e->d_type == DT_REG || e->d_type == DT_UNKNOWN))
			rc = fn(e->d_name + np, arg);
	}
	closedir(d);
	return rc;
}

/* What is wrong with entry e beneath stepfd, or NULL. */
static const char *entry_wrong(int stepfd, const struct mf_entry *e, char *buf, size_t n)
{
	const char *base;
	struct stat sb;
	int pfd = *e->path ? treeops_open_parent(stepfd, e->path, &base) : dup(stepfd);
	const char *wrong = NULL;

	if (pfd < 0)
		return "its directory is missing";
	if (fstatat(pfd, *e->path ? base : ".", &sb, AT_SYMLINK_NOFOLLOW) < 0) {
		snprintf(buf, n, "%s", strerror(errno));
		wrong = buf;
	} else if (e->type == MF_DIR && !S_ISDIR(sb.st_mode)) {
		wrong = "not a directory";
	} else if (e->type == MF_LINK) {
		char t[MF_MAX_PATH + 1];
		ssize_t k = S_ISLNK(sb.st_mode) ? readlinkat(pfd, base, t, sizeof(t) - 1) : -1;

		if (k < 0 || (uint64_t)k != e->size || memcmp(t, e->target, (size_t)k) != 0)
			wrong = "link target differs";
	} else if (e->type == MF_FILE && !S_ISREG(sb.st_mode)) {
		wrong = "not a regular file";
	} else if (e->type == MF_FILE && (uint64_t)sb.st_size != e->size) {
		snprintf(buf, n, "size %lld, manifest says %llu", (long long)sb.st_size,
			 (unsigned long long)e->size);
		wrong = buf;
	} else if (e->type == MF_FILE && mf_mtime_ns(&sb) != e->mtime_ns) {
		wrong = "mtime differs from the manifest";
	}
	close(pfd);
	return wrong;
}

FILE *durable_mf_open(int stepfd, const char *origin)
{
	char rel[DURABLE_MF_MAX + 16], mf[DURABLE_MF_MAX];
	FILE *f;
	int fd, err;

	durable_mf_name(origin, mf);
	snprintf(rel, sizeof(rel), MF_DIRNAME "/%s", mf);
	fd = treeops_open_file_beneath(stepfd, rel);
	if (fd < 0) {
		errno = -fd;
		return NULL;
	}
	if (!(f = fdopen(fd, "re"))) {
		err = errno;
		close(fd);
		errno = err;
	}
	return f;
}

int durable_mf_root(int stepfd, const char *origin, digest_t *root)
{
	FILE *f = durable_mf_open(stepfd, origin);
	struct mf_reader *r;
	struct mf_entry e;
	int rc = f ? mf_reader_open_fp(&r, f, DURABLE_MF_PREFIX, MF_COMPLETE) : -errno;

	if (rc == 0) {
		while ((rc = mf_reader_next(r, &e)) == 1)
			mf_entry_free(&e);
		if (rc == 0)
			*root = mf_reader_root(r);
		mf_reader_close(r);
	}
	if (f)
		fclose(f);
	return rc;
}

int durable_part_check(int stepfd, const char *origin, struct durable_part *p)
{
	char rel[DURABLE_MF_MAX + 16], mf[DURABLE_MF_MAX], buf[256];
	struct mf_reader *r;
	struct mf_entry e;
	FILE *f;
	int rc;

	memset(p, 0, sizeof(*p));
	durable_mf_name(origin, mf);
	snprintf(rel, sizeof(rel), MF_DIRNAME "/%s", mf);
	f = durable_mf_open(stepfd, origin);
	rc = f ? mf_reader_open_fp(&r, f, rel, MF_COMPLETE) : -errno;
	if (rc < 0) {
		snprintf(p->first, sizeof(p->first), "%s: %s", rel, rc == -EINVAL ?
			 "not a regular file" : strerror(-rc));
		if (f)
			fclose(f);
		return rc;
	}
	while ((rc = mf_reader_next(r, &e)) == 1) {
		const char *wrong = entry_wrong(stepfd, &e, buf, sizeof(buf));

		if (e.type == MF_FILE) {
			p->files++;
			p->bytes += e.size;
		}
		if (wrong && !p->bad++) {
			size_t k = (size_t)snprintf(p->first, sizeof(p->first), "%.250s: ",
						    *e.path ? e.path : ".");

			snprintf(p->first + k, sizeof(p->first) - k, "%.250s", wrong);
		}
		mf_entry_free(&e);
	}
	if (rc == 0) {
		p->root = mf_reader_root(r);
		p->has_root = true;
	} else {
		snprintf(p->first, sizeof(p->first), "%s", mf_reader_why(r));
	}
	mf_reader_close(r);
	fclose(f);
	return rc < 0 ? rc : p->bad ? 1 : 0;
}
