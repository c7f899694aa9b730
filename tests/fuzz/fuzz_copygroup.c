/* libFuzzer target: a peer's answer to "what do you hold" (MSG_HOLD) and
 * verify --cluster's table (MSG_CELLS), parsed by hold_parse.
 *
 * Byte 0 picks the mode (bit 0: MSG_HOLD from holder "n1", else MSG_CELLS);
 * the rest is the frame's payload. Whatever the bytes, nothing may crash or
 * read outside them; a payload refused must append nothing; a payload
 * accepted must come back the same through hold_put. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/copygroup.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct msg m = { .type = MSG_HOLD };
	struct hold_cell *cells = NULL, *again = NULL;
	size_t n = 0, n2 = 0;
	const char *holder;
	int rc;

	if (size < 1 || proto_check_payload(data + 1, size - 1) != 0)
		return 0;
	holder = data[0] & 1 ? "n1" : NULL;
	m.type = holder ? MSG_HOLD : MSG_CELLS;
	m.buf = (uint8_t *)data + 1;
	m.len = m.cap = size - 1;
	rc = hold_parse(&m, holder, &cells, &n);
	if (rc != 0) {
		/* nothing appended (the array itself may have grown) */
		if ((rc != -EBADMSG && rc != -ENOMEM) || n != 0)
			abort();
		hold_cells_free(cells, 0);
		return 0;
	}
	/* What was accepted builds a frame that parses to the same groups. */
	{
		struct msg out;

		msg_init(&out, m.type);
		for (size_t i = 0; i < n; i++)
			hold_put(&out, &cells[i], holder == NULL);
		if (out.err == 0) {
			if (hold_parse(&out, holder, &again, &n2) != 0 || n2 != n)
				abort();
			for (size_t i = 0; i < n; i++)
				if (strcmp(cells[i].state, again[i].state) != 0 ||
				    cells[i].ntext != again[i].ntext ||
				    cells[i].has_root != again[i].has_root)
					abort();
			hold_cells_free(again, n2);
		}
		msg_free(&out);
	}
	hold_cells_free(cells, n);
	return 0;
}
