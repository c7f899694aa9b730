/* The record of a deep verify: see damage.h. */
#include "daemon/pull/damage.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/fs/cred.h"
#include "common/manifest.h"

/* Each verify writes its own temporary (two deep verifies of one step may
 * run at once: the cluster's and a local one); the last rename wins, and
 * each is whole. */
static void new_name(char *out, size_t cap)
{
	snprintf(out, cap, DAMAGE_NAME ".new.%ld", (long)gettid());
}

#define MAGIC "stage-damage 1"

static int64_t ctime_of(const struct stat *st)
{
	return (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
}

/* "manifest INO SIZE CTIME" of the manifest mf as it is now. */
static int manifest_id(int stage_fd, const char *mf, char *out, size_t cap)
{
	struct stat st;

	if (fstatat(stage_fd, mf, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	snprintf(out, cap, "manifest %llu %lld %" PRId64, (unsigned long long)st.st_ino,
		 (long long)st.st_size, ctime_of(&st));
	return 0;
}

static int ent_cmp(const void *a, const void *b)
{
	return mf_path_cmp(((const struct damage_ent *)a)->rel, ((const struct damage_ent *)b)->rel);
}

void damage_free(struct damage *d)
{
	for (size_t i = 0; i < d->n; i++) {
		free(d->v[i].rel);
		free(d->v[i].bad);
	}
	free(d->v);
	d->v = NULL;
	d->n = 0;
}

/* A decimal number at s, digits only (no sign, no space), below 2^48. */
static int num(const char *s, char **end, uint64_t *v)
{
	unsigned long long x;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	x = strtoull(s, end, 10);
	if (errno || x >= (1ull << 48))
		return -EINVAL;
	*v = x;
	return 0;
}

/* "a,b-c,..." into e->bad, ascending; "-" is the file whole. *budget:
 * chunk numbers the whole record may still hold (the file's lines are
 * short; what they expand to is bounded here). 0 or -EINVAL/-ENOMEM. */
static int parse_chunks(struct damage_ent *e, char *s, uint64_t *budget)
{
	size_t cap = 0;
	char *save = NULL;

	if (strcmp(s, "-") == 0)
		return 0;
	for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *end;
		uint64_t a, b;

		if (num(tok, &end, &a) < 0)
			return -EINVAL;
		b = a;
		if (*end == '-' && num(end + 1, &end, &b) < 0)
			return -EINVAL;
		if (*end || b < a || (e->nbad && a <= e->bad[e->nbad - 1]) ||
		    b - a >= *budget || e->nbad + (b - a) >= DAMAGE_MAX)
			return -EINVAL;
		*budget -= b - a + 1;
		for (uint64_t k = a;; k++) {
			if (e->nbad == cap) {
				uint64_t *v = realloc(e->bad, (cap ? 2 * cap : 16) * sizeof(*v));

				if (!v)
					return -ENOMEM;
				e->bad = v;
				cap = cap ? 2 * cap : 16;
			}
			e->bad[e->nbad++] = k;
			if (k == b)
				break;
		}
	}
	return 0;
}

/* One "damaged|unreadable INO CTIME CHUNKS PATH" line. */
static int parse_ent(struct damage_ent *e, char *line, uint64_t *budget)
{
	char kind[16], *chunks, *path;
	unsigned long long ino;
	long long ct;
	int n = 0, len;

	if (sscanf(line, "%15s %llu %lld %n", kind, &ino, &ct, &n) != 3 || !n)
		return -EINVAL;
	if (strcmp(kind, "damaged") && strcmp(kind, "unreadable"))
		return -EINVAL;
	chunks = line + n;
	path = strchr(chunks, ' ');
	if (!path)
		return -EINVAL;
	*path++ = '\0';
	e->ino = ino;
	e->ctime_ns = ct;
	e->unreadable = kind[0] == 'u';
	len = mf_unescape(path, strlen(path));
	if (len <= 0)
		return -EINVAL;
	path[len] = '\0';
	if (!(e->rel = strdup(path)))
		return -ENOMEM;
	return parse_chunks(e, chunks, budget);
}

int damage_load(struct damage *d, int stage_fd, const char *mf)
{
	char want[128], *line = malloc(MF_MAX_LINE);
	uint64_t budget = DAMAGE_CHUNKS_MAX;
	struct stat st;
	size_t cap = 0;
	bool ended = false;
	int fd, rc = 0, no = 0;
	FILE *f = NULL;

	*d = (struct damage){ .stage_fd = -1 };
	if (!line)
		return -ENOMEM;
	/* Non-blocking: a fifo in its place must not hang the restore. Only a
	 * regular file written by the user this thread acts as, or by root (the
	 * daemon's own verify), is read. */
	fd = openat(stage_fd, DAMAGE_NAME, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
	    (st.st_uid != cred_uid() && st.st_uid != 0) ||
	    manifest_id(stage_fd, mf, want, sizeof(want)) < 0 || !(f = fdopen(fd, "r"))) {
		if (fd >= 0)
			close(fd);
		free(line);
		return -ENOENT;
	}
	while (rc == 0 && !ended && fgets(line, MF_MAX_LINE, f)) {
		size_t len = strlen(line);
		long long since;

		if (!len || line[len - 1] != '\n') {
			rc = -EINVAL;           /* cut off, or longer than any we write */
			break;
		}
		line[--len] = '\0';
		no++;
		if (no == 1)
			rc = strcmp(line, MAGIC) ? -EINVAL : 0;
		else if (no == 2)
			rc = strcmp(line, want) ? -ENOENT : 0;     /* another manifest */
		else if (no == 3)
			rc = sscanf(line, "since %lld", &since) == 1 ? (d->since = since, 0) : -EINVAL;
		else if (strcmp(line, "end") == 0)
			ended = true;
		else if (d->n == DAMAGE_MAX)
			rc = -ENOENT;           /* more than is kept: not used */
		else {
			if (d->n == cap) {
				struct damage_ent *v = realloc(d->v, (cap ? 2 * cap : 16) * sizeof(*v));

				if (!v) {
					rc = -ENOMEM;
					break;
				}
				d->v = v;
				cap = cap ? 2 * cap : 16;
			}
			d->v[d->n] = (struct damage_ent){ 0 };
			rc = parse_ent(&d->v[d->n], line, &budget);
			d->n++;
		}
	}
	fclose(f);
	free(line);
	/* Its since was read from its own temporary, which it was renamed
	 * from: a since later than the file's ctime is not one we wrote. */
	if (rc == 0 && (!ended || d->since > ctime_of(&st)))
		rc = -ENOENT;
	if (rc < 0) {
		damage_free(d);
		return rc == -ENOMEM ? rc : -ENOENT;
	}
	if (d->n)               /* qsort's base may not be NULL, even for none */
		qsort(d->v, d->n, sizeof(*d->v), ent_cmp);
	return 0;
}

const struct damage_ent *damage_find(const struct damage *d, const char *rel)
{
	size_t lo = 0, hi = d->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = mf_path_cmp(d->v[mid].rel, rel);

		if (c == 0)
			return &d->v[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

int damage_start(struct damage *d, int stage_fd, const char *mf)
{
	char id[128];
	struct stat st;
	int fd, rc = manifest_id(stage_fd, mf, id, sizeof(id));

	d->out = NULL;
	d->stage_fd = stage_fd;
	if (rc < 0)
		return rc;
	new_name(d->tmp, sizeof(d->tmp));
	/* A fresh file: whatever stands under the name (a fifo, a hard link
	 * to another file) is unlinked, not opened. */
	unlinkat(stage_fd, d->tmp, 0);
	fd = openat(stage_fd, d->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	/* The kernel's time now, on the clock it stamps every change with. */
	if (fstat(fd, &st) < 0 || !(d->out = fdopen(fd, "w"))) {
		rc = -errno;
		close(fd);
		unlinkat(stage_fd, d->tmp, 0);
		return rc;
	}
	d->since = ctime_of(&st);
	d->mf = mf;
	snprintf(d->mf_id, sizeof(d->mf_id), "%s", id);
	fprintf(d->out, MAGIC "\n%s\nsince %" PRId64 "\n", id, d->since);
	return 0;
}

void damage_abort(struct damage *d)
{
	if (!d->out)
		return;
	fclose(d->out);
	d->out = NULL;
	unlinkat(d->stage_fd, d->tmp, 0);
}

/* bad[0..nbad) as runs "a,b-c,..." into out (cap bytes): false when it
 * does not fit (or there is none). */
static bool chunk_list(const uint64_t *bad, uint64_t nbad, char *out, size_t cap)
{
	size_t o = 0;

	for (uint64_t i = 0, k; i < nbad; i = k) {
		int w;

		for (k = i + 1; k < nbad && bad[k] == bad[k - 1] + 1; k++)
			;
		w = k - i > 1 ? snprintf(out + o, cap - o, "%s%llu-%llu", i ? "," : "",
					 (unsigned long long)bad[i], (unsigned long long)bad[k - 1])
			      : snprintf(out + o, cap - o, "%s%llu", i ? "," : "",
					 (unsigned long long)bad[i]);
		if (w < 0 || (size_t)w >= cap - o)
			return false;
		o += (size_t)w;
	}
	return nbad > 0;
}

void damage_add(struct damage *d, const char *rel, uint64_t ino, int64_t ctime_ns,
		bool unreadable, const uint64_t *bad, uint64_t nbad)
{
	size_t n = strlen(rel), cap = 3 * n + 1, lcap = MF_MAX_LINE - 64 - cap;
	char *esc = malloc(cap + lcap);

	if (!d->out)
		goto out;
	if (!esc || mf_escape(rel, n, esc, cap) < 0) {
		/* A record without this finding would lie: there is none. */
		damage_abort(d);
		goto out;
	}
	/* A list too long for a line names the file whole. */
	if (unreadable || !chunk_list(bad, nbad, esc + cap, lcap))
		strcpy(esc + cap, "-");
	fprintf(d->out, "%s %llu %" PRId64 " %s %s\n", unreadable ? "unreadable" : "damaged",
		(unsigned long long)ino, ctime_ns, esc + cap, esc);
out:
	free(esc);
}

int damage_commit(struct damage *d)
{
	char id[128];
	int rc;

	if (!d->out)
		return -EIO;
	/* A commit of the step while the verify ran: what it read may be of
	 * either manifest, so it vouches for neither. */
	if (manifest_id(d->stage_fd, d->mf, id, sizeof(id)) < 0 || strcmp(id, d->mf_id)) {
		damage_abort(d);
		return -ESTALE;
	}
	fputs("end\n", d->out);
	rc = fflush(d->out) == 0 && !ferror(d->out) ? 0 : -EIO;
	fclose(d->out);
	d->out = NULL;
	if (rc == 0 && renameat(d->stage_fd, d->tmp, d->stage_fd, DAMAGE_NAME) < 0)
		rc = -errno;
	if (rc < 0)
		unlinkat(d->stage_fd, d->tmp, 0);
	return rc;
}

void damage_remove(int stage_fd)
{
	unlinkat(stage_fd, DAMAGE_NAME, 0);
}
