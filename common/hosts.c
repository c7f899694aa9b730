/* The cluster hosts file and partner placement (format and rule: hosts.h).
 *
 * Invariants of a parsed struct hosts, which placement and the replication
 * code rely on: 1 <= n <= HOSTS_MAX_NODES; every name passes
 * config_check_name and no two are equal; no two nodes have the same port
 * and the same host (by address value for IP addresses, without case for
 * names), so a node's address identifies it; every domain passes
 * config_check_name. hosts_parse is all or nothing, so a struct hosts never
 * holds part of a file.
 *
 * Duplicates are found by comparing each node with those before it: at most
 * 4096 nodes makes that 8M comparisons in the worst case, a few milliseconds
 * once at start-up, and it reports the first offending line like every other
 * error.
 */
#include "common/hosts.h"
#include "common/textfile.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct seen {
	unsigned line;          /* where the node was defined */
	char *addr;             /* owned; host in comparable form, see addr_key */
};

struct parser {
	struct hosts out;       /* the nodes so far, owned */
	struct seen *seen;      /* seen[i] goes with out.v[i], owned */
	size_t cap;             /* allocated length of out.v and seen */
	struct textfile_pos pos; /* the file, the line, the message */
};

/* A message at where the parser is; returns rc. */
#define fail(p, rc, ...) textfile_fail(&(p)->pos, rc, __VA_ARGS__)

static bool is_ws(char ch)
{
	return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\v' || ch == '\f';
}

/* The host in a form where equal means the same machine and port: IPv6
 * addresses have many spellings, host names have case. (IPv4 is spelled one
 * way: config_parse_hostport takes only dotted quads, inet_pton no leading
 * zeros.) */
static char *addr_key(const char *host)
{
	unsigned char a6[16];
	char buf[INET6_ADDRSTRLEN];
	char *k;

	if (inet_pton(AF_INET6, host, a6) == 1 && inet_ntop(AF_INET6, a6, buf, sizeof(buf)))
		return strdup(buf);
	k = strdup(host);
	for (char *s = k; s && *s; s++)
		*s = (char)tolower((unsigned char)*s);
	return k;
}

/* rdma=ADDR: an address without a port. Checked by config_parse_hostport
 * under a dummy port so that "a host name" means the same in both fields. */
static int check_rdma(char **addr, const char **why)
{
	char *a = *addr, buf[300];
	size_t n = strlen(a);
	unsigned char a6[16];
	int rc;

	if (n >= 2 && a[0] == '[' && a[n - 1] == ']') {
		a[n - 1] = '\0';
		a++;
	}
	if (strchr(a, ':')) {
		rc = inet_pton(AF_INET6, a, a6) == 1 ? 0 : -EINVAL;
		*why = "not an IPv6 address";
	} else if (!*a || strchr(a, '[') || strchr(a, ']')) {
		rc = -EINVAL;
		*why = "expected an IPv4 or IPv6 address or a host name, without a port";
	} else if ((size_t)snprintf(buf, sizeof(buf), "%s:1", a) >= sizeof(buf)) {
		rc = -EINVAL;
		*why = "host name too long";
	} else {
		rc = config_parse_hostport(buf, NULL, 0, NULL, why);
	}
	if (rc == 0)
		*addr = a;
	else if (a != *addr)
		a[n - 2] = ']';         /* the message quotes the value as written */
	return rc;
}

static void host_release(struct host *n)
{
	free(n->name);
	free(n->host);
	free(n->domain);
	free(n->rdma);
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

/* Copies the line's fields (they live in the parse buffer) into a new node;
 * takes key on success only, so the caller frees it on failure. */
static int add_node(struct parser *p, const char *name, const char *host, uint16_t port,
		    const char *domain, const char *rdma, char *key)
{
	struct host n = { 0 };

	if (p->out.n == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 16;
		struct host *v = realloc(p->out.v, cap * sizeof(*v));
		struct seen *s;

		if (!v)
			return -ENOMEM;
		p->out.v = v;
		s = realloc(p->seen, cap * sizeof(*s));
		if (!s)
			return -ENOMEM;
		p->seen = s;
		p->cap = cap;
	}
	n.name = strdup(name);
	n.host = strdup(host);
	n.port = port;
	n.domain = dup_or_null(domain);
	n.rdma = dup_or_null(rdma);
	if (!n.name || !n.host || (domain && !n.domain) || (rdma && !n.rdma)) {
		host_release(&n);
		return -ENOMEM;
	}
	p->out.v[p->out.n] = n;
	p->seen[p->out.n] = (struct seen){ .line = p->pos.line, .addr = key };
	p->out.n++;
	return 0;
}

/* Splits off the next white-space separated field, or NULL at the end. */
static char *next_field(char **sp)
{
	char *s = *sp, *f;

	while (is_ws(*s))
		s++;
	if (!*s)
		return NULL;
	f = s;
	while (*s && !is_ws(*s))
		s++;
	if (*s)
		*s++ = '\0';
	*sp = s;
	return f;
}

static int parse_options(struct parser *p, const char *name, char *s,
			 char **domain, char **rdma)
{
	const char *why;
	char *f;

	while ((f = next_field(&s))) {
		char *eq = strchr(f, '='), *val;

		if (!eq)
			return fail(p, -EINVAL, "node '%s': '%s': expected domain=RACK or rdma=ADDR",
				    name, f);
		*eq = '\0';
		val = eq + 1;
		if (strcmp(f, "domain") == 0) {
			if (*domain)
				return fail(p, -EINVAL, "node '%s': duplicate option 'domain'", name);
			if (config_check_name(val, &why))
				return fail(p, -EINVAL, "node '%s': domain '%s': %s", name, val, why);
			*domain = val;
		} else if (strcmp(f, "rdma") == 0) {
			if (*rdma)
				return fail(p, -EINVAL, "node '%s': duplicate option 'rdma'", name);
			if (check_rdma(&val, &why))
				return fail(p, -EINVAL, "node '%s': rdma '%s': %s", name, eq + 1, why);
			*rdma = val;
		} else {
			return fail(p, -EINVAL, "node '%s': unknown option '%s'", name, f);
		}
	}
	return 0;
}

/* One line of the file (textfile_lines' callback; arg is the parser). */
static int parse_line(void *arg, char *s)
{
	struct parser *p = arg;
	char host[256], *name, *addr, *domain = NULL, *rdma = NULL, *key;
	const char *why;
	uint16_t port;
	int rc;

	for (size_t i = 0; s[i]; i++) {
		if (s[i] == '#' && (i == 0 || is_ws(s[i - 1]))) {
			s[i] = '\0';
			break;
		}
	}
	name = next_field(&s);
	if (!name)
		return 0;
	if (p->out.n == HOSTS_MAX_NODES)
		return fail(p, -EINVAL, "more than %d nodes", HOSTS_MAX_NODES);
	if (config_check_name(name, &why))
		return fail(p, -EINVAL, "node '%s': %s", name, why);
	if (strcmp(name, HOLD_DURABLE) == 0)
		return fail(p, -EINVAL, "node '%s': the name of the durable tier in verify "
			    "--cluster, restore --from and resume: call the node otherwise", name);
	for (size_t i = 0; i < p->out.n; i++)
		if (strcmp(p->out.v[i].name, name) == 0)
			return fail(p, -EINVAL, "node '%s': duplicate name (first on line %u)",
				    name, p->seen[i].line);
	addr = next_field(&s);
	if (!addr)
		return fail(p, -EINVAL, "node '%s': missing HOST:PORT", name);
	if (config_parse_hostport(addr, host, sizeof(host), &port, &why))
		return fail(p, -EINVAL, "node '%s': address '%s': %s", name, addr, why);
	rc = parse_options(p, name, s, &domain, &rdma);
	if (rc)
		return rc;

	key = addr_key(host);
	if (!key)
		return fail(p, -ENOMEM, "node '%s': out of memory", name);
	for (size_t i = 0; i < p->out.n; i++) {
		if (p->out.v[i].port == port && strcmp(p->seen[i].addr, key) == 0) {
			free(key);
			return fail(p, -EINVAL,
				    "node '%s': address '%s' already used by node '%s' (line %u)",
				    name, addr, p->out.v[i].name, p->seen[i].line);
		}
	}
	rc = add_node(p, name, host, port, domain, rdma, key);
	if (rc) {
		free(key);
		return fail(p, rc, "node '%s': out of memory", name);
	}
	return 0;
}

static int parse_text(struct parser *p, char *text, size_t len)
{
	int rc = textfile_lines(text, len, &p->pos.line, parse_line, p);

	if (rc == -EILSEQ)
		return fail(p, -EINVAL, "NUL byte in file");
	if (rc == 0 && p->out.n == 0) {
		p->pos.line = 0;
		rc = fail(p, -EINVAL, "no nodes in file");
	}
	return rc;
}

void hosts_free(struct hosts *h)
{
	for (size_t i = 0; i < h->n; i++)
		host_release(&h->v[i]);
	free(h->v);
	h->v = NULL;
	h->n = 0;
}

int hosts_parse(struct hosts *h, const char *text, size_t len, const char *fname,
		char *err, size_t errlen)
{
	struct parser p = {
		.pos.fname = fname ? fname : "<hosts>",
		.pos.err = err,
		.pos.errlen = err ? errlen : 0,
	};
	char *buf;
	int rc;

	h->v = NULL;
	h->n = 0;
	if (p.pos.errlen)
		err[0] = '\0';
	if (len > HOSTS_MAX_FILE)
		return fail(&p, -EFBIG, "larger than %u bytes", HOSTS_MAX_FILE);
	buf = malloc(len + 1);
	if (!buf)
		return fail(&p, -ENOMEM, "out of memory");
	if (len)
		memcpy(buf, text, len);
	buf[len] = '\0';

	rc = parse_text(&p, buf, len);
	for (size_t i = 0; i < p.out.n; i++)
		free(p.seen[i].addr);
	free(p.seen);
	if (rc)
		hosts_free(&p.out);
	else
		*h = p.out;
	free(buf);
	return rc;
}

int hosts_load(struct hosts *h, const char *path, char *err, size_t errlen)
{
	size_t len = 0;
	char *buf = NULL;
	int rc;

	h->v = NULL;
	h->n = 0;
	/* One byte over the limit is enough for hosts_parse to refuse it. */
	rc = textfile_read(path, HOSTS_MAX_FILE, &buf, &len);
	if (rc < 0) {
		if (err && errlen)
			snprintf(err, errlen, "hosts file %s ([cluster] hosts): %s", path,
				 rc == -EFBIG ? "too large for a hosts file" : strerror(-rc));
		return rc;
	}
	rc = hosts_parse(h, buf, len, path, err, errlen);
	free(buf);
	return rc;
}

ssize_t hosts_find(const struct hosts *h, const char *name)
{
	for (size_t i = 0; i < h->n; i++)
		if (strcmp(h->v[i].name, name) == 0)
			return (ssize_t)i;
	return -1;
}

int hosts_partners(const struct hosts *h, size_t self, int replicas, size_t *out, size_t cap)
{
	const char *dom;
	size_t want, k = 0;

	if (self >= h->n || (replicas < 0 && replicas != CFG_REPLICAS_ALL))
		return -EINVAL;
	want = replicas == CFG_REPLICAS_ALL ? h->n : (size_t)replicas;
	dom = h->v[self].domain;
	for (size_t step = 1; step < h->n && k < want; step++) {
		size_t j = (self + step) % h->n;

		if (dom && h->v[j].domain && strcmp(dom, h->v[j].domain) == 0)
			continue;
		if (k == cap)
			return -ENOSPC;
		out[k++] = j;
	}
	return (int)k;
}
