/* Reading a `stage codec` container. Only a whole container is accepted:
 * every chunk intact, then a trailer whose counts and digest match, then
 * the end of the file. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/codec.h"
#include "common/codec_chunk.h"
#include "common/codec_file.h"

/* Exactly n bytes, or -EBADMSG for a file that ends early. */
static int read_exact(FILE *f, void *buf, size_t n)
{
	if (n && fread(buf, 1, n, f) != n)
		return ferror(f) ? -EIO : -EBADMSG;
	return 0;
}

static int check_trailer(FILE *in, const uint8_t *tr, uint64_t nchunks, uint64_t raw,
			 uint64_t digest)
{
	if (chunk_get32(tr + 4) != 0 || chunk_get64(tr + 8) != nchunks ||
	    chunk_get64(tr + 16) != raw || chunk_get64(tr + 24) != digest)
		return -EBADMSG;
	if (fgetc(in) != EOF)
		return -EBADMSG;
	return ferror(in) ? -EIO : 0;
}

int codec_file_decompress(FILE *in, FILE *out, struct codec_stats *st)
{
	uint8_t hdr[CODEC_FILE_HDR], *frame, *raw;
	struct codec_chunk_hdr ch;
	size_t chunk_size, cap, got, used;
	uint64_t nchunks = 0;
	XXH3_state_t *h;
	int rc;

	memset(st, 0, sizeof(*st));
	rc = read_exact(in, hdr, sizeof(hdr));
	if (rc < 0)
		return rc;
	chunk_size = chunk_get32(hdr + 8);
	if (memcmp(hdr, CODEC_FILE_MAGIC, 4) != 0 || hdr[4] != CODEC_FILE_VERSION ||
	    hdr[5] >= CODEC_DT_COUNT || hdr[6] || hdr[7] || chunk_get32(hdr + 12) ||
	    chunk_size == 0 || chunk_size > CODEC_CHUNK_MAX)
		return -EBADMSG;
	st->dtype = hdr[5];
	cap = codec_chunk_bound(chunk_size);
	rc = -ENOMEM;
	frame = malloc(cap);
	if (!frame)
		return rc;
	raw = malloc(chunk_size);
	if (!raw)
		goto out_free_frame;
	h = XXH3_createState();
	if (!h)
		goto out_free_raw;
	XXH3_64bits_reset(h);

	for (;;) {
		rc = read_exact(in, frame, 4);
		if (rc < 0)
			break;
		if (memcmp(frame, CODEC_FILE_END, 4) == 0) {
			rc = read_exact(in, frame + 4, CODEC_FILE_TRAILER - 4);
			if (rc == 0)
				rc = check_trailer(in, frame, nchunks, st->raw_bytes,
						   XXH3_64bits_digest(h));
			break;
		}
		rc = read_exact(in, frame + 4, CODEC_CHUNK_HDR - 4);
		if (rc == 0)
			rc = codec_chunk_parse_hdr(frame, CODEC_CHUNK_HDR, &ch);
		/* An empty chunk is never written: one would let a file grow
		 * without end and without data. */
		if (rc == 0 && (ch.raw_len == 0 || ch.raw_len > chunk_size))
			rc = -EBADMSG;
		if (rc == 0)
			rc = read_exact(in, frame + CODEC_CHUNK_HDR, ch.comp_len);
		if (rc == 0)
			rc = codec_chunk_decode(frame, CODEC_CHUNK_HDR + ch.comp_len, raw, chunk_size,
						&got, &used);
		if (rc < 0)
			break;
		XXH3_64bits_update(h, raw, got);
		st->chunks[ch.codec]++;
		st->raw_bytes += got;
		st->comp_bytes += used;
		nchunks++;
		if (fwrite(raw, 1, got, out) != got) {
			rc = -EIO;
			break;
		}
	}
	if (rc == 0 && fflush(out) != 0)
		rc = -EIO;
	st->comp_bytes += CODEC_FILE_HDR + CODEC_FILE_TRAILER;
	XXH3_freeState(h);
out_free_raw:
	free(raw);
out_free_frame:
	free(frame);
	return rc;
}
