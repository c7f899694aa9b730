"""I/O errors below the file system, as the faults-below-the-file-system
issue asks: a disk or an NFS mount that fails a read or a write in the
middle of a file (tests/tools/faultfs.py's `fail`), at a seeded file and
byte, with EIO or ENOSPC. Each campaign checks:

- the command exits 1 and names the file and the error as the kernel says
  it ("Input/output error", "No space left on device");
- nothing partial stands under a final name, and nothing is published that
  was not whole: a pull's destination has no manifest, a replica is not
  under its final name, a restore leaves its step marked unfinished;
- what the fault did not touch is untouched: the origin of a commit, the
  other holders' copies;
- the daemon keeps serving, and once the fault is gone the next pull,
  commit or restore completes.

Seeded: STAGE_EIO_SEED (default 1) and STAGE_EIO_ROUNDS rounds per campaign
(default 3 in `make check`; 20 for the long campaign). The seed and each
round's fault are printed, with the line that replays them.
"""
import errno
import os
import random
import shutil

import pytest

from helpers import (F, assert_replica_of, assert_tree_equal, ckpt, commit_wait, ls_find,
                     make_tree, manifest_path, replica, temporaries)
from test_powercut import assert_whole, change, dataset, versions

MiB = 1 << 20
SEED = int(os.environ.get("STAGE_EIO_SEED", "1"))
ROUNDS = int(os.environ.get("STAGE_EIO_ROUNDS", "3"))
REPLAY = f"(replay: STAGE_EIO_SEED={SEED} STAGE_EIO_ROUNDS={ROUNDS})"


def rng_for(what):
    rng = random.Random(f"{SEED}-{what}")
    print(f"\n{what}: seed {SEED}, {ROUNDS} rounds {REPLAY}")
    return rng


def files_of(top):
    return sorted(rel for rel, v in versions(top).items() if v != "dir" and not v.startswith("->"))


def pick(rng, files):
    """A file to fail: every other time a shard (many chunks, the big-file
    path, O_DIRECT), else any of the small files."""
    big = [r for r in files if r.startswith("shard-")]
    return rng.choice(big if big and rng.random() < 0.5 else files)


def fault(m, rng, op, glob, size, errs=("EIO",)):
    """Orders one fault at a seeded byte of a file of size bytes; returns
    (byte, errno name, the kernel's words for it)."""
    at = rng.randrange(size) if size else 0
    name = rng.choice(errs)
    m.cmd("fail", op, glob, at, name)
    return at, name, os.strerror(getattr(errno, name))


def said(cp):
    return cp.stdout + cp.stderr


def failed_pull_then_clean(d, m, src, dest, i, *known):
    """After a pull failed on a fault: no manifest, whole files only (each a
    version in known), no temporaries, the daemon serving; then the fault
    cleared, the next pull completes and verifies."""
    assert not manifest_path(dest).exists(), f"round {i + 1}: a manifest after a failed pull"
    assert_whole(dest, *known)
    assert not temporaries(dest), f"round {i + 1}: temporaries left: {temporaries(dest)}"
    d.assert_serving()
    m.cmd("clear")
    cp = d.pull(src, timeout=120)
    assert cp.returncode == 0, f"round {i + 1}: the pull after the fault: {said(cp)}"
    assert_tree_equal(src, dest)
    cp = d.run("verify", dest)
    assert cp.returncode == 0, f"round {i + 1}: verify: {said(cp)}"


@pytest.mark.timeout(60 + 30 * ROUNDS)
def test_source_eio_mid_pull(fault_mount, make_daemon):
    """The shared mount fails a read of one file part-way: the pull exits 1
    naming the file and the error, the staged tree holds whole files only
    and no manifest; once the mount reads again the pull completes."""
    m = fault_mount("shared")
    d = make_daemon(source_roots=[m.mnt / "src"])
    src = dataset(d.src_root / "ds", SEED)
    dest = d.dest_of(src)
    rng = rng_for("source EIO mid-pull")
    prev = {}
    for i in range(ROUNDS):
        fresh = i % 2 == 0
        if fresh:
            shutil.rmtree(dest, ignore_errors=True)
            prev = {}
        else:
            change(src, rng, i)
        cur = versions(src)
        # A file the pull must read: any, or for a re-pull one that changed.
        wanted = [r for r in files_of(src) if fresh or prev.get(r) != cur[r]]
        rel = pick(rng, wanted)
        size = (src / rel).stat().st_size
        at, name, words = fault(m, rng, "read", f"/src/ds/{rel}", size)
        print(f"  round {i + 1}: {'fresh pull' if fresh else 're-pull'}, read of {rel} fails "
              f"with {name} at byte {at} of {size}")
        cp = d.pull(src, timeout=120)
        assert cp.returncode == 1, f"round {i + 1}: exit {cp.returncode}: {said(cp)}"
        assert rel in said(cp) and words in said(cp), f"round {i + 1}: not named: {said(cp)}"
        failed_pull_then_clean(d, m, src, dest, i, cur, prev)
        prev = cur


@pytest.mark.timeout(60 + 30 * ROUNDS)
def test_destination_eio_mid_pull(fault_mount, make_daemon):
    """The local disk fails a write part-way (EIO, or ENOSPC as a full disk
    does): the pull exits 1 naming the file and the error, nothing partial
    under a final name, no manifest; the next pull completes."""
    m = fault_mount()
    d = make_daemon(disk=m.mnt, exec_prefix=m.env_prefix(), start=False)
    d.start()
    src = dataset(d.src_root / "ds", SEED)
    dest = d.dest_of(src)
    rng = rng_for("destination EIO mid-pull")
    for i in range(ROUNDS):
        shutil.rmtree(dest, ignore_errors=True)
        # Every file is written to .stage/tmp first: the fault takes the
        # first temporary to reach the byte (a shard, or a small file when
        # the byte is early enough).
        at, name, words = fault(m, rng, "write", "*/stage/ds/.stage/tmp/*", 6 * MiB,
                                ("EIO", "ENOSPC"))
        print(f"  round {i + 1}: writes of temporaries fail with {name} at byte {at}")
        cp = d.pull(src, timeout=120)
        assert cp.returncode == 1, f"round {i + 1}: exit {cp.returncode}: {said(cp)}"
        assert words in said(cp) and str(dest) in said(cp), f"round {i + 1}: {said(cp)}"
        failed_pull_then_clean(d, m, src, dest, i, versions(src))


@pytest.mark.timeout(90 + 60 * ROUNDS)
@pytest.mark.parametrize("streams", [1, 3])
def test_replica_disk_eio(fault_mount, make_cluster, streams):
    """n1's disk fails a write of a replica part-way: that copy is refused
    and counted as a try (retried, then failed in `stage ls`), n2's copy is
    confirmed, the origin is untouched, nothing of n1's copy stands under
    its final name; a later commit, the fault gone, reaches n1. On one
    connection, or on three streams to each partner."""
    m = fault_mount()
    n0, n1, n2 = make_cluster(3, replicas=2, disks={1: m.mnt}, exec_prefix={1: m.env_prefix()},
                              transfer={"compress": "off", "watch": "off", "streams": streams},
                              start=False)
    for n in (n0, n1, n2):
        n.start()
    rng = rng_for("replica disk EIO")
    for i in range(ROUNDS):
        step = dataset(ckpt(n0, step=f"step-{i}"), SEED + i)
        want = versions(step)
        rel = pick(rng, files_of(step))
        size = (step / rel).stat().st_size
        at, name, words = fault(m, rng, "write", f"*/replicas/.incoming/n0/job1/step-{i}/{rel}",
                                size)
        print(f"  round {i + 1}: n1's writes of {rel} fail with {name} at byte {at} of {size}")
        cp = n0.run("commit", step, "--wait", timeout=120)
        assert cp.returncode == 1, f"round {i + 1}: exit {cp.returncode}: {said(cp)}"
        assert "n1" in cp.stderr and words in cp.stderr and rel in cp.stderr, cp.stderr
        assert ls_find(n0, f"job1/step-{i}", copies="n1:failed,n2:confirmed") or \
            ls_find(n0, f"job1/step-{i}", copies="n2:confirmed,n1:failed"), \
            f"round {i + 1}: {n0.run('ls').stdout}"
        tries = n0.log().count(f"job1/step-{i} to n1: refused")
        assert tries >= 2, f"round {i + 1}: the refusal was not retried ({tries} tries)"
        assert versions(step) == want, f"round {i + 1}: the origin changed"
        assert n0.run("verify", step).returncode == 0
        assert_replica_of(step, replica(n2, n0, step=f"step-{i}"))
        assert not replica(n1, n0, step=f"step-{i}").exists(), \
            f"round {i + 1}: a refused copy under its final name"
        n1.assert_serving()
        m.cmd("clear")
    later = make_tree(ckpt(n0, step="step-later"), [F("a.bin", size=3 * MiB)], seed=SEED)
    commit_wait(n0, later, timeout=120)
    assert_replica_of(later, replica(n1, n0, step="step-later"))


def restore_pair(fault_mount, make_cluster, on, streams=None):
    """n0 with its step committed and replicated to n1 and n2; node `on`'s
    disk is the faultfs mount; n0's restores over `streams` lanes if set."""
    m = fault_mount()
    nodes = make_cluster(3, replicas=2, disks={on: m.mnt}, exec_prefix={on: m.env_prefix()},
                         transfer={"compress": "off", "watch": "off"}, start=False)
    if streams:
        nodes[0].transfer["restore_streams"] = streams
        nodes[0].write_config()
    for n in nodes:
        n.start()
    step = dataset(ckpt(nodes[0]), SEED)
    commit_wait(nodes[0], step, timeout=120)
    return m, nodes, step


def damage(step, rng):
    lost = sorted(rng.sample(files_of(step), 4) + ["shard-1.bin"])
    for rel in set(lost):
        (step / rel).unlink(missing_ok=True)
    return sorted(set(lost))


@pytest.mark.timeout(90 + 30 * ROUNDS)
def test_restore_local_disk_eio(fault_mount, make_cluster):
    """n0's disk fails a write of a file being rebuilt: the restore exits 1
    naming the file and the error, nothing partial under a final name, no
    other source is tried for a local fault, the step stays marked; the
    next restore repairs it."""
    m, (n0, n1, n2), step = restore_pair(fault_mount, make_cluster, 0)
    want = versions(step)
    rng = rng_for("restore local disk EIO")
    for i in range(ROUNDS):
        damage(step, rng)
        # Rebuilds are written as .stage/tmp/rebuild.LANE.N, several at once:
        # the fault takes the first to reach the byte.
        at, name, words = fault(m, rng, "write", "*/ckpt/job1/step-100/.stage/tmp/rebuild.*",
                                6 * MiB, ("EIO", "ENOSPC"))
        print(f"  round {i + 1}: writes of rebuilds fail with {name} at byte {at}")
        cp = n0.run("restore", step, timeout=120)
        assert cp.returncode == 1, f"round {i + 1}: exit {cp.returncode}: {said(cp)}"
        assert words in cp.stderr and "run the restore again" in cp.stderr, cp.stderr
        assert "taking the rest" not in cp.stderr, "a local fault is no holder's"
        assert_whole(step, want)
        assert (step / ".stage" / "restoring").exists(), "the step is not marked unfinished"
        n0.assert_serving()
        m.cmd("clear")
        cp = n0.run("restore", step, timeout=120)
        assert cp.returncode == 0, f"round {i + 1}: the restore after the fault: {said(cp)}"
        assert versions(step) == want
        assert n0.run("verify", step).returncode == 0


@pytest.mark.timeout(90 + 30 * ROUNDS)
def test_restore_holder_disk_eio(fault_mount, make_cluster):
    """The holder chosen (n1, first in placement order) cannot read its copy
    part-way: the restore names it and takes the rest from n2's copy of the
    same commit, every chunk checked; with n2 down as well it exits 1 naming
    n1's error, nothing partial published, and repairs once n1 reads. One
    lane, so that the file n1 cannot read is n1's to send (with two, the
    lane starting on n2 may take it)."""
    m, (n0, n1, n2), step = restore_pair(fault_mount, make_cluster, 1, streams=1)
    want = versions(step)
    rng = rng_for("restore holder disk EIO")
    for i in range(ROUNDS):
        lost = damage(step, rng)
        rel = pick(rng, lost)
        size = os.path.getsize(replica(n1, n0) / rel)
        at, name, words = fault(m, rng, "read", f"*/replicas/n0/job1/step-100/{rel}", size)
        alone = i % 2 == 1
        print(f"  round {i + 1}: n1's reads of {rel} fail with {name} at byte {at} of {size}"
              f"{', n2 down' if alone else ''}")
        if alone:
            n2.stop()
        cp = n0.run("restore", step, timeout=120)
        if alone:
            assert cp.returncode == 1, f"round {i + 1}: exit {cp.returncode}: {said(cp)}"
            assert "n1" in cp.stderr and words in cp.stderr and rel in cp.stderr, cp.stderr
            assert_whole(step, want)
            n2.start()
            m.cmd("clear")
            cp = n0.run("restore", step, timeout=120)
            assert cp.returncode == 0, f"round {i + 1}: the restore after the fault: {said(cp)}"
        else:
            assert cp.returncode == 0, f"round {i + 1}: exit {cp.returncode}: {said(cp)}"
            assert words in cp.stderr and "from the copy on n2" in cp.stderr, cp.stderr
            m.cmd("clear")
        assert versions(step) == want
        assert n0.run("verify", step).returncode == 0
        assert_replica_of(step, replica(n1, n0))
