/* The checkpoint watcher on real inotify and real directories: markers,
 * settle, the .stage exclusion, re-arming, discovery at open and later,
 * deletion and queue overflow. Times are short (settle 300 ms, quiet
 * 100 ms); waits poll until the callback fires or a generous deadline. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/ckpt/watch.h"

#define SETTLE   300
#define QUIET    100
#define LONG     5000           /* deadline for something that must happen */

struct rec {
	int n;                          /* reports so far */
	char what[32][160];             /* "JOB/STEP why" */
	int64_t at[32];                 /* when, ms */
};

struct t {
	char root[64];
	struct watch *w;
	struct rec r;
};

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_done(const char *job, const char *step, const char *why, void *arg)
{
	struct rec *r = arg;

	if (r->n < 32) {
		snprintf(r->what[r->n], sizeof(r->what[0]), "%s/%s %s", job, step, why);
		r->at[r->n] = now_ms();
	}
	r->n++;
}

/* Drives the watcher as the daemon does until `want` reports were made or
 * max_ms passed; returns the number of reports. */
static int pump(struct t *t, int want, int max_ms)
{
	int64_t end = now_ms() + max_ms, left;
	struct pollfd p = { .fd = watch_fd(t->w), .events = POLLIN };
	int to;

	while (t->r.n < want && (left = end - now_ms()) > 0) {
		to = watch_timeout_ms(t->w);
		if (to < 0 || to > left)
			to = (int)left;
		assert_true(poll(&p, 1, to) >= 0);
		if (p.revents & POLLIN)
			assert_int_equal(watch_handle(t->w, on_done, &t->r), 0);
		watch_tick(t->w, on_done, &t->r);
	}
	return t->r.n;
}

/* Nothing is reported during ms. */
static void silent(struct t *t, int ms)
{
	int n = t->r.n;

	assert_int_equal(pump(t, n + 1, ms), n);
}

static void expect(struct t *t, const char *what)
{
	int n = t->r.n;

	assert_int_equal(pump(t, n + 1, LONG), n + 1);
	assert_string_equal(t->r.what[n], what);
}

static void mk(struct t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mk(struct t *t, const char *fmt, ...)
{
	char rel[PATH_MAX], p[PATH_MAX + 64];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(rel, sizeof(rel), fmt, ap);
	va_end(ap);
	snprintf(p, sizeof(p), "%s/%s", t->root, rel);
	assert_int_equal(mkdir(p, 0755), 0);
}

/* Appends text to ROOT/rel, creating it. */
static void put(struct t *t, const char *rel, const char *text)
{
	char p[PATH_MAX];
	int fd;

	snprintf(p, sizeof(p), "%s/%s", t->root, rel);
	fd = open(p, O_WRONLY | O_CREAT | O_APPEND, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

/* ROOT/rel in buf. */
static const char *at(struct t *t, const char *rel, char *buf)
{
	snprintf(buf, PATH_MAX, "%s/%s", t->root, rel);
	return buf;
}

static void rm_rf(struct t *t, const char *rel)
{
	char cmd[PATH_MAX + 16];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s/%s'", t->root, rel);
	assert_int_equal(system(cmd), 0);
}

static void open_w(struct t *t, const char *marker)
{
	struct watch_opts o = { .marker = marker, .settle_ms = SETTLE, .quiet_ms = QUIET };
	char why[256];

	assert_int_equal(watch_open(&t->w, t->root, &o, why, sizeof(why)), 0);
}

static int setup(void **state)
{
	struct t *t = calloc(1, sizeof(*t));

	assert_non_null(t);
	strcpy(t->root, "/tmp/test_watch.XXXXXX");
	assert_non_null(mkdtemp(t->root));
	*state = t;
	return 0;
}

static int teardown(void **state)
{
	struct t *t = *state;
	watch_close(t->w);
	rm_rf(t, "");
	free(t);
	return 0;
}

static void test_dcp_marker(void **state)
{
	struct t *t = *state;
	int64_t t0;

	open_w(t, NULL);
	assert_int_equal(watch_timeout_ms(t->w), -1);
	mk(t, "job");
	mk(t, "job/step_100");
	put(t, "job/step_100/__0_0.distcp", "shard 0");
	put(t, "job/step_100/__1_0.distcp", "shard 1");
	silent(t, QUIET + 50);          /* past quiet, before settle: no marker, no report */
	t0 = now_ms();
	put(t, "job/step_100/.metadata", "meta");
	expect(t, "job/step_100 marker .metadata");
	assert_true(t->r.at[0] - t0 >= QUIET);
	silent(t, SETTLE + 200);        /* once */
	assert_int_equal(watch_timeout_ms(t->w), -1);
}

static void test_hf_trainer_state(void **state)
{
	struct t *t = *state;

	mk(t, "run");
	open_w(t, NULL);
	mk(t, "run/checkpoint-500");
	put(t, "run/checkpoint-500/model.safetensors", "weights");
	put(t, "run/checkpoint-500/trainer_state.json", "{}");
	expect(t, "run/checkpoint-500 marker trainer_state.json");
}

static void test_configured_marker(void **state)
{
	struct t *t = *state;

	mk(t, "job");
	open_w(t, "DONE");
	mk(t, "job/s1");
	put(t, "job/s1/data", "x");
	silent(t, QUIET + 50);
	put(t, "job/s1/DONE", "");
	expect(t, "job/s1 marker DONE");
}

static void test_deepspeed_latest(void **state)
{
	struct t *t = *state;

	char p[PATH_MAX];

	mk(t, "ds");
	open_w(t, NULL);
	mk(t, "ds/global_step10");
	put(t, "ds/global_step10/mp_rank_00_model_states.pt", "w");
	silent(t, QUIET + 50);
	put(t, "ds/latest", "nonexistent_step\n");      /* names no step: ignored */
	silent(t, 30);
	unlink(at(t, "ds/latest", p));
	put(t, "ds/latest", "  global_step10 \nrest\n");
	expect(t, "ds/global_step10 marker latest");
}

static void test_settle_without_marker(void **state)
{
	struct t *t = *state;
	int64_t t0;

	mk(t, "job");
	mk(t, "job/s");
	put(t, "job/s/f", "x");
	open_w(t, NULL);
	expect(t, "job/s settled 300 ms");      /* found at open, no manifest */
	t->r.n = 0;
	t0 = now_ms();
	put(t, "job/s/g", "y");
	silent(t, SETTLE - 80);
	expect(t, "job/s settled 300 ms");
	assert_true(t->r.at[0] - t0 >= SETTLE);
}

static void test_writes_postpone_settle(void **state)
{
	struct t *t = *state;
	int64_t last = 0;
	int i;

	mk(t, "job");
	open_w(t, NULL);
	mk(t, "job/s");
	for (i = 0; i < 8; i++) {       /* 800 ms of writes, each within settle of the last */
		put(t, "job/s/big", "more data");
		last = now_ms();
		silent(t, 100);
	}
	expect(t, "job/s settled 300 ms");
	assert_true(t->r.at[0] - last >= SETTLE);
}

static void test_nested_subdirectories(void **state)
{
	struct t *t = *state;

	mk(t, "job");
	mk(t, "job/s");
	put(t, "job/s/.metadata", "m");
	open_w(t, NULL);
	expect(t, "job/s marker .metadata");
	/* Made faster than the watcher can add watches: found by scanning. */
	mk(t, "job/s/model");
	mk(t, "job/s/model/layer0");
	mk(t, "job/s/model/layer0/deep");
	put(t, "job/s/model/layer0/deep/w.bin", "w");
	expect(t, "job/s marker .metadata");
	/* Writes deep down alone are activity: the deep directory is watched. */
	put(t, "job/s/model/layer0/deep/w.bin", "more");
	expect(t, "job/s marker .metadata");
	put(t, "job/s/model/layer0/x", "x");
	expect(t, "job/s marker .metadata");
}

static void test_stage_dir_ignored(void **state)
{
	struct t *t = *state;
	char p[PATH_MAX], q[PATH_MAX];

	mk(t, "job");
	open_w(t, NULL);
	mk(t, "job/s");
	put(t, "job/s/.metadata", "m");
	expect(t, "job/s marker .metadata");
	mk(t, "job/s/.stage");
	mk(t, "job/s/.stage/tmp");
	put(t, "job/s/.stage/tmp/1", "t");
	put(t, "job/s/.stage/manifest.partial", "journal");
	assert_int_equal(rename(at(t, "job/s/.stage/manifest.partial", p),
				at(t, "job/s/.stage/manifest", q)), 0);
	silent(t, SETTLE + 200);
}

static void test_written_again_reported_again(void **state)
{
	struct t *t = *state;

	mk(t, "job");
	open_w(t, NULL);
	mk(t, "job/s");
	put(t, "job/s/__0_0.distcp", "a");
	put(t, "job/s/.metadata", "m");
	expect(t, "job/s marker .metadata");
	silent(t, QUIET + 50);
	put(t, "job/s/__0_0.distcp", "b");      /* .metadata still there: it counts */
	expect(t, "job/s marker .metadata");
	assert_int_equal(t->r.n, 2);
}

static void test_new_job_and_step(void **state)
{
	struct t *t = *state;

	open_w(t, NULL);
	mk(t, "job");
	mk(t, "job/s");
	put(t, "job/s/.metadata", "m");
	expect(t, "job/s marker .metadata");
	/* All at once, before the watcher sees the job: found by scanning. */
	mk(t, "j2");
	mk(t, "j2/s2");
	put(t, "j2/s2/trainer_state.json", "{}");
	expect(t, "j2/s2 marker trainer_state.json");
}

static void test_hidden_names_ignored(void **state)
{
	struct t *t = *state;

	open_w(t, NULL);
	mk(t, ".hidden");
	mk(t, ".hidden/s");
	put(t, ".hidden/s/.metadata", "m");
	mk(t, "job");
	mk(t, "job/.tmp_step");
	put(t, "job/.tmp_step/.metadata", "m");
	mk(t, "job/bad name");
	put(t, "job/bad name/.metadata", "m");
	put(t, "not_a_dir", "x");
	silent(t, SETTLE + 200);
	/* A hidden directory beneath a step is the step's, though. */
	mk(t, "job/s");
	mk(t, "job/s/.cache");
	put(t, "job/s/.cache/f", "x");
	expect(t, "job/s settled 300 ms");
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(a, b);
}

static void test_existing_at_open(void **state)
{
	struct t *t = *state;

	mk(t, "job");
	mk(t, "job/a");
	put(t, "job/a/.metadata", "m");         /* finished while the daemon was down */
	mk(t, "job/b");
	put(t, "job/b/.metadata", "m");
	mk(t, "job/b/.stage");
	put(t, "job/b/.stage/manifest", "done");        /* committed already */
	mk(t, "job/c");
	put(t, "job/c/f", "x");                 /* no marker */
	mk(t, "ds");
	mk(t, "ds/global_step7");
	put(t, "ds/global_step7/f", "x");
	put(t, "ds/latest", "global_step7");
	open_w(t, NULL);
	assert_int_equal(pump(t, 3, LONG), 3);
	silent(t, SETTLE + 200);
	assert_int_equal(t->r.n, 3);
	qsort(t->r.what, 3, sizeof(t->r.what[0]), cmp_str);
	assert_string_equal(t->r.what[0], "ds/global_step7 marker latest");
	assert_string_equal(t->r.what[1], "job/a marker .metadata");
	assert_string_equal(t->r.what[2], "job/c settled 300 ms");
}

static void test_deleted_step_never_reported(void **state)
{
	struct t *t = *state;

	mk(t, "job");
	open_w(t, NULL);
	mk(t, "job/s");
	mk(t, "job/s/sub");
	put(t, "job/s/sub/f", "x");
	put(t, "job/s/.metadata", "m");
	silent(t, 20);
	rm_rf(t, "job/s");
	silent(t, SETTLE + 200);
	/* Also when the whole job goes, and when the deletion is still unread. */
	mk(t, "job/s2");
	put(t, "job/s2/.metadata", "m");
	silent(t, 20);
	rm_rf(t, "job");
	usleep((SETTLE + 100) * 1000);
	watch_tick(t->w, on_done, &t->r);
	silent(t, SETTLE);
	assert_int_equal(t->r.n, 0);
}

static void test_queue_overflow_rescans(void **state)
{
	struct t *t = *state;
	char p[PATH_MAX];
	long max = 0;
	FILE *f = fopen("/proc/sys/fs/inotify/max_queued_events", "r");
	int i, fd;

	if (!f || fscanf(f, "%ld", &max) != 1 || max > 100000) {
		if (f)
			fclose(f);
		skip();
	}
	fclose(f);
	mk(t, "job");
	mk(t, "job/s");
	put(t, "job/s/.metadata", "m");
	mk(t, "job/s/.stage");
	put(t, "job/s/.stage/manifest", "m");
	open_w(t, NULL);
	for (i = 0; i <= max; i++) {    /* a create and a close each: the queue overflows */
		snprintf(p, sizeof(p), "%s/job/s/%d", t->root, i);
		fd = open(p, O_WRONLY | O_CREAT, 0644);
		assert_true(fd >= 0);
		close(fd);
	}
	/* Its events are lost: only the rescan can find this one. */
	mk(t, "j2");
	mk(t, "j2/s2");
	put(t, "j2/s2/.metadata", "m");
	assert_int_equal(pump(t, 2, LONG), 2);
	qsort(t->r.what, 2, sizeof(t->r.what[0]), cmp_str);
	assert_string_equal(t->r.what[0], "j2/s2 marker .metadata");
	assert_string_equal(t->r.what[1], "job/s marker .metadata");
}

static void test_missing_root(void **state)
{
	struct t *t = *state;
	struct watch_opts o = { .settle_ms = SETTLE, .quiet_ms = QUIET };
	char p[PATH_MAX], why[PATH_MAX + 64] = "";

	snprintf(p, sizeof(p), "%s/nope", t->root);
	assert_int_equal(watch_open(&t->w, p, &o, why, sizeof(why)), -ENOENT);
	assert_null(t->w);
	assert_non_null(strstr(why, p));
	snprintf(p, sizeof(p), "%s/file", t->root);
	put(t, "file", "x");
	assert_int_equal(watch_open(&t->w, p, &o, why, sizeof(why)), -ENOTDIR);
	assert_non_null(strstr(why, p));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
		T(test_dcp_marker),
		T(test_hf_trainer_state),
		T(test_configured_marker),
		T(test_deepspeed_latest),
		T(test_settle_without_marker),
		T(test_writes_postpone_settle),
		T(test_nested_subdirectories),
		T(test_stage_dir_ignored),
		T(test_written_again_reported_again),
		T(test_new_job_and_step),
		T(test_hidden_names_ignored),
		T(test_existing_at_open),
		T(test_deleted_step_never_reported),
		T(test_queue_overflow_rescans),
		T(test_missing_root),
#undef T
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
