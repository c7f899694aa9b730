/* `stage manifest PATH [--xxhsum]`: a staged tree's manifest, read locally
 * (no daemon) and checked whole before it is trusted: the file as it is,
 * lines for `xxhsum -H2 -c`, or JSON objects. */
#ifndef STAGE_CLI_MANIFEST_H
#define STAGE_CLI_MANIFEST_H

#include <stdbool.h>
#include <stdio.h>

#include "client/cli_out.h"
#include "common/manifest.h"

/* Runs the command on the tree at root (absolute); returns the exit code. */
int cli_manifest_run(struct cli_out *o, const char *root, bool xxhsum);

/* The line `xxhsum -H2 -c` checks a file entry with, run from inside the
 * tree: "<32 hex>  <raw path>\n". Other entries have none. 0, or -EINVAL for
 * a name xxhsum 0.8 cannot read back (it has a '\n'); nothing is written then. */
int cli_manifest_xxhsum(FILE *f, const struct mf_entry *e);

/* One entry as a JSON object on a line:
 * {"type":"f","path":..,"size":..,"mode":"0644","mtime_ns":..,"digest":..}
 * links add "target"; directories have no digest. */
void cli_manifest_json(FILE *f, const struct mf_entry *e);

#endif
