/* Whether a file's bytes are in the page cache: how a reader chooses
 * between O_DIRECT and the cache per file.
 *
 * O_DIRECT reads of a step are right when the step is not cached (a cold
 * step, a verify that must read the disk): filling the cache costs a copy
 * and, on some machines, a host fault per page (docs/BENCHMARKS.md). But a
 * step its trainer has just written is still in the cache, often dirty:
 * an O_DIRECT read of it goes to the disk the trainer is writing to, and
 * first waits for the kernel to write the dirty pages back. Read through
 * the cache, it is a copy from memory.
 *
 * cachestat(2) (Linux 6.5) counts a range's cached, dirty and writeback
 * pages without touching them; where it is missing, mincore(2) of a
 * mapping of the range counts the resident ones (the mapping is never
 * touched, so nothing is read), for the file's owner or root only: the
 * kernel tells anyone else every page is resident, and then the answer is
 * "cold". On overlayfs cachestat sees the overlay's own, empty mapping:
 * there mincore answers.
 */
#ifndef STAGE_PCACHE_H
#define STAGE_PCACHE_H

#include <stdbool.h>
#include <stdint.h>

/* Whether [off, off + len) of fd is better read through the cache: at
 * least half its pages cached, or any of them dirty or under writeback.
 * False when it cannot tell. */
bool pcache_warm(int fd, uint64_t off, uint64_t len);
/* The same by mincore(2) alone (its fall-back, which tests call too). */
bool pcache_warm_mincore(int fd, uint64_t off, uint64_t len);
/* Bytes of memory the kernel says are available for new pages without
 * swapping (MemAvailable of /proc/meminfo), no more than the daemon's
 * memory cgroup still allows (memory.max less memory.current, cgroup v2),
 * or 0 when it cannot tell. */
uint64_t pcache_available(void);

#endif
