#include "daemon/engine/prio.h"

#include <errno.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/config.h"
#include "common/log.h"

/* <linux/ioprio.h> is not in every libc's headers; the values are ABI. */
#define IOPRIO_CLASS_SHIFT 13
#define IOPRIO_CLASS_BE 2
#define IOPRIO_CLASS_IDLE 3
#define IOPRIO_WHO_PROCESS 1

void prio_background(int priority, const char *what)
{
	pid_t tid = (pid_t)syscall(SYS_gettid);
	long io;
	int nice;

	if (priority != CFG_PRIORITY_LOW)
		return;
	/* The trainer's own saves come first: at least nice 10 for the CPU,
	 * and the lowest best-effort level for the disk (not idle, which an
	 * always-busy disk would starve), never raising what the daemon was
	 * started with. Per thread, and inherited by the io_uring workers the
	 * thread starts later. */
	errno = 0;
	nice = getpriority(PRIO_PROCESS, (id_t)tid);
	if ((nice != -1 || errno == 0) && nice < 10 &&
	    setpriority(PRIO_PROCESS, (id_t)tid, 10) < 0)
		log_warn("%s: lowering the CPU priority: %s", what, strerror(errno));
	io = syscall(SYS_ioprio_get, IOPRIO_WHO_PROCESS, tid);
	if (io >= 0 && (io >> IOPRIO_CLASS_SHIFT) != IOPRIO_CLASS_IDLE &&
	    syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, tid,
		    (IOPRIO_CLASS_BE << IOPRIO_CLASS_SHIFT) | 7) < 0)
		log_warn("%s: lowering the I/O priority: %s", what, strerror(errno));
}
