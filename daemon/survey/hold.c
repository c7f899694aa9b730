/* hold_survey: one verify per copy this node keeps of a step. The copies of
 * one step are few (this node's own, and one per origin it is a partner of),
 * so they are checked one after the other; each check streams its manifest,
 * so memory does not grow with the checkpoint. */
#include "daemon/survey/hold.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/manifest.h"
#include "daemon/ckpt/ckpt.h"
#include "daemon/durable/tier.h"
#include "daemon/job/job.h"
#include "daemon/fs/cred.h"
#include "daemon/fs/treeops.h"
#include "daemon/net/peer.h"
#include "daemon/pull/verify.h"
#include "daemon/peers/peers.h"

struct texts {
	struct hold_cell *c;
	uint64_t more;             /* findings beyond COPY_TEXTS_MAX */
};

static void on_bad(const struct verify_finding *f, void *arg)
{
	struct texts *t = arg;
	char *s;

	if (t->c->ntext == COPY_TEXTS_MAX) {
		t->more++;
		return;
	}
	/* At most 256 bytes a finding: an answer holds many, and a frame 1 MiB. */
	if (asprintf(&s, "%.200s: %s%s%.40s%s", f->rel, f->kind, f->detail ? " (" : "",
		     f->detail ? f->detail : "", f->detail ? ")" : "") >= 0)
		t->c->text[t->c->ntext++] = s;
}

static void add_text(struct hold_cell *c, const char *fmt, const char *arg)
{
	char *s;

	if (c->ntext < COPY_TEXTS_MAX && asprintf(&s, fmt, arg) >= 0)
		c->text[c->ntext++] = s;
}

/* The latest committed step (natural order) other than `step` in dir,
 * into out; false if none. */
static bool latest_other(int dirfd, const char *step, char out[CKPT_NAME_MAX + 1])
{
	ckpt_name_t *v;
	size_t n;
	bool found = false;

	if (ckpt_steps(dirfd, ckpt_has_manifest, NULL, &v, &n) < 0)
		return false;
	while (n-- && !found)
		if (strcmp(v[n], step) != 0) {
			strcpy(out, v[n]);
			found = true;
		}
	free(v);
	return found;
}

/* One copy: job_dir holds the origin's steps of the job (ckpt_root/JOB or
 * replica_root/ORIGIN/JOB). own: this node's own copy, whose deep verify
 * leaves its record for a restore here (pull/damage.h). */
static void survey_copy(const struct stage_config *cfg, const char *origin, const char *label,
			int job_dir, const char *job, const char *step, bool deep, bool own,
			struct msg *m)
{
	struct hold_cell c = { .origin = (char *)origin, .step = (char *)step };
	char other[CKPT_NAME_MAX + 1], path[8192];
	struct texts t = { .c = &c };
	peers_notes_fn notes;
	int fd, rc;

	fd = openat(job_dir, step, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (!latest_other(job_dir, step, other))
			return;                 /* nothing of this job from origin */
		c.state = "other-step";
		c.step = other;
		hold_put(m, &c, false);
		return;
	}
	snprintf(path, sizeof(path), "%s/%s", label, step);
	if (faccessat(fd, MF_NAME, F_OK, AT_SYMLINK_NOFOLLOW) < 0) {
		c.state = "incomplete";
		add_text(&c, "%s has no manifest: never committed, or still being written", path);
	} else {
		struct cred *owner = NULL;
		int switched = 0;
		struct job j;

		/* This node's own step is read (and its damage recorded) as its
		 * owner when a thread of the daemon's does it (a peer's question;
		 * a user's request here already acts as its user). A replica is
		 * the daemon's to read, whoever asks (its directories are the
		 * daemon's; who may see it was checked before the question). */
		if (own && (switched = cred_enter_owner(fd, &owner)) < 0) {
			c.state = "damaged";
			add_text(&c, "%s: cannot act as its owner", path);
			goto out;
		}
		if (!own)
			cred_daemon_begin();
		job_begin(&j, -1, deep ? REQ_DEEP : 0, cfg, "verify", path);
		rc = verify_tree(&j, path, fd, &(struct verify_opts){ .deep = deep, .bad = on_bad,
							       .arg = &t, .root = &c.root,
							       .record = own });
		c.has_root = rc >= 0;
		c.files = atomic_load(&j.files_total);
		c.bytes = atomic_load(&j.bytes_total);
		job_end(&j);
		if (!own)
			cred_daemon_end();
		if (switched)
			cred_leave();
		free(owner);
		c.state = rc == 0 ? "ok" : "damaged";
		if (rc == -EBADMSG)
			add_text(&c, "%s/" MF_NAME " is damaged (truncated or edited)", path);
		else if (rc < 0)
			add_text(&c, "%s", strerror(-rc));
		if (t.more) {
			char n[32];

			snprintf(n, sizeof(n), "%llu", (unsigned long long)t.more);
			add_text(&c, "and %s more", n);
		}
	}
out:
	close(fd);
	/* This node's own copy: what its replication says of the copies of
	 * this commit (this root) its partners have not confirmed, so that an
	 * asker can tell a copy on its way, or skipped, from one lost. */
	notes = own && c.has_root ? atomic_load(&peers.copy_notes) : NULL;
	if (notes)
		c.ncopy = (unsigned)notes(job, step, &c.root, c.copy, COPY_NOTES_MAX);
	hold_put(m, &c, false);
	for (unsigned i = 0; i < c.ntext; i++)
		free(c.text[i]);
	for (unsigned i = 0; i < c.ncopy; i++)
		free(c.copy[i]);
}

/* Every committed step of one copy's job directory, the newest
 * HOLD_STEPS_MAX of them (natural order): what resume chooses from. */
static void survey_steps(const struct stage_config *cfg, const char *origin, const char *label,
			 int job_dir, const char *job, bool deep, bool own, struct msg *m)
{
	ckpt_name_t *v;
	size_t n;

	/* Only steps with a manifest: a trainer's tensorboard/ or tmp/ beside
	 * its steps must not push them out of the survey (names sort after
	 * step-N), and a step without one is nothing to resume from. */
	if (ckpt_steps(job_dir, ckpt_has_manifest, NULL, &v, &n) < 0)
		return;
	for (size_t k = n; k > 0 && n - k < HOLD_STEPS_MAX; k--)      /* newest first */
		survey_copy(cfg, origin, label, job_dir, job, v[k - 1], deep, own, m);
	free(v);
}

/* One copy directory: the step asked for, or every step (step NULL). */
static void survey_one(const struct stage_config *cfg, const char *origin, const char *label,
		       int job_dir, const char *job, const char *step, bool deep, bool own,
		       struct msg *m)
{
	if (step)
		survey_copy(cfg, origin, label, job_dir, job, step, deep, own, m);
	else
		survey_steps(cfg, origin, label, job_dir, job, deep, own, m);
}

int hold_survey(const struct stage_config *cfg, const char *self, const char *job,
		const char *step, bool deep, struct msg *m)
{
	char label[8192];
	const char *w;
	struct dirent *e;
	DIR *d;
	int fd;

	/* JOB/ may be the training user's: it is opened beneath ckpt_root with
	 * no symlink on the way, so a JOB swapped for a link is "nothing held
	 * here", not a survey of wherever the link points. */
	snprintf(label, sizeof(label), "%s/%s", cfg->ckpt_root, job);
	fd = treeops_open_beneath_path(cfg->ckpt_root, job);
	if (fd >= 0) {
		survey_one(cfg, self, label, fd, job, step, deep, true, m);
		close(fd);
	}
	d = opendir(cfg->replica_root);
	while (d && (e = readdir(d))) {
		if (config_check_name(e->d_name, &w) < 0 || strlen(e->d_name) > CKPT_NAME_MAX)
			continue;       /* ".incoming" and strays */
		snprintf(label, sizeof(label), "%s/%s", e->d_name, job);
		fd = treeops_open_beneath(dirfd(d), label);
		if (fd < 0)
			continue;
		snprintf(label, sizeof(label), "%s/%s/%s", cfg->replica_root, e->d_name, job);
		survey_one(cfg, e->d_name, label, fd, job, step, deep, false, m);
		close(fd);
	}
	if (d)
		closedir(d);
	return m->err;
}

struct dsurvey {
	const char *step;
	int stepfd;
	struct msg *m;
};

static int durable_cell(const char *origin, void *arg)
{
	struct dsurvey *d = arg;
	struct hold_cell c = { .origin = (char *)origin, .step = (char *)d->step };
	struct durable_part p;
	const char *w;
	int rc;

	if (config_check_name(origin, &w) < 0 || strlen(origin) > CKPT_NAME_MAX)
		return 0;       /* a stray in .stage */
	rc = durable_part_check(d->stepfd, origin, &p);
	if (rc == -ENOENT)
		return 0;       /* retired, or being drained again, since the listing */
	c.state = rc == 0 ? "ok" : "damaged";
	c.has_root = p.has_root;
	c.root = p.root;
	c.files = p.files;
	c.bytes = p.bytes;
	if (rc == -EBADMSG)
		add_text(&c, "its manifest is damaged: %s", p.first);
	else if (rc != 0)
		add_text(&c, "%s", p.first);
	if (rc == 1 && p.bad > 1) {
		char more[64];

		snprintf(more, sizeof(more), "%llu", (unsigned long long)p.bad - 1);
		add_text(&c, "and %s more", more);
	}
	hold_put(d->m, &c, false);
	for (unsigned i = 0; i < c.ntext; i++)
		free(c.text[i]);
	return 0;
}

static void durable_step(struct dsurvey *d, int jobfd, const char *step)
{
	d->step = step;
	d->stepfd = treeops_open_beneath(jobfd, step);
	if (d->stepfd < 0)
		return;         /* not drained */
	durable_each_origin(d->stepfd, durable_cell, d);
	close(d->stepfd);
}

int hold_survey_durable(const struct stage_config *cfg, const char *job, const char *step,
			struct msg *m)
{
	struct dsurvey d = { .m = m };
	int root, jobfd;

	/* The root itself must read (a shared mount gone is named); the job
	 * need not be there (nothing of it drained yet). */
	root = open(cfg->durable_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root < 0)
		return -errno;
	jobfd = treeops_open_beneath(root, job);
	close(root);
	if (jobfd < 0)
		return jobfd == -ENOENT ? 0 : jobfd;
	if (step) {
		durable_step(&d, jobfd, step);
	} else {
		ckpt_name_t *v;
		size_t n;

		if (ckpt_steps(jobfd, durable_has_part, NULL, &v, &n) == 0) {
			for (size_t i = n; i > 0 && n - i < HOLD_STEPS_MAX; i--)
				durable_step(&d, jobfd, v[i - 1]);
			free(v);
		}
	}
	close(jobfd);
	return m->err;
}

/* MSG_HOLD_REQ from a peer: answered on its connection, which stays open. */
int hold_serve(struct xport *x, const char *peer, const struct msg *req)
{
	char job[CKPT_NAME_MAX + 1], step[CKPT_NAME_MAX + 1] = "";
	uint64_t flags = 0;
	struct msg m;
	int rc;

	msg_get_u64(req, K_FLAGS, &flags);
	/* Every byte of every step held: a question nobody asks, that could
	 * keep a node reading for hours. */
	if ((flags & REQ_ALLSTEPS) && (flags & REQ_DEEP)) {
		log_warn("question from %s refused: every step, deep", peer);
		peer_send_error(x, EINVAL, "%s: a deep survey is of one step", peers.cfg->name);
		return -EINVAL;
	}
	if (ckpt_get_name(req, K_JOB, job) < 0 ||
	    (!(flags & REQ_ALLSTEPS) && ckpt_get_name(req, K_STEP, step) < 0)) {
		log_warn("question from %s refused: no valid job or step name", peer);
		peer_send_error(x, EBADMSG, "%s: a malformed question", peers.cfg->name);
		return -EBADMSG;
	}
	log_info("%s asks what this node holds of %s/%s%s", peer, job,
		 flags & REQ_ALLSTEPS ? "*" : step, flags & REQ_DEEP ? " (deep)" : "");
	msg_init(&m, MSG_HOLD);
	rc = hold_survey(peers.cfg, peers.cfg->name, job, flags & REQ_ALLSTEPS ? NULL : step,
			 flags & REQ_DEEP, &m);
	if (rc == 0) {
		rc = x->ops->send(x, &m);
	} else {
		log_warn("question from %s about %s/%s not answered: %s", peer, job, step,
			 strerror(-rc));
		peer_send_error(x, -rc, "%s: %s", peers.cfg->name, strerror(-rc));
	}
	msg_free(&m);
	return rc;
}
