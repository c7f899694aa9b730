/* Checkpoint names and the commit-time manifest.
 *
 * The manifest is built by one walk of the step in component order; files
 * are hashed many at a time on the copier (hash only), and finish out of
 * order, so entries wait in a window until every entry before them is
 * ready, then go to the writer in order. The window has WINDOW slots, so
 * memory is bounded whatever the number of shards.
 *
 * Lanes ([transfer] hash_threads): with more than one, each lane is a
 * thread with a copier of its own (memory and files in flight split
 * between them), and the walk hands each file to the lane with the fewest
 * bytes still to hash, so a step of a few big shards is hashed on as many
 * cores as it has shards (one file's digest is sequential: a file is
 * always one lane's). The lanes start from the committer's thread, so they
 * act as the step's owner as it does (fs/cred.h). Under b->mu: the
 * window's done flags, the lanes' queues and bytes, err and why; a lane's
 * copier is its thread's alone.
 */
#include "daemon/ckpt/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/manifest.h"
#include "common/paths.h"
#include "daemon/engine/copier.h"
#include "daemon/engine/pcache.h"
#include "daemon/fs/roots.h"
#include "daemon/fs/treeops.h"
#include "daemon/fs/walk.h"

#define WINDOW 1024
#define MF_TMP "manifest.commit"

int ckpt_parse(const struct stage_config *cfg, const char *path, char job[CKPT_NAME_MAX + 1],
	       char step[CKPT_NAME_MAX + 1], char *why, size_t whylen)
{
	size_t rl = strlen(cfg->ckpt_root);
	const char *rest, *slash, *w;

	if (strncmp(path, cfg->ckpt_root, rl) != 0 || (rl > 1 && path[rl] != '/') ||
	    (rl == 1 && path[0] != '/')) {
		snprintf(why, whylen, "%s is not under ckpt_root (%s)", path, cfg->ckpt_root);
		return -EINVAL;
	}
	rest = path + rl + (rl > 1);
	slash = strchr(rest, '/');
	if (!slash || strchr(slash + 1, '/') || (size_t)(slash - rest) > CKPT_NAME_MAX ||
	    strlen(slash + 1) > CKPT_NAME_MAX || !slash[1]) {
		snprintf(why, whylen, "%s: a checkpoint is a directory %s/JOB/STEP", path,
			 cfg->ckpt_root);
		return -EINVAL;
	}
	memcpy(job, rest, (size_t)(slash - rest));
	job[slash - rest] = '\0';
	strcpy(step, slash + 1);
	if (config_check_name(job, &w) < 0 || config_check_name(step, &w) < 0) {
		snprintf(why, whylen, "%s: job or step name '%s': %s", path,
			 config_check_name(job, &w) < 0 ? job : step, w);
		return -EINVAL;
	}
	return 0;
}

int ckpt_locate(const struct stage_config *cfg, const char *arg, bool replicas_ok,
		char origin[CKPT_NAME_MAX + 1], char job[CKPT_NAME_MAX + 1],
		char step[CKPT_NAME_MAX + 1], char *why, size_t whylen)
{
	struct stage_config c = *cfg;
	char *p = NULL, *root = NULL, *rr = NULL, *base = NULL;
	int rc = roots_resolve(arg, &p);

	origin[0] = '\0';
	if (rc < 0) {
		snprintf(why, whylen, "'%s': %s", arg, rc == -EINVAL ?
			 "'..' below what exists" : strerror(-rc));
		return rc;
	}
	root = realpath(cfg->ckpt_root, NULL);
	rr = replicas_ok ? realpath(cfg->replica_root, NULL) : NULL;
	if (root && paths_under(p, root)) {
		c.ckpt_root = root;
		rc = ckpt_parse(&c, p, job, step, why, whylen);
	} else if (rr && paths_under(p, rr) && strcmp(p, rr) != 0) {
		const char *rest = p + strlen(rr) + (strlen(rr) > 1);
		size_t n = strcspn(rest, "/");
		const char *w;

		if (n <= CKPT_NAME_MAX) {
			memcpy(origin, rest, n);
			origin[n] = '\0';
		}
		if (n > CKPT_NAME_MAX || config_check_name(origin, &w) < 0 ||
		    asprintf(&base, "%.*s", (int)(rest - p + (ptrdiff_t)n), p) < 0) {
			base = NULL;
			snprintf(why, whylen, "%s: a replica is %s/ORIGIN/JOB/STEP", p,
				 cfg->replica_root);
			rc = -EINVAL;
		} else {
			c.ckpt_root = base;
			rc = ckpt_parse(&c, p, job, step, why, whylen);
		}
	} else {
		snprintf(why, whylen, "%s is not a checkpoint: not beneath ckpt_root (%s)%s%s", p,
			 cfg->ckpt_root, replicas_ok ? " or replica_root " : "",
			 replicas_ok ? cfg->replica_root : "");
		rc = -EINVAL;
	}
	free(p);
	free(root);
	free(rr);
	free(base);
	return rc;
}

int ckpt_step_cmp(const char *a, const char *b)
{
	while (*a && *b) {
		if (*a >= '0' && *a <= '9' && *b >= '0' && *b <= '9') {
			const char *ea = a, *eb = b;

			while (*a == '0')
				a++;
			while (*b == '0')
				b++;
			for (ea = a; *ea >= '0' && *ea <= '9'; ea++)
				;
			for (eb = b; *eb >= '0' && *eb <= '9'; eb++)
				;
			if (ea - a != eb - b)
				return ea - a < eb - b ? -1 : 1;
			for (; a < ea; a++, b++)
				if (*a != *b)
					return *a < *b ? -1 : 1;
			continue;
		}
		if (*a != *b)
			return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
		a++;
		b++;
	}
	return *a ? 1 : *b ? -1 : 0;
}

static int step_qcmp(const void *a, const void *b)
{
	return ckpt_step_cmp(a, b);
}

bool ckpt_has_manifest(int jobfd, const char *step, const void *arg)
{
	char p[CKPT_NAME_MAX + sizeof(MF_NAME) + 2];

	snprintf(p, sizeof(p), "%s/%s", step, MF_NAME);
	return faccessat(jobfd, p, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

int ckpt_steps(int jobfd, bool (*want)(int jobfd, const char *step, const void *arg),
	       const void *arg, ckpt_name_t **out, size_t *n)
{
	int fd = dup(jobfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	ckpt_name_t *v = NULL;
	struct dirent *e;
	size_t cap = 0;
	const char *w;

	*n = 0;
	*out = NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	while ((e = readdir(d))) {
		if (strlen(e->d_name) > CKPT_NAME_MAX || config_check_name(e->d_name, &w) < 0 ||
		    e->d_type == DT_REG || e->d_type == DT_LNK || (want && !want(jobfd, e->d_name, arg)))
			continue;
		if (*n == cap) {
			void *nv = realloc(v, (cap = cap ? 2 * cap : 16) * sizeof(*v));

			if (!nv) {
				free(v);
				closedir(d);
				*n = 0;
				return -ENOMEM;
			}
			v = nv;
		}
		snprintf(v[(*n)++], sizeof(v[0]), "%s", e->d_name);
	}
	closedir(d);
	if (*n)                 /* qsort of NULL, even of none, is undefined */
		qsort(v, *n, sizeof(*v), step_qcmp);
	*out = v;
	return 0;
}

struct slot {
	struct cp_file cf;
	struct mf_entry e;       /* owned; e.path also names the file for the copier */
	int dirfd;               /* owned dup of the entry's directory, files only */
	int done;                /* 1 ready, -errno failed */
	struct lane *lane;       /* the lane hashing it (lanes only) */
};

struct builder;

/* A hashing thread with a copier of its own. */
struct lane {
	struct builder *b;
	struct copier *cp;
	pthread_t thread;
	bool started;
	struct slot *q[WINDOW];  /* files handed to it, not started yet */
	unsigned qh, qn;
	uint64_t bytes;          /* of the files handed to it and not hashed yet */
};

struct builder {
	struct copier *cp;       /* without lanes: the committer's own */
	struct mf_writer *mw;
	struct slot *win;        /* WINDOW slots, a ring */
	size_t head, n;          /* oldest slot, slots in use */
	int step_fd;             /* the step directory, borrowed */
	int err;                 /* first failure, sticky */
	char *why;
	size_t whylen;
	uint64_t files, bytes;
	unsigned nlanes;         /* 0: no lanes, the committer hashes */
	struct lane *lanes;
	bool stop;               /* the walk is over: lanes end once idle */
	pthread_mutex_t mu;
	pthread_cond_t cv;
};

static void fail(struct builder *b, int err, const char *fmt, const char *rel, const char *what)
{
	if (b->err)
		return;
	b->err = err;
	snprintf(b->why, b->whylen, fmt, rel, what);
}

static void on_hashed(struct cp_file *cf, void *arg)
{
	struct slot *s = cf->owner;
	struct builder *b = arg;

	if (cf->err) {
		s->done = cf->err;
		fail(b, cf->err, cf->err == -ESTALE ? "%s changed while it was hashed: the trainer "
			"is still writing the step%s; commit it again once it is finished" :
			"cannot read %s: %s", s->e.path, cf->err == -ESTALE ? "" : strerror(-cf->err));
	} else {
		s->e.digest = cf->digest;
		s->e.nchunks = cf->nchunks;
		s->e.chunks = cf->chunks;
		cf->chunks = NULL;
		s->done = 1;
	}
	copier_release(cf);
	close(s->dirfd);
	s->dirfd = -1;
}

static void on_hashed_lane(struct cp_file *cf, void *arg)
{
	struct slot *s = cf->owner;
	struct builder *b = arg;

	pthread_mutex_lock(&b->mu);
	s->lane->bytes -= s->e.size;
	on_hashed(cf, arg);
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
}

static void *lane_main(void *arg)
{
	struct lane *l = arg;
	struct builder *b = l->b;

	pthread_setname_np(pthread_self(), "commit hash");
	for (;;) {
		struct slot *s = NULL;
		bool over, bad;
		int rc;

		pthread_mutex_lock(&b->mu);
		while (!b->stop && !copier_inflight(l->cp) &&
		       !(l->qn && copier_has_room(l->cp)))
			pthread_cond_wait(&b->cv, &b->mu);
		if (l->qn && copier_has_room(l->cp)) {
			s = l->q[l->qh];
			l->qh = (l->qh + 1) % WINDOW;
			l->qn--;
		}
		over = b->stop && !l->qn && !s;
		bad = b->err != 0;
		pthread_mutex_unlock(&b->mu);
		if (s && (bad || copier_start(l->cp, &s->cf) < 0)) {
			pthread_mutex_lock(&b->mu);
			l->bytes -= s->e.size;
			close(s->dirfd);
			s->dirfd = -1;
			s->done = -EIO;
			fail(b, -EIO, "cannot start reading %s%s", s->e.path, "");
			pthread_cond_broadcast(&b->cv);
			pthread_mutex_unlock(&b->mu);
		}
		if (copier_inflight(l->cp)) {
			if (bad)        /* the commit failed: no need to hash the rest */
				copier_cancel(l->cp);
			rc = copier_run(l->cp, 20, on_hashed_lane, b);
			if (rc < 0) {
				pthread_mutex_lock(&b->mu);
				fail(b, rc, "io_uring: %s%s", "", strerror(-rc));
				pthread_cond_broadcast(&b->cv);
				pthread_mutex_unlock(&b->mu);
				break;  /* its files stay in flight: copier_destroy ends them */
			}
		} else if (over) {
			break;
		}
	}
	return NULL;
}

/* The lanes, from opts split n ways: 0, or -errno (none left running). */
static int lanes_start(struct builder *b, unsigned n, const struct copier_opts *o)
{
	struct copier_opts lo = *o;
	int rc = 0;

	lo.memory = o->memory / n;
	lo.max_files = o->max_files / n ? o->max_files / n : 1;
	b->lanes = calloc(n, sizeof(*b->lanes));
	if (!b->lanes)
		return -ENOMEM;
	b->nlanes = n;
	for (unsigned i = 0; i < n && rc == 0; i++) {
		struct lane *l = &b->lanes[i];

		l->b = b;
		rc = copier_create(&l->cp, -1, &lo);
		if (rc == 0 && pthread_create(&l->thread, NULL, lane_main, l) != 0)
			rc = -EAGAIN;
		l->started = rc == 0;
	}
	return rc;
}

/* Waits for every lane to end; then their copiers go. */
static void lanes_stop(struct builder *b)
{
	pthread_mutex_lock(&b->mu);
	b->stop = true;
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
	for (unsigned i = 0; i < b->nlanes; i++) {
		struct lane *l = &b->lanes[i];

		if (l->started)
			pthread_join(l->thread, NULL);
		if (l->cp)
			copier_destroy(l->cp);
	}
	/* Files never started, or whose lane's ring failed under them: no
	 * callback released them. */
	for (size_t i = 0; i < b->n; i++) {
		struct slot *s = &b->win[(b->head + i) % WINDOW];

		if (s->dirfd >= 0) {
			copier_release(&s->cf);
			close(s->dirfd);
			s->dirfd = -1;
		}
	}
	free(b->lanes);
	b->lanes = NULL;
	b->nlanes = 0;
}

/* Hands s to the lane with the fewest bytes still to hash. Under b->mu. */
static void hand_to_lane(struct builder *b, struct slot *s)
{
	struct lane *l = &b->lanes[0];

	for (unsigned i = 1; i < b->nlanes; i++)
		if (b->lanes[i].bytes < l->bytes)
			l = &b->lanes[i];
	s->lane = l;
	l->bytes += s->e.size;
	l->q[(l->qh + l->qn) % WINDOW] = s;
	l->qn++;
	pthread_cond_broadcast(&b->cv);
}

/* Writes the ready slots at the head of the window, in order. With lanes,
 * under b->mu. */
static void retire(struct builder *b)
{
	while (b->n && b->win[b->head].done) {
		struct slot *s = &b->win[b->head];
		int rc;

		if (s->done == 1 && !b->err && (rc = mf_writer_add(b->mw, &s->e)) < 0)
			fail(b, rc, "manifest entry %s: %s", s->e.path, strerror(-rc));
		mf_entry_free(&s->e);
		s->done = 0;
		b->head = (b->head + 1) % WINDOW;
		b->n--;
	}
}

static int run_copier(struct builder *b, int ms)
{
	int rc = copier_run(b->cp, ms, on_hashed, b);

	if (rc < 0)
		fail(b, rc, "io_uring: %s%s", "", strerror(-rc));
	retire(b);
	return rc;
}

/* With lanes: the ready slots retired as the lanes finish them, until at
 * most `most` slots are in use or something failed. b->err. */
static int lanes_retire_until(struct builder *b, size_t most)
{
	int err;

	pthread_mutex_lock(&b->mu);
	retire(b);
	while (b->n > most && !b->err) {
		pthread_cond_wait(&b->cv, &b->mu);
		retire(b);
	}
	err = b->err;
	pthread_mutex_unlock(&b->mu);
	return err;
}

/* The next free slot, waiting for the head when the window is full. */
static struct slot *take_slot(struct builder *b)
{
	struct slot *s;

	if (b->nlanes) {
		if (lanes_retire_until(b, WINDOW - 1))
			return NULL;
	} else {
		while (b->n == WINDOW && !b->err)
			if (run_copier(b, 100) < 0)
				return NULL;
		if (b->err)
			return NULL;
	}
	s = &b->win[(b->head + b->n) % WINDOW];
	memset(s, 0, sizeof(*s));
	s->dirfd = -1;
	b->n++;
	return s;
}

/* b->mu, when there are lanes to share the builder with. */
static void lock(struct builder *b)
{
	if (b->nlanes)
		pthread_mutex_lock(&b->mu);
}

static void unlock(struct builder *b)
{
	if (b->nlanes)
		pthread_mutex_unlock(&b->mu);
}

static void add_entry(struct builder *b, const struct walk_ent *w)
{
	struct slot *s;
	char target[MF_MAX_PATH + 1];
	ssize_t tn;

	if (w->type == '?') {
		lock(b);
		fail(b, -EINVAL, "%s: %s", w->rel, "not a file, directory or symlink");
		unlock(b);
		return;
	}
	s = take_slot(b);
	if (!s)
		return;
	lock(b);                /* the slot's done, err and retire are shared with the lanes */
	s->e.type = w->type;
	s->e.path = strdup(w->rel);
	s->e.mode = w->st.st_mode & 07777;
	s->e.mtime_ns = w->mtime_ns;
	if (!s->e.path) {
		s->done = -ENOMEM;
		fail(b, -ENOMEM, "%s: %s", w->rel, "out of memory");
		goto out;
	}
	if (w->type == MF_DIR) {
		s->done = 1;
	} else if (w->type == MF_LINK) {
		tn = readlinkat(w->src_dirfd, w->name, target, sizeof(target) - 1);
		if (tn <= 0 || !(s->e.target = strndup(target, (size_t)tn))) {
			s->done = -EIO;
			fail(b, -EIO, "cannot read link %s: %s", w->rel, strerror(errno));
			goto out;
		}
		s->e.size = (uint64_t)tn;
		s->e.digest = digest_of(target, (size_t)tn);
		s->done = 1;
	} else {
		s->e.size = (uint64_t)w->st.st_size;
		s->dirfd = dup(w->src_dirfd);
		b->files++;
		b->bytes += s->e.size;
		s->cf = (struct cp_file){
			.src_at = s->dirfd, .src = strrchr(s->e.path, '/') ?
				strrchr(s->e.path, '/') + 1 : s->e.path,
			.size = s->e.size, .mtime_ns = w->mtime_ns, .owner = s,
		};
		if (b->nlanes) {
			if (s->dirfd >= 0) {
				hand_to_lane(b, s);
			} else {
				s->done = -EIO;
				fail(b, -EIO, "cannot start reading %s%s", s->e.path, "");
			}
			goto out;
		}
		while (!copier_has_room(b->cp) && !b->err)
			run_copier(b, 100);
		if (s->dirfd < 0 || b->err || copier_start(b->cp, &s->cf) < 0) {
			if (s->dirfd >= 0)
				close(s->dirfd);
			s->dirfd = -1;
			s->done = -EIO;
			fail(b, -EIO, "cannot start reading %s%s", s->e.path, "");
		}
	}
out:
	retire(b);
	unlock(b);
}

/* Whether something failed, as the walk sees it. */
static bool failed(struct builder *b)
{
	bool err;

	lock(b);
	err = b->err != 0;
	unlock(b);
	return err;
}

static int build(struct builder *b, int stage_fd)
{
	struct walk *w;
	struct walk_ent e;
	int rc;

	rc = walk_open(&w, b->step_fd, -1, 0);
	if (rc < 0) {
		fail(b, rc, "cannot list %s: %s", ".", strerror(-rc));
		return rc;
	}
	while (!failed(b) && (rc = walk_next(w, &e)) != 0) {
		if (rc < 0) {
			fail(b, rc, "cannot list %s: %s", walk_err_path(w), walk_why(w));
			break;
		}
		add_entry(b, &e);
	}
	walk_close(w);
	if (b->nlanes)
		return lanes_retire_until(b, 0);
	while (copier_inflight(b->cp))
		if (run_copier(b, 100) < 0)
			break;
	retire(b);
	return b->err;
}

int ckpt_manifest(const struct stage_config *cfg, const char *job, const char *step, bool sent,
		  bool in_order, digest_t *root, uint64_t *files, uint64_t *bytes, char *why,
		  size_t whylen)
{
	struct builder b = { .why = why, .whylen = whylen };
	unsigned lanes = in_order ? 1 : config_hash_threads(cfg);
	/* auto: the disk read once for the hash and the sends after it, as
	 * long as the step fits a share of memory the kernel can give back */
	uint64_t budget = sent && cfg->cache_reads == CFG_CACHE_READS_AUTO ?
			  pcache_available() / 4 : 0;
	struct copier_opts co = {
		.memory = cfg->memory, .io_size = cfg->io_size, .chunk_size = cfg->chunk_size,
		/* always: no O_DIRECT, so the step is in the cache when its
		 * copies are sent (engine/pcache.h) */
		.direct_min = cfg->cache_reads == CFG_CACHE_READS_ALWAYS ? UINT64_MAX :
			      2 * cfg->io_size,
		.max_files = in_order ? 1 : cfg->files_in_flight, .depth = 8,
		.cache_budget = budget ? &budget : NULL,
	};
	char rel[2 * CKPT_NAME_MAX + 2];
	int root_fd, stage_fd, rc;

	snprintf(rel, sizeof(rel), "%s/%s", job, step);
	root_fd = open(cfg->ckpt_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0) {
		rc = -errno;
		snprintf(why, whylen, "cannot open ckpt_root %s: %s", cfg->ckpt_root, strerror(-rc));
		return rc;
	}
	b.step_fd = treeops_open_beneath(root_fd, rel);
	close(root_fd);
	if (b.step_fd < 0) {
		rc = b.step_fd;
		snprintf(why, whylen, "cannot open %s/%s: %s", cfg->ckpt_root, rel, strerror(-rc));
		return rc;
	}
	/* A new .stage is synced into the step: else the manifest's name is
	 * durable and the directory holding it may not be. */
	rc = mkdirat(b.step_fd, MF_DIRNAME, 0755) == 0 ? treeops_sync_dir(b.step_fd) :
	     errno == EEXIST ? 0 : -errno;
	if (rc < 0) {
		snprintf(why, whylen, "cannot create %s/%s/%s: %s", cfg->ckpt_root, rel, MF_DIRNAME,
			 strerror(-rc));
		goto out_close_step;
	}
	stage_fd = openat(b.step_fd, MF_DIRNAME, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (stage_fd < 0) {
		rc = -errno;
		snprintf(why, whylen, "cannot open %s/%s/%s: %s", cfg->ckpt_root, rel, MF_DIRNAME,
			 strerror(-rc));
		goto out_close_step;
	}
	b.win = calloc(WINDOW, sizeof(*b.win));
	if (!b.win) {
		rc = -ENOMEM;
		snprintf(why, whylen, "out of memory");
		goto out_close_stage;
	}
	pthread_mutex_init(&b.mu, NULL);
	pthread_cond_init(&b.cv, NULL);
	rc = lanes > 1 ? lanes_start(&b, lanes, &co) : copier_create(&b.cp, -1, &co);
	if (rc < 0) {
		snprintf(why, whylen, "%s: %s", lanes > 1 ? "starting the hashing threads" :
			 "io_uring", strerror(-rc));
		goto out_destroy_copier;
	}
	rc = mf_writer_open(&b.mw, stage_fd, MF_TMP, cfg->chunk_size);
	if (rc < 0) {
		snprintf(why, whylen, "cannot write %s/%s/%s/%s: %s", cfg->ckpt_root, rel,
			 MF_DIRNAME, MF_TMP, strerror(-rc));
		goto out_destroy_copier;
	}
	rc = build(&b, stage_fd);
	if (rc == 0 && (rc = mf_writer_finish(b.mw, root)) < 0)
		snprintf(why, whylen, "cannot finish the manifest of %s/%s: %s", cfg->ckpt_root,
			 rel, strerror(-rc));
	else if (rc)
		mf_writer_abort(b.mw);
	b.mw = NULL;
	if (rc == 0 && renameat(stage_fd, MF_TMP, stage_fd, "manifest") < 0) {
		rc = -errno;
		snprintf(why, whylen, "cannot publish the manifest of %s/%s: %s", cfg->ckpt_root,
			 rel, strerror(-rc));
	}
	if (rc == 0 && fsync(stage_fd) < 0) {
		rc = -errno;
		snprintf(why, whylen, "cannot make the manifest of %s/%s durable: %s",
			 cfg->ckpt_root, rel, strerror(-rc));
	} else if (rc < 0) {
		unlinkat(stage_fd, MF_TMP, 0);
	}
	*files = b.files;
	*bytes = b.bytes;
out_destroy_copier:
	if (b.nlanes)
		lanes_stop(&b);
	if (b.cp)
		copier_destroy(b.cp);
	pthread_mutex_destroy(&b.mu);
	pthread_cond_destroy(&b.cv);
	for (size_t i = 0; i < b.n; i++)
		mf_entry_free(&b.win[(b.head + i) % WINDOW].e);
	free(b.win);
out_close_stage:
	close(stage_fd);
out_close_step:
	close(b.step_fd);
	return rc;
}

int ckpt_manifest_root(int dirfd, const char *name, digest_t *root, uint64_t *chunk,
		       char *why, size_t whylen)
{
	struct mf_reader *mr;
	struct mf_entry e;
	int rc = mf_reader_open(&mr, dirfd, name, MF_COMPLETE);

	if (rc < 0) {
		if (why)
			snprintf(why, whylen, "%s: %s", name, strerror(-rc));
		return rc;
	}
	while ((rc = mf_reader_next(mr, &e)) == 1)
		mf_entry_free(&e);
	if (rc == 0) {
		*root = mf_reader_root(mr);
		if (chunk)
			*chunk = mf_reader_chunk_size(mr);
	} else if (why) {
		snprintf(why, whylen, "%s", mf_reader_why(mr));
	}
	mf_reader_close(mr);
	return rc;
}

int ckpt_get_name(const struct msg *m, uint16_t key, char out[CKPT_NAME_MAX + 1])
{
	char *s = NULL;
	const char *w;
	int rc = msg_get_str(m, key, &s);

	if (rc == 0 && (strlen(s) > CKPT_NAME_MAX || config_check_name(s, &w) < 0))
		rc = -EINVAL;
	if (rc == 0)
		strcpy(out, s);
	free(s);
	return rc;
}
