#include "daemon/fs/cred.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <liburing.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/proto.h"

/* The daemon's own identity, fixed at cred_init. */
static uid_t own_uid;
static gid_t own_gid;
static gid_t *own_groups;
static int own_ngroups;
static bool switching;

static _Thread_local const struct cred *cur;   /* whom this thread acts as */
static _Thread_local const struct cred *held;  /* stepped out of by cred_daemon_begin */

void cred_init(void)
{
	int n;

	own_uid = geteuid();
	own_gid = getegid();
	switching = own_uid == 0;
	n = getgroups(0, NULL);
	if (n > 0 && (own_groups = calloc((size_t)n, sizeof(gid_t))) != NULL)
		own_ngroups = getgroups(n, own_groups);
	if (own_ngroups < 0)
		own_ngroups = 0;
}

bool cred_switching(void)
{
	return switching;
}

static struct cred *cred_alloc(unsigned ngroups)
{
	struct cred *c = calloc(1, sizeof(*c) + (size_t)ngroups * sizeof(gid_t));

	if (c)
		c->ngroups = ngroups;
	return c;
}

int cred_of_peer(int fd, struct cred **out)
{
	struct ucred uc;
	socklen_t len = sizeof(uc);
	gid_t *g = NULL;
	struct cred *c;
	int n = 0;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
		return -errno;
	/* The groups as the kernel saw them at connect: ERANGE tells how many. */
	len = 64 * sizeof(gid_t);
	for (int tries = 0; tries < 4; tries++) {
		gid_t *ng = realloc(g, len ? len : sizeof(gid_t));

		if (!ng) {
			free(g);
			return -ENOMEM;
		}
		g = ng;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) == 0) {
			n = (int)(len / sizeof(gid_t));
			break;
		}
		if (errno != ERANGE) {
			int err = -errno;

			free(g);
			return err;
		}
	}
	c = cred_alloc((unsigned)n);
	if (!c) {
		free(g);
		return -ENOMEM;
	}
	c->uid = uc.uid;
	c->gid = uc.gid;
	if (n)
		memcpy(c->groups, g, (size_t)n * sizeof(gid_t));
	free(g);
	*out = c;
	return 0;
}

int cred_of_user(uid_t uid, gid_t gid, struct cred **out)
{
	struct passwd pw, *pwp = NULL;
	char buf[4096];
	gid_t *g = NULL;
	int n = 32;
	struct cred *c;

	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &pwp) == 0 && pwp) {
		/* The user's own groups, not those of what they own: a
		 * directory's group may be one they are not in. */
		gid = pw.pw_gid;
		for (int tries = 0; tries < 4; tries++) {
			gid_t *ng = realloc(g, (size_t)n * sizeof(gid_t));

			if (!ng) {
				free(g);
				return -ENOMEM;
			}
			g = ng;
			if (getgrouplist(pw.pw_name, gid, g, &n) >= 0)
				break;
			if (tries == 3)
				n = 0;
		}
	} else {
		n = 0;
	}
	c = cred_alloc(n > 0 ? (unsigned)n : 1);
	if (!c) {
		free(g);
		return -ENOMEM;
	}
	c->uid = uid;
	c->gid = gid;
	if (n > 0)
		memcpy(c->groups, g, (size_t)n * sizeof(gid_t));
	else
		c->groups[0] = gid;
	free(g);
	*out = c;
	return 0;
}

/* c's groups as "g1,g2,..." (malloc'd; NULL: out of memory). */
static char *groups_text(const struct cred *c)
{
	char *t = malloc((size_t)c->ngroups * 11 + 1), *p = t;

	if (!t)
		return NULL;
	*p = '\0';
	for (unsigned i = 0; i < c->ngroups; i++)
		p += sprintf(p, "%s%u", i ? "," : "", (unsigned)c->groups[i]);
	return t;
}

/* The kernel's own bound on supplementary groups (NGROUPS_MAX). */
#define CRED_GROUPS_MAX 65536

/* uid, gid and such a text (from a peer that holds the cluster key) into
 * *out. 0, -EINVAL (a number out of range, too many groups) or -ENOMEM. */
static int from_text(uint64_t uid, uint64_t gid, const char *groups, struct cred **out)
{
	unsigned n = 0;
	struct cred *c;
	const char *p;

	if (uid >= UINT32_MAX || gid >= UINT32_MAX)
		return -EINVAL;
	for (p = groups; *p; p++)
		n += *p == ',';
	n += *groups != '\0';
	if (n > CRED_GROUPS_MAX)
		return -EINVAL;
	c = cred_alloc(n);
	if (!c)
		return -ENOMEM;
	c->uid = (uid_t)uid;
	c->gid = (gid_t)gid;
	p = groups;
	for (unsigned i = 0; i < n; i++) {
		char *end;
		unsigned long v;

		errno = 0;
		v = strtoul(p, &end, 10);
		if (errno || end == p || *p < '0' || *p > '9' || v >= UINT32_MAX ||
		    (*end != ',' && *end != '\0')) {
			free(c);
			return -EINVAL;
		}
		c->groups[i] = (gid_t)v;
		p = *end ? end + 1 : end;
	}
	*out = c;
	return 0;
}

void cred_to_msg(struct msg *m, const struct cred *c)
{
	char *g = groups_text(c);

	msg_put_u64(m, K_UID, c->uid);
	msg_put_u64(m, K_GID, c->gid);
	msg_put_str(m, K_GROUPS, g ? g : "");
	free(g);
}

int cred_from_msg(const struct msg *m, struct cred **out)
{
	uint64_t uid, gid;
	char *groups = NULL;
	int rc;

	*out = NULL;
	if (msg_get_u64(m, K_UID, &uid) < 0)
		return 0;
	if (msg_get_u64(m, K_GID, &gid) < 0 || msg_get_str(m, K_GROUPS, &groups) < 0)
		return -EBADMSG;
	rc = from_text(uid, gid, groups, out);
	free(groups);
	return rc == -ENOMEM ? rc : rc < 0 ? -EBADMSG : 0;
}

const char *cred_name(uid_t uid, char *buf, size_t len)
{
	struct passwd pw, *pwp = NULL;
	char tmp[4096];

	if (getpwuid_r(uid, &pw, tmp, sizeof(tmp), &pwp) == 0 && pwp)
		snprintf(buf, len, "%s (uid %u)", pw.pw_name, (unsigned)uid);
	else
		snprintf(buf, len, "uid %u", (unsigned)uid);
	return buf;
}

int cred_serves(const struct cred *c, char *why, size_t whylen)
{
	char me[128], them[128];

	if (switching || c->uid == own_uid || c->uid == 0)
		return 0;
	snprintf(why, whylen, "this staged runs as %s, not as root, and serves that user alone; "
		 "%s cannot use it (run a staged of your own, or ask for the node's)",
		 cred_name(own_uid, me, sizeof(me)), cred_name(c->uid, them, sizeof(them)));
	return -EPERM;
}

/* The raw calls: each changes the calling thread alone. setfs[ug]id
 * return the previous value and never fail loudly; asking with -1 reads
 * the value back. */
static int set_ids(uid_t uid, gid_t gid, size_t ngroups, const gid_t *groups)
{
	if (syscall(SYS_setgroups, ngroups, groups) < 0)
		return -errno;
	syscall(SYS_setfsgid, gid);
	if ((gid_t)syscall(SYS_setfsgid, (gid_t)-1) != gid)
		return -EPERM;
	syscall(SYS_setfsuid, uid);
	if ((uid_t)syscall(SYS_setfsuid, (uid_t)-1) != uid)
		return -EPERM;
	return 0;
}

/* The thread's file-system ids as the kernel has them: what every call is
 * judged by. A thread started by one acting as a user inherits them
 * without this file's thread-local record of it, so decisions read these. */
static uid_t fsuid_now(void)
{
	return (uid_t)syscall(SYS_setfsuid, (uid_t)-1);
}

static gid_t fsgid_now(void)
{
	return (gid_t)syscall(SYS_setfsgid, (gid_t)-1);
}

void cred_leave(void)
{
	cur = NULL;
	if (!switching)
		return;
	/* The uid first: back at 0 it regains the file capabilities. */
	syscall(SYS_setfsuid, own_uid);
	syscall(SYS_setfsgid, own_gid);
	syscall(SYS_setgroups, (size_t)own_ngroups, own_groups);
}

int cred_enter(const struct cred *c)
{
	int rc;

	cred_leave();
	if (!switching || c->uid == own_uid)
		return 0;
	rc = set_ids(c->uid, c->gid, c->ngroups, c->groups);
	if (rc < 0) {
		cred_leave();
		return rc;
	}
	cur = c;
	return 0;
}

const struct cred *cred_current(void)
{
	return cur;
}

uid_t cred_uid(void)
{
	return fsuid_now();
}

bool cred_is_root(void)
{
	return own_uid == 0 && fsuid_now() == 0;
}

struct cred *cred_of_thread(void)
{
	int n = getgroups(0, NULL);
	struct cred *c = cred_alloc(n > 0 ? (unsigned)n : 0);

	if (!c)
		return NULL;
	if (n > 0 && getgroups(n, c->groups) != n) {
		free(c);
		return NULL;
	}
	c->uid = fsuid_now();
	c->gid = fsgid_now();
	return c;
}

static _Thread_local struct cred *held_own;    /* held, when cred_daemon_begin made it */

uid_t cred_uid_held(void)
{
	return held ? held->uid : cred_uid();
}

void cred_daemon_begin(void)
{
	/* Not nested: an inner begin would lose what the outer one holds, and
	 * the rest of the request would run as the daemon. */
	if (held)
		abort();
	held = cur;
	if (!held && switching && fsuid_now() != own_uid) {
		/* Inherited, not entered here: remembered from the kernel. Should
		 * that fail, the thread stays as it is (its state writes fail;
		 * nothing is done as the daemon that the user could not). */
		held = held_own = cred_of_thread();
		if (!held)
			return;
	}
	cred_leave();
}

void cred_daemon_end(void)
{
	static const struct cred nobody = { .uid = 65534, .gid = 65534 };
	const struct cred *c = held;
	int rc;

	held = NULL;
	rc = c ? cred_enter(c) : 0;
	if (c == held_own) {
		cur = NULL;     /* not this thread's to keep a pointer to */
		free(held_own);
		held_own = NULL;
	}
	if (rc == 0)
		return;
	/* It worked a moment ago; should it not now, the rest of the request
	 * must not run as the daemon: it runs as nobody, and fails. */
	if (set_ids(nobody.uid, nobody.gid, 0, NULL) == 0)
		cur = &nobody;
	else
		abort();
}

unsigned cred_ring_personality(struct io_uring *ring)
{
	int id;

	if (!switching || fsuid_now() == own_uid)
		return 0;
	/* Without one the kernel still uses the submitter's credentials, which
	 * are the same while the thread stays in; the personality pins them. */
	id = io_uring_register_personality(ring);
	return id > 0 ? (unsigned)id : 0;
}

void cred_ring_stamp(struct io_uring *ring, unsigned personality)
{
	unsigned mask = *ring->sq.kring_mask;

	if (!personality)
		return;
	for (unsigned i = ring->sq.sqe_head; i != ring->sq.sqe_tail; i++)
		ring->sq.sqes[i & mask].personality = (__u16)personality;
}

int cred_mkdirat_given(int dirfd, const char *name, mode_t mode)
{
	uid_t uid = fsuid_now();
	gid_t gid = fsgid_now();
	int ret = 0;

	if (mkdirat(dirfd, name, mode) == 0 || errno == EEXIST)
		return 0;
	if (errno != EACCES || !switching || uid == own_uid)
		return -errno;
	cred_daemon_begin();
	if (mkdirat(dirfd, name, mode) < 0)
		ret = errno == EEXIST ? 0 : -errno;
	else if (fchownat(dirfd, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
		ret = -errno;
	cred_daemon_end();
	return ret;
}

int cred_of_owner(int dirfd, struct cred **c)
{
	struct stat st;

	*c = NULL;
	if (!switching)
		return 0;
	if (fstat(dirfd, &st) < 0)
		return -errno;
	return st.st_uid == own_uid ? 0 : cred_of_user(st.st_uid, st.st_gid, c);
}

int cred_enter_owner(int dirfd, struct cred **c)
{
	int rc;

	*c = NULL;
	if (!cred_is_root())
		return 0;
	rc = cred_of_owner(dirfd, c);
	if (rc < 0 || !*c)
		return rc;
	if ((rc = cred_enter(*c)) < 0) {
		free(*c);
		*c = NULL;
		return rc;
	}
	return 1;
}
