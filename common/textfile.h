/* Small text files that come from outside (the config, the hosts file):
 * reading them with a size cap, and the one shape of message their parsers
 * give, "FILE:LINE: why", with the file's control bytes made harmless. */
#ifndef STAGE_TEXTFILE_H
#define STAGE_TEXTFILE_H

#include <stdarg.h>
#include <stddef.h>

/* Reads up to max + 1 bytes of PATH into a fresh buffer (one byte over is
 * enough for the caller to refuse the file as too large). 0 or -errno. */
int textfile_read(const char *path, size_t max, char **buf, size_t *len);
/* Calls fn on each line of TEXT (len bytes, writable: each '\n' becomes a
 * NUL), counting lines in *line, until fn returns non-zero (returned). A
 * line holding a NUL byte stops the walk with -EILSEQ, *line at it. */
int textfile_lines(char *text, size_t len, unsigned *line, int (*fn)(void *arg, char *s),
		   void *arg);
/* Writes "FNAME:LINE: " (or "FNAME: " when line is 0) then the message into
 * err, replacing control bytes by '?': the message may quote the file. */
void textfile_verr(char *err, size_t errlen, const char *fname, unsigned line,
		   const char *fmt, va_list ap);
/* Where a parser of such a file is, for its messages. */
struct textfile_pos {
	const char *fname;
	unsigned line;          /* 0 for messages about the whole file */
	char *err;              /* the message, errlen bytes (0: none kept) */
	size_t errlen;
};
/* textfile_verr at pos; returns rc. */
int textfile_fail(struct textfile_pos *pos, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
