/* Who a thread acts as on the file system.
 *
 * A shared node runs one staged, usually as root, for many users. Every
 * request acts as the user who asked (the kernel's word for it, SO_PEERCRED
 * and SO_PEERGROUPS, never the client's); what the daemon does on its own
 * acts as the owner of the step it works on. So the kernel and the file
 * server judge each access exactly as for the user's own `cp`.
 *
 * How: a thread switches its file-system uid and gid and its supplementary
 * groups with the raw system calls, which change the calling thread alone
 * (glibc's setgroups changes every thread of the process). A fsuid other
 * than 0 takes the file capabilities (DAC override, chown, fowner) out of
 * the thread's effective set; going back to 0 gives them back. Threads a
 * thread creates start with its credentials (clone copies them), so a
 * request's helpers (a restore's lanes, a probe) act as its user too.
 * io_uring work the kernel hands to its workers runs with the credentials
 * of the submitting thread; rings that serve a user stamp each request with
 * a personality registered under that user (cred_ring_personality), so that
 * what the ring does is pinned to that user whatever the thread does next.
 *
 * States of a thread: the daemon's own, or acting as c (cred_enter(c) ...
 * cred_leave(), or inherited from the thread that started it). cred_enter
 * is not nested: a second one replaces the first. cred_daemon_begin/end
 * step out to the daemon's own for the daemon's state (state_dir) and
 * back, in an inheriting thread too. The kernel's ids are the truth every
 * decision here reads (cred_uid, cred_is_root): a thread-local record
 * would not follow a thread into the threads it starts.
 *
 * A daemon that is not root cannot switch: it serves its own uid alone
 * (cred_serves says so) and cred_enter of that uid is a no-op.
 */
#ifndef STAGE_CRED_H
#define STAGE_CRED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct io_uring;

struct cred {
	uid_t uid;
	gid_t gid;
	unsigned ngroups;            /* supplementary groups, as the kernel gave them */
	gid_t groups[];
};

/* Records the daemon's own identity; before any thread but main runs. */
void cred_init(void);
/* Whether this daemon acts as its callers (it runs as root). */
bool cred_switching(void);
/* The credentials of the process at the other end of a unix socket:
 * uid, gid and groups as the kernel recorded them at connect. 0 or -errno;
 * *out is freed with free(). */
int cred_of_peer(int fd, struct cred **out);
/* The credentials of uid as the system's user database has them (its
 * primary group and its groups; gid alone when it has no entry): how the
 * daemon acts as the owner of what it works on. 0 or -errno; *out freed
 * with free(). */
int cred_of_user(uid_t uid, gid_t gid, struct cred **out);
/* A user named to a peer (a cluster pull's ask, a resume's restore): c's
 * uid, gid and groups as K_UID, K_GID, K_GROUPS added to m; and back, from
 * a peer that holds the cluster key: 0 and *out (NULL: none named; freed
 * with free()), -EBADMSG or -ENOMEM. */
struct msg;
void cred_to_msg(struct msg *m, const struct cred *c);
int cred_from_msg(const struct msg *m, struct cred **out);
/* The credentials of the owner of the directory dirfd, as cred_of_user has
 * them: 0 and *c, NULL when there is nothing to switch to (the daemon's own
 * uid owns it, or the daemon does not switch); or -errno. */
int cred_of_owner(int dirfd, struct cred **c);
/* A thread of the daemon's own acts as the owner of the directory dirfd
 * (its own work on what a user owns: a commit's hashing, a verify that
 * records damage). 1 when it switched: *c is what it entered, the caller
 * does cred_leave and then frees *c; 0 when nothing changed (a thread that
 * already acts as a user, whose request this is; a root-owned directory; a
 * daemon that does not switch), *c NULL; or -errno, nothing changed. */
int cred_enter_owner(int dirfd, struct cred **c);
/* This thread's credentials as the kernel has them (fsuid, fsgid, groups:
 * what a request's helper thread inherited too), or NULL (out of memory).
 * Freed with free(). */
struct cred *cred_of_thread(void);
/* Whether a caller with c may use this daemon: any user when it switches,
 * else its own uid (and root). 0, or -EPERM with why naming both. */
int cred_serves(const struct cred *c, char *why, size_t whylen);
/* This thread acts as c (borrowed: it must outlive the cred_leave). A
 * no-op for the daemon's own uid or a daemon that does not switch. 0 or
 * -errno (the thread is then back to the daemon's own). */
int cred_enter(const struct cred *c);
/* Back to the daemon's own. */
void cred_leave(void);
/* Whom cred_enter on this thread made it act as; NULL: none (the daemon
 * itself, or a thread that inherited a user's credentials from the thread
 * that started it: the functions below read the kernel, and cover both). */
const struct cred *cred_current(void);
/* The uid this thread's files are created as (fsuid), as the kernel has
 * it. */
uid_t cred_uid(void);
/* Whether this thread acts with root's file capabilities (chown to any
 * owner, read anything): fsuid 0 in a root daemon. */
bool cred_is_root(void);
/* Steps out to the daemon's own for its own state and back; never nested
 * (a nested begin aborts): each begin is followed by its end on the same
 * thread. */
void cred_daemon_begin(void);
void cred_daemon_end(void);
/* Between those two: the uid the thread acts as outside them. */
uid_t cred_uid_held(void);
/* A personality of ring for this thread's credentials, to put in each of
 * its requests' sqe->personality; 0 (none needed) when the thread acts as
 * the daemon. Freed with the ring. */
unsigned cred_ring_personality(struct io_uring *ring);
/* Puts personality (of cred_ring_personality) into every request of ring
 * not yet submitted: right before each io_uring_submit, since liburing's
 * prep helpers clear the field. A no-op for 0. */
void cred_ring_stamp(struct io_uring *ring, unsigned personality);
/* mkdirat(dirfd, name, mode) as this thread acts. A directory of the
 * daemon's own (a root: stage_root, the durable root) refuses a user
 * (EACCES): the daemon then makes name there and gives it to the user this
 * thread acts as. 0 (also when name exists), or -errno. */
int cred_mkdirat_given(int dirfd, const char *name, mode_t mode);
/* "alice (uid 1001)" or "uid 1001", for messages. */
const char *cred_name(uid_t uid, char *buf, size_t len);

#endif
