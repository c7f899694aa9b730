/* resume_run: survey every node of every step of the job, decide
 * (resume_decide.c), repair the origins whose own copy is not intact (all
 * at once, each by the restore `stage restore` runs: in place here, over a
 * peer connection elsewhere), and answer with this node's path of the step.
 * resume_serve: the repaired node's side. */
#include "daemon/cluster/resume.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hostlist.h"
#include "common/log.h"
#include "daemon/ckpt/ckpt.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/hold.h"
#include "daemon/net/peer.h"
#include "daemon/repl/repl_impl.h"

#define RESTORE_ASK_MS (6 * 3600 * 1000)   /* a restore of a big step takes its time */

struct repair {
	const struct resume_fix *fix;
	const char *job, *step;
	pthread_t thread;
	bool started;
	int code;                   /* the restore's exit code */
	char text[1024];
};

/* This node's own copy, by the same restore a client asks for. */
static void repair_here(struct repair *r)
{
	char path[8192];
	struct job sub;

	snprintf(path, sizeof(path), "%s/%s/%s", repl.cfg->ckpt_root, r->job, r->step);
	job_begin(&sub, -1, 0, repl.cfg, "restore", path);
	sub.code = 1;
	snprintf(sub.result, sizeof(sub.result), "the restore ended without a result");
	repl_restore_run(&sub, path, r->fix->from);
	r->code = sub.code;
	snprintf(r->text, sizeof(r->text), "%s", sub.result);
	job_end(&sub);
}

static void repair_there(struct repair *r)
{
	ssize_t h = hosts_find(&repl.hosts, r->fix->origin);
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
	rc = repl_dial((size_t)h, REPL_CONNECT_MS, RESTORE_ASK_MS, &x, r->text, sizeof(r->text));
	if (rc < 0)
		return;
	msg_init(&m, MSG_RESTORE_ASK);
	msg_put_str(&m, K_JOB, r->job);
	msg_put_str(&m, K_STEP, r->step);
	msg_put_str(&m, K_HOLDER, r->fix->from);
	rc = x->ops->send(x, &m);
	msg_free(&m);
	if (rc == 0)
		rc = x->ops->recv(x, &m);
	if (rc < 0) {
		snprintf(r->text, sizeof(r->text), "%s", rc == -ENOTCONN ?
			 "closed the connection (staged of another version?)" : strerror(-rc));
	} else if (m.type == MSG_ERROR) {
		peer_refused(&m, r->fix->origin, r->text, sizeof(r->text));
		msg_free(&m);
	} else if (m.type != MSG_RESTORE_ANS || msg_get_u64(&m, K_CODE, &code) < 0 ||
		   msg_get_str(&m, K_TEXT, &text) < 0) {
		snprintf(r->text, sizeof(r->text), "a malformed answer (frame type %u)", m.type);
		msg_free(&m);
	} else {
		r->code = code > 3 ? 1 : (int)code;
		snprintf(r->text, sizeof(r->text), "%s", text);
		free(text);
		msg_free(&m);
	}
	x->ops->close(x);
}

static void *repair_main(void *arg)
{
	struct repair *r = arg;

	if (strcmp(r->fix->origin, repl.cfg->name) == 0)
		repair_here(r);
	else
		repair_there(r);
	return NULL;
}

/* resume_decide's input from a flattened survey (the arrays stay f's). */
static void take(struct resume_in *in, const struct repl_flat *f)
{
	in->names = f->names;
	in->reached = f->reached;
	in->nnodes = f->nnodes;
	in->cells = f->cells;
	in->ncells = f->ncells;
}

/* Every repair at once, a thread each. Returns how many failed (each named
 * in a note). */
static size_t repair_all(struct job *j, const char *job, const struct resume_out *out)
{
	struct repair *r = calloc(out->nfix ? out->nfix : 1, sizeof(*r));
	size_t failed = 0;

	if (!r) {
		job_note(j, LOG_ERROR, NULL, NULL, "out of memory for the repairs");
		return out->nfix;
	}
	atomic_store(&j->phase, "restore");
	for (size_t i = 0; i < out->nfix; i++) {
		r[i] = (struct repair){ .fix = &out->fix[i], .job = job, .step = out->step };
		r[i].started = pthread_create(&r[i].thread, NULL, repair_main, &r[i]) == 0;
		if (!r[i].started)
			repair_main(&r[i]);     /* no thread to spare: here and now */
	}
	for (size_t i = 0; i < out->nfix; i++) {
		if (r[i].started)
			pthread_join(r[i].thread, NULL);
		if (r[i].code == 0) {
			/* Not a finding (stdout's lines): the path must be all
			 * that `CKPT=$(stage resume JOB)` captures. */
			job_note(j, LOG_INFO, NULL, NULL, "%s: %s", out->fix[i].origin, r[i].text);
		} else {
			failed++;
			job_note(j, LOG_ERROR, NULL, NULL, "%s: the restore of %s/%s from %s failed: %s",
				 out->fix[i].origin, job, out->step, out->fix[i].from, r[i].text);
		}
	}
	free(r);
	return failed;
}

/* --deep: the fast choice confirmed by reading every byte of that step on
 * every node, the next newest tried when it fails. On 0, *out is the deep
 * decision (its fixes from the deep states; its strings live in *keep, the
 * deep answers, which the caller frees); on 1 the last fast one, with no
 * step. -errno as resume_decide. */
static int confirm_deep(struct job *j, const char *job, struct resume_in *in,
			struct resume_out *out, struct repl_answer **keep, size_t *nkeep)
{
	char skipped[HOLD_STEPS_MAX][CKPT_NAME_MAX + 1];
	const char *skip[HOLD_STEPS_MAX];
	bool confirmed = false;
	int rc = 0;

	in->skip = skip;
	in->nskip = 0;
	while (out->step && in->nskip < HOLD_STEPS_MAX) {
		struct repl_answer *dans = NULL;
		/* The job's nodes as the fast look found them: a node with
		 * nothing of this step is still one of them. */
		struct resume_in din = { .origins = out->origins, .norigins = out->norigins };
		struct resume_out dout = { 0 };
		struct repl_flat df = { 0 };
		size_t dn = 0;

		atomic_store(&j->phase, "ask --deep");
		snprintf(skipped[in->nskip], sizeof(skipped[0]), "%s", out->step);
		rc = repl_survey(job, skipped[in->nskip], true, NULL, &dans, &dn);
		if (rc == 0)
			rc = repl_flatten(dans, dn, &df);
		if (rc == 0) {
			take(&din, &df);
			rc = resume_decide(&din, &dout);
		}
		repl_flat_free(&df);
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
		repl_answers_free(dans, dn);
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
	struct repl_answer *ans = NULL, *deep = NULL;
	struct repl_flat flat = { 0 };
	char why[1024], path[8192], **names = NULL;
	size_t nans = 0, nnames = 0, ndeep = 0;
	const char *w;
	int rc;

	if (config_check_name(job, &w) < 0 || strlen(job) > CKPT_NAME_MAX) {
		job_result(j, 2, NULL, NULL, "resume: '%.*s' is not a job name (%s): a job is "
			   "the JOB of ckpt_root/JOB/STEP", 200, job, w);
		return;
	}
	rc = repl_nodes(nodes, &names, &nnames, why, sizeof(why));
	if (rc < 0) {
		job_result(j, rc == -EINVAL ? 2 : 1, NULL, NULL, "resume %s: %s", job,
			   rc == -EINVAL ? why : strerror(-rc));
		return;
	}
	job_set_what(j, "%s on every node", job);
	atomic_store(&j->phase, "ask");
	rc = repl_survey(job, NULL, false, NULL, &ans, &nans);
	if (rc == 0)
		rc = repl_flatten(ans, nans, &flat);
	if (rc == 0) {
		take(&in, &flat);
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
	snprintf(path, sizeof(path), "%s/%s/%s", repl.cfg->ckpt_root, job, out.step);
	if (dry) {
		for (size_t i = 0; i < out.nfix; i++)
			job_note(j, LOG_INFO, NULL, NULL, "would restore %s/%s on %s from %s", job,
				 out.step, out.fix[i].origin, out.fix[i].from);
		job_result(j, 0, path, NULL, "%s resumes from %s: %zu of %zu node%s to repair "
			   "(a dry run: nothing was changed)", job, out.step, out.nfix, out.norigins,
			   out.norigins == 1 ? "" : "s");
	} else if (repair_all(j, job, &out) > 0) {
		job_result(j, 1, NULL, NULL, "%s/%s: not every node could be repaired (above); "
			   "nothing else was changed", job, out.step);
	} else {
		job_result(j, 0, path, NULL, "%s resumes from %s on %zu node%s (%zu repaired)", job,
			   out.step, out.norigins, out.norigins == 1 ? "" : "s", out.nfix);
	}
out:
	resume_out_free(&out);
	repl_flat_free(&flat);
	repl_answers_free(deep, ndeep);
	repl_answers_free(ans, nans);
	hostlist_free(names, nnames);
}

int resume_serve(struct xport *x, const char *peer, const struct msg *req)
{
	char job[CKPT_NAME_MAX + 1], step[CKPT_NAME_MAX + 1], from[CKPT_NAME_MAX + 1];
	struct resume_fix fix = { repl.cfg->name, from };
	struct repair r = { .fix = &fix, .job = job, .step = step };
	struct msg m;
	int rc;

	if (ckpt_get_name(req, K_JOB, job) < 0 || ckpt_get_name(req, K_STEP, step) < 0 ||
	    ckpt_get_name(req, K_HOLDER, from) < 0) {
		log_warn("restore asked by %s refused: no valid job, step or node name", peer);
		peer_send_error(x, EBADMSG, "%s: a malformed restore request", repl.cfg->name);
		return -EBADMSG;
	}
	log_info("%s asks this node to restore %s/%s from %s (resume)", peer, job, step, from);
	repair_here(&r);
	msg_init(&m, MSG_RESTORE_ANS);
	msg_put_u64(&m, K_CODE, (uint64_t)r.code);
	msg_put_str(&m, K_TEXT, r.text);
	rc = x->ops->send(x, &m);
	msg_free(&m);
	return rc;
}
