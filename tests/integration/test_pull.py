"""stage pull: exact copies, the manifest, the xxhsum export, mirror re-pulls."""
import os
import re
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers import (CHUNK, IS_ROOT, SECRET, D, F, L, assert_tree_equal, check_manifest_against,
                     escape, inodes, json_result, last_line, make_outside, make_tree, manifest_path,
                     messy_entries, parse_manifest, simple_entries, snapshot, temporaries, walk,
                     xxh128_file)
from conftest import NOBODY


def staged_messy(daemon, newline_names=True):
    outside = make_outside(daemon.base)
    src = make_tree(daemon.src_root / "ds", messy_entries(outside, newline_names))
    return src, daemon.dest_of(src)


def test_messy_tree_is_copied_exactly(daemon):
    src, dest = staged_messy(daemon)
    before = snapshot(src)
    cp = daemon.pull(src)
    assert cp.returncode == 0, cp.stderr
    assert last_line(cp.stdout) == str(dest)
    assert_tree_equal(src, dest)
    assert manifest_path(dest).is_file()
    assert temporaries(dest) == []
    assert snapshot(src) == before, "the source was modified by a pull"
    # Links pointing outside were copied as links, never followed.
    for rel, st in walk(dest).items():
        if stat.S_ISREG(st.st_mode):
            assert SECRET not in Path(dest, rel).read_bytes(), f"{rel!r} holds the outside file's content"
    assert os.readlink(dest / "links/abs_out") == str(daemon.base / "outside/secret.txt")


def test_manifest_describes_source(daemon):
    src, dest = staged_messy(daemon)
    cp = daemon.pull(src, json=True)
    assert cp.returncode == 0, cp.stderr
    res, _ = json_result(cp.stdout)
    m = check_manifest_against(dest, src)
    assert res["root"].lower() == m.root
    # Names travel escaped: the odd ones appear in the text only as %XX.
    text = manifest_path(dest).read_bytes()
    for raw in [b"new\nline.txt", b"100%.txt", b"bad-\xff\xfe-bytes.bin", "数据集".encode()]:
        assert escape(raw) in text, f"{raw!r} not escaped as the contract says"
    # `stage manifest` prints it: every content digest is there.
    cp = daemon.run("manifest", dest)
    assert cp.returncode == 0, cp.stderr
    for e in m.entries.values():
        if e.type == "f":
            assert e.digest in cp.stdout.lower(), f"digest of {e.path!r} missing from `stage manifest`"


def test_xxhsum_export_is_accepted_by_xxhsum(daemon, tmp_path):
    src, dest = staged_messy(daemon, newline_names=False)
    assert daemon.pull(src).returncode == 0
    cp = subprocess.run(daemon.cmd("manifest", dest, "--xxhsum"), capture_output=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    sums = tmp_path / "sums.xxh128"
    sums.write_bytes(cp.stdout)
    chk = subprocess.run(["xxhsum", "-H2", "-c", str(sums)], cwd=dest, capture_output=True, timeout=60)
    assert chk.returncode == 0, (chk.stdout + chk.stderr).decode(errors="replace")
    # Every regular file is named, with the digest of its source.
    listed = {}
    for line in cp.stdout.split(b"\n"):
        if line:
            h, _, name = line.partition(b"  ")
            listed[os.fsdecode(name)] = h.decode().lower()
    files = [r for r, st in walk(src).items() if stat.S_ISREG(st.st_mode)]
    for rel in files:
        assert listed.get(rel) == xxh128_file(src / rel), f"{rel!r} not exported correctly"
    # The check is real: damage one file and xxhsum notices.
    with open(dest / "big/multi.bin", "r+b") as f:
        f.seek(5 * CHUNK + 3)
        f.write(b"\0\1\2")
    chk = subprocess.run(["xxhsum", "-H2", "-c", str(sums)], cwd=dest, capture_output=True, timeout=60)
    assert chk.returncode != 0


def test_xxhsum_export_skips_newline_names(daemon, tmp_path):
    src = make_tree(daemon.src_root / "ds", [
        F("plain.txt", b"plain\n"), F("with space.txt", b"sp\n"), F("new\nline.txt", b"nl\n")])
    dest = daemon.dest_of(src)
    assert daemon.pull(src).returncode == 0
    cp = subprocess.run(daemon.cmd("manifest", dest, "--xxhsum"), capture_output=True, timeout=60)
    assert cp.returncode == 1, "a name with a newline cannot be exported: exit 1 expected"
    assert cp.stderr.strip(), "no warning about the skipped name"
    sums = tmp_path / "sums.xxh128"
    sums.write_bytes(cp.stdout)
    chk = subprocess.run(["xxhsum", "-H2", "-c", str(sums)], cwd=dest, capture_output=True, timeout=60)
    assert chk.returncode == 0, (chk.stdout + chk.stderr).decode(errors="replace")
    assert cp.stdout.count(b"\n") == 2, cp.stdout


def test_repull_of_unchanged_tree_copies_nothing(daemon):
    src, dest = staged_messy(daemon)
    assert daemon.pull(src).returncode == 0
    root1 = parse_manifest(manifest_path(dest)).root
    ino1 = inodes(dest)
    cp = daemon.pull(src, json=True)
    assert cp.returncode == 0, cp.stderr
    res, _ = json_result(cp.stdout)
    assert res["code"] == 0
    assert res["files_copied"] == 0 and res["bytes_copied"] == 0 and res["files_removed"] == 0, res
    assert inodes(dest) == ino1, "a re-pull of an unchanged tree rewrote files"
    assert_tree_equal(src, dest)
    assert parse_manifest(manifest_path(dest)).root == root1


def test_repull_mirrors_changes_and_deletions(daemon):
    src = make_tree(daemon.src_root / "ds", simple_entries(n=15) + [
        F("gone/one", b"1"), F("gone/two", b"2"), F("keep/deep/k.txt", b"k\n")])
    dest = daemon.dest_of(src)
    assert daemon.pull(src).returncode == 0
    ino1 = inodes(dest)

    same_size = src / "d0/f000.bin"                         # same size, new content, new mtime
    data = bytearray(same_size.read_bytes())
    data[100] ^= 0xFF
    same_size.write_bytes(bytes(data))
    os.utime(same_size, ns=(1_700_000_000_000_000_001,) * 2)
    with open(src / "d1/f001.bin", "ab") as f:              # grows
        f.write(b"more bytes")
    (src / "d2/f002.bin").unlink()                          # deleted file
    for p in ["gone/one", "gone/two"]:                      # deleted directory
        (src / p).unlink()
    (src / "gone").rmdir()
    (src / "new.txt").write_bytes(b"new file\n")            # added
    (src / "newdir/sub").mkdir(parents=True)
    (src / "newdir/sub/n.bin").write_bytes(os.urandom(3 * CHUNK))
    changed = {"d0/f000.bin", "d1/f001.bin", "new.txt", "newdir/sub/n.bin"}

    cp = daemon.pull(src, json=True)
    assert cp.returncode == 0, cp.stderr
    res, _ = json_result(cp.stdout)
    assert_tree_equal(src, dest)
    assert not (dest / "gone").exists() and not (dest / "d2/f002.bin").exists()
    assert res["files_copied"] == len(changed), res
    assert res["files_removed"] >= 2, res              # d2/f002.bin and gone/ (counted as 1 or 3)
    ino2 = inodes(dest)
    for rel, ino in ino1.items():
        if rel in ino2 and rel not in changed:
            assert ino2[rel] == ino, f"unchanged {rel!r} was rewritten"
    check_manifest_against(dest, src)
    assert temporaries(dest) == []


def test_repull_applies_mode_change(daemon):
    src = make_tree(daemon.src_root / "ds", [F("a.txt", b"a\n"), F("b.txt", b"b\n"), D("sub"), F("sub/c", b"c")])
    dest = daemon.dest_of(src)
    assert daemon.pull(src).returncode == 0
    for p, mode in [("a.txt", 0o600), ("sub", 0o711)]:
        st = os.stat(src / p)
        os.chmod(src / p, mode)
        os.utime(src / p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert daemon.pull(src).returncode == 0
    assert_tree_equal(src, dest)
    check_manifest_against(dest, src)


def test_repull_follows_type_changes(daemon):
    src = make_tree(daemon.src_root / "ds", [
        F("was_file", b"f"), F("was_dir/inner", b"i"), F("was_link_target", b"t"),
        L("was_link", "was_link_target"), F("file_to_link", b"x")])
    dest = daemon.dest_of(src)
    assert daemon.pull(src).returncode == 0
    (src / "was_file").unlink()
    make_tree(src, [F("was_file/now_inside", b"now a dir")])
    (src / "was_dir/inner").unlink()
    (src / "was_dir").rmdir()
    (src / "was_dir").write_bytes(b"now a file")
    (src / "was_link").unlink()
    (src / "was_link").write_bytes(b"now a file too")
    (src / "file_to_link").unlink()
    os.symlink("was_link_target", src / "file_to_link")
    cp = daemon.pull(src)
    assert cp.returncode == 0, cp.stderr
    assert_tree_equal(src, dest)
    check_manifest_against(dest, src)


def test_pull_with_verify(daemon):
    src, dest = staged_messy(daemon)
    cp = daemon.pull(src, "--verify")
    assert cp.returncode == 0, cp.stderr
    assert last_line(cp.stdout) == str(dest)
    assert_tree_equal(src, dest)
    cp = daemon.pull(src, "--verify", json=True)   # again, nothing to copy, still verified
    assert cp.returncode == 0, cp.stderr
    assert json_result(cp.stdout)[0]["code"] == 0


def test_json_output(daemon):
    src = make_tree(daemon.src_root / "ds", simple_entries(n=30))
    dest = daemon.dest_of(src)
    files = [st for st in walk(src).values() if stat.S_ISREG(st.st_mode)]
    total = sum(st.st_size for st in files)
    cp = daemon.pull(src, json=True)
    assert cp.returncode == 0, cp.stderr
    res, events = json_result(cp.stdout)
    for ev in events:
        assert ev["event"] in ("progress", "note", "result"), ev
        if ev["event"] == "note":
            assert {"level", "kind", "path", "text"} <= ev.keys(), ev
    assert res["code"] == 0
    assert res["path"] == str(dest)
    assert res["files"] == len(files) and res["bytes"] == total, res
    assert res["files_copied"] == len(files) and res["bytes_copied"] == total, res
    assert res["files_removed"] == 0
    assert isinstance(res["elapsed_ms"], int) and res["elapsed_ms"] >= 0
    assert isinstance(res["text"], str)
    assert re.fullmatch(r"[0-9a-fA-F]{32}", res["root"]), res["root"]
    assert res["root"].lower() == parse_manifest(manifest_path(dest)).root


def test_root_digest_names_content(daemon):
    src = make_tree(daemon.src_root / "ds", simple_entries(n=8) + [L("ln", "top.bin")])
    a, b = daemon.stage_root / "copies/a", daemon.stage_root / "copies/b"
    assert daemon.pull(src, "--to", a).returncode == 0
    assert daemon.pull(src, "--to", b).returncode == 0
    ra, rb = (parse_manifest(manifest_path(p)).root for p in (a, b))
    assert ra == rb, "two copies of one tree have different root digests"
    os.utime(src / "d0/f000.bin", ns=(1_600_000_000_000_000_000,) * 2)   # mtime only
    assert daemon.pull(src, "--to", a).returncode == 0
    assert parse_manifest(manifest_path(a)).root == ra, "the root digest depends on an mtime"
    flip = src / "d1/f001.bin"
    st = os.stat(flip)
    data = bytearray(flip.read_bytes())
    data[0] ^= 1
    flip.write_bytes(bytes(data))
    os.utime(flip, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert daemon.pull(src, "--to", a).returncode == 0
    assert parse_manifest(manifest_path(a)).root != ra, "content changed, root digest did not"


def test_to_dest_relative_src_and_option_order(daemon):
    src = make_tree(daemon.src_root / "ds", simple_entries(n=5))
    to = daemon.stage_root / "custom/place"
    cp = daemon.run("pull", "--to", to, "ds", cwd=daemon.src_root)   # option first, SRC relative to cwd
    assert cp.returncode == 0, cp.stderr
    assert last_line(cp.stdout) == str(to)
    assert_tree_equal(src, to)
    cp = daemon.pull(f"{src}/")                                        # trailing slash: same default dest
    assert cp.returncode == 0, cp.stderr
    assert last_line(cp.stdout) == str(daemon.stage_root / "ds")
    assert_tree_equal(src, daemon.stage_root / "ds")
    cp = daemon.pull(daemon.src_root / "ds/../ds")                    # '..' that stays inside is fine
    assert cp.returncode == 0, cp.stderr
    assert last_line(cp.stdout) == str(daemon.stage_root / "ds")


def test_nested_src_and_second_source_root(make_daemon, tmp_path):
    roots = [tmp_path / "nfs1", tmp_path / "nfs2"]
    d = make_daemon(source_roots=roots)
    s1 = make_tree(roots[0] / "a/b/c", simple_entries(n=3))
    s2 = make_tree(roots[1] / "team/ds2", simple_entries(n=4))
    for s, want in [(s1, d.stage_root / "a/b/c"), (s2, d.stage_root / "team/ds2")]:
        cp = d.pull(s)
        assert cp.returncode == 0, cp.stderr
        assert last_line(cp.stdout) == str(want)
        assert_tree_equal(s, want)


def test_long_names_and_deep_paths(daemon):
    long = "L" * 251 + ".txt"                     # 255 bytes: a temporary cannot just add a prefix
    deep = "/".join(f"level{i:02}" for i in range(40))
    src = make_tree(daemon.src_root / "ds", [
        F(long, b"long name\n"), F(f"{deep}/bottom.bin", size=CHUNK + 7),
        F("u" * 60 + "/" + "é" * 127, b"254 bytes of UTF-8 name\n")])
    cp = daemon.pull(src)
    assert cp.returncode == 0, cp.stderr
    assert_tree_equal(src, daemon.dest_of(src))
    check_manifest_against(daemon.dest_of(src), src)


def test_special_mode_bits_and_extreme_mtimes(daemon):
    src = make_tree(daemon.src_root / "ds", [
        F("setuid-tool", b"#!/bin/sh\n", mode=0o4755),
        F("setgid-tool", b"#!/bin/sh\n", mode=0o2750),
        D("sticky", mode=0o1777),
        F("sticky/f", b"f"),
        F("before-1970", b"old\n", mtime_ns=-86_400_000_000_123),
        F("year-2200", b"future\n", mtime_ns=7_258_118_400_999_999_999),
        F("epoch", b"zero\n", mtime_ns=0),
    ])
    cp = daemon.pull(src)
    assert cp.returncode == 0, cp.stderr
    assert_tree_equal(src, daemon.dest_of(src))
    check_manifest_against(daemon.dest_of(src), src)


def test_concurrent_pulls(daemon):
    srcs = [make_tree(daemon.src_root / f"ds{i}", simple_entries(n=40, size=20_000), seed=i) for i in range(3)]
    results = {}

    def go(s):
        results[s] = daemon.pull(s, timeout=90)

    threads = [threading.Thread(target=go, args=(s,)) for s in srcs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    for s in srcs:
        assert results[s].returncode == 0, results[s].stderr
        assert_tree_equal(s, daemon.dest_of(s))


@pytest.mark.skipif(not IS_ROOT, reason="needs root: owners are preserved only when root")
def test_owners_preserved_as_root(daemon):
    src = make_tree(daemon.src_root / "ds", [
        F("o/f", b"f", owner=(2001, 3001)), D("o", owner=(2002, 3002)), L("o/l", "f", owner=(2003, 3003))])
    assert daemon.pull(src).returncode == 0
    dest = daemon.dest_of(src)
    for rel, ids in [("o/f", (2001, 3001)), ("o", (2002, 3002)), ("o/l", (2003, 3003))]:
        st = os.lstat(dest / rel)
        assert (st.st_uid, st.st_gid) == ids, rel


def test_concurrent_pulls_of_the_same_tree(daemon):
    src = make_tree(daemon.src_root / "ds", simple_entries(n=300, size=30_000))
    dest = daemon.dest_of(src)
    procs = [daemon.popen("pull", src) for _ in range(2)]
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(90))
        except subprocess.TimeoutExpired:
            p.kill()
            raise
    assert 0 in rcs and set(rcs) <= {0, 1, 2}, f"exit codes {rcs}: {[p.err_path.read_text() for p in procs]}"
    assert_tree_equal(src, dest)
    assert temporaries(dest) == []
    check_manifest_against(dest, src, digests=10)
    cp = daemon.run("verify", dest, "--deep")
    assert cp.returncode == 0, cp.stdout + cp.stderr


def test_special_files_do_not_hang_the_pull(daemon):
    src = make_tree(daemon.src_root / "ds", [F("a.txt", b"a\n"), F("z.txt", b"z\n")])
    os.mkfifo(src / "fifo")                      # opening it for reading would block forever
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(src / "sock"))
    cp = daemon.pull(src, timeout=30)
    assert cp.returncode in (0, 1), cp.stderr
    assert "fifo" in cp.stderr + cp.stdout, "a skipped entry must be named"
    dest = daemon.dest_of(src)
    for rel in ["a.txt", "z.txt"]:
        assert (dest / rel).read_bytes() == (src / rel).read_bytes()
    for rel in ["fifo", "sock"]:
        assert not (dest / rel).is_file(), f"{rel} became a regular file"
    assert temporaries(dest) == []
    daemon.assert_serving()


def test_directory_never_pulled_has_no_manifest(daemon):
    make_tree(daemon.src_root / "x", [F("f", b"f")])
    cp = daemon.run("manifest", daemon.src_root / "x")        # nothing staged there
    assert cp.returncode in (1, 2) and cp.stderr.strip()
    cp = daemon.run("verify", daemon.src_root / "x")
    assert cp.returncode in (1, 2) and (cp.stderr.strip() or cp.stdout.strip())


@pytest.mark.timeout(120)
def test_file_written_during_the_pull_is_named_with_advice(daemon):
    """A source file that grows while it is copied: the pull exits 1 naming
    it, "changed while it was copied; pull again when it is quiet" (not an
    I/O error), publishes no manifest; once it is quiet the next pull is
    whole."""
    src = daemon.src_root / "busy"
    src.mkdir()
    (src / "quiet.bin").write_bytes(os.urandom(100_000))
    grow = src / "grow.bin"
    grow.write_bytes(os.urandom(64 << 20))
    stop = threading.Event()

    def writer():
        with open(grow, "ab") as f:
            while not stop.is_set():
                f.write(os.urandom(4096))
                f.flush()
                time.sleep(0.001)

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(5):
            cp = daemon.pull(src)
            if cp.returncode != 0:
                break
    finally:
        stop.set()
        t.join()
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert re.search(r"^changed grow\.bin$", cp.stdout, re.M), cp.stdout
    assert f"1 file of {src} changed while it was copied (listed above); pull again when it is " \
           "quiet" in cp.stderr, cp.stderr
    assert "Stale file handle" not in cp.stdout + cp.stderr
    dest = daemon.dest_of(src)
    assert not (dest / ".stage" / "manifest").exists()
    cp = daemon.pull(src)
    assert cp.returncode == 0, cp.stderr
    assert (dest / "grow.bin").read_bytes() == grow.read_bytes()


def xxh64_name(name):
    """XXH3-64 of a name as entries.c's tmp_name() prints it (%016llx)."""
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
