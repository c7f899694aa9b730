/* resume_run: survey every node of every step of the job, decide
 * (resume_decide.c), repair the origins whose own copy is not intact (all
 * at once, each by the restore `stage restore` runs: in place here, over a
 * peer connection elsewhere), and answer with this node's path of the step.
 * resume_serve: the repaired node's side. */
#include "daemon/fs/cred.h"
#include "daemon/restore/resume.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hostlist.h"
#include "common/log.h"
#include "daemon/ckpt/ckpt.h"
#include "daemon/restore/restore.h"
#include "daemon/survey/hold.h"
#include "daemon/net/peer.h"
#include "daemon/repl/repl.h"
#include "daemon/peers/peers.h"

#define RESTORE_ASK_MS (6 * 3600 * 1000)   /* a restore of a big step takes its time */

/* One thing asked of an origin: restore its own copy from a holder
 * (MSG_RESTORE_ASK), or send its copy again to a partner that lost it
 * (MSG_RESEND_ASK). This node does it in place, the others over the wire. */
struct repair {
	uint16_t type;              /* MSG_RESTORE_ASK or MSG_RESEND_ASK */
	const char *node;           /* the origin asked */
	const char *other;          /* the holder restored from, or the partner sent to */
	digest_t root;              /* MSG_RESTORE_ASK: the commit to restore */
	const char *job, *step;
	const struct cred *who;     /* the user it is done for (fs/cred.h), borrowed; NULL:
				     * the daemon. Here, the thread's own; there, named */
	pthread_t thread;
	bool started;
	int code;                   /* an exit code: 0 done, 1 failed, 2 refused */
	char text[1024];
};

static void do_here(struct repair *r)
{
	char path[8192];
	struct job sub;

	if (r->type == MSG_RESEND_ASK) {
		int rc = repl_resend(r->job, r->step, r->other, r->text, sizeof(r->text));

		r->code = rc == 0 ? 0 : rc == -ENOENT ? 2 : 1;
		if (rc == 0)
			snprintf(r->text, sizeof(r->text), "%s/%s sent to %s again, confirmed there",
				 r->job, r->step, r->other);
		return;
	}
	/* The same restore a client asks for, as work of this node's own. */
	snprintf(path, sizeof(path), "%s/%s/%s", peers.cfg->ckpt_root, r->job, r->step);
	job_begin(&sub, -1, 0, peers.cfg, "restore", path);
	sub.code = 1;
	snprintf(sub.result, sizeof(sub.result), "the restore ended without a result");
	restore_pinned(&sub, path, r->other, &r->root);
	r->code = sub.code;
	snprintf(r->text, sizeof(r->text), "%s", sub.result);
	job_end(&sub);
}

static void do_there(struct repair *r)
{
	ssize_t h = hosts_find(&peers.hosts, r->node);
	uint64_t code = 1;
	struct xport *x;
	struct msg m;
	char *text = NULL;
	int rc;

	r->code = 1;
	if (h < 0) {
		snprintf(r->text, sizeof(r->text), "not in the hosts file");
		return;
	}
	rc = peers_dial((size_t)h, PEERS_CONNECT_MS, RESTORE_ASK_MS, &x, r->text, sizeof(r->text));
	if (rc < 0)
		return;
	msg_init(&m, r->type);
	msg_put_str(&m, K_JOB, r->job);
	msg_put_str(&m, K_STEP, r->step);
	msg_put_str(&m, K_HOLDER, r->other);
	if (r->type == MSG_RESTORE_ASK) {
		char hex[DIGEST_HEX_LEN + 1];

		digest_to_hex(r->root, hex);
		msg_put_str(&m, K_ROOT, hex);
	}
	if (r->who)
		cred_to_msg(&m, r->who);
	rc = x->ops->send(x, &m);
	msg_free(&m);
	if (rc == 0)
		rc = x->ops->recv(x, &m);
	if (rc < 0) {
		snprintf(r->text, sizeof(r->text), "%s", rc == -ENOTCONN ?
			 "closed the connection (staged of another version?)" : strerror(-rc));
	} else if (m.type == MSG_ERROR) {
		peer_refused(&m, r->node, r->text, sizeof(r->text));
		msg_free(&m);
	} else if (m.type != MSG_ASK_DONE || msg_get_u64(&m, K_CODE, &code) < 0 ||
		   msg_get_str(&m, K_TEXT, &text) < 0) {
		snprintf(r->text, sizeof(r->text), "a malformed answer (frame type %u)", m.type);
		msg_free(&m);
	} else {
		r->code = code > 2 ? 1 : (int)code;
		snprintf(r->text, sizeof(r->text), "%s", text);
		free(text);
		msg_free(&m);
	}
	x->ops->close(x);
}

static void *repair_main(void *arg)
{
	struct repair *r = arg;

	pthread_setname_np(pthread_self(), "resume repair");
	if (strcmp(r->node, peers.cfg->name) == 0)
		do_here(r);
	else
		do_there(r);
	return NULL;
}

/* resume_decide's input from a flattened survey (the arrays stay f's). */
static void take(struct resume_in *in, const struct survey_flat *f)
{
	in->names = f->names;
	in->reached = f->reached;
	in->nnodes = f->nnodes;
	in->cells = f->cells;
	in->ncells = f->ncells;
}

/* Every repair at once, a thread each (what cannot get a thread is done
 * here and now). Returns how many failed, each named in a note. */
static size_t run_all(struct job *j, struct repair *r, size_t n)
{
	struct cred *who = cred_of_thread();      /* the kernel's: for a daemon that
						   * does not switch, its own */
	size_t failed = 0;

	if (!who) {
		job_note(j, LOG_ERROR, NULL, NULL, "out of memory: no repair asked");
		return n;
	}
	for (size_t i = 0; i < n; i++) {
		/* Each node repairs as the user who asked for the resume, as
		 * this node does (the threads inherit the credentials). */
		r[i].who = who;
		r[i].started = pthread_create(&r[i].thread, NULL, repair_main, &r[i]) == 0;
		if (!r[i].started)
			repair_main(&r[i]);
	}
	for (size_t i = 0; i < n; i++) {
		if (r[i].started)
			pthread_join(r[i].thread, NULL);
		/* Not findings (stdout's lines): the path must be all that
		 * `CKPT=$(stage resume JOB)` captures. */
		if (r[i].code == 0) {
			job_note(j, LOG_INFO, NULL, NULL, "%s: %s", r[i].node, r[i].text);
		} else {
			failed++;
			job_note(j, LOG_ERROR, NULL, NULL, "%s: %s %s/%s %s %s failed: %s", r[i].node,
				 r[i].type == MSG_RESTORE_ASK ? "the restore of" : "sending",
				 r[i].job, r[i].step, r[i].type == MSG_RESTORE_ASK ? "from" : "again to",
				 r[i].other, r[i].text);
		}
	}
	free(who);
	return failed;
}

/* The repairs of the decision: first each origin's own copy (restores),
 * then the replicas partners lost (sends, which need the origin's copy
 * whole). Returns (restores failed, sends failed). */
static size_t repair_all(struct job *j, const char *job, const struct resume_out *out,
			 size_t *sends_failed)
{
	size_t n = out->nfix > out->nsend ? out->nfix : out->nsend;
	struct repair *r = calloc(n ? n : 1, sizeof(*r));
	size_t failed;

	*sends_failed = out->nsend;
	if (!r) {
		job_note(j, LOG_ERROR, NULL, NULL, "out of memory for the repairs");
		return out->nfix;
	}
	atomic_store(&j->phase, "restore");
	for (size_t i = 0; i < out->nfix; i++)
		r[i] = (struct repair){ .type = MSG_RESTORE_ASK, .node = out->fix[i].origin,
					.other = out->fix[i].from, .root = out->fix[i].root,
					.job = job, .step = out->step };
	failed = run_all(j, r, out->nfix);
	if (!failed) {
		for (size_t i = 0; i < out->nsend; i++)
			r[i] = (struct repair){ .type = MSG_RESEND_ASK, .node = out->send[i].origin,
						.other = out->send[i].to, .job = job,
						.step = out->step };
		*sends_failed = run_all(j, r, out->nsend);
	}
	free(r);
	return failed;
}

static bool has_ok(const struct hold_cell *cells, size_t n, const char *origin,
		   const char *holder, const char *step)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(cells[i].origin, origin) == 0 && strcmp(cells[i].holder, holder) == 0 &&
		    cells[i].step && strcmp(cells[i].step, step) == 0 &&
		    strcmp(cells[i].state, "ok") == 0)
			return true;
	return false;
}

void resume_holdings(struct job *j, const char *job, const char *step,
		     const struct hold_cell *cells, size_t ncells)
{
	const char *self = peers.cfg->name;
	struct repair *r = calloc(peers.hosts.n ? peers.hosts.n : 1, sizeof(*r));
	size_t n = 0;

	if (!r)
		return;
	for (size_t h = 0; h < peers.hosts.n; h++) {
		const char *o = peers.hosts.v[h].name, *place[64];
		size_t np = survey_placement(o, place, 64);
		bool placed = false;

		for (size_t k = 0; k < np; k++)
			placed |= strcmp(place[k], self) == 0;
		if (placed && strcmp(o, self) != 0 && has_ok(cells, ncells, o, o, step) &&
		    !has_ok(cells, ncells, o, self, step))
			r[n++] = (struct repair){ .type = MSG_RESEND_ASK, .node = o, .other = self,
						  .job = job, .step = step };
	}
	if (n)
		run_all(j, r, n);
	free(r);
}

/* --deep: the fast choice confirmed by reading every byte of that step on
 * every node, the next newest tried when it fails. On 0, *out is the deep
 * decision (its fixes from the deep states; its strings live in *keep, the
 * deep answers, which the caller frees); on 1 the last fast one, with no
 * step. -errno as resume_decide. */
static int confirm_deep(struct job *j, const char *job, struct resume_in *in,
			struct resume_out *out, struct survey_answer **keep, size_t *nkeep)
{
	char skipped[HOLD_STEPS_MAX][CKPT_NAME_MAX + 1];
	const char *skip[HOLD_STEPS_MAX];
	bool confirmed = false;
	int rc = 0;

	in->skip = skip;
	in->nskip = 0;
	while (out->step && in->nskip < HOLD_STEPS_MAX) {
		struct survey_answer *dans = NULL;
		/* The job's nodes as the fast look found them: a node with
		 * nothing of this step is still one of them. */
		struct resume_in din = { .origins = out->origins, .norigins = out->norigins,
					 .placement = in->placement };
		struct resume_out dout = { 0 };
		struct survey_flat df = { 0 };
		size_t dn = 0;

		atomic_store(&j->phase, "ask --deep");
		snprintf(skipped[in->nskip], sizeof(skipped[0]), "%s", out->step);
		rc = survey_ask(job, skipped[in->nskip], true, NULL, &dans, &dn);
		if (rc == 0)
			rc = survey_flatten(dans, dn, &df);
		if (rc == 0) {
			take(&din, &df);
			rc = resume_decide(&din, &dout);
		}
		survey_flat_free(&df);
		if (rc == 0) {
			resume_out_free(out);
			*out = dout;
			*keep = dans;
			*nkeep = dn;
			confirmed = true;
			break;
		}
		for (size_t i = 0; rc == 1 && i < dout.nwhy; i++)
			job_note(j, LOG_WARN, NULL, NULL, "%s (every byte read)", dout.why[i]);
		resume_out_free(&dout);
		survey_answers_free(dans, dn);
		if (rc < 0)
			break;
		skip[in->nskip] = skipped[in->nskip];
		in->nskip++;
		resume_out_free(out);
		if ((rc = resume_decide(in, out)) < 0)
			break;
	}
	in->skip = NULL;        /* skipped[] ends with this call */
	in->nskip = 0;
	return rc < 0 ? rc : confirmed ? 0 : 1;
}

void resume_run(struct job *j, const char *job, const char *nodes)
{
	bool dry = j->flags & REQ_DRYRUN;
	struct resume_in in = { 0 };
	struct resume_out out = { 0 };
	struct survey_answer *ans = NULL, *deep = NULL;
	struct survey_flat flat = { 0 };
	char why[1024], path[8192], **names = NULL;
	size_t nans = 0, nnames = 0, ndeep = 0;
	const char *w;
	int rc;

	if (config_check_name(job, &w) < 0 || strlen(job) > CKPT_NAME_MAX) {
		job_result(j, 2, NULL, NULL, "resume: '%.*s' is not a job name (%s): a job is "
			   "the JOB of ckpt_root/JOB/STEP", 200, job, w);
		return;
	}
	rc = survey_nodes(nodes, &names, &nnames, why, sizeof(why));
	if (rc < 0) {
		job_result(j, rc == -EINVAL ? 2 : 1, NULL, NULL, "resume %s: %s", job,
			   rc == -EINVAL ? why : strerror(-rc));
		return;
	}
	job_set_what(j, "%s on every node", job);
	atomic_store(&j->phase, "ask");
	rc = survey_ask(job, NULL, false, NULL, &ans, &nans);
	if (rc == 0)
		rc = survey_flatten(ans, nans, &flat);
	if (rc == 0) {
		take(&in, &flat);
		in.placement = survey_placement;
		in.origins = (const char *const *)names;
		in.norigins = nnames;
		rc = resume_decide(&in, &out);
	}
	if (rc == 0 && (j->flags & REQ_DEEP))
		rc = confirm_deep(j, job, &in, &out, &deep, &ndeep);
	if (rc < 0) {
		job_result(j, 1, NULL, NULL, "resume %s: %s", job, strerror(-rc));
		goto out;
	}
	for (size_t i = 0; i < nans; i++)
		if (ans[i].err)
			job_note(j, LOG_WARN, NULL, NULL, "%s could not be asked: %s", ans[i].node,
				 ans[i].why);
	for (size_t i = 0; i < out.nwhy; i++)
		job_note(j, rc == 1 ? LOG_ERROR : LOG_WARN, NULL, NULL, "%s", out.why[i]);
	if (rc == 1) {
		job_result(j, 1, NULL, NULL, "%s cannot resume: no step is intact somewhere for "
			   "every one of its %zu node%s (why: above)", job, out.norigins,
			   out.norigins == 1 ? "" : "s");
		goto out;
	}
	snprintf(path, sizeof(path), "%s/%s/%s", peers.cfg->ckpt_root, job, out.step);
	if (dry) {
		for (size_t i = 0; i < out.nfix; i++)
			job_note(j, LOG_INFO, NULL, NULL, "would restore %s/%s on %s from %s", job,
				 out.step, out.fix[i].origin, out.fix[i].from);
		for (size_t i = 0; i < out.nsend; i++)
			job_note(j, LOG_INFO, NULL, NULL, "would have %s send its %s/%s to %s again",
				 out.send[i].origin, job, out.step, out.send[i].to);
		job_result(j, 0, path, NULL, "%s resumes from %s: %zu of %zu node%s to repair, %zu "
			   "cop%s to send again (a dry run: nothing was changed)", job, out.step,
			   out.nfix, out.norigins, out.norigins == 1 ? "" : "s", out.nsend,
			   out.nsend == 1 ? "y" : "ies");
	} else {
		size_t sends_failed, failed = repair_all(j, job, &out, &sends_failed);

		if (failed)
			job_result(j, 1, NULL, NULL, "%s/%s: not every node could be repaired "
				   "(above); nothing else was changed", job, out.step);
		else
			/* A replica that could not be queued again costs redundancy,
			 * not the resume: said above, and `verify --cluster` says it
			 * until the next commit. */
			job_result(j, 0, path, NULL, "%s resumes from %s on %zu node%s (%zu repaired, "
				   "%zu cop%s sent again%s)", job, out.step, out.norigins,
				   out.norigins == 1 ? "" : "s", out.nfix,
				   out.nsend - sends_failed, out.nsend - sends_failed == 1 ? "y" : "ies",
				   sends_failed ? "; some could not be: above" : "");
	}
out:
	resume_out_free(&out);
	survey_flat_free(&flat);
	survey_answers_free(deep, ndeep);
	survey_answers_free(ans, nans);
	hostlist_free(names, nnames);
}

int resume_serve(struct xport *x, const char *peer, const struct msg *req)
{
	char job[CKPT_NAME_MAX + 1], step[CKPT_NAME_MAX + 1], other[CKPT_NAME_MAX + 1];
	struct repair r = { .type = req->type, .node = peers.cfg->name, .other = other,
			    .job = job, .step = step };
	bool restore = req->type == MSG_RESTORE_ASK;
	struct cred *who = NULL;
	struct msg m;
	int rc;

	char *hex = NULL;

	if (ckpt_get_name(req, K_JOB, job) < 0 || ckpt_get_name(req, K_STEP, step) < 0 ||
	    ckpt_get_name(req, K_HOLDER, other) < 0 ||
	    (restore && (msg_get_str(req, K_ROOT, &hex) < 0 ||
			 digest_from_hex(hex, strlen(hex), &r.root) < 0))) {
		free(hex);
		log_warn("%s asked by %s refused: no valid job, step or node name",
			 restore ? "a restore" : "a resend", peer);
		peer_send_error(x, EBADMSG, "%s: a malformed request", peers.cfg->name);
		return -EBADMSG;
	}
	free(hex);
	rc = cred_from_msg(req, &who);
	if (rc < 0) {
		log_warn("%s asked by %s refused: a malformed user", restore ? "a restore" :
			 "a resend", peer);
		peer_send_error(x, -rc, "%s: a malformed user", peers.cfg->name);
		return rc;
	}
	log_info("%s asks this node to %s %s/%s %s %s (resume)", peer,
		 restore ? "restore" : "send", job, step, restore ? "from" : "again to", other);
	/* As the user who asked for the resume on the asker's node, which
	 * found them the job's owner there. */
	if (who && (rc = cred_enter(who)) < 0) {
		r.code = 1;
		snprintf(r.text, sizeof(r.text), "%s cannot act as uid %u: %s", peers.cfg->name,
			 (unsigned)who->uid, strerror(-rc));
	} else {
		do_here(&r);
	}
	cred_leave();
	free(who);
	msg_init(&m, MSG_ASK_DONE);
	msg_put_u64(&m, K_CODE, (uint64_t)r.code);
	msg_put_str(&m, K_TEXT, r.text);
	rc = x->ops->send(x, &m);
	msg_free(&m);
	return rc;
}
