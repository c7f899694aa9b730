/* common/proto.c: the header and field encodings byte for byte, the getters,
 * and whole frames over real sockets and pipes, good and malformed. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdbool.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/proto.h"

static void pair(int sv[2])
{
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
}

static void write_all(int fd, const void *p, size_t n)
{
	assert_int_equal(write(fd, p, n), (ssize_t)n);
}

/* The frame of docs/PROTOCOL.md's example, byte for byte. */
static const uint8_t example[] = {
	'S', 'T', 'G', '1', 0x01, 0x00, 0x00, 0x00, 0x1b, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
	0x01, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, '/', 'd', 's',
	0x03, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x02, 0, 0, 0, 0, 0, 0, 0,
};

static void test_encoding(void **state)
{
	uint8_t out[sizeof(example)];
	struct msg m;
	int sv[2];

	(void)state;
	msg_init(&m, MSG_PULL_REQ);
	msg_put_str(&m, K_PATH, "/ds");
	msg_put_u64(&m, K_FLAGS, REQ_PROGRESS);
	assert_int_equal(m.err, 0);
	assert_int_equal(m.len, sizeof(example) - PROTO_HDR_LEN);
	assert_memory_equal(m.buf, example + PROTO_HDR_LEN, m.len);

	pair(sv);
	assert_int_equal(msg_send(sv[0], &m), 0);
	assert_int_equal(read(sv[1], out, sizeof(out)), (ssize_t)sizeof(out));
	assert_memory_equal(out, example, sizeof(example));
	msg_free(&m);
	close(sv[0]);
	close(sv[1]);
}

static void test_header(void **state)
{
	uint8_t h[PROTO_HDR_LEN];
	uint16_t type, flags;
	uint32_t len;

	(void)state;
	proto_encode_hdr(h, 0xbeef, 0x1234, PROTO_MAX_PAYLOAD);
	assert_memory_equal(h, "STG1\xef\xbe\x34\x12\x00\x10\x10\x00\x00\x00\x00\x00", PROTO_HDR_LEN);
	assert_int_equal(proto_decode_hdr(h, &type, &flags, &len), 0);
	assert_int_equal(type, 0xbeef);
	assert_int_equal(flags, 0x1234);
	assert_int_equal(len, PROTO_MAX_PAYLOAD);

	proto_encode_hdr(h, 1, 0, PROTO_MAX_PAYLOAD + 1);
	assert_int_equal(proto_decode_hdr(h, &type, &flags, &len), -EBADMSG);
	proto_encode_hdr(h, 1, 0, UINT32_MAX);
	assert_int_equal(proto_decode_hdr(h, &type, &flags, &len), -EBADMSG);
	proto_encode_hdr(h, 1, 0, 0);
	h[3] = '2';
	assert_int_equal(proto_decode_hdr(h, &type, &flags, &len), -EBADMSG);
	proto_encode_hdr(h, 1, 0, 0);
	h[15] = 1;
	assert_int_equal(proto_decode_hdr(h, &type, &flags, &len), -EBADMSG);
}

static void test_check_payload(void **state)
{
	static const uint8_t good[] = { 7, 0, 0, 0, 2, 0, 0, 0, 'h', 'i', 9, 0, 0, 0, 0, 0, 0, 0 };
	static const uint8_t long_field[] = { 7, 0, 0, 0, 3, 0, 0, 0, 'h', 'i' };
	static const uint8_t huge_field[] = { 7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 'h' };
	static const uint8_t reserved[] = { 7, 0, 0, 1, 0, 0, 0, 0 };
	static const uint8_t short_hdr[] = { 7, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0 };
	uint8_t *big;

	(void)state;
	assert_int_equal(proto_check_payload(NULL, 0), 0);
	assert_int_equal(proto_check_payload(good, sizeof(good)), 0);
	assert_int_equal(proto_check_payload(long_field, sizeof(long_field)), -EBADMSG);
	assert_int_equal(proto_check_payload(huge_field, sizeof(huge_field)), -EBADMSG);
	assert_int_equal(proto_check_payload(reserved, sizeof(reserved)), -EBADMSG);
	assert_int_equal(proto_check_payload(short_hdr, sizeof(short_hdr)), -EBADMSG);

	/* One empty field, then the length of the rest: over the limit by one. */
	big = calloc(1, PROTO_MAX_PAYLOAD + 1);
	assert_non_null(big);
	big[8 + 4] = (uint8_t)(PROTO_MAX_PAYLOAD + 1 - 16);
	big[8 + 5] = (uint8_t)((PROTO_MAX_PAYLOAD + 1 - 16) >> 8);
	big[8 + 6] = (uint8_t)((PROTO_MAX_PAYLOAD + 1 - 16) >> 16);
	assert_int_equal(proto_check_payload(big, PROTO_MAX_PAYLOAD + 1), -EBADMSG);
	big[8 + 4]--;
	assert_int_equal(proto_check_payload(big, PROTO_MAX_PAYLOAD), 0);
	free(big);
}

static void test_getters(void **state)
{
	static const uint8_t nul[] = { 'a', 0, 'b' };
	const uint8_t *p;
	uint16_t key;
	size_t n, off = 0;
	uint64_t v;
	char *s;
	struct msg m;

	(void)state;
	msg_init(&m, MSG_RESULT);
	msg_put_u64(&m, K_CODE, 1);
	msg_put_u64(&m, K_CODE, 2);             /* repeated: the first one wins */
	msg_put_str(&m, K_TEXT, "first");
	msg_put_str(&m, K_TEXT, "second");
	msg_put_str(&m, K_PATH, "");
	msg_put_bytes(&m, K_ROOT, nul, sizeof(nul));
	msg_put_bytes(&m, 0xffff, NULL, 0);
	assert_int_equal(m.err, 0);

	assert_int_equal(msg_get_u64(&m, K_CODE, &v), 0);
	assert_int_equal(v, 1);
	assert_int_equal(msg_get_str(&m, K_TEXT, &s), 0);
	assert_string_equal(s, "first");
	free(s);
	assert_int_equal(msg_get_str(&m, K_PATH, &s), 0);
	assert_string_equal(s, "");
	free(s);
	assert_int_equal(msg_get_str(&m, K_ROOT, &s), -EINVAL);
	assert_int_equal(msg_get_bytes(&m, K_ROOT, &p, &n), 0);
	assert_int_equal(n, 3);
	assert_memory_equal(p, nul, 3);
	assert_int_equal(msg_get_u64(&m, K_TEXT, &v), -EBADMSG);
	assert_int_equal(msg_get_u64(&m, K_DEST, &v), -ENOENT);
	assert_int_equal(msg_get_str(&m, K_DEST, &s), -ENOENT);
	assert_int_equal(msg_get_bytes(&m, 0xffff, &p, &n), 0);
	assert_int_equal(n, 0);

	static const uint16_t order[] = { K_CODE, K_CODE, K_TEXT, K_TEXT, K_PATH, K_ROOT, 0xffff };
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		assert_int_equal(msg_next_field(&m, &off, &key, &p, &n), 1);
		assert_int_equal(key, order[i]);
	}
	assert_int_equal(msg_next_field(&m, &off, &key, &p, &n), 0);
	assert_int_equal(off, m.len);

	/* A hand-made msg with a torn tail: the walk ends, nothing reads past it. */
	m.len -= 1;
	off = 0;
	for (int i = 0; i < 6; i++)
		assert_int_equal(msg_next_field(&m, &off, &key, &p, &n), 1);
	assert_int_equal(msg_next_field(&m, &off, &key, &p, &n), 0);
	msg_free(&m);
	msg_free(&m);
}

static void test_put_limits(void **state)
{
	struct msg m;
	uint8_t *big = calloc(1, PROTO_MAX_PAYLOAD);
	uint64_t v;
	int sv[2];

	(void)state;
	assert_non_null(big);
	/* Exactly full. */
	msg_init(&m, MSG_NOTE);
	msg_put_bytes(&m, K_TEXT, big, PROTO_MAX_PAYLOAD - PROTO_FIELD_HDR_LEN);
	assert_int_equal(m.err, 0);
	assert_int_equal(m.len, PROTO_MAX_PAYLOAD);
	msg_put_bytes(&m, K_TEXT, NULL, 0);
	assert_int_equal(m.err, -E2BIG);
	msg_free(&m);

	/* Over: sticky, later puts do nothing, send refuses. */
	msg_init(&m, MSG_NOTE);
	msg_put_u64(&m, K_CODE, 7);
	msg_put_bytes(&m, K_TEXT, big, PROTO_MAX_PAYLOAD);
	assert_int_equal(m.err, -E2BIG);
	msg_put_u64(&m, K_LEVEL, 1);
	assert_int_equal(m.len, 16);
	assert_int_equal(msg_get_u64(&m, K_LEVEL, &v), -ENOENT);
	msg_put_bytes(&m, K_TEXT, big, SIZE_MAX);   /* no overflow in the size check */
	assert_int_equal(m.err, -E2BIG);
	pair(sv);
	assert_int_equal(msg_send(sv[0], &m), -E2BIG);
	close(sv[0]);
	close(sv[1]);
	msg_free(&m);

	msg_init(&m, MSG_NOTE);
	msg_put_bytes(&m, K_TEXT, big, SIZE_MAX - 3);
	assert_int_equal(m.err, -E2BIG);
	msg_free(&m);

	/* A msg filled by hand past the limit is refused too, not truncated. */
	msg_init(&m, MSG_NOTE);
	m.buf = big;
	m.len = PROTO_MAX_PAYLOAD + 1;
	assert_int_equal(msg_send(-1, &m), -E2BIG);
	free(big);
}

struct sender {
	int fd;
	const struct msg *m;
	int rc;
};

static void *send_thread(void *arg)
{
	struct sender *s = arg;

	s->rc = msg_send(s->fd, s->m);
	return NULL;
}

/* Sends m from a thread (socket buffers are smaller than a frame), receives
 * it here and checks it arrived whole. */
static void round_trip(const struct msg *m)
{
	struct sender s = { .m = m };
	pthread_t t;
	struct msg r;
	int sv[2];

	pair(sv);
	s.fd = sv[0];
	assert_int_equal(pthread_create(&t, NULL, send_thread, &s), 0);
	assert_int_equal(msg_recv(sv[1], &r), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(s.rc, 0);
	assert_int_equal(r.type, m->type);
	assert_int_equal(r.flags, m->flags);
	assert_int_equal(r.len, m->len);
	if (m->len)
		assert_memory_equal(r.buf, m->buf, m->len);
	msg_free(&r);
	close(sv[0]);
	assert_int_equal(msg_recv(sv[1], &r), -ENOTCONN);
	close(sv[1]);
}

static void test_round_trip(void **state)
{
	struct msg m;
	uint8_t *big = malloc(PROTO_MAX_PAYLOAD);
	char *s;

	(void)state;
	msg_init(&m, MSG_STATUS_REQ);
	round_trip(&m);                          /* empty payload */

	msg_init(&m, MSG_PULL_REQ);
	m.flags = 0x8001;
	msg_put_str(&m, K_PATH, "/nfs/data set/é");
	msg_put_u64(&m, K_FLAGS, REQ_VERIFY | REQ_PROGRESS);
	round_trip(&m);
	msg_free(&m);

	/* The largest frame: one field filling PROTO_MAX_PAYLOAD. */
	assert_non_null(big);
	for (size_t i = 0; i < PROTO_MAX_PAYLOAD; i++)
		big[i] = (uint8_t)(i * 7 + (i >> 13));
	msg_init(&m, MSG_RESULT);
	msg_put_bytes(&m, K_TEXT, big, PROTO_MAX_PAYLOAD - PROTO_FIELD_HDR_LEN);
	assert_int_equal(m.len, PROTO_MAX_PAYLOAD);
	round_trip(&m);
	msg_free(&m);

	/* Many fields. */
	msg_init(&m, MSG_NOTE);
	for (int i = 0; i < 10000; i++)
		msg_put_u64(&m, (uint16_t)(100 + i), (uint64_t)i * 0x0101010101010101ull);
	msg_put_str(&m, K_TEXT, "tail");
	round_trip(&m);
	assert_int_equal(msg_get_str(&m, K_TEXT, &s), 0);
	assert_string_equal(s, "tail");
	free(s);
	msg_free(&m);
	free(big);
}

/* Writes raw bytes, closes, and returns what msg_recv makes of them. */
static int recv_raw(const void *p, size_t n)
{
	struct msg m;
	int sv[2], rc;

	pair(sv);
	write_all(sv[0], p, n);
	close(sv[0]);
	rc = msg_recv(sv[1], &m);
	if (rc == 0)
		msg_free(&m);
	else
		assert_null(m.buf);
	close(sv[1]);
	return rc;
}

static void test_bad_frames(void **state)
{
	uint8_t f[sizeof(example)];

	(void)state;
	assert_int_equal(recv_raw(example, sizeof(example)), 0);

	memcpy(f, example, sizeof(f));
	f[0] = 's';                                     /* magic */
	assert_int_equal(recv_raw(f, sizeof(f)), -EBADMSG);

	memcpy(f, example, sizeof(f));
	f[13] = 1;                                      /* header reserved */
	assert_int_equal(recv_raw(f, sizeof(f)), -EBADMSG);

	memcpy(f, example, sizeof(f));
	f[PROTO_HDR_LEN + 2] = 1;                       /* field reserved */
	assert_int_equal(recv_raw(f, sizeof(f)), -EBADMSG);

	memcpy(f, example, sizeof(f));
	f[PROTO_HDR_LEN + 4] = 4;                       /* field runs into the next */
	assert_int_equal(recv_raw(f, sizeof(f)), -EBADMSG);

	memcpy(f, example, sizeof(f));
	f[PROTO_HDR_LEN + 4] = 0xff;                    /* field runs past the payload */
	assert_int_equal(recv_raw(f, sizeof(f)), -EBADMSG);

	memcpy(f, example, sizeof(f));
	f[8] -= 1;                                      /* payload ends mid-field */
	assert_int_equal(recv_raw(f, sizeof(f) - 1), -EBADMSG);

	/* Over-size: refused from the header alone, before any payload arrives. */
	proto_encode_hdr(f, MSG_NOTE, 0, PROTO_MAX_PAYLOAD + 1);
	assert_int_equal(recv_raw(f, PROTO_HDR_LEN), -EBADMSG);
	proto_encode_hdr(f, MSG_NOTE, 0, UINT32_MAX);
	assert_int_equal(recv_raw(f, PROTO_HDR_LEN), -EBADMSG);
}

static void test_eof(void **state)
{
	(void)state;
	assert_int_equal(recv_raw(example, 0), -ENOTCONN);
	assert_int_equal(recv_raw(example, 1), -ECONNRESET);
	assert_int_equal(recv_raw(example, PROTO_HDR_LEN - 1), -ECONNRESET);
	assert_int_equal(recv_raw(example, PROTO_HDR_LEN), -ECONNRESET);
	assert_int_equal(recv_raw(example, sizeof(example) - 1), -ECONNRESET);
}

static void test_closed_peer(void **state)
{
	struct msg m;
	int sv[2];

	(void)state;
	/* No SIGPIPE handler is installed: without MSG_NOSIGNAL this kills us. */
	pair(sv);
	close(sv[1]);
	msg_init(&m, MSG_STATUS_REQ);
	msg_put_str(&m, K_TEXT, "anyone?");
	assert_int_equal(msg_send(sv[0], &m), -EPIPE);
	close(sv[0]);
	assert_int_equal(msg_send(sv[0], &m), -EBADF);
	msg_free(&m);
	assert_int_equal(msg_recv(sv[0], &m), -EBADF);
	assert_null(m.buf);
}

static void test_pipe(void **state)
{
	struct msg m, r;
	int p[2];
	char *s;

	(void)state;
	assert_int_equal(pipe(p), 0);
	msg_init(&m, MSG_NOTE);
	msg_put_str(&m, K_TEXT, "through a pipe");
	assert_int_equal(msg_send(p[1], &m), 0);   /* ENOTSOCK -> writev */
	close(p[1]);
	assert_int_equal(msg_recv(p[0], &r), 0);
	assert_int_equal(msg_get_str(&r, K_TEXT, &s), 0);
	assert_string_equal(s, "through a pipe");
	free(s);
	msg_free(&r);
	assert_int_equal(msg_recv(p[0], &r), -ENOTCONN);
	close(p[0]);
	msg_free(&m);
}

static void on_alarm(int sig)
{
	(void)sig;
}

/* SIGALRM every 2 ms, without SA_RESTART, so blocking calls see EINTR or
 * return short; off restores the old handler. */
static void ticker(bool on)
{
	static struct sigaction old;
	struct sigaction sa = { .sa_handler = on_alarm };
	struct itimerval it = { .it_interval = { 0, 2000 }, .it_value = { 0, 2000 } };
	struct itimerval stop = { { 0, 0 }, { 0, 0 } };

	if (on) {
		assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
		assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
	} else {
		assert_int_equal(setitimer(ITIMER_REAL, &stop, NULL), 0);
		assert_int_equal(sigaction(SIGALRM, &old, NULL), 0);
	}
}

/* Signals land while msg_recv blocks mid-frame. */
static void test_recv_interrupted(void **state)
{
	struct msg r;
	int sv[2];
	pid_t pid;

	(void)state;
	pair(sv);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(sv[1]);
		for (size_t i = 0; i < sizeof(example); i++) {
			usleep(5000);
			if (write(sv[0], example + i, 1) != 1)
				_exit(1);
		}
		_exit(0);
	}
	close(sv[0]);
	ticker(true);
	assert_int_equal(msg_recv(sv[1], &r), 0);
	ticker(false);
	assert_int_equal(r.len, sizeof(example) - PROTO_HDR_LEN);
	assert_memory_equal(r.buf, example + PROTO_HDR_LEN, r.len);
	msg_free(&r);
	close(sv[1]);
	assert_int_equal(waitpid(pid, NULL, 0), pid);
}

/* Signals land while msg_send blocks on a slow reader: sendmsg returns
 * short and msg_send must resume mid-iovec. */
static void test_send_interrupted(void **state)
{
	uint8_t *big = malloc(PROTO_MAX_PAYLOAD);
	struct msg m;
	int sv[2], st, sz = 4096;
	pid_t pid;

	(void)state;
	assert_non_null(big);
	for (size_t i = 0; i < PROTO_MAX_PAYLOAD; i++)
		big[i] = (uint8_t)(i ^ (i >> 8));
	msg_init(&m, MSG_RESULT);
	msg_put_bytes(&m, K_TEXT, big, PROTO_MAX_PAYLOAD - PROTO_FIELD_HDR_LEN);
	pair(sv);
	assert_int_equal(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz)), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct msg r;
		uint8_t chunk[65536];
		size_t got = 0;

		close(sv[0]);
		/* Drain slowly, then take the rest as a frame. */
		usleep(20000);
		if (read(sv[1], chunk, PROTO_HDR_LEN) != PROTO_HDR_LEN)
			_exit(1);
		while (got < m.len) {
			ssize_t n = read(sv[1], chunk, m.len - got < 4096 ? m.len - got : 4096);

			if (n <= 0 || memcmp(chunk, m.buf + got, (size_t)n) != 0)
				_exit(2);
			got += (size_t)n;
			if (got % (64 * 4096) == 0)
				usleep(3000);
		}
		_exit(msg_recv(sv[1], &r) == -ENOTCONN ? 0 : 3);
	}
	close(sv[1]);
	ticker(true);
	assert_int_equal(msg_send(sv[0], &m), 0);
	ticker(false);
	close(sv[0]);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	msg_free(&m);
	free(big);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_encoding),
		cmocka_unit_test(test_header),
		cmocka_unit_test(test_check_payload),
		cmocka_unit_test(test_getters),
		cmocka_unit_test(test_put_limits),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_bad_frames),
		cmocka_unit_test(test_eof),
		cmocka_unit_test(test_closed_peer),
		cmocka_unit_test(test_pipe),
		cmocka_unit_test(test_recv_interrupted),
		cmocka_unit_test(test_send_interrupted),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
