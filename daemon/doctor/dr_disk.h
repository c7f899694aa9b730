/* The doctor's storage probes on one node: how fast a local root takes
 * bytes to durability and gives them back, and how fast a shared source
 * mount lists and reads. Both measure through io_uring with several
 * requests in flight and O_DIRECT where the file system takes it, as the
 * engine's own I/O does, so the figures say what a pull, a commit or a
 * replication can expect here, not what the page cache can.
 *
 * Both are bounded: a few MiB of buffers whatever the sizes asked, and the
 * source walk by a number of entries and a time. Both are safe to run next
 * to a training job: the disk probe touches one file of its own and nothing
 * else, and leaves nothing behind on any path out; the source probe never
 * writes and asks for O_NOATIME so that reading leaves no trace.
 *
 * Each call is self-contained (its own rings and buffers), so several roots
 * may be probed from several threads at once.
 */
#ifndef STAGE_DR_DISK_H
#define STAGE_DR_DISK_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define DR_PIECE (1u << 20)             /* bytes per request, and the unit of `bytes` */

/* One local root: stage_root, ckpt_root, a replica root. */
struct dr_disk {
	int err;                        /* 0, or -errno */
	char why[256];                  /* with err: the path and the cause */
	double write_Bps;               /* bytes / (first write .. fdatasync done) */
	double read_Bps;                /* bytes / (first read .. last read done) */
	bool direct;                    /* O_DIRECT both ways (false: refused, e.g. tmpfs, or
	                                   a probe below two pieces, which the write queue
	                                   writes through the cache) */
	uint64_t bytes;                 /* written and read back: `bytes` rounded up to DR_PIECE */
	uint64_t free_bytes;            /* statvfs before the probe, for an unprivileged user */
	uint64_t total_bytes;           /* (f_bavail, f_blocks; times f_frsize) */
	dev_t dev;                      /* st_dev of the root: a second root on the same
	                                   file system need not be probed again */
};

/* Writes `bytes` (rounded up to DR_PIECE, at least one) to a fresh file
 * DIR/.stage-doctor.PID.TID (O_CREAT|O_EXCL, 0600) through the write queue,
 * fdatasync'd (the time to durability counts in the write figure), then
 * reads it back with O_DIRECT (without: after POSIX_FADV_DONTNEED, so that
 * it comes from the disk) and checks a stamp in every 4 KiB block of it;
 * then unlinks it, on every path out. Refuses (-ENOSPC, nothing written)
 * when the file would not fit in what statvfs says is free, so the probe
 * never fills a disk another program is writing to.
 *
 * cancel (may be NULL) is polled between requests; true stops the probe
 * with -ECANCELED. Returns out->err: 0 or -errno (why names DIR and the
 * cause; a full disk is "no space left on DIR ..."). The figures measured
 * before an error are kept, the others are 0. */
int dr_disk_probe(const char *dir, uint64_t bytes, bool (*cancel)(void *), void *arg,
		  struct dr_disk *out);

/* One source root (the shared mount): read only, never written. */
struct dr_source {
	int err;                        /* 0, or -errno */
	char why[256];                  /* with err: the path and the cause */
	double read_Bps;                /* 0 when no regular file was found to read */
	double files_per_s;             /* entries stat'ed per second of the walk */
	uint64_t entries;               /* entries stat'ed (ROOT itself not counted) */
	uint64_t bytes_read;            /* at most `bytes` */
	bool direct;                    /* every byte read with O_DIRECT */
};

/* Walks ROOT depth first (on ROOT's file system only, never through a
 * symlink) stat'ing each entry, batched through io_uring as the pull's walk
 * does, until the tree ends, max_entries were stat'ed or time_ms passed (0:
 * no such bound). Then reads the largest regular files it saw (largest
 * first, up to `bytes` in all, 0: none) with O_RDONLY|O_DIRECT|O_NOATIME
 * where allowed, opened beneath ROOT, several requests in flight.
 *
 * A directory or file beneath ROOT that cannot be opened is passed over; an
 * error is ROOT itself (missing, not a directory, unreadable), every file
 * found refusing to be read, an I/O error, or cancel (polled between
 * requests; -ECANCELED). Returns out->err. */
int dr_source_probe(const char *root, uint64_t bytes, uint32_t max_entries, int time_ms,
		    bool (*cancel)(void *), void *arg, struct dr_source *out);

#endif
