"""stage pull --cluster: SRC staged on every node, the shared storage read
once in all. The shared storage is a tests/tools/faultfs.py mount with no
page cache (--direct-io), so every byte any node reads through it is counted
by it, as each node's reads reach an NFS server; every node's source root is
that one mount."""
import json
import os
import time

import pytest

from helpers import (assert_tree_equal, json_result, last_line, make_tree, F, D, L, wait_for)


def dataset(root, n_small=40, big=(3 << 20, 1 << 20)):
    """Mixed files: small ones in two directories, a few big ones, a link."""
    entries = [D("a"), D("a/b"), D("c")]
    entries += [F(f"a/s{i:03d}", size=1000 + 37 * i) for i in range(n_small // 2)]
    entries += [F(f"a/b/t{i:03d}", size=3000 + 11 * i) for i in range(n_small // 2)]
    entries += [F(f"c/big{i}", size=size) for i, size in enumerate(big)]
    entries += [F("empty", size=0), L("c/link", "big0")]
    make_tree(root, entries)
    return sum(e.size for e in entries if isinstance(e, F))


@pytest.fixture
def shared(fault_mount):
    """The shared storage: (mount, SRC inside it, its size in bytes)."""
    m = fault_mount("nfs", direct_io=True)
    src = m.mnt / "ds"
    size = dataset(src)
    return m, src, size


def read_bytes(m):
    return m.stats()["read_bytes"]


def cluster_of(make_cluster, shared, n, **kw):
    m, src, size = shared
    return make_cluster(n, source_roots=[m.mnt], **kw)


def test_cluster_pull_reads_once_and_stages_everywhere(make_cluster, shared):
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 3)
    before = read_bytes(m)
    cp = nodes[0].run("--json", "pull", src, "--cluster", timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    res, events = json_result(cp.stdout)
    read = read_bytes(m) - before
    # Every byte of the tree read once through the mount, in all.
    assert read == size, f"read {read} bytes through the shared mount for a {size}-byte tree"
    for d in nodes:
        dest = d.dest_of(src)
        assert_tree_equal(src, dest)
        v = d.run("verify", dest)
        assert v.returncode == 0, v.stdout + v.stderr
    print(json.dumps(res), [e for e in events if e["event"] == "note"])


def test_independent_pulls_read_n_times(make_cluster, shared):
    """The mount counts what it should: three plain pulls read it thrice."""
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 3)
    before = read_bytes(m)
    for d in nodes:
        cp = d.pull(src)
        assert cp.returncode == 0, cp.stderr
    assert read_bytes(m) - before == 3 * size
