/* The drainer (drain.h has the states): scan, choose, drain, retire. */
#include "daemon/durable/drain.h"
#include "daemon/durable/tier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/digest.h"
#include "common/log.h"
#include "common/manifest.h"
#include "daemon/ckpt/ckpt.h"
#include "daemon/engine/cbuild.h"
#include "daemon/engine/pace.h"
#include "daemon/engine/prio.h"
#include "daemon/engine/uio.h"
#include "daemon/fs/cred.h"
#include "daemon/fs/treeops.h"
#include "daemon/obs/obs.h"

#define SCAN_MS 2000            /* how often committed steps are looked for */
#define RETRY_MS 30000          /* after a failed drain, the next try of that job */
#define BUF (1u << 20)
#define PENDING_MAX 8           /* chosen steps of a job waiting to be drained */

static struct {
	const struct stage_config *cfg;   /* borrowed */
	pthread_t thread;
	bool running;
	atomic_bool stopping;             /* read between pieces too: a stop never waits
					   * for a big file at a low rate */
	pthread_mutex_t lock;             /* with cond, the wait between scans */
	pthread_cond_t cond;              /* monotonic; signalled at stop */
	struct io_uring ring;
	struct pace pace;
	struct cbuild cb;                 /* the file being drained */
	uint8_t *buf;                     /* BUF bytes */
} dr = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* ---- which steps: state_dir/durable/JOB ---- */

struct jstate {
	char seen[CKPT_NAME_MAX + 1];     /* newest step considered, "" for none */
	unsigned since;                   /* commits since the last chosen one */
	char pending[PENDING_MAX][CKPT_NAME_MAX + 1];
	size_t npending;
};

static void state_path(const char *job, char *out, size_t n)
{
	snprintf(out, n, "%s/durable/%s", dr.cfg->state_dir, job);
}

static void state_load(const char *job, struct jstate *s)
{
	char path[8192], line[CKPT_NAME_MAX + 32], name[CKPT_NAME_MAX + 1];
	FILE *f;

	memset(s, 0, sizeof(*s));
	state_path(job, path, sizeof(path));
	if (!(f = fopen(path, "re")))
		return;
	while (fgets(line, sizeof(line), f)) {
		const char *w;

		if (sscanf(line, "seen %255s", name) == 1 && !config_check_name(name, &w))
			snprintf(s->seen, sizeof(s->seen), "%s", name);
		else if (sscanf(line, "since %u", &s->since) == 1)
			;
		else if (sscanf(line, "pending %255s", name) == 1 && !config_check_name(name, &w) &&
			 s->npending < PENDING_MAX)
			snprintf(s->pending[s->npending++], sizeof(s->pending[0]), "%s", name);
	}
	fclose(f);
}

/* Whole or not at all: a temporary, fsync, rename. */
static int state_save(const char *job, const struct jstate *s)
{
	char path[8192], tmp[8300];
	FILE *f;
	int rc = 0;

	snprintf(path, sizeof(path), "%s/durable", dr.cfg->state_dir);
	if (mkdir(path, 0700) < 0 && errno != EEXIST)
		return -errno;
	state_path(job, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if (!(f = fopen(tmp, "we")))
		return -errno;
	fprintf(f, "seen %s\nsince %u\n", s->seen[0] ? s->seen : "-", s->since);
	for (size_t i = 0; i < s->npending; i++)
		fprintf(f, "pending %s\n", s->pending[i]);
	if (fflush(f) != 0 || fsync(fileno(f)) < 0)
		rc = -errno;
	if (fclose(f) != 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc < 0)
		unlink(tmp);
	return rc;
}

/* ---- the committed steps of a job, in natural order ---- */

static bool has(int dirfd, const char *step, const char *rel)
{
	char p[CKPT_NAME_MAX * 2 + 64];

	snprintf(p, sizeof(p), "%s/%s", step, rel);
	return faccessat(dirfd, p, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

/* In ckpt_root/JOB: committed (a manifest), and no restore under way (half a
 * restore is not drained). */
static bool is_committed(int jobfd, const char *step, const void *arg)
{
	return ckpt_has_manifest(jobfd, step, arg) && !has(jobfd, step, MF_DIRNAME "/restoring");
}

/* ---- one file ---- */

/* A temporary's name beside BASE: of fixed length whatever BASE's (a name
 * near NAME_MAX must drain too), this node's own. */
static void tmp_name(char *out, size_t n, const char *base, const char *self)
{
	snprintf(out, n, ".stage-drain.%.64s.%016llx", self,
		 (unsigned long long)XXH3_64bits(base, strlen(base)));
}

/* Creates the temporary afresh: whatever stood there (a planted hard
 * link, a leftover) is unlinked first, and O_EXCL makes sure. */
static int create_tmp(int pfd, const char *tmp)
{
	unlinkat(pfd, tmp, 0);
	return openat(pfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
}

/* The content digest of the regular file at dfd/name, or -errno (-EINVAL
 * for anything else: a fifo planted there must not hang the drainer). */
static int digest_file(int dfd, const char *name, digest_t *out)
{
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	XXH3_state_t *st;
	struct stat sb;
	uint64_t off = 0;
	ssize_t n;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		close(fd);
		return -EINVAL;
	}
	if (!(st = XXH3_createState())) {
		close(fd);
		return -ENOMEM;
	}
	XXH3_128bits_reset(st);
	while ((n = uio_pread(&dr.ring, fd, dr.buf, BUF, off)) > 0) {
		XXH3_128bits_update(st, dr.buf, (size_t)n);
		off += (uint64_t)n;
	}
	*out = XXH3_128bits_digest(st);
	XXH3_freeState(st);
	close(fd);
	return n < 0 ? (int)n : 0;
}

/* The mode and mtime of e given to the regular file at dfd/name, made
 * durable. 0 or -errno. */
static int fix_meta(int dfd, const char *name, const struct mf_entry *e)
{
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC), rc = 0;
	const char *what;

	if (fd < 0)
		return -errno;
	rc = treeops_set_meta(fd, false, 0, 0, e->mode & 01777, e->mtime_ns, &what);
	if (rc == 0 && fsync(fd) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

/* Copies src/rel to dst/rel: a temporary beside it, every byte hashed on
 * the way and compared with the manifest's digest, made durable, given its
 * mode (without set-id bits: the copy is root's, on shared storage) and
 * mtime, renamed in place but never over a file that is there already,
 * unless `ours` (this node's last drain of the step named it); one of the
 * same content from a drain cut short stays; any other is another origin's:
 * a conflict. 0 or -errno with why. */
static int drain_file(int src, int dst, const struct mf_entry *e, uint64_t chunk_size,
		      const char *self, bool ours, char *why, size_t whylen)
{
	const char *base, *sbase, *what;
	char tmp[128];
	int in = -1, out = -1, pfd, spfd = -1, rc = 0, crc;

	pfd = treeops_open_parent(dst, e->path, &base);
	if (pfd < 0) {
		rc = pfd;
		snprintf(why, whylen, "%s: %s", e->path, strerror(-rc));
		goto out;
	}
	tmp_name(tmp, sizeof(tmp), base, self);
	/* The source too is opened with no symlink on its way. */
	spfd = treeops_open_parent(src, e->path, &sbase);
	errno = spfd < 0 ? -spfd : 0;
	in = spfd < 0 ? -1 : openat(spfd, sbase, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	out = in < 0 ? -1 : create_tmp(pfd, tmp);
	if (in < 0 || out < 0) {
		rc = -errno;
		if (in < 0)
			snprintf(why, whylen, "opening %s: %s", e->path, strerror(-rc));
		else
			snprintf(why, whylen, "creating %s beside %s: %s", tmp, e->path, strerror(-rc));
		goto out;
	}
	/* The builder checks every chunk against the manifest before its last
	 * byte is written and the whole file at the end, and writes through
	 * its queue: the next piece is read while the last ones go out. */
	rc = cbuild_begin(&dr.cb, e, chunk_size, out, 0, true);
	while (rc == 0 && dr.cb.at < e->size) {
		uint64_t at = dr.cb.at;
		size_t want = e->size - at < WQ_BUF ? (size_t)(e->size - at) : WQ_BUF;
		uint8_t *p;
		int b = cbuild_buf(&dr.cb, &p);
		ssize_t n;

		if (atomic_load(&dr.stopping)) {
			rc = -ECANCELED;
			break;
		}
		n = uio_pread(&dr.ring, in, p, want, at);
		if (n != (ssize_t)want) {
			rc = n < 0 ? (int)n : -ESTALE;   /* shorter than its manifest: changed */
			snprintf(why, whylen, "reading %s: %s", e->path, n < 0 ? strerror(-rc) :
				 "it is shorter than its manifest says");
			break;
		}
		pace_take(&dr.pace, want);
		rc = cbuild_put(&dr.cb, b, want);
		if (rc == -EBADMSG) {
			rc = -ESTALE;
			snprintf(why, whylen, "chunk %llu of %s does not match its manifest: it changed "
				 "after the commit", (unsigned long long)dr.cb.bad_chunk, e->path);
		} else if (rc < 0) {
			snprintf(why, whylen, "writing %s: %s", e->path, strerror(-rc));
		} else {
			obs_add(OBS_DURABLE_BYTES, want);
		}
	}
	crc = cbuild_end(&dr.cb);
	if (rc == 0 && crc == -EBADMSG) {
		rc = -ESTALE;
		snprintf(why, whylen, "%s does not hash to its manifest's digest: it changed after "
			 "the commit", e->path);
	} else if (rc == 0 && crc < 0) {
		rc = crc;
		snprintf(why, whylen, "writing %s: %s", e->path, strerror(-rc));
	}
	if (rc < 0)
		goto out;
	/* Its mode and mtime before its fsync, which makes them durable with
	 * the bytes (fdatasync need not: a power cut kept a part's bytes and
	 * lost its mtimes). */
	rc = treeops_set_meta(out, false, 0, 0, e->mode & 01777, e->mtime_ns, &what);
	if (rc == 0 && fsync(out) < 0)
		rc = -errno;
	if (rc < 0) {
		snprintf(why, whylen, "writing %s: %s", e->path, strerror(-rc));
		goto out;
	}
	rc = ours ? (renameat(pfd, tmp, pfd, base) < 0 ? -errno : 0) :
		    treeops_rename_noreplace(pfd, tmp, pfd, base);
	if (rc < 0) {
		digest_t there;

		if (rc == -EEXIST && digest_file(pfd, base, &there) == 0 &&
		    digest_eq(there, e->digest)) {
			/* Ours, from a drain cut short: it stays, given the
			 * mode and mtime a crash may have cost it. */
			rc = fix_meta(pfd, base, e);
			if (rc < 0)
				snprintf(why, whylen, "%s: %s", e->path, strerror(-rc));
		} else if (rc == -EEXIST) {
			snprintf(why, whylen, "%s is there already, of other content: two nodes write "
				 "the same file name into one step (left as it is)", e->path);
		} else {
			snprintf(why, whylen, "renaming %s: %s", e->path, strerror(-rc));
		}
		unlinkat(pfd, tmp, 0);
	}
out:
	if (rc < 0 && out >= 0)
		unlinkat(pfd, tmp, 0);
	if (in >= 0)
		close(in);
	if (out >= 0)
		close(out);
	if (spfd >= 0)
		close(spfd);
	if (pfd >= 0)
		close(pfd);
	return rc;
}

static int drain_link(int dst, const struct mf_entry *e, const char *self, char *why,
		      size_t whylen)
{
	const char *base;
	char tmp[128], there[4096];
	int pfd = treeops_open_parent(dst, e->path, &base), rc = 0;
	ssize_t n;

	if (pfd < 0) {
		snprintf(why, whylen, "%s: %s", e->path, strerror(-pfd));
		return pfd;
	}
	tmp_name(tmp, sizeof(tmp), base, self);
	unlinkat(pfd, tmp, 0);
	rc = symlinkat(e->target, pfd, tmp) < 0 ? -errno : treeops_rename_noreplace(pfd, tmp, pfd, base);
	if (rc < 0) {
		n = readlinkat(pfd, base, there, sizeof(there) - 1);
		if (rc == -EEXIST && n >= 0 && (size_t)n == strlen(e->target) &&
		    memcmp(there, e->target, (size_t)n) == 0)
			rc = 0;
		else
			snprintf(why, whylen, "%s: %s", e->path, rc == -EEXIST ? "there already, "
				 "of another target: two nodes write the same name" : strerror(-rc));
		unlinkat(pfd, tmp, 0);
	}
	close(pfd);
	return rc;
}

/* ---- one step ---- */

/* The manifest the drain read (mfd, from its start) as
 * dst/.stage/manifest.NODE: temporary, fsync, rename, fsync of .stage. */
static int copy_manifest(int mfd, int dst, const char *self, char *why, size_t whylen)
{
	char name[CKPT_NAME_MAX + 32], tmp[CKPT_NAME_MAX + 48];
	int out, sd, rc = 0;
	uint64_t off = 0;
	ssize_t n = 0;

	sd = treeops_mkdirs_beneath(dst, MF_DIRNAME, 0755);
	if (sd < 0) {
		snprintf(why, whylen, "%s: %s", MF_DIRNAME, strerror(-sd));
		return sd;
	}
	durable_mf_name(self, name);
	snprintf(tmp, sizeof(tmp), ".manifest.%s.tmp", self);
	out = create_tmp(sd, tmp);
	if (out < 0)
		rc = -errno;
	while (rc == 0 && (n = uio_pread(&dr.ring, mfd, dr.buf, BUF, off)) > 0) {
		rc = uio_pwrite(&dr.ring, out, dr.buf, (size_t)n, off);
		off += (uint64_t)n;
	}
	if (rc == 0 && n < 0)
		rc = (int)n;
	/* The durable root's own file system decides what durable means: the
	 * files' bytes and attributes (fsync each), their names (syncfs), then
	 * this. */
	if (rc == 0 && (syncfs(out) < 0 || fsync(out) < 0 || renameat(sd, tmp, sd, name) < 0 ||
			fsync(sd) < 0))
		rc = -errno;
	if (rc < 0) {
		snprintf(why, whylen, "writing %s/%s: %s", MF_DIRNAME, name, strerror(-rc));
		unlinkat(sd, tmp, 0);
	}
	if (out >= 0)
		close(out);
	close(sd);
	return rc;
}

/* The paths of the files and links a manifest lists (component order, as
 * it lists them), for bsearch with mf_path_cmp. 0 (none if there is no
 * such manifest) or -errno. */
struct paths {
	char **v;
	size_t n;
};

static int path_cmp(const void *a, const void *b)
{
	return mf_path_cmp(*(char *const *)a, *(char *const *)b);
}

static int paths_add(int dirfd, const char *name, struct paths *p)
{
	struct mf_reader *r = NULL;
	struct mf_entry e = { 0 };
	int rc;

	if (mf_reader_open(&r, dirfd, name, MF_COMPLETE) < 0)
		return 0;
	while ((rc = mf_reader_next(r, &e)) == 1) {
		char **v;

		if (e.type != MF_DIR && (v = realloc(p->v, (p->n + 1) * sizeof(*v))) != NULL) {
			p->v = v;
			p->v[p->n++] = e.path;
			e.path = NULL;
		}
		mf_entry_free(&e);
	}
	mf_reader_close(r);
	if (p->n)
		qsort(p->v, p->n, sizeof(*p->v), path_cmp);
	return rc < 0 ? rc : 0;
}

static bool paths_has(const struct paths *p, const char *path)
{
	return p->n && bsearch(&path, p->v, p->n, sizeof(*p->v), path_cmp) != NULL;
}

static void paths_free(struct paths *p)
{
	for (size_t i = 0; i < p->n; i++)
		free(p->v[i]);
	free(p->v);
	p->v = NULL;
	p->n = 0;
}

/* Every other origin's manifest in the step's .stage: what they claim. */
static void others_paths(int sd, const char *self, struct paths *p)
{
	int fd = openat(sd, MF_DIRNAME, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	char mine[DURABLE_MF_MAX];
	struct dirent *de;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	durable_mf_name(self, mine);
	while ((de = readdir(d)))
		if (strncmp(de->d_name, DURABLE_MF_PREFIX, strlen(DURABLE_MF_PREFIX)) == 0 &&
		    strcmp(de->d_name, mine) != 0)
			paths_add(dirfd(d), de->d_name, p);
	closedir(d);
}

/* Unlinks REL beneath dir with no symlink on its way. */
static void unlink_beneath(int dir, const char *rel, int flags)
{
	const char *base;
	int pfd = treeops_open_parent(dir, rel, &base);

	if (pfd >= 0) {
		unlinkat(pfd, base, flags);
		close(pfd);
	}
}

/* Whether dst already holds this origin's manifest with src's root. */
static bool drained(int src, int dst, const char *self)
{
	digest_t a, b;

	/* The durable side read as any reader does: no link followed, no fifo
	 * waited on; its root only (no stat of every file each scan). */
	return ckpt_manifest_root(src, MF_NAME, &a, NULL, NULL, 0) == 0 &&
	       durable_mf_root(dst, self, &b) == 0 && digest_eq(a, b);
}

static int drain_step(const char *job, const char *step, char *why, size_t whylen)
{
	const char *self = dr.cfg->name;
	char rel[2 * CKPT_NAME_MAX + 2], old[CKPT_NAME_MAX + 32];
	struct mf_reader *r = NULL;
	struct mf_entry e = { 0 };
	struct paths prev = { 0 };
	int src, dst, mfd = -1, rc;
	struct stat st;
	FILE *fp = NULL;

	snprintf(rel, sizeof(rel), "%s/%s", job, step);
	src = treeops_open_beneath_path(dr.cfg->ckpt_root, rel);
	if (src < 0) {
		snprintf(why, whylen, "%s/%s: %s", dr.cfg->ckpt_root, rel, strerror(-src));
		return src;
	}
	dst = open(dr.cfg->durable_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dst >= 0) {
		int root = dst;

		/* The job's directory is its owner's, made for them if the
		 * durable root is the admin's alone. */
		dst = cred_mkdirat_given(root, job, 0755);
		if (dst == 0 && !cred_is_root() && fstatat(root, job, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		    st.st_uid != cred_uid() && st.st_uid != 0) {
			/* Job names are not per user there: another user's job
			 * of that name holds it. */
			char owner[128];

			snprintf(why, whylen, "%s/%s belongs to %s, not to this job's owner",
				 dr.cfg->durable_root, job, cred_name(st.st_uid, owner, sizeof(owner)));
			close(root);
			close(src);
			return -EEXIST;
		}
		if (dst == 0)
			dst = treeops_mkdirs_beneath(root, rel, 0755);
		close(root);
	} else {
		dst = -errno;
	}
	if (dst < 0) {
		snprintf(why, whylen, "%s/%s: %s", dr.cfg->durable_root, rel, strerror(-dst));
		close(src);
		return dst;
	}
	if (drained(src, dst, self)) {
		rc = 0;
		goto out;
	}
	/* This node's last drain of the step (another commit of it): its files
	 * are this node's to replace, and its manifest goes first, so that it
	 * never stands over files of two commits. */
	snprintf(old, sizeof(old), "%s/manifest.%s", MF_DIRNAME, self);
	paths_add(dst, old, &prev);
	if (prev.n)
		unlinkat(dst, old, 0);
	/* One open of the manifest: what is read is what is published. */
	mfd = openat(src, MF_NAME, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (mfd >= 0 && (fstat(mfd, &st) < 0 || !S_ISREG(st.st_mode))) {
		close(mfd);
		mfd = -1;
		errno = EINVAL;         /* a fifo or a device in the manifest's place */
	}
	fp = mfd < 0 ? NULL : fdopen(dup(mfd), "re");
	rc = !fp ? -errno : mf_reader_open_fp(&r, fp, MF_NAME, MF_COMPLETE);
	while (rc == 0 && (rc = mf_reader_next(r, &e)) == 1) {
		rc = 0;
		if (e.type == MF_DIR && *e.path) {
			int d = treeops_mkdirs_beneath(dst, e.path, e.mode & 07777);

			if (d < 0) {
				rc = d;
				snprintf(why, whylen, "%s: %s", e.path, strerror(-rc));
			} else {
				close(d);
			}
		} else if (e.type == MF_FILE) {
			rc = drain_file(src, dst, &e, mf_reader_chunk_size(r), self,
					paths_has(&prev, e.path), why, whylen);
		} else if (e.type == MF_LINK) {
			rc = drain_link(dst, &e, self, why, whylen);
		}
		mf_entry_free(&e);
		if (rc == 0 && atomic_load(&dr.stopping))
			rc = -ECANCELED;
	}
	if (rc < 0 && !*why)
		snprintf(why, whylen, "its manifest: %s", r ? mf_reader_why(r) : strerror(-rc));
	if (rc == 0)
		rc = copy_manifest(mfd, dst, self, why, whylen);
	if (rc == 0)
		obs_add(OBS_DURABLE_STEPS, 1);
out:
	if (r)
		mf_reader_close(r);
	if (fp)
		fclose(fp);
	if (mfd >= 0)
		close(mfd);
	paths_free(&prev);
	close(dst);
	close(src);
	return rc;
}

/* ---- retiring ---- */

/* This origin's part of durable_root/JOB/STEP: its manifest first (a crash
 * must not leave it claiming files that are gone), then its files and
 * links, except those another origin's manifest claims too (a file of the
 * same content both wrote, kept once), then the directories left empty
 * (deepest first); nothing is followed through a link on the way. */
static void retire_step(int jobdir, const char *job, const char *step)
{
	char name[CKPT_NAME_MAX + 32], **dirs = NULL;
	struct paths mine = { 0 }, others = { 0 };
	struct mf_reader *r = NULL;
	struct mf_entry e = { 0 };
	size_t ndirs = 0;
	int sd = treeops_open_beneath(jobdir, step);

	if (sd < 0)
		return;
	snprintf(name, sizeof(name), "%s/manifest.%s", MF_DIRNAME, dr.cfg->name);
	if (mf_reader_open(&r, sd, name, MF_COMPLETE) == 0) {
		while (mf_reader_next(r, &e) == 1) {
			char **v = e.type == MF_DIR && !*e.path ? NULL :
				   realloc(e.type == MF_DIR ? dirs : mine.v, ((e.type == MF_DIR ?
				   ndirs : mine.n) + 1) * sizeof(*v));

			if (v && e.type == MF_DIR) {
				dirs = v;
				dirs[ndirs++] = e.path;
				e.path = NULL;
			} else if (v) {
				mine.v = v;
				mine.v[mine.n++] = e.path;
				e.path = NULL;
			}
			mf_entry_free(&e);
		}
		mf_reader_close(r);
	}
	others_paths(sd, dr.cfg->name, &others);
	unlinkat(sd, name, 0);
	for (size_t i = 0; i < mine.n; i++)
		if (!paths_has(&others, mine.v[i]))
			unlink_beneath(sd, mine.v[i], 0);
	while (ndirs--) {
		unlink_beneath(sd, dirs[ndirs], AT_REMOVEDIR);
		free(dirs[ndirs]);
	}
	free(dirs);
	paths_free(&mine);
	paths_free(&others);
	unlinkat(sd, MF_DIRNAME, AT_REMOVEDIR);
	close(sd);
	if (unlinkat(jobdir, step, AT_REMOVEDIR) == 0)
		log_info("durable: %s/%s retired", job, step);
}

/* In durable_root/JOB: this origin's part drained (its manifest there). */
static bool is_mine(int jobfd, const char *step, const void *arg)
{
	(void)arg;
	return durable_has_part(jobfd, step, dr.cfg->name);
}

/* All but the newest `keep` of this origin's drained steps of JOB. */
static void retire(const char *job)
{
	ckpt_name_t *steps = NULL;
	int jd = treeops_open_beneath_path(dr.cfg->durable_root, job);
	size_t n = 0;

	if (jd < 0)
		return;
	if (ckpt_steps(jd, is_mine, NULL, &steps, &n) == 0)
		for (size_t i = 0; i + (size_t)dr.cfg->durable_keep < n; i++)
			retire_step(jd, job, steps[i]);
	free(steps);
	close(jd);
}

/* ---- the thread ---- */

/* New committed steps of JOB chosen (every `every`th), the chosen drained
 * oldest first. A failure leaves the step chosen, tried again after
 * RETRY_MS, and replication never waits for any of it. */
/* The newest step committed again (its manifest's mtime moved since the
 * last look) after this node drained it: chosen again, so that the durable
 * copy follows the commit. The last look's mtime is kept in *mf_mtime. */
static bool recommitted(int jobfd, const char *job, const char *step, int64_t *mf_mtime)
{
	char p[CKPT_NAME_MAX * 2 + 64], rel[CKPT_NAME_MAX * 2 + 2];
	struct stat sb;
	int src, dst;
	bool again;

	snprintf(p, sizeof(p), "%s/%s", step, MF_NAME);
	if (fstatat(jobfd, p, &sb, AT_SYMLINK_NOFOLLOW) < 0 || mf_mtime_ns(&sb) == *mf_mtime)
		return false;
	*mf_mtime = mf_mtime_ns(&sb);
	snprintf(rel, sizeof(rel), "%s/%s", job, step);
	src = treeops_open_beneath(jobfd, step);
	dst = treeops_open_beneath_path(dr.cfg->durable_root, rel);
	snprintf(p, sizeof(p), "%s/manifest.%s", MF_DIRNAME, dr.cfg->name);
	again = src >= 0 && dst >= 0 && faccessat(dst, p, F_OK, AT_SYMLINK_NOFOLLOW) == 0 &&
		!drained(src, dst, dr.cfg->name);
	if (src >= 0)
		close(src);
	if (dst >= 0)
		close(dst);
	return again;
}

static void drain_job(const char *job, int jobfd, uint64_t *retry_at, int64_t *mf_mtime)
{
	ckpt_name_t *steps = NULL;
	struct cred *owner = NULL;
	char why[2048];
	struct jstate s, before;
	struct stat st;
	size_t n = 0;
	int rc;

	if (mono_ns() < *retry_at || ckpt_steps(jobfd, is_committed, NULL, &steps, &n) < 0 || !n) {
		free(steps);
		return;
	}
	if (cred_of_owner(jobfd, &owner) < 0) {
		free(steps);
		return;         /* out of memory: the next scan */
	}
	if (owner) {
		/* A job directory the drain made as root before it acted as the
		 * owner (an older staged, or the admin's) stays the daemon's to
		 * write: the owner could not write in it. */
		int djfd = treeops_open_beneath_path(dr.cfg->durable_root, job);

		if (djfd >= 0 && fstat(djfd, &st) == 0 && st.st_uid == 0) {
			free(owner);
			owner = NULL;
		}
		if (djfd >= 0)
			close(djfd);
	}
	state_load(job, &s);
	before = s;
	if (!s.seen[0] || strcmp(s.seen, "-") == 0) {
		/* A job first seen: its newest step, not its whole history. */
		snprintf(s.pending[0], sizeof(s.pending[0]), "%s", steps[n - 1]);
		s.npending = 1;
		s.since = 0;
		snprintf(s.seen, sizeof(s.seen), "%s", steps[n - 1]);
	} else {
		for (size_t i = 0; i < n; i++) {
			if (ckpt_step_cmp(steps[i], s.seen) <= 0)
				continue;
			snprintf(s.seen, sizeof(s.seen), "%s", steps[i]);
			if (++s.since < (unsigned)dr.cfg->durable_every)
				continue;
			s.since = 0;
			if (s.npending == PENDING_MAX) {        /* far behind: the oldest goes */
				memmove(s.pending[0], s.pending[1], sizeof(s.pending[0]) *
					(PENDING_MAX - 1));
				s.npending--;
			}
			snprintf(s.pending[s.npending++], sizeof(s.pending[0]), "%s", steps[i]);
		}
		if (recommitted(jobfd, job, steps[n - 1], mf_mtime) && s.npending < PENDING_MAX) {
			bool listed = false;

			for (size_t i = 0; i < s.npending; i++)
				listed |= strcmp(s.pending[i], steps[n - 1]) == 0;
			if (!listed)
				snprintf(s.pending[s.npending++], sizeof(s.pending[0]), "%s",
					 steps[n - 1]);
		}
	}
	/* Written when it changed only: an idle scan writes nothing. */
	if (memcmp(&before, &s, sizeof(s)) != 0 && (rc = state_save(job, &s)) < 0)
		log_warn("durable: %s/durable/%s: %s", dr.cfg->state_dir, job, strerror(-rc));
	while (s.npending) {
		bool present = false;

		for (size_t i = 0; i < n && !present; i++)
			present = strcmp(steps[i], s.pending[0]) == 0;
		uint64_t t0 = mono_ns();
		struct timespec c0, c1;

		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
		why[0] = '\0';
		/* As the job's owner, as everything the daemon does on its own:
		 * a durable root on NFS judges the owner, not the daemon. */
		rc = 0;
		if (present && owner && (rc = cred_enter(owner)) < 0)
			snprintf(why, sizeof(why), "cannot act as uid %u, the owner of job %s: %s",
				 (unsigned)owner->uid, job, strerror(-rc));
		else if (present)
			rc = drain_step(job, s.pending[0], why, sizeof(why));
		cred_leave();
		if (rc == -ECANCELED)
			break;
		if (rc < 0 && (rc == -ESTALE || rc == -EEXIST || rc == -ENAMETOOLONG)) {
			/* Trying again would fail the same way: the step changed
			 * after its commit, or another node holds its names. It
			 * is dropped, so that the steps after it drain. */
			obs_add(OBS_DURABLE_FAILURES, 1);
			log_err("durable: %s/%s not drained to %s: %s; not tried again", job,
				s.pending[0], dr.cfg->durable_root, why);
		} else if (rc < 0) {
			obs_add(OBS_DURABLE_FAILURES, 1);
			log_err("durable: %s/%s not drained to %s: %s; trying again in %d s", job,
				s.pending[0], dr.cfg->durable_root, why, RETRY_MS / 1000);
			*retry_at = mono_ns() + RETRY_MS * 1000000ull;
			break;
		}
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
		if (present && rc == 0)
			log_info("durable: %s/%s drained to %s/%s/%s in %.3f s (CPU %.3f s)", job,
				 s.pending[0], dr.cfg->durable_root, job, s.pending[0],
				 (mono_ns() - t0) / 1e9, (double)(c1.tv_sec - c0.tv_sec) +
				 (c1.tv_nsec - c0.tv_nsec) / 1e9);
		memmove(s.pending[0], s.pending[1], sizeof(s.pending[0]) * (PENDING_MAX - 1));
		s.npending--;
		state_save(job, &s);
		if (!owner || cred_enter(owner) == 0)
			retire(job);
		cred_leave();
	}
	free(owner);
	free(steps);
}

struct retry {                  /* per job, in memory */
	char job[CKPT_NAME_MAX + 1];
	uint64_t at;                    /* when to try again after a failure (mono ns) */
	int64_t mf_mtime;               /* its newest step's manifest, at the last look */
};

static void scan(struct retry **rv, size_t *nr)
{
	DIR *d = opendir(dr.cfg->ckpt_root);
	struct dirent *e;
	const char *w;

	while (d && !atomic_load(&dr.stopping) && (e = readdir(d))) {
		struct retry *rj = NULL;
		int jfd;

		if (strlen(e->d_name) > CKPT_NAME_MAX || config_check_name(e->d_name, &w) < 0)
			continue;
		for (size_t i = 0; i < *nr && !rj; i++)
			if (strcmp((*rv)[i].job, e->d_name) == 0)
				rj = &(*rv)[i];
		if (!rj) {
			struct retry *v = realloc(*rv, (*nr + 1) * sizeof(*v));

			if (!v)
				continue;
			*rv = v;
			rj = &v[(*nr)++];
			memset(rj, 0, sizeof(*rj));
			snprintf(rj->job, sizeof(rj->job), "%s", e->d_name);
		}
		jfd = treeops_open_beneath(dirfd(d), e->d_name);
		if (jfd < 0)
			continue;
		drain_job(e->d_name, jfd, &rj->at, &rj->mf_mtime);
		close(jfd);
	}
	if (d)
		closedir(d);
}

static void *drain_main(void *arg)
{
	struct retry *rv = NULL;
	size_t nr = 0;

	pthread_setname_np(pthread_self(), "drain");

	prio_background(dr.cfg->priority, "the drainer");
	pthread_mutex_lock(&dr.lock);
	while (!atomic_load(&dr.stopping)) {
		uint64_t next = mono_ns() + SCAN_MS * 1000000ull;
		struct timespec ts = mono_timespec(next);

		pthread_mutex_unlock(&dr.lock);
		scan(&rv, &nr);
		pthread_mutex_lock(&dr.lock);
		while (!atomic_load(&dr.stopping) &&
		       pthread_cond_timedwait(&dr.cond, &dr.lock, &ts) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&dr.lock);
	free(rv);
	return NULL;
}

int durable_start(const struct stage_config *cfg, char *why, size_t whylen)
{
	int rc;

	dr.cfg = cfg;
	if (!cfg->durable_root[0])
		return 0;
	dr.buf = aligned_alloc(4096, BUF);
	if (!dr.buf) {
		snprintf(why, whylen, "the durable drain: out of memory");
		return -ENOMEM;
	}
	rc = uio_init(&dr.ring);
	if (rc < 0) {
		snprintf(why, whylen, "the durable drain: io_uring: %s", strerror(-rc));
		goto out_free_buf;
	}
	rc = cbuild_open(&dr.cb);
	if (rc < 0) {
		snprintf(why, whylen, "the durable drain: %s", strerror(-rc));
		goto out_exit_ring;
	}
	pace_init(&dr.pace, cfg->durable_rate);
	mono_cond_init(&dr.cond);
	atomic_store(&dr.stopping, false);
	rc = -pthread_create(&dr.thread, NULL, drain_main, NULL);
	if (rc < 0) {
		snprintf(why, whylen, "cannot start the durable drain: %s", strerror(-rc));
		goto out_destroy_cond;
	}
	dr.running = true;
	log_info("durable: draining committed steps to %s (keep %d, every %d)", cfg->durable_root,
		 cfg->durable_keep, cfg->durable_every);
	return 0;

out_destroy_cond:
	pthread_cond_destroy(&dr.cond);
	cbuild_close(&dr.cb);
out_exit_ring:
	io_uring_queue_exit(&dr.ring);
out_free_buf:
	free(dr.buf);
	dr.buf = NULL;
	return rc;
}

void durable_stop(void)
{
	if (!dr.running)
		return;
	pthread_mutex_lock(&dr.lock);
	atomic_store(&dr.stopping, true);
	pthread_cond_signal(&dr.cond);
	pthread_mutex_unlock(&dr.lock);
	pthread_join(dr.thread, NULL);
	pthread_cond_destroy(&dr.cond);
	cbuild_close(&dr.cb);
	io_uring_queue_exit(&dr.ring);
	free(dr.buf);
	dr.buf = NULL;
	dr.running = false;
}
