# stage: a plain Makefile. `make help` lists the targets.
#
# Layout of the build: common/ is a static library that depends on nothing of
# the project; staged and stage link it. Each tests/unit/test_X.c is its own
# cmocka binary linked with libcommon.a and the daemon's objects (minus main).

CC       ?= cc
BUILD    ?= build
PKGS     := liburing libxxhash libzstd libsodium libcrypto libibverbs librdmacm
CPPFLAGS += -I. -D_GNU_SOURCE
CFLAGS   ?= -O2 -g
CFLAGS   += -std=c11 -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
            -Wmissing-prototypes -Wno-unused-parameter -fno-strict-aliasing
LDLIBS   += -lpthread -lm

# pkg-config finds the libraries; xxhash's .pc is missing on some releases.
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
ifeq ($(PKG_LIBS),)
PKG_LIBS := -luring -lxxhash -lzstd -lsodium -lcrypto -libverbs -lrdmacm
endif
CFLAGS += $(PKG_CFLAGS)
LDLIBS += $(PKG_LIBS)

ifeq ($(SANITIZE),address)
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
else ifeq ($(SANITIZE),undefined)
CFLAGS  += -fsanitize=undefined -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=undefined
endif

COMMON_SRC := $(sort $(wildcard common/*.c))
DAEMON_SRC := $(sort $(wildcard daemon/*.c daemon/*/*.c))
RDMA_SRC   := $(sort $(wildcard rdma/*.c))
CLIENT_SRC := $(sort $(wildcard client/*.c))
UNIT_SRC   := $(sort $(wildcard tests/unit/test_*.c))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
COMMON_OBJ := $(call obj,$(COMMON_SRC))
DAEMON_OBJ := $(call obj,$(filter-out daemon/staged.c,$(DAEMON_SRC)) $(RDMA_SRC))
CLIENT_OBJ := $(call obj,$(filter-out client/stage.c,$(CLIENT_SRC)))
UNIT_BIN   := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))

BIN := $(BUILD)/bin/staged $(BUILD)/bin/stage

.PHONY: all check unit calls integration demo deps help clean bench-smoke fuzz fuzz-smoke install
all: $(BIN)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/libcommon.a: $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

$(BUILD)/bin/staged: $(call obj,daemon/staged.c) $(DAEMON_OBJ) $(BUILD)/libcommon.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/bin/stage: $(call obj,client/stage.c) $(CLIENT_OBJ) $(BUILD)/libcommon.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/libdaemon.a: $(DAEMON_OBJ)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

$(BUILD)/libclient.a: $(CLIENT_OBJ)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

# Archives, so a test pulls in only the modules it calls.
$(BUILD)/tests/%: $(call obj,tests/unit/%.c) $(BUILD)/libdaemon.a $(BUILD)/libclient.a $(BUILD)/libcommon.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lcmocka

deps:
	@tools/install-deps

# The calls between files, from the objects: no circle, folders call down
# (the layers are written in tools/check-calls and docs/ARCHITECTURE.md).
calls: all
	@tools/check-calls $(BUILD)

unit: $(UNIT_BIN)
	@tools/run-unit $(UNIT_BIN)

# A peer holding the cluster key that misbehaves on purpose, for
# tests/integration/test_evil_peer.py: the daemon's own handshake and frames.
EVILPEER := $(BUILD)/tests/evilpeer
$(EVILPEER): $(call obj,tests/tools/evilpeer.c tests/tools/evilpeer_scn.c tests/tools/evilpeer_partner.c) $(BUILD)/libdaemon.a $(BUILD)/libclient.a $(BUILD)/libcommon.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
all: $(EVILPEER)

# Expands a hostlist expression with common/hostlist.c, one name a line, for
# tests/integration/test_hostlist.py to compare with Slurm's scontrol.
HOSTLIST_EXPAND := $(BUILD)/tests/hostlist_expand
$(HOSTLIST_EXPAND): $(call obj,tests/tools/hostlist_expand.c) $(BUILD)/libcommon.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
all: $(HOSTLIST_EXPAND)

# Preloaded into the daemons of the fault campaigns (tests/tools/faultfs.py):
# tells faultfs of each syncfs, which FUSE does not pass on. Built without
# the sanitizers: it is loaded before their runtime.
SYNCFS_SHIM := $(BUILD)/tests/syncfs_shim.so
$(SYNCFS_SHIM): tests/tools/syncfs_shim.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -O2 -g -std=c11 -Wall -Wextra -Werror -fPIC -shared -o $@ $<
all: $(SYNCFS_SHIM)

# The one-copy bound of tools/bench/dataplane (its comment says why not fio).
COPYBOUND := $(BUILD)/tools/copybound
$(COPYBOUND): tools/bench/copybound.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< -luring
all: $(COPYBOUND)

# What sealing a frame costs per wire (docs/BENCHMARKS.md, "The seal").
SEALSPEED := $(BUILD)/tools/sealspeed
$(SEALSPEED): $(call obj,tools/bench/sealspeed.c) $(BUILD)/libcommon.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
all: $(SEALSPEED)

integration: $(BIN) $(EVILPEER) $(HOSTLIST_EXPAND) $(SYNCFS_SHIM)
	@tools/run-integration

# One integration run under valgrind's memcheck: a plain build (no ASan) in
# build-vg, every daemon (with tests/tools/vgshim.c preloaded, why: its
# comment) and every client the tests start under memcheck, and any error or
# definite leak fails its test (tests/integration/conftest.py,
# STAGE_VALGRIND). Replications compress (float) so that the codec runs.
# Pulls, verify, commit and replication, resume, a full disk, dedup,
# verify --cluster and restore, the hostile-network and lying-peer tests, a
# whole doctor run (its figures are not judged under valgrind: too slow), the
# metrics of a replication and the textfile writer, requests acting as their
# users (a pull, checkpoint commands, a replica, a cluster pull), and the
# trainer first (skipped steps, pauses for a save).
VG_BUILD := build-vg
VG_TESTS := $(addprefix tests/integration/, \
	test_pull.py::test_messy_tree_is_copied_exactly \
	test_pull.py::test_repull_mirrors_changes_and_deletions \
	test_pull.py::test_pull_with_verify \
	test_pull.py::test_json_output \
	test_pull.py::test_concurrent_pulls_of_the_same_tree \
	test_pull.py::test_special_files_do_not_hang_the_pull \
	test_verify.py \
	test_replicate.py::test_commit_wait_replica_identical \
	test_replicate.py::test_recommit_unchanged_and_changed \
	test_replicate.py::test_wrong_key_refused \
	test_replicate.py::test_full_disk_on_holder \
	test_replicate.py::test_kill9_origin_resumes_from_records \
	test_restore.py::test_cluster_verify_all_intact \
	test_restore.py::test_flipped_byte_found_and_restored \
	test_restore.py::test_deleted_checkpoint_dir_restored \
	test_restore.py::test_replacement_node \
	test_restore.py::test_holder_down \
	test_dedup.py::test_damaged_local_copy_is_fetched_instead \
	test_hostile.py \
	test_streams.py \
	test_stale.py \
	test_yield.py \
	test_evil_peer.py \
	test_doctor.py::test_loopback_fact_values \
	test_doctor.py::test_bad_input \
	test_metrics.py::test_replication_both_ends_and_a_partner_down \
	test_metrics.py::test_unwritable_textfile_warns_once_and_recovers \
	test_resume.py::test_replacement_node_gets_its_shards_and_holdings_back \
	test_durable.py::test_steps_drained_side_by_side \
	test_durable.py::test_kill9_mid_drain_resumes \
	test_durable_restore.py::test_bad_replica_chunk_comes_from_durable \
	test_durable_restore.py::test_two_neighbours_lose_disks \
	test_users.py::test_a_pull_never_writes_into_another_users_destination \
	test_users.py::test_checkpoint_commands_on_another_users_job_are_refused \
	test_users.py::test_replicas_keep_their_owner_and_only_the_owner_restores \
	test_users.py::test_a_cluster_pull_acts_as_its_user_on_every_node)
.PHONY: valgrind
valgrind:
	@command -v valgrind >/dev/null || { echo "make valgrind: no valgrind (make deps)" >&2; exit 2; }
	@$(MAKE) --no-print-directory BUILD=$(VG_BUILD) SANITIZE= \
		$(VG_BUILD)/bin/staged $(VG_BUILD)/bin/stage $(VG_BUILD)/tests/vgshim.so \
		$(VG_BUILD)/tests/evilpeer
	@STAGE_BUILD=$(CURDIR)/$(VG_BUILD) STAGE_VALGRIND=1 STAGE_VALGRIND_CLIENT=1 STAGE_COMPRESS=float \
		PYTHONDONTWRITEBYTECODE=1 timeout --kill-after=30 900 \
		/usr/bin/python3 -m pytest -q -ra -p no:cacheprovider $(VG_TESTS)

# Preloaded into the daemon under valgrind only.
$(BUILD)/tests/vgshim.so: tests/tools/vgshim.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -fPIC -shared -o $@ $< -luring -ldl

# `make check` installs what is missing, builds, and runs every test.
check: deps
	@$(MAKE) --no-print-directory all unit calls
	@$(MAKE) --no-print-directory integration

demo: deps
	@$(MAKE) --no-print-directory all
	@tools/demo

bench-smoke: $(BIN)
	@tools/bench/pull --smoke
	@tools/bench/codec --smoke
	@tools/bench/verify --smoke
	@tools/bench/replicate --smoke
	@tools/bench/restore --smoke
	@tools/bench/trainer --smoke
	@tools/bench/doctor --smoke
	@tools/bench/resume --smoke
	@tools/bench/cpull --smoke
	@tools/bench/fanout --smoke
	@tools/bench/durable --smoke
	@tools/bench/dataplane --smoke

# libFuzzer targets, one per parser of outside bytes; built with clang.
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRC))
FUZZ_FLAGS := -std=c11 -D_GNU_SOURCE -I. -g -O1 -fsanitize=fuzzer,address,undefined

$(BUILD)/fuzz/%: tests/fuzz/%.c $(COMMON_SRC)
	@mkdir -p $(dir $@)
	clang $(FUZZ_FLAGS) -o $@ $^ -lxxhash -lsodium -lzstd -lcrypto

# Targets that reach past common/.
$(BUILD)/fuzz/fuzz_rflow: rdma/flow.c
$(BUILD)/fuzz/fuzz_seal: daemon/net/xport_seal.c

fuzz: $(FUZZ_BIN)

# A short run of each target over its corpus: proves they still build and run.
fuzz-smoke: $(FUZZ_BIN)
	@for f in $(FUZZ_BIN); do \
		n=$${f##*/fuzz_}; \
		echo "== $$f ($${FUZZ_SECONDS:-10} s)"; \
		rm -rf $(BUILD)/fuzz/new-$$n && mkdir -p $(BUILD)/fuzz/new-$$n; \
		$$f -max_total_time=$${FUZZ_SECONDS:-10} $(BUILD)/fuzz/new-$$n \
			tests/fuzz/corpus/$$n > $(BUILD)/fuzz/$$n.log 2>&1 \
			|| { tail -n 30 $(BUILD)/fuzz/$$n.log; exit 1; }; \
		tail -n 1 $(BUILD)/fuzz/$$n.log; \
	done

# `make install [PREFIX=/usr/local] [DESTDIR=]`: the two programs, the
# systemd unit (its ExecStart names PREFIX), a sample config that never
# replaces one already there, and the README.
PREFIX ?= /usr/local
SYSCONFDIR ?= /etc
SYSTEMD_UNIT_DIR ?= $(PREFIX)/lib/systemd/system
DOCDIR ?= $(PREFIX)/share/doc/stage
# Where bash-completion loads a command's completion from, on first use.
BASH_COMPLETION_DIR ?= $(PREFIX)/share/bash-completion/completions
install: $(BIN)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(SYSTEMD_UNIT_DIR) $(DESTDIR)$(SYSCONFDIR)/stage \
		$(DESTDIR)$(DOCDIR) $(DESTDIR)$(BASH_COMPLETION_DIR)
	install -m 0755 $(BUILD)/bin/staged $(BUILD)/bin/stage $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 tools/install/stage.bash $(DESTDIR)$(BASH_COMPLETION_DIR)/stage
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' \
		-e 's|@DOCDIR@|$(DOCDIR)|g' tools/install/staged.service.in \
		> $(DESTDIR)$(SYSTEMD_UNIT_DIR)/staged.service
	chmod 0644 $(DESTDIR)$(SYSTEMD_UNIT_DIR)/staged.service
	install -m 0644 tools/install/staged.conf $(DESTDIR)$(SYSCONFDIR)/stage/staged.conf.sample
	test -e $(DESTDIR)$(SYSCONFDIR)/stage/staged.conf || \
		install -m 0644 tools/install/staged.conf $(DESTDIR)$(SYSCONFDIR)/stage/staged.conf
	install -m 0644 README.md docs/*.md $(DESTDIR)$(DOCDIR)/

help:
	@echo "make              build build/bin/staged and build/bin/stage (warnings are errors)"
	@echo "make check        install missing dependencies, build, run unit and integration tests"
	@echo "make demo         install missing dependencies, build, show a pull and a verify"
	@echo "make unit         build and run the cmocka unit tests"
	@echo "make calls        check the calls between files: no circle, each folder calls only down"
	@echo "make integration  run the pytest integration tests (real daemons)"
	@echo "make valgrind     plain build in build-vg; integration tests with daemons and clients under memcheck"
	@echo "make deps         apt-get what the build, tests and benchmarks need"
	@echo "make install      PREFIX=/usr/local SYSCONFDIR=/etc DESTDIR=: programs, systemd unit, sample config,"
	@echo "                  bash completion"
	@echo "make fuzz         build the libFuzzer targets (clang); make fuzz-smoke runs each briefly"
	@echo "make SANITIZE=address|undefined ...   build with sanitizers"
	@echo "make clean"

clean:
	rm -rf $(BUILD)

.SECONDARY:

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
