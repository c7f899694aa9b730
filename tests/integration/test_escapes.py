"""Paths that try to leave the roots are refused (exit 2) and nothing is written."""
import os
import stat
from pathlib import Path

import pytest

from helpers import SECRET, F, L, assert_tree_equal, json_result, make_outside, make_tree, snapshot, walk


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
