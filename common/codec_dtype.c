/* Which float type a file holds: a safetensors header says so; otherwise the
 * first chunk is compressed each way and the smallest result names it. */
#include <stdlib.h>
#include <string.h>

#include "common/codec.h"

#define ST_HDR_MAX (100u << 20)
#define TRIAL_MAX  (1u << 20)

static const char *skip_ws(const char *s, const char *end)
{
	while (s < end && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r'))
		s++;
	return s;
}

static const char *find(const char *s, const char *end, const char *what)
{
	size_t w = strlen(what);

	for (; s + w <= end; s++)
		if (memcmp(s, what, w) == 0)
			return s + w;
	return NULL;
}

static const char *number(const char *s, const char *end, uint64_t *v)
{
	*v = 0;
	s = skip_ws(s, end);
	if (s == end || *s < '0' || *s > '9')
		return NULL;
	while (s < end && *s >= '0' && *s <= '9' && *v < UINT64_MAX / 10)
		*v = *v * 10 + (uint64_t)(*s++ - '0');
	return skip_ws(s, end);
}

static enum codec_dtype st_dtype(const char *v, size_t n)
{
	if (n == 4 && memcmp(v, "BF16", 4) == 0)
		return CODEC_DT_BF16;
	if (n == 3 && memcmp(v, "F16", 3) == 0)
		return CODEC_DT_F16;
	if (n == 3 && memcmp(v, "F32", 3) == 0)
		return CODEC_DT_F32;
	return CODEC_DT_BYTES;
}

/* The header is outside data: every step is bounded by end. -1 if this is
 * not a safetensors header. */
static int from_safetensors(const uint8_t *buf, size_t n, uint64_t file_size)
{
	uint64_t hlen = 0, bytes[CODEC_DT_COUNT] = { 0 };
	const char *s, *end;
	int best = CODEC_DT_BYTES;

	if (n < 10 || file_size < 10)
		return -1;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | buf[i];
	if (hlen < 2 || hlen > ST_HDR_MAX || hlen > file_size - 8 || buf[8] != '{')
		return -1;
	s = (const char *)buf + 8;
	end = s + (hlen < n - 8 ? hlen : n - 8);
	while ((s = find(s, end, "\"dtype\""))) {
		const char *v, *q;
		uint64_t a, b;
		enum codec_dtype dt;

		s = skip_ws(s, end);
		if (s == end || *s != ':')
			continue;
		s = skip_ws(s + 1, end);
		if (s == end || *s != '"')
			continue;
		v = ++s;
		while (s < end && *s != '"')
			s++;
		dt = st_dtype(v, (size_t)(s - v));
		q = find(s, end, "\"data_offsets\"");
		if (!q)
			break;
		q = skip_ws(q, end);
		if (q == end || *q != ':')
			continue;
		q = skip_ws(q + 1, end);
		if (q == end || *q != '[' || !(q = number(q + 1, end, &a)) || q == end ||
		    *q != ',' || !(q = number(q + 1, end, &b)) || b < a)
			continue;
		bytes[dt] += b - a;
	}
	for (int i = 1; i < CODEC_DT_COUNT; i++)
		if (bytes[i] > bytes[best])
			best = i;
	return best;
}

static size_t trial(const void *buf, size_t n, const struct codec_ops *c, enum codec_dtype dt,
		    uint8_t *out, size_t cap)
{
	struct codec_params p = { .dtype = dt };
	size_t len;

	return c->compress(buf, n, out, cap, &len, &p) == 0 ? len : SIZE_MAX;
}

enum codec_dtype codec_detect_dtype(const void *buf, size_t n, uint64_t file_size)
{
	static const enum codec_dtype tries[] = { CODEC_DT_BF16, CODEC_DT_F32 };
	int st = from_safetensors(buf, n, file_size);
	enum codec_dtype best = CODEC_DT_BYTES;
	size_t best_len, cap;
	uint8_t *out;

	if (st >= 0)
		return (enum codec_dtype)st;
	if (n > TRIAL_MAX)
		n = TRIAL_MAX;
	if (n < 64)
		return CODEC_DT_BYTES;
	cap = codec_chunk_bound(n);
	out = malloc(cap);
	if (!out)
		return CODEC_DT_BYTES;
	/* Float must beat zstd by 2 %: not worth a second pass otherwise. */
	best_len = trial(buf, n, &codec_zstd_ops, CODEC_DT_BYTES, out, cap);
	best_len = best_len == SIZE_MAX ? n : best_len;
	best_len -= best_len / 50;
	for (size_t i = 0; i < sizeof(tries) / sizeof(tries[0]); i++) {
		size_t len = trial(buf, n, &codec_float_ops, tries[i], out, cap);

		if (len < best_len) {
			best_len = len;
			best = tries[i];
		}
	}
	free(out);
	return best;
}

const char *codec_dtype_name(enum codec_dtype dt)
{
	static const char *const names[CODEC_DT_COUNT] = { "bytes", "bf16", "f16", "f32" };

	return (unsigned)dt < CODEC_DT_COUNT ? names[dt] : "?";
}
