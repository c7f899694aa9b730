"""Checkpoint replication between real daemons: `stage commit`, `stage ls`,
the watcher, resume after kill -9, authentication, retention, and a real
network path through two network namespaces joined by a veth pair.

Layout: the origin's checkpoint is ckpt_root/JOB/STEP (Daemon: base/ckpt);
its copy on a partner lands at replica_root/ORIGIN/JOB/STEP (base/replicas)
with DIR/.stage/manifest identical to the origin's, and is built under
replica_root/.incoming/... so that nothing half-received ever carries the
final name. Clusters come from the make_cluster fixture (conftest.py):
nodes n0..nN-1, one hosts file, one key, fixed ports.
"""
import itertools
import json
import os
import re
import signal
import stat
import subprocess
import threading
import time

import pytest

from conftest import need_root
from helpers import (CHUNK, D, F, L, assert_landed_match_source,
                     check_manifest_against, landed_files, make_tree, manifest_path, run_cmd,
                     wait_for, walk, write_key, ckpt, replica, assert_replica_of, commit_wait,
                     bytes_sent_to, staged_refuses, ls_entries, ls_find, after_kill9)

MiB = 1 << 20


# ---------------------------------------------------------------- helpers

def cluster(make_cluster, n=2, transfer=None, **kw):
    """make_cluster with the watcher off unless asked: a commit happens only
    when the test says so."""
    return make_cluster(n, transfer={"watch": "off", **(transfer or {})}, **kw)


def incoming(holder, origin, job="job1", step="step-100"):
    return holder.base / "replicas" / ".incoming" / origin.name / job / step


def rich_tree(step, seed=1):
    """Every kind of entry a checkpoint may hold: multi-chunk and small files,
    an empty file, odd modes, a subdirectory, symlinks (relative, dangling)."""
    return make_tree(step, [
        F("model.pt", size=5 * CHUNK + 123),
        F("optim/shard-0.bin", size=CHUNK * 2),
        F("optim/shard-1.bin", size=777, mode=0o600),
        F("empty", data=b""),
        F("run.sh", data=b"#!/bin/sh\necho hi\n", mode=0o755),
        D("sub/deeper", mode=0o750),
        F("sub/deeper/x.json", data=b'{"a": 1}\n', mode=0o640),
        L("latest.pt", "model.pt"),
        L("dangling", "no/such/file"),
    ], seed=seed)


def wait_replica(holder, origin, job="job1", step="step-100", timeout=30):
    path = replica(holder, origin, job, step)
    wait_for(lambda: manifest_path(path).exists(), timeout,
             f"the replica {path} to appear; origin log:\n{origin.log()[-2000:]}", interval=0.05)
    return path


# ---------------------------------------------------------------- 1, 2: commit

def test_commit_wait_replica_identical(make_cluster):
    """commit --wait: the partner's copy is the original byte for byte with
    an identical manifest, verify --deep passes on it, ls on both nodes
    knows it (origin: committed, copy confirmed; holder: replica)."""
    n0, n1 = cluster(make_cluster, 2)
    step = rich_tree(ckpt(n0))
    cp = commit_wait(n0, step)
    assert "job1/step-100" in cp.stdout + cp.stderr
    check_manifest_against(step, step)
    rep = replica(n1, n0)
    assert_replica_of(step, rep)
    # the .stage of the replica holds no leftovers of the transfer
    assert sorted(os.listdir(rep / ".stage")) == ["manifest"], os.listdir(rep / ".stage")
    v = n1.run("verify", rep, "--deep")
    assert v.returncode == 0, f"verify --deep of the replica: {v.stdout}{v.stderr}"
    # nothing left in flight on the holder
    assert not landed_files(n1.base / "replicas" / ".incoming"), "files left under .incoming"

    o = ls_find(n0, "job1/step-100", origin="n0")
    assert o, f"origin ls: {ls_entries(n0)}"
    assert o["state"] == "committed" and o["copies"] == "n1:confirmed", o
    assert o["files"] == "6", o                 # regular files, empty one included
    assert int(o["bytes"]) == sum(st.st_size for r, st in walk(step).items() if stat.S_ISREG(st.st_mode))
    assert re.fullmatch(r"[0-9a-f]{32}", o["root"]), o
    h = ls_find(n1, "job1/step-100", origin="n0")
    assert h and h["state"] == "replica" and h["holder"] == "n1", f"holder ls: {ls_entries(n1)}"
    # --json: one object per line
    js = n0.run("ls", json=True)
    assert js.returncode == 0
    objs = [json.loads(l) for l in js.stdout.splitlines() if l.strip()]
    assert any("job1/step-100" in json.dumps(o) for o in objs), js.stdout


def test_commit_nowait_returns_at_once(make_cluster):
    """commit without --wait returns 0 at once (the copy is slowed to ~3 s by
    the sender's rate) and the replica appears later."""
    n0, n1 = cluster(make_cluster, 2, node_transfer={0: {"rate": "8MiB"}})
    step = make_tree(ckpt(n0), [F(f"w{i}.bin", size=8 * MiB) for i in range(3)] + [F("meta.json", size=100)])
    t0 = time.monotonic()
    cp = n0.run("commit", step, timeout=30)
    took = time.monotonic() - t0
    assert cp.returncode == 0, cp.stderr
    assert re.search(r"committed job1/step-100: manifest and 1 copy queued", cp.stdout + cp.stderr), \
        cp.stdout + cp.stderr
    assert took < 1.5, f"commit without --wait took {took:.2f} s"
    assert not replica(n1, n0).exists(), "replica already there: the commit waited?"
    rep = wait_replica(n1, n0, timeout=30)
    wait_for(lambda: ls_find(n0, "job1/step-100", copies="n1:confirmed"), 10, "copy confirmed in ls")
    assert_replica_of(step, rep)


def test_commit_fails_if_file_changes_while_hashed(make_cluster):
    """A file that keeps changing while the manifest is computed fails the
    commit: --wait exits 1, ls says failed, and nothing reaches the partner."""
    n0, n1 = cluster(make_cluster, 2)
    step = make_tree(ckpt(n0), [F("a.bin", size=64 * MiB), F("b.bin", size=1000)])
    stop = threading.Event()

    def scribble():
        with open(step / "a.bin", "r+b") as f:
            k = 0
            while not stop.is_set():
                f.seek((k * 4099) % (64 * MiB))
                f.write(os.urandom(64))
                f.flush()
                k += 1
                time.sleep(0.001)

    t = threading.Thread(target=scribble)
    t.start()
    try:
        cp = n0.run("commit", step, "--wait", timeout=60)
    finally:
        stop.set()
        t.join()
    assert cp.returncode == 1, f"exit {cp.returncode}\n{cp.stdout}{cp.stderr}"
    assert "a.bin" in cp.stdout + cp.stderr, cp.stderr
    f = ls_find(n0, "job1/step-100")
    assert f and f["state"] == "failed", ls_entries(n0)
    time.sleep(0.5)
    assert not replica(n1, n0).exists()
    # a later commit of the now quiet step succeeds
    commit_wait(n0, step)
    assert_replica_of(step, replica(n1, n0))


# ---------------------------------------------------------------- 3: bad input

def test_commit_bad_paths(make_cluster, tmp_path):
    """A commit of anything but ckpt_root/JOB/STEP is a usage error (exit 2)
    naming the path; the daemon keeps serving and a good commit still works."""
    n0, n1 = cluster(make_cluster, 2)
    outside = tmp_path / "elsewhere" / "job1" / "step-1"
    make_tree(outside, [F("a", size=10)])
    job_only = n0.base / "ckpt" / "job1"
    make_tree(job_only / "step-1", [F("a", size=10)])
    too_deep = job_only / "step-1" / "sub"
    too_deep.mkdir()
    dot = n0.base / "ckpt" / "job1" / ".hidden"
    dot.mkdir()
    dash = n0.base / "ckpt" / "job1" / "-x"
    dash.mkdir()
    space = n0.base / "ckpt" / "job1" / "a b"
    space.mkdir()
    link = n0.base / "ckpt" / "job1" / "step-link"      # a step that is a symlink to elsewhere
    os.symlink(outside, link)
    missing = n0.base / "ckpt" / "job1" / "step-none"
    for bad in (outside, job_only, too_deep, dot, dash, space, link, missing, n0.base / "ckpt"):
        cp = n0.run("commit", bad, "--wait", timeout=20)
        assert cp.returncode == 2, f"commit {bad}: exit {cp.returncode}\n{cp.stdout}{cp.stderr}"
        assert bad.name in cp.stderr or os.path.realpath(bad) in cp.stderr, \
            f"message does not name {bad}: {cp.stderr!r}"
    assert not manifest_path(outside).exists(), "a manifest was written outside ckpt_root"
    assert not (outside / ".stage").exists()
    n0.assert_serving()
    assert not (n1.base / "replicas" / "n0").exists(), "a bad commit reached the partner"
    commit_wait(n0, job_only / "step-1")
    assert_replica_of(job_only / "step-1", replica(n1, n0, "job1", "step-1"))


# ---------------------------------------------------------------- 4: the watcher

@pytest.mark.parametrize("kind", ["dcp", "hf", "deepspeed", "custom"])
def test_watch_marker_commits(make_cluster, kind):
    """watch = on: a step gets its data files, then its completion marker
    (PyTorch DCP .metadata written last; HF trainer_state.json; DeepSpeed's
    JOB/latest naming the step; the configured marker) and is replicated
    with no commit call, well before settle (60 s) could have done it."""
    n0, n1 = cluster(make_cluster, 2, transfer={"watch": "on", "settle": 60, "marker": "DONE"})
    time.sleep(0.3)                          # the watcher is set up
    step = ckpt(n0)
    step.mkdir(parents=True)
    for i in range(3):
        (step / f"__{i}_0.distcp").write_bytes(os.urandom(300_000))
        time.sleep(0.1)
    if kind == "dcp":
        # quiet data files alone are not a finished step (settle is 60 s)
        time.sleep(3)
        assert ls_find(n0, "job1/step-100") is None, "committed before its marker"
        (step / ".metadata").write_bytes(os.urandom(5000))
    elif kind == "hf":
        (step / "trainer_state.json").write_text('{"global_step": 100}\n')
    elif kind == "custom":
        (step / "DONE").write_text("")
    else:
        (step.parent / "latest").write_text("step-100\n")
    rep = wait_replica(n1, n0, timeout=20)
    wait_for(lambda: ls_find(n0, "job1/step-100", copies="n1:confirmed"), 10, "copy confirmed in ls")
    assert_replica_of(step, rep)
    assert (rep / "__2_0.distcp").exists()
    # the job dir's `latest` is not a step: nothing committed for it
    assert [n for n, _ in ls_entries(n0)] == ["job1/step-100"], ls_entries(n0)


def test_watch_settle_without_marker(make_cluster):
    """watch = on, settle = 1: a step with no marker is committed once it has
    had no writes for a second, and not while it is still being written."""
    n0, n1 = cluster(make_cluster, 2, transfer={"watch": "on", "settle": 1})
    time.sleep(0.3)
    step = ckpt(n0, step="step-7")
    step.mkdir(parents=True)
    # keep writing for ~3 s, a file every 0.2 s: settle must not fire meanwhile
    t_end = time.monotonic() + 3
    i = 0
    while time.monotonic() < t_end:
        (step / f"part-{i}.bin").write_bytes(os.urandom(50_000))
        t_last = time.monotonic()
        i += 1
        time.sleep(0.2)
        assert ls_find(n0, "job1/step-7") is None, "committed while still being written"
    wait_for(lambda: ls_find(n0, "job1/step-7"), 20, "the settled step to be committed", interval=0.05)
    assert time.monotonic() - t_last >= 0.9, "committed before `settle` seconds without writes"
    rep = wait_replica(n1, n0, step="step-7", timeout=20)
    assert_replica_of(step, rep)
    assert len(list(rep.glob("part-*.bin"))) == i


# ---------------------------------------------------------------- 5: kill -9

def big_ckpt(d, nfiles=6, size=48 * MiB, step="step-100"):
    return make_tree(ckpt(d, step=step), [F(f"shard-{i}.bin", size=size) for i in range(nfiles)]
                     + [F("meta/index.json", size=4000), F("empty", data=b"")])


@pytest.mark.parametrize("streams", [1, 3])
def test_kill9_receiver_resumes(make_cluster, streams):
    """kill -9 of the receiver mid-transfer (288 MiB at 60 MiB/s): nothing
    ever appears under the final replica name before the copy is complete;
    after a restart the sender reconnects, the copy resumes from the
    journal (what was durable is not sent again) and commit --wait
    succeeds with an exact replica. On one connection, and on three
    streams (docs/PROTOCOL.md, "Streams")."""
    n0, n1 = cluster(make_cluster, 2, node_transfer={0: {"rate": "60MiB", "streams": streams}})
    step = big_ckpt(n0)
    total = sum(st.st_size for st in landed_files(step).values())
    final, inc = replica(n1, n0), incoming(n1, n0)
    p = n0.popen("commit", step, "--wait")

    def received():
        return sum(st.st_size for st in landed_files(inc).values())

    def poll_until(pred, timeout, what):
        deadline = time.monotonic() + timeout
        while not pred():
            assert not final.exists(), f"{final} exists before the copy is complete"
            assert p.poll() is None, f"commit ended early: {p.returncode} {p.err_path.read_text()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)

    poll_until(lambda: received() >= 150 * MiB, 30, "150 MiB received")
    n1.kill9()
    got_before = received()
    sent_before = bytes_sent_to(n0, n1)
    time.sleep(1)                              # see after_kill9
    assert not final.exists()
    n1.start()
    deadline = time.monotonic() + 60
    while p.poll() is None:
        if final.exists():                     # published (a rename): complete at first sight
            assert manifest_path(final).read_bytes() == manifest_path(step).read_bytes(), \
                "published without the origin's manifest"
            assert_landed_match_source(step, final)
            break
        assert time.monotonic() < deadline, "commit --wait did not finish after the restart"
        time.sleep(0.02)
    p.wait(60)
    err = p.err_path.read_text()
    assert p.returncode == 0, f"commit --wait: {p.returncode}\n{err}\n{n0.log()[-3000:]}"
    assert "retrying" in err, f"no note about the partner being down: {err!r}"
    assert_replica_of(step, final)
    assert not landed_files(n1.base / "replicas" / ".incoming"), "leftovers under .incoming"
    resent = bytes_sent_to(n0, n1) - total
    assert resent < got_before - 48 * MiB, \
        (f"no resume: {resent} bytes sent twice, receiver had {got_before} (sender {sent_before}) "
         f"before kill -9")
    assert "resuming" in n1.log(), n1.log()
    v = n1.run("verify", final, "--deep")
    assert v.returncode == 0, v.stdout + v.stderr


@pytest.mark.parametrize("streams", [1, 3])
def test_kill9_origin_resumes_from_records(make_cluster, streams):
    """kill -9 of the origin mid-copy (commit without --wait): restarted, it
    finds the unconfirmed copy in state_dir/commits/ and completes it, on
    one connection or three streams."""
    n0, n1 = cluster(make_cluster, 2, node_transfer={0: {"rate": "40MiB", "streams": streams}})
    step = big_ckpt(n0, nfiles=4, size=32 * MiB)
    cp = n0.run("commit", step)
    assert cp.returncode == 0, cp.stderr
    inc = incoming(n1, n0)
    wait_for(lambda: sum(st.st_size for st in landed_files(inc).values()) >= 40 * MiB, 30,
             "40 MiB received", interval=0.02)
    n0.kill9()
    assert not replica(n1, n0).exists()
    assert any((n0.state_dir / "commits").iterdir()), "no commit records in state_dir/commits"
    after_kill9()
    n0.start()
    wait_for(lambda: ls_find(n0, "job1/step-100", copies="n1:confirmed"), 45,
             f"the copy to be confirmed after the origin's restart; log:\n{n0.log()[-2000:]}", interval=0.2)
    assert_replica_of(step, replica(n1, n0))
    assert "resuming" in n1.log(), f"the copy started over:\n{n1.log()}"


def test_restart_right_after_kill9(make_cluster):
    """A daemon restarted at once after kill -9 (as a supervisor would) starts."""
    n0, n1 = cluster(make_cluster, 2)
    for attempt in range(5):
        n0.kill9()
        try:
            n0.start()          # may be fooled by the dying daemon's socket
            time.sleep(0.3)
        except AssertionError as ex:
            pytest.fail(f"attempt {attempt}: {ex}")
        if not n0.running:
            n0.runs[-1][1] = "died"             # seen here: not a teardown problem
            pytest.fail(f"attempt {attempt}: staged exited {n0.proc.returncode}: {n0.log().strip()}")
        n0.assert_serving()


# ---------------------------------------------------------------- 6: authentication

def test_wrong_key_refused(make_cluster):
    """A node with another cluster key (n2, whose partner is n0) cannot write
    a thing on n0: n0 refuses it and says so, and keeps serving; the nodes
    with the right key still replicate."""
    n0, n1, n2 = cluster(make_cluster, 3, keys={2: "ab" * 32})
    step = rich_tree(ckpt(n2))
    cp = n2.run("commit", step)
    assert cp.returncode == 0, cp.stderr
    wait_for(lambda: re.search(r"refused|authentication failed", n0.log()), 20,
             f"n0 to log the refusal; n0 log:\n{n0.log()}\nn2 log:\n{n2.log()}", interval=0.1)
    time.sleep(1.5)                           # give the sender time to retry
    rr = n0.base / "replicas"
    held = [r for r in walk(rr, skip_top_stage=False) if "n2" in r.split("/")] if rr.exists() else []
    assert not held, f"something of n2 under n0's replica_root: {held}"
    assert not landed_files(rr), f"files under n0's replica_root: {list(landed_files(rr))}"
    c = ls_find(n2, "job1/step-100")
    assert c and c.get("copies") != "n0:confirmed", c
    st = n2.status().stdout
    assert re.search(r"^peer:\s+n0 .*down", st, re.M), st
    n0.assert_serving()
    # the cluster proper is unharmed: n0 -> n1 works
    s0 = rich_tree(ckpt(n0), seed=5)
    commit_wait(n0, s0)
    assert_replica_of(s0, replica(n1, n0))


# ---------------------------------------------------------------- 7: retention

def test_retention_keep_natural_order(make_cluster):
    """keep = 2: after step-1, step-2, step-10 the holder keeps step-2 and
    step-10 (natural order: step-10 is the newest); then step-9 pushes out
    step-2 (lexical order would drop step-10 instead)."""
    n0, n1 = cluster(make_cluster, 2, keep=2)
    steps = {}
    for s in ("step-1", "step-2", "step-10"):
        steps[s] = make_tree(ckpt(n0, step=s), [F("w.bin", size=3000 + len(s)), F("m.json", data=s.encode())])
        commit_wait(n0, steps[s])
    held = sorted(os.listdir(n1.base / "replicas" / "n0" / "job1"))
    assert held == ["step-10", "step-2"], held
    steps["step-9"] = make_tree(ckpt(n0, step="step-9"), [F("w.bin", size=3009)])
    commit_wait(n0, steps["step-9"])
    held = sorted(os.listdir(n1.base / "replicas" / "n0" / "job1"))
    assert held == ["step-10", "step-9"], held
    for s in ("step-9", "step-10"):
        assert_replica_of(steps[s], replica(n1, n0, step=s))
    names = sorted(n for n, f in ls_entries(n1) if f.get("state") == "replica")
    assert names == ["job1/step-10", "job1/step-9"], ls_entries(n1)
    # another job is counted on its own
    other = make_tree(ckpt(n0, job="job2", step="step-1"), [F("w.bin", size=10)])
    commit_wait(n0, other)
    assert sorted(os.listdir(n1.base / "replicas" / "n0" / "job1")) == ["step-10", "step-9"]
    assert_replica_of(other, replica(n1, n0, "job2", "step-1"))


# ---------------------------------------------------------------- 9: commit again

def test_recommit_unchanged_and_changed(make_cluster):
    """A second commit of an unchanged step is confirmed again without
    sending the data again; after a file is rewritten, a commit replaces the
    replica with the new content (no trace of the old one)."""
    n0, n1 = cluster(make_cluster, 2)
    step = make_tree(ckpt(n0), [F("a.bin", size=3 * MiB), F("b.bin", size=100_000), F("c.txt", data=b"old\n")])
    commit_wait(n0, step)
    rep = replica(n1, n0)
    assert_replica_of(step, rep)
    sent1 = bytes_sent_to(n0, n1)
    ino = os.stat(rep / "a.bin").st_ino

    commit_wait(n0, step)
    assert ls_find(n0, "job1/step-100", copies="n1:confirmed")
    assert bytes_sent_to(n0, n1) - sent1 < 1 * MiB, "the unchanged checkpoint was sent again"
    assert os.stat(rep / "a.bin").st_ino == ino, "the unchanged replica was rewritten"
    assert_replica_of(step, rep)

    old_root = ls_find(n0, "job1/step-100")["root"]
    (step / "c.txt").write_bytes(b"new content, longer\n")
    with open(step / "a.bin", "r+b") as f:
        f.seek(2 * MiB)
        f.write(b"\xff" * 1000)
    os.unlink(step / "b.bin")
    (step / "d.bin").write_bytes(os.urandom(5000))
    commit_wait(n0, step)
    assert ls_find(n0, "job1/step-100")["root"] != old_root
    assert_replica_of(step, rep)
    assert not (rep / "b.bin").exists()
    assert (rep / "c.txt").read_bytes() == b"new content, longer\n"
    v = n1.run("verify", rep, "--deep")
    assert v.returncode == 0, v.stdout + v.stderr
    assert sorted(os.listdir(n1.base / "replicas" / "n0" / "job1")) == ["step-100"]


# ---------------------------------------------------------------- placement, config

def test_two_replicas(make_cluster):
    """replicas = 2 on three nodes: n0's checkpoint lands on n1 and n2, both
    exact, and ls lists both copies confirmed."""
    n0, n1, n2 = cluster(make_cluster, 3, replicas=2)
    step = rich_tree(ckpt(n0))
    commit_wait(n0, step)
    copies = ls_find(n0, "job1/step-100")["copies"]
    assert sorted(copies.split(",")) == ["n1:confirmed", "n2:confirmed"], copies
    for h in (n1, n2):
        assert_replica_of(step, replica(h, n0))
        assert ls_find(h, "job1/step-100", origin="n0", state="replica", holder=h.name), ls_entries(h)


def test_sigterm_with_idle_inbound_peer(make_cluster):
    """A node that has received a copy stops promptly on SIGTERM even though
    its partner (still running) keeps the connection open."""
    n0, n1 = cluster(make_cluster, 2)
    commit_wait(n0, rich_tree(ckpt(n0)))
    n1.proc.send_signal(signal.SIGTERM)
    try:
        rc = n1.proc.wait(10)
    except subprocess.TimeoutExpired:
        n1.proc.kill()                          # the test sent the SIGTERM: not a stranger's
        n1.proc.wait(10)
        rc = None
    n1.runs[-1][1] = "term"
    assert rc == 0, f"n1 still running 10 s after SIGTERM (exit {rc}); log:\n{n1.log()[-2000:]}"


def test_partners_skip_same_domain(make_cluster):
    """Node i's copy goes to the next node in hosts order outside its domain:
    with n0, n1 in rack a and n2 in rack b, n0's copy goes to n2, not n1."""
    n0, n1, n2 = cluster(make_cluster, 3, domains=["a", "a", "b"])
    step = rich_tree(ckpt(n0))
    commit_wait(n0, step)
    assert ls_find(n0, "job1/step-100")["copies"] == "n2:confirmed"
    assert_replica_of(step, replica(n2, n0))
    assert not (n1.base / "replicas" / "n0").exists()


def test_cluster_config_errors(make_cluster, make_daemon, tmp_path):
    """A node not in an existing hosts file, or a key file readable by
    others, keeps the daemon from starting (exit 2, saying why)."""
    n0, n1 = cluster(make_cluster, 2, start=False)

    stranger = make_daemon(base=tmp_path / "stranger", start=False, name="nX",
                           cluster={"hosts": n0.cluster["hosts"], "key_file": n0.cluster["key_file"]})
    out = staged_refuses(stranger, "a name missing from the hosts file")
    assert str(n0.cluster["hosts"]) in out and "nX" in out, out
    loose = write_key(tmp_path / "loose.key")
    os.chmod(loose, 0o640)
    n0.cluster["key_file"] = loose
    n0.write_config()
    out = staged_refuses(n0, "a key file readable by its group")
    assert str(loose) in out, out
    short = write_key(tmp_path / "short.key", "0123456789abcdef")
    n0.cluster["key_file"] = short
    n0.write_config()
    out = staged_refuses(n0, "a 16-byte key")
    assert str(short) in out, out


# ---------------------------------------------------------------- 8: network namespaces

_ns_ids = itertools.count()


@pytest.fixture
def netns_pair():
    """Two network namespaces joined by a veth pair: returns
    (ns_a, ns_b, dev_a, dev_b, addr_a, addr_b). Removed at teardown, even
    after a failure. Request it before make_cluster (daemons stop first)."""
    need_root("network namespaces")
    if run_cmd("ip", "netns", "list", check=False).returncode != 0:
        pytest.skip("`ip netns` is not available")
    tag = f"{os.getpid() % 10000}{next(_ns_ids)}"
    na, nb = f"stgit-a{tag}", f"stgit-b{tag}"
    da, db = f"sta{tag}", f"stb{tag}"
    aa, ab = "10.231.7.1", "10.231.7.2"
    made = []
    try:
        for ns in (na, nb):
            r = run_cmd("ip", "netns", "add", ns, check=False)
            if r.returncode != 0:
                pytest.skip(f"cannot create a network namespace: {r.stderr.strip()}")
            made.append(ns)
        run_cmd("ip", "link", "add", da, "netns", na, "type", "veth", "peer", "name", db, "netns", nb)
        for ns, dev, addr in ((na, da, aa), (nb, db, ab)):
            run_cmd("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            run_cmd("ip", "-n", ns, "link", "set", "lo", "up")
            run_cmd("ip", "-n", ns, "link", "set", dev, "up")
        wait_for(lambda: all(" UP " in run_cmd("ip", "-n", ns, "-br", "link", "show", "dev", dev).stdout
                             for ns, dev in ((na, da), (nb, db))), 10, "the veth link to come up", 0.1)
        yield na, nb, da, db, aa, ab
    finally:
        for ns in made:
            run_cmd("ip", "netns", "del", ns, check=False)


@pytest.mark.timeout(120)
def test_netns_veth_commit_and_link_down(netns_pair, make_cluster):
    """Two daemons in two network namespaces over a veth pair: commit --wait
    works; then with the link taken down for 3 s in the middle of a
    rate-limited transfer, the copy still completes and verifies."""
    na, nb, da, db, aa, ab = netns_pair
    n0, n1 = cluster(make_cluster, 2, addrs=[f"{aa}:7431", f"{ab}:7431"], netns=[na, nb],
                     node_transfer={0: {"rate": "20MiB"}})
    small = rich_tree(ckpt(n0, step="step-1"))
    commit_wait(n0, small)
    assert_replica_of(small, replica(n1, n0, step="step-1"))
    st = n0.status().stdout
    assert re.search(rf"^peer:\s+n1 {re.escape(ab)}:7431: partner, up", st, re.M), st

    big = big_ckpt(n0, nfiles=4, size=20 * MiB, step="step-2")
    p = n0.popen("commit", big, "--wait")
    inc = incoming(n1, n0, step="step-2")
    wait_for(lambda: sum(st.st_size for st in landed_files(inc).values()) >= 20 * MiB, 30,
             "20 MiB received", interval=0.02)
    run_cmd("ip", "-n", na, "link", "set", da, "down")
    try:
        time.sleep(3)
        assert p.poll() is None, "commit --wait ended while the link was down"
        assert not replica(n1, n0, step="step-2").exists()
    finally:
        run_cmd("ip", "-n", na, "link", "set", da, "up")
    p.wait(90)
    assert p.returncode == 0, f"commit --wait: {p.returncode}\n{p.err_path.read_text()}\n{n0.log()[-3000:]}"
    rep = replica(n1, n0, step="step-2")
    assert_replica_of(big, rep)
    v = n1.run("verify", rep, "--deep")
    assert v.returncode == 0, v.stdout + v.stderr



def test_full_disk_on_holder(make_cluster):
    """A checkpoint bigger than the holder's free space (replica_root on an
    8 MiB tmpfs): commit --wait exits 1 naming the cause, the copy is
    failed in ls, nothing appears under the final name. A small checkpoint
    committed afterwards should still get through."""
    need_root("mounting a size-limited tmpfs")
    n0, n1 = cluster(make_cluster, 2, start=False)
    rr = n1.base / "replicas"
    run_cmd("mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", "tmpfs", rr)
    try:
        n0.start()
        n1.start()
        big = make_tree(ckpt(n0), [F(f"f{i}", size=3 * MiB) for i in range(4)])
        cp = n0.run("commit", big, "--wait", timeout=60)
        assert cp.returncode == 1, f"exit {cp.returncode}: {cp.stdout}{cp.stderr}"
        assert "No space left on device" in cp.stderr, cp.stderr
        assert ls_find(n0, "job1/step-100", copies="n1:failed"), ls_entries(n0)
        assert not replica(n1, n0).exists()
        n1.assert_serving()
        small = make_tree(ckpt(n0, step="step-2"), [F("a", size=1000)])
        cp = n0.run("commit", small, "--wait", timeout=60)
        assert cp.returncode == 0, f"a later, small copy: {cp.stderr.strip()}"
        assert_replica_of(small, replica(n1, n0, step="step-2"))
    finally:
        if n1.running:
            n1.stop()
        run_cmd("umount", rr, check=False)


IOPRIO_LOW = (2 << 13) | 7          # best-effort class, level 7 (ioprio ABI)


def thread_priorities(pid):
    """{tid: (nice, ioprio)} of every thread of pid; ioprio None where the
    syscall number of this machine is not known here."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": 252, "aarch64": 31}.get(os.uname().machine)
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/stat") as f:
            s = f.read()
        nice = int(s[s.rindex(")") + 2:].split()[16])      # field 19
        io = libc.syscall(nr, 1, int(t)) if nr else None   # IOPRIO_WHO_PROCESS
        out[int(t)] = (nice, io)
    return out


@pytest.mark.parametrize("priority", ["low", "normal"])
def test_replication_threads_yield_to_the_trainer(make_cluster, priority):
    """priority = low (the default): the threads that hash commits, send and
    receive replicas run at nice 10 and the lowest best-effort I/O level, so
    a trainer's own saves come first; the main thread keeps its priority.
    priority = normal lowers nothing."""
    n0, n1 = cluster(make_cluster, 2, transfer={"priority": priority})
    commit_wait(n0, rich_tree(ckpt(n0)))         # the sender is up; n1 has a receiver
    for node in (n0, n1):
        pr = thread_priorities(node.proc.pid)
        low = [t for t, (nice, io) in pr.items() if nice == 10]
        assert pr[node.proc.pid][0] == 0, pr          # the main thread
        if priority == "low":
            # n0: committer and sender; n1: its committer and the receiver
            assert len(low) >= 2, pr
            assert all(pr[t][1] in (None, IOPRIO_LOW) for t in low), pr
        else:
            assert not low and all(io != IOPRIO_LOW for _, io in pr.values()), pr


def test_recommit_on_a_replica_root_without_rename_flags(fault_mount, make_cluster):
    """A step committed again, received on a replica_root that refuses
    renameat2's flags (faultfs, as NFS): the new copy replaces the old by
    three renames through .STEP.x, and one left there by a crash between
    them (planted here) is removed first; before, it made every later
    publication of the step fail with "Directory not empty"."""
    m = fault_mount()
    n0, n1 = cluster(make_cluster, 2, disks={1: m.mnt}, exec_prefix={1: m.env_prefix()},
                     start=False)
    n0.start()
    n1.start()
    s = rich_tree(ckpt(n0))
    commit_wait(n0, s)
    assert_replica_of(s, replica(n1, n0))
    inc = n1.replica_root / ".incoming" / "n0" / "job1"
    (inc / ".step-100.x" / "stale").mkdir(parents=True)
    (inc / ".step-100.x" / "stale" / "f").write_bytes(b"from an exchange cut short")
    (s / "model.pt").write_bytes(os.urandom(CHUNK + 7))
    commit_wait(n0, s)
    assert_replica_of(s, replica(n1, n0))
    assert not (inc / ".step-100.x").exists() and not (inc / "step-100").exists(), \
        sorted(os.listdir(inc))
