"""Real faults: kill -9 of the daemon mid-pull, Ctrl-C of the client, a full
file system, an unreadable source file."""
import hashlib
import os
import re
import signal
import stat
import subprocess
import threading
import time

import pytest

from conftest import NOBODY
from helpers import (CHUNK, F, L, assert_landed_match_source, assert_tree_equal, check_manifest_against,
                     inodes, json_result, landed_files, make_tree, manifest_path, parse_manifest, rm_tree,
                     same_content, sha256_file, simple_entries, temporaries, tree_diff, walk, xxh128_file)

MiB = 1 << 20
# Few files in flight and small I/O, so a pull of a few thousand files lasts
# long enough to be interrupted after its first files land.
SLOW = {"files_in_flight": "2", "io_size": "64KiB", "memory": "4MiB"}
SCALES = (1, 3, 9)       # the tree grows when a pull finished before we could interrupt it


def make_big_source(root, scale, seed=7, per_scale=1500):
    n = per_scale * scale
    entries = [F(f"small/{i // 400:02}/f{i:05}.bin", size=512 + (i * 37) % 12000) for i in range(n)]
    entries += [F(f"big/b{i}.bin", size=6 * MiB * scale + i) for i in range(2)]
    return make_tree(root, entries, seed=seed)


def pull_until(d, src, ready, timeout=90):
    """Starts `stage --json pull SRC` and polls ready() while it runs.
    Returns (client process, True) once ready() holds, or (process, False)
    if the client exited first."""
    proc = d.popen("pull", src, json=True)
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if ready():
            return proc, True
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"nothing happened within {timeout} s of starting the pull; log:\n{d.log()[-2000:]}")
        time.sleep(0.003)
    return proc, False


def wait_client(proc, what, timeout=20):
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"stage did not exit within {timeout} s after {what}") from None


def landed_for(dest, seconds, at_least=1):
    """ready() for pull_until: files have been landing in dest for `seconds`."""
    t0 = []

    def ready():
        k = len(landed_files(dest))
        if k and not t0:
            t0.append(time.monotonic())
        return k >= at_least and time.monotonic() - t0[0] >= seconds
    return ready


def files_of(src):
    return {r: st for r, st in walk(src).items() if stat.S_ISREG(st.st_mode)}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("delay", [0.0, 1.0], ids=["as-first-files-land", "after-1s-of-landing"])
def test_kill9_mid_pull_then_resume(make_daemon, delay):
    d = make_daemon(transfer=SLOW)
    src = d.src_root / "ds"
    dest = d.dest_of(src)
    for scale in SCALES:
        make_big_source(src, scale, per_scale=6000)
        proc, fired = pull_until(d, src, landed_for(dest, delay, at_least=10))
        if fired:
            d.kill9()
        rc = wait_client(proc, "the daemon was killed" if fired else "the pull")
        if fired and not manifest_path(dest).exists():
            break
        if not d.running:
            d.start()
        rm_tree(dest)
        rm_tree(src)
    else:
        pytest.fail("every pull finished before it could be killed: grow the test data")

    assert rc not in (0, 2), f"stage exited {rc} although the daemon died under it"
    assert_landed_match_source(src, dest)          # nothing half-written under a final name
    sfiles = files_of(src)
    finished = {rel: st.st_ino for rel, st in landed_files(dest).items()
                if (st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode)) ==
                (sfiles[rel].st_size, sfiles[rel].st_mtime_ns, stat.S_IMODE(sfiles[rel].st_mode))}
    assert finished, "files had landed, yet none had its final size, mtime and mode"

    d.start()
    cp = d.pull(src, json=True, timeout=180)
    assert cp.returncode == 0, cp.stderr
    res, _ = json_result(cp.stdout)
    assert_tree_equal(src, dest)
    assert temporaries(d.stage_root) == [], "temporaries of the killed pull remain"
    check_manifest_against(dest, src, digests=20)
    now = inodes(dest)
    recopied = sorted(r for r, ino in finished.items() if now.get(r) != ino)
    assert not recopied, f"{len(recopied)} of {len(finished)} finished files were copied again: {recopied[:5]}"
    assert res["files_copied"] <= len(sfiles) - len(finished), res
    cp = d.run("verify", dest, "--deep", timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr


NEW_MTIME = 1_800_000_000_000_000_000


@pytest.mark.timeout(240)
def test_kill9_during_repull_leaves_each_file_old_or_new(make_daemon):
    d = make_daemon(transfer=SLOW)
    src = d.src_root / "ds"
    dest = d.dest_of(src)
    for scale in SCALES:
        make_big_source(src, scale)
        cp = d.pull(src, timeout=180)
        assert cp.returncode == 0, cp.stderr
        old = {r: sha256_file(src / r) for r in files_of(src)}
        for i, rel in enumerate(sorted(old)):         # every file gets new content and a new mtime
            p = src / rel
            size = os.path.getsize(p) + (i % 3 == 0) * 100
            p.write_bytes(os.urandom(size))
            os.utime(p, ns=(NEW_MTIME + i, NEW_MTIME + i))
        new = {r: sha256_file(src / r) for r in old}

        def updated():
            return sum(st.st_mtime_ns >= NEW_MTIME for st in landed_files(dest).values()) >= 10

        proc, fired = pull_until(d, src, updated)
        if fired:
            d.kill9()
        rc = wait_client(proc, "the daemon was killed" if fired else "the pull")
        if fired and rc != 0:
            break
        if not d.running:
            d.start()
        rm_tree(dest)
        rm_tree(src)
    else:
        pytest.fail("every re-pull finished before it could be killed: grow the test data")

    landed = landed_files(dest)
    assert set(landed) == set(old), "files vanished or appeared under final names during an update: " + \
        repr(sorted(set(old) ^ set(landed))[:5])
    bad = [r for r in landed if sha256_file(dest / r) not in (old[r], new[r])]
    assert not bad, f"files that are neither the old nor the new version: {bad[:5]}"
    d.start()
    cp = d.pull(src, timeout=180)
    assert cp.returncode == 0, cp.stderr
    assert_tree_equal(src, dest)
    assert temporaries(d.stage_root) == []
    check_manifest_against(dest, src, digests=20)


def settle(d, dest, quiet=1.5, timeout=30):
    """Waits until dest stops changing and holds no temporaries."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while True:
        state = (frozenset((r, st.st_ino, st.st_size) for r, st in landed_files(dest).items()),
                 tuple(temporaries(dest)), manifest_path(dest).exists())
        if state != last:
            last, since = state, time.monotonic()
        elif not state[1] and time.monotonic() - since >= quiet:
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"{dest} still changing or holding temporaries {timeout} s after the "
                                 f"client was interrupted: {len(state[0])} files, temporaries {state[1][:5]}")
        time.sleep(0.05)


@pytest.mark.timeout(240)
def test_ctrl_c_cancels_the_pull(make_daemon):
    d = make_daemon(transfer=SLOW)
    src = d.src_root / "ds"
    dest = d.dest_of(src)
    for scale in SCALES:
        make_big_source(src, scale)
        proc, fired = pull_until(d, src, lambda: len(landed_files(dest)) >= 5)
        if fired:
            d.assert_serving()                        # status answers while a pull runs
            proc.send_signal(signal.SIGINT)
        rc = wait_client(proc, "SIGINT" if fired else "the pull")
        if fired and rc != 0:
            break
        rm_tree(dest)
        rm_tree(src)
    else:
        pytest.fail("every pull finished before Ctrl-C: grow the test data")

    files, tmps, has_manifest = settle(d, dest)
    assert not has_manifest, "the pull completed although the client was interrupted"
    assert len(files) < len(files_of(src))
    assert_landed_match_source(src, dest)
    d.assert_serving()
    cp = d.pull(src, timeout=180)
    assert cp.returncode == 0, cp.stderr
    assert_tree_equal(src, dest)


@pytest.mark.timeout(180)
def test_sigterm_mid_pull_stops_cleanly(make_daemon):
    d = make_daemon(transfer=SLOW)
    src = d.src_root / "ds"
    dest = d.dest_of(src)
    for scale in SCALES:
        make_big_source(src, scale, per_scale=3000)
        proc, fired = pull_until(d, src, lambda: len(landed_files(dest)) >= 5)
        if fired:
            rc_daemon = d.stop()
        rc = wait_client(proc, "SIGTERM to the daemon" if fired else "the pull")
        if fired and not manifest_path(dest).exists():
            break
        if not d.running:
            d.start()
        rm_tree(dest)
        rm_tree(src)
    else:
        pytest.fail("every pull finished before SIGTERM: grow the test data")

    assert rc_daemon == 0, f"staged exited {rc_daemon} on SIGTERM during a pull"
    assert rc not in (0, 2), f"stage exited {rc} although its pull was stopped"
    assert temporaries(dest) == [], "a stopped pull left temporaries"
    assert_landed_match_source(src, dest)
    d.start()
    cp = d.pull(src, timeout=180)
    assert cp.returncode == 0, cp.stderr
    assert_tree_equal(src, dest)


class Scribbler(threading.Thread):
    """Keeps rewriting blocks of a source file, each new content with an
    mtime of its own, and remembers which content every mtime the file ever
    showed belonged to. Writes are a clock tick apart, so the kernel's coarse
    mtime never returns to a value it had with other content."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path, self.stop_ev, self.lock = path, threading.Event(), threading.Lock()
        self.data = bytearray(path.read_bytes())
        self.versions = {}                    # mtime_ns -> {sha256 of the content}
        self.record(os.stat(path).st_mtime_ns)
        self.n = 0

    def record(self, mtime):
        with self.lock:
            self.versions.setdefault(mtime, set()).add(hashlib.sha256(self.data).hexdigest())

    def content_at(self, mtime):
        with self.lock:
            return set(self.versions.get(mtime, ()))

    def run(self):
        with open(self.path, "r+b", buffering=0) as f:
            while not self.stop_ev.is_set():
                off = (self.n * 7919 * 4096) % (len(self.data) - 4096)
                block = os.urandom(4096)
                self.data[off:off + 4096] = block
                os.pwrite(f.fileno(), block, off)
                self.record(os.fstat(f.fileno()).st_mtime_ns)      # the kernel's own mtime
                t = NEW_MTIME + self.n * 1_000_003
                os.utime(f.fileno(), ns=(t, t))
                self.record(t)
                self.n += 1
                time.sleep(0.012)


@pytest.mark.timeout(150)
def test_source_changing_during_pull_is_never_misrecorded(make_daemon):
    d = make_daemon(transfer=SLOW)
    src = make_tree(d.src_root / "ds", [F("hot.bin", size=8 * MiB), F("cold.txt", b"cold\n")])
    dest = d.dest_of(src)
    hot = dest / "hot.bin"
    w = Scribbler(src / "hot.bin")
    w.start()
    overlapped = 0
    try:
        for _ in range(15):                  # each pull sees a newer mtime and copies hot.bin again
            n0 = w.n
            cp = d.pull(src, json=True, timeout=60)
            overlapped += w.n > n0
            assert cp.returncode in (0, 1), cp.stderr
            res, _ = json_result(cp.stdout)
            assert temporaries(dest) == []
            if os.path.lexists(hot):
                st = os.stat(hot)
                assert sha256_file(hot) in w.content_at(st.st_mtime_ns), \
                    "staged hot.bin is not the content the source had at the mtime it claims (a torn copy)"
            if cp.returncode == 0:
                e = parse_manifest(manifest_path(dest)).entries["hot.bin"]
                st = os.stat(hot)
                assert (e.size, e.mtime_ns, e.digest) == (st.st_size, st.st_mtime_ns, xxh128_file(hot)), \
                    "the manifest does not describe the staged hot.bin"
            else:
                assert "hot.bin" in cp.stdout + cp.stderr, "the failure must name the file that changed"
    finally:
        w.stop_ev.set()
        w.join(10)
    assert overlapped >= 3, f"only {overlapped} pulls ran while the source changed; nothing was tested"
    cp = d.pull(src, timeout=90)
    assert cp.returncode == 0, cp.stderr
    assert_tree_equal(src, dest)


def test_full_disk(small_tmpfs, make_daemon):
    d = make_daemon(stage_root=small_tmpfs)
    big = make_tree(d.src_root / "big", [F(f"f{i}.bin", size=3 * MiB + i) for i in range(4)] +
                    [F(f"s/{i:02}", size=1000 + i) for i in range(20)])
    dest = d.dest_of(big)
    cp = d.pull(big)
    assert cp.returncode == 1, f"exit {cp.returncode}: {cp.stdout} {cp.stderr}"
    assert re.search(r"no space|full|ENOSPC", cp.stdout + cp.stderr, re.I), cp.stderr
    assert temporaries(small_tmpfs) == [], "temporaries left on the full file system"
    assert not manifest_path(dest).exists()
    assert_landed_match_source(big, dest)
    d.assert_serving()

    cp = d.pull(big, json=True)                       # again, as a script sees it
    assert cp.returncode == 1
    assert json_result(cp.stdout)[0]["code"] == 1
    assert temporaries(small_tmpfs) == []

    rm_tree(dest)                                     # free the space: the daemon works again
    small = make_tree(d.src_root / "small", simple_entries(n=10))
    cp = d.pull(small)
    assert cp.returncode == 0, cp.stderr
    assert_tree_equal(small, d.dest_of(small))
    check_manifest_against(d.dest_of(small), small)


@pytest.mark.parametrize("what", ["file", "dir"])
def test_unreadable_source_entry(nobody_base, make_daemon, what):
    d = make_daemon(base=nobody_base / "d", user=NOBODY)
    locked = "locked-file.bin" if what == "file" else "locked-dir"
    src = make_tree(d.src_root / "ds", [
        F("a.txt", b"a\n"), F("locked-file.bin", size=5000), F("locked-dir/inner.txt", b"i\n"),
        F("sub/c.bin", size=2 * CHUNK + 1), F("z.txt", b"z\n")])
    for p in [src, *src.rglob("*")]:
        os.chown(p, *NOBODY)                          # even its owner cannot read a mode-000 entry
    os.chmod(src / locked, 0)
    dest = d.dest_of(src)
    readable = ["a.txt", "sub/c.bin", "z.txt", "locked-dir/inner.txt" if what == "file" else "locked-file.bin"]

    cp = d.pull(src)
    assert cp.returncode == 1, f"exit {cp.returncode}: {cp.stdout} {cp.stderr}"
    assert locked in cp.stderr + cp.stdout, f"the failure must name {locked}: {cp.stderr!r}"
    for rel in readable:
        assert (dest / rel).is_file() and same_content(src / rel, dest / rel), f"{rel} not staged"
    if what == "file":
        assert not os.path.lexists(dest / locked)
    else:
        assert not os.path.lexists(dest / locked / "inner.txt")
    assert temporaries(dest) == []
    assert not manifest_path(dest).exists()
    assert stat.S_IMODE(os.stat(src / locked).st_mode) == 0, "the source was modified"
    d.assert_serving()

    cp = d.pull(src, json=True)
    assert cp.returncode == 1
    res, events = json_result(cp.stdout)
    assert res["code"] == 1
    named = [e for e in events if e["event"] in ("note", "result")
             and locked in (e.get("path") or "") + (e.get("text") or "")]
    assert named, f"no JSON note or result names {locked}: {events}"
    assert temporaries(dest) == []
    os.chmod(src / locked, 0o755 if what == "dir" else 0o644)    # readable again: the pull completes
    cp = d.pull(src)
    assert cp.returncode == 0, cp.stderr
    assert_tree_equal(src, dest)


def test_unprivileged_daemon_reads_other_users_files(nobody_base, make_daemon):
    """The usual case on a cluster: the dataset belongs to someone else and
    is world-readable; the daemon is not root and does not own it."""
    d = make_daemon(base=nobody_base / "d", user=NOBODY)
    src = make_tree(d.src_root / "ds", [
        F("a.txt", b"a\n", owner=(1234, 1234)), F("sub/b.bin", size=3 * CHUNK, owner=(0, 0)),
        F("sub/c.txt", b"c\n", mode=0o444, owner=(4321, 4321)), L("sub/l", "c.txt")])
    cp = d.pull(src)
    assert cp.returncode == 0, f"exit {cp.returncode}: {cp.stdout} {cp.stderr}"
    diffs = tree_diff(src, d.dest_of(src), check_owner=False)     # only root can give files away
    assert not diffs, diffs
