/* Logging: one macro that checks the level before it formats anything. */
#ifndef STAGE_LOG_H
#define STAGE_LOG_H

enum log_level { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG };

extern enum log_level log_threshold;
/* "error", "warn", "info", "debug", indexed by level, NULL-terminated. */
extern const char *const log_level_names[];

void log_open(const char *ident, int fd);
void log_write(enum log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* "error", "warn", "info", "debug" -> level; -1 when unknown. */
int log_level_parse(const char *s);
const char *log_level_name(enum log_level lvl);

#define LOG(lvl, ...)                                     \
	do {                                              \
		if ((lvl) <= log_threshold)               \
			log_write((lvl), __VA_ARGS__);    \
	} while (0)

#define log_err(...)   LOG(LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  LOG(LOG_WARN, __VA_ARGS__)
#define log_info(...)  LOG(LOG_INFO, __VA_ARGS__)
#define log_debug(...) LOG(LOG_DEBUG, __VA_ARGS__)

#endif
