/* Reading one chunk frame: every length checked before it is used, the raw
 * bytes checked against the digest before they are handed back (unless the
 * caller checks them against digests of its own). */
#include <errno.h>
#include <stdbool.h>
#include <xxhash.h>

#include "common/codec.h"
#include "common/codec_chunk.h"

int codec_chunk_parse_hdr(const void *in, size_t n, struct codec_chunk_hdr *h)
{
	const uint8_t *p = in;

	if (n < CODEC_CHUNK_HDR)
		return -EBADMSG;
	if (chunk_get32(p + 12) != chunk_hdr_check(p) || p[0] >= CODEC_COUNT ||
	    p[1] >= CODEC_DT_COUNT || p[2] || p[3])
		return -EBADMSG;
	h->codec = p[0];
	h->dtype = p[1];
	h->raw_len = chunk_get32(p + 4);
	h->comp_len = chunk_get32(p + 8);
	h->digest = chunk_get64(p + 16);
	if (h->raw_len > CODEC_CHUNK_MAX ||
	    h->comp_len > codec_chunk_bound(h->raw_len) - CODEC_CHUNK_HDR ||
	    (h->codec == CODEC_NONE && h->comp_len != h->raw_len))
		return -EBADMSG;
	return 0;
}

static int decode(const void *in, size_t n, void *out, size_t cap, size_t *outlen,
		  size_t *used, bool check)
{
	struct codec_chunk_hdr h;
	size_t got = 0;
	int rc = codec_chunk_parse_hdr(in, n, &h);

	if (rc < 0)
		return rc;
	if (h.comp_len > n - CODEC_CHUNK_HDR)
		return -EBADMSG;
	if (h.raw_len > cap)
		return -ENOSPC;
	rc = codec_by_id(h.codec)->decompress((const uint8_t *)in + CODEC_CHUNK_HDR, h.comp_len,
					      out, h.raw_len, &got);
	if (rc == -ENOMEM)
		return rc;
	if (rc < 0 || got != h.raw_len || (check && XXH3_64bits(out, h.raw_len) != h.digest))
		return -EBADMSG;
	*outlen = h.raw_len;
	*used = CODEC_CHUNK_HDR + h.comp_len;
	return 0;
}

int codec_chunk_decode(const void *in, size_t n, void *out, size_t cap, size_t *outlen,
		       size_t *used)
{
	return decode(in, n, out, cap, outlen, used, true);
}

int codec_chunk_decode_unchecked(const void *in, size_t n, void *out, size_t cap,
				 size_t *outlen, size_t *used)
{
	return decode(in, n, out, cap, outlen, used, false);
}
