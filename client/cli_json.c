#include "client/cli_json.h"

#include <inttypes.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at s (at most n bytes), or 0 if the
 * byte at s does not start one. Rejects overlong forms, surrogates and code
 * points past U+10FFFF (RFC 3629), so what passes is what a strict JSON
 * parser accepts. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	unsigned char lo = 0x80, hi = 0xbf;
	size_t len;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4;
	else
		return 0;
	if (n < len)
		return 0;
	/* Only the second byte's range depends on the first. */
	if (c == 0xe0)
		lo = 0xa0;
	else if (c == 0xed)
		hi = 0x9f;
	else if (c == 0xf0)
		lo = 0x90;
	else if (c == 0xf4)
		hi = 0x8f;
	if (s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if (s[i] < 0x80 || s[i] > 0xbf)
			return 0;
	return len;
}

void cli_json_string(FILE *f, const char *str, size_t n)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t i = 0;

	fputc('"', f);
	while (i < n) {
		unsigned char c = s[i];
		size_t len = utf8_len(s + i, n - i);

		if (len > 1) {
			fwrite(s + i, 1, len, f);
			i += len;
			continue;
		}
		i++;
		if (len == 1 && c >= 0x20 && c != '"' && c != '\\')
			fputc(c, f);
		else if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", f);
		else if (c == '\t')
			fputs("\\t", f);
		else if (c == '\r')
			fputs("\\r", f);
		else
			fprintf(f, "\\u%04x", c);
	}
	fputc('"', f);
}

void cli_json_begin(struct cli_json *j, FILE *f, const char *event)
{
	j->f = f;
	j->first = true;
	fputc('{', f);
	if (event)
		cli_json_str(j, "event", event);
}

void cli_json_key(struct cli_json *j, const char *key, size_t n)
{
	if (!j->first)
		fputc(',', j->f);
	j->first = false;
	cli_json_string(j->f, key, n);
	fputc(':', j->f);
}

void cli_json_strn(struct cli_json *j, const char *key, const char *s, size_t n)
{
	cli_json_key(j, key, strlen(key));
	cli_json_string(j->f, s, n);
}

void cli_json_str(struct cli_json *j, const char *key, const char *s)
{
	cli_json_strn(j, key, s, strlen(s));
}

void cli_json_u64(struct cli_json *j, const char *key, uint64_t v)
{
	cli_json_key(j, key, strlen(key));
	fprintf(j->f, "%" PRIu64, v);
}

void cli_json_end(struct cli_json *j)
{
	fputs("}\n", j->f);
}
