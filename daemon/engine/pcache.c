/* Page-cache residency of a file's range: see pcache.h. */
#include "daemon/engine/pcache.h"

#include <errno.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef __NR_cachestat
#define __NR_cachestat 451      /* the same number on every architecture */
#endif

struct pc_range {
	uint64_t off, len;
};

struct pc_stat {
	uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

/* By mincore of a mapping of the range: the cached pages, or -1. */
static int64_t resident(int fd, uint64_t off, uint64_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t start = off / (uint64_t)pg * (uint64_t)pg, span = off + len - start;
	size_t pages = (size_t)((span + (uint64_t)pg - 1) / (uint64_t)pg);
	unsigned char *vec;
	int64_t n = 0;
	void *p;

	p = mmap(NULL, span, PROT_READ, MAP_SHARED, fd, (off_t)start);
	if (p == MAP_FAILED)
		return -1;
	vec = malloc(pages);
	if (vec && mincore(p, span, vec) == 0)
		for (size_t i = 0; i < pages; i++)
			n += vec[i] & 1;
	else
		n = -1;
	free(vec);
	munmap(p, span);
	return n;
}

/* Pages of a range of len bytes. */
static uint64_t pages_of(uint64_t len)
{
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);

	return (len + pg - 1) / pg;
}

static bool on_overlay(int fd)
{
	struct statfs sf;

	return fstatfs(fd, &sf) == 0 && sf.f_type == OVERLAYFS_SUPER_MAGIC;
}

bool pcache_warm(int fd, uint64_t off, uint64_t len)
{
	uint64_t pages = pages_of(len);
	struct pc_range r = { off, len };
	struct pc_stat st;

	if (len == 0)
		return false;
	/* cachestat of an overlayfs file counts the overlay's own mapping,
	 * which holds no pages: its reads and writes go to the file beneath,
	 * which a mapping reaches (and mincore sees). */
	if (on_overlay(fd))
		return pcache_warm_mincore(fd, off, len);
	if (syscall(__NR_cachestat, fd, &r, &st, 0) == 0) {
		if (st.nr_dirty || st.nr_writeback)
			return true;
		return st.nr_cache * 2 >= pages;
	}
	if (errno != ENOSYS)
		return false;
	return pcache_warm_mincore(fd, off, len);
}

bool pcache_warm_mincore(int fd, uint64_t off, uint64_t len)
{
	uid_t fsuid = (uid_t)setfsuid((uid_t)-1);       /* this thread's, unchanged */
	struct stat st;
	int64_t cached;

	/* mincore tells the page cache's truth only to the file's owner (or
	 * a writer, or root); anyone else is told every page is resident,
	 * which would send a cold file through the cache. */
	if (len == 0 || fstat(fd, &st) < 0 || (fsuid != 0 && fsuid != st.st_uid))
		return false;
	cached = resident(fd, off, len);
	return cached >= 0 && (uint64_t)cached * 2 >= pages_of(len);
}

/* The first number in the file at path (cgroup v2's memory.max and
 * memory.current), or UINT64_MAX when it is "max" or cannot be read. */
static uint64_t read_u64(const char *path)
{
	unsigned long long v;
	FILE *f = fopen(path, "re");
	int ok;

	if (!f)
		return UINT64_MAX;
	ok = fscanf(f, "%llu", &v) == 1;
	fclose(f);
	return ok ? (uint64_t)v : UINT64_MAX;
}

/* What the daemon's memory cgroup (v2) still allows: its pages, the page
 * cache it reads into among them, count against memory.max, which
 * /proc/meminfo does not show in a container. UINT64_MAX: no limit. */
static uint64_t cgroup_room(void)
{
	char line[4096], path[4200];
	uint64_t max, cur;
	FILE *f = fopen("/proc/self/cgroup", "re");
	bool found = false;
	size_t n;

	if (!f)
		return UINT64_MAX;
	while (!found && fgets(line, sizeof(line), f))
		found = strncmp(line, "0::", 3) == 0;
	fclose(f);
	if (!found)
		return UINT64_MAX;
	n = strcspn(line + 3, "\n");
	line[3 + n] = '\0';
	snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.max", line + 3);
	max = read_u64(path);
	if (max == UINT64_MAX)
		return UINT64_MAX;
	snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.current", line + 3);
	cur = read_u64(path);
	return cur == UINT64_MAX ? 0 : cur < max ? max - cur : 0;
}

uint64_t pcache_available(void)
{
	char line[128];
	unsigned long long kib;
	uint64_t n = 0, room = cgroup_room();
	FILE *f = fopen("/proc/meminfo", "re");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
			n = (uint64_t)kib << 10;
			break;
		}
	fclose(f);
	return n < room ? n : room;
}
