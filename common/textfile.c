#include "common/textfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int textfile_read(const char *path, size_t max, char **out, size_t *outlen)
{
	size_t len = 0;
	ssize_t n = 1;
	char *buf;
	int fd, rc = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	buf = malloc(max + 1);
	if (!buf) {
		rc = -ENOMEM;
		goto out_close;
	}
	while (n != 0 && len <= max) {
		n = read(fd, buf + len, max + 1 - len);
		if (n < 0 && errno != EINTR) {
			rc = -errno;
			break;
		}
		if (n > 0)
			len += (size_t)n;
	}
	if (rc) {
		free(buf);
		goto out_close;
	}
	*out = buf;
	*outlen = len;
out_close:
	close(fd);
	return rc;
}

int textfile_lines(char *text, size_t len, unsigned *line, int (*fn)(void *arg, char *s),
		   void *arg)
{
	char *end = text + len;
	int rc = 0;

	for (char *s = text; s < end && rc == 0;) {
		char *nl = memchr(s, '\n', (size_t)(end - s));
		size_t n = nl ? (size_t)(nl - s) : (size_t)(end - s);

		(*line)++;
		s[n] = '\0';    /* the '\n', or the text's terminator */
		if (strlen(s) != n)
			return -EILSEQ;
		rc = fn(arg, s);
		s += n + 1;
	}
	return rc;
}

void textfile_verr(char *err, size_t errlen, const char *fname, unsigned line,
		   const char *fmt, va_list ap)
{
	int n;

	if (!err || !errlen)
		return;
	n = line ? snprintf(err, errlen, "%s:%u: ", fname, line) : snprintf(err, errlen, "%s: ", fname);
	if (n >= 0 && (size_t)n < errlen)
		vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
	for (char *s = err; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
}

int textfile_fail(struct textfile_pos *pos, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	textfile_verr(pos->err, pos->errlen, pos->fname, pos->line, fmt, ap);
	va_end(ap);
	return rc;
}
