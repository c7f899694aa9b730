/* vgshim: an LD_PRELOAD for staged under valgrind (memcheck), used only by
 * `make valgrind` (tests/integration/conftest.py with STAGE_VALGRIND=1).
 * It changes how the daemon waits for io_uring and how openat2 reaches the
 * kernel, never what the daemon computes, to get past four limits of
 * Debian 12's valgrind (3.19):
 *
 * 1. valgrind runs one thread at a time and keeps its lock while a thread
 *    is inside io_uring_enter: a thread that blocks there waiting for a
 *    completion freezes every other thread, so the daemon's main loop waits
 *    forever for a pull thread that never runs (and SIGTERM is never
 *    handled). The blocking waits the daemon uses (io_uring_wait_cqe,
 *    io_uring_submit_and_wait, io_uring_submit_and_wait_timeout) submit
 *    without waiting here, then sleep in poll(2) on the ring's fd, which
 *    valgrind knows may block, and take the completion as before.
 * 2. valgrind does not know openat2 (syscall 437) and fails it with ENOSYS:
 *    syscall(SYS_openat2, ...) runs here as IORING_OP_OPENAT2, the same
 *    kernel code with the same open_how (RESOLVE_BENEATH and all).
 * 3. memcheck does not see what the kernel reads from or writes to memory
 *    named by an SQE. At submission, this does for IORING_OP_READ, WRITE and
 *    STATX what valgrind does for read(2), write(2) and statx(2): it reports
 *    a buffer that is not addressable, and the uninitialised bytes of one
 *    written, with the submitting stack; and it marks what the kernel will
 *    fill as defined (all LEN bytes of a read, even if it comes back short).
 * 4. valgrind does not know cachestat (syscall 451) and warns of it: it
 *    fails here with ENOSYS before valgrind sees it, as on a kernel older
 *    than 6.5, and the daemon asks mincore(2) instead (engine/pcache.c).
 */
#include <dlfcn.h>
#include <errno.h>
#include <liburing.h>
#include <linux/openat2.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <valgrind/memcheck.h>

typedef long (*syscall_fn)(long, ...);
typedef int (*submit_fn)(struct io_uring *);
typedef int (*get_cqe_fn)(struct io_uring *, struct io_uring_cqe **, unsigned, unsigned, sigset_t *);

static void *next(const char *name)
{
	void *f = dlsym(RTLD_NEXT, name);

	if (!f)
		abort();
	return f;
}

/* ------------------------------------------------------------ 3: buffers */

static void *ptr(uint64_t a)
{
	return (void *)(uintptr_t)a;
}

/* The SQEs not yet handed to the kernel: what io_uring_submit will send. */
static void check_sqes(struct io_uring *ring)
{
	unsigned shift = ring->flags & IORING_SETUP_SQE128 ? 1 : 0;

	for (unsigned i = ring->sq.sqe_head; i != ring->sq.sqe_tail; i++) {
		struct io_uring_sqe *s = &ring->sq.sqes[(i & ring->sq.ring_mask) << shift];

		switch (s->opcode) {
		case IORING_OP_READ:
			(void)VALGRIND_CHECK_MEM_IS_ADDRESSABLE(ptr(s->addr), s->len);
			(void)VALGRIND_MAKE_MEM_DEFINED_IF_ADDRESSABLE(ptr(s->addr), s->len);
			break;
		case IORING_OP_WRITE:
			(void)VALGRIND_CHECK_MEM_IS_DEFINED(ptr(s->addr), s->len);
			break;
		case IORING_OP_STATX:       /* addr2 (off): the struct statx */
			(void)VALGRIND_CHECK_MEM_IS_ADDRESSABLE(ptr(s->off), sizeof(struct statx));
			(void)VALGRIND_MAKE_MEM_DEFINED_IF_ADDRESSABLE(ptr(s->off), sizeof(struct statx));
			break;
		default:
			break;
		}
	}
}

int io_uring_submit(struct io_uring *ring)
{
	static submit_fn real;

	if (!real)
		real = (submit_fn)next("io_uring_submit");
	check_sqes(ring);
	return real(ring);
}

/* ------------------------------------------------------------ 1: waits */

static int64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Until nr completions are in the CQ ring: 0, -ETIME after timeout_ms
 * (< 0: none), or -errno (-EINTR). */
static int wait_ready(struct io_uring *ring, unsigned nr, int timeout_ms)
{
	int64_t end = timeout_ms < 0 ? 0 : now_ms() + timeout_ms;

	for (;;) {
		struct pollfd p = { .fd = ring->ring_fd, .events = POLLIN };
		int left = -1, rc;

		/* Completions the kernel holds back (an overflowed CQ ring, task
		 * work) come in on a non-blocking enter. */
		if (IO_URING_READ_ONCE(*ring->sq.kflags) & (IORING_SQ_CQ_OVERFLOW | IORING_SQ_TASKRUN))
			io_uring_get_events(ring);
		if (io_uring_cq_ready(ring) >= nr)
			return 0;
		if (timeout_ms >= 0) {
			int64_t l = end - now_ms();

			if (l <= 0)
				return -ETIME;
			left = (int)l;
		}
		if (io_uring_cq_ready(ring) > 0) {
			/* some but not nr: poll would return at once */
			usleep(1000);
			continue;
		}
		rc = poll(&p, 1, left);
		if (rc < 0)
			return -errno;
	}
}

int __io_uring_get_cqe(struct io_uring *ring, struct io_uring_cqe **cqe_ptr, unsigned submit,
		       unsigned wait_nr, sigset_t *sigmask)
{
	static get_cqe_fn real;

	if (!real)
		real = (get_cqe_fn)next("__io_uring_get_cqe");
	if (!wait_nr || submit || sigmask)
		return real(ring, cqe_ptr, submit, wait_nr, sigmask);
	for (;;) {
		int rc = wait_ready(ring, wait_nr, -1);

		if (rc < 0)
			return rc;
		rc = real(ring, cqe_ptr, 0, 0, NULL);   /* a peek now */
		if (rc != -EAGAIN)
			return rc;
	}
}

int io_uring_submit_and_wait(struct io_uring *ring, unsigned wait_nr)
{
	int rc = io_uring_submit(ring), w;

	if (rc < 0 || !wait_nr)
		return rc;
	w = wait_ready(ring, wait_nr, -1);
	return w < 0 && rc == 0 ? w : rc;
}

int io_uring_submit_and_wait_timeout(struct io_uring *ring, struct io_uring_cqe **cqe_ptr,
				     unsigned wait_nr, struct __kernel_timespec *ts, sigset_t *sigmask)
{
	int rc = io_uring_submit(ring), w = 0;

	(void)sigmask;
	*cqe_ptr = NULL;
	if (rc < 0)
		return rc;
	if (wait_nr)
		w = wait_ready(ring, wait_nr,
			       ts ? (int)(ts->tv_sec * 1000 + ts->tv_nsec / 1000000) : -1);
	if (w < 0)
		return w;
	if (io_uring_cq_ready(ring))
		io_uring_peek_cqe(ring, cqe_ptr);
	return rc;
}

/* ------------------------------------------------------------ 2: openat2 */

static long openat2_ring(int dirfd, const char *path, struct open_how *how, size_t size)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	static struct io_uring ring;
	static int ready;
	struct io_uring_sqe *sqe;
	struct io_uring_cqe *cqe;
	int rc;

	pthread_mutex_lock(&lock);
	if (!ready) {
		rc = io_uring_queue_init(2, &ring, 0);
		if (rc < 0)
			goto out;
		ready = 1;
	}
	sqe = io_uring_get_sqe(&ring);
	io_uring_prep_openat2(sqe, dirfd, path, how);
	sqe->len = (unsigned)size;
	rc = io_uring_submit(&ring);
	if (rc >= 0)
		while ((rc = io_uring_wait_cqe(&ring, &cqe)) == -EINTR)
			;
	if (rc >= 0) {
		rc = cqe->res;
		io_uring_cqe_seen(&ring, cqe);
	}
out:
	pthread_mutex_unlock(&lock);
	if (rc < 0) {
		errno = -rc;
		return -1;
	}
	return rc;
}

long syscall(long nr, ...)
{
	static syscall_fn real;
	long a[6];
	va_list ap;

	va_start(ap, nr);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (nr == SYS_openat2)
		return openat2_ring((int)a[0], (const char *)a[1], (struct open_how *)a[2], (size_t)a[3]);
	if (nr == 451) {        /* cachestat */
		errno = ENOSYS;
		return -1;
	}
	if (!real)
		real = (syscall_fn)next("syscall");
	return real(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}
