/* stage pull: mirror a source tree into the stage root, hashing every byte
 * into a manifest. */
#ifndef STAGE_PULL_H
#define STAGE_PULL_H

#include "daemon/job/job.h"

/* Serves one MSG_PULL_REQ on job j (sends the result itself). */
void pull_run(struct job *j, const char *src_arg, const char *dest_arg);

#endif
