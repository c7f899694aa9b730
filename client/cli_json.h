/* JSON lines for scripts: one flat object per line on stdout.
 *
 * Strings are escaped per RFC 8259. Names are raw bytes, not necessarily
 * UTF-8: valid UTF-8 passes through unchanged, and each byte that is not part
 * of a valid sequence is written as \u00XX. That fallback is lossy (it reads
 * back as U+00XX, indistinguishable from a Latin-1 character); scripts that
 * need exact bytes of such names use `stage manifest`, whose text escapes them
 * losslessly. */
#ifndef STAGE_CLI_JSON_H
#define STAGE_CLI_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct cli_json {
	FILE *f;
	bool first;         /* no member written yet: the next needs no comma */
};

/* Writes s[0..n) as a quoted, escaped JSON string. */
void cli_json_string(FILE *f, const char *s, size_t n);

/* {"event":EVENT ... }\n; event may be NULL for an object without one. */
void cli_json_begin(struct cli_json *j, FILE *f, const char *event);
/* Writes the member name key[0..n); the caller writes the value (an array, say). */
void cli_json_key(struct cli_json *j, const char *key, size_t n);
void cli_json_str(struct cli_json *j, const char *key, const char *s);
void cli_json_strn(struct cli_json *j, const char *key, const char *s, size_t n);
void cli_json_u64(struct cli_json *j, const char *key, uint64_t v);
void cli_json_end(struct cli_json *j);

#endif
