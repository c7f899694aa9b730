/* What `stage status` and `stage ls` see of replication: the partners and
 * why they are up or down, the transfers in flight, the copies waiting for
 * a save ([transfer] yield), the lag, this node's commits and their copies,
 * and the replicas it holds for others, each shown to root and to the
 * owner of the job only. Read under repl.lock (repl_impl.h). */
#include "daemon/repl/repl.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/copygroup.h"
#include "common/manifest.h"
#include "daemon/repl/repl_impl.h"

static const char *cstate_name(enum cstate s)
{
	static const char *const n[] = { "pending", "sending", "confirmed", "failed", "skipped" };

	return n[s];
}

/* Whether path exists and viewer may see what it stands for: root sees
 * everything, a user what they own (a job's directory; a replica's
 * manifest, which keeps the origin's owner). */
static bool ls_visible(const char *path, uid_t viewer)
{
	struct stat st;

	return lstat(path, &st) == 0 && (viewer == 0 || st.st_uid == viewer);
}

/* Whether viewer may see this node's job (ckpt_root/JOB): root always
 * (a job deleted here is still listed, to be restored). */
static bool job_visible(const char *job, uid_t viewer)
{
	char dir[PATH_MAX];

	snprintf(dir, sizeof(dir), "%s/%s", repl.cfg->ckpt_root, job);
	return viewer == 0 || ls_visible(dir, viewer);
}

void repl_status(struct msg *m, uid_t viewer)
{
	char v[2048];
	uint64_t lag_bytes = 0;
	unsigned lag_copies = 0;

	pthread_mutex_lock(&repl.lock);
	if (!peers.cluster) {
		msg_put_str(m, K_NAME, "peers");
		msg_put_str(m, K_VALUE, "none (a single node: no hosts file)");
	}
	for (size_t h = 0; peers.cluster && h < peers.hosts.n; h++) {
		const struct host *hp = &peers.hosts.v[h];
		struct partner *p = NULL;
		uint64_t now = mono_ns();

		if (h == peers.self)
			continue;
		for (size_t i = 0; i < repl.npartners; i++)
			if (repl.partners[i].host == h)
				p = &repl.partners[i];
		if (!p)
			snprintf(v, sizeof(v), "%s %s:%u: not a partner of this node", hp->name,
				 hp->host, hp->port);
		else if (p->state == PEER_UP) {
			unsigned want = repl_streams_wanted(p, repl.cfg);
			/* The next copy's count, or the last one's where it got fewer. */
			bool fewer = p->streams && p->streams < p->wanted;
			unsigned n = fewer ? p->streams : want;
			unsigned cpus = config_cpus();
			char sw[640], sd[512], cw[64];

			/* Why that many: the setting, what adapting measured, or
			 * the connections it got. */
			if (fewer && repl.cfg->streams)
				snprintf(sw, sizeof(sw), "of %u wanted: the others could not be "
					 "opened, or were lost mid-copy", p->wanted);
			else if (repl.cfg->streams)
				snprintf(sw, sizeof(sw), "[transfer] streams = %d", repl.cfg->streams);
			else {
				if (repl.cfg->streams_max)
					snprintf(cw, sizeof(cw), "[transfer] streams_max = %d",
						 repl.cfg->streams_max);
				else
					snprintf(cw, sizeof(cw), "half the %u CPU%s it may run on",
						 cpus, cpus == 1 ? "" : "s");
				sadapt_describe(&p->sa, sd, sizeof(sd));
				snprintf(sw, sizeof(sw), "adapting, 1 to %u, %s: %s%s", p->sa.cap, cw, sd,
					 fewer ? "; the last copy lost a stream mid-copy" : "");
			}
			snprintf(v, sizeof(v), "%s %s:%u: partner, up, transport %s, codec %s, "
				 "%llu bytes sent as %llu, %llu bytes held there, %u stream%s (%s)",
				 hp->name, hp->host, hp->port, p->x ? p->x->ops->name : "-",
				 p->codec ? p->codec : "-",
				 (unsigned long long)p->raw, (unsigned long long)p->wire,
				 (unsigned long long)p->held, n, n == 1 ? "" : "s", sw);
		}
		else if (p->state == PEER_DOWN)
			snprintf(v, sizeof(v), "%s %s:%u: partner, down: %s (retry in %llu ms)",
				 hp->name, hp->host, hp->port, p->why,
				 (unsigned long long)(p->retry_at_ns > now ?
						      (p->retry_at_ns - now) / 1000000 : 0));
		else
			snprintf(v, sizeof(v), "%s %s:%u: partner, not connected (nothing to send)",
				 hp->name, hp->host, hp->port);
		msg_put_str(m, K_NAME, "peer");
		msg_put_str(m, K_VALUE, v);
	}
	if (peers.cluster) {
		if (peers.hosts.n > 1)
			net_status(m);
		else {
			msg_put_str(m, K_NAME, "transport");
			msg_put_str(m, K_VALUE, "none (one node)");
		}
	}
	for (struct record *r = repl.records; r; r = r->next)
		for (size_t i = 0; i < repl.npartners; i++) {
			struct rcopy *c = &r->copies[i];

			if (c->state != C_PENDING && c->state != C_SENDING)
				continue;
			lag_copies++;
			lag_bytes += r->bytes - (c->sent < r->bytes ? c->sent : r->bytes);
			if (c->state == C_SENDING && job_visible(r->job, viewer)) {
				snprintf(v, sizeof(v), "%s/%s to %s: %llu of %llu bytes", r->job,
					 r->step, repl_partner_name(i), (unsigned long long)c->sent,
					 (unsigned long long)c->total);
				msg_put_str(m, K_NAME, "sending");
				msg_put_str(m, K_VALUE, v);
			}
		}
	for (size_t i = 0; peers.cluster && repl.cfg->yield && repl.cfg->watch &&
			   i < REPL_WRITERS; i++) {
		const struct writer *w = &repl.writers[i];
		const char *job = w->job;

		if (w->ms && (uint64_t)mono_ms() - w->ms < REPL_YIELD_QUIET_MS &&
		    job_visible(job, viewer)) {
			snprintf(v, sizeof(v), "%s: a step is being written here; the job's copies, "
				 "to and from this node, wait ([transfer] yield)", job);
			msg_put_str(m, K_NAME, "yield");
			msg_put_str(m, K_VALUE, v);
		}
	}
	if (peers.cluster) {
		snprintf(v, sizeof(v), "%u cop%s, %llu bytes not yet confirmed", lag_copies,
			 lag_copies == 1 ? "y" : "ies", (unsigned long long)lag_bytes);
		msg_put_str(m, K_NAME, "replication lag");
		msg_put_str(m, K_VALUE, v);
	}
	repl_recv_status(m, viewer);
	pthread_mutex_unlock(&repl.lock);
}

/* Replicas this node holds for others: replica_root/ORIGIN/JOB/STEP with a
 * manifest. */
static void ls_held(struct msg *m, uid_t viewer)
{
	DIR *od = opendir(repl.cfg->replica_root);
	struct dirent *oe;
	const char *w;

	if (!od)
		return;
	while ((oe = readdir(od))) {
		char jp[4096];
		DIR *jd;
		struct dirent *je;

		if (config_check_name(oe->d_name, &w) < 0)
			continue;
		snprintf(jp, sizeof(jp), "%s/%s", repl.cfg->replica_root, oe->d_name);
		jd = opendir(jp);
		while (jd && (je = readdir(jd))) {
			char sp[4400];
			DIR *sd;
			struct dirent *se;

			if (config_check_name(je->d_name, &w) < 0)
				continue;
			snprintf(sp, sizeof(sp), "%s/%s", jp, je->d_name);
			sd = opendir(sp);
			while (sd && (se = readdir(sd))) {
				char mp[4800], name[600], v[700];

				if (config_check_name(se->d_name, &w) < 0)
					continue;
				snprintf(mp, sizeof(mp), "%s/%s/.stage/manifest", sp, se->d_name);
				if (!ls_visible(mp, viewer))    /* the manifest is the owner's */
					continue;
				snprintf(name, sizeof(name), "%s/%s", je->d_name, se->d_name);
				snprintf(v, sizeof(v), "origin=%s state=replica holder=%s", oe->d_name,
					 repl.cfg->name);
				msg_put_str(m, K_NAME, name);
				msg_put_str(m, K_VALUE, v);
			}
			if (sd)
				closedir(sd);
		}
		if (jd)
			closedir(jd);
	}
	closedir(od);
}

void repl_ls(struct msg *m, uid_t viewer)
{
	pthread_mutex_lock(&repl.lock);
	for (struct record *r = repl.records; r; r = r->next) {
		char name[600], v[4096], hex[DIGEST_HEX_LEN + 1] = "-";
		size_t o;

		if (!job_visible(r->job, viewer))
			continue;
		snprintf(name, sizeof(name), "%s/%s", r->job, r->step);
		if (r->state == R_READY)
			digest_to_hex(r->root, hex);
		o = (size_t)snprintf(v, sizeof(v), "origin=%s state=%s root=%s files=%llu "
				     "bytes=%llu copies=", repl.cfg->name,
				     r->state == R_HASHING ? "hashing" : r->state == R_READY ?
				     "committed" : "failed", hex, (unsigned long long)r->files,
				     (unsigned long long)r->bytes);
		for (size_t i = 0; i < repl.npartners && o < sizeof(v); i++)
			o += (size_t)snprintf(v + o, sizeof(v) - o, "%s%s:%s", i ? "," : "",
					      repl_partner_name(i), cstate_name(r->copies[i].state));
		if (!repl.npartners && o < sizeof(v))
			snprintf(v + o, sizeof(v) - o, "none");
		msg_put_str(m, K_NAME, name);
		msg_put_str(m, K_VALUE, v);
	}
	pthread_mutex_unlock(&repl.lock);
	ls_held(m, viewer);
}

uint64_t repl_newest_committed(char *what, size_t len)
{
	const struct record *best = NULL;
	uint64_t bytes = 0;

	pthread_mutex_lock(&repl.lock);
	for (const struct record *r = repl.records; r; r = r->next)
		if (r->state == R_READY && (!best || r->seq > best->seq))
			best = r;
	if (best) {
		bytes = best->bytes;
		snprintf(what, len, "%s/%s", best->job, best->step);
	}
	pthread_mutex_unlock(&repl.lock);
	return bytes;
}

/* A reason as a note may carry it: not empty, not starting with a space
 * (copy_note_parse), else dflt. */
static const char *note_why(const char *w, const char *dflt)
{
	if (strncmp(w, "skipped: ", 9) == 0)
		w += 9;
	while (*w == ' ')
		w++;
	return *w ? w : dflt;
}

/* One K_COPY note (copygroup.h) for partner i's copy of r, or NULL when it
 * is confirmed (or memory ran out: a note is an explanation, not a
 * finding). Under lock. */
static char *copy_note(const struct record *r, size_t i)
{
	const struct rcopy *c = &r->copies[i];
	const struct partner *p = &repl.partners[i];
	const char *to = repl_partner_name(i);
	char s[COPY_NOTE_MAX + 1];

	/* A reason (a partner's refusal) is cut at 200 bytes, so that with a
	 * node name of 255 the note stays within COPY_NOTE_MAX, past which it
	 * would make the answer malformed. A sender marks a copy sending
	 * before it dials, so a partner down shows as queued in either state. */
	if (c->state == C_CONFIRMED)
		return NULL;
	if ((c->state == C_SENDING || c->state == C_PENDING) && p->state == PEER_DOWN)
		snprintf(s, sizeof(s), "%s " COPY_QUEUED ": the partner is down (%.200s)", to,
			 p->why);
	else if (c->state == C_SENDING)
		snprintf(s, sizeof(s), "%s " COPY_SENDING ": %.1f of %.1f MiB sent", to,
			 (double)c->sent / (1 << 20), (double)c->total / (1 << 20));
	else if (c->state == C_PENDING && c->why[0])
		snprintf(s, sizeof(s), "%s " COPY_QUEUED ": the last try failed (%.200s)", to,
			 c->why);
	else if (c->state == C_PENDING)
		snprintf(s, sizeof(s), "%s " COPY_QUEUED, to);
	else if (c->state == C_SKIPPED)
		snprintf(s, sizeof(s), "%s " COPY_SKIPPED ": %.200s", to,
			 note_why(c->why, "a newer step went first"));
	else
		snprintf(s, sizeof(s), "%s " COPY_FAILED ": %.200s", to,
			 note_why(c->why, "given up"));
	return strdup(s);
}

size_t repl_copy_notes(const char *job, const char *step, const digest_t *root, char **out,
		       size_t cap)
{
	const struct record *r;
	size_t n = 0;

	pthread_mutex_lock(&repl.lock);
	r = repl.stopping ? NULL : repl_rec_find(job, step);
	/* A record being hashed again, or of another root, is not about the
	 * copy the survey read: nothing is said of it. */
	if (r && r->state == R_READY && digest_eq(*root, r->root))
		for (size_t i = 0; i < repl.npartners && n < cap; i++)
			if ((out[n] = copy_note(r, i)))
				n++;
	pthread_mutex_unlock(&repl.lock);
	return n;
}
