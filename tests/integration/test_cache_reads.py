"""A commit's reads and the page cache ([transfer] cache_reads): with `auto`
(the default) a commit whose step goes to a partner reads a cold step
through the page cache, so that the send right after it reads the step
from memory and the disk is read once; `warm` reads a cold step with
O_DIRECT for the hash and again for the send, leaving it out of the cache;
a node with no partner reads it with O_DIRECT under `auto` as well. Real
daemons on 127.0.0.1, n0's roots on /var/tmp (a disk, where O_DIRECT
works and a file can leave the cache; where it cannot, the test says so and
skips), the step made cold by fdatasync and POSIX_FADV_DONTNEED; what the
cache holds afterwards is read with fincore(1)."""
import os
import shutil
import subprocess
import tempfile

import pytest

from helpers import F, assert_replica_of, ckpt, commit_wait, make_tree, replica, wait_for

MiB = 1 << 20
SIZE = 32 * MiB


def cached(path):
    """Bytes of path in the page cache."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES",
                          str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def make_cold(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if cached(path) >= SIZE // 8:
        pytest.skip(f"{path} cannot leave the page cache on this file system: not run")


@pytest.fixture
def disk():
    """n0's roots on /var/tmp, removed after its daemons stop (set up first)."""
    d = tempfile.mkdtemp(prefix="stage-cache-", dir="/var/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("mode,nodes", [("auto", 2), ("warm", 2), ("auto", 1)])
def test_a_cold_step_is_read_once_when_it_is_sent(disk, make_cluster, mode, nodes):
    """auto with a partner: the step is in the cache after its commit and
    send (hash through the cache); warm, or no partner: it is not (O_DIRECT
    reads leave nothing there). The replica is exact either way."""
    ds = make_cluster(nodes, transfer={"compress": "off", "cache_reads": mode}, disks={0: disk})
    n0 = ds[0]
    step = make_tree(ckpt(n0), [F("big.bin", size=SIZE), F("small.bin", size=4096)], seed=7)
    make_cold(step / "big.bin")
    commit_wait(n0, step)
    got = cached(step / "big.bin")      # before the comparison below reads it
    if mode == "auto" and nodes == 2:
        assert got >= SIZE // 2, f"only {got} bytes of a step just hashed and sent are cached"
    else:
        assert got < SIZE // 2, f"{got} bytes cached: the step was read through the cache"
    if nodes == 2:
        wait_for(lambda: replica(ds[1], n0).is_dir(), 30, "step-100 to reach n1")
        assert_replica_of(step, replica(ds[1], n0))
