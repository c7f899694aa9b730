/*
 * tools/bench/copybound.c: the one-copy bound of the data-plane benchmark.
 *
 * usage: copybound OUTDIR FILE...
 *
 * Reads every FILE once and writes the same bytes to OUTDIR/w000000,
 * w000001, ... (made, truncated), each written file fsync'd, with one
 * io_uring: 4 MiB blocks, at most 8 reads in flight and 16 buffers (so
 * 8 writes or more); a block read is written from the same buffer (no copy in user
 * space). O_DIRECT on both sides where the file system takes it (a tmpfs
 * does not: buffered there, said in the output). Prints one line of JSON:
 * {"bytes": N, "secs": S, "direct_read": B, "direct_write": B}, S from the
 * first open to the last fsync. This is what a transfer that reads a step
 * and writes it elsewhere cannot beat on the same disk: tools/bench/dataplane
 * runs it alongside stage (fio does the same but cannot be carried to a
 * machine without a package registry; its dependencies are too many).
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BLOCK   (4u << 20)
#define NBUF    16
#define DEPTH   8

struct file {
	int in, out;
	uint64_t size, next;            /* next offset to read */
};

struct buf {
	void *p;
	int file;                       /* -1: free */
	uint64_t off;
	unsigned len;
	int writing;
};

static int open_in(const char *path, int *direct)
{
	int fd = open(path, O_RDONLY | O_DIRECT);
	if (fd >= 0) {
		*direct = 1;
		return fd;
	}
	*direct = 0;
	return open(path, O_RDONLY);
}

static int open_out(const char *path, int *direct)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
	if (fd >= 0) {
		*direct = 1;
		return fd;
	}
	*direct = 0;
	return open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: copybound OUTDIR FILE...\n");
		return 2;
	}
	int nf = argc - 2, din = 1, dout = 1;
	struct file *f = calloc((size_t)nf, sizeof(*f));
	struct buf b[NBUF];
	struct io_uring ring;
	if (!f || io_uring_queue_init(2 * DEPTH, &ring, 0) < 0) {
		fprintf(stderr, "copybound: cannot set up (%s)\n", strerror(errno));
		return 1;
	}
	for (int i = 0; i < NBUF; i++) {
		if (posix_memalign(&b[i].p, 4096, BLOCK)) {
			fprintf(stderr, "copybound: out of memory\n");
			return 1;
		}
		b[i].file = -1;
	}
	double t0 = now();
	for (int i = 0; i < nf; i++) {
		char out[4096];
		struct stat st;
		int d;
		snprintf(out, sizeof(out), "%s/w%06d", argv[1], i);
		f[i].in = open_in(argv[i + 2], &d);
		din &= d;
		f[i].out = open_out(out, &d);
		dout &= d;
		if (f[i].in < 0 || f[i].out < 0 || fstat(f[i].in, &st) < 0) {
			fprintf(stderr, "copybound: %s or %s: %s\n", argv[i + 2], out, strerror(errno));
			return 1;
		}
		f[i].size = (uint64_t)st.st_size;
	}
	uint64_t total = 0;
	int cur = 0, reads = 0, writes = 0;
	for (;;) {
		/* Start reads while a buffer is free and fewer than DEPTH are in flight. */
		for (int i = 0; i < NBUF && reads < DEPTH; i++) {
			if (b[i].file >= 0)
				continue;
			while (cur < nf && f[cur].next >= f[cur].size)
				cur++;
			if (cur == nf)
				break;
			uint64_t left = f[cur].size - f[cur].next;
			b[i].file = cur;
			b[i].off = f[cur].next;
			b[i].len = left < BLOCK ? (unsigned)left : BLOCK;
			b[i].writing = 0;
			f[cur].next += b[i].len;
			/* O_DIRECT needs whole blocks: read a rounded length, write what is there. */
			unsigned rl = din ? (b[i].len + 4095u) & ~4095u : b[i].len;
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
			io_uring_prep_read(sqe, f[cur].in, b[i].p, rl, b[i].off);
			io_uring_sqe_set_data(sqe, &b[i]);
			reads++;
		}
		if (reads + writes == 0)
			break;
		io_uring_submit(&ring);
		struct io_uring_cqe *cqe;
		int rc = io_uring_wait_cqe(&ring, &cqe);
		if (rc < 0) {
			fprintf(stderr, "copybound: wait: %s\n", strerror(-rc));
			return 1;
		}
		struct buf *x = io_uring_cqe_get_data(cqe);
		int res = cqe->res;
		io_uring_cqe_seen(&ring, cqe);
		unsigned want = x->writing && dout ? (x->len + 4095u) & ~4095u : x->len;
		if (res < 0 || (unsigned)res < want) {
			fprintf(stderr, "copybound: %s at %llu: %s\n", x->writing ? "write" : "read",
				(unsigned long long)x->off, res < 0 ? strerror(-res) : "short");
			return 1;
		}
		if (x->writing) {
			writes--;
			total += x->len;
			x->file = -1;
			continue;
		}
		reads--;
		x->writing = 1;
		struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
		unsigned wl = dout ? (x->len + 4095u) & ~4095u : x->len;
		io_uring_prep_write(sqe, f[x->file].out, x->p, wl, x->off);
		io_uring_sqe_set_data(sqe, x);
		writes++;
	}
	for (int i = 0; i < nf; i++) {
		/* An O_DIRECT write of a rounded tail leaves the file long: cut it back. */
		if (ftruncate(f[i].out, (off_t)f[i].size) < 0 || fsync(f[i].out) < 0) {
			fprintf(stderr, "copybound: fsync: %s\n", strerror(errno));
			return 1;
		}
		close(f[i].in);
		close(f[i].out);
	}
	printf("{\"bytes\": %llu, \"secs\": %.6f, \"direct_read\": %s, \"direct_write\": %s}\n",
	       (unsigned long long)total, now() - t0, din ? "true" : "false",
	       dout ? "true" : "false");
	return 0;
}
