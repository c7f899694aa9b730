#include "client/cli_manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/cli_args.h"
#include "client/cli_json.h"

int cli_manifest_xxhsum(FILE *f, const struct mf_entry *e)
{
	char hex[DIGEST_HEX_LEN + 1];

	if (e->type != MF_FILE)
		return 0;
	/* xxhsum 0.8.1 reads a line per entry and has no escape for a newline
	 * (0.8.2's leading-backslash form is not understood by 0.8.1). Leading,
	 * trailing and repeated spaces, tabs, CRs and backslashes all read back. */
	if (strchr(e->path, '\n'))
		return -EINVAL;
	digest_to_hex(e->digest, hex);
	fprintf(f, "%s  %s\n", hex, e->path);
	return 0;
}

void cli_manifest_json(FILE *f, const struct mf_entry *e)
{
	char hex[DIGEST_HEX_LEN + 1], mode[8];
	struct cli_json j;

	cli_json_begin(&j, f, NULL);
	cli_json_strn(&j, "type", &e->type, 1);
	cli_json_str(&j, "path", e->path);
	cli_json_u64(&j, "size", e->size);
	snprintf(mode, sizeof(mode), "%04o", (unsigned)(e->mode & 07777));
	cli_json_str(&j, "mode", mode);
	/* mtimes before 1970 are negative; JSON numbers carry the sign. */
	cli_json_key(&j, "mtime_ns", strlen("mtime_ns"));
	fprintf(f, "%" PRId64, e->mtime_ns);
	if (e->type != MF_DIR) {
		digest_to_hex(e->digest, hex);
		cli_json_str(&j, "digest", hex);
	}
	if (e->target)
		cli_json_str(&j, "target", e->target);
	cli_json_end(&j);
}

/* Tells which entry could not be written, by its name as the manifest
 * escapes it (the raw one may be unprintable). */
static void skipped(FILE *err, const char *path)
{
	size_t n = strlen(path), cap = 3 * n + 1;
	char *esc = malloc(cap);

	if (esc && mf_escape(path, n, esc, cap) >= 0)
		fprintf(err, "stage: cannot express %s in xxhsum format, skipped\n", esc);
	else
		fputs("stage: cannot express an entry in xxhsum format, skipped\n", err);
	free(esc);
}

/* The manifest as it is on disk; fd is the very file the reader checked. */
static int copy_out(int fd, FILE *out)
{
	char buf[64 * 1024];
	off_t off = 0;
	ssize_t n;

	while ((n = pread(fd, buf, sizeof(buf), off)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (fwrite(buf, 1, (size_t)n, out) != (size_t)n)
			break;  /* the caller reports a failed stdout */
		off += n;
	}
	return 0;
}

/* Reads every entry, writing each in the format asked for as it goes. 0, or
 * -errno after reporting it; *nskipped counts entries xxhsum cannot take. */
static int read_all(struct cli_out *o, struct mf_reader *r, const char *label, bool xxhsum,
		    unsigned long *nskipped)
{
	struct mf_entry e;
	int rc;

	while ((rc = mf_reader_next(r, &e)) == 1) {
		if (o->json) {
			cli_manifest_json(o->out, &e);
		} else if (xxhsum && cli_manifest_xxhsum(o->out, &e) < 0) {
			skipped(o->err, e.path);
			++*nskipped;
		}
		mf_entry_free(&e);
		if (ferror(o->out))
			return 0;       /* nobody is reading: stop; main reports it */
	}
	if (rc < 0) {
		if (*mf_reader_why(r))
			cli_out_fail(o, CLI_EXIT_FAILED, "%s", mf_reader_why(r));
		else
			cli_out_fail(o, CLI_EXIT_FAILED, "cannot read %s: %s", label, strerror(-rc));
	}
	return rc;
}

int cli_manifest_run(struct cli_out *o, const char *root, bool xxhsum)
{
	char *label = NULL;
	struct mf_reader *r;
	unsigned long nskipped = 0;
	int dirfd, fd, rc = CLI_EXIT_FAILED;
	FILE *fp;

	dirfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0) {
		cli_out_fail(o, CLI_EXIT_FAILED, "cannot open %s: %s", root, strerror(errno));
		return CLI_EXIT_FAILED;
	}
	if (asprintf(&label, "%s%s%s", root, strcmp(root, "/") ? "/" : "", MF_NAME) < 0) {
		label = NULL;
		cli_out_fail(o, CLI_EXIT_FAILED, "out of memory");
		goto out_close_dir;
	}
	fd = openat(dirfd, MF_NAME, O_RDONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT) {
		cli_out_fail(o, CLI_EXIT_FAILED,
			     "%s has no manifest (%s): not a staged tree, or its pull did not finish",
			     root, label);
		goto out_free_label;
	}
	if (fd < 0 || !(fp = fdopen(fd, "r"))) {
		cli_out_fail(o, CLI_EXIT_FAILED, "cannot open %s: %s", label, strerror(errno));
		if (fd >= 0)
			close(fd);
		goto out_free_label;
	}
	if (mf_reader_open_fp(&r, fp, label, MF_COMPLETE) < 0) {
		cli_out_fail(o, CLI_EXIT_FAILED, "cannot read %s: %s", label, strerror(ENOMEM));
		goto out_fclose;
	}
	if (read_all(o, r, label, xxhsum, &nskipped) < 0)
		goto out_reader_close;
	if (o->json) {
		char hex[DIGEST_HEX_LEN + 1];
		struct cli_json j;

		digest_to_hex(mf_reader_root(r), hex);
		cli_json_begin(&j, o->out, "result");
		cli_json_u64(&j, "code", CLI_EXIT_OK);
		cli_json_str(&j, "root", hex);
		cli_json_u64(&j, "entries", mf_reader_count(r));
		cli_json_end(&j);
	} else if (!xxhsum && (rc = copy_out(fd, o->out)) < 0) {
		cli_out_fail(o, CLI_EXIT_FAILED, "cannot read %s: %s", label, strerror(-rc));
		rc = CLI_EXIT_FAILED;
		goto out_reader_close;
	}
	rc = nskipped ? CLI_EXIT_FAILED : CLI_EXIT_OK;
out_reader_close:
	mf_reader_close(r);
out_fclose:
	fclose(fp);
out_free_label:
	free(label);
out_close_dir:
	close(dirfd);
	return rc;
}
