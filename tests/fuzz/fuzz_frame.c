/* libFuzzer target: a frame's header and payload as they come off the wire.
 *
 * Bytes 0..15 go to proto_decode_hdr, the rest is the payload. A payload
 * proto_check_payload accepts is walked with every getter and must re-encode
 * with msg_put_bytes to the same bytes; one it refuses is still walked,
 * since msg_next_field must stay inside any buffer. The payload ends where
 * libFuzzer's allocation ends, so ASan sees any read past it. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void walk(const struct msg *m)
{
	const uint8_t *p, *q;
	size_t off = 0, n, qn;
	uint16_t key;
	uint64_t v;
	char *s;

	while (msg_next_field(m, &off, &key, &p, &n) > 0) {
		if (off > m->len)
			abort();
		/* The getters see the first field of a key. */
		if (msg_get_bytes(m, key, &q, &qn) != 0 || q > p)
			abort();
		if (msg_get_u64(m, key, &v) == -ENOENT)
			abort();
		if (msg_get_str(m, key, &s) == 0) {
			if (strlen(s) != qn)
				abort();
			free(s);
		} else if (!memchr(q, '\0', qn)) {
			abort();
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t hdr[PROTO_HDR_LEN];
	uint16_t type, flags;
	uint32_t len;
	const uint8_t *payload = data + (size < PROTO_HDR_LEN ? size : PROTO_HDR_LEN);
	size_t n = size - (size_t)(payload - data), off = 0, fn;
	struct msg m = { .buf = (uint8_t *)payload, .len = n, .cap = n };
	struct msg copy;
	const uint8_t *p;
	uint16_t key;

	if (size >= PROTO_HDR_LEN && proto_decode_hdr(data, &type, &flags, &len) == 0) {
		if (len > PROTO_MAX_PAYLOAD)
			abort();
		proto_encode_hdr(hdr, type, flags, len);
		if (memcmp(hdr, data, PROTO_HDR_LEN) != 0)
			abort();
	}

	walk(&m);
	if (proto_check_payload(payload, n) != 0)
		return 0;

	msg_init(&copy, 0);
	while (msg_next_field(&m, &off, &key, &p, &fn) > 0)
		msg_put_bytes(&copy, key, p, fn);
	if (off != n || copy.err || copy.len != n || (n && memcmp(copy.buf, payload, n) != 0))
		abort();
	msg_free(&copy);
	return 0;
}
