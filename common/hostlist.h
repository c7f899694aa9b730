/* Slurm hostlist expressions, as in SLURM_JOB_NODELIST and `stage doctor
 * --nodes`: "n[0-7,12]", "gpu-[01-16]", "r[1-2]n[01-03]", "n0,n2".
 *
 * An expression is items separated by ','. An item is a name, or text with
 * one or more bracket groups "[LIST]", LIST being numbers NUM and ranges
 * LO-HI separated by ','. Each group stands for its numbers in the order
 * written; an item with several groups stands for every combination, in
 * Slurm's order: the last group varies fastest, then the first, the
 * second, and so on up to the one before the last, which varies slowest.
 * With two groups that is the reading order, "r[1-2]n[1-2]" is r1n1 r1n2
 * r2n1 r2n2; with three, "a[1-2]b[1-2]c[1-2]" is a1b1c1 a1b1c2 a2b1c1
 * a2b1c2 a1b2c1 a1b2c2 a2b2c1 a2b2c2.
 * Text may come before and between groups but not after the last one
 * ("n[0-3]-ib" is refused, as Slurm refuses it). A number is zero padded to
 * the width of the low bound as written: "[01-16]" is 01..16, "[8-010]" is
 * 8 9 10 (the high bound's zeros do not count), "[007]" is 007.
 *
 * Against Slurm (`scontrol show hostnames`): what is accepted here expands
 * to the same names in the same order, except that a name given twice is
 * kept once, where it first appears. Slurm takes some forms that are more
 * likely typing mistakes than intent, and they are refused here: empty
 * items ("a,,b", "n0,"), a range with a missing bound ("[1-]"), blanks or
 * tabs between items, a '[' without its ']', anything but digits, '-' and
 * ',' between brackets, and names config_check_name refuses (".n1").
 */
#ifndef STAGE_HOSTLIST_H
#define STAGE_HOSTLIST_H

#include <stddef.h>

/* Names given a second time beyond this many, the expression is refused
 * (-E2BIG): they cost work but add nothing, and max bounds only the new
 * names. */
#define HOSTLIST_REPEATS_MAX 65536

/* Expands EXPR into names, in order, each name once (first wins). At most
 * max names: -E2BIG beyond (also past HOSTLIST_REPEATS_MAX repeats), found
 * after at most max + HOSTLIST_REPEATS_MAX + 1 names were made, whatever
 * the ranges say (n[0-999999999] fails at once). A malformed expression is
 * -EINVAL, whatever its size; why quotes the bad item, e.g. "'n[2-1]': the
 * range '2-1' runs backwards". -ENOMEM. On success *names is a malloc'd
 * array of *n malloc'd strings (free with hostlist_free) and why is ""; on
 * error *names is NULL and *n 0. why may be NULL. */
int hostlist_expand(const char *expr, size_t max, char ***names, size_t *n, char *why, size_t whylen);
/* Frees what hostlist_expand returned; NULL is fine. */
void hostlist_free(char **names, size_t n);

#endif
