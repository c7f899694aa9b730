/* The Prometheus text exposition format (version 0.0.4), written into a
 * growing buffer: a family's HELP and TYPE lines once, then its samples.
 *
 *   # HELP stage_pull_bytes_total Bytes pulls copied into stage_root.
 *   # TYPE stage_pull_bytes_total counter
 *   stage_pull_bytes_total 1048576
 *   stage_peer_up{peer="n1"} 1
 *
 * Names are the caller's constants and are checked (a bad one is a bug:
 * -EINVAL, and nothing more is written); label values come from outside
 * (node names) and are escaped as the format says (\\, \", \n). Errors are
 * sticky: the first is what prom_error returns, and the text is then not
 * to be used. Memory is the text's size: the caller bounds the series.
 */
#ifndef STAGE_PROM_H
#define STAGE_PROM_H

#include <stddef.h>
#include <stdint.h>

#define PROM_MAX (8u << 20)     /* the largest text a prom holds: -E2BIG past it */

struct prom {
	char *buf;              /* len bytes of text, NUL-terminated; owned */
	size_t len, cap;
	int err;                /* 0, or the first -errno */
	char family[128];       /* the family samples go to ("" before the first) */
};

void prom_init(struct prom *p);
void prom_free(struct prom *p);
/* Starts family `name` of type "counter" or "gauge". */
void prom_family(struct prom *p, const char *name, const char *type, const char *help);
/* One sample of the current family. labels: NULL, or name, value, name,
 * value, ..., NULL (at most 8 pairs), e.g. (const char *[]){ "peer", "n1",
 * NULL }. The _f64 form writes 15 digits, or 17 where 15 do not read back
 * as v (NaN and the infinities as the format spells them); the _u64 form
 * is exact. */
void prom_u64(struct prom *p, const char *const *labels, uint64_t v);
void prom_f64(struct prom *p, const char *const *labels, double v);
int prom_error(const struct prom *p);
/* A writer that could not gather its figures: the text is not to be used. */
void prom_fail(struct prom *p, int err);

#endif
