/* Inside pull --cluster: what its files share. cpull.c is the asker's
 * side; cpull_node.c is one node's part (its pull, and a relay's asking of
 * its group); cpull_ask.c asks a set of nodes for either (its own part it
 * is handed as a function, so it calls up into nothing); cpull_fwd.c
 * brings the files this node does not read from the source from the peers
 * that do; cpull_sess.c serves this node's files to its peers. Calls go
 * that way down, never back.
 *
 * Who reads what. Every node walks SRC (metadata) in the same order; each
 * file has one reader, found by every node alike from its path and the
 * list of nodes: a sequence of jump-consistent hashes of the path, the
 * first node of it that is not known dead. A node never counts itself dead,
 * so on a node X the reader is X or a node before X's first place in the
 * file's sequence: asking follows the sequence backwards, and no two nodes
 * can each wait for the other. A node found dead (no connection, or one
 * lost) is skipped from then on, so its share falls to the next node of
 * each of its files' sequences, whichever node finds it first.
 */
#ifndef STAGE_CPULL_IMPL_H
#define STAGE_CPULL_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/digest.h"
#include "common/proto.h"
#include "common/xport.h"
#include "daemon/pull/pull.h"

#define CPULL_ID_HEX 32                /* a pull's id: 16 random bytes */
#define CPULL_NODES_MAX 4096
#define CPULL_WAIT_MS 1000             /* a fetch waits this long for its file, then
					* "not yet" (the connection and the lane
					* are free for other files meanwhile) */
#define CPULL_GIVEUP_MS 120000         /* a file "not yet" for this long: skip the node */
#define CPULL_PROBE 1u                 /* MSG_CPULL_FETCH's K_FLAGS: only if it is there now */

/* The nodes of one pull, in the asker's order. */
struct cpull_nodes {
	char **names;                  /* owned (hostlist_free) */
	size_t *host;                  /* index of each in the hosts file */
	size_t n;
	size_t self;                   /* this node's index */
	_Atomic bool *dead;            /* found dead by this node */
};

void cpull_nodes_free(struct cpull_nodes *nn);

/* cpull_fwd.c: the reader of rel among nodes not dead and not in skip[];
 * other: the first node of its sequence that is not this one (nn->n: none),
 * the node that would read it if this one were dead. */
size_t cpull_reader(const struct cpull_nodes *nn, const char *rel, const size_t *skip,
		    size_t nskip, bool other);

/* The pull's share of this node: forwards on a few threads (lanes). */
struct cfwd;
/* 0 and *fw, or -errno. id and nn are borrowed until cfwd_close. */
int cfwd_open(struct cfwd **fw, const char *id, struct cpull_nodes *nn);
/* Joins the lanes: every forward must have been reaped. */
void cfwd_close(struct cfwd *fw);
/* The share for pull_run_share (its arg is fw). */
extern const struct pull_share_ops cfwd_ops;
/* Bytes received from peers so far. */
uint64_t cfwd_bytes_in(struct cfwd *fw);

/* cpull_node.c: this node's part of pull id (the asker's, or its own
 * when it is the asker): its pull run here with the others. A pull being
 * served by id is opened first and served from until cpull_part_end. */
struct cred;
struct cpull_ask {
	const char *id, *src, *dest;   /* dest NULL: the default */
	const char *list;              /* the nodes, comma-joined */
	uint32_t flags;                /* REQ_VERIFY */
	const struct cred *who;        /* the user every part acts as (the asker's caller,
					* daemon/fs/cred.h), borrowed; NULL: each node's daemon */
};
struct cpull_answer {
	int code;                      /* the pull's exit code */
	char text[1024];               /* its result */
	struct pull_stats st;
};
/* How far a node's part is, for the asker's progress. */
struct cpull_prog {
	uint64_t files_done, files_total, bytes_done, bytes_total, bytes_fwd;
};
static inline void cpull_prog_add(struct cpull_prog *sum, const struct cpull_prog *p)
{
	sum->files_done += p->files_done;
	sum->files_total += p->files_total;
	sum->bytes_done += p->bytes_done;
	sum->bytes_total += p->bytes_total;
	sum->bytes_fwd += p->bytes_fwd;
}
/* A part being run, as another thread sees it (mu is the caller's to
 * init and destroy; the pointers are the part's while it runs). */
struct cpull_live {
	pthread_mutex_t mu;
	struct job *job;
	struct cfwd *fw;
	struct cpull_prog last;        /* what was read last */
};
/* Where the part is now (the last figures once it has ended). */
void cpull_live_read(struct cpull_live *lv, struct cpull_prog *p);
/* Its asker is gone: the part stops, as a pull whose client hung up. */
void cpull_live_stop(struct cpull_live *lv);
/* 0 with *ans (the pull ran, well or not), or -errno with why: refused
 * before any pull (a bad node list, the same pull twice). lv, if given,
 * shows the part while it runs. */
int cpull_part(const struct cpull_ask *a, struct cpull_live *lv, struct cpull_answer *ans,
	       char *why, size_t whylen);
void cpull_part_end(const char *id);
/* cpull_ask.c: asking a set of other nodes to take part in a pull (the
 * asker's, or a relay's for its group): directly up to [cluster] fanout,
 * past that through relays. */
struct cask;
struct cask_node {
	struct cask *c;
	const char *name;              /* borrowed from cask_start's names */
	size_t host;                   /* index in the hosts file */
	struct cask_node *via;         /* the relay it is asked through, or NULL */
	const size_t *grp;             /* a relay: its group, indices into the set (under
					* c->mu: a relay lost early hands it on) */
	size_t ngrp;
	bool here;                     /* this node: its part runs in place (cask_start's here) */
	pthread_t thread;
	bool head, started;            /* given a thread of its own at the start; it began */
	/* under c->mu */
	struct xport *x;               /* a cancel shuts it down */
	bool answered, said;           /* its answer is in (or why not); its owner told it */
	int code;                      /* its pull's exit code (1 until it answers) */
	char text[1024];
	char root[DIGEST_HEX_LEN + 1];
	char path[4096];
	uint64_t files, bytes, rfiles, rbytes, ffiles, fbytes;
	struct cpull_prog prog;        /* its last progress (a relay: its group's summed, its
					* own included) */
	char slow[64];                 /* a relay: the slowest of its group still pulling */
	uint64_t slow_done, slow_total;
};
struct cask {
	const struct cpull_ask *a;     /* borrowed */
	pthread_mutex_t mu;
	pthread_cond_t cv;             /* an answer came; over */
	size_t n, answered;
	bool over;                     /* the owner ends the pull: END to every node */
	bool cancelled;                /* a node dialled from now on is not asked */
	struct cask_node *v;           /* n, in the order given */
	size_t *grp;                   /* the groups' indices (the relays' grp point here) */
	void (*here)(struct cask_node *nd, void *arg);
	void *here_arg;
};
/* The slowest of some nodes still pulling: the least done. */
struct cask_slow {
	char name[64];                 /* "" while none */
	double frac;
	uint64_t done, total;
};
/* Starts asking names[0..n) (borrowed until cask_end). here, if given, runs
 * this node's own part when names has it, on its node's thread: it fills
 * the node's code, text and figures (the owner shows its progress). 0 or
 * -ENOMEM. */
int cask_start(struct cask **c, const struct cpull_ask *a, char *const *names, size_t n,
	       void (*here)(struct cask_node *nd, void *arg), void *here_arg);
/* Waits up to ms for an answer; true once every node has answered. */
bool cask_wait(struct cask *c, int ms);
/* Shuts every connection (the owner's client went): the nodes' parts stop. */
void cask_cancel(struct cask *c);
/* The set's progress added to *sum, its slowest offered to *slow. */
void cask_sum(struct cask *c, struct cpull_prog *sum, struct cask_slow *slow);
void cask_slow_offer(struct cask_slow *s, const char *name, uint64_t done, uint64_t total);
/* A part's answer (this node's own) into a node's record. */
void cask_take_part(struct cask_node *nd, const struct cpull_answer *ans);
/* A node's answer as MSG_ASK_DONE (named: with K_NAME, as a relay sends). */
void cask_put_answer(struct msg *m, const struct cask_node *nd, bool named);
/* Every answer in: MSG_END to every node, the threads joined. The records
 * stay readable until cask_free. */
void cask_end(struct cask *c);
void cask_free(struct cask *c);

/* cpull_sess.c: the pulls this node serves from, by id. */
/* A pull to serve from (STARTING): 0, -EEXIST, -EBUSY (too many), -ENOMEM. */
int cpull_sess_add(const char *id);
/* Ends it, once no fetch is served from it: the mirror of cpull_sess_add. */
void cpull_sess_remove(const char *id);
bool cpull_id_ok(const char *id);
/* The destination is open: peers may fetch from it. 0 or -errno. */
int cpull_sess_begin(const char *id, int dst_fd);
/* This node's pull is over: a fetch of what is not there is refused. */
void cpull_sess_pulled(const char *id, bool ok);
/* This node could not read rel from the source (why): a fetch of it is
 * refused at once (EIO), not kept waiting until the pull ends. */
void cpull_sess_failed(const char *id, const char *rel, const char *why);

#endif
