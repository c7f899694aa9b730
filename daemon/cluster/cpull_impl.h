/* Inside pull --cluster: what its files share. cpull.c asks the nodes
 * (the asker's side); cpull_node.c is one node's part (its pull); cpull_fwd.c
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
struct cpull_ask {
	const char *id, *src, *dest;   /* dest NULL: the default */
	const char *list;              /* the nodes, comma-joined */
	uint32_t flags;                /* REQ_VERIFY */
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
/* 0 with *ans (the pull ran, well or not), or -errno with why: refused
 * before any pull (a bad node list, the same pull twice). lv, if given,
 * shows the part while it runs. */
int cpull_part(const struct cpull_ask *a, struct cpull_live *lv, struct cpull_answer *ans,
	       char *why, size_t whylen);
void cpull_part_end(const char *id);
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

#endif
