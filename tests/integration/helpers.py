"""Helpers of the integration tests: building trees, comparing them, reading
manifests, digests with the real xxhsum. Nothing here fakes the product: the
tests run build/bin/staged and build/bin/stage on real files.

Paths are str; names that are not UTF-8 travel as surrogate escapes
(os.fsdecode), so a name with byte 0xff round-trips through os.* calls.
"""
import hashlib
import json
import os
import random
import re
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("STAGE_BUILD", REPO / "build"))
STAGED = BUILD / "bin" / "staged"
STAGE = BUILD / "bin" / "stage"

CHUNK = 64 * 1024            # chunk_size every test daemon is configured with
TMP_DIR = ".stage/tmp"      # temporaries of an in-flight pull live here, nowhere else
IS_ROOT = os.geteuid() == 0

SANITIZER_MARKERS = (
    "ERROR: AddressSanitizer",
    "ERROR: LeakSanitizer",
    "AddressSanitizer:DEADLYSIGNAL",
    "WARNING: ThreadSanitizer",
    "runtime error:",            # UBSan
)


def client_env(extra=None):
    """The environment for stage: no STAGE_SOCKET from the caller's shell, and no
    SLURM_JOB_NODELIST of a job the tests may run inside (doctor, resume and
    verify --cluster would take it for the nodes to check)."""
    env = dict(os.environ)
    env.pop("STAGE_SOCKET", None)
    env.pop("SLURM_JOB_NODELIST", None)
    env.update(extra or {})
    return env


def sanitizer_report(text):
    """The first line of a sanitizer report in text, or None."""
    for line in text.splitlines():
        if any(m in line for m in SANITIZER_MARKERS):
            return line
    return None


def wait_for(pred, timeout, what, interval=0.01):
    """Polls pred() until it returns something true; returns that value."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------- trees

@dataclass
class F:
    """A regular file: data given, or size random bytes from the tree's seed."""
    path: str
    data: bytes = None
    size: int = None
    mode: int = 0o644
    mtime_ns: int = None
    owner: tuple = None      # (uid, gid), applied only when root


@dataclass
class D:
    path: str
    mode: int = 0o755
    mtime_ns: int = None
    owner: tuple = None


@dataclass
class L:
    path: str
    target: str
    mtime_ns: int = None
    owner: tuple = None


MTIME_BASE = 1_650_000_000_123_456_789   # nanoseconds that are not a multiple of anything


def make_tree(root, entries, seed=1):
    """Creates root and the entries beneath it with exact modes, owners and
    mtimes (ns). Parents are created as needed. Metadata is applied after all
    content exists, directories deepest first, so creating a child never
    disturbs a directory's mtime. Returns root as a Path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    dirs = []
    for i, e in enumerate(entries):
        p = os.path.join(root, e.path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if e.mtime_ns is None:
            e.mtime_ns = MTIME_BASE + i * 1_000_003_001
        if isinstance(e, D):
            os.makedirs(p, exist_ok=True)
            dirs.append(e)
        elif isinstance(e, F):
            data = e.data if e.data is not None else rng.randbytes(e.size or 0)
            with open(p, "wb") as f:
                f.write(data)
        elif isinstance(e, L):
            os.symlink(e.target, p)
        else:
            raise TypeError(e)
    for e in entries:
        p = os.path.join(root, e.path)
        if isinstance(e, F):
            if e.owner and IS_ROOT:
                os.chown(p, *e.owner)
            os.chmod(p, e.mode)
            os.utime(p, ns=(e.mtime_ns, e.mtime_ns))
        elif isinstance(e, L):
            if e.owner and IS_ROOT:
                os.lchown(p, *e.owner)
            os.utime(p, ns=(e.mtime_ns, e.mtime_ns), follow_symlinks=False)
    # Directories that were only implied get a fixed mtime too, deepest first.
    explicit = {os.path.normpath(d.path): d for d in dirs}
    implied = set()
    for e in entries:
        parent = os.path.dirname(os.path.normpath(e.path))
        while parent:
            implied.add(parent)
            parent = os.path.dirname(parent)
    for rel in sorted(set(explicit) | implied, key=lambda r: -r.count("/")):
        p = os.path.join(root, rel)
        d = explicit.get(rel)
        if d and d.owner and IS_ROOT:
            os.chown(p, *d.owner)
        os.chmod(p, d.mode if d else 0o755)
        t = d.mtime_ns if d else MTIME_BASE - 7_777_777_777
        os.utime(p, ns=(t, t))
    return root


def messy_entries(outside, newline_names=True):
    """The issue's messy tree: nested and empty dirs, empty files, a file of
    many chunks and chunk-edge sizes, symlinks (inside, dangling, pointing
    outside, odd targets), names with spaces, newlines, UTF-8, '%', 0xff and
    control bytes, modes 0600/0755/0444/0700/0555, and other owners when
    root. `outside` is a directory outside the source root holding
    secret.txt; links point at it and must be copied as links."""
    odd = os.fsdecode(b"bad-\xff\xfe-bytes.bin")
    e = [
        F("top.txt", b"hello stage\n"),
        F("empty", b""),
        F("sub/empty2", b""),
        D("emptydir"),
        F("a/b/c/d/e/deep.txt", b"deep\n"),
        F("a/b/sibling.bin", size=3000),
        F("big/multi.bin", size=21 * CHUNK + 12345),
        F("big/exact.bin", size=CHUNK),
        F("big/chunk_plus_one.bin", size=CHUNK + 1),
        F("big/chunk_minus_one.bin", size=CHUNK - 1),
        F("dir with spaces/file with spaces.txt", b"spaces\n"),
        F(" leading space", b"lead\n"),
        F("trailing space ", b"trail\n"),
        F("数据集/ファイル-ü.txt", "utf-8 ✓\n".encode()),
        F("émoji-🙂.bin", size=777),
        F("100%.txt", b"percent\n"),
        F("%41%42", b"not AB\n"),
        F("pct%dir/x", b"x\n"),
        F(odd, size=4096),
        F("tab\tname", b"tab\n"),
        F("ctrl-\x01-\x7f", b"ctrl\n"),
        F("-leading-dash", b"dash\n"),
        F(".hidden", b"hidden\n"),
        F("sub/.stage", b"a .stage below the top is ordinary data\n"),
        F("sub/file.txt", b"file\n"),
        F("private.key", b"secret key\n", mode=0o600),
        F("run.sh", b"#!/bin/sh\necho hi\n", mode=0o755),
        F("readonly.txt", b"ro\n", mode=0o444),
        F("odd-mode", b"odd\n", mode=0o640),
        D("privdir", mode=0o700),
        F("privdir/inner", b"inner\n", mode=0o600),
        F("rodir/inside.txt", b"inside a read-only dir\n"),
        D("rodir", mode=0o555),
        L("links/rel", "../sub/file.txt"),
        L("links/dir", "../a/b"),
        L("links/dangling", "does/not/exist"),
        L("links/self", "self"),
        L("links/abs_out", os.path.join(outside, "secret.txt")),
        L("links/rel_out", "../../../outside/secret.txt"),
        L("links/dir_out", str(outside)),
        L("links/space target", "../dir with spaces/file with spaces.txt"),
        L("links/odd target", os.fsdecode(b"%\xff x")),
        F("owned/file", b"owned\n", owner=(1234, 5678)),
        D("owned", owner=(4321, 8765)),
        L("owned/link", "file", owner=(1111, 2222)),
    ]
    if newline_names:
        e += [
            F("new\nline.txt", b"newline in the name\n"),
            F("dir\nwith nl/inner.txt", b"inner\n"),
        ]
    return e


def make_outside(base):
    """A directory outside every root, with content that must never be copied."""
    out = Path(base) / "outside"
    out.mkdir(parents=True, exist_ok=True)
    (out / "secret.txt").write_bytes(SECRET)
    (out / "ds").mkdir(exist_ok=True)
    (out / "ds" / "secret2.txt").write_bytes(SECRET)
    return out


SECRET = b"OUTSIDE-SECRET-4a7f9e: this must never be staged\n"


def simple_entries(n=12, size=2000):
    """Small regular-files-and-dirs tree."""
    e = []
    for i in range(n):
        e.append(F(f"d{i % 3}/f{i:03}.bin", size=size + i))
    e.append(F("top.bin", size=CHUNK * 3 + 5))
    return e


# ---------------------------------------------------------------- walking and comparing

def walk(top, skip_top_stage=True, live=False):
    """{rel: lstat} for everything beneath top; links are never followed.
    The top-level .stage is skipped unless asked. live: the tree is being
    written while we look, so entries may vanish between readdir and stat
    (they are left out)."""
    out = {}

    def rec(d, prefix):
        try:
            it = os.scandir(d)
        except FileNotFoundError:
            if live:
                return
            raise
        with it:
            for ent in it:
                if not prefix and skip_top_stage and ent.name == ".stage":
                    continue
                rel = prefix + ent.name
                try:
                    st = ent.stat(follow_symlinks=False)
                except FileNotFoundError:
                    if live:
                        continue
                    raise
                out[rel] = st
                if stat.S_ISDIR(st.st_mode):
                    rec(ent.path, rel + "/")

    rec(os.fspath(top), "")
    return out


def same_content(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x = fa.read(1 << 20)
            y = fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def tree_diff(src, dst, check_owner=None):
    """Differences between two trees (content and metadata: type, mode,
    mtime_ns, size, symlink target, owner when root), skipping the top-level
    .stage of either. Empty list: equal."""
    if check_owner is None:
        check_owner = IS_ROOT
    a, b = walk(src), walk(dst)
    diffs = [f"missing in dest: {r!r}" for r in sorted(a.keys() - b.keys())]
    diffs += [f"extra in dest: {r!r}" for r in sorted(b.keys() - a.keys())]
    for rel in sorted(a.keys() & b.keys()):
        s, d = a[rel], b[rel]
        if stat.S_IFMT(s.st_mode) != stat.S_IFMT(d.st_mode):
            diffs.append(f"type differs: {rel!r} {stat.filemode(s.st_mode)} vs {stat.filemode(d.st_mode)}")
            continue
        if not stat.S_ISLNK(s.st_mode) and stat.S_IMODE(s.st_mode) != stat.S_IMODE(d.st_mode):
            diffs.append(f"mode differs: {rel!r} {stat.S_IMODE(s.st_mode):o} vs {stat.S_IMODE(d.st_mode):o}")
        if s.st_mtime_ns != d.st_mtime_ns:
            diffs.append(f"mtime_ns differs: {rel!r} {s.st_mtime_ns} vs {d.st_mtime_ns}")
        if check_owner and (s.st_uid, s.st_gid) != (d.st_uid, d.st_gid):
            diffs.append(f"owner differs: {rel!r} {s.st_uid}:{s.st_gid} vs {d.st_uid}:{d.st_gid}")
        if stat.S_ISREG(s.st_mode):
            if s.st_size != d.st_size:
                diffs.append(f"size differs: {rel!r} {s.st_size} vs {d.st_size}")
            elif not same_content(os.path.join(src, rel), os.path.join(dst, rel)):
                diffs.append(f"content differs: {rel!r}")
        elif stat.S_ISLNK(s.st_mode):
            ta, tb = os.readlink(os.path.join(src, rel)), os.readlink(os.path.join(dst, rel))
            if ta != tb:
                diffs.append(f"link target differs: {rel!r} {ta!r} vs {tb!r}")
    return diffs


def tree_equal(src, dst):
    return not tree_diff(src, dst)


def assert_tree_equal(src, dst, check_owner=None):
    diffs = tree_diff(src, dst, check_owner)
    assert not diffs, "trees differ:\n  " + "\n  ".join(diffs[:40])


def temporaries(top):
    """What is left in the .stage/tmp of every staged tree beneath top (top
    itself included): where a pull keeps its temporaries, emptied when a
    pull ends, finished or not; left by kill -9 and emptied by the next pull.
    Also, as a check that none ever strays into the tree, any leftover of the
    old naming scheme."""
    if not os.path.isdir(top):
        return []
    left = []
    for dirpath, dirnames, filenames in os.walk(top):
        if os.path.basename(dirpath) == "tmp" and os.path.basename(os.path.dirname(dirpath)) == ".stage":
            left += [os.path.relpath(os.path.join(dirpath, n), top) for n in dirnames + filenames]
    return sorted(left) + sorted(r for r in walk(top, skip_top_stage=False, live=True)
                                 if os.path.basename(r).startswith(".stage-tmp."))


def landed_files(top):
    """{rel: lstat} of regular files under their final names."""
    if not os.path.isdir(top):
        return {}
    w = walk(top, live=True)
    return {r: st for r, st in w.items()
            if stat.S_ISREG(st.st_mode)}


def assert_landed_match_source(src, dest):
    """The 'nothing half-written under a final name' rule: every regular file
    under its final name holds exactly the bytes of the source file of that
    name."""
    bad = []
    for rel, st in landed_files(dest).items():
        sp = os.path.join(src, rel)
        if not os.path.isfile(sp):
            bad.append(f"{rel!r}: no such source file")
        elif os.path.getsize(sp) != st.st_size:
            bad.append(f"{rel!r}: size {st.st_size}, source {os.path.getsize(sp)}")
        elif not same_content(sp, os.path.join(dest, rel)):
            bad.append(f"{rel!r}: content differs from the source")
    assert not bad, "files under their final name that are not the source:\n  " + "\n  ".join(bad[:40])


def snapshot(top):
    """Content and metadata of a tree, to prove it was not modified."""
    snap = {}
    for rel, st in walk(top, skip_top_stage=False).items():
        item = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_size,
                st.st_uid, st.st_gid, st.st_ino)
        p = os.path.join(top, rel)
        if stat.S_ISREG(st.st_mode) and os.access(p, os.R_OK):
            item += (sha256_file(p),)
        elif stat.S_ISLNK(st.st_mode):
            item += (os.readlink(p),)
        snap[rel] = item
    return snap


def sha256_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def inodes(top):
    return {r: st.st_ino for r, st in walk(top).items() if stat.S_ISREG(st.st_mode)}


def flip_byte(path, offset):
    """Flips one byte in place, keeping size and mtime (bit rot)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns


# ---------------------------------------------------------------- digests (the real xxhsum)

def xxh128(data):
    r = subprocess.run(["xxhsum", "-H2", "-"], input=data, capture_output=True, timeout=30, check=True)
    return r.stdout.split()[0].decode().lower()


def xxh128_file(path):
    with open(path, "rb") as f:
        r = subprocess.run(["xxhsum", "-H2", "-"], stdin=f, capture_output=True, timeout=60, check=True)
    return r.stdout.split()[0].decode().lower()


# ---------------------------------------------------------------- manifest

@dataclass
class Entry:
    type: str
    path: str            # raw name, fsdecoded
    size: int = 0
    mode: int = 0
    mtime_ns: int = 0
    digest: str = None
    target: str = None
    chunks: list = field(default_factory=list)


@dataclass
class Manifest:
    chunk: int
    entries: dict        # path -> Entry
    order: list          # paths in file order
    root: str
    count: int
    lines: list          # raw byte lines


_ESC_TOKEN = re.compile(rb"^(?:[\x21-\x24\x26-\x7e]|%[0-9A-Fa-f]{2})+$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


def unescape(tok):
    """Decodes a manifest path token; asserts it is escaped as the contract
    says (bytes 0x21..0x7e other than '%' literal, everything else %XX)."""
    assert _ESC_TOKEN.match(tok), f"badly escaped manifest token {tok!r}"
    raw = re.sub(rb"%([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]), tok)
    return os.fsdecode(raw)


def escape(raw):
    if isinstance(raw, str):
        raw = os.fsencode(raw)
    return b"".join(bytes([c]) if 0x21 <= c <= 0x7E and c != 0x25 else b"%%%02X" % c for c in raw)


def parse_manifest(path):
    data = Path(path).read_bytes()
    assert data.endswith(b"\n"), "manifest does not end with a newline"
    lines = data[:-1].split(b"\n")
    assert lines[0] == b"stage-manifest 1", f"first line {lines[0]!r}"
    m = re.match(rb"^chunk (\d+)$", lines[1])
    assert m, f"second line {lines[1]!r}"
    chunk = int(m.group(1))
    entries, order, last = {}, [], None
    for n, line in enumerate(lines[2:-1], start=3):
        t = line.split(b" ")
        kind = t[0]
        try:
            if kind == b"d":
                assert len(t) == 4
                e = Entry("d", unescape(t[1]), 0, int(t[2], 8), int(t[3]))
            elif kind == b"f":
                assert len(t) == 6
                e = Entry("f", unescape(t[1]), int(t[2]), int(t[3], 8), int(t[4]), t[5].decode().lower())
            elif kind == b"l":
                assert len(t) == 7
                e = Entry("l", unescape(t[1]), int(t[2]), int(t[3], 8), int(t[4]), t[5].decode().lower(),
                          unescape(t[6]))
            elif kind == b"c":
                assert len(t) == 2 and last is not None and last.type == "f"
                last.chunks.append(t[1].decode().lower())
                continue
            else:
                raise AssertionError("unknown entry type")
        except (AssertionError, ValueError) as ex:
            raise AssertionError(f"manifest line {n} malformed: {line!r} ({ex})") from None
        if e.digest is not None:
            assert _HEX32.match(e.digest), f"manifest line {n}: digest {e.digest!r}"
        assert e.path not in entries, f"manifest line {n}: {e.path!r} listed twice"
        entries[e.path] = e
        order.append(e.path)
        last = e
    t = lines[-1].split(b" ")
    assert len(t) == 4 and t[0] == b"end", f"last line {lines[-1]!r}"
    root = t[1].decode().lower()
    assert _HEX32.match(root), f"root digest {root!r}"
    return Manifest(chunk, entries, order, root, int(t[2]), lines)


def manifest_path(dest):
    return Path(dest) / ".stage" / "manifest"


def check_manifest_against(dest, src, chunk=CHUNK, digests=True):
    """The manifest of dest describes src exactly: one entry per entry of the
    tree, with type, size, mode, mtime_ns, content digest equal to
    `xxhsum -H2` of the source file, one chunk digest per chunk for files
    larger than a chunk, link targets verbatim; COUNT is the number of
    entries. digests: True (every file), False, or N (a sample of about N
    files: xxhsum runs once per file and chunk). Returns the manifest."""
    m = parse_manifest(manifest_path(dest))
    assert m.chunk == chunk
    tree = walk(src)
    regular = sorted(r for r, st in tree.items() if stat.S_ISREG(st.st_mode))
    if digests is True or digests is False:
        hashed = set(regular) if digests else set()
    else:                                   # a sample of about `digests` files, spread evenly
        hashed = set(regular[::max(1, len(regular) // max(1, digests))])
    bad = []
    want = set(tree)
    got = set(m.entries)
    bad += [f"not in manifest: {r!r}" for r in sorted(want - got)]
    bad += [f"in manifest, not in tree: {r!r}" for r in sorted(got - want)]
    for rel in sorted(want & got):
        st, e = tree[rel], m.entries[rel]
        p = os.path.join(src, rel)
        typ = "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "f"
        if e.type != typ:
            bad.append(f"{rel!r}: type {e.type}, tree {typ}")
            continue
        if e.mtime_ns != st.st_mtime_ns:
            bad.append(f"{rel!r}: mtime_ns {e.mtime_ns}, tree {st.st_mtime_ns}")
        if typ != "l" and e.mode != stat.S_IMODE(st.st_mode):
            bad.append(f"{rel!r}: mode {e.mode:o}, tree {stat.S_IMODE(st.st_mode):o}")
        if typ == "f":
            if e.size != st.st_size:
                bad.append(f"{rel!r}: size {e.size}, tree {st.st_size}")
            nchunks = -(-st.st_size // chunk) if st.st_size > chunk else 0
            if len(e.chunks) != nchunks:
                bad.append(f"{rel!r}: {len(e.chunks)} chunk lines, want {nchunks}")
            if rel in hashed:
                if e.digest != xxh128_file(p):
                    bad.append(f"{rel!r}: digest {e.digest} is not xxhsum -H2 of the file")
                if nchunks and len(e.chunks) == nchunks:
                    with open(p, "rb") as f:
                        for i in range(nchunks):
                            if e.chunks[i] != xxh128(f.read(chunk)):
                                bad.append(f"{rel!r}: chunk {i} digest wrong")
        elif typ == "l":
            target = os.readlink(p)
            if e.target != target:
                bad.append(f"{rel!r}: target {e.target!r}, tree {target!r}")
            if e.size != len(os.fsencode(target)):
                bad.append(f"{rel!r}: size {e.size}, target is {len(os.fsencode(target))} bytes")
    if m.count != len(m.entries):
        bad.append(f"trailer count {m.count}, {len(m.entries)} entries")
    assert not bad, "manifest does not describe the tree:\n  " + "\n  ".join(bad[:40])
    return m


# ---------------------------------------------------------------- client output

def json_lines(text):
    """Every stdout line is one JSON object with an "event"."""
    out = []
    for n, line in enumerate(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"), 1):
        try:
            obj = json.loads(line)
        except ValueError as ex:
            raise AssertionError(f"--json stdout line {n} is not JSON ({ex}): {line!r}") from None
        assert isinstance(obj, dict) and "event" in obj, f"--json line {n} is not an event object: {line!r}"
        out.append(obj)
    assert out, "--json printed nothing"
    return out


def json_result(text):
    ev = json_lines(text)
    results = [e for e in ev if e["event"] == "result"]
    assert len(results) == 1 and ev[-1]["event"] == "result", \
        f"want exactly one result event, last: {[e['event'] for e in ev]}"
    return ev[-1], ev


def copy_cells(text):
    """The "copy" events of verify --cluster --json output: {(origin, holder): event}
    (origin "" for a holder-level group: one that could not be asked)."""
    return {(o.get("origin", ""), o.get("holder")): o for o in json_lines(text)
            if o["event"] == "copy"}


def last_line(text):
    lines = [l for l in text.split("\n") if l != ""]
    assert lines, "stdout is empty"
    return lines[-1]


def rm_tree(p):
    """rm -rf that copes with read-only directories."""
    if not os.path.lexists(p):
        return
    for dirpath, dirnames, _ in os.walk(p):
        for d in dirnames:
            dp = os.path.join(dirpath, d)
            if not os.path.islink(dp):
                os.chmod(dp, 0o755)
    os.chmod(p, 0o755)
    shutil.rmtree(p)


# ---------------------------------------------------------------- clusters

def write_key(path, key=None):
    """A cluster key file: 64 hex digits (random unless given), mode 0600."""
    path = Path(path)
    path.write_text((key or os.urandom(32).hex()) + "\n")
    os.chmod(path, 0o600)
    return path


def write_hosts(path, nodes):
    """A hosts file from [(name, "HOST:PORT", domain or None), ...]."""
    path = Path(path)
    path.write_text("".join(f"{n} {a}" + (f" domain={d}" if d else "") + "\n" for n, a, d in nodes))
    return path


def run_cmd(*argv, check=True, timeout=30):
    """Runs a system command (ip, tc...); CompletedProcess with text output."""
    cp = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)
    if check and cp.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {cp.returncode}: {cp.stderr.strip()}")
    return cp


# ---------------------------------------------------------------- checkpoints
# Daemon layout: ckpt_root is base/ckpt, replica_root base/replicas.

def ckpt(d, job="job1", step="step-100"):
    return d.ckpt_root / job / step


def replica(holder, origin, job="job1", step="step-100"):
    return holder.replica_root / origin.name / job / step


def assert_replica_of(origin_dir, replica_dir):
    """The replica is the original byte for byte (content, type, mode, mtime
    ns, symlink targets; owner as root) and its manifest is the origin's."""
    assert replica_dir.is_dir(), f"no replica at {replica_dir}"
    assert_tree_equal(origin_dir, replica_dir)
    a, b = manifest_path(origin_dir), manifest_path(replica_dir)
    assert a.read_bytes() == b.read_bytes(), "the replica's manifest differs from the origin's"


def commit_wait(d, path, timeout=60):
    cp = d.run("commit", path, "--wait", timeout=timeout)
    assert cp.returncode == 0, \
        f"commit --wait exited {cp.returncode}\nstdout: {cp.stdout}\nstderr: {cp.stderr}\nlog:\n{d.log()[-3000:]}"
    return cp


def bytes_sent_to(d, peer):
    """Raw bytes d's sender has ever sent to peer, from `stage status`."""
    st = d.status(timeout=20).stdout
    m = re.search(rf"^peer:\s+{peer.name} .*?(\d+) bytes sent as \d+", st, re.M)
    return int(m.group(1)) if m else 0


def staged_refuses(d, what):
    """staged with d's config must refuse to start: exit 2. Its output."""
    try:
        r = subprocess.run([str(d.exe), "--config", str(d.config_path), "--foreground"],
                           capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"staged started despite {what}")
    assert r.returncode == 2, f"{what}: exit {r.returncode}\n{r.stdout}{r.stderr}"
    return r.stdout + r.stderr


def ls_entries(d):
    """`stage ls` as [(NAME, {key: value})]; asserts exit 0."""
    cp = d.run("ls", timeout=20)
    assert cp.returncode == 0, f"stage ls on {d.name} exited {cp.returncode}: {cp.stderr}"
    out = []
    for line in cp.stdout.splitlines():
        m = re.match(r"^(\S+): (.*)$", line)
        if not m:
            continue
        fields = dict(kv.split("=", 1) for kv in m.group(2).split() if "=" in kv)
        out.append((m.group(1), fields))
    return out


def ls_find(d, name, **want):
    """The fields of the ls line for NAME whose fields include `want`, or None."""
    for n, f in ls_entries(d):
        if n == name and all(f.get(k) == v for k, v in want.items()):
            return f
    return None


def after_kill9():
    """Time for the kernel to finish tearing down a SIGKILLed daemon. DAEMON
    BUG (test_restart_right_after_kill9): its io_uring multishot accept keeps
    the control socket accepting for a few ms after the process is reaped,
    and a staged started in that window exits with "another staged is
    already listening"."""
    time.sleep(0.5)
