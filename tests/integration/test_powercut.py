"""Power cuts, as the faults-below-the-file-system issue asks: at random
moments of a pull, a commit's hashing, the receiving of a replica and a
restore, the node's disk loses every write that fsync, fdatasync or syncfs
had not made durable, and every name its directory's fsync had not
(tests/tools/faultfs.py, the strict POSIX reading). Then the node "reboots"
(faultfs mounted again, the daemon started again) and each campaign checks:

- what was acknowledged is there and right: a pull reported complete, a
  commit confirmed, a replica confirmed, a restore reported done;
- nothing partial stands under a final name: every file there is a whole
  version the test knows (the source's, or for a re-pull the one before);
- the next pull, commit or restore completes.

The node's state_dir and every root it writes are on the faultfs mount
(its disk); its config, logs and the other node are not. The daemon runs
with tests/tools/syncfs_shim.c preloaded, since FUSE does not pass syncfs
on. A rate cap on the mount stretches each operation to about a second so
that the cuts land in its middle.

Seeded: STAGE_POWERCUT_SEED (default 1) and STAGE_POWERCUT_CUTS cuts per
campaign (default 4 in `make check`; the issue's campaign is 20 or more).
The seed and the plan are printed, each cut as it lands.
"""
import hashlib
import os
import random
import shutil
import stat
import subprocess
import time

import pytest

from faultmount import SYNCFS_SHIM
from helpers import (F, assert_replica_of, assert_tree_equal, ckpt, commit_wait, ls_entries,
                     make_tree, manifest_path, replica, temporaries, wait_for, walk)

MiB = 1 << 20
SEED = int(os.environ.get("STAGE_POWERCUT_SEED", "1"))
CUTS = int(os.environ.get("STAGE_POWERCUT_CUTS", "4"))
RATE = 24 * MiB          # bytes/s through the mount: an operation of ~25 MiB takes about a second


def versions(top):
    """{rel: sha256 or link target or "dir"} of the tree beneath top, its .stage left out."""
    out = {}
    for rel, st in walk(top).items():
        p = os.path.join(top, rel)
        if stat.S_ISREG(st.st_mode):
            with open(p, "rb") as f:
                out[rel] = hashlib.sha256(f.read()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            out[rel] = "-> " + os.readlink(p)
        else:
            out[rel] = "dir"
    return out


def assert_whole(top, *known):
    """Every entry beneath top (its .stage left out) is one of the versions
    in known ({rel: version} maps): nothing partial under a final name."""
    bad = []
    for rel, v in versions(top).items():
        if v == "dir":
            continue
        if not any(k.get(rel) == v for k in known):
            bad.append(rel)
    assert not bad, f"under final names in {top}, not a whole known version: {sorted(bad)[:20]}"


def sync_fs(m, path):
    """syncfs of the mount through the shim, as a trainer's save that ends
    with a sync would: what the test wrote there is durable."""
    env = dict(os.environ, LD_PRELOAD=str(SYNCFS_SHIM), FAULTFS_CONTROL=str(m.control))
    subprocess.run(["sync", "-f", str(path)], check=True, env=env, timeout=60)


class Plan:
    def __init__(self, what, span):
        self.rng = random.Random(f"{SEED}-{what}")
        self.at = [self.rng.uniform(0.05, span) for _ in range(CUTS)]
        self.what = what
        print(f"\n{what}: seed {SEED}, {CUTS} cuts in 0..{span:.2f} s: " +
              " ".join(f"{a:.2f}" for a in self.at) +
              f"  (replay: STAGE_POWERCUT_SEED={SEED} STAGE_POWERCUT_CUTS={CUTS})")


def cut(d, m, what, i, at, acked, before_start=None):
    """kill -9 of the node's daemon and the cut of its disk at once (a power
    cut stops both), then the reboot. acked: whether the operation had been
    acknowledged when the cut came (for the record). before_start: called
    once the disk is back, before the daemon starts."""
    d.kill9()
    lost = m.cut()
    print(f"  cut {i + 1}: {what} at {at:.2f} s, {'after it was acknowledged' if acked else 'in flight'} "
          f"({lost})")
    m.reboot()
    if before_start:
        before_start()
    d.start()


def node_on(m, make_daemon, **kw):
    return make_daemon(disk=m.mnt, exec_prefix=m.env_prefix(), start=False, **kw)


def dataset(root, seed):
    return make_tree(root, [F(f"shard-{i}.bin", size=6 * MiB + i * 4099) for i in range(3)] +
                     [F(f"small/{i:03d}", size=1000 + 37 * i) for i in range(150)], seed=seed)


def change(src, rng, n):
    """A new version of the source: a shard and some small files rewritten,
    some removed, some added; each change with an mtime of its own."""
    t = time.time_ns()
    for rel in [f"shard-{rng.randrange(3)}.bin"] + [f"small/{i:03d}" for i in rng.sample(range(150), 12)]:
        p = src / rel
        if p.exists():
            p.write_bytes(rng.randbytes(p.stat().st_size))
            os.utime(p, ns=(t, t + n))
    for i in rng.sample(range(150), 3):
        (src / f"small/{i:03d}").unlink(missing_ok=True)
    for j in range(3):
        (src / f"small/new-{n}-{j}").write_bytes(rng.randbytes(500 + j))


def pull_ok(d, src):
    cp = d.pull(src, timeout=120)
    assert cp.returncode == 0, f"the pull after the reboot failed ({cp.returncode}): {cp.stderr}\n{d.log()[-3000:]}"
    dest = d.dest_of(src)
    assert_tree_equal(src, dest)
    cp = d.run("verify", dest)
    assert cp.returncode == 0, f"verify after the pull: {cp.stdout}{cp.stderr}"
    assert not temporaries(dest), f"temporaries left: {temporaries(dest)}"


@pytest.mark.timeout(120 + 30 * CUTS)
def test_power_cut_during_pull(fault_mount, make_daemon):
    m = fault_mount()
    d = node_on(m, make_daemon)
    src = dataset(d.src_root / "ds", SEED)
    dest = d.dest_of(src)
    d.start()
    m.cmd("rate", RATE)
    t0 = time.monotonic()
    pull_ok(d, src)
    plan = Plan("pull", (time.monotonic() - t0) * 1.1)
    prev = versions(src)
    for i, at in enumerate(plan.at):
        fresh = plan.rng.random() < 0.5
        if fresh:
            shutil.rmtree(dest)
            sync_fs(m, m.mnt)
        else:
            change(src, plan.rng, i)
        cur = versions(src)
        p = d.popen("pull", src)
        time.sleep(at)
        rc = p.poll()
        cut(d, m, "fresh pull" if fresh else "re-pull", i, at, rc == 0)
        p.wait(30)
        out = p.out_path.read_text(errors="replace")
        acked = rc == 0 and "pulled" in out
        if acked:
            assert_tree_equal(src, dest)
            cp = d.run("verify", dest)
            assert cp.returncode == 0, f"cut {i + 1}: a pull reported complete does not verify: {cp.stdout}{cp.stderr}"
        elif dest.exists():
            assert_whole(dest, cur, {} if fresh else prev)
            if manifest_path(dest).exists():
                cp = d.run("verify", dest)
                assert cp.returncode in (0, 1), cp.stderr
        pull_ok(d, src)
        prev = cur


@pytest.mark.timeout(120 + 30 * CUTS)
def test_power_cut_during_commit(fault_mount, make_daemon):
    m = fault_mount()
    d = node_on(m, make_daemon)
    d.start()
    m.cmd("rate", RATE)

    def trainer_save(n):
        step = dataset(ckpt(d, step=f"step-{n}"), n)
        sync_fs(m, step)
        return step

    step = trainer_save(99)
    t0 = time.monotonic()
    commit_wait(d, step)
    plan = Plan("commit", (time.monotonic() - t0) * 1.1)
    for i, at in enumerate(plan.at):
        step = trainer_save(100 + i)
        want = versions(step)
        # The confirmation is --wait's: a plain commit answers once the
        # manifest is queued ("manifest and 0 copies queued"), before it is
        # written.
        p = d.popen("commit", step, "--wait")
        time.sleep(at)
        rc = p.poll()
        cut(d, m, "commit", i, at, rc == 0)
        p.wait(30)
        assert versions(step) == want, f"cut {i + 1}: the trainer's files changed"
        mf = manifest_path(step)
        if rc == 0:
            assert mf.exists(), f"cut {i + 1}: a confirmed commit lost its manifest"
        if mf.exists():
            cp = d.run("verify", step)
            assert cp.returncode == 0, \
                f"cut {i + 1}: the manifest {'of a confirmed commit ' if rc == 0 else ''}does not verify: " \
                f"{cp.stdout}{cp.stderr}"
        commit_wait(d, step)
        cp = d.run("verify", step)
        assert cp.returncode == 0, f"cut {i + 1}: the commit after the reboot does not verify: {cp.stdout}{cp.stderr}"


def saver(d, steps):
    """save(n): the trainer saves step-N on d (appended to steps)."""
    def save(n):
        s = dataset(ckpt(d, step=f"step-{n}"), n)
        steps.append(s)
        return s
    return save


def confirmed(n0):
    return {n.split("/", 1)[1] for n, f in ls_entries(n0)
            if f.get("origin") == "n0" and n.startswith("job1/") and f.get("copies") == "n1:confirmed"}


@pytest.mark.timeout(150 + 40 * CUTS)
@pytest.mark.parametrize("streams", [1, 3])
def test_power_cut_while_receiving_a_replica(fault_mount, make_cluster, streams):
    """n1's power cut while it receives copies (on one connection, or on
    three streams): what it acknowledged stays, the rest comes again."""
    m = fault_mount()
    n0, n1 = make_cluster(2, keep=100, disks={1: m.mnt}, exec_prefix={1: m.env_prefix()},
                          transfer={"compress": "off", "streams": streams}, start=False)
    n0.start()
    n1.start()
    m.cmd("rate", RATE)
    steps = []
    save = saver(n0, steps)

    t0 = time.monotonic()
    commit_wait(n0, save(99), timeout=120)
    plan = Plan("replica", (time.monotonic() - t0) * 1.1)
    for i, at in enumerate(plan.at):
        s = save(100 + i)
        cp = n0.run("commit", s)
        assert cp.returncode == 0, cp.stderr
        time.sleep(at)
        acked = confirmed(n0)
        cut(n1, m, f"receiving {s.name}", i, at, s.name in acked)
        for name in sorted(acked):
            assert_replica_of(ckpt(n0, step=name), replica(n1, n0, step=name))
        rr = replica(n1, n0, step="x").parent
        for name in sorted(os.listdir(rr)) if rr.exists() else []:
            # Published: whole, with the origin's manifest.
            assert_replica_of(ckpt(n0, step=name), rr / name)
        wait_for(lambda: {x.name for x in steps} <= confirmed(n0), 120,
                 f"every step confirmed on n1 after cut {i + 1}")
    for x in steps:
        assert_replica_of(x, replica(n1, n0, step=x.name))


@pytest.mark.timeout(150 + 40 * CUTS)
def test_power_cut_during_restore(fault_mount, make_cluster):
    m = fault_mount()
    n0, n1 = make_cluster(2, disks={0: m.mnt}, exec_prefix={0: m.env_prefix()},
                          transfer={"compress": "off"}, start=False)
    n0.start()
    n1.start()
    step = dataset(ckpt(n0), 7)
    sync_fs(m, step)
    commit_wait(n0, step, timeout=120)
    want = versions(step)
    orig = m.backing.parent / "orig"            # off the mount
    shutil.copytree(step, orig, symlinks=True)
    m.cmd("rate", RATE)
    plan = None
    rng = random.Random(f"{SEED}-restore-damage")
    for i in range(CUTS + 1):
        lost = sorted(rng.sample(sorted(r for r, v in want.items() if v != "dir"), 6))
        for rel in lost:
            (step / rel).unlink()
        sync_fs(m, step)
        t0 = time.monotonic()
        p = n0.popen("restore", step)
        if plan is None:                # the first restore, whole, to time the plan
            assert p.wait(120) == 0, p.err_path.read_text()
            assert versions(step) == want
            plan = Plan("restore", (time.monotonic() - t0) * 1.1)
            continue
        at = plan.at[i - 1]
        time.sleep(at)
        rc = p.poll()
        cut(n0, m, "restore", i - 1, at, rc == 0)
        p.wait(30)
        if rc == 0:
            assert versions(step) == want, f"cut {i}: a restore reported done, but the step is not whole"
        assert_whole(step, want)
        cp = n0.run("restore", step, timeout=120)
        assert cp.returncode == 0, f"cut {i}: the restore after the reboot: {cp.stdout}{cp.stderr}"
        assert versions(step) == want
        cp = n0.run("verify", step)
        assert cp.returncode == 0, cp.stdout + cp.stderr
    assert_tree_equal(orig, step)


def meta(p):
    st = os.lstat(p)
    return st.st_mode, st.st_mtime_ns


def durable_part(root, step, node="n0"):
    return (root / "job1" / step.name / ".stage" / f"manifest.{node}").exists()


@pytest.mark.timeout(150 + 40 * CUTS)
def test_power_cut_during_durable_drain(fault_mount, make_cluster):
    """The durable tier's storage (an NFS server) loses power while a step
    is drained to it, and the node's daemon dies at the same moment. After
    the reboot: a part whose manifest stands there is whole and the
    commit's, byte for byte; no file under a final name is partial; the
    drain finishes every step."""
    m = fault_mount("nfs")
    root = m.mnt / "ckpt"
    root.mkdir()
    sync_fs(m, m.mnt)
    (n0,) = make_cluster(1, transfer={"watch": "off", "compress": "off"},
                         exec_prefix={0: m.env_prefix()}, start=False)
    n0.durable = {"root": root, "keep": 100}
    n0.write_config()
    n0.start()
    m.cmd("rate", RATE)
    steps = []
    save = saver(n0, steps)

    def commit(n):
        s = save(n)
        commit_wait(n0, s, timeout=120)
        return s

    t0 = time.monotonic()
    first = commit(99)
    wait_for(lambda: durable_part(root, first), 60, "the first step drained")
    plan = Plan("durable drain", (time.monotonic() - t0) * 1.1)

    def check(when):
        for s in steps:
            part = root / "job1" / s.name
            if durable_part(root, s):
                # Its files byte for byte, with their modes and mtimes; the
                # directories are every origin's, so theirs are not one
                # commit's to keep.
                got = versions(part)
                bad = [r for r, v in versions(s).items()
                       if got.get(r) != v or v != "dir" and meta(s / r) != meta(part / r)]
                assert not bad, f"{when}: the durable part of {s.name} differs: " + ", ".join(
                    f"{r} ({'content' if got.get(r) != versions(s)[r] else 'mode, mtime'})"
                    for r in bad[:10])
                assert (part / ".stage" / "manifest.n0").read_bytes() == manifest_path(s).read_bytes(), \
                    f"{when}: the durable manifest of {s.name} is not its commit's"
            elif part.exists():
                left = {r: v for r, v in versions(part).items() if ".stage-drain." not in r}
                bad = [r for r, v in left.items() if v != "dir" and versions(s).get(r) != v]
                assert not bad, f"{when}: partial under final names in {part}: {bad[:10]}"

    check("uncut")
    for i, at in enumerate(plan.at):
        s = commit(100 + i)
        time.sleep(at)
        # The check comes between the reboot and the daemon's start: the
        # drain it starts would be changing what is checked.
        cut(n0, m, f"draining {s.name}", i, at, durable_part(root, s),
            before_start=lambda: check(f"cut {i + 1}"))
        wait_for(lambda: all(durable_part(root, x) for x in steps), 120,
                 f"every step drained after cut {i + 1}")
        check(f"after cut {i + 1}, drained")
        for x in steps:
            part = root / "job1" / x.name
            assert not [p for p in part.rglob("*stage-drain*")], f"temporaries left in {part}"
