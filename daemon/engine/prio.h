/* The background threads' priority: with [transfer] priority = low, the
 * calling thread's CPU priority at least nice 10 and its I/O priority the
 * lowest best-effort level (replication's senders and receivers, the
 * committer, the durable drain), so that a trainer's own saves come first. */
#ifndef STAGE_PRIO_H
#define STAGE_PRIO_H

/* priority: enum cfg_priority; what names the thread for the log if it
 * fails. */
void prio_background(int priority, const char *what);

#endif
