/* The checkpoint watcher: a tree of watched directories mirroring
 * ckpt_root/JOB/STEP/..., a map from inotify watch descriptor to node, and
 * a list of the steps waiting to finish. See watch.h for the contract. */
#include "daemon/ckpt/watch.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"

#define LATEST_MAX   4096       /* bytes of JOB/latest read: one short line is expected */
#define READS_MAX    64         /* event buffers per watch_handle: poll calls again */
#define EVBUF_SIZE   65536

enum kind { K_ROOT, K_JOB, K_STEP, K_SUB };

/* A watched directory. Children are unordered; lookups by name (moves only)
 * scan them, everything frequent goes through the wd map. */
struct wnode {
	int wd;                         /* inotify watch descriptor */
	enum kind kind;
	char *name;                     /* one component; the root's is ckpt_root itself */
	struct wnode *parent;           /* NULL for the root */
	struct wnode *child;            /* first child */
	struct wnode *prev, *next;      /* siblings */
	struct wnode *hnext;            /* wd map chain */
	struct wnode *scan_next;        /* queue of directories still to be listed */
	struct wnode *step;             /* K_STEP, K_SUB: the step this directory is in */
	/* K_STEP only */
	struct wnode *pprev, *pnext;    /* the pending list */
	bool pending;                   /* not reported since its last activity */
	uint64_t last_ms;               /* CLOCK_MONOTONIC of its last activity */
	uint64_t told_ms;               /* when watch_opts's wrote was last called for it */
	const char *marker;             /* the marker seen (for the log), or NULL */
	/* K_JOB only */
	char *latest;                   /* the existing step JOB/latest named, or NULL */
};

struct watch {
	int fd;                         /* inotify, non-blocking */
	char *root_path;                /* ckpt_root as given */
	char *marker;                   /* the configured extra marker, or NULL */
	uint64_t settle_ms, quiet_ms;
	struct wnode *root;             /* NULL once ckpt_root itself went away */
	struct wnode **map;             /* wd -> node, chained, nmap buckets (a power of 2) */
	size_t nmap, count;
	struct wnode *pending;          /* steps waiting for quiet or settle */
	struct wnode *scan_head, *scan_tail;
	bool warned_limit;              /* the watch limit was logged already */
	void (*wrote)(const char *job, void *arg);      /* watch_opts's */
	void *wrote_arg;
	char evbuf[EVBUF_SIZE] __attribute__((aligned(__alignof__(struct inotify_event))));
};

static const char *const builtin_markers[] = { ".metadata", "trainer_state.json" };

static struct wnode **map_slot(const struct watch *w, int wd)
{
	return &w->map[(unsigned)wd & (w->nmap - 1)];
}

static struct wnode *map_get(const struct watch *w, int wd)
{
	struct wnode *n;

	for (n = *map_slot(w, wd); n && n->wd != wd; n = n->hnext)
		;
	return n;
}

static int map_put(struct watch *w, struct wnode *n)
{
	struct wnode **slot;

	/* wds are handed out in sequence, so masking spreads them evenly. */
	if (w->count >= w->nmap) {
		size_t nb = 2 * w->nmap, i;
		struct wnode **m = calloc(nb, sizeof(*m)), *o, *nx;

		if (!m)
			return -ENOMEM;
		for (i = 0; i < w->nmap; i++)
			for (o = w->map[i]; o; o = nx) {
				nx = o->hnext;
				o->hnext = m[(unsigned)o->wd & (nb - 1)];
				m[(unsigned)o->wd & (nb - 1)] = o;
			}
		free(w->map);
		w->map = m;
		w->nmap = nb;
	}
	slot = map_slot(w, n->wd);
	n->hnext = *slot;
	*slot = n;
	w->count++;
	return 0;
}

static void map_del(struct watch *w, struct wnode *n)
{
	struct wnode **pp;

	for (pp = map_slot(w, n->wd); *pp; pp = &(*pp)->hnext)
		if (*pp == n) {
			*pp = n->hnext;
			w->count--;
			return;
		}
}

static void pending_del(struct watch *w, struct wnode *s)
{
	if (!s->pending)
		return;
	s->pending = false;
	if (s->pprev)
		s->pprev->pnext = s->pnext;
	else
		w->pending = s->pnext;
	if (s->pnext)
		s->pnext->pprev = s->pprev;
}

static uint64_t deadline(const struct watch *w, const struct wnode *s)
{
	return s->last_ms + (s->marker ? w->quiet_ms : w->settle_ms);
}

/* Writes the node's path (and "/name") to buf, rebuilt from the tree: moves
 * forget and re-add nodes, so names are current. Its length, or -errno. */
static int node_path(const struct wnode *n, const char *name, char *buf, size_t len)
{
	int o = n->parent ? node_path(n->parent, n->name, buf, len) :
			    snprintf(buf, len, "%s", n->name);
	int k;

	if (o < 0 || (size_t)o >= len)
		return -ENAMETOOLONG;
	if (!name)
		return o;
	k = snprintf(buf + o, len - (size_t)o, "/%s", name);
	return k < 0 || (size_t)k >= len - (size_t)o ? -ENAMETOOLONG : o + k;
}

static bool exists(const struct wnode *n, const char *name, bool want_dir)
{
	char p[PATH_MAX];
	struct stat st;

	if (node_path(n, name, p, sizeof(p)) < 0 || fstatat(AT_FDCWD, p, &st, AT_SYMLINK_NOFOLLOW))
		return false;
	return !want_dir || S_ISDIR(st.st_mode);
}

static struct wnode *child_named(const struct wnode *n, const char *name)
{
	struct wnode *c;

	for (c = n->child; c && strcmp(c->name, name); c = c->next)
		;
	return c;
}

/* Which marker the step has now, by looking (re-arm, discovery). */
static const char *step_marker(const struct watch *w, const struct wnode *s)
{
	size_t i;

	for (i = 0; i < sizeof(builtin_markers) / sizeof(builtin_markers[0]); i++)
		if (exists(s, builtin_markers[i], false))
			return builtin_markers[i];
	if (w->marker && exists(s, w->marker, false))
		return w->marker;
	if (s->parent->latest && !strcmp(s->parent->latest, s->name))
		return "latest";
	return NULL;
}

/* Something was written in the step: it waits (again) for its quiet time. */
static void step_activity(struct watch *w, struct wnode *s)
{
	s->last_ms = (uint64_t)mono_ms();
	if (w->wrote && s->last_ms - s->told_ms >= WATCH_WROTE_MS) {
		s->told_ms = s->last_ms;
		w->wrote(s->parent->name, w->wrote_arg);
	}
	if (s->pending)
		return;
	s->marker = step_marker(w, s);
	s->pending = true;
	s->pprev = NULL;
	s->pnext = w->pending;
	if (w->pending)
		w->pending->pprev = s;
	w->pending = s;
}

static void node_free(struct watch *w, struct wnode *n, bool rm_watch)
{
	struct wnode *job = n->parent;

	if (n->kind == K_STEP) {
		pending_del(w, n);
		if (job->latest && !strcmp(job->latest, n->name)) {
			free(job->latest);
			job->latest = NULL;
		}
	}
	if (n->prev)
		n->prev->next = n->next;
	else if (n->parent)
		n->parent->child = n->next;
	if (n->next)
		n->next->prev = n->prev;
	map_del(w, n);
	if (rm_watch)
		inotify_rm_watch(w->fd, n->wd);
	if (n == w->root)
		w->root = NULL;
	free(n->latest);
	free(n->name);
	free(n);
}

/* Forgets a directory and everything beneath it, deepest first. gone: the
 * kernel removed top's watch itself (deleted directory). */
static void forget(struct watch *w, struct wnode *top, bool gone)
{
	struct wnode *n = top, *up;

	for (;;) {
		while (n->child)
			n = n->child;
		up = n->parent;
		if (n == top) {
			node_free(w, n, !gone);
			return;
		}
		node_free(w, n, true);
		n = up;
	}
}

static uint32_t kind_mask(enum kind k)
{
	uint32_t m = IN_ONLYDIR | IN_MASK_CREATE | IN_DELETE_SELF;

	if (k != K_ROOT)
		m |= IN_DONT_FOLLOW;    /* ckpt_root may be a symlink, nothing beneath */
	switch (k) {
	case K_ROOT:
		return m | IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM;
	case K_JOB:             /* step directories and JOB/latest */
		return m | IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_CLOSE_WRITE | IN_DELETE;
	default:                /* everything that is activity */
		return m | IN_EXCL_UNLINK | IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE |
		       IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_ATTRIB;
	}
}

/* Watches parent/name and queues it to be listed. A directory that vanished
 * meanwhile, or that is watched already (seen by a listing and an event
 * both), is no error. */
static int add_dir(struct watch *w, struct wnode *parent, const char *name, enum kind k)
{
	char p[PATH_MAX];
	struct wnode *n;
	int wd, ret;

	ret = parent ? node_path(parent, name, p, sizeof(p)) :
		       (snprintf(p, sizeof(p), "%s", name) < (int)sizeof(p) ? 0 : -ENAMETOOLONG);
	if (ret < 0)
		return ret;
	wd = inotify_add_watch(w->fd, p, kind_mask(k));
	if (wd < 0) {
		ret = -errno;
		if (ret == -ENOSPC && !w->warned_limit) {
			log_warn("watch: inotify watch limit reached at '%s' (fs.inotify.max_user_watches)", p);
			w->warned_limit = true;
		}
		if (ret == -ENOENT || ret == -ENOTDIR || ret == -EEXIST || ret == -EACCES || ret == -ELOOP)
			return parent ? 0 : ret;
		return ret;
	}
	n = calloc(1, sizeof(*n));
	if (n) {
		n->wd = wd;
		n->name = strdup(name);
	}
	if (!n || !n->name || map_put(w, n) < 0) {
		if (n)
			free(n->name);
		free(n);
		inotify_rm_watch(w->fd, wd);
		return -ENOMEM;
	}
	n->kind = k;
	n->parent = parent;
	if (parent) {
		n->next = parent->child;
		if (parent->child)
			parent->child->prev = n;
		parent->child = n;
	}
	if (k == K_STEP) {
		n->step = n;
		/* As at open: a manifest means commit saw it finished already. */
		if (!exists(n, ".stage/manifest", false))
			step_activity(w, n);
	} else if (k == K_SUB) {
		n->step = parent->step;
	}
	if (w->scan_tail)
		w->scan_tail->scan_next = n;
	else
		w->scan_head = n;
	w->scan_tail = n;
	return 0;
}

/* JOB/latest (DeepSpeed): its first line, trimmed, names the finished step. */
static void read_latest(struct watch *w, struct wnode *job)
{
	char p[PATH_MAX], buf[LATEST_MAX + 1], *s, *e;
	struct wnode *step;
	const char *why;
	size_t len = 0;
	ssize_t r;
	int fd;

	if (node_path(job, "latest", p, sizeof(p)) < 0)
		return;
	fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
	if (fd < 0)
		return;
	while (len < LATEST_MAX && (r = read(fd, buf + len, LATEST_MAX - len)) > 0)
		len += (size_t)r;
	close(fd);
	buf[len] = 0;
	s = buf + strspn(buf, " \t\r\v\f");
	s[strcspn(s, "\n")] = 0;
	for (e = s + strlen(s); e > s && isspace((unsigned char)e[-1]); e--)
		;
	*e = 0;
	if (config_check_name(s, &why) < 0) {
		log_debug("watch: %s: ignored: %s", p, why);
		return;
	}
	step = child_named(job, s);
	if (!step || step->kind != K_STEP)
		return;
	free(job->latest);
	job->latest = strdup(s);
	if (step->pending && !step->marker)
		step->marker = "latest";
}

/* Lists the queued directories: their subdirectories are watched (and
 * queued) in turn, so what was created before a watch existed is found. */
static int scan_drain(struct watch *w)
{
	struct wnode *n;
	struct dirent *de;
	struct stat st;
	char p[PATH_MAX];
	int ret = 0, r, fd;
	DIR *d;

	while ((n = w->scan_head)) {
		w->scan_head = n->scan_next;
		if (!w->scan_head)
			w->scan_tail = NULL;
		n->scan_next = NULL;
		if (node_path(n, NULL, p, sizeof(p)) < 0)
			continue;
		fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (n->kind == K_ROOT ? 0 : O_NOFOLLOW));
		if (fd < 0 || !(d = fdopendir(fd))) {
			if (fd >= 0)
				close(fd);
			continue;
		}
		while ((de = readdir(d))) {
			const char *name = de->d_name, *why;
			enum kind k = n->kind == K_ROOT ? K_JOB : n->kind == K_JOB ? K_STEP : K_SUB;

			if (!strcmp(name, ".") || !strcmp(name, ".."))
				continue;
			if (de->d_type == DT_UNKNOWN) {
				if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISDIR(st.st_mode))
					continue;
			} else if (de->d_type != DT_DIR) {
				continue;
			}
			if (k != K_SUB && config_check_name(name, &why) < 0)
				continue;
			if (n->kind == K_STEP && !strcmp(name, ".stage"))
				continue;
			r = add_dir(w, n, name, k);
			if (r < 0 && !ret)
				ret = r;
		}
		closedir(d);
		if (n->kind == K_JOB)
			read_latest(w, n);      /* after the steps exist: it must name one */
	}
	return ret;
}

/* Builds the tree from scratch (open, queue overflow). Steps known to be
 * written stay so: a rewritten step with an old manifest is not lost. */
static int rescan(struct watch *w)
{
	struct wnode *s, *job;
	char **keep = NULL, *slash;
	size_t nkeep = 0, i = 0;
	int ret;

	for (s = w->pending; s; s = s->pnext)
		nkeep++;
	keep = nkeep ? calloc(nkeep, sizeof(*keep)) : NULL;
	for (s = w->pending; keep && s; s = s->pnext)
		if (asprintf(&keep[i], "%s/%s", s->parent->name, s->name) >= 0)
			i++;
	if (w->root)
		forget(w, w->root, false);
	ret = add_dir(w, NULL, w->root_path, K_ROOT);
	if (ret == 0) {
		w->root = w->scan_head; /* the queue was empty: the root is all it holds */
		ret = scan_drain(w);
	}
	while (i--) {
		slash = strchr(keep[i], '/');
		*slash = 0;
		if (w->root && (job = child_named(w->root, keep[i])) &&
		    (s = child_named(job, slash + 1)) && s->kind == K_STEP)
			step_activity(w, s);
		free(keep[i]);
	}
	free(keep);
	return ret;
}

static bool is_marker(const struct watch *w, const char *name)
{
	return !strcmp(name, builtin_markers[0]) || !strcmp(name, builtin_markers[1]) ||
	       (w->marker && !strcmp(name, w->marker));
}

static void on_event(struct watch *w, const struct inotify_event *e)
{
	const char *name = e->len ? e->name : "", *why;
	bool isdir = e->mask & IN_ISDIR;
	bool in = e->mask & (IN_CREATE | IN_MOVED_TO);
	struct wnode *n, *c;
	int ret = 0, r;

	if (e->mask & IN_Q_OVERFLOW) {
		log_info("watch: inotify queue overflowed: rescanning %s", w->root_path);
		ret = rescan(w);
		goto out;
	}
	n = map_get(w, e->wd);
	if (!n)
		return;                 /* a watch forgotten already */
	if (e->mask & (IN_DELETE_SELF | IN_IGNORED)) {
		if (n == w->root)
			log_warn("watch: %s went away: no longer watching", w->root_path);
		forget(w, n, true);
		return;
	}
	if (!*name)
		return;                 /* events on the directory itself: its parent saw them */
	switch (n->kind) {
	case K_ROOT:
	case K_JOB:
		if (n->kind == K_JOB && !isdir && !strcmp(name, "latest")) {
			if (e->mask & (IN_CLOSE_WRITE | IN_MOVED_TO)) {
				read_latest(w, n);
			} else if (e->mask & (IN_DELETE | IN_MOVED_FROM)) {
				free(n->latest);
				n->latest = NULL;
			}
			return;
		}
		if (!isdir || config_check_name(name, &why) < 0)
			return;
		break;
	case K_STEP:
		if (!strcmp(name, ".stage"))
			return;         /* commit's own writes */
		/* fall through */
	case K_SUB:
		step_activity(w, n->step);
		if (n->kind == K_STEP && is_marker(w, name))
			n->marker = step_marker(w, n);
		if (!isdir)
			return;
		break;
	}
	if (in)
		ret = add_dir(w, n, name, n->kind == K_ROOT ? K_JOB : n->kind == K_JOB ? K_STEP : K_SUB);
	else if ((e->mask & IN_MOVED_FROM) && (c = child_named(n, name)))
		forget(w, c, false);
out:
	r = scan_drain(w);
	if (!ret)
		ret = r;
	if (ret < 0 && ret != -ENOSPC)
		log_warn("watch: %s: %s", w->root_path, strerror(-ret));
}

int watch_open(struct watch **wp, const char *ckpt_root, const struct watch_opts *o,
	       char *why, size_t whylen)
{
	struct watch *w;
	int ret;

	w = calloc(1, sizeof(*w));
	if (!w) {
		ret = -ENOMEM;
		goto fail;
	}
	w->settle_ms = o->settle_ms;
	w->quiet_ms = o->quiet_ms;
	w->wrote = o->wrote;
	w->wrote_arg = o->wrote_arg;
	w->nmap = 64;
	w->map = calloc(w->nmap, sizeof(*w->map));
	w->root_path = strdup(ckpt_root);
	w->marker = o->marker && *o->marker ? strdup(o->marker) : NULL;
	if (!w->map || !w->root_path || (o->marker && *o->marker && !w->marker)) {
		ret = -ENOMEM;
		goto free_watch;
	}
	w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (w->fd < 0) {
		ret = -errno;
		goto free_watch;
	}
	ret = rescan(w);
	if (ret < 0 && !w->root)
		goto close_fd;
	if (ret < 0)            /* a subtree could not be watched: logged, the rest works */
		log_warn("watch: %s: %s", ckpt_root, strerror(-ret));
	*wp = w;
	return 0;

close_fd:
	close(w->fd);
free_watch:
	free(w->marker);
	free(w->root_path);
	free(w->map);
	free(w);
fail:
	snprintf(why, whylen, "watch %s: %s", ckpt_root, strerror(-ret));
	return ret;
}

void watch_close(struct watch *w)
{
	if (!w)
		return;
	if (w->root)
		forget(w, w->root, false);
	close(w->fd);
	free(w->marker);
	free(w->root_path);
	free(w->map);
	free(w);
}

int watch_fd(const struct watch *w)
{
	return w->fd;
}

int watch_handle(struct watch *w, watch_fn fn, void *arg)
{
	const struct inotify_event *e;
	ssize_t len;
	size_t off;
	int i;

	for (i = 0; i < READS_MAX; i++) {
		len = read(w->fd, w->evbuf, sizeof(w->evbuf));
		if (len < 0 && errno == EINTR)
			continue;
		if (len < 0 && errno == EAGAIN)
			break;
		if (len <= 0)
			return len < 0 ? -errno : -EIO;
		for (off = 0; off < (size_t)len; off += sizeof(*e) + e->len) {
			e = (const struct inotify_event *)(w->evbuf + off);
			on_event(w, e);
		}
	}
	watch_tick(w, fn, arg);
	return 0;
}

void watch_tick(struct watch *w, watch_fn fn, void *arg)
{
	uint64_t now = (uint64_t)mono_ms();
	struct wnode *s, *nx;
	char why[NAME_MAX + 16];

	for (s = w->pending; s; s = nx) {
		nx = s->pnext;
		if (deadline(w, s) > now)
			continue;
		pending_del(w, s);
		/* Its deletion may wait unread in the queue: never report it. */
		if (!exists(s, NULL, true))
			continue;
		if (s->marker)
			snprintf(why, sizeof(why), "marker %s", s->marker);
		else
			snprintf(why, sizeof(why), "settled %llu ms", (unsigned long long)w->settle_ms);
		fn(s->parent->name, s->name, why, arg);
	}
}

int watch_timeout_ms(const struct watch *w)
{
	uint64_t now = (uint64_t)mono_ms(), best = UINT64_MAX, d;
	const struct wnode *s;

	for (s = w->pending; s; s = s->pnext) {
		d = deadline(w, s);
		if (d < best)
			best = d;
	}
	if (best == UINT64_MAX)
		return -1;
	if (best <= now)
		return 0;
	return best - now > INT_MAX ? INT_MAX : (int)(best - now);
}
