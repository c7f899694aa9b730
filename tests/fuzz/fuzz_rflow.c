/* libFuzzer target: the RDMA flow bookkeeping (rdma/flow.c) driven by a
 * peer's hello and then any sequence of completions and calls: receives
 * with any slot, length and immediate (what a hostile or broken peer
 * controls), reads, re-posts, sends begun and completed. Nothing may crash
 * or read outside the slots; errors stay; the counts stay within their
 * bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rdma/flow.h"

#define NSLOTS 8
#define SLOT 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint32_t take(const uint8_t **p, const uint8_t *end, int n)
{
	uint32_t v = 0;

	for (int i = 0; i < n && *p < end; i++)
		v = v << 8 | *(*p)++;
	return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t mem[NSLOTS * SLOT], out[3 * SLOT];
	const uint8_t *p = data, *end = data + size;
	uint32_t pn, ps, freed[NSLOTS], nf, buf, imm;
	struct rflow f;
	int err = 0;

	if (size < RFLOW_HELLO_LEN || rflow_hello_get(data, RFLOW_HELLO_LEN, &pn, &ps) != 0)
		return 0;
	p += RFLOW_HELLO_LEN;
	if (rflow_init(&f, NSLOTS, SLOT, 4, SLOT, pn, ps) != 0)
		return 0;
	while (p < end) {
		bool free_now;

		switch (*p++ % 5) {
		case 0:
			rflow_recv(&f, take(&p, end, 1) % (NSLOTS + 2), take(&p, end, 2) % (SLOT + 2),
				   take(&p, end, 4), &free_now);
			break;
		case 1:
			nf = 0;
			rflow_read(&f, mem, out, take(&p, end, 2) % sizeof(out), freed, &nf);
			if (nf > NSLOTS)
				abort();
			rflow_reposted(&f, nf);
			break;
		case 2:
			rflow_reposted(&f, take(&p, end, 1) % 3);
			break;
		case 3:
			if (rflow_send_begin(&f, take(&p, end, 2) % (SLOT + 2), &buf, &imm) == 0 &&
			    buf >= 4)
				abort();
			break;
		default:
			rflow_send_done(&f);
		}
		if (err && rflow_error(&f) != err)
			abort();        /* errors stay */
		err = rflow_error(&f);
		if (rflow_readable(&f) > (size_t)NSLOTS * SLOT || rflow_queued(&f) > 4ull * SLOT)
			abort();
	}
	rflow_fini(&f);
	return 0;
}
