/* Commit records: state_dir/commits/JOB/STEP, one small text file each,
 * replaced whole (temporary, fsync, rename) on every change that must
 * survive a restart:
 *
 *   stage-commit 1
 *   seq 1764500000123456789
 *   state ready                 (hashing | ready | failed)
 *   root 0123...                (32 hex digits, ready only)
 *   size FILES BYTES            (ready, or hashed again after it was)
 *   copy NAME confirmed         (one per partner that confirmed)
 *   skipped NAME                (one per partner it was skipped for: a newer
 *                                step went instead, repl_impl.h)
 *   begun NAME                  (one per partner whose copy, not confirmed,
 *                                was begun: it is never skipped)
 *
 * Copies not listed are pending (a daemon that does not know "skipped"
 * ignores the line, and sends the copy). A file that does not parse is ignored
 * with a warning (its checkpoint can be committed again).
 */
#include "daemon/repl/repl_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/fs/cred.h"
#include "daemon/fs/roots.h"

static const char *const rstate_names[] = { "hashing", "ready", "failed" };

static void rec_path(char *out, size_t n, const char *job, const char *step)
{
	snprintf(out, n, "%s/commits/%s/%s", repl.cfg->state_dir, job, step ? step : "");
}

struct record *repl_rec_new(const char *job, const char *step)
{
	struct record *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	r->copies = calloc(repl.npartners ? repl.npartners : 1, sizeof(*r->copies));
	if (!r->copies) {
		free(r);
		return NULL;
	}
	snprintf(r->job, sizeof(r->job), "%s", job);
	snprintf(r->step, sizeof(r->step), "%s", step);
	return r;
}

void repl_rec_free(struct record *r)
{
	if (r) {
		free(r->copies);
		free(r);
	}
}

struct record *repl_rec_find(const char *job, const char *step)
{
	for (struct record *r = repl.records; r; r = r->next)
		if (strcmp(r->job, job) == 0 && strcmp(r->step, step) == 0)
			return r;
	return NULL;
}

/* Records are the daemon's own, whoever's request writes them (a commit or
 * a restore runs as its user): written as the daemon. */
static int rec_save(const struct record *r);

int repl_rec_save(const struct record *r)
{
	int rc;

	cred_daemon_begin();
	rc = rec_save(r);
	cred_daemon_end();
	return rc;
}

static int rec_save(const struct record *r)
{
	char dir[4096], path[4400], tmp[4400], hex[DIGEST_HEX_LEN + 1];
	FILE *f;
	int fd, rc = 0;

	rec_path(dir, sizeof(dir), r->job, NULL);
	rc = roots_mkdirs(dir, 0755);
	if (rc < 0)
		goto out_log;
	snprintf(path, sizeof(path), "%s%s", dir, r->step);
	snprintf(tmp, sizeof(tmp), "%s.%s.tmp", dir, r->step);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		goto out_log;
	}
	f = fdopen(fd, "w");
	if (!f) {
		rc = -errno;
		close(fd);
		goto out_unlink;
	}
	fprintf(f, "stage-commit 1\nseq %llu\nstate %s\n", (unsigned long long)r->seq,
		rstate_names[r->state]);
	if (r->state == R_READY) {
		digest_to_hex(r->root, hex);
		fprintf(f, "root %s\n", hex);
	}
	if (r->state == R_READY || r->files)     /* being hashed again: the last figures */
		fprintf(f, "size %llu %llu\n", (unsigned long long)r->files,
			(unsigned long long)r->bytes);
	for (size_t i = 0; i < repl.npartners; i++)
		if (r->copies[i].state == C_CONFIRMED)
			fprintf(f, "copy %s confirmed\n", repl_partner_name(i));
		else if (r->copies[i].state == C_SKIPPED)
			fprintf(f, "skipped %s\n", repl_partner_name(i));
		else if (r->copies[i].begun)
			fprintf(f, "begun %s\n", repl_partner_name(i));
	if (fflush(f) != 0 || fsync(fileno(f)) < 0)
		rc = -errno;
	if (fclose(f) != 0 && !rc)
		rc = -errno;
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc == 0) {
		fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd >= 0) {
			fsync(fd);
			close(fd);
		}
		return 0;
	}
out_unlink:
	unlink(tmp);
out_log:
	log_err("commit record %s/%s in %s/commits: %s", r->job, r->step, repl.cfg->state_dir,
		strerror(-rc));
	return rc;
}

void repl_rec_remove(const char *job, const char *step)
{
	char path[4400];

	cred_daemon_begin();
	rec_path(path, sizeof(path), job, step);
	unlink(path);
	rec_path(path, sizeof(path), job, NULL);
	rmdir(path);            /* only once the job has no records left */
	cred_daemon_end();
}

static void insert_sorted(struct record *r)
{
	struct record **pp = &repl.records;

	while (*pp && (*pp)->seq <= r->seq)
		pp = &(*pp)->next;
	r->next = *pp;
	*pp = r;
}

/* The copy on partner NAME is in state st (a name no longer a partner:
 * nothing). */
static void copy_is(struct record *r, const char *name, enum cstate st)
{
	for (size_t i = 0; i < repl.npartners; i++)
		if (strcmp(repl_partner_name(i), name) == 0) {
			r->copies[i].state = st;
			r->copies[i].begun = st == C_PENDING;   /* "begun NODE" */
			if (st == C_SKIPPED)
				snprintf(r->copies[i].why, sizeof(r->copies[i].why),
					 "skipped: a newer step went first");
		}
}

static int load_one(const char *job, const char *step, const char *path)
{
	struct record *r;
	char line[512], name[300], st[32], hex[64];
	unsigned long long a, b;
	bool ok = false;
	FILE *f = fopen(path, "re");

	if (!f)
		return -errno;
	r = repl_rec_new(job, step);
	if (!r) {
		fclose(f);
		return -ENOMEM;
	}
	while (fgets(line, sizeof(line), f)) {
		if (strcmp(line, "stage-commit 1\n") == 0) {
			ok = true;
		} else if (sscanf(line, "seq %llu", &a) == 1) {
			r->seq = a;
		} else if (sscanf(line, "state %31s", st) == 1) {
			for (int i = 0; i < 3; i++)
				if (strcmp(st, rstate_names[i]) == 0)
					r->state = (enum rstate)i;
		} else if (sscanf(line, "root %63s", hex) == 1) {
			if (digest_from_hex(hex, strlen(hex), &r->root) < 0)
				ok = false;
		} else if (sscanf(line, "size %llu %llu", &a, &b) == 2) {
			r->files = a;
			r->bytes = b;
		} else if (sscanf(line, "copy %299s %31s", name, st) == 2 &&
			   strcmp(st, "confirmed") == 0) {
			copy_is(r, name, C_CONFIRMED);
		} else if (sscanf(line, "skipped %299s", name) == 1) {
			copy_is(r, name, C_SKIPPED);
		} else if (sscanf(line, "begun %299s", name) == 1) {
			copy_is(r, name, C_PENDING);
		}
	}
	fclose(f);
	if (!ok || !r->seq) {
		log_warn("%s: not a commit record; ignored", path);
		repl_rec_free(r);
		return -EINVAL;
	}
	insert_sorted(r);
	return 0;
}

int repl_rec_load_all(void)
{
	char dir[4096], sub[4400], path[4700];
	struct dirent *je, *se;
	DIR *jd, *sd;
	const char *w;

	rec_path(dir, sizeof(dir), "", NULL);
	jd = opendir(dir);
	if (!jd)
		return errno == ENOENT ? 0 : -errno;
	while ((je = readdir(jd))) {
		if (config_check_name(je->d_name, &w) < 0)
			continue;
		snprintf(sub, sizeof(sub), "%s%s", dir, je->d_name);
		sd = opendir(sub);
		if (!sd)
			continue;
		while ((se = readdir(sd))) {
			if (config_check_name(se->d_name, &w) < 0)
				continue;       /* .STEP.tmp: a save that did not finish */
			snprintf(path, sizeof(path), "%s/%s", sub, se->d_name);
			load_one(je->d_name, se->d_name, path);
		}
		closedir(sd);
	}
	closedir(jd);
	return 0;
}

void repl_rec_retain(const char *job)
{
	unsigned n = 0;

	for (struct record *r = repl.records; r; r = r->next)
		if (strcmp(r->job, job) == 0)
			n++;
	while (n > (unsigned)repl.cfg->keep) {
		struct record **oldest = NULL;

		for (struct record **pp = &repl.records; *pp; pp = &(*pp)->next)
			if (strcmp((*pp)->job, job) == 0 &&
			    (!oldest || ckpt_step_cmp((*pp)->step, (*oldest)->step) < 0))
				oldest = pp;
		if (!oldest)
			break;
		{
			struct record *r = *oldest;

			/* A copy being sent finishes on its own; it just is not kept. */
			*oldest = r->next;
			repl_rec_remove(r->job, r->step);
			for (size_t i = 0; i < repl.npartners; i++)
				if (r->copies[i].state == C_SENDING)
					r->copies[i].state = C_FAILED;
			repl_rec_free(r);
		}
		n--;
	}
}
