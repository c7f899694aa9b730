/* Who a thread acts as (daemon/fs/cred.h), on real files with real ids
 * (root only; skipped otherwise): the peer of a unix socket is who the
 * kernel says, groups included; a thread that enters a user's credentials
 * creates files as that user and is refused what that user is refused,
 * while another thread of the process stays root all along, and a thread
 * it starts is that user too (and can step out and back); leaving gives
 * the file capabilities back; a ring's personality keeps its requests the
 * user's even after the thread has left; cred_daemon_begin/end step out
 * and back. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/fs/cred.h"

#define NOBODY 65534

static char dir[64];

static int setup(void **state)
{
	snprintf(dir, sizeof(dir), "/var/tmp/test_cred.XXXXXX");
	if (!mkdtemp(dir) || chmod(dir, 0755) < 0)
		return -1;
	cred_init();
	return 0;
}

static int teardown(void **state)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static struct cred *nobody(void)
{
	struct cred *c = calloc(1, sizeof(*c) + sizeof(gid_t));

	c->uid = NOBODY;
	c->gid = NOBODY;
	c->ngroups = 1;
	c->groups[0] = NOBODY;
	return c;
}

static void test_peer_is_who_the_kernel_says(void **state)
{
	int sv[2];
	struct cred *c = NULL;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(cred_of_peer(sv[0], &c), 0);
	assert_int_equal(c->uid, geteuid());
	assert_int_equal(c->gid, getegid());
	assert_int_equal((int)c->ngroups, getgroups(0, NULL));
	free(c);
	close(sv[0]);
	close(sv[1]);
}

static void test_user_of_the_database(void **state)
{
	struct cred *c = NULL;

	assert_int_equal(cred_of_user(0, 0, &c), 0);
	assert_int_equal(c->uid, 0);
	assert_true(c->ngroups >= 1);
	assert_int_equal(c->groups[0], 0);
	free(c);
	/* no entry: its gid alone */
	assert_int_equal(cred_of_user(4000123, 4000124, &c), 0);
	assert_int_equal(c->ngroups, 1);
	assert_int_equal(c->groups[0], 4000124);
	free(c);
}

struct other {
	pthread_t t;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int step;
	uid_t seen;
};

/* A second thread that looks at its own fsuid while the first has entered. */
static void *other_main(void *arg)
{
	struct other *o = arg;
	char path[128];
	struct stat st;
	int fd;

	pthread_mutex_lock(&o->mu);
	while (o->step < 1)
		pthread_cond_wait(&o->cv, &o->mu);
	snprintf(path, sizeof(path), "%s/by-other", dir);
	fd = open(path, O_CREAT | O_WRONLY, 0600);
	o->seen = (fd >= 0 && fstat(fd, &st) == 0) ? st.st_uid : (uid_t)-1;
	if (fd >= 0)
		close(fd);
	o->step = 2;
	pthread_cond_broadcast(&o->cv);
	pthread_mutex_unlock(&o->mu);
	return NULL;
}

static void test_a_thread_acts_as_the_user_alone(void **state)
{
	struct other o = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
	struct cred *c = nobody();
	char path[128], secret[128];
	struct stat st;
	int fd;

	snprintf(secret, sizeof(secret), "%s/root-only", dir);
	fd = open(secret, O_CREAT | O_WRONLY, 0600);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(pthread_create(&o.t, NULL, other_main, &o), 0);

	assert_int_equal(cred_enter(c), 0);
	assert_ptr_equal(cred_current(), c);
	assert_false(cred_is_root());
	assert_int_equal(cred_uid(), NOBODY);
	/* refused what nobody is refused: root's 0600 file, a chown */
	assert_int_equal(open(secret, O_RDONLY), -1);
	assert_int_equal(errno, EACCES);
	snprintf(path, sizeof(path), "%s/by-nobody", dir);
	/* the directory is root's 0755: nobody cannot create in it */
	assert_int_equal(open(path, O_CREAT | O_WRONLY, 0600), -1);
	assert_int_equal(errno, EACCES);
	cred_leave();
	assert_int_equal(chmod(dir, 0777), 0);
	assert_int_equal(cred_enter(c), 0);
	fd = open(path, O_CREAT | O_WRONLY, 0600);
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_uid, NOBODY);
	assert_int_equal(st.st_gid, NOBODY);
	assert_int_equal(fchown(fd, 0, 0), -1);
	close(fd);

	/* meanwhile the other thread is still root */
	pthread_mutex_lock(&o.mu);
	o.step = 1;
	pthread_cond_broadcast(&o.cv);
	while (o.step < 2)
		pthread_cond_wait(&o.cv, &o.mu);
	pthread_mutex_unlock(&o.mu);
	pthread_join(o.t, NULL);
	assert_int_equal(o.seen, 0);

	/* the daemon's own work as an owner does not switch a thread that
	 * already acts as a user (it would leave it as root after) */
	{
		struct cred *oc = NULL;
		int dfd = open(dir, O_RDONLY | O_DIRECTORY);

		assert_true(dfd >= 0);
		assert_int_equal(cred_enter_owner(dfd, &oc), 0);
		assert_null(oc);
		assert_int_equal(cred_uid(), NOBODY);
		close(dfd);
	}

	/* stepping out for the daemon's own state, and back */
	cred_daemon_begin();
	assert_true(cred_is_root());
	assert_int_equal(cred_uid_held(), NOBODY);
	fd = open(secret, O_RDONLY);
	assert_true(fd >= 0);
	close(fd);
	cred_daemon_end();
	assert_int_equal(open(secret, O_RDONLY), -1);

	cred_leave();
	assert_true(cred_is_root());
	fd = open(secret, O_RDONLY);       /* the file capabilities are back */
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(chown(path, 0, 0), 0);
	free(c);
}

struct child {
	uid_t uid, uid_out, uid_back;
	bool root, root_out;
};

/* Started by a thread acting as nobody: it has no record of its own, but
 * the kernel's ids are nobody's, and it can step out and back. */
static void *child_main(void *arg)
{
	struct child *ch = arg;

	ch->uid = cred_uid();
	ch->root = cred_is_root();
	cred_daemon_begin();
	ch->uid_out = cred_uid();
	ch->root_out = cred_is_root();
	cred_daemon_end();
	ch->uid_back = cred_uid();
	cred_leave();
	return NULL;
}

static void test_a_thread_started_by_a_user_is_that_user(void **state)
{
	struct cred *c = nobody();
	struct child ch = { 0 };
	pthread_t t;

	assert_int_equal(cred_enter(c), 0);
	assert_int_equal(pthread_create(&t, NULL, child_main, &ch), 0);
	pthread_join(t, NULL);
	cred_leave();
	assert_int_equal(ch.uid, NOBODY);
	assert_false(ch.root);
	assert_int_equal(ch.uid_out, 0);
	assert_true(ch.root_out);
	assert_int_equal(ch.uid_back, NOBODY);
	free(c);
}

static void test_a_rings_personality_outlives_the_thread_leaving(void **state)
{
	struct cred *c = nobody();
	struct io_uring ring;
	struct io_uring_cqe *cqe;
	char secret[128];
	unsigned pers;
	int fd;

	snprintf(secret, sizeof(secret), "%s/root-only-2", dir);
	fd = open(secret, O_CREAT | O_WRONLY, 0600);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(io_uring_queue_init(4, &ring, 0), 0);
	assert_int_equal(cred_ring_personality(&ring), 0);   /* the daemon's own: none */
	assert_int_equal(cred_enter(c), 0);
	pers = cred_ring_personality(&ring);
	cred_leave();
	if (!pers) {
		io_uring_queue_exit(&ring);
		free(c);
		skip();
	}
	/* the thread is root again; the request still acts as nobody */
	io_uring_prep_openat(io_uring_get_sqe(&ring), AT_FDCWD, secret, O_RDONLY, 0);
	cred_ring_stamp(&ring, pers);
	assert_int_equal(io_uring_submit(&ring), 1);
	assert_int_equal(io_uring_wait_cqe(&ring, &cqe), 0);
	assert_int_equal(cqe->res, -EACCES);
	io_uring_cqe_seen(&ring, cqe);
	/* and without it, as the thread: root */
	io_uring_prep_openat(io_uring_get_sqe(&ring), AT_FDCWD, secret, O_RDONLY, 0);
	assert_int_equal(io_uring_submit(&ring), 1);
	assert_int_equal(io_uring_wait_cqe(&ring, &cqe), 0);
	assert_true(cqe->res >= 0);
	close(cqe->res);
	io_uring_cqe_seen(&ring, cqe);
	io_uring_queue_exit(&ring);
	free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_peer_is_who_the_kernel_says),
		cmocka_unit_test(test_user_of_the_database),
		cmocka_unit_test(test_a_thread_acts_as_the_user_alone),
		cmocka_unit_test(test_a_thread_started_by_a_user_is_that_user),
		cmocka_unit_test(test_a_rings_personality_outlives_the_thread_leaving),
	};

	if (geteuid() != 0) {
		printf("test_cred: needs root (switching credentials), skipped\n");
		return 77;
	}
	return cmocka_run_group_tests(tests, setup, teardown);
}
