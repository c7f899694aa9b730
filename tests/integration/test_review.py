"""Regression tests from a review of the daemon's engine (daemon/*.c).

Each test names the defect it demonstrates in its docstring and fails until
that defect is fixed. test_status_while_jobs_start needs a ThreadSanitizer
build to fail (STAGE_BUILD=a build made with CFLAGS=-fsanitize=thread).
"""
import os
import signal
import stat
import subprocess
import threading
import time

import pytest

from conftest import NOBODY
from helpers import (IS_ROOT, D, F, assert_tree_equal, check_manifest_against, make_tree, manifest_path,
                     wait_for)


def xxh64_name(name):
    """XXH3-64 of a name as pull.c's tmp_name() prints it (%016llx)."""
    r = subprocess.run(["xxhsum", "-H3", "-"], input=os.fsencode(name), capture_output=True,
                       timeout=30, check=True)
    return r.stdout.split()[-1].decode().lower()


def test_source_name_that_is_a_temporary_name(daemon):
    """pull.c tmp_name(): the temporary of NAME is DIR/.stage-tmp.<xxh64(NAME)>,
    in the same directory as the data. A source file may carry exactly that
    name (a half-pulled tree copied back to the share, say). Its landed copy
    and NAME's temporary then share one path: settle_landed() renames the
    one file over the other's temporary (or copier on_open's EEXIST handler
    unlinks the landed file), and the manifest describes a tree that is not
    on disk."""
    tmpname = ".stage-tmp." + xxh64_name("data.bin")
    src = make_tree(daemon.src_root / "ds", [
        F("data.bin", b"the real data\n" * 100),
        F(tmpname, b"an ordinary source file with an unlucky name\n"),
    ])
    dest = daemon.dest_of(src)
    cp = daemon.pull(src)
    assert cp.returncode == 0, cp.stderr
    assert manifest_path(dest).is_file()
    # The contract: a tree with a manifest matches it, and it is the source.
    check_manifest_against(dest, dest)
    assert_tree_equal(src, dest)


def test_unprivileged_repull_of_read_only_top_directory(nobody_base, make_daemon):
    """pull.c do_dir() makes each existing destination directory owner-writable
    before a non-root daemon works in it, but never the top one, and finish()
    gives the top the source's mode. A dataset whose top directory is 0555
    (common on shared storage) therefore stages once, and every later pull
    that has to add, replace or remove a top-level name fails with EACCES."""
    d = make_daemon(base=nobody_base / "d", user=NOBODY)
    src = make_tree(d.src_root / "ds", [F("a.txt", b"a\n"), F("sub/b.txt", b"b\n")])
    os.chmod(src, 0o555)
    dest = d.dest_of(src)
    cp = d.pull(src)
    assert cp.returncode == 0, cp.stderr
    os.chmod(src, 0o755)
    (src / "new.txt").write_bytes(b"new\n")
    os.chmod(src, 0o555)
    cp = d.pull(src)
    os.chmod(src, 0o755)
    assert cp.returncode == 0, f"re-pull failed: {cp.stdout} {cp.stderr}"
    assert_tree_equal(src, dest, check_owner=False)  # a non-root daemon cannot chown


def test_unprivileged_repull_removes_read_only_subtree(nobody_base, make_daemon):
    """pull.c do_entry() -> treeops_remove() for a name the source no longer
    has: a non-root daemon cannot unlink inside a 0555 directory it staged
    itself, so once a dataset drops a read-only directory every re-pull fails
    ("remove: Permission denied") and the tree never gets a manifest again."""
    d = make_daemon(base=nobody_base / "d", user=NOBODY)
    src = make_tree(d.src_root / "ds", [F("keep.txt", b"k\n"), F("ro/inner.txt", b"i\n"),
                                        D("ro", mode=0o555)])
    dest = d.dest_of(src)
    cp = d.pull(src)
    assert cp.returncode == 0, cp.stderr
    os.chmod(src / "ro", 0o755)
    (src / "ro" / "inner.txt").unlink()
    (src / "ro").rmdir()
    cp = d.pull(src)
    assert cp.returncode == 0, f"re-pull failed: {cp.stdout} {cp.stderr}"
    assert_tree_equal(src, dest, check_owner=False)  # a non-root daemon cannot chown


def test_failed_pull_verify_leaves_no_manifest(nobody_base, make_daemon):
    """pull.c pull_run(): with --verify, the manifest is renamed into place
    by pull_pass() *before* verify_tree() runs, and verify_tree's drop_bad()
    then unlinks every file it finds bad. When the second pass fails too, the
    job reports failure but leaves DEST/.stage/manifest in place for a tree
    that no longer holds the files it lists (contract §5/§6: the manifest's
    presence means complete).

    Made deterministic with a file a non-root daemon can read in the source
    (through the "other" bits) but not in its own copy (it owns the copy,
    and the owner bits are 0)."""
    d = make_daemon(base=nobody_base / "d", user=NOBODY)
    src = make_tree(d.src_root / "ds", [F("ok.txt", b"ok\n"),
                                        F("others-only.bin", b"x" * 5000, mode=0o044,
                                          owner=(1234, 1234))])
    dest = d.dest_of(src)
    cp = d.pull(src, "--verify")
    if cp.returncode == 0:
        check_manifest_against(dest, src)
        return
    assert not manifest_path(dest).exists(), \
        f"pull --verify failed ({cp.stderr.strip()!r}) but left a manifest; tree: " \
        f"{sorted(os.listdir(dest))}"


def test_adoption_failure_falls_back_to_copying(nobody_base, make_daemon):
    """pull.c on_copied(): when hashing a landed-but-unjournaled copy in place
    fails for a reason of the destination copy, the comment says "copy it
    after all", but the entry is only marked failed. The next pull adopts
    (and fails) again, so the tree can never be completed: every pull exits 1.

    The state is the one kill -9 leaves between settle_landed()'s rename and
    the journal flush; it is made here by removing the manifest of a
    finished pull. The copy is unreadable to the (non-root) daemon that owns
    it because its owner bits are 0, while the source is readable to it
    through the "other" bits."""
    d = make_daemon(base=nobody_base / "d", user=NOBODY)
    src = make_tree(d.src_root / "ds", [F("ok.txt", b"ok\n"),
                                        F("others-only.bin", b"x" * 5000, mode=0o044,
                                          owner=(1234, 1234))])
    dest = d.dest_of(src)
    cp = d.pull(src)
    assert cp.returncode == 0, cp.stderr
    manifest_path(dest).unlink()           # as if killed before the journal said so
    for attempt in range(2):
        cp = d.pull(src)
        assert cp.returncode == 0, f"re-pull {attempt + 1} failed: {cp.stderr.strip()}"
    assert_tree_equal(src, dest, check_owner=False)  # a non-root daemon cannot chown


def test_prev_manifest_not_trusted_for_a_copy_replaced_by_a_killed_pull(daemon):
    """pull.c reusable(): an entry of manifest.prev is trusted when the
    *source* still has its size and mtime and the destination has a file of
    that name; the destination copy is not looked at. A pull killed after
    settle_landed() renamed a new version into place but before retire()
    journaled it (renamed entries wait behind the window's head, so this
    window is as long as the slowest file ahead of them) leaves exactly that:
    manifest.prev says v1, the file is v2, nothing says so. If the source is
    then back at v1 with v1's mtime (a snapshot rollback, a re-extracted
    tarball), the next pull records v1's digest for v2's bytes.

    The killed pull's state is built by hand: manifest moved to
    manifest.prev (pull_pass does that first), v2 under the final name with
    its own size and mtime, no journal entry."""
    src = make_tree(daemon.src_root / "ds", [F("a.bin", b"version one\n"), F("b.txt", b"b\n")])
    dest = daemon.dest_of(src)
    assert daemon.pull(src).returncode == 0
    stage = dest / ".stage"
    os.rename(stage / "manifest", stage / "manifest.prev")
    (dest / "a.bin").write_bytes(b"version two, longer\n")
    os.utime(dest / "a.bin", ns=(2_000_000_000_000_000_000, 2_000_000_000_000_000_000))
    cp = daemon.pull(src)
    assert cp.returncode == 0, cp.stderr
    check_manifest_against(dest, dest)     # the manifest describes what is on disk
    assert_tree_equal(src, dest)


@pytest.mark.timeout(180)
def test_root_daemon_dir_metadata_does_not_follow_swapped_symlink(make_daemon, tmp_path):
    """pull.c apply_meta() sets a directory's owner, mode and times by its
    relative *path* from the destination root (fchownat/fchmodat/utimensat
    on DEST/"a/sub"); only the last component is protected, and fchmodat
    not even that. A root daemon gives staged directories their source
    owner, so that owner can, while a pull runs, replace the staged
    directory "a" by a symlink; close_dirs_until() (or pass_teardown() on
    the failure this causes) then chowns and chmods whatever "a/sub" now
    names, outside stage_root: here a root-owned 0600 file."""
    if not IS_ROOT:
        pytest.skip("needs root: a root daemon chowning")
    d = make_daemon(transfer={"files_in_flight": "1", "io_size": "64KiB", "memory": "1MiB"})
    entries = [F(f"a/sub/f{i:05}.bin", size=20000) for i in range(4000)]
    entries += [D("a/sub", mode=0o777, owner=(1234, 1234)), D("a", owner=(1234, 1234))]
    src = make_tree(d.src_root / "ds", entries)
    dest = d.dest_of(src)
    outside = tmp_path / "outside"
    outside.mkdir()
    canary = outside / "sub"
    canary.write_bytes(b"root's file\n")
    os.chmod(canary, 0o600)
    before = os.stat(canary)

    proc = d.popen("pull", src)
    # As the owner of the staged "a" could: wait until the pull works in
    # a/sub, then swap "a" for a symlink.
    wait_for(lambda: (dest / "a" / "sub").is_dir() and len(os.listdir(dest / "a" / "sub")) > 20,
             60, "the pull to work in a/sub")
    os.rename(dest / "a", dest / "a.moved")
    os.symlink(outside, dest / "a")
    proc.wait(120)
    after = os.stat(canary)
    changed = [what for what, x, y in [("owner", (before.st_uid, before.st_gid), (after.st_uid, after.st_gid)),
                                       ("mode", stat.S_IMODE(before.st_mode), stat.S_IMODE(after.st_mode)),
                                       ("mtime", before.st_mtime_ns, after.st_mtime_ns)] if x != y]
    assert not changed, f"the pull changed {changed} of {canary}, outside stage_root: " \
        f"now {after.st_uid}:{after.st_gid} {stat.S_IMODE(after.st_mode):o}"


def test_mtime_beyond_int64_nanoseconds(daemon):
    """walk.c attr_from_statx()/pull.c mtime_ns()/copier.c stat_mtime_ns():
    tv_sec * 1000000000 overflows int64 (undefined behaviour) for mtimes
    after 2262-04-11, which ext4 and xfs store (up to 2446). The wrapped
    value is recorded and given to the copy, so the staged file gets a date
    in 1677 and the pull still reports success. Such a file should be
    refused with a message naming it (the manifest's mtime is int64 ns)."""
    src = make_tree(daemon.src_root / "ds", [F("ok.txt", b"ok\n"), F("year-2300.txt", b"far\n")])
    t = 10_413_792_000                      # 2300-01-01, in seconds
    os.utime(src / "year-2300.txt", (t, t))
    dest = daemon.dest_of(src)
    cp = daemon.pull(src)
    if cp.returncode != 0:
        assert "year-2300.txt" in cp.stdout + cp.stderr, cp.stderr
        return
    assert os.stat(dest / "year-2300.txt").st_mtime == os.stat(src / "year-2300.txt").st_mtime, \
        f"staged copy dated {time.ctime(os.stat(dest / 'year-2300.txt').st_mtime)}"


@pytest.mark.timeout(120)
def test_client_that_stops_reading_cannot_wedge_a_job(daemon):
    """job.c send_or_hang_up() -> msg_send(): a blocking sendmsg on the
    client's socket with no send timeout (ctl.c sets only SO_RCVTIMEO). A
    client that stops reading (suspended with Ctrl-Z, or stuck writing its
    own output) while the job has more notes to send than the socket
    buffers hold blocks the job thread inside send: job_cancelled() is never
    reached, the pull keeps its lock, and SIGTERM cannot stop it (the daemon
    waits its 30 s grace and exits with the job still running)."""
    src = daemon.src_root / "ds"
    src.mkdir()
    for i in range(12000):                 # one "skipped ... not a regular file" note each
        os.mkfifo(src / f"fifo-with-a-long-enough-name-{i:05}")
    # The client's stderr is a pipe nobody reads: once it is full the client
    # stops reading the socket, as a suspended client would.
    proc = subprocess.Popen(daemon.cmd("pull", src), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(5)
        t0 = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        try:
            daemon.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        took = time.monotonic() - t0
    finally:
        proc.kill()                        # the job's send fails now: the daemon can exit
        proc.wait(60)
        proc.stderr.close()
        try:
            daemon.proc.wait(40)
            daemon.runs[-1][1] = "term"
        except subprocess.TimeoutExpired:
            pass
    assert took < 10, f"staged still running {took:.0f} s after SIGTERM: a job is stuck in send()"


def test_destination_inside_another_staged_tree_is_refused(daemon):
    """roots.c roots_pull()/pull.c take_destination(): a --to inside an
    existing staged tree is accepted (only "exists, not empty, no .stage/" is
    refused, and the lock is per tree). The inner pull then changes the outer
    tree behind its manifest, which no longer matches it, and the outer
    tree's next pull mirrors the inner staged tree (its manifest included)
    away. The reverse nesting is refused already."""
    outer = make_tree(daemon.src_root / "outer", [F("a.txt", b"a\n")])
    other = make_tree(daemon.src_root / "other", [F("b.txt", b"b\n")])
    dest = daemon.dest_of(outer)
    assert daemon.pull(outer).returncode == 0
    cp = daemon.pull(other, "--to", dest / "inner")
    if cp.returncode != 0:
        return                                            # refused: fine
    v = daemon.run("verify", dest)
    assert v.returncode == 0, f"the inner pull broke the outer tree's manifest: {v.stdout} {v.stderr}"


def test_status_while_jobs_start(make_daemon):
    """job.c jobs_status() formats j->what under the registry lock, but
    pull_run() and verify_run() rewrite j->what (snprintf) on the job's
    thread without it, after job_begin() published the job: a data race
    with every `stage status`. A plain build cannot see it; under
    ThreadSanitizer (CFLAGS=-fsanitize=thread, run with STAGE_BUILD=that
    build) the daemon's log reports it and the fixture fails the test."""
    d = make_daemon(transfer={"files_in_flight": "2"})
    src = make_tree(d.src_root / "ds", [F(f"d/f{i:04}", size=3000) for i in range(1500)])
    stop = []

    def poll():
        while not stop:
            d.status()

    t = threading.Thread(target=poll)
    t.start()
    try:
        for _ in range(3):
            assert d.pull(src).returncode == 0
            assert d.run("verify", d.dest_of(src), "--deep").returncode == 0
    finally:
        stop.append(1)
        t.join()
