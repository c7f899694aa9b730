"""The durable tier on real daemons: each node's committed steps drained to
one shared directory ([durable] root) as ROOT/JOB/STEP with every node's
files side by side and a manifest per node, byte for byte the originals;
`every` and `keep`; a drain killed mid-file resumed after restart; two
nodes writing the same file name refused, not overwritten; a full durable
root named, replication unaffected."""
import os
import subprocess

import pytest

from conftest import need_root
from helpers import F, ckpt, commit_wait, make_tree, wait_for, after_kill9

JOB = "llm"


def durable_cluster(make_cluster, root, n=2, **durable):
    nodes = make_cluster(n, replicas=1, transfer={"watch": "off"}, start=False)
    for d in nodes:
        d.durable = {"root": root, **durable}
        d.write_config()
    return nodes


def step(d, name, files, seed):
    return make_tree(ckpt(d, JOB, name), files, seed=seed)


def drained(root, name, node):
    return (root / JOB / name / ".stage" / f"manifest.{node}").exists()


def same_bytes(a, b):
    return a.read_bytes() == b.read_bytes()


def test_steps_drained_side_by_side(make_cluster, tmp_path):
    root = tmp_path / "nfs-ckpt"
    root.mkdir()
    n0, n1 = durable_cluster(make_cluster, root)
    for d in (n0, n1):
        d.start()
    s0 = step(n0, "step-100", [F("__0_0.distcp", size=300_000), F(".metadata", data=b"meta\n"),
                               F("sub/opt-0.pt", size=70_000)], 1)
    s1 = step(n1, "step-100", [F("__1_0.distcp", size=200_000)], 2)
    commit_wait(n0, s0)
    commit_wait(n1, s1)
    wait_for(lambda: drained(root, "step-100", "n0") and drained(root, "step-100", "n1"), 30,
             "both nodes' parts of step-100 on the durable root")
    dst = root / JOB / "step-100"
    for src, rel in [(s0, "__0_0.distcp"), (s0, ".metadata"), (s0, "sub/opt-0.pt"),
                     (s1, "__1_0.distcp")]:
        assert same_bytes(src / rel, dst / rel), rel
        assert os.stat(src / rel).st_mtime_ns == os.stat(dst / rel).st_mtime_ns, rel
    # Each node's manifest is its commit's, and nothing half-written is left.
    assert (dst / ".stage" / "manifest.n0").read_bytes() == (s0 / ".stage" / "manifest").read_bytes()
    assert not [p for p in dst.rglob("*stage-drain*")], list(dst.rglob("*"))
    m = n0.run("metrics").stdout
    assert "stage_durable_steps_total 1\n" in m and "stage_durable_failures_total 0\n" in m, m


def test_every_and_keep(make_cluster, tmp_path):
    root = tmp_path / "nfs-ckpt"
    root.mkdir()
    (n0,) = durable_cluster(make_cluster, root, n=1, keep=2, every=2)
    n0.start()
    for k in range(1, 8):
        commit_wait(n0, step(n0, f"step-{k}00", [F("w.pt", size=10_000 + k)], k))
        if k == 1:      # a job first seen: its newest step, at once
            wait_for(lambda: drained(root, "step-100", "n0"), 30, "step-100 drained")
    # After step-100: every second commit (300, 500, 700); keep = 2.
    wait_for(lambda: drained(root, "step-700", "n0"), 30, "step-700 drained")
    wait_for(lambda: not (root / JOB / "step-300").exists(), 30, "step-300 retired")
    have = sorted(p.name for p in (root / JOB).iterdir())
    assert have == ["step-500", "step-700"], have


def test_recommit_shared_files_and_modes(make_cluster, tmp_path):
    """A step committed again is drained again, this node's old files
    replaced; a file both nodes wrote alike is kept once and survives the
    first node's retirement of the step; set-id bits do not reach the
    root-owned copy."""
    root = tmp_path / "nfs-ckpt"
    root.mkdir()
    n0, n1 = durable_cluster(make_cluster, root, keep=1)
    for d in (n0, n1):
        d.start()
    same = b'{"arch": "llama"}\n'
    s0 = step(n0, "step-100", [F("a.pt", size=9000), F("config.json", data=same),
                               F("run.sh", data=b"#!/bin/sh\n", mode=0o4755)], 1)
    s1 = step(n1, "step-100", [F("b.pt", size=8000), F("config.json", data=same)], 2)
    commit_wait(n0, s0)
    commit_wait(n1, s1)
    wait_for(lambda: drained(root, "step-100", "n0") and drained(root, "step-100", "n1"), 30,
             "both parts of step-100")
    dst = root / JOB / "step-100"
    assert os.stat(dst / "run.sh").st_mode & 0o7777 == 0o755, oct(os.stat(dst / "run.sh").st_mode)
    # n0 commits step-100 again with other content: its part follows.
    (s0 / "a.pt").write_bytes(b"new" * 1000)
    commit_wait(n0, s0)
    wait_for(lambda: (dst / "a.pt").read_bytes() == b"new" * 1000 and drained(root, "step-100", "n0"),
             30, "n0's new a.pt drained")
    assert (dst / ".stage" / "manifest.n0").read_bytes() == (s0 / ".stage" / "manifest").read_bytes()
    # n0 moves on (keep = 1): its part of step-100 goes, the shared config.json stays for n1.
    commit_wait(n0, step(n0, "step-200", [F("a.pt", size=100)], 3))
    wait_for(lambda: not (dst / "a.pt").exists(), 30, "n0's part of step-100 retired")
    assert (dst / "config.json").read_bytes() == same and (dst / "b.pt").exists()
    assert drained(root, "step-100", "n1")


def test_kill9_mid_drain_resumes(make_cluster, tmp_path):
    root = tmp_path / "nfs-ckpt"
    root.mkdir()
    (n0,) = durable_cluster(make_cluster, root, n=1, rate="4MiB")
    n0.start()
    big = step(n0, "step-100", [F("big.pt", size=24 << 20), F("small.pt", size=1000)], 3)
    commit_wait(n0, big)
    wait_for(lambda: list((root / JOB / "step-100").glob(".stage-drain.n0.*")), 30,
             "the drain under way")
    n0.kill9()
    assert not drained(root, "step-100", "n0")
    assert not (root / JOB / "step-100" / "big.pt").exists(), "a half file under its final name"
    after_kill9()
    n0.transfer.pop("rate", None)
    n0.durable.pop("rate", None)
    n0.write_config()
    n0.start()
    wait_for(lambda: drained(root, "step-100", "n0"), 60, "the drain done after the restart")
    assert same_bytes(big / "big.pt", root / JOB / "step-100" / "big.pt")
    assert not list((root / JOB / "step-100").glob(".stage-drain*"))


def test_same_name_from_two_nodes_refused(make_cluster, tmp_path):
    root = tmp_path / "nfs-ckpt"
    root.mkdir()
    n0, n1 = durable_cluster(make_cluster, root)
    for d in (n0, n1):
        d.start()
    commit_wait(n0, step(n0, "step-100", [F("model.pt", size=5000)], 1))
    wait_for(lambda: drained(root, "step-100", "n0"), 30, "n0's part drained")
    want = (root / JOB / "step-100" / "model.pt").read_bytes()
    commit_wait(n1, step(n1, "step-100", [F("model.pt", size=6000)], 2))
    wait_for(lambda: "two nodes write the same file name" in n1.log(), 30, "n1's refusal logged")
    assert (root / JOB / "step-100" / "model.pt").read_bytes() == want, "n0's file overwritten"
    assert not drained(root, "step-100", "n1")
    assert "model.pt" in [l for l in n1.log().splitlines() if "same file name" in l][0]


def test_full_durable_root_named_replication_unaffected(make_cluster, tmp_path):
    need_root("a tmpfs mount")
    root = tmp_path / "small"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(root)], check=True)
    nodes = []
    try:
        nodes = n0, n1 = durable_cluster(make_cluster, root)
        for d in (n0, n1):
            d.start()
        s = step(n0, "step-100", [F("big.pt", size=4 << 20)], 4)
        commit_wait(n0, s)                  # replicated and confirmed regardless
        wait_for(lambda: "not drained to" in n0.log(), 30, "the failed drain logged")
        line = [l for l in n0.log().splitlines() if "not drained to" in l][0]
        assert str(root) in line and "No space left on device" in line, line
        assert not drained(root, "step-100", "n0")
        assert not list(root.rglob("*stage-drain*")), "a temporary left on the full root"
        assert n1.run("verify", n1.base / "replicas" / "n0" / JOB / "step-100").returncode == 0
        n0.assert_serving()
    finally:
        for d in nodes:
            d.stop()
        subprocess.run(["umount", str(root)], check=False)


def test_durable_root_without_rename_flags(fault_mount, make_cluster):
    """A durable root on a file system that refuses renameat2's flags with
    EINVAL, as NFS does (faultfs speaks FUSE 7.19, where the kernel refuses
    them the same way): each file is still published without replacing
    another node's (a hard link, then the temporary unlinked). Before, every
    file of every drain failed with "Invalid argument"."""
    m = fault_mount("nfs")
    root = m.mnt / "ckpt"
    root.mkdir()
    n0, n1 = durable_cluster(make_cluster, root)
    for d in (n0, n1):
        d.start()
    s0 = step(n0, "step-100", [F("model.pt", size=300_000), F("sub/opt-0.pt", size=70_000)], 1)
    commit_wait(n0, s0)
    wait_for(lambda: drained(root, "step-100", "n0"), 30, "n0's part drained")
    dst = root / JOB / "step-100"
    for rel in ("model.pt", "sub/opt-0.pt"):
        assert same_bytes(s0 / rel, dst / rel), rel
    assert not [p for p in dst.rglob("*stage-drain*")], list(dst.rglob("*"))
    commit_wait(n1, step(n1, "step-100", [F("model.pt", size=6000)], 2))
    wait_for(lambda: "two nodes write the same file name" in n1.log(), 30, "n1's refusal logged")
    assert same_bytes(s0 / "model.pt", dst / "model.pt"), "n0's file overwritten"
    assert not drained(root, "step-100", "n1")
