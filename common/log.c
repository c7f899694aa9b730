#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum log_level log_threshold = LOG_INFO;

static const char *log_ident = "stage";
static int log_fd = 2;

const char *const log_level_names[] = {
	[LOG_ERROR] = "error", [LOG_WARN] = "warn", [LOG_INFO] = "info", [LOG_DEBUG] = "debug", NULL,
};

void log_open(const char *ident, int fd)
{
	log_ident = ident;
	log_fd = fd;
}

const char *log_level_name(enum log_level lvl)
{
	return log_level_names[lvl];
}

int log_level_parse(const char *s)
{
	for (int i = 0; log_level_names[i]; i++)
		if (strcmp(s, log_level_names[i]) == 0)
			return i;
	return -1;
}

void log_write(enum log_level lvl, const char *fmt, ...)
{
	char line[2048];
	struct timespec ts;
	struct tm tm;
	va_list ap;
	int n;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s[%d] %s: ",
		     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
		     tm.tm_sec, ts.tv_nsec / 1000000, log_ident, (int)getpid(), log_level_names[lvl]);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	/* One write per line so concurrent threads never interleave inside a line. */
	if (write(log_fd, line, (size_t)n) < 0) {
		/* nowhere left to report it */
	}
}
