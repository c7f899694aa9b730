/* The configuration file's reader: INI sections and `key = value` lines,
 * comments after '#' or ';', each key set through config.c's table.
 *
 * config_parse is all or nothing: values are set on a shallow copy and only
 * committed when the whole file is good, so a failed reload leaves the
 * running configuration as it was. A key is set at most once per file
 * (duplicates are errors), so each field of the copy is either shared with
 * the original or freshly owned, never both; that is what commit and
 * rollback rely on.
 */
#include "common/config.h"
#include "common/config_impl.h"
#include "common/textfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG_MAX_FILE (1u << 20)

struct parser {
	struct stage_config next;       /* the values being built; shallow copy at first */
	unsigned *set_on;               /* line each key was set on, 0 if not (cfg_count) */
	const char *section;            /* the table's spelling, NULL before the first */
	struct textfile_pos pos;        /* the file, the line, the message */
};

/* A message at where the parser is; returns rc. */
#define fail(p, rc, ...) textfile_fail(&(p)->pos, rc, __VA_ARGS__)

static int parse_section(struct parser *p, char *s)
{
	size_t n = strlen(s);
	char *name;
	int i;

	if (s[n - 1] != ']')
		return fail(p, -EINVAL, "expected '[section]'");
	s[n - 1] = '\0';
	name = cfg_trim(s + 1);
	i = cfg_find(name, NULL);
	if (i < 0)
		return fail(p, -EINVAL, "section '[%s]': unknown section", name);
	p->section = cfg_section((size_t)i);
	return 0;
}

/* One line of the file (textfile_lines' callback; arg is the parser). */
static int parse_line(void *arg, char *line)
{
	struct parser *p = arg;
	char why[512];
	char *s, *eq, *key, *val;
	int i, rc;

	for (size_t k = 0; line[k]; k++) {
		if ((line[k] == '#' || line[k] == ';') && (k == 0 || cfg_is_ws(line[k - 1]))) {
			line[k] = '\0';
			break;
		}
	}
	s = cfg_trim(line);
	if (!*s)
		return 0;
	if (*s == '[')
		return parse_section(p, s);
	eq = strchr(s, '=');
	if (!eq)
		return fail(p, -EINVAL, "expected 'key = value'");
	*eq = '\0';
	key = cfg_trim(s);
	val = cfg_trim(eq + 1);
	if (!*key)
		return fail(p, -EINVAL, "expected 'key = value'");
	if (!p->section)
		return fail(p, -EINVAL, "key '%s': key before any section", key);
	i = cfg_find(p->section, key);
	if (i < 0)
		return fail(p, -EINVAL, "key '%s.%s': unknown key", p->section, key);
	if (p->set_on[i])
		return fail(p, -EINVAL, "key '%s.%s': duplicate key (first set on line %u)",
			    p->section, key, p->set_on[i]);
	rc = cfg_set((size_t)i, &p->next, val, why, sizeof(why));
	if (rc == -ENOMEM)
		return fail(p, rc, "key '%s.%s': out of memory", p->section, key);
	if (rc)
		return fail(p, rc, "key '%s.%s': %s", p->section, key, why);
	p->set_on[i] = p->pos.line;
	return 0;
}

static int parse_text(struct parser *p, char *text, size_t len)
{
	int rc = textfile_lines(text, len, &p->pos.line, parse_line, p);

	if (rc == -EILSEQ)
		return fail(p, -EINVAL, "NUL byte in file");
	return rc;
}

int config_parse(struct stage_config *c, const char *text, size_t len,
		 const char *fname, char *err, size_t errlen)
{
	struct parser p = {
		.next = *c,
		.pos.fname = fname ? fname : "<config>",
		.pos.err = err,
		.pos.errlen = err ? errlen : 0,
	};
	char *buf;
	int rc;

	if (p.pos.errlen)
		err[0] = '\0';
	buf = malloc(len + 1);
	p.set_on = calloc(cfg_count(), sizeof(*p.set_on));
	if (!buf || !p.set_on) {
		free(buf);
		free(p.set_on);
		return fail(&p, -ENOMEM, "out of memory");
	}
	if (len)
		memcpy(buf, text, len);
	buf[len] = '\0';

	rc = parse_text(&p, buf, len);
	/* Each key set here is owned by p.next; the loser of the two is freed. */
	for (size_t i = 0; i < cfg_count(); i++)
		if (p.set_on[i])
			cfg_release(i, rc ? &p.next : c);
	if (rc == 0)
		*c = p.next;
	free(p.set_on);
	free(buf);
	return rc;
}

/* Reads at most CONFIG_MAX_FILE bytes; one byte more is -EFBIG. */
int config_load(struct stage_config *c, const char *path, char *err, size_t errlen)
{
	size_t len = 0;
	char *text = NULL;
	int rc;

	rc = textfile_read(path, CONFIG_MAX_FILE, &text, &len);
	if (rc == 0 && len > CONFIG_MAX_FILE) {
		free(text);
		rc = -EFBIG;
	}
	if (rc) {
		if (err)
			snprintf(err, errlen, "configuration %s: %s", path,
				 rc == -EFBIG ? "too large for a configuration file" : strerror(-rc));
		return rc;
	}
	rc = config_parse(c, text, len, path, err, errlen);
	free(text);
	return rc;
}
