/* Messages about text from outside (the command line, an environment
 * variable, a peer's question): written into a caller's why buffer with
 * control bytes made '?', so that the text cannot drive a terminal, and
 * quoted at a bounded length. */
#ifndef STAGE_WHY_H
#define STAGE_WHY_H

#include <stddef.h>

#define WHY_QUOTE_MAX 80        /* bytes of outside text a message quotes */

/* Formats into why (if why and whylen), then returns rc. */
int why_fail(char *why, size_t whylen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* len bytes of s, cut with "..." past WHY_QUOTE_MAX so that the reason
 * after the quote still fits; returns q. */
const char *why_quote(char q[WHY_QUOTE_MAX + 1], const char *s, size_t len);

#endif
