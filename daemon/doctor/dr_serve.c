/* The answering side of stage doctor: every node's daemon, the asking one
 * included, answers the doctor's questions here.
 *
 * One doctor at a time per node (the session lock below): two preflights
 * at once would measure each other's traffic, and a port opened by one
 * would read as "in use" to the other. A session holds a node while it
 * keeps asking; one whose asker vanished ends by itself after DR_LEASE_MS,
 * closing any ports it left open (dr_ports.c holds them no longer than the
 * lease either).
 */
#include "daemon/doctor/doctor.h"
#include "daemon/doctor/dr_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/version.h"
#include "daemon/doctor/dr_disk.h"
#include "daemon/doctor/dr_local.h"
#include "daemon/fs/fsprobe.h"
#include "daemon/net/peer.h"
#include "daemon/repl/repl.h"
#include "daemon/peers/peers.h"

/* ------------------------------------------------------------ the session lock */

static struct {
	pthread_mutex_t mu;
	char session[DR_SESSION_LEN + 1];  /* "" when free */
	char asker[256];
	int64_t until_ms;                  /* mono_ms when the lease ends */
} lock = { .mu = PTHREAD_MUTEX_INITIALIZER };

int dr_session_take(const char *session, const char *asker, int64_t busy_ms, char *why,
		    size_t whylen)
{
	int64_t now = mono_ms();
	bool stale;
	int rc = 0;

	pthread_mutex_lock(&lock.mu);
	stale = lock.session[0] && strcmp(lock.session, session) != 0 && now >= lock.until_ms;
	if (lock.session[0] && strcmp(lock.session, session) != 0 && !stale) {
		snprintf(why, whylen, "a doctor is already running on %s (asked by %s); try again "
			 "when it ends", peers_self_name(), lock.asker);
		rc = -EBUSY;
	} else {
		if (strcmp(lock.session, session) != 0) {
			snprintf(lock.session, sizeof(lock.session), "%s", session);
			snprintf(lock.asker, sizeof(lock.asker), "%s", asker);
			lock.until_ms = 0;
		}
		/* Questions of one session overlap (the streams of a bandwidth
		 * test): the lease is the latest any of them needs. */
		if (now + busy_ms + DR_LEASE_MS > lock.until_ms)
			lock.until_ms = now + busy_ms + DR_LEASE_MS;
	}
	pthread_mutex_unlock(&lock.mu);
	if (stale)
		dr_release();      /* the vanished session's ports */
	return rc;
}

void dr_session_end(const char *session)
{
	bool mine;

	pthread_mutex_lock(&lock.mu);
	mine = strcmp(lock.session, session) == 0;
	if (mine)
		lock.session[0] = '\0';
	pthread_mutex_unlock(&lock.mu);
	if (mine)
		dr_release();
}

/* ------------------------------------------------------------ facts */

static int answer_facts(const struct dr_ctx *c, const struct msg *ask, struct msg *ans)
{
	struct dr_fact facts[DR_FACTS_MAX];
	struct dr_rdma_port ports[16];
	struct dr_holder holders[DR_NODES_MAX];
	struct dr_clock clk;
	size_t n = 0, nh;

	msg_put_pairf(ans, "version", "%s", STAGE_VERSION);
	if (dr_facts_eval(c->cfg->doctor_facts, facts, DR_FACTS_MAX, &n) == 0)
		for (size_t i = 0; i < n; i++) {
			char name[DR_FACT_NAME_MAX + 8];

			snprintf(name, sizeof(name), "fact.%.*s", DR_FACT_NAME_MAX, facts[i].name);
			msg_put_pairf(ans, name, "%s", facts[i].value);
		}
	if (dr_clock_state(&clk) == 0) {
		msg_put_pairf(ans, "clock.synced", "%d", clk.synced);
		msg_put_pairf(ans, "clock.maxerror_us", "%ld", clk.maxerror_us);
	}
	/* The interface toward each node the asker names (its peers). */
	nh = dr_holders(ask, holders, DR_NODES_MAX);
	for (size_t i = 0; i < nh; i++) {
		const struct dr_holder *h = &holders[i];
		char name[300], why[256];
		struct dr_route r;

		snprintf(name, sizeof(name), "route.%.255s", h->name);
		if (h->host < 0)
			msg_put_pairf(ans, name, "!%s is not in this node's hosts file", h->name);
		else if (dr_route(peers.hosts.v[h->host].host, peers.hosts.v[h->host].port, &r, why,
				  sizeof(why)) < 0)
			msg_put_pairf(ans, name, "!%s", why);
		else
			msg_put_pairf(ans, name, "%s|%d|%ld|%s", r.ifname, r.mtu, r.speed_mbps, r.local);
	}
	n = 0;
	if (dr_rdma_ports(ports, sizeof(ports) / sizeof(ports[0]), &n) == 0)
		for (size_t i = 0; i < n; i++) {
			char name[32];

			snprintf(name, sizeof(name), "rdma.%zu", i);
			msg_put_pairf(ans, name, "%s/%d|%s|%s", ports[i].dev, ports[i].port, ports[i].state,
			       ports[i].rate);
		}
	return 0;
}

/* ------------------------------------------------------------ disks */

static bool stopping(void *arg)
{
	return atomic_load(&stage_stopping);
}

static int answer_disk(const struct dr_ctx *c, const struct msg *ask, struct msg *ans)
{
	const struct { const char *name, *path; } roots[] = {
		{ "stage_root", c->cfg->stage_root },
		{ "ckpt_root", c->cfg->ckpt_root },
		{ "replica_root", c->cfg->replica_root },
	};
	dev_t devs[3];
	uint64_t size = 0, newest;
	char what[600] = "";

	/* The asker says how much; this node's own config is the most it
	 * writes or reads, whoever asks. */
	msg_get_u64(ask, K_SIZE, &size);
	if (!size || size > c->cfg->doctor_storage_size)
		size = c->cfg->doctor_storage_size;
	for (size_t i = 0; i < 3; i++) {
		struct dr_disk d;
		struct statvfs vf;
		struct stat st;
		uint64_t here = size;
		size_t same = i;
		int rc;

		dr_put_at(ans, "disk", i, "root", "%s", roots[i].name);
		dr_put_at(ans, "disk", i, "path", "%s", roots[i].path);
		/* A root on the file system of one above is not measured again. */
		devs[i] = stat(roots[i].path, &st) == 0 ? st.st_dev : (dev_t)-1;
		for (size_t k = 0; k < i; k++)
			if (devs[k] == devs[i] && devs[i] != (dev_t)-1)
				same = k;
		if (same < i) {
			dr_put_at(ans, "disk", i, "same", "%zu", same);
			continue;
		}
		/* Never more than a tenth of what is free: a trainer's next save
		 * must not meet a full disk because the doctor was measuring. */
		if (statvfs(roots[i].path, &vf) == 0 &&
		    (uint64_t)vf.f_bavail * vf.f_frsize / 10 < here)
			here = (uint64_t)vf.f_bavail * vf.f_frsize / 10;
		memset(&d, 0, sizeof(d));
		rc = dr_disk_probe(roots[i].path, here, stopping, NULL, &d);
		if (rc == -ECANCELED)
			return rc;
		if (rc < 0) {
			dr_put_at(ans, "disk", i, "err", "%s", d.why[0] ? d.why : strerror(-rc));
			continue;
		}
		dr_put_at(ans, "disk", i, "write", "%.0f", d.write_Bps);
		dr_put_at(ans, "disk", i, "read", "%.0f", d.read_Bps);
		dr_put_at(ans, "disk", i, "direct", "%d", d.direct);
		dr_put_at(ans, "disk", i, "free", "%llu", (unsigned long long)d.free_bytes);
	}
	newest = repl_newest_committed(what, sizeof(what));
	msg_put_pairf(ans, "newest", "%llu", (unsigned long long)newest);
	msg_put_pairf(ans, "newest.step", "%s", what);
	for (int i = 0; i < c->cfg->n_source_roots; i++) {
		struct dr_source s;
		int rc;

		memset(&s, 0, sizeof(s));
		/* A shared mount that hangs is a finding, not a doctor that hangs. */
		rc = fsprobe_answers(c->cfg->source_roots[i], FSPROBE_WAIT_MS, stopping, NULL, s.why,
				     sizeof(s.why));
		if (rc == 0)
			rc = dr_source_probe(c->cfg->source_roots[i], size, 20000, 500, stopping, NULL,
					     &s);
		if (rc == -ECANCELED)
			return rc;
		dr_put_at(ans, "src", (size_t)i, "path", "%s", c->cfg->source_roots[i]);
		if (rc < 0) {
			dr_put_at(ans, "src", (size_t)i, "err", "%s", s.why[0] ? s.why : strerror(-rc));
			continue;
		}
		dr_put_at(ans, "src", (size_t)i, "read", "%.0f", s.read_Bps);
		dr_put_at(ans, "src", (size_t)i, "meta", "%.0f", s.files_per_s);
		dr_put_at(ans, "src", (size_t)i, "bytes", "%llu", (unsigned long long)s.bytes_read);
	}
	return 0;
}

/* ------------------------------------------------------------ dispatch */

/* How long a question may keep this node busy, so that its lease does not
 * run out while it runs: a bandwidth test's two figures and its pings, a
 * sink of one, the storage probes. */
static int64_t busy_ms(const char *kind, const struct stage_config *cfg)
{
	if (strcmp(kind, "bw") == 0 || strcmp(kind, "sink") == 0)
		return 2 * (int64_t)cfg->doctor_duration_ms + 10000;
	if (strcmp(kind, "disk") == 0 || strcmp(kind, "facts") == 0)
		return 120000;
	return 0;
}

int dr_answer(const struct dr_ctx *c, const struct msg *ask, struct msg *ans, char *why,
	      size_t whylen)
{
	char *kind = NULL, *session = NULL;
	uint64_t t2 = wall_ns();
	int rc;

	if (msg_get_str(ask, K_KIND, &kind) < 0 || msg_get_str(ask, K_JOB, &session) < 0 ||
	    strlen(session) != DR_SESSION_LEN) {
		snprintf(why, whylen, "a doctor's question without its kind or session");
		rc = -EBADMSG;
		goto out;
	}
	if (strcmp(kind, "end") == 0) {
		dr_session_end(session);
		rc = 0;
		goto out;
	}
	rc = dr_session_take(session, c->asker, busy_ms(kind, c->cfg), why, whylen);
	if (rc < 0)
		goto out;
	if (strcmp(kind, "time") == 0) {
		/* NTP's t2 and t3: when the question arrived, when the answer
		 * leaves (here, as close to the send as this layer gets). */
		msg_put_u64(ans, K_T2, t2);
		msg_put_u64(ans, K_T3, wall_ns());
	} else if (strcmp(kind, "facts") == 0) {
		rc = answer_facts(c, ask, ans);
	} else if (strcmp(kind, "disk") == 0) {
		rc = answer_disk(c, ask, ans);
	} else if (strcmp(kind, "listen") == 0) {
		rc = dr_listen(ask, ans, why, whylen);
	} else if (strcmp(kind, "release") == 0) {
		dr_release();
	} else if (strcmp(kind, "dial") == 0) {
		rc = dr_dial(ask, ans, why, whylen);
	} else if (strcmp(kind, "bw") == 0) {
		rc = dr_bw(c, ask, ans, why, whylen);
	} else if (strcmp(kind, "sink") == 0) {
		rc = dr_sink(c, ask, ans, why, whylen);
	} else {
		snprintf(why, whylen, "unknown doctor question '%.40s' (a newer asker?)", kind);
		rc = -EPROTO;
	}
	if (rc < 0 && !why[0])
		snprintf(why, whylen, "%s", strerror(-rc));
	if (rc >= 0)
		dr_session_take(session, c->asker, 0, why, whylen);   /* from its end */
out:
	free(kind);
	free(session);
	return rc;
}

int doctor_serve(struct xport *x, const char *peer, const struct msg *req)
{
	struct dr_ctx c = { .cfg = peers.cfg, .asker = peer, .x = x };
	char why[512] = "";
	struct msg ans;
	int rc;

	msg_init(&ans, MSG_DOCTOR_ANS);
	rc = dr_answer(&c, req, &ans, why, sizeof(why));
	if (rc < 0) {
		msg_free(&ans);
		peer_send_error(x, -rc, "%s", why);
		return rc;
	}
	rc = x->ops->send(x, &ans);
	msg_free(&ans);
	return rc;
}

int doctor_check_config(const struct stage_config *cfg, char *why, size_t whylen)
{
	char w[256];

	if (dr_facts_check(cfg->doctor_facts, w, sizeof(w)) < 0) {
		snprintf(why, whylen, "key 'doctor.facts': %s", w);
		return -EINVAL;
	}
	return 0;
}
