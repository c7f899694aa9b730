/* The piece sender over a real loopback TCP pair, from real files on the
 * disk (/var/tmp: O_DIRECT) and on a tmpfs (/dev/shm): every byte of the
 * range arrives in order, one MSG_DATA per piece whose codec frame decodes
 * to exactly the file's bytes at its K_OFFSET, with K_FILE only when asked;
 * a range that starts mid-file; the codec the hook picks is the one used;
 * the hook sees every piece; the fd's flags are as they were afterwards;
 * and a file shorter than its range fails with -ESTALE, saying so. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/codec.h"
#include "common/xport.h"
#include "daemon/engine/psend.h"

static const struct xport_ops *T = &xport_tcp_ops;
static const char *const dirs[] = { "/var/tmp", "/dev/shm" };

static void pair(struct xport **c, struct xport **s)
{
	struct xport_listener *l;
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	struct pollfd p;
	struct host h;
	char why[256] = "";
	int lfd;

	assert_int_equal(T->listen("127.0.0.1", 0, &l, &lfd, why, sizeof(why)), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&ss, &len), 0);
	h = (struct host){ .name = "b", .host = "127.0.0.1",
			   .port = ntohs(((struct sockaddr_in *)&ss)->sin_port) };
	assert_int_equal(T->connect(&h, 2000, c, why, sizeof(why)), 0);
	p = (struct pollfd){ .fd = lfd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 5000), 1);
	assert_int_equal(T->accept(l, s), 0);
	T->unlisten(l);
}

static uint8_t *pattern(size_t n, unsigned seed)
{
	uint8_t *p = malloc(n ? n : 1);

	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)((i * 2654435761u + seed) >> 13);
	return p;
}

struct job {
	struct psend *ps;
	struct xport *x;
	int fd;
	uint64_t size, idx, off, end;
	const struct psend_hooks *h;
	int rc;
	char why[256];
};

static void *send_main(void *arg)
{
	struct job *j = arg;
	struct codec_params cp = { .dtype = CODEC_DT_COUNT };

	j->rc = psend_range(j->ps, j->x, j->fd, j->size, j->idx, j->off, j->end, &cp, j->h,
			    "the file", j->why, sizeof(j->why));
	/* What was sent still arrives; then the other end reads the end. */
	j->x->ops->shutdown(j->x);
	codec_thread_end();     /* the codecs' scratch of this thread, as the daemon's do */
	return NULL;
}

struct seen {
	uint64_t raw, pieces;
	const struct codec_ops *pick;
};

static const struct codec_ops *pick(void *arg)
{
	return ((struct seen *)arg)->pick;
}

static void sent(void *arg, uint64_t at, size_t raw, size_t wire, unsigned codec)
{
	struct seen *s = arg;

	s->raw += raw;
	s->pieces++;
}

/* Sends [off, end) of a file of `size` bytes made in dir; checks what the
 * other end gets. Returns psend_range's result. */
static int run(struct psend *ps, const char *dir, size_t size, uint64_t off, uint64_t end,
	       uint64_t idx, const struct codec_ops *codec, size_t file_size, char *why)
{
	char path[256];
	uint8_t *p = pattern(size, (unsigned)size), *raw = malloc(PSEND_PIECE);
	struct seen seen = { .pick = codec };
	const struct psend_hooks h = { .pick = pick, .sent = sent, .arg = &seen };
	struct xport *c, *s;
	struct job j;
	pthread_t t;
	uint64_t next = off;
	int fd, fl;

	snprintf(path, sizeof(path), "%s/test_psend.XXXXXX", dir);
	fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, p, file_size), (ssize_t)file_size);
	fl = fcntl(fd, F_GETFL);
	pair(&c, &s);
	j = (struct job){ .ps = ps, .x = c, .fd = fd, .size = size, .idx = idx, .off = off,
			  .end = end, .h = &h };
	assert_int_equal(pthread_create(&t, NULL, send_main, &j), 0);
	while (next < end) {
		struct msg m;
		const uint8_t *d;
		size_t n, got = 0, used;
		uint64_t at, file;

		if (T->recv(s, &m) < 0)
			break;          /* the sender stopped early (a short file) */
		assert_int_equal(m.type, MSG_DATA);
		assert_int_equal(msg_get_u64(&m, K_OFFSET, &at), 0);
		assert_int_equal(at, next);
		if (idx == PSEND_NO_FILE) {
			assert_int_equal(msg_get_u64(&m, K_FILE, &file), -ENOENT);
		} else {
			assert_int_equal(msg_get_u64(&m, K_FILE, &file), 0);
			assert_int_equal(file, idx);
		}
		assert_int_equal(msg_get_bytes(&m, K_DATA, &d, &n), 0);
		assert_true(n > 0);
		if (codec != &codec_none_ops || d[0] != CODEC_NONE)
			assert_int_equal(d[0], codec->id);   /* none, or what was picked */
		assert_int_equal(codec_chunk_decode(d, n, raw, PSEND_PIECE, &got, &used), 0);
		assert_int_equal(used, n);
		assert_true(got > 0 && at + got <= end);
		assert_memory_equal(raw, p + at, got);
		next = at + got;
		msg_free(&m);
	}
	pthread_join(t, NULL);
	if (j.rc == 0) {
		assert_int_equal(next, end);
		assert_int_equal(seen.raw, end - off);
		assert_int_equal(seen.pieces, (end - off + PSEND_PIECE - 1) / PSEND_PIECE);
	}
	assert_int_equal(fcntl(fd, F_GETFL), fl);        /* O_DIRECT put back */
	snprintf(why, 256, "%s", j.why);
	T->close(c);
	T->close(s);
	close(fd);
	unlink(path);
	free(p);
	free(raw);
	return j.rc;
}

static void test_ranges(void **state)
{
	static const size_t sizes[] = { 1, 4096, PSEND_PIECE, PSEND_PIECE + 5, 2 * PSEND_PIECE,
					3 * PSEND_PIECE + 4097, 9 * PSEND_PIECE + 1 };
	struct psend ps;
	char why[256];

	assert_int_equal(psend_open(&ps, 0), 0);
	for (size_t d = 0; d < 2; d++)
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			size_t n = sizes[i];

			assert_int_equal(run(&ps, dirs[d], n, 0, n, 7, &codec_none_ops, n, why), 0);
			/* From a chunk boundary to the end, without K_FILE. */
			if (n > PSEND_PIECE)
				assert_int_equal(run(&ps, dirs[d], n, PSEND_PIECE, n, PSEND_NO_FILE,
						     &codec_none_ops, n, why), 0);
		}
	/* An unaligned start reads through the cache. */
	assert_int_equal(run(&ps, dirs[0], 5 * PSEND_PIECE, 12345, 4 * PSEND_PIECE + 3, 0,
			     &codec_none_ops, 5 * PSEND_PIECE, why), 0);
	psend_close(&ps);
}

static void test_codec_is_the_picked_one(void **state)
{
	struct psend ps;
	char why[256];

	assert_int_equal(psend_open(&ps, 0), 0);
	/* The pattern compresses: zstd frames, not none. */
	assert_int_equal(run(&ps, dirs[0], 3 * PSEND_PIECE, 0, 3 * PSEND_PIECE, 1, &codec_zstd_ops,
			     3 * PSEND_PIECE, why), 0);
	psend_close(&ps);
}

static void test_short_file(void **state)
{
	struct psend ps;
	char why[256];

	assert_int_equal(psend_open(&ps, 0), 0);
	for (size_t d = 0; d < 2; d++) {
		/* The range says 4 MiB; the file holds 2.5. */
		assert_int_equal(run(&ps, dirs[d], 4 * PSEND_PIECE, 0, 4 * PSEND_PIECE, 0,
				     &codec_none_ops, 5 * PSEND_PIECE / 2, why), -ESTALE);
		assert_non_null(strstr(why, "shorter than its manifest says"));
		/* The sender is fine for the next range. */
		assert_int_equal(run(&ps, dirs[d], 3 * PSEND_PIECE, 0, 3 * PSEND_PIECE, 0,
				     &codec_none_ops, 3 * PSEND_PIECE, why), 0);
	}
	psend_close(&ps);
}

/* What one stream's far end got: (file, offset) of each piece, then
 * whether MSG_END came; with src, each piece's bytes are checked against
 * src at its offset, and its frame's digest: right, or with no_sum 0. */
struct got {
	struct xport *x;
	const uint8_t *src;
	bool no_sum;
	uint64_t file[64], off[64];
	unsigned n;
	bool end;
};

static void *got_main(void *arg)
{
	struct got *g = arg;
	struct msg m;

	while (T->recv(g->x, &m) == 0) {
		if (m.type == MSG_END) {
			g->end = true;
			msg_free(&m);
			break;
		}
		assert_int_equal(m.type, MSG_DATA);
		assert_true(g->n < 64);
		assert_int_equal(msg_get_u64(&m, K_FILE, &g->file[g->n]), 0);
		assert_int_equal(msg_get_u64(&m, K_OFFSET, &g->off[g->n]), 0);
		if (g->src) {
			uint8_t *raw = malloc(PSEND_PIECE);
			const uint8_t *f;
			size_t fn, rn, used;

			assert_non_null(raw);
			assert_int_equal(msg_get_bytes(&m, K_DATA, &f, &fn), 0);
			if (g->no_sum) {
				for (int k = 16; k < 24; k++)
					assert_int_equal(f[k], 0);
				assert_int_equal(codec_chunk_decode_unchecked(f, fn, raw, PSEND_PIECE,
									      &rn, &used), 0);
			} else {
				assert_int_equal(codec_chunk_decode(f, fn, raw, PSEND_PIECE, &rn,
								    &used), 0);
			}
			assert_int_equal(rn, PSEND_PIECE);
			assert_memory_equal(raw, g->src + g->off[g->n], rn);
			free(raw);
		}
		g->n++;
		msg_free(&m);
	}
	return NULL;
}

/* n connected pairs c[i] -> sv[i], and a file in /var/tmp holding p's size
 * bytes (*fd, its name in path); undone by streams_done. */
static void streams_setup(struct xport **c, struct xport **sv, int n, char *path, int *fd,
			  const uint8_t *p, size_t size)
{
	*fd = mkstemp(path);
	assert_true(*fd >= 0);
	assert_int_equal(write(*fd, p, size), (ssize_t)size);
	for (int i = 0; i < n; i++)
		pair(&c[i], &sv[i]);
}

static void streams_done(struct xport **c, struct xport **sv, int n, const char *path, int fd)
{
	for (int i = 0; i < n; i++) {
		T->close(c[i]);
		T->close(sv[i]);
	}
	close(fd);
	unlink(path);
}

/* Three streams, turns of 2 MiB chunks: a 3 MiB file's first chunk (two
 * pieces) on stream 0, its last, short one on stream 1; stream 2 gets only
 * its end. Then, the streams ended with the turn on stream 2, a range on
 * one stream goes on stream 0 whole (the next copy starts at turn 0). */
static void test_turns_a_chunk_at_a_time(void **state)
{
	size_t size = 3 * PSEND_PIECE;
	uint8_t *p = pattern(size, 9);
	struct codec_params cp = { .dtype = CODEC_DT_COUNT };
	const struct psend_hooks h = { 0 };
	struct xport *c[3], *sv[3];
	struct got g[3] = { 0 };
	pthread_t t[3];
	struct psend ps;
	char path[] = "/var/tmp/test_psend.XXXXXX", why[256] = "";
	int fd;

	streams_setup(c, sv, 3, path, &fd, p, size);
	for (int i = 0; i < 3; i++) {
		g[i].x = sv[i];
		assert_int_equal(pthread_create(&t[i], NULL, got_main, &g[i]), 0);
	}
	assert_int_equal(psend_open(&ps, 0), 0);
	assert_int_equal(psend_streams_begin(&ps, c, 3, 64 * PSEND_PIECE), 0);
	psend_streams_group(&ps, 2 * PSEND_PIECE);
	assert_int_equal(psend_range(&ps, c[0], fd, size, 0, 0, size, &cp, &h, "f", why,
				     sizeof(why)), 0);
	assert_int_equal(psend_streams_end(&ps, true), 0);
	cp.dtype = CODEC_DT_COUNT;
	assert_int_equal(psend_range(&ps, c[0], fd, size, 1, 0, 2 * PSEND_PIECE, &cp, &h, "f",
				     why, sizeof(why)), 0);
	c[0]->ops->shutdown(c[0]);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	assert_int_equal(g[0].n, 4);
	assert_false(g[0].end);
	assert_int_equal(g[0].file[0], 0);
	assert_int_equal(g[0].off[0], 0);
	assert_int_equal(g[0].off[1], PSEND_PIECE);
	assert_int_equal(g[0].file[2], 1);
	assert_int_equal(g[0].off[2], 0);
	assert_int_equal(g[0].file[3], 1);
	assert_int_equal(g[0].off[3], PSEND_PIECE);
	assert_int_equal(g[1].n, 1);
	assert_int_equal(g[1].off[0], 2 * PSEND_PIECE);
	assert_true(g[1].end);
	assert_int_equal(g[2].n, 0);
	assert_true(g[2].end);
	psend_close(&ps);
	streams_done(c, sv, 3, path, fd);
	free(p);
}

/* Four streams, turns of 4 MiB, a 48 MiB file: the reads go ahead a turn
 * for every stream and one more (20 pieces), so the ring wraps twice, and
 * every piece still comes on its turn's stream with its own bytes. A
 * budget of 12 MiB holds it to 12; the slots beyond PSEND_DEPTH go with the
 * streams. The second round's pieces go without their frames' digest
 * (no_sum, as after a receiver's K_FRAME_SUM 0) on every stream; the
 * first's with it. */
static void test_read_ahead_of_every_stream(void **state)
{
	size_t size = 48 * PSEND_PIECE, turn = 4 * PSEND_PIECE;
	uint8_t *p = pattern(size, 5);
	const struct psend_hooks h = { 0 };
	struct xport *c[4], *sv[4];
	char path[] = "/var/tmp/test_psend.XXXXXX", why[256] = "";
	int fd;

	streams_setup(c, sv, 4, path, &fd, p, size);
	for (int round = 0; round < 2; round++) {
		uint64_t budget = round == 0 ? 64 * PSEND_PIECE : 12 * PSEND_PIECE;
		struct codec_params cp = { .dtype = CODEC_DT_COUNT, .no_sum = round == 1 };
		struct got g[4] = { 0 };
		pthread_t t[4];
		struct psend ps;
		struct msg m;

		for (int i = 0; i < 4; i++) {
			g[i] = (struct got){ .x = sv[i], .src = p, .no_sum = round == 1 };
			assert_int_equal(pthread_create(&t[i], NULL, got_main, &g[i]), 0);
		}
		assert_int_equal(psend_open(&ps, 0), 0);
		assert_int_equal(ps.depth, PSEND_DEPTH);
		assert_int_equal(psend_streams_begin(&ps, c, 4, budget), 0);
		psend_streams_group(&ps, turn);
		assert_int_equal(ps.depth, round == 0 ? 20 : 12);
		assert_int_equal(psend_range(&ps, c[0], fd, size, 0, 0, size, &cp, &h, "f", why,
					     sizeof(why)), 0);
		assert_int_equal(psend_streams_end(&ps, true), 0);
		assert_int_equal(ps.depth, PSEND_DEPTH);
		/* Stream 0's end is its caller's to send: here, to end its reader. */
		msg_init(&m, MSG_END);
		assert_int_equal(c[0]->ops->send(c[0], &m), 0);
		msg_free(&m);
		for (int i = 0; i < 4; i++) {
			pthread_join(t[i], NULL);
			assert_true(g[i].end);
			assert_int_equal(g[i].n, 12);
			for (unsigned k = 0; k < g[i].n; k++)
				assert_int_equal(g[i].off[k], ((k / 4) * 4 + i) * turn +
							      (k % 4) * PSEND_PIECE);
		}
		psend_close(&ps);
	}
	streams_done(c, sv, 4, path, fd);
	free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ranges),
		cmocka_unit_test(test_codec_is_the_picked_one),
		cmocka_unit_test(test_short_file),
		cmocka_unit_test(test_turns_a_chunk_at_a_time),
		cmocka_unit_test(test_read_ahead_of_every_stream),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
