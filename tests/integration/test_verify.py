"""stage verify: fast (types, sizes, mtimes) and --deep (every byte re-hashed)."""
import os
import subprocess

import pytest

from helpers import CHUNK, F, L, flip_byte, json_lines, make_tree, manifest_path


@pytest.fixture
def staged(daemon):
    src = make_tree(daemon.src_root / "ds", [
        F("small.txt", b"small file\n"),
        F("multi.bin", size=9 * CHUNK + 100),
        F("sub/inner.bin", size=5000),
        F("sub/empty", b""),
        L("sub/link", "inner.bin"),
    ])
    cp = daemon.pull(src)
    assert cp.returncode == 0, cp.stderr
    return daemon, daemon.dest_of(src)


def lines_naming(stdout, kinds, rel):
    return [l for l in stdout.splitlines() if l.split(" ", 1)[0] in kinds and rel in l]


def test_verify_clean_tree(staged):
    d, dest = staged
    for args in [(), ("--deep",)]:
        cp = d.run("verify", dest, *args)
        assert cp.returncode == 0, f"verify {args}: {cp.stdout} {cp.stderr}"
    cp = d.run("verify", "--deep", dest.name, cwd=dest.parent)    # relative to the client's cwd
    assert cp.returncode == 0, cp.stdout + cp.stderr


@pytest.mark.parametrize("rel,offset", [("small.txt", 3), ("multi.bin", 4 * CHUNK + 17), ("multi.bin", 9 * CHUNK + 99)])
def test_flipped_byte_found_only_by_deep(staged, rel, offset):
    d, dest = staged
    flip_byte(dest / rel, offset)
    cp = d.run("verify", dest)
    assert cp.returncode == 0, f"fast verify looks only at types, sizes, mtimes: {cp.stdout} {cp.stderr}"
    cp = d.run("verify", dest, "--deep")
    assert cp.returncode == 1, f"deep verify missed a flipped byte in {rel}: {cp.stdout} {cp.stderr}"
    assert lines_naming(cp.stdout, ("damaged", "changed"), rel), cp.stdout
    cp = d.run("verify", dest, "--deep", json=True)
    assert cp.returncode == 1
    notes = [e for e in json_lines(cp.stdout) if e["event"] == "note"]
    assert any(n["kind"] in ("damaged", "changed") and n["path"].endswith(rel) for n in notes), notes


def test_deleted_file_is_missing(staged):
    d, dest = staged
    (dest / "sub/inner.bin").unlink()
    cp = d.run("verify", dest)
    assert cp.returncode == 1, cp.stdout
    assert lines_naming(cp.stdout, ("missing",), "sub/inner.bin"), cp.stdout
    cp = d.run("verify", dest, json=True)
    assert cp.returncode == 1
    notes = [e for e in json_lines(cp.stdout) if e["event"] == "note"]
    assert any(n["kind"] == "missing" and n["path"].endswith("sub/inner.bin") for n in notes), notes


def test_added_file_is_unexpected(staged):
    d, dest = staged
    (dest / "sub/intruder.txt").write_bytes(b"not from the source\n")
    for args in [(), ("--deep",)]:
        cp = d.run("verify", dest, *args)
        assert cp.returncode == 1, cp.stdout
        assert lines_naming(cp.stdout, ("unexpected",), "sub/intruder.txt"), cp.stdout


def test_size_or_mtime_change_found_by_fast_verify(staged):
    d, dest = staged
    with open(dest / "small.txt", "ab") as f:
        f.write(b"x")
    st = os.stat(dest / "multi.bin")
    os.utime(dest / "multi.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    cp = d.run("verify", dest)
    assert cp.returncode == 1, cp.stdout
    assert "small.txt" in cp.stdout and "multi.bin" in cp.stdout, cp.stdout


def test_missing_manifest_is_not_verified(staged):
    d, dest = staged
    manifest_path(dest).unlink()
    cp = d.run("verify", dest)
    assert cp.returncode in (1, 2), "a tree without a manifest is not verified"
    assert cp.stderr.strip() or cp.stdout.strip()


def test_tampered_manifest_is_not_verified(staged):
    d, dest = staged
    mf = manifest_path(dest)
    text = mf.read_bytes()
    lines = text.split(b"\n")
    i = next(n for n, l in enumerate(lines) if l.startswith(b"f ") and b"small.txt" in l)
    lines[i] = lines[i].replace(b"small.txt", b"small.txu")
    mf.write_bytes(b"\n".join(lines))
    cp = d.run("verify", dest, "--deep")
    assert cp.returncode != 0, "an edited manifest was accepted"
    mf.write_bytes(text[: len(text) // 2])       # torn
    cp = d.run("verify", dest)
    assert cp.returncode != 0, "a truncated manifest was accepted"
    d.assert_serving()


def test_json_notes_with_odd_names(daemon):
    odd = ["odd\nname.txt", 'quote"back\\slash', os.fsdecode(b"bad-\xff.bin"), "tab\tütf8"]
    src = make_tree(daemon.src_root / "odd", [F(n, b"x") for n in odd] + [F("keep", b"k")])
    dest = daemon.dest_of(src)
    assert daemon.pull(src).returncode == 0
    for n in odd:
        os.unlink(dest / n)
    cp = subprocess.run(daemon.cmd("verify", dest, json=True), capture_output=True, timeout=60)
    assert cp.returncode == 1
    try:
        text = cp.stdout.decode("utf-8")              # JSON is UTF-8, whatever bytes the names hold
    except UnicodeDecodeError as ex:
        raise AssertionError(f"--json output is not UTF-8: {ex}: {cp.stdout!r}") from None
    notes = [e for e in json_lines(text) if e["event"] == "note" and e["kind"] == "missing"]
    assert len(notes) == len(odd), notes
    paths = {n["path"] for n in notes}
    for n in odd[:2] + odd[3:]:                      # valid UTF-8 names come back exactly
        assert n in paths or any(p.endswith("/" + n) for p in paths), (n, paths)
