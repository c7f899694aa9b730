#include "client/cli_conn.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/config.h"

int cli_conn_socket_path(const char *opt, char **out)
{
	const char *env = getenv("STAGE_SOCKET");
	struct stage_config c;
	int rc;

	if (!opt && env && *env)
		opt = env;
	if (opt) {
		*out = strdup(opt);
		return *out ? 0 : -ENOMEM;
	}
	rc = config_defaults(&c);
	if (rc < 0)
		return rc;
	*out = strdup(c.socket);
	config_free(&c);
	return *out ? 0 : -ENOMEM;
}

int cli_conn_open(const char *path, int *fd)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t n = strlen(path);
	int s, rc;

	if (n >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, n + 1);
	s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	/* No handler is installed, so connect() cannot see EINTR (and retrying
	 * it after one would be wrong anyway). */
	rc = connect(s, (struct sockaddr *)&sa, sizeof(sa));
	if (rc < 0) {
		rc = -errno;
		close(s);
		return rc;
	}
	*fd = s;
	return 0;
}

int cli_conn_exchange(int fd, const struct msg *req, cli_conn_frame_fn on_frame, void *ctx)
{
	bool last = false;
	struct msg m;
	int rc;

	rc = msg_send(fd, req);
	while (rc == 0 && !last) {
		/* msg_recv starts from an empty msg: each frame is freed here. */
		rc = msg_recv(fd, &m);
		if (rc < 0)
			break;
		rc = on_frame(ctx, &m);
		last = m.type == MSG_RESULT;
		msg_free(&m);
	}
	return rc;
}
