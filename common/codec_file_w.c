/* Writing a `stage codec` container: header, chunk frames, trailer. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "common/codec.h"
#include "common/codec_chunk.h"
#include "common/codec_file.h"

/* Fills buf as far as the file allows: a short read from a pipe must not
 * make a short chunk, which would shift every later element's alignment. */
static int read_full(FILE *f, uint8_t *buf, size_t n, size_t *got)
{
	*got = 0;
	while (*got < n) {
		size_t r = fread(buf + *got, 1, n - *got, f);

		if (r == 0)
			return ferror(f) ? -EIO : 0;
		*got += r;
	}
	return 0;
}

static int write_all(FILE *f, const void *p, size_t n)
{
	return fwrite(p, 1, n, f) == n ? 0 : -EIO;
}

static uint64_t size_of(FILE *f)
{
	struct stat st;
	int fd = fileno(f);

	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
		return UINT64_MAX;
	return (uint64_t)st.st_size;
}

int codec_file_compress(FILE *in, FILE *out, const struct codec_ops *want,
			enum codec_dtype dtype, size_t chunk_size, struct codec_stats *st)
{
	struct codec_params p = { 0 };
	uint8_t hdr[CODEC_FILE_HDR] = CODEC_FILE_MAGIC, tr[CODEC_FILE_TRAILER] = CODEC_FILE_END;
	uint8_t *raw, *frame;
	size_t got, len, cap;
	uint64_t nchunks = 0;
	XXH3_state_t *h;
	int rc;

	if (!chunk_size)
		chunk_size = CODEC_CHUNK_DEFAULT;
	if (chunk_size > CODEC_CHUNK_MAX)
		return -EINVAL;
	memset(st, 0, sizeof(*st));
	cap = codec_chunk_bound(chunk_size);
	rc = -ENOMEM;
	raw = malloc(chunk_size);
	if (!raw)
		return rc;
	frame = malloc(cap);
	if (!frame)
		goto out_free_raw;
	h = XXH3_createState();
	if (!h)
		goto out_free_frame;
	XXH3_64bits_reset(h);

	rc = read_full(in, raw, chunk_size, &got);
	if (rc < 0)
		goto out_free_state;
	if (dtype >= CODEC_DT_COUNT)
		dtype = codec_detect_dtype(raw, got, size_of(in));
	p.dtype = dtype;
	st->dtype = dtype;
	hdr[4] = CODEC_FILE_VERSION;
	hdr[5] = (uint8_t)dtype;
	chunk_put32(hdr + 8, (uint32_t)chunk_size);
	rc = write_all(out, hdr, sizeof(hdr));
	while (rc == 0 && got > 0) {
		rc = codec_chunk_encode(raw, got, want, &p, frame, cap, &len);
		if (rc < 0)
			break;
		st->chunks[frame[0]]++;
		st->raw_bytes += got;
		st->comp_bytes += len;
		nchunks++;
		XXH3_64bits_update(h, raw, got);
		rc = write_all(out, frame, len);
		if (rc == 0 && got == chunk_size)
			rc = read_full(in, raw, chunk_size, &got);
		else
			got = 0;
	}
	if (rc < 0)
		goto out_free_state;
	chunk_put64(tr + 8, nchunks);
	chunk_put64(tr + 16, st->raw_bytes);
	chunk_put64(tr + 24, XXH3_64bits_digest(h));
	rc = write_all(out, tr, sizeof(tr));
	st->comp_bytes += CODEC_FILE_HDR + CODEC_FILE_TRAILER;
	if (rc == 0 && fflush(out) != 0)
		rc = -EIO;
out_free_state:
	XXH3_freeState(h);
out_free_frame:
	free(frame);
out_free_raw:
	free(raw);
	return rc;
}
