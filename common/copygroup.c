/* Copy groups (copygroup.h). */
#include "common/copygroup.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"

void hold_put(struct msg *m, const struct hold_cell *c, bool with_holder)
{
	msg_put_str(m, K_ORIGIN, c->origin ? c->origin : "");
	if (with_holder && c->holder)
		msg_put_str(m, K_HOLDER, c->holder);
	msg_put_str(m, K_STATE, c->state);
	if (c->step)
		msg_put_str(m, K_STEP, c->step);
	if (c->has_root) {
		char hex[DIGEST_HEX_LEN + 1];

		digest_to_hex(c->root, hex);
		msg_put_str(m, K_ROOT, hex);
	}
	if (c->files || c->bytes) {
		msg_put_u64(m, K_FILES_TOTAL, c->files);
		msg_put_u64(m, K_BYTES_TOTAL, c->bytes);
	}
	for (unsigned i = 0; i < c->ntext; i++)
		msg_put_str(m, K_TEXT, c->text[i]);
	for (unsigned i = 0; i < c->ncopy; i++)
		msg_put_str(m, K_COPY, c->copy[i]);
}

int copy_note_parse(const char *s, struct copy_note *n)
{
	static const char *const states[] = { COPY_QUEUED, COPY_SENDING, COPY_SKIPPED,
					      COPY_FAILED };
	const char *sp = strchr(s, ' '), *st, *end, *w;
	size_t len;
	bool known = false;

	if (!sp || strlen(s) > COPY_NOTE_MAX || (size_t)(sp - s) >= sizeof(n->node))
		return -EBADMSG;
	memcpy(n->node, s, (size_t)(sp - s));
	n->node[sp - s] = '\0';
	if (config_check_name(n->node, &w) < 0)
		return -EBADMSG;
	st = sp + 1;
	end = strchr(st, ':');
	len = end ? (size_t)(end - st) : strlen(st);
	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
		known |= strlen(states[i]) == len && memcmp(st, states[i], len) == 0;
	if (!known || (end && (end[1] != ' ' || end[2] == '\0' || end[2] == ' ')))
		return -EBADMSG;
	memcpy(n->state, st, len);
	n->state[len] = '\0';
	n->why = end ? end + 2 : NULL;
	return 0;
}

static void cell_free(struct hold_cell *c)
{
	free(c->origin);
	free(c->holder);
	free(c->state);
	free(c->step);
	for (unsigned i = 0; i < c->ntext; i++)
		free(c->text[i]);
	for (unsigned i = 0; i < c->ncopy; i++)
		free(c->copy[i]);
}

void hold_cells_free(struct hold_cell *cells, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cell_free(&cells[i]);
	free(cells);
}

static char *dup_field(const uint8_t *p, size_t n)
{
	char *s;

	if (memchr(p, '\0', n) || !(s = malloc(n + 1)))
		return NULL;
	memcpy(s, p, n);
	s[n] = '\0';
	return s;
}

/* Names from a peer end up in paths and tables: they must be node or step
 * names ("" is allowed for an origin: a holder-level group). */
static bool name_ok(const char *s, bool empty_ok)
{
	const char *w;

	if (!*s)
		return empty_ok;
	return config_check_name(s, &w) == 0;       /* 1..255 bytes too */
}

static bool cell_ok(const struct hold_cell *c)
{
	static const char *const states[] = { "ok", "damaged", "incomplete", "other-step",
					      "missing", "unreachable", "differs" };
	bool known = false;

	for (size_t i = 0; c->state && i < sizeof(states) / sizeof(states[0]); i++)
		known |= strcmp(c->state, states[i]) == 0;
	/* A node speaks of the copies of its own commits only. */
	return known && name_ok(c->origin, true) && c->holder && name_ok(c->holder, false) &&
	       (!c->step || name_ok(c->step, false)) &&
	       (c->ncopy == 0 || strcmp(c->origin, c->holder) == 0);
}

int hold_parse(const struct msg *m, const char *holder, struct hold_cell **cells, size_t *n)
{
	struct hold_cell *c = NULL;
	const uint8_t *p;
	size_t off = 0, len, n0 = *n;
	uint16_t key;
	int rc = 0;

	while (rc == 0 && msg_next_field(m, &off, &key, &p, &len) == 1) {
		char **slot = NULL;

		if (key == K_ORIGIN) {
			struct hold_cell *v;

			if (c && !cell_ok(c)) {
				rc = -EBADMSG;
				break;
			}
			v = realloc(*cells, (*n + 1) * sizeof(*v));
			if (!v) {
				rc = -ENOMEM;
				break;
			}
			*cells = v;
			c = &v[(*n)++];
			memset(c, 0, sizeof(*c));
			if (!(c->origin = dup_field(p, len)) ||
			    (holder && !(c->holder = strdup(holder))))
				rc = -EBADMSG;
			continue;
		}
		if (!c)
			continue;       /* fields before the first group */
		switch (key) {
		case K_HOLDER:
			/* A MSG_HOLD speaks for its sender only. */
			if (holder)
				rc = -EBADMSG;
			slot = &c->holder;
			break;
		case K_STATE: slot = &c->state; break;
		case K_STEP: slot = &c->step; break;
		case K_ROOT:
			c->has_root = digest_from_hex((const char *)p, len, &c->root) == 0;
			if (!c->has_root)
				rc = -EBADMSG;
			break;
		case K_FILES_TOTAL:
		case K_BYTES_TOTAL:
			if (len != 8) {
				rc = -EBADMSG;
				break;
			}
			*(key == K_FILES_TOTAL ? &c->files : &c->bytes) = proto_get_le64(p);
			break;
		case K_TEXT:
			if (c->ntext < COPY_TEXTS_MAX && !(c->text[c->ntext++] = dup_field(p, len)))
				rc = -EBADMSG;
			break;
		case K_COPY: {
			struct copy_note note;
			char *t = dup_field(p, len);

			/* Every note is checked; past COPY_NOTES_MAX they are
			 * dropped (more partners than that: the first ones). */
			if (!t || copy_note_parse(t, &note) < 0)
				rc = -EBADMSG;
			if (rc == 0 && c->ncopy < COPY_NOTES_MAX)
				c->copy[c->ncopy++] = t;
			else
				free(t);
			break;
		}
		default:
			break;
		}
		if (slot) {
			free(*slot);
			if (!(*slot = dup_field(p, len)))
				rc = -EBADMSG;
		}
	}
	if (rc == 0 && c && !cell_ok(c))
		rc = -EBADMSG;
	if (rc < 0) {
		/* All or nothing: half a frame's groups must not pass for an answer. */
		for (size_t i = n0; i < *n; i++)
			cell_free(&(*cells)[i]);
		*n = n0;
	}
	return rc;
}
