/* The syntax of the names and addresses a configuration carries, which the
 * rest of the code checks by the same rules: HOST:PORT (a listen address, a
 * hosts file's line) and node, job and step names (config.h). */
#include "common/config.h"
#include "common/config_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

/* RFC 1123 names; '_' too, since real hosts files carry it. */
static bool is_hostname(const char *h)
{
	size_t label = 0, n = 0;

	for (; h[n]; n++) {
		char ch = h[n];

		if (ch == '.') {
			if (label == 0)
				return false;
			label = 0;
		} else if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
			   (ch >= '0' && ch <= '9') || ch == '-' || ch == '_') {
			if (++label > 63)
				return false;
		} else {
			return false;
		}
	}
	return n > 0 && n <= 253 && label > 0;
}

int config_parse_hostport(const char *s, char *host, size_t hostlen, uint16_t *port,
			  const char **why)
{
	char h[256];
	const char *hb, *he, *p;
	uint64_t v;
	unsigned char addr[sizeof(struct in6_addr)];

	if (s[0] == '[') {
		hb = s + 1;
		he = strchr(hb, ']');
		if (!he) {
			*why = "missing ']' after the IPv6 address";
			return -EINVAL;
		}
		p = he + 1;
		if (*p != ':') {
			*why = "expected ':PORT' after ']'";
			return -EINVAL;
		}
	} else {
		hb = s;
		he = strrchr(s, ':');
		if (!he) {
			*why = "expected HOST:PORT";
			return -EINVAL;
		}
		if (memchr(hb, ':', (size_t)(he - hb))) {
			*why = "an IPv6 address goes in brackets: [ADDR]:PORT";
			return -EINVAL;
		}
		p = he;
	}
	if (he == hb) {
		*why = "missing host";
		return -EINVAL;
	}
	if ((size_t)(he - hb) >= sizeof(h)) {
		*why = "host name too long";
		return -EINVAL;
	}
	memcpy(h, hb, (size_t)(he - hb));
	h[he - hb] = '\0';

	if (hb != s) {
		if (inet_pton(AF_INET6, h, addr) != 1) {
			*why = "not an IPv6 address inside '[...]'";
			return -EINVAL;
		}
	} else if (h[strspn(h, "0123456789.")] == '\0') {
		/* All digits and dots: an address, never a name. */
		if (inet_pton(AF_INET, h, addr) != 1) {
			*why = "not an IPv4 address";
			return -EINVAL;
		}
	} else if (!is_hostname(h)) {
		*why = "not a host name or address";
		return -EINVAL;
	}

	if (cfg_parse_uint(p + 1, &v) || v < 1 || v > 65535) {
		*why = "PORT must be a number from 1 to 65535";
		return -EINVAL;
	}
	if (host) {
		if (strlen(h) >= hostlen) {
			*why = "host name too long";
			return -EINVAL;
		}
		strcpy(host, h);
	}
	if (port)
		*port = (uint16_t)v;
	return 0;
}

int config_check_name(const char *s, const char **why)
{
	size_t n = strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-");

	if (!*s)
		*why = "empty name";
	else if (s[n])
		*why = "a name has only letters, digits, '.', '-' and '_'";
	else if (s[0] == '.' || s[0] == '-')
		*why = "a name does not start with '.' or '-'";
	else if (n > 255)
		*why = "name longer than 255 bytes";
	else
		return 0;
	return -EINVAL;
}
