/* Rendering of MSG_CELLS (verify --cluster's table); see cli_cells.c. */
#ifndef STAGE_CLI_CELLS_H
#define STAGE_CLI_CELLS_H

#include <stdio.h>

#include "common/proto.h"

/* The table and the detail lines on out. 0 or -ENOMEM. */
int cli_cells_human(FILE *out, const struct msg *m);
/* One JSON object per copy group on out, with this "event". */
void cli_cells_json(FILE *out, const struct msg *m, const char *event);

#endif
