/* Whether a file system answers, asked without staking the asking thread on
 * it.
 *
 * An NFS server that went away blocks every call on its mount: a hard mount
 * forever, and not even kill -9 takes a thread out of it. A pull started
 * there would hold its connection's thread until the server came back, and
 * a script that retried it every minute would take one more each time,
 * until the daemon had none left for `stage status`. So before a pull
 * touches its source, a probe thread asks the source's file system
 * (statfs of the path, which takes every lookup on the way and a round trip
 * to the server) and the pull waits for the answer, FSPROBE_WAIT_MS at
 * most, while its client may still hang up.
 *
 * One probe is out per mount (found in /proc/self/mountinfo by the path's
 * text alone: nothing is asked of the file system to know where it is), and
 * whoever asks while it is out waits for the same answer; one out longer
 * than the wait means the mount is not answering, and the asker is refused
 * at once. So a mount that hangs costs one thread for the probe, plus the
 * calls that were under way when it stopped, however often it is asked.
 *
 * States of a mount's slot: idle --ask--> out --answer--> idle. A slot that
 * is idle is reused for another mount; FSPROBE_SLOTS bounds the probes out
 * at once.
 */
#ifndef STAGE_FSPROBE_H
#define STAGE_FSPROBE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/proto.h"

#define FSPROBE_WAIT_MS 5000u
#define FSPROBE_SLOTS 16u

/* Asks path's file system whether it answers; waits wait_ms at most,
 * calling gone(arg) every 100 ms (NULL: never). 0 when it answered
 * (whatever it said: a missing path is the caller's to find), -ETIMEDOUT
 * when it did not, -EBUSY when FSPROBE_SLOTS mounts are not answering, or
 * -ECANCELED when gone() said so; why names the mount and for how long.
 * Another error (no memory, no thread) is returned without asking. */
int fsprobe_answers(const char *path, unsigned wait_ms, bool (*gone)(void *), void *arg,
		    char *why, size_t whylen);
/* One "not answering" pair per mount whose probe is out for longer than a
 * second, for `stage status`. */
void fsprobe_status(struct msg *m);

/* The mount point beneath which path (absolute) lies, by the text of both,
 * from a mountinfo table's text; "/" for a path with "..". Exposed for the
 * unit test. 0 or -errno. */
int fsprobe_mount_of(const char *mountinfo, const char *path, char *out, size_t outlen);

#endif
