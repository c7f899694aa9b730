"""Paths that try to leave the roots are refused (exit 2) and nothing is written."""
import ctypes
import os
import shutil
import stat
import threading
from pathlib import Path

import pytest

from helpers import (SECRET, F, L, assert_tree_equal, ckpt, commit_wait, json_result, make_outside,
                     make_tree, snapshot, walk)
from helpers import IS_ROOT, D, wait_for


def setup_escape_world(d):
    """src_root/ds (legit), outside/ds (forbidden), a sibling whose name
    extends the root's, symlinks inside the root pointing out, and a symlink
    inside stage_root pointing out."""
    base = d.base
    make_outside(base)
    make_tree(d.src_root / "ds", [F("ok.txt", b"ok\n")])
    make_tree(Path(f"{d.src_root}-evil") / "ds", [F("evil.txt", SECRET)])
    os.symlink(base / "outside/ds", d.src_root / "link_out")
    os.symlink(base / "outside", d.src_root / "dirlink_out")
    (base / "elsewhere").mkdir()
    os.symlink(base / "elsewhere", d.stage_root / "out")
    return base


def watched(d):
    """Everything a refused pull must leave alone (not the daemon's log or state)."""
    return {str(p): snapshot(p) for p in [d.src_root, Path(f"{d.src_root}-evil"), d.stage_root,
                                          d.base / "outside", d.base / "elsewhere"]}


SRC_CASES = {
    "outside_roots": lambda d: [d.base / "outside/ds"],
    "sibling_with_root_as_prefix": lambda d: [f"{d.src_root}-evil/ds"],
    "dotdot_climbing_out": lambda d: [f"{d.src_root}/ds/../../outside/ds"],
    "dotdot_to_etc": lambda d: [f"{d.src_root}/ds/../../../../../../../../etc"],
    "symlink_src_pointing_out": lambda d: [d.src_root / "link_out"],
    "symlinked_parent_pointing_out": lambda d: [d.src_root / "dirlink_out/ds"],
    "missing_src": lambda d: [d.src_root / "no-such-dir"],
    "src_is_a_file": lambda d: [d.src_root / "ds/ok.txt"],
    "to_outside_stage_root": lambda d: [d.src_root / "ds", "--to", d.base / "elsewhere/x"],
    "to_dotdot_climbing_out": lambda d: [d.src_root / "ds", "--to", f"{d.stage_root}/../elsewhere/x"],
    "to_through_symlink_out": lambda d: [d.src_root / "ds", "--to", d.stage_root / "out/x"],
    "to_sibling_with_root_as_prefix": lambda d: [d.src_root / "ds", "--to", f"{d.stage_root}-evil/x"],
    # A mirror into stage_root itself would delete every other staged dataset.
    "to_stage_root_itself": lambda d: [d.src_root / "ds", "--to", d.stage_root],
}


@pytest.mark.parametrize("case", sorted(SRC_CASES))
def test_escape_refused(daemon, case):
    setup_escape_world(daemon)
    before = watched(daemon)
    args = SRC_CASES[case](daemon)
    cp = daemon.pull(*args)
    assert cp.returncode == 2, f"exit {cp.returncode}, stdout {cp.stdout!r}, stderr {cp.stderr!r}"
    assert cp.stderr.strip(), "a refusal must say why"
    assert watched(daemon) == before, "a refused pull changed something on disk"
    assert not Path(f"{daemon.stage_root}-evil").exists()
    daemon.assert_serving()


def test_relative_src_outside_roots_refused(daemon):
    base = setup_escape_world(daemon)
    before = watched(daemon)
    cp = daemon.run("pull", "ds", cwd=base / "outside")
    assert cp.returncode == 2, cp
    assert watched(daemon) == before


def test_refusal_in_json(daemon):
    base = setup_escape_world(daemon)
    cp = daemon.pull(base / "outside/ds", json=True)
    assert cp.returncode == 2
    res, _ = json_result(cp.stdout)
    assert res["code"] == 2 and res["text"], res


def test_symlinks_inside_tree_are_copied_not_followed(daemon):
    base = daemon.base
    out = make_outside(base)
    before_out = snapshot(out)
    src = make_tree(daemon.src_root / "ds", [
        F("real.txt", b"real\n"),
        L("to_file", str(out / "secret.txt")),
        L("to_dir", str(out)),
        L("rel_to_dir", "../../outside"),
        L("rel_to_file", "../../outside/ds/secret2.txt"),
    ])
    cp = daemon.pull(src)
    assert cp.returncode == 0, cp.stderr
    dest = daemon.dest_of(src)
    assert_tree_equal(src, dest)
    for rel, st in walk(dest).items():
        assert not stat.S_ISDIR(st.st_mode), f"{rel!r}: a link was followed (the tree has no directories)"
        if stat.S_ISREG(st.st_mode):
            assert SECRET not in (dest / rel).read_bytes(), f"outside content copied into {rel!r}"
    assert snapshot(out) == before_out


def _exchanger(a, b, stop):
    """Swaps the names a and b (a directory and a symlink) atomically, again
    and again, until stop is set: renameat2(RENAME_EXCHANGE)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                               ctypes.c_uint]
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    n = 0
    while not stop.is_set():
        if libc.renameat2(AT_FDCWD, bytes(a), AT_FDCWD, bytes(b), RENAME_EXCHANGE) == 0:
            n += 1
    return n


@pytest.mark.timeout(120)
def test_symlink_swapped_in_during_resolution_is_not_followed(daemon):
    """A source-root owner swaps a directory on the source path for a symlink
    pointing out, thousands of times a second, while pulls of that path run:
    the check on the path and the open of it are one step (beneath the root,
    no symlink on the way), so every pull copies the real tree or is refused;
    none ever copies what the symlink points at."""
    base = daemon.base
    make_outside(base)
    make_tree(daemon.src_root / "a" / "ds", [F("ok.txt", b"ok\n")])
    os.symlink(base / "outside", daemon.src_root / "b")
    stop = threading.Event()
    swaps = []
    t = threading.Thread(target=lambda: swaps.append(_exchanger(daemon.src_root / "a",
                                                                 daemon.src_root / "b", stop)))
    t.start()
    outcomes = {"copied": 0, "refused": 0}
    try:
        for i in range(150):
            dest = daemon.stage_root / f"try{i}"
            cp = daemon.pull(daemon.src_root / "a" / "ds", "--to", dest)
            if cp.returncode == 0:
                outcomes["copied"] += 1
                got = sorted(p.name for p in dest.iterdir() if p.name != ".stage")
                assert got == ["ok.txt"], f"pull {i} copied {got} (followed the swapped-in link)"
            else:
                assert cp.returncode == 2 and cp.stderr.strip(), cp
                outcomes["refused"] += 1
                outcomes["changed"] = outcomes.get("changed", 0) + ("changed while" in cp.stderr)
            for p in dest.rglob("*") if dest.exists() else []:
                if p.is_file():
                    assert SECRET not in p.read_bytes(), f"pull {i}: outside content in {p}"
    finally:
        stop.set()
        t.join()
    assert swaps[0] > 1000, f"only {swaps[0]} swaps: the race was not exercised"
    # Some pulls must have been checked as the real tree and found the link
    # at the open: the case realpath alone got wrong.
    assert outcomes["copied"] and outcomes.get("changed"), outcomes
    daemon.assert_serving()


@pytest.mark.timeout(180)
def test_restore_does_not_follow_a_job_dir_swapped_for_a_link(make_cluster):
    """The owner of ckpt_root/JOB swaps it for a symlink pointing out while
    restores of JOB/STEP run: each restore writes beneath ckpt_root or
    refuses; nothing is ever created where the link points."""
    n0, n1 = make_cluster(2, transfer={"watch": "off"})
    step = make_tree(ckpt(n0, step="step-1"), [F("w.bin", size=64 * 1024)])
    commit_wait(n0, step)
    out = n0.base / "outside"
    out.mkdir()
    job = step.parent
    real = os.open(job, os.O_RDONLY | os.O_DIRECTORY)   # follows the real dir through swaps
    os.symlink(out, job.parent / "evil")
    shutil.rmtree(step)
    stop = threading.Event()
    swaps = []
    t = threading.Thread(target=lambda: swaps.append(_exchanger(job, job.parent / "evil", stop)))
    t.start()
    restored = refused = caught = 0
    try:
        for i in range(25):
            cp = n0.run("restore", str(step), timeout=60)
            assert not list(out.iterdir()), f"restore {i} wrote outside ckpt_root: {list(out.iterdir())}"
            if cp.returncode == 0:
                restored += 1
            else:
                assert cp.stderr.strip(), cp
                refused += 1
                if "where a directory belongs" in cp.stderr:
                    caught += 1
                    assert cp.returncode == 2, cp       # a refusal, like a path outside
            if "step-1" in os.listdir(real):
                shutil.rmtree("step-1", dir_fd=real)
    finally:
        stop.set()
        t.join()
        os.close(real)
    assert swaps[0] > 100, f"only {swaps[0]} swaps: the race was not exercised"
    # Some restores were checked as the real JOB and met the link when they
    # opened it: the case a path-string check alone got wrong.
    assert restored and caught, (restored, refused, caught)
    n0.assert_serving()


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
