"""tests/tools/faultfs.py itself: what a power cut keeps and loses, the
injected errors, the hang. The fault campaigns trust these answers, so each
is checked here against the strict POSIX reading the tool claims."""
import errno
import os
import subprocess
import threading
import time

import pytest

from faultmount import SYNCFS_SHIM


def write(path, data, sync=False):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_what_a_power_cut_keeps(fault_mount):
    m = fault_mount()
    d = m.mnt
    # At mount, what the backing holds is durable.
    (m.backing / "old").write_bytes(b"old bytes")
    os.utime(m.backing / "old", ns=(10**18, 10**18))
    (m.backing / "keep").mkdir()
    (m.backing / "keep" / "a").write_bytes(b"a" * 5000)
    (m.backing / "keep2").mkdir()

    write(d / "synced", b"durable", sync=True)     # file and directory synced
    fsync_dir(d)
    write(d / "nodir", b"data synced, name not", sync=True)
    write(d / "old", b"rewritten, never synced")
    (d / "keep" / "a").unlink()                      # unlinked, directory not synced
    inode_reuse = d / "keep" / "b"                   # likely a's inode number again
    write(inode_reuse, b"new")
    os.mkdir(d / "newdir")
    write(d / "newdir" / "f", b"f", sync=True)
    fsync_dir(d / "newdir")                          # its entry in d is not synced
    os.rename(d / "synced", d / "renamed")           # a rename never synced
    os.unlink(d / "keep" / "b")
    write(d / "keep2" / "syncedname", b"lost", sync=False)
    fsync_dir(d / "keep2")                           # the name is durable, its data never was

    m.cut()
    with pytest.raises(OSError) as ei:
        os.listdir(d)
    assert ei.value.errno == errno.EIO, "after the cut every call must fail like a dead disk"
    m.reboot()

    assert sorted(os.listdir(d)) == ["keep", "keep2", "old", "synced"]
    assert (d / "synced").read_bytes() == b"durable"
    assert (d / "old").read_bytes() == b"old bytes" and (d / "old").stat().st_mtime_ns == 10**18
    assert os.listdir(d / "keep") == ["a"] and (d / "keep" / "a").read_bytes() == b"a" * 5000
    assert os.listdir(d / "keep2") == ["syncedname"] and (d / "keep2" / "syncedname").read_bytes() == b""
    assert m.stats()["cuts"] == 0, "a reboot starts a fresh faultfs"


def test_synced_rename_survives_and_syncfs_makes_all_durable(fault_mount):
    m = fault_mount()
    d = m.mnt
    os.mkdir(d / "a")
    os.mkdir(d / "b")
    fsync_dir(d)
    write(d / "a" / "x", b"x" * 100000, sync=True)
    fsync_dir(d / "a")
    os.rename(d / "a" / "x", d / "b" / "x")
    fsync_dir(d / "a")
    fsync_dir(d / "b")
    write(d / "b" / "unsynced", b"gone")
    m.cut()
    m.reboot()
    assert os.listdir(d / "a") == [] and os.listdir(d / "b") == ["x"]
    assert (d / "b" / "x").read_bytes() == b"x" * 100000

    # syncfs(2), through the shim (coreutils' sync -f calls it).
    write(d / "b" / "y", b"y")
    os.mkdir(d / "c")
    env = dict(os.environ, LD_PRELOAD=str(SYNCFS_SHIM), FAULTFS_CONTROL=str(m.control))
    subprocess.run(["sync", "-f", str(d / "b")], check=True, env=env, timeout=30)
    assert m.stats()["syncfs"] == 1
    write(d / "b" / "z", b"after")
    m.cut()
    m.reboot()
    assert sorted(os.listdir(d)) == ["a", "b", "c"]
    assert sorted(os.listdir(d / "b")) == ["x", "y"] and (d / "b" / "y").read_bytes() == b"y"


def test_injected_errors_name_the_byte(fault_mount):
    m = fault_mount()
    d = m.mnt
    (m.backing / "src.bin").write_bytes(bytes(range(256)) * 4096)     # 1 MiB
    m.cmd("fail", "read", "/src.bin", 300000, "EIO")
    m.cmd("fail", "write", "*.out", 65536, "ENOSPC")
    with open(d / "src.bin", "rb", buffering=0) as f:
        got = b""
        with pytest.raises(OSError) as ei:
            while True:
                b = f.read(65536)
                assert b, "end of file before the error"
                got += b
        assert ei.value.errno == errno.EIO
        assert 200000 <= len(got) < 300000 and got == (bytes(range(256)) * 4096)[:len(got)], \
            "the bytes before the failing one read well, none past it"
    with open(d / "x.out", "wb", buffering=0) as f:
        f.write(b"w" * 65536)
        with pytest.raises(OSError) as ei:
            f.write(b"w")
        assert ei.value.errno == errno.ENOSPC
    assert m.stats()["faults"] >= 2
    m.cmd("clear")
    assert (d / "src.bin").read_bytes() == bytes(range(256)) * 4096


def test_hang_blocks_every_call_until_released(fault_mount):
    m = fault_mount()
    (m.backing / "f").write_bytes(b"f")
    m.cmd("hang")
    got = []
    t = threading.Thread(target=lambda: got.append(os.listdir(m.mnt)), daemon=True)
    t.start()
    time.sleep(0.5)
    assert t.is_alive() and m.stats()["blocked"] >= 1, "a call on a hung mount must block"
    m.cmd("release")
    t.join(10)
    assert got == [["f"]]
