/* stage verify on this node: a staged tree (or checkpoint) against its
 * manifest. Fast mode compares types, sizes, mtimes and link targets; deep
 * mode also re-reads and re-hashes every byte through the copier, and on a
 * checkpoint leaves a record of what it found (damage.h) that a restore
 * right after it uses instead of reading everything again. */
#ifndef STAGE_VERIFY_H
#define STAGE_VERIFY_H

#include <stdbool.h>

#include "common/digest.h"
#include "daemon/job/job.h"

/* One entry that does not match. kind: "missing", "unexpected", "changed",
 * "damaged", "unreadable". For "damaged", the numbers of the chunks whose
 * bytes no longer match the manifest, ascending (nbad of them), so that a
 * repair can fetch those only; nbad 0: the file as a whole (a file of one
 * chunk, or chunks that match under a file digest that does not). */
struct verify_finding {
	const char *kind, *rel, *detail;   /* detail may be NULL */
	const uint64_t *bad;
	uint64_t nbad;
};
typedef void (*verify_bad_fn)(const struct verify_finding *f, void *arg);

struct verify_opts {
	bool deep;                 /* re-hash every byte */
	bool direct;               /* deep reads with O_DIRECT where possible */
	verify_bad_fn bad;         /* may be NULL: hears of every entry that does not match */
	void *arg;
	const char *manifest;      /* its name in .stage; NULL: "manifest" */
	bool count;                /* a verify a client asked for: its findings go in the
				    * metrics (a restore's or a holder's own checks do not) */
	digest_t *root;            /* may be NULL: the manifest's root, once read whole */
	/* deep only (damage.h): */
	bool record;               /* leave the record of what was found, for a restore */
	bool trust;                /* take the last record's word for what it covers */
	uint64_t *trusted;         /* may be NULL: files so taken, not read again */
};

/* Verifies the tree at dirfd (path is for messages) against its manifest,
 * sending each finding as a note. Returns 0 verified, 1 findings, -errno
 * when it could not verify at all (the reason was sent as a note; -EBADMSG:
 * the manifest is damaged, -ENOENT: there is none). */
int verify_tree(struct job *j, const char *path, int dirfd, const struct verify_opts *o);
/* Serves one MSG_VERIFY_REQ (sends the result). */
void verify_run(struct job *j, const char *path_arg);

#endif
