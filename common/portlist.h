/* Port lists and port ranges of the [doctor] section and `stage doctor
 * --ports`: "29500,29400-29410" (ports the jobs listen on, each checked)
 * and "ephemeral", "none" or "LO-HI" (where NCCL's ports come from,
 * sampled). A port is 1..65535, written in decimal. */
#ifndef STAGE_PORTLIST_H
#define STAGE_PORTLIST_H

#include <stddef.h>
#include <stdint.h>

#define PORTLIST_MAX 64         /* ports a list may hold, ranges expanded */

/* Where "ephemeral" is read from: "LO<blanks>HI". */
#define PORTRANGE_EPHEMERAL_FILE "/proc/sys/net/ipv4/ip_local_port_range"

/* "29500,29400-29410": ports and ranges LO-HI separated by ',', blanks
 * around items and around a range's '-' allowed, expanded in order, a port
 * given twice kept once (first place), at most cap of them into ports
 * (*n). -EINVAL for a list that does not parse, with why like "'abc' is
 * not a port number (1-65535)" or "'30000-29000': the range runs
 * backwards" (the whole list is checked first, so this wins over -E2BIG);
 * -E2BIG beyond cap, why "'29400-29500': more than 64 ports". On error *n
 * is 0 and ports holds nothing of use; on success why is "". why may be
 * NULL. */
int portlist_parse(const char *s, uint16_t *ports, size_t cap, size_t *n, char *why, size_t whylen);

/* "ephemeral" (PORTRANGE_EPHEMERAL_FILE now), "none" (*lo = *hi = 0) or
 * "LO-HI" (lo <= hi, both ports), blanks around allowed. -EINVAL with why
 * like "'30000-29000': the range runs backwards" or "'abc': expected
 * ephemeral, none or LO-HI"; for "ephemeral" a file that cannot be read is
 * its -errno and "PATH: strerror", one that does not hold a range -EINVAL.
 * why may be NULL. */
int portrange_parse(const char *s, uint16_t *lo, uint16_t *hi, char *why, size_t whylen);

#endif
