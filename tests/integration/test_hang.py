"""A shared mount that stops answering, as an NFS server gone away does
(tests/tools/faultfs.py's `hang`: every call on it blocks until released),
as the faults-below-the-file-system issue asks:

- a pull on it is cancelled by Ctrl-C within 3 s, whether it was copying
  or waiting to start;
- `stage status`, `ls` and `commit` keep answering within 3 s, and status
  names the mount that does not answer and the pull stuck on it;
- pulls asked again and again while it hangs are refused, naming the
  mount, and cost no thread or fd each: the daemon's counts stay where the
  first stuck pull left them;
- a pull from another file system goes on;
- once the mount answers again, the stuck pull ends and a rerun completes.
"""
import os
import signal
import subprocess
import time

import pytest

from helpers import (F, assert_tree_equal, ckpt, landed_files, make_tree, wait_for)
from test_powercut import dataset

MiB = 1 << 20
ANSWER_S = 3.0          # what the issue allows a command to take


def counts(pid):
    """(threads, fds) of the process."""
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


def timed(d, *args, timeout=20):
    t0 = time.monotonic()
    cp = d.run(*args, timeout=timeout)
    return cp, time.monotonic() - t0


def interrupt(p, what):
    """Ctrl-C of a client: it must end within ANSWER_S."""
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    try:
        rc = p.wait(ANSWER_S + 2)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what}: Ctrl-C did not end the command")
    took = time.monotonic() - t0
    assert took < ANSWER_S, f"{what}: Ctrl-C took {took:.1f} s"
    assert rc != 0, f"{what}: exit 0 after Ctrl-C"


def jobs(d):
    return [l for l in d.status(timeout=20).stdout.splitlines() if l.startswith("job:")]


@pytest.mark.timeout(180)
def test_hanging_shared_mount(fault_mount, make_daemon, tmp_path):
    m = fault_mount("shared")
    local = tmp_path / "local"
    d = make_daemon(source_roots=[m.mnt / "src", local])
    src = dataset(d.src_root / "ds", 3)
    other = make_tree(local / "other", [F(f"f{i}", size=100000 + i) for i in range(20)])
    dest = d.dest_of(src)
    pid = d.proc.pid

    # 1. A pull copying when the mount stops answering.
    m.cmd("rate", 8 * MiB)
    a = d.popen("pull", src)
    wait_for(lambda: len(landed_files(dest)) >= 1, 30, "the pull to land a file")
    m.cmd("hang")
    try:
        hung(d, m, a, src, other, dest, pid)
    finally:
        # Released whatever happened: a process with a call in a FUSE
        # request that was sent cannot even be reaped until it is answered.
        m.cmd("clear")


def hung(d, m, a, src, other, dest, pid):
    wait_for(lambda: m.stats()["blocked"] >= 1, 10, "a call to block on the mount")
    interrupt(a, "the pull copying from the hung mount")

    # 2. The rest of the daemon answers.
    for args in (["status"], ["ls"]):
        cp, took = timed(d, *args)
        assert cp.returncode == 0 and took < ANSWER_S, f"stage {args[0]}: {took:.1f} s: {cp.stderr}"
    step = make_tree(ckpt(d), [F("a.bin", size=200000)])
    cp, took = timed(d, "commit", step, "--wait")
    assert cp.returncode == 0 and took < ANSWER_S, f"stage commit: {took:.1f} s: {cp.stderr}"

    # 3. A pull waiting for the mount to answer is cancelled too, and its
    # thread does not stay behind.
    b = d.popen("pull", src)
    time.sleep(1)
    interrupt(b, "the pull waiting for the hung mount")
    wait_for(lambda: len(jobs(d)) == 1, 3, "the cancelled pull's job to end")
    t_probe = time.monotonic() - 1

    # 4. Asked again and again, pulls are refused, naming the mount; the
    # first once the probe has waited 5 s, the rest at once.
    time.sleep(max(0.0, t_probe + 5.5 - time.monotonic()))
    stuck = counts(pid)
    print(f"threads, fds: {stuck} with one pull stuck on the mount")
    for k in range(20):
        cp, took = timed(d, "pull", src)
        assert cp.returncode == 1, f"pull {k + 1} on the hung mount: exit {cp.returncode}: {cp.stderr}"
        assert str(m.mnt) in cp.stderr and "has not answered" in cp.stderr, cp.stderr
        assert took < ANSWER_S, f"pull {k + 1} on the hung mount took {took:.1f} s"
    now = counts(pid)
    print(f"threads, fds: {now} after 20 more pulls refused")
    assert now[0] <= stuck[0] + 2, f"threads grew: {stuck[0]} -> {now[0]}"
    assert now[1] <= stuck[1] + 2, f"fds grew: {stuck[1]} -> {now[1]}"

    # 5. status says what is wrong, and where.
    time.sleep(max(0.0, 5.5 - (time.monotonic() - t_probe)))
    st = d.status(timeout=20).stdout
    assert f"not answering: {m.mnt}" in st, st
    assert any("stuck for" in l and str(src) in l for l in jobs(d)), st

    # 6. Another file system is not held up.
    cp, took = timed(d, "pull", other, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert_tree_equal(other, d.dest_of(other))

    # 7. The mount answers again: the stuck pull ends (its client is gone)
    # and a rerun completes.
    m.cmd("clear")
    wait_for(lambda: not jobs(d), 30, "the stuck pull to end once the mount answers")
    assert "not answering" not in d.status(timeout=20).stdout
    cp = d.pull(src, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert_tree_equal(src, dest)
    assert d.run("verify", dest).returncode == 0
    d.assert_serving()


@pytest.mark.timeout(180)
def test_hanging_durable_tier(fault_mount, make_cluster):
    """The durable tier's shared mount stops answering: commits and their
    replication go on (the drain waits), a restore takes the peer's copy,
    `stage resume` answers naming the tier as not answering; released, the
    drain catches up."""
    m = fault_mount("nfs")
    root = m.mnt / "ckpt"
    root.mkdir()
    n0, n1 = make_cluster(2, replicas=1, transfer={"watch": "off"}, start=False)
    for d in (n0, n1):
        d.durable = {"root": root}
        d.write_config()
        d.start()
    first = make_tree(ckpt(n0, "llm", "step-100"), [F("w.pt", size=300000), F("meta", size=100)])
    cp, _ = timed(n0, "commit", first, "--wait")
    assert cp.returncode == 0, cp.stderr
    wait_for(lambda: (root / "llm" / "step-100" / ".stage" / "manifest.n0").exists(), 30,
             "step-100 drained")
    m.cmd("hang")
    try:
        durable_hung(m, root, n0)
    finally:
        m.cmd("clear")
    wait_for(lambda: (root / "llm" / "step-200" / ".stage" / "manifest.n0").exists(), 60,
             "step-200 drained once the tier answers")
    n0.assert_serving()


def durable_hung(m, root, n0):
    first = ckpt(n0, "llm", "step-100")
    second = make_tree(ckpt(n0, "llm", "step-200"), [F("w.pt", size=300000)], seed=2)
    cp, took = timed(n0, "commit", second, "--wait")
    assert cp.returncode == 0 and took < ANSWER_S, f"commit with the tier hung: {took:.1f} s: {cp.stderr}"
    for args in (["status"], ["ls"]):
        cp, took = timed(n0, *args)
        assert cp.returncode == 0 and took < ANSWER_S, f"stage {args[0]}: {took:.1f} s"
    (first / "w.pt").unlink()
    cp, took = timed(n0, "restore", first, timeout=60)
    assert cp.returncode == 0, f"restore with the tier hung: {cp.stdout}{cp.stderr}"
    assert "from n1" in cp.stderr, cp.stderr
    cp, took = timed(n0, "resume", "llm", timeout=60)
    print(f"resume with the tier hung: exit {cp.returncode} in {took:.1f} s: {cp.stdout}{cp.stderr}")
    assert took < 10, f"resume took {took:.1f} s with the tier hung"
    assert "durable tier" in cp.stdout + cp.stderr and "not answered" in cp.stdout + cp.stderr
