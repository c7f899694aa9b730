#include "common/paths.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

bool paths_under(const char *path, const char *root)
{
	size_t n = strlen(root);

	if (strcmp(root, "/") == 0)
		return path[0] == '/';
	return strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

const char *paths_rel(const char *path, const char *root)
{
	if (!paths_under(path, root))
		return NULL;
	if (strcmp(root, "/") == 0)
		return path + 1;
	path += strlen(root);
	return *path == '/' ? path + 1 : path;
}

int paths_normalize(char *p, bool keep_dotdot)
{
	char *out = p, *in = p;

	if (p[0] != '/')
		return -EINVAL;
	while (*in) {
		char *seg;
		size_t len;

		while (*in == '/')
			in++;
		if (!*in)
			break;
		seg = in;
		while (*in && *in != '/')
			in++;
		len = (size_t)(in - seg);
		if (len == 1 && seg[0] == '.')
			continue;
		if (len == 2 && seg[0] == '.' && seg[1] == '.' && !keep_dotdot)
			return -EINVAL;
		*out++ = '/';
		memmove(out, seg, len);
		out += len;
	}
	if (out == p)
		*out++ = '/';
	*out = '\0';
	return 0;
}

char *paths_absolute(const char *base, const char *arg)
{
	size_t bl = strlen(base), al = strlen(arg);
	char *p = malloc(bl + al + 2);

	if (!p)
		return NULL;
	if (arg[0] == '/') {
		memcpy(p, arg, al + 1);
	} else {
		memcpy(p, base, bl);
		p[bl] = '/';
		memcpy(p + bl + 1, arg, al + 1);
	}
	if (paths_normalize(p, true) < 0) {
		free(p);
		return NULL;
	}
	return p;
}
