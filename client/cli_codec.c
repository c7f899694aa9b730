/* `stage codec`: the codecs of common/codec.h on files, without a daemon.
 *
 * compress writes the container of docs/CODEC.md; decompress restores the
 * bytes exactly or fails and removes what it wrote; bench runs every codec
 * over the file in memory on this one thread, in the manner of `zstd -b`. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/cli_args.h"
#include "client/cli_codec.h"
#include "common/clock.h"
#include "common/codec.h"

#define BENCH_MIN_NS  1000000000ull     /* time each side at least this long */
#define BENCH_MAX_ITS 5

static const char usage[] =
	"Usage: stage codec compress [--codec none|zstd|float] IN OUT\n"
	"       stage codec decompress IN OUT\n"
	"       stage codec bench FILE\n"
	"compress picks the best codec for each chunk unless --codec names one (a chunk\n"
	"it does not shrink is still stored as zstd or as it is).\n";

static int usage_error(const char *fmt, const char *arg)
{
	fputs("stage: ", stderr);
	fprintf(stderr, fmt, arg);
	fputs("\n", stderr);
	fputs(usage, stderr);
	return CLI_EXIT_USAGE;
}

/* The output being written, for the SIGINT handler: an interrupted
 * compress or decompress leaves no half file that looks whole. */
static const char *volatile writing;

static void on_interrupt(int sig)
{
	const char *p = writing;

	if (p)
		unlink(p);
	_exit(128 + sig);
}

static void guard_output(const char *path)
{
	struct sigaction sa = { .sa_handler = on_interrupt };

	writing = path;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

/* Opening OUT truncates it: if it is IN, the data would be gone. */
static bool same_file(const char *a, const char *b)
{
	struct stat sa, sb;

	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
	       sa.st_ino == sb.st_ino;
}

/* Opens IN and creates OUT, guarded: an interrupted or failed run removes
 * OUT rather than leave half a file that looks whole. 0, or an exit code. */
static int open_pair(const char *in_path, const char *out_path, FILE **in, FILE **out)
{
	*in = fopen(in_path, "rb");
	if (!*in) {
		fprintf(stderr, "stage: cannot open %s: %s\n", in_path, strerror(errno));
		return CLI_EXIT_FAILED;
	}
	*out = fopen(out_path, "wb");
	if (!*out) {
		fprintf(stderr, "stage: cannot create %s: %s\n", out_path, strerror(errno));
		fclose(*in);
		return CLI_EXIT_FAILED;
	}
	guard_output(out_path);
	return 0;
}

/* Closes both after rc, the codec's result; a failure removes OUT. */
static int close_pair(FILE *in, FILE *out, const char *out_path, int rc)
{
	if (fclose(out) != 0 && rc == 0)
		rc = -EIO;
	if (rc == 0)
		writing = NULL;
	fclose(in);
	if (rc < 0)
		unlink(out_path);
	return rc;
}

static int run_compress(const char *in_path, const char *out_path, const struct codec_ops *c)
{
	struct codec_stats st;
	FILE *in, *out;
	int rc;

	if ((rc = open_pair(in_path, out_path, &in, &out)))
		return rc;
	rc = close_pair(in, out, out_path, codec_file_compress(in, out, c, CODEC_DT_COUNT, 0, &st));
	if (rc < 0) {
		fprintf(stderr, "stage: cannot compress %s into %s: %s\n", in_path, out_path,
			strerror(-rc));
		return CLI_EXIT_FAILED;
	}
	printf("%s: %llu -> %llu bytes (%.3fx), dtype %s, chunks: %llu float, %llu zstd, "
	       "%llu none\n", in_path, (unsigned long long)st.raw_bytes,
	       (unsigned long long)st.comp_bytes,
	       st.comp_bytes ? (double)st.raw_bytes / (double)st.comp_bytes : 0.0,
	       codec_dtype_name(st.dtype), (unsigned long long)st.chunks[CODEC_FLOAT],
	       (unsigned long long)st.chunks[CODEC_ZSTD], (unsigned long long)st.chunks[CODEC_NONE]);
	return CLI_EXIT_OK;
}

static int run_decompress(const char *in_path, const char *out_path)
{
	struct codec_stats st;
	FILE *in, *out;
	int rc;

	if ((rc = open_pair(in_path, out_path, &in, &out)))
		return rc;
	rc = close_pair(in, out, out_path, codec_file_decompress(in, out, &st));
	if (rc < 0) {
		fprintf(stderr, "stage: cannot decompress %s: %s\n", in_path,
			rc == -EBADMSG ? "not a stage codec file, or damaged" : strerror(-rc));
		return CLI_EXIT_FAILED;
	}
	return CLI_EXIT_OK;
}

static int load(const char *path, uint8_t **buf, size_t *n)
{
	FILE *f = fopen(path, "rb");
	long sz;

	if (!f)
		return -errno;
	if (fseek(f, 0, SEEK_END) != 0 || (sz = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
		fclose(f);
		return -EIO;
	}
	*n = (size_t)sz;
	*buf = malloc(*n ? *n : 1);
	if (!*buf) {
		fclose(f);
		return -ENOMEM;
	}
	if (fread(*buf, 1, *n, f) != *n) {
		free(*buf);
		fclose(f);
		return -EIO;
	}
	fclose(f);
	return 0;
}

/* One codec over the whole buffer, chunk by chunk as `compress` frames it.
 * Speeds are of the best pass, in MB/s of raw bytes. */
static int bench_one(const struct codec_ops *c, const uint8_t *raw, size_t n,
		     const struct codec_params *p, uint8_t *comp, size_t comp_cap,
		     uint8_t *back, double *ratio, double *cmbs, double *dmbs)
{
	size_t total = 0, best_c = SIZE_MAX, best_d = SIZE_MAX;
	uint64_t spent = 0;
	int rc = 0;

	for (int it = 0; it < BENCH_MAX_ITS && (it == 0 || spent < BENCH_MIN_NS); it++) {
		uint64_t t0 = mono_ns();

		total = 0;
		for (size_t off = 0; off < n; off += CODEC_CHUNK_DEFAULT) {
			size_t len, k = n - off < CODEC_CHUNK_DEFAULT ? n - off : CODEC_CHUNK_DEFAULT;

			rc = codec_chunk_encode(raw + off, k, c, p, comp + total, comp_cap - total,
						&len);
			if (rc < 0)
				return rc;
			total += len;
		}
		uint64_t t = mono_ns() - t0;

		spent += t;
		best_c = t < best_c ? t : best_c;
	}
	spent = 0;
	for (int it = 0; it < BENCH_MAX_ITS && (it == 0 || spent < BENCH_MIN_NS); it++) {
		uint64_t t0 = mono_ns();
		size_t in_off = 0, out_off = 0, got, used;

		while (in_off < total) {
			rc = codec_chunk_decode(comp + in_off, total - in_off, back + out_off,
						n - out_off, &got, &used);
			if (rc < 0)
				return rc;
			in_off += used;
			out_off += got;
		}
		uint64_t t = mono_ns() - t0;

		spent += t;
		best_d = t < best_d ? t : best_d;
		if (out_off != n || (n && memcmp(raw, back, n) != 0))
			return -EBADMSG;
	}
	*ratio = total ? (double)n / (double)total : 0.0;
	*cmbs = best_c ? (double)n * 1e3 / (double)best_c : 0.0;
	*dmbs = best_d ? (double)n * 1e3 / (double)best_d : 0.0;
	return 0;
}

static int run_bench(const char *path)
{
	uint8_t *raw = NULL, *comp, *back;
	size_t n = 0, chunks, cap;
	struct codec_params p = { 0 };
	int rc = load(path, &raw, &n), code = CLI_EXIT_OK;

	if (rc < 0) {
		fprintf(stderr, "stage: cannot read %s: %s\n", path, strerror(-rc));
		return CLI_EXIT_FAILED;
	}
	chunks = n / CODEC_CHUNK_DEFAULT + 1;
	cap = chunks * codec_chunk_bound(CODEC_CHUNK_DEFAULT);
	comp = malloc(cap);
	back = malloc(n ? n : 1);
	if (!comp || !back) {
		fprintf(stderr, "stage: bench %s: %s\n", path, strerror(ENOMEM));
		code = CLI_EXIT_FAILED;
		goto out_free;
	}
	p.dtype = codec_detect_dtype(raw, n < CODEC_CHUNK_DEFAULT ? n : CODEC_CHUNK_DEFAULT, n);
	printf("%s: %zu bytes, dtype %s, chunks of %u KiB, one core\n", path, n,
	       codec_dtype_name(p.dtype), CODEC_CHUNK_DEFAULT >> 10);
	printf("%-6s %8s %16s %16s\n", "codec", "ratio", "compress MB/s", "decompress MB/s");
	for (unsigned id = 0; id < CODEC_COUNT; id++) {
		const struct codec_ops *c = codec_by_id(id);
		double ratio, cm, dm;

		rc = bench_one(c, raw, n, &p, comp, cap, back, &ratio, &cm, &dm);
		if (rc < 0) {
			fprintf(stderr, "stage: bench %s with %s: %s\n", path, c->name, strerror(-rc));
			code = CLI_EXIT_FAILED;
			continue;
		}
		printf("%-6s %8.3f %16.0f %16.0f\n", c->name, ratio, cm, dm);
	}
out_free:
	free(back);
	free(comp);
	free(raw);
	return code;
}

int cli_codec_main(int argc, char **argv)
{
	const char *ops[3] = { NULL }, *cname = NULL;
	const struct codec_ops *c = NULL;
	int nops = 0;
	bool dashdash = false;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (dashdash || a[0] != '-' || !a[1]) {
			if (nops == 3)
				return usage_error("extra operand '%s'", a);
			ops[nops++] = a;
		} else if (strcmp(a, "--") == 0) {
			dashdash = true;
		} else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			fputs(usage, stdout);
			return CLI_EXIT_OK;
		} else if (strncmp(a, "--codec=", 8) == 0) {
			cname = a + 8;
		} else if (strcmp(a, "--codec") == 0) {
			if (i + 1 == argc)
				return usage_error("option '%s' needs a value", a);
			cname = argv[++i];
		} else {
			return usage_error("unrecognized option '%s'", a);
		}
	}
	if (!nops)
		return usage_error("missing subcommand%s", "");
	if (cname && !(c = codec_find(cname)))
		return usage_error("unknown codec '%s' (none, zstd, float)", cname);
	if (cname && strcmp(ops[0], "compress") != 0)
		return usage_error("--codec applies to 'compress', not '%s'", ops[0]);
	if (strcmp(ops[0], "compress") == 0 || strcmp(ops[0], "decompress") == 0) {
		if (nops != 3)
			return usage_error("'%s' needs IN and OUT", ops[0]);
		if (same_file(ops[1], ops[2]))
			return usage_error("IN and OUT are the same file: %s", ops[1]);
		return ops[0][0] == 'c' ? run_compress(ops[1], ops[2], c)
					: run_decompress(ops[1], ops[2]);
	}
	if (strcmp(ops[0], "bench") == 0) {
		if (nops != 2)
			return usage_error("'%s' needs one FILE", ops[0]);
		return run_bench(ops[1]);
	}
	return usage_error("unknown codec subcommand '%s'", ops[0]);
}
