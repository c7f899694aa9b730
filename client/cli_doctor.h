/* Rendering of stage doctor's frames: MSG_CHECK (one line per check, ✓ or
 * ✗, and the advice under a problem) and MSG_MATRIX (a node-by-node table).
 * The client knows no check by name: what a check says and which numbers
 * it carries come from the daemon (daemon/doctor/dr_decide.c). */
#ifndef STAGE_CLI_DOCTOR_H
#define STAGE_CLI_DOCTOR_H

#include <stdio.h>

#include "common/proto.h"

int cli_check_human(FILE *out, const struct msg *m);
/* {"event":event,"check":..,"subject":..,"ok":..,"text":..,"advice":..} and
 * the K_NUM members as numbers (or true/false), K_ATTR members as strings;
 * "name[]" members gather into an array, "group.name" into an object. */
void cli_check_json(FILE *out, const struct msg *m, const char *event);
int cli_matrix_human(FILE *out, const struct msg *m);
/* {"event":event,"name":..,"unit":..,"nodes":[..],"cells":[[..],..]} */
void cli_matrix_json(FILE *out, const struct msg *m, const char *event);

#endif
