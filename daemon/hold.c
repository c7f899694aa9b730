/* hold_survey: one verify per copy this node keeps of a step. The copies of
 * one step are few (this node's own, and one per origin it is a partner of),
 * so they are checked one after the other; each check streams its manifest,
 * so memory does not grow with the checkpoint. */
#include "daemon/hold.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/manifest.h"
#include "daemon/ckpt.h"
#include "daemon/job.h"
#include "daemon/verify.h"

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

/* The latest step (natural order) other than `step` in dir that has a
 * manifest, into out; false if none. */
static bool latest_other(int dirfd, const char *step, char out[CKPT_NAME_MAX + 1])
{
	int fd = dup(dirfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;
	const char *w;
	bool found = false;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return false;
	}
	while ((e = readdir(d))) {
		char mf[CKPT_NAME_MAX + sizeof(MF_NAME) + 2];

		if (strlen(e->d_name) > CKPT_NAME_MAX || config_check_name(e->d_name, &w) < 0 ||
		    strcmp(e->d_name, step) == 0)
			continue;
		snprintf(mf, sizeof(mf), "%s/%s", e->d_name, MF_NAME);
		if (faccessat(dirfd, mf, F_OK, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		if (!found || ckpt_step_cmp(e->d_name, out) > 0)
			strcpy(out, e->d_name);
		found = true;
	}
	closedir(d);
	return found;
}

/* One copy: job_dir holds the origin's steps of the job (ckpt_root/JOB or
 * replica_root/ORIGIN/JOB). */
static void survey_copy(const struct stage_config *cfg, const char *origin, const char *label,
			int job_dir, const char *step, bool deep, struct msg *m)
{
	struct hold_cell c = { .origin = (char *)origin, .step = (char *)step };
	char other[CKPT_NAME_MAX + 1], path[8192];
	struct texts t = { .c = &c };
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
		struct job j;

		job_begin(&j, -1, deep ? REQ_DEEP : 0, cfg, "verify", path);
		rc = verify_tree(&j, path, fd, &(struct verify_opts){ .deep = deep, .bad = on_bad,
							       .arg = &t, .root = &c.root });
		c.has_root = rc >= 0;
		c.files = atomic_load(&j.files_total);
		c.bytes = atomic_load(&j.bytes_total);
		job_end(&j);
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
	close(fd);
	hold_put(m, &c, false);
	for (unsigned i = 0; i < c.ntext; i++)
		free(c.text[i]);
}

int hold_survey(const struct stage_config *cfg, const char *self, const char *job,
		const char *step, bool deep, struct msg *m)
{
	char label[8192];
	const char *w;
	struct dirent *e;
	DIR *d;
	int fd;

	snprintf(label, sizeof(label), "%s/%s", cfg->ckpt_root, job);
	fd = open(label, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		survey_copy(cfg, self, label, fd, step, deep, m);
		close(fd);
	}
	d = opendir(cfg->replica_root);
	while (d && (e = readdir(d))) {
		if (config_check_name(e->d_name, &w) < 0 || strlen(e->d_name) > CKPT_NAME_MAX)
			continue;       /* ".incoming" and strays */
		snprintf(label, sizeof(label), "%s/%s/%s", cfg->replica_root, e->d_name, job);
		fd = open(label, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0)
			continue;
		survey_copy(cfg, e->d_name, label, fd, step, deep, m);
		close(fd);
	}
	if (d)
		closedir(d);
	return m->err;
}

void hold_put(struct msg *m, const struct hold_cell *c, bool with_holder)
{
	msg_put_str(m, K_ORIGIN, c->origin ? c->origin : "");
	if (with_holder && c->holder)
		msg_put_str(m, K_HOLDER, c->holder);
	msg_put_str(m, K_STATE, c->state);
	if (c->step)
		msg_put_str(m, K_STEP, c->step);
	if (c->has_root) {
		char hex[DIGEST_HEX_LEN + 1];

		digest_to_hex(c->root, hex);
		msg_put_str(m, K_ROOT, hex);
	}
	if (c->files || c->bytes) {
		msg_put_u64(m, K_FILES_TOTAL, c->files);
		msg_put_u64(m, K_BYTES_TOTAL, c->bytes);
	}
	for (unsigned i = 0; i < c->ntext; i++)
		msg_put_str(m, K_TEXT, c->text[i]);
}

static void cell_free(struct hold_cell *c)
{
	free(c->origin);
	free(c->holder);
	free(c->state);
	free(c->step);
	for (unsigned i = 0; i < c->ntext; i++)
		free(c->text[i]);
}

void hold_cells_free(struct hold_cell *cells, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cell_free(&cells[i]);
	free(cells);
}

static char *dup_field(const uint8_t *p, size_t n)
{
	char *s;

	if (memchr(p, '\0', n) || !(s = malloc(n + 1)))
		return NULL;
	memcpy(s, p, n);
	s[n] = '\0';
	return s;
}

/* Names from a peer end up in paths and tables: they must be node or step
 * names ("" is allowed for an origin: a holder-level group). */
static bool name_ok(const char *s, bool empty_ok)
{
	const char *w;

	if (!*s)
		return empty_ok;
	return strlen(s) <= CKPT_NAME_MAX && config_check_name(s, &w) == 0;
}

static bool cell_ok(const struct hold_cell *c)
{
	static const char *const states[] = { "ok", "damaged", "incomplete", "other-step",
					      "missing", "unreachable", "differs" };
	bool known = false;

	for (size_t i = 0; c->state && i < sizeof(states) / sizeof(states[0]); i++)
		known |= strcmp(c->state, states[i]) == 0;
	return known && name_ok(c->origin, true) && c->holder && name_ok(c->holder, false) &&
	       (!c->step || name_ok(c->step, false));
}

int hold_parse(const struct msg *m, const char *holder, struct hold_cell **cells, size_t *n)
{
	struct hold_cell *c = NULL;
	const uint8_t *p;
	size_t off = 0, len, n0 = *n;
	uint16_t key;
	int rc = 0;

	while (rc == 0 && msg_next_field(m, &off, &key, &p, &len) == 1) {
		char **slot = NULL;

		if (key == K_ORIGIN) {
			struct hold_cell *v;

			if (c && !cell_ok(c)) {
				rc = -EBADMSG;
				break;
			}
			v = realloc(*cells, (*n + 1) * sizeof(*v));
			if (!v) {
				rc = -ENOMEM;
				break;
			}
			*cells = v;
			c = &v[(*n)++];
			memset(c, 0, sizeof(*c));
			if (!(c->origin = dup_field(p, len)) ||
			    (holder && !(c->holder = strdup(holder))))
				rc = -EBADMSG;
			continue;
		}
		if (!c)
			continue;       /* fields before the first group */
		switch (key) {
		case K_HOLDER:
			/* A MSG_HOLD speaks for its sender only. */
			if (holder)
				rc = -EBADMSG;
			slot = &c->holder;
			break;
		case K_STATE: slot = &c->state; break;
		case K_STEP: slot = &c->step; break;
		case K_ROOT:
			c->has_root = digest_from_hex((const char *)p, len, &c->root) == 0;
			if (!c->has_root)
				rc = -EBADMSG;
			break;
		case K_FILES_TOTAL:
		case K_BYTES_TOTAL:
			if (len != 8) {
				rc = -EBADMSG;
				break;
			}
			*(key == K_FILES_TOTAL ? &c->files : &c->bytes) = proto_get_le64(p);
			break;
		case K_TEXT:
			if (c->ntext < COPY_TEXTS_MAX && !(c->text[c->ntext++] = dup_field(p, len)))
				rc = -EBADMSG;
			break;
		default:
			break;
		}
		if (slot) {
			free(*slot);
			if (!(*slot = dup_field(p, len)))
				rc = -EBADMSG;
		}
	}
	if (rc == 0 && c && !cell_ok(c))
		rc = -EBADMSG;
	if (rc < 0) {
		/* All or nothing: half a frame's groups must not pass for an answer. */
		for (size_t i = n0; i < *n; i++)
			cell_free(&(*cells)[i]);
		*n = n0;
	}
	return rc;
}
