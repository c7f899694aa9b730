/* syncfs_shim: an LD_PRELOAD for staged in the fault campaigns
 * (tests/integration/test_powercut.py), so that tests/tools/faultfs.py
 * learns of each syncfs(2) the daemon makes on its mount.
 *
 * The kernel does not pass syncfs on to a FUSE server (it sends FUSE_SYNCFS
 * to virtiofs only), so without this a file made durable by the daemon's
 * batch syncfs would look, to faultfs, as if it never had been, and every
 * power cut would lose what ext4 or XFS keep. The call itself is the real
 * one, unchanged; after it succeeds, each control socket named in
 * FAULTFS_CONTROL (colon-separated) is told "syncfs DEV", DEV being the
 * st_dev of fd's file system, and answered before syncfs returns: the order
 * a disk gives (durable, then the caller goes on). errno is kept.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

static void tell(const char *path, dev_t dev)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char line[64], ans[64];
	int fd, n;

	if (strlen(path) >= sizeof(sa.sun_path))
		return;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		n = snprintf(line, sizeof(line), "syncfs %llu\n", (unsigned long long)dev);
		if (write(fd, line, (size_t)n) == n)
			(void)!read(fd, ans, sizeof(ans)); /* wait for the answer */
	}
	close(fd);
}

int syncfs(int fd)
{
	const char *env = getenv("FAULTFS_CONTROL");
	char list[1024], *save = NULL, *p;
	struct stat st;
	int r, err;

	r = (int)syscall(SYS_syncfs, fd);
	if (r != 0 || !env || strlen(env) >= sizeof(list))
		return r;
	err = errno;
	if (fstat(fd, &st) == 0) {
		strcpy(list, env);
		for (p = strtok_r(list, ":", &save); p; p = strtok_r(NULL, ":", &save))
			tell(p, st.st_dev);
	}
	errno = err;
	return r;
}
