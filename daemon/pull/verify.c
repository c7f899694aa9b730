/* Verify: one merge pass of the tree's walk with its manifest (both in
 * component order). Every manifest entry absent from the tree is "missing",
 * every name of the tree absent from the manifest "unexpected", a different
 * type, size, mtime or link target "changed", and in deep mode a file whose
 * bytes no longer hash to the manifest's digest "damaged" (naming the bad
 * chunks). Deep reads run many files at once on the copier; findings from
 * them arrive in completion order.
 */
#include "daemon/pull/verify.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/manifest.h"
#include "daemon/engine/copier.h"
#include "daemon/fs/cursor.h"
#include "daemon/fs/roots.h"
#include "daemon/fs/walk.h"
#include "daemon/pull/damage.h"
#include "daemon/obs/obs.h"

struct vitem {             /* a file being re-hashed */
	struct cp_file cf;
	struct mf_entry want;  /* owned copy of the manifest entry */
	uint64_t ino;          /* as the walk saw it, for the record */
	int64_t ctime_ns;
};

struct verify {
	struct job *job;
	const char *path;
	int dirfd;               /* the tree, borrowed */
	struct copier *cp;
	uint64_t files, bytes, findings;
	verify_bad_fn bad;
	void *bad_arg;
	bool count;              /* findings go in the metrics */
	struct damage rec;       /* being written, when rec.out */
	struct damage old;       /* the last record, when trusting it (old.since) */
	bool trusting;
	uint64_t trusted;        /* files taken from old, not read */
	char taint[MF_MAX_PATH + 1];   /* trusting: a directory changed since old began */
	int err;                 /* the copier failed: nothing more is read */
};

/* rel is NULL for a finding about no single entry (a directory that could
 * not be listed): then detail says everything. */
static void finding_chunks(struct verify *v, const char *kind, const char *rel,
			   const char *detail, const uint64_t *bad, uint64_t nbad)
{
	v->findings++;
	if (v->count)
		obs_finding(rel ? kind : "unreadable");
	if (!rel)
		job_note(v->job, LOG_ERROR, NULL, NULL, "%s: %s", v->path, detail);
	else
		job_note(v->job, LOG_ERROR, kind, rel, "%s %s/%s%s%s", kind, v->path, rel,
			 detail ? ": " : "", detail ? detail : "");
	if (rel && v->bad) {
		struct verify_finding f = { kind, rel, detail, bad, nbad };

		v->bad(&f, v->bad_arg);
	}
}

static void finding(struct verify *v, const char *kind, const char *rel, const char *detail)
{
	finding_chunks(v, kind, rel, detail, NULL, 0);
}

static void on_hashed(struct cp_file *cf, void *arg)
{
	struct vitem *it = cf->owner;
	struct verify *v = arg;

	if (cf->err) {
		char d[256];

		snprintf(d, sizeof(d), "%s: %s", cf->err_op, strerror(-cf->err));
		finding(v, cf->err == -ESTALE ? "changed" : "unreadable", it->want.path, d);
		if (cf->err != -ESTALE)
			damage_add(&v->rec, it->want.path, it->ino, it->ctime_ns, true, NULL, 0);
	} else if (!digest_eq(cf->digest, it->want.digest)) {
		uint64_t n = cf->nchunks < it->want.nchunks ? cf->nchunks : it->want.nchunks;
		uint64_t *bad = n ? malloc(n * sizeof(*bad)) : NULL, nbad = 0;
		char d[512];
		int o = 0;

		for (uint64_t i = 0; i < n; i++)
			if (!digest_eq(cf->chunks[i], it->want.chunks[i])) {
				if (nbad < 8 && o < (int)sizeof(d) - 32)
					o += snprintf(d + o, sizeof(d) - (size_t)o, "%s%llu",
						      nbad ? ", " : "chunk ", (unsigned long long)i);
				if (bad)
					bad[nbad] = i;
				nbad++;
			}
		if (nbad)
			snprintf(d + o, sizeof(d) - (size_t)o, "%s of %llu differ",
				 nbad > 8 ? ", ..." : "", (unsigned long long)cf->nchunks);
		else
			snprintf(d, sizeof(d), "content digest differs");
		/* Without memory for the list, the file as a whole is named. */
		finding_chunks(v, "damaged", it->want.path, d, bad, bad ? nbad : 0);
		damage_add(&v->rec, it->want.path, it->ino, it->ctime_ns, false, bad,
			   bad ? nbad : 0);
		free(bad);
	}
	atomic_fetch_add(&v->job->files_done, 1);
	atomic_fetch_add(&v->job->bytes_done, it->want.size);
	copier_release(cf);
	mf_entry_free(&it->want);
	free(it);
}

static void drain(struct verify *v, bool all)
{
	while (!v->err && copier_inflight(v->cp) && (all || !copier_has_room(v->cp))) {
		int rc = copier_run(v->cp, 100, on_hashed, v);

		/* The files still in flight will never report: the verify
		 * cannot say they are intact, and fails. */
		if (rc < 0) {
			v->err = rc;
			damage_abort(&v->rec);
			break;
		}
		job_progress(v->job, false);
	}
}

static void rehash(struct verify *v, const struct mf_entry *m, const struct walk_ent *w)
{
	struct vitem *it = calloc(1, sizeof(*it));
	int64_t mtime_ns = w->mtime_ns;

	if (!it || mf_entry_copy(&it->want, m) < 0) {
		free(it);
		finding(v, "unreadable", m->path, "out of memory");
		damage_abort(&v->rec);          /* it was not read: the record would lie */
		return;
	}
	it->ino = w->st.st_ino;
	it->ctime_ns = w->ctime_ns;
	drain(v, false);
	it->cf = (struct cp_file){
		.src_at = v->dirfd, .src = it->want.path, .size = it->want.size,
		.mtime_ns = mtime_ns, .owner = it,
	};
	if (copier_start(v->cp, &it->cf) < 0) {
		finding(v, "unreadable", m->path, "cannot start reading");
		damage_abort(&v->rec);
		mf_entry_free(&it->want);
		free(it);
	}
}

static bool beneath_taint(const struct verify *v, const char *rel)
{
	size_t n = strlen(v->taint);

	return n && strncmp(rel, v->taint, n) == 0 && rel[n] == '/';
}

/* Trusting: a directory whose ctime moved since the record began had an
 * entry renamed into it (or out), and what was renamed in keeps its own
 * old ctime: nothing beneath it is taken at the record's word. Walked in
 * manifest order, the outermost such directory is enough to remember. */
static void note_dir(struct verify *v, const char *rel, const struct walk_ent *w)
{
	if (beneath_taint(v, rel))
		return;
	v->taint[0] = '\0';
	if (w->ctime_ns >= v->old.since && strlen(rel) < sizeof(v->taint))
		strcpy(v->taint, rel);
}

/* Deep, trusting the last record: whether m needs no reading, because the
 * record vouches for it (its finding, made again here) or because nothing
 * changed it since the record began (damage.h). */
static bool from_record(struct verify *v, const struct mf_entry *m, const struct walk_ent *w)
{
	const struct damage_ent *d = damage_find(&v->old, m->path);

	if (beneath_taint(v, m->path))
		return false;
	if (d) {
		if (d->ino != (uint64_t)w->st.st_ino || d->ctime_ns != w->ctime_ns)
			return false;
		finding_chunks(v, d->unreadable ? "unreadable" : "damaged", m->path,
			       "found by the last verify --deep, unchanged since", d->bad, d->nbad);
		damage_add(&v->rec, m->path, d->ino, d->ctime_ns, d->unreadable, d->bad, d->nbad);
	} else if (w->ctime_ns >= v->old.since) {
		return false;
	}
	v->trusted++;
	atomic_fetch_add(&v->job->files_done, 1);
	atomic_fetch_add(&v->job->bytes_done, m->size);
	return true;
}

/* One name present on both sides. */
static void compare(struct verify *v, const struct mf_entry *m, const struct walk_ent *w,
		    bool deep)
{
	char detail[256];

	if (w->type != m->type) {
		snprintf(detail, sizeof(detail), "type '%c', manifest says '%c'", w->type, m->type);
		{
			finding(v, "changed", m->path, detail);
			return;
		}
	}
	if (m->type == MF_DIR) {
		if (deep && v->trusting)
			note_dir(v, m->path, w);
		return;
	}
	if (m->type == MF_LINK) {
		char t[MF_MAX_PATH + 1];
		ssize_t n = readlinkat(w->src_dirfd, w->name, t, sizeof(t) - 1);

		if (n < 0 || (uint64_t)n != m->size || memcmp(t, m->target, (size_t)n) != 0)
			finding(v, "changed", m->path, "link target differs");
		return;
	}
	v->files++;
	v->bytes += m->size;
	if ((uint64_t)w->st.st_size != m->size) {
		snprintf(detail, sizeof(detail), "size %lld, manifest says %llu",
			 (long long)w->st.st_size, (unsigned long long)m->size);
		{
			finding(v, "changed", m->path, detail);
			return;
		}
	}
	if (w->mtime_ns != m->mtime_ns) {
		finding(v, "changed", m->path, "mtime differs from the manifest");
		return;
	}
	if (deep) {
		if (!v->trusting || !from_record(v, m, w))
			rehash(v, m, w);
		return;
	}
	atomic_fetch_add(&v->job->files_done, 1);
	atomic_fetch_add(&v->job->bytes_done, m->size);
}

static bool beneath(const char *root, const char *path)
{
	size_t n = strlen(root);

	while (n > 0 && root[n - 1] == '/')
		n--;            /* "/" is n = 0: every absolute path is beneath it */
	return strncmp(root, path, n) == 0 && path[n] == '/';
}

int verify_tree(struct job *j, const char *path, int dirfd, const struct verify_opts *o)
{
	struct verify v = { .job = j, .path = path, .dirfd = dirfd, .bad = o->bad,
			    .bad_arg = o->arg, .count = o->count };
	const char *mf = o->manifest ? o->manifest : "manifest";
	bool deep = o->deep;
	struct cursor mc;
	struct walk *w;
	struct walk_ent e;
	bool have_w;
	char why[1024];
	int stage_fd, ret;

	stage_fd = openat(dirfd, MF_DIRNAME, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (stage_fd < 0 || faccessat(stage_fd, mf, F_OK, AT_SYMLINK_NOFOLLOW) < 0) {
		if (stage_fd >= 0)
			close(stage_fd);
		if (beneath(j->cfg->ckpt_root, path))
			job_note(j, LOG_ERROR, NULL, NULL, "%s has no manifest (%s/%s): it is not "
				 "committed yet; `stage commit %s` writes it", path, path, MF_NAME,
				 path);
		else
			job_note(j, LOG_ERROR, NULL, NULL, "%s has no manifest (%s/%s): not a staged "
				 "tree, or its pull did not finish", path, path, MF_NAME);
		return -ENOENT;
	}
	ret = cursor_open(&mc, stage_fd, mf, MF_COMPLETE, why, sizeof(why));
	if (ret < 0) {
		close(stage_fd);
		job_note(j, LOG_ERROR, NULL, NULL, "%s/%s: %s", path, MF_DIRNAME, why);
		return ret;
	}
	/* The last record is read before the next one starts (its since is
	 * what the files are compared with). Without either, a plain verify. */
	if (deep && o->trust)
		v.trusting = damage_load(&v.old, stage_fd, mf) == 0;
	if (deep && o->record)
		damage_start(&v.rec, stage_fd, mf);
	/* The kernel's clock went back since the last record (set by hand, or
	 * stepped): a change since then may carry a ctime below its since.
	 * Without a record of its own begun, that cannot be told: no trust. */
	if (v.trusting && (!v.rec.out || v.rec.since < v.old.since))
		v.trusting = false;
	if (deep) {
		struct copier_opts co = {
			.memory = j->cfg->memory, .io_size = j->cfg->io_size,
			.chunk_size = cursor_chunk_size(&mc), .direct_min = 2 * j->cfg->io_size,
			.max_files = j->cfg->files_in_flight, .depth = 8, .direct_verify = o->direct,
		};

		ret = copier_create(&v.cp, -1, &co);
		if (ret < 0) {
			job_note(j, LOG_ERROR, NULL, NULL, "io_uring: %s", strerror(-ret));
			goto out_copier;        /* v.cp is NULL */
		}
	}
	ret = walk_open(&w, dirfd, -1, 0);
	if (ret < 0) {
		job_note(j, LOG_ERROR, NULL, NULL, "cannot list %s: %s", path, strerror(-ret));
		goto out_copier;
	}
	atomic_store(&j->phase, deep ? "verify --deep" : "verify");
	have_w = false;
	for (;;) {
		const struct mf_entry *m;
		int cmp;

		if (job_cancelled(j)) {
			ret = -ECANCELED;
			break;
		}
		if (!have_w) {
			ret = walk_next(w, &e);
			if (ret < 0) {
				finding(&v, "unreadable", walk_err_path(w), walk_why(w));
				damage_abort(&v.rec);   /* what is below it was not read */
				continue;
			}
			have_w = ret == 1;
		}
		m = cursor_peek(&mc);
		if (!m && !have_w)
			break;
		cmp = !m ? 1 : !have_w ? -1 : mf_path_cmp(m->path, e.rel);
		if (cmp < 0) {
			finding(&v, "missing", m->path, NULL);
			cursor_advance(&mc);
		} else if (cmp > 0) {
			finding(&v, "unexpected", e.rel, NULL);
			if (e.type == 'd')
				walk_skip(w);
			have_w = false;
		} else {
			compare(&v, m, &e, deep);
			if (e.type == 'd' && m->type != MF_DIR)
				walk_skip(w);
			cursor_advance(&mc);
			have_w = false;
		}
		job_progress(j, false);
	}
	walk_close(w);
	if (v.cp)
		drain(&v, true);
	if (mc.err) {
		job_note(j, LOG_ERROR, NULL, NULL, "%s/%s is damaged: %s; %s", path, MF_NAME,
			 mc.r ? mf_reader_why(mc.r) : strerror(-mc.err),
			 beneath(j->cfg->ckpt_root, path) ? "`stage restore` brings a good one back" :
			 "pull the tree again");
		ret = mc.err;
	} else if (ret == 0 && v.err) {
		job_note(j, LOG_ERROR, NULL, NULL, "%s: reading stopped: io_uring: %s", path,
			 strerror(-v.err));
		ret = v.err;
	} else if (ret == 0) {
		ret = v.findings ? 1 : 0;
		if (o->root && mc.r)
			*o->root = mf_reader_root(mc.r);
	}
	atomic_store(&j->files_total, v.files);
	atomic_store(&j->bytes_total, v.bytes);
	if (ret >= 0)
		damage_commit(&v.rec);
	if (o->trusted)
		*o->trusted = v.trusted;
out_copier:
	damage_abort(&v.rec);           /* not committed: the last record stays */
	damage_free(&v.old);
	copier_destroy(v.cp);
	cursor_close(&mc);
	close(stage_fd);
	return ret;
}


void verify_run(struct job *j, const char *path_arg)
{
	bool deep = j->flags & REQ_DEEP;
	char why[2048], *path = NULL;
	int fd, ret;

	ret = roots_local(j->cfg, path_arg, &path, &fd, why, sizeof(why));
	if (ret < 0) {
		job_result(j, ret == -ENOENT ? 1 : roots_exit_code(ret), NULL, NULL, "%s", why);
		return;
	}
	job_set_what(j, "%s", path);
	/* A checkpoint keeps the record of what its deep verify found, for a
	 * restore after it (damage.h); a dataset has no restore to use it. */
	ret = verify_tree(j, path, fd, &(struct verify_opts){
				  .deep = deep, .record = beneath(j->cfg->ckpt_root, path),
				  .count = true });
	if (ret == 0)
		job_result(j, 0, path, NULL, "verified %s%s: %llu files, %llu bytes", path,
			   deep ? " (every byte)" : "",
			   (unsigned long long)atomic_load(&j->files_total),
			   (unsigned long long)atomic_load(&j->bytes_total));
	else if (ret == 1)
		job_result(j, 1, path, NULL, "%s does not match its manifest", path);
	else if (ret == -ENOENT)    /* the note said why: no manifest */
		job_result(j, 1, path, NULL, "could not verify %s: it has no manifest", path);
	else
		job_result(j, 1, path, NULL, "could not verify %s: %s", path, strerror(-ret));
	close(fd);
	free(path);
}
