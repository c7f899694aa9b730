"""Fixtures of the integration suite: real staged daemons on real files.

Every test gets a time limit (SIGALRM, default 120 s, STAGE_TEST_TIMEOUT or
@pytest.mark.timeout(N) to change it) and every subprocess its own timeout,
so a hung daemon fails one test instead of the run.
"""
import faulthandler
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import (BUILD, IS_ROOT, REPO, STAGE, STAGED, client_env, rm_tree, sanitizer_report, wait_for,
                     write_hosts, write_key)

DEFAULT_TIMEOUT = int(os.environ.get("STAGE_TEST_TIMEOUT", "120"))
NOBODY = (65534, 65534)
_names = itertools.count()

# STAGE_VALGRIND=1 runs every daemon under valgrind's memcheck (`make
# valgrind`; a build without ASan: STAGE_BUILD=build-vg), with
# tests/tools/vgshim.c preloaded (why: its comment). Each run's report goes
# to base/valgrind.N.log next to daemon.N.log, and Daemon.close() fails the
# test on any error in it (also definite leaks, at exit).
# STAGE_VALGRIND_CLIENT=1 with it runs every `stage` the tests start through
# Daemon.run/popen under memcheck too (reports: base/valgrind-stage.PID.log).
# STAGE_COMPRESS sets [transfer] compress for the daemons whose test does not
# set it (e.g. `float`, so that a replication runs the codec).
VALGRIND = os.environ.get("STAGE_VALGRIND", "") not in ("", "0")
VALGRIND_EXIT = 97            # valgrind's exit status when it found errors
VALGRIND_SUPP = REPO / "tests" / "valgrind.supp"
VALGRIND_SHIM = BUILD / "tests" / "vgshim.so"
SLOW = 6 if VALGRIND else 1   # daemon start and stop take this much longer
VALGRIND_CLIENT = VALGRIND and os.environ.get("STAGE_VALGRIND_CLIENT", "") not in ("", "0")
COMPRESS = os.environ.get("STAGE_COMPRESS")


def valgrind_cmd(log, shim=True):
    """The command prefix that runs a program under memcheck, report to log
    (empty when clean: --quiet); shim: preload vgshim.so (the daemon)."""
    if not VALGRIND:
        return []
    pre = ["env", f"LD_PRELOAD={VALGRIND_SHIM}"] if shim else []
    return pre + ["valgrind", "--tool=memcheck", "--quiet", f"--error-exitcode={VALGRIND_EXIT}",
                  "--leak-check=full", "--show-leak-kinds=definite", "--errors-for-leak-kinds=definite",
                  "--track-fds=no", "--num-callers=30", "--fair-sched=yes",
                  f"--suppressions={VALGRIND_SUPP}", f"--log-file={log}"]


def valgrind_report(path):
    """The text of a valgrind report (errors, definite leaks) in path, or None."""
    text = Path(path).read_text(errors="replace") if Path(path).exists() else ""
    return text if text.strip() else None


def pytest_configure(config):
    config.addinivalue_line("markers", "timeout(seconds): this test's time limit (SIGALRM)")


def pytest_sessionstart(session):
    missing = [str(p) for p in (STAGED, STAGE) if not os.access(p, os.X_OK)]
    if VALGRIND and not VALGRIND_SHIM.exists():
        missing.append(str(VALGRIND_SHIM))
    if missing:
        pytest.exit(f"not built: {', '.join(missing)} (run `make`)", returncode=2)


@pytest.fixture(autouse=True)
def _time_limit(request):
    m = request.node.get_closest_marker("timeout")
    secs = int(m.args[0]) if m else DEFAULT_TIMEOUT

    def on_alarm(signum, frame):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=False)
        pytest.fail(f"test exceeded its time limit of {secs} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(secs)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# One port allocator for tests and benchmarks (never the same port twice in a
# run: the kernel may hand an ephemeral port out again once its socket closed).
sys.path.insert(0, str(REPO / "tools" / "bench"))
from benchlib import free_port  # noqa: E402,F401 (tests import it from here)


class Daemon:
    """One staged with its own config, roots, state and socket.

    base/            config, logs (one per start), state/, ckpt/, replicas/
    source_roots     default [base/src]
    stage_root       default base/stage
    socket           in a short private directory under /tmp (sun_path is 108 bytes)
    user             None (run as we are) or (uid, gid): daemon and client run
                     under setpriv with that identity
    """

    def __init__(self, base, *, source_roots=None, stage_root=None, transfer=None, user=None, name=None,
                 listen=None, cluster=None, netns=None, doctor=None, metrics=None, exec_prefix=None,
                 disk=None):
        # listen: fixed "HOST:PORT" (default: a fresh free port each write_config);
        # cluster: {key: value} written as a [cluster] section (default: none);
        # netns: run the daemon inside this network namespace (ip netns exec);
        # doctor: {key: value} written as a [doctor] section (default: none);
        # metrics: the same for [metrics] (also settable later: self.metrics,
        # then write_config);
        # exec_prefix: argv put before the daemon (after ip netns exec), e.g.
        # ["faketime", "-f", "+3s"]; read at each start, so a test may change
        # it and restart().
        # disk: a directory (a faultfs mount) that holds state_dir and every
        # root the daemon writes, as one node's disk would; config and logs
        # stay in base (default: all in base).
        self.listen = listen
        self.cluster = dict(cluster) if cluster else None
        self.netns = netns
        self.doctor = dict(doctor) if doctor else None
        self.metrics = dict(metrics) if metrics else None
        self.durable = None     # {key: value} for a [durable] section; set, then write_config
        self.node_extra = {}    # more [node] keys (socket_group, ...); set, then write_config
        self.exec_prefix = list(exec_prefix or [])
        self.base = Path(base)
        self.base.mkdir(parents=True, exist_ok=True)
        self.name = name or f"it-n{next(_names)}"
        self.user = user
        self.sock_dir = Path(tempfile.mkdtemp(prefix="stg-", dir="/tmp"))
        self.socket = self.sock_dir / "staged.sock"
        self.disk = Path(disk) if disk else self.base
        self.state_dir = self.disk / "state"
        self.ckpt_root = self.disk / "ckpt"
        self.replica_root = self.disk / "replicas"
        self.source_roots = [Path(p) for p in (source_roots or [self.base / "src"])]
        self.src_root = self.source_roots[0]
        self.stage_root = Path(stage_root) if stage_root else self.disk / "stage"
        # streams = 1 unless a test asks: the default (0, adapting from a quarter of the cores) would
        # make every test's connections depend on the machine it runs on. stale = send
        # unless a test asks: with the default (skip), whether a test's quick commits of
        # several steps all reach a partner would depend on how fast the sender keeps up
        # (test_stale.py tests skipping).
        self.transfer = {"chunk_size": "64KiB", "streams": 1, "stale": "send",
                         **({"compress": COMPRESS} if COMPRESS else {}), **(transfer or {})}
        self.config_path = self.base / "daemon.conf"
        # The daemon runs through a symlink with a name of its own: other
        # people's `pkill staged` / `pidof staged` on a shared machine must
        # not stop our daemons mid-test. Same binary, same behaviour.
        self.exe = self.sock_dir / "it-daemon"
        os.symlink(STAGED, self.exe)
        self.proc = None
        self.runs = []        # [log path, how it ended: None (running), "term", "kill9", "died", "hung"]
        for p in [self.state_dir, self.stage_root, self.ckpt_root, self.replica_root,
                  *self.source_roots]:
            p.mkdir(parents=True, exist_ok=True)
        if user:
            for p in [self.base, self.sock_dir, self.state_dir, self.stage_root,
                      self.ckpt_root, self.replica_root]:
                os.chown(p, *user)
        self.write_config()

    # ------------------------------------------------------------ config

    def config_text(self):
        t = "\n".join(f"{k} = {v}" for k, v in self.transfer.items())
        return (
            "[node]\n"
            f"name = {self.name}\n"
            f"socket = {self.socket}\n"
            f"listen = {self.listen or f'127.0.0.1:{free_port()}'}\n"
            f"state_dir = {self.state_dir}\n" +
            "".join(f"{k} = {v}\n" for k, v in self.node_extra.items()) +
            "[paths]\n"
            f"source_roots = {','.join(str(p) for p in self.source_roots)}\n"
            f"stage_root = {self.stage_root}\n"
            f"ckpt_root = {self.ckpt_root}\n"
            f"replica_root = {self.replica_root}\n"
            "[transfer]\n"
            f"{t}\n"
        ) + ("[cluster]\n" + "".join(f"{k} = {v}\n" for k, v in self.cluster.items())
             if self.cluster else "") + \
            ("[doctor]\n" + "".join(f"{k} = {v}\n" for k, v in self.doctor.items()) if self.doctor else "") + \
            ("[metrics]\n" + "".join(f"{k} = {v}\n" for k, v in self.metrics.items())
             if self.metrics else "") + \
            ("[durable]\n" + "".join(f"{k} = {v}\n" for k, v in self.durable.items())
             if self.durable else "")

    def write_config(self):
        self.config_path.write_text(self.config_text())
        os.chmod(self.config_path, 0o644)

    @property
    def prefix(self):
        if not self.user:
            return []
        uid, gid = self.user
        return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]

    # ------------------------------------------------------------ life cycle

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout=15):
        assert not self.running
        timeout *= SLOW
        log = self.base / f"daemon.{len(self.runs)}.log"
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(
                (["ip", "netns", "exec", self.netns] if self.netns else []) + self.exec_prefix +
                self.prefix + valgrind_cmd(self.valgrind_log(len(self.runs))) +
                [str(self.exe), "--config", str(self.config_path), "--foreground"],
                stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, cwd=self.base)
        self.runs.append([log, None])

        def ready():
            if self.proc.poll() is not None:
                self.runs[-1][1] = "died"
                raise AssertionError(f"staged exited {self.proc.returncode} while starting:\n{self.log()}")
            if not self.socket.exists():
                return False
            # The control socket is bound before the peer listener (it must
            # exist before the daemon forks); "listening on" is logged once
            # both are up, so a test may dial the peer port at once.
            if " listening on " not in self.log():
                return False
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                try:
                    s.connect(str(self.socket))
                    return True
                except (ConnectionRefusedError, FileNotFoundError):
                    return False

        wait_for(ready, timeout, f"staged to listen on {self.socket}")
        return self

    def valgrind_log(self, run):
        return self.base / f"valgrind.{run}.log"

    def stop(self, timeout=20):
        """SIGTERM; returns the exit status."""
        timeout *= SLOW
        if not self.running:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
            self.runs[-1][1] = "term"
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.runs[-1][1] = "hung"
            raise AssertionError(f"staged did not exit within {timeout} s of SIGTERM")
        return rc

    def kill9(self):
        assert self.running, "staged is not running"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.runs[-1][1] = "kill9"

    def restart(self):
        if self.running:
            rc = self.stop()
            assert rc == 0, f"staged exited {rc} on SIGTERM"
        return self.start()

    def log(self, all_runs=False):
        runs = self.runs if all_runs else self.runs[-1:]
        return "".join(Path(p).read_text(errors="replace") for p, _ in runs if Path(p).exists())

    def close(self):
        """Teardown: stop the daemon; problems found (exit status, sanitizer and valgrind reports)."""
        problems = []
        if self.running:
            try:
                rc = self.stop()
                if rc != 0:
                    why = " (valgrind found errors)" if VALGRIND and rc == VALGRIND_EXIT else ""
                    problems.append(f"staged {self.name} exited {rc}{why} on SIGTERM; log:\n{self.log()[-3000:]}")
            except AssertionError as ex:
                problems.append(str(ex))
        elif self.proc is not None and self.runs and self.runs[-1][1] is None:
            self.runs[-1][1] = "died"
            problems.append(f"staged {self.name} died on its own with status {self.proc.returncode}; "
                            f"log:\n{self.log()[-3000:]}")
        for run, (log, how) in enumerate(self.runs):
            vg = valgrind_report(self.valgrind_log(run)) if VALGRIND else None
            if vg:
                problems.append(f"valgrind report in {self.valgrind_log(run)} (run ended: {how}):\n"
                                f"{vg[:20000]}")
            text = Path(log).read_text(errors="replace") if Path(log).exists() else ""
            # A run ended by kill -9 cannot have run its exit-time (leak)
            # checks, but anything it reported before the kill is real.
            rep = sanitizer_report(text)
            if rep:
                problems.append(f"sanitizer report in {log} (run ended: {how}): {rep}")
            if how != "term" and re.search(r"signal (15|2)\b", text):
                problems.append(f"{log}: staged was stopped by a signal this test did not send "
                                "(someone else on this machine?)")
        for vlog in sorted(self.base.glob("valgrind-stage.*.log")) if VALGRIND_CLIENT else []:
            vg = valgrind_report(vlog)
            if vg:
                problems.append(f"valgrind report of a client in {vlog}:\n{vg[:20000]}")
        shutil.rmtree(self.sock_dir, ignore_errors=True)
        return problems

    # ------------------------------------------------------------ the client

    def cmd(self, *args, json=False):
        vg = valgrind_cmd(self.base / "valgrind-stage.%p.log", shim=False) if VALGRIND_CLIENT else []
        return self.prefix + vg + [str(STAGE), "--socket", str(self.socket)] + (["--json"] if json else []) + \
            [str(a) for a in args]

    def run(self, *args, json=False, timeout=60, cwd=None, env=None):
        """Runs `stage --socket SOCK [--json] ARGS...`; CompletedProcess with str output."""
        cp = subprocess.run(self.cmd(*args, json=json), capture_output=True, timeout=timeout,
                            cwd=cwd or self.base, env=client_env(env),
                            encoding="utf-8", errors="surrogateescape")
        rep = sanitizer_report(cp.stderr)
        assert rep is None, f"sanitizer report from stage {args}: {rep}\n{cp.stderr}"
        return cp

    def popen(self, *args, json=False, out=None):
        """Starts the client in the background, output to files (a full pipe
        must never throttle the daemon)."""
        out = Path(out or self.base / f"client.{time.monotonic_ns()}")
        so, se = open(f"{out}.out", "wb"), open(f"{out}.err", "wb")
        try:
            p = subprocess.Popen(self.cmd(*args, json=json), stdin=subprocess.DEVNULL, stdout=so, stderr=se,
                                 cwd=self.base, env=client_env())
        finally:
            so.close()
            se.close()
        p.out_path, p.err_path = Path(f"{out}.out"), Path(f"{out}.err")
        return p

    def pull(self, src, *args, **kw):
        return self.run("pull", src, *args, **kw)

    def status(self, **kw):
        return self.run("status", **kw)

    def assert_serving(self):
        assert self.running, f"staged is not running; log:\n{self.log()[-3000:]}"
        cp = self.status(timeout=20)
        assert cp.returncode == 0, f"stage status exited {cp.returncode}: {cp.stderr}"

    def dest_of(self, src):
        """Default destination of SRC: stage_root + its path below its source root."""
        src = Path(src)
        for r in self.source_roots:
            if src == r or r in src.parents:
                return self.stage_root / src.relative_to(r)
        raise ValueError(src)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    rep = (yield).get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture
def make_daemon(request, tmp_path):
    made = []

    def make(base=None, start=True, **kw):
        d = Daemon(base or tmp_path / f"d{len(made)}", **kw)
        made.append(d)
        if start:
            d.start()
        return d

    yield make
    problems = []
    for d in made:
        problems += d.close()
    if problems:
        pytest.fail("daemon teardown:\n" + "\n".join(problems), pytrace=False)
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.passed:
        for d in made:            # thousands of files: gone now, not in pytest's next cleanup
            if tmp_path in d.base.parents:
                rm_tree(d.base)


@pytest.fixture
def daemon(make_daemon):
    return make_daemon()


def need_root(what):
    if not IS_ROOT:
        pytest.skip(f"needs root: {what}")


def mounted_tmpfs(mnt, size):
    """A tmpfs of size ("8m") at mnt, made here (root only), for a fixture to
    yield from; unmounted when the fixture ends."""
    need_root("mounting a size-limited tmpfs")
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mnt)],
                   check=True, timeout=30)
    yield mnt
    r = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        subprocess.run(["umount", "-l", str(mnt)], timeout=30)
        pytest.fail(f"umount {mnt}: {r.stderr.strip()}", pytrace=False)


@pytest.fixture
def small_tmpfs(tmp_path):
    """An 8 MiB tmpfs (root only); unmounted at teardown. Request it before
    make_daemon so the daemon stops first."""
    yield from mounted_tmpfs(tmp_path / "tmpfs", "8m")


@pytest.fixture
def big_tmpfs(tmp_path):
    """A 512 MiB tmpfs for a node's state and roots (root only), as
    small_tmpfs: request it before make_cluster."""
    yield from mounted_tmpfs(tmp_path / "mem", "512m")


@pytest.fixture
def fault_mount(tmp_path):
    """fault_mount(name="disk", direct_io=False) -> a mounted FaultMount
    (tests/tools/faultfs.py) under tmp_path; all unmounted at teardown. Request it before make_daemon
    or make_cluster so that the daemons stop first. Root only."""
    need_root("mounting a FUSE file system")
    from faultmount import FaultMount
    made = []

    def make(name="disk", direct_io=False):
        m = FaultMount(tmp_path, name, direct_io=direct_io)
        made.append(m)
        return m.mount()

    yield make
    for m in made:
        m.close()


@pytest.fixture
def nobody_base():
    """A base directory an unprivileged user can reach (pytest's tmp_path is
    under a 0700 root-owned directory), owned by nobody. Root only."""
    need_root("running the daemon as an unprivileged user")
    base = Path(tempfile.mkdtemp(prefix="stage-it-", dir="/tmp"))
    os.chmod(base, 0o755)
    os.chown(base, *NOBODY)
    yield base
    rm_tree(base)


@pytest.fixture
def make_cluster(make_daemon, tmp_path):
    """make_cluster(n, ...) -> [Daemon]: n daemons named n0..n{n-1} sharing a
    hosts file (tmp_path/cluster/hosts, nodes in index order) and a key file
    (0600), each with a fixed listen address.

    replicas, keep: the [cluster] keys (None: the daemon's default).
    transfer: [transfer] keys for every node; node_transfer {i: {...}} per node.
    domains: [domain or None] per node. addrs: ["HOST:PORT"] per node (default
    127.0.0.1 and a free port). netns: [NS or None] per node. keys: {i: key}
    gives node i a key file of its own with that key. doctor: [doctor] keys for
    every node; node_doctor {i: {...}} per node. exec_prefix {i: [argv]}: what
    node i's daemon runs under (e.g. faketime). disks {i: dir}: node i's
    state and roots in dir (Daemon's disk). source_roots: [dir] for every
    node (a shared mount). cluster_keys: more [cluster] keys for every node
    (fanout, say). start: start them all."""
    counter = itertools.count()

    def make(n=2, *, replicas=None, keep=None, transfer=None, node_transfer=None, domains=None,
             addrs=None, netns=None, keys=None, doctor=None, node_doctor=None, exec_prefix=None,
             disks=None, source_roots=None, cluster_keys=None, start=True):
        cdir = tmp_path / f"cluster{next(counter)}"
        cdir.mkdir()
        key = write_key(cdir / "cluster.key")
        addrs = addrs or [f"127.0.0.1:{free_port()}" for _ in range(n)]
        names = [f"n{i}" for i in range(n)]
        hosts = write_hosts(cdir / "hosts", [(names[i], addrs[i], (domains or [None] * n)[i]) for i in range(n)])
        nodes = []
        for i in range(n):
            kf = key
            if keys and i in keys:
                kf = write_key(cdir / f"{names[i]}.key", keys[i])
            cl = {"hosts": hosts, "key_file": kf}
            if replicas is not None:
                cl["replicas"] = replicas
            if keep is not None:
                cl["keep"] = keep
            cl.update(cluster_keys or {})
            tr = {**(transfer or {}), **((node_transfer or {}).get(i, {}))}
            doc = {**(doctor or {}), **((node_doctor or {}).get(i, {}))}
            nodes.append(make_daemon(base=cdir / names[i], start=False, name=names[i], listen=addrs[i],
                                     cluster=cl, transfer=tr, netns=(netns or [None] * n)[i],
                                     doctor=doc or None, exec_prefix=(exec_prefix or {}).get(i),
                                     disk=(disks or {}).get(i), source_roots=source_roots))
        if start:
            for d in nodes:
                d.start()
        return nodes

    return make
