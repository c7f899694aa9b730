/* A further stream of a copy lost mid-way: its turns handed to the others
 * (docs/PROTOCOL.md, "Streams"), the sender's half: the receiver's word
 * read (tx_take_answer, also between pieces and for DONE) and the streams
 * left marked (tx_hand_off). repl_tx.h holds what it shares with
 * repl_send.c. */
#include "daemon/repl/repl_tx.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "daemon/net/peer.h"

int tx_answer(struct xport *x, struct msg *m, char *why, size_t whylen)
{
	int rc = x->ops->recv(x, m);

	if (rc < 0) {
		snprintf(why, whylen, "%s", rc == -ENOTCONN ? "the peer closed the connection" :
			 strerror(-rc));
		return rc == -ENOTCONN ? -ECONNRESET : rc;
	}
	if (m->type == MSG_ERROR) {
		char t[PEER_TEXT_MAX + 1];

		peer_error_of(m, t);
		snprintf(why, whylen, "refused: %s", t);
		msg_free(m);
		return -EREMOTEIO;
	}
	return 0;
}

/* A frame of the receiver's in the middle of a copy, on x: MSG_RESTREAM (a
 * further stream of the copy lost at its turn: docs/PROTOCOL.md, "Streams")
 * is kept in o and gives -ERESTART; MSG_ERROR is a refusal (-EREMOTEIO);
 * anything else, or nothing, fails the copy. The lost stream's connection
 * is shut, so that a send stuck on it ends. Sets o->ctl_rc and o->ctl_why.
 * With done, MSG_DONE is taken too (0, into *done). */
int tx_take_answer(struct sender *s, struct out *o, struct msg *done)
{
	uint64_t lost = 0, code = 0;
	struct msg m;
	int rc = tx_answer(s->x, &m, o->ctl_why, sizeof(o->ctl_why));

	if (rc == 0 && done && m.type == MSG_DONE) {
		*done = m;      /* finish's */
		return 0;
	}
	if (rc < 0 && rc != -EREMOTEIO)
		return o->ctl_rc = rc;
	if (rc == 0 && (m.type != MSG_RESTREAM || !o->handoff ||
			msg_get_u64(&m, K_INDEX, &lost) < 0 ||
			msg_get_u64(&m, K_FILE, &o->r_idx) < 0 ||
			msg_get_u64(&m, K_OFFSET, &o->r_off) < 0 ||
			msg_get_u64(&m, K_CODE, &code) < 0 || code != o->epoch + 1)) {
		if (m.type == MSG_RESTREAM)
			snprintf(o->ctl_why, sizeof(o->ctl_why), "a MSG_RESTREAM out of place "
				 "(stream %llu, hand-off %llu)", (unsigned long long)lost,
				 (unsigned long long)code);
		else
			snprintf(o->ctl_why, sizeof(o->ctl_why), "unexpected frame type %u mid-copy",
				 m.type);
		rc = -EBADMSG;
	} else if (rc == 0) {
		o->r_pos = 0;
		for (unsigned k = 1; k < o->n; k++)
			if (o->xid[k] == lost)
				o->r_pos = k;
		snprintf(o->ctl_why, sizeof(o->ctl_why), "the receiver lost stream %llu",
			 (unsigned long long)lost);
		rc = o->r_pos ? -ERESTART : -EBADMSG;
		if (o->r_pos) {
			o->epoch = code;
			s->xs[o->r_pos]->ops->shutdown(s->xs[o->r_pos]);   /* any thread may */
		}
	}
	if (rc != -EREMOTEIO)
		msg_free(&m);   /* (a refusal's is freed already) */
	o->ctl_ns = mono_ns();
	return o->ctl_rc = rc;
}

/* A further stream of the copy is lost. The receiver's MSG_RESTREAM (read
 * already, or awaited here when a send on stream `failed` failed first)
 * names it and the point the pieces go on from. It is closed and taken out
 * of xs (the next copy dials another), each stream left gets MSG_MARK, and
 * the pieces from that point go on them in turns (docs/PROTOCOL.md,
 * "Streams"). 0, or -errno with why. */
int tx_hand_off(struct sender *s, struct out *o, unsigned failed, char *why, size_t whylen)
{
	struct xport *gone;
	int rc;

	if (o->ctl_rc != -ERESTART) {
		/* The receiver finds the loss at that stream's turn, within its
		 * peer timeout: shut, it finds it at once. */
		if (failed)
			s->xs[failed]->ops->shutdown(s->xs[failed]);
		o->ctl_rc = 0;
		s->x->ops->set_timeout(s->x, 2 * peers_io_ms());
		rc = tx_take_answer(s, o, NULL);
		s->x->ops->set_timeout(s->x, peers_io_ms());
		if (rc != -ERESTART) {
			snprintf(why, whylen, "%s", o->ctl_why);
			return rc;
		}
	}
	log_warn("%s/%s to %s: stream %u lost; its turns go to the %u left, from entry %llu "
		 "byte %llu", o->job, o->step, s->h->name, o->xid[o->r_pos], o->n - 1,
		 (unsigned long long)o->r_idx, (unsigned long long)o->r_off);
	pthread_mutex_lock(&repl.lock);
	gone = s->xs[o->r_pos];
	for (unsigned k = o->r_pos; k + 1 < s->nx; k++)
		s->xs[k] = s->xs[k + 1];
	for (unsigned k = o->r_pos; k + 1 < o->n; k++)
		o->xid[k] = o->xid[k + 1];
	s->nx--;
	o->n--;
	for (unsigned k = 0; k < s->nx; k++)
		s->p->xs[k] = s->xs[k];
	s->p->nx = s->nx;
	s->p->streams = o->n;
	pthread_mutex_unlock(&repl.lock);
	gone->ops->close(gone);
	for (unsigned k = 0; k < o->n; k++) {
		struct msg m;

		msg_init(&m, MSG_MARK);
		msg_put_u64(&m, K_CODE, o->epoch);
		s->xs[k]->ops->set_timeout(s->xs[k], peers_io_ms());
		rc = s->xs[k]->ops->send(s->xs[k], &m);
		if (k)
			s->xs[k]->ops->set_timeout(s->xs[k], held_ms(o->total, peers_io_ms()));
		msg_free(&m);
		/* A further stream dead too: the receiver names it in turn. */
		if (rc < 0 && k == 0) {
			snprintf(why, whylen, "sending: %s", strerror(-rc));
			return rc;
		}
	}
	o->ctl_rc = 0;
	return 0;
}
