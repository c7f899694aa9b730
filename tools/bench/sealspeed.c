/*
 * tools/bench/sealspeed.c: what sealing a frame costs, per wire, on one core.
 *
 * usage: sealspeed [SECONDS]
 *
 * Seals and checks 1 MiB frames (the size of a data piece) with the
 * daemon's own common/seal.c, on both wires, for SECONDS each (default 2),
 * and beside them what the choice was made against: libsodium's Poly1305
 * with a ChaCha20 one-time key per frame (the seal of stage 0.1), and
 * XXH3-64 and XXH3-128 (the digests every byte also gets). One line of
 * JSON per case: {"case": ..., "gbs": GB/s}. Built with the tree (make) so
 * that it can be carried to a machine with no compiler; docs/BENCHMARKS.md
 * ("The seal") holds its figures for both machines.
 */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "common/seal.h"

#define FRAME (1u << 20)

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t sink;

static void report(const char *name, double bytes, double secs)
{
	printf("{\"case\": \"%s\", \"gbs\": %.2f}\n", name, bytes / secs / 1e9);
	fflush(stdout);
}

static void run_seal(enum seal_wire w, const char *name, uint8_t *buf, double secs, int check)
{
	static const uint8_t key[SEAL_KEY_BYTES] = "sealspeed: not a secret, a key.";
	struct seal a, b;
	uint8_t hdr[24] = { 1 }, tag[SEAL_TAG_BYTES];
	struct iovec head = { .iov_base = hdr, .iov_len = sizeof(hdr) };
	struct iovec body = { .iov_base = buf, .iov_len = FRAME };
	uint8_t *out = buf;
	double t0 = now(), t;
	uint64_t n = 0;

	if (seal_init(&a, key, true, w) || seal_init(&b, key, false, w))
		exit(1);
	do {
		if (seal_tag(&a, &head, 1, &body, 1, &out, tag) != 0)
			exit(1);
		if (check && seal_check(&b, &head, 1, buf, FRAME, tag) != 0)
			exit(1);
		n++;
		t = now();
	} while (t - t0 < secs);
	report(name, (double)n * FRAME, t - t0);
	seal_end(&a);
	seal_end(&b);
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 2.0;
	uint8_t *buf = malloc(FRAME), key[32] = { 7 }, nonce[12] = { 0 }, otk[32], tag[16];
	double t0, t;
	uint64_t n;

	if (!buf || sodium_init() < 0 || secs <= 0)
		return 1;
	for (unsigned i = 0; i < FRAME; i++)
		buf[i] = (uint8_t)(i * 2654435761u >> 24);
	run_seal(SEAL_AUTHENTICATED, "aes-256-gmac (wire authenticated), seal", buf, secs, 0);
	run_seal(SEAL_ENCRYPTED, "aes-256-gcm (wire encrypted), seal", buf, secs, 0);
	run_seal(SEAL_AUTHENTICATED, "aes-256-gmac, seal + check", buf, secs, 1);
	run_seal(SEAL_ENCRYPTED, "aes-256-gcm, seal + check", buf, secs, 1);
	t0 = now();
	n = 0;
	do {
		nonce[4] = (uint8_t)n;
		crypto_stream_chacha20_ietf(otk, sizeof(otk), nonce, key);
		crypto_onetimeauth(tag, buf, FRAME, otk);
		sink += tag[0];
		n++;
		t = now();
	} while (t - t0 < secs);
	report("chacha20 key + poly1305 (stage 0.1), seal", (double)n * FRAME, t - t0);
	t0 = now();
	n = 0;
	do {
		sink += XXH3_64bits(buf, FRAME);
		n++;
		t = now();
	} while (t - t0 < secs);
	report("xxh3-64", (double)n * FRAME, t - t0);
	t0 = now();
	n = 0;
	do {
		sink += XXH3_128bits(buf, FRAME).low64;
		n++;
		t = now();
	} while (t - t0 < secs);
	report("xxh3-128", (double)n * FRAME, t - t0);
	free(buf);
	return sink == 42;       /* keeps the digests from being optimised away */
}
