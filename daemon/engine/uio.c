#include "daemon/engine/uio.h"

#include <errno.h>
#include <stdbool.h>

int uio_init(struct io_uring *ring)
{
	return io_uring_queue_init(4, ring, 0);
}

/* One request, waited for: its result, or -errno. */
static int one(struct io_uring *ring, int fd, void *buf, size_t n, uint64_t off, bool write)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	struct io_uring_cqe *cqe;
	int rc;

	if (!sqe)
		return -EBUSY;
	if (write)
		io_uring_prep_write(sqe, fd, buf, (unsigned)n, off);
	else
		io_uring_prep_read(sqe, fd, buf, (unsigned)n, off);
	rc = io_uring_submit(ring);
	if (rc < 0)
		return rc;
	/* Submitted: wait for this very completion, whatever interrupts. */
	while ((rc = io_uring_wait_cqe(ring, &cqe)) == -EINTR)
		;
	if (rc < 0)
		return rc;
	rc = cqe->res;
	io_uring_cqe_seen(ring, cqe);
	return rc;
}

/* Until n bytes are done, the file ends (a read returns 0) or an error:
 * the bytes done, or -errno. */
static ssize_t all(struct io_uring *ring, int fd, void *buf, size_t n, uint64_t off, bool write)
{
	size_t done = 0;

	while (done < n) {
		int rc = one(ring, fd, (char *)buf + done, n - done, off + done, write);

		if (rc == -EINTR || rc == -EAGAIN)
			continue;
		if (rc < 0)
			return rc;
		if (rc == 0)
			break;
		done += (size_t)rc;
	}
	return (ssize_t)done;
}

ssize_t uio_pread(struct io_uring *ring, int fd, void *buf, size_t n, uint64_t off)
{
	return all(ring, fd, buf, n, off, false);
}

int uio_pwrite(struct io_uring *ring, int fd, const void *buf, size_t n, uint64_t off)
{
	ssize_t rc = all(ring, fd, (void *)buf, n, off, true);

	return rc < 0 ? (int)rc : (size_t)rc < n ? -ENOSPC : 0;
}
