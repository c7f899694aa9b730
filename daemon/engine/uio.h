/* Positional reads and writes through an io_uring, one at a time: for the
 * paths where queue depth does not matter (restore's reads of local chunks,
 * a fetched manifest), so that file I/O still goes through io_uring like
 * everywhere else. Files being built go through the write queue (wq.h). */
#ifndef STAGE_UIO_H
#define STAGE_UIO_H

#include <liburing.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* 0 or -errno. Release with io_uring_queue_exit. */
int uio_init(struct io_uring *ring);
/* Reads up to n bytes at off, retrying short reads: the bytes read (fewer
 * only at the end of the file) or -errno. */
ssize_t uio_pread(struct io_uring *ring, int fd, void *buf, size_t n, uint64_t off);
/* Writes all n bytes at off: 0, or -errno (-ENOSPC for a short write). */
int uio_pwrite(struct io_uring *ring, int fd, const void *buf, size_t n, uint64_t off);

#endif
