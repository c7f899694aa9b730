/* Copy groups, parsed and built: the wire half of MSG_HOLD and MSG_CELLS
 * (docs/PROTOCOL.md, "Copy groups"; the field order in common/proto.h). A
 * peer's answer reaches hold_parse, so it lives apart from the daemon,
 * where the fuzz target can reach it (tests/fuzz/fuzz_copygroup.c). */
#ifndef STAGE_COPYGROUP_H
#define STAGE_COPYGROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/digest.h"
#include "common/proto.h"

/* One copy group, parsed. Strings are owned (hold_cells_free). */
struct hold_cell {
	char *origin, *holder, *state, *step;
	bool has_root;
	digest_t root;
	uint64_t files, bytes;
	char *text[COPY_TEXTS_MAX];
	unsigned ntext;
	char *copy[COPY_NOTES_MAX];        /* K_COPY notes (an origin's own copy only) */
	unsigned ncopy;
};

/* A K_COPY note: how the origin's copy of the step to `node` stands, when
 * it has not been confirmed there. The states: */
#define COPY_QUEUED  "queued"          /* waits its turn (or the partner; why: its last try) */
#define COPY_SENDING "sending"         /* being sent now (why: how far) */
#define COPY_SKIPPED "skipped"         /* left out for a newer step ([transfer] stale) */
#define COPY_FAILED  "failed"          /* given up (why: the partner's refusal) */
struct copy_note {
	char node[256];
	char state[16];
	const char *why;                   /* into the note's text; NULL: none */
};
#define COPY_NOTE_MAX 512                /* bytes a note may have */
/* Reads a note "NODE STATE" or "NODE STATE: WHY" (NODE a node name, STATE
 * one of the above, WHY not empty and not starting with a space; at most
 * COPY_NOTE_MAX bytes in all): 0, or -EBADMSG. */
int copy_note_parse(const char *s, struct copy_note *n);

/* Parses every copy group of m, appending to *cells (*n of them, growing).
 * holder: for a MSG_HOLD, its sender, the holder of every group (a group
 * naming a holder of its own is refused); NULL for a MSG_CELLS, whose groups
 * name theirs. 0, or -EBADMSG (a group without a state, a bad root, a name
 * that is not a node or step name, an allocation that failed), and then
 * nothing was appended. */
int hold_parse(const struct msg *m, const char *holder, struct hold_cell **cells, size_t *n);
/* Appends one group to m (the inverse of hold_parse; holder may be NULL). */
void hold_put(struct msg *m, const struct hold_cell *c, bool with_holder);
void hold_cells_free(struct hold_cell *cells, size_t n);

#endif
