"""common/hostlist.c against Slurm itself: every expression here expands, with
BUILD/tests/hostlist_expand (tests/tools/hostlist_expand.c), to what
`scontrol show hostnames` prints, a repeated name kept once; and the ones
Slurm refuses are refused here too (the forms refused here only, on purpose,
are in common/hostlist.h and tests/unit/test_hostlist.c).

scontrol comes with Debian's slurm-client (tools/install-deps); without it
these tests skip. It needs a slurm.conf even to expand a list: a minimal one
in the test's own directory, so that no cluster's config is read.
"""
import os
import shutil
import subprocess

import pytest

from helpers import BUILD, sanitizer_report

EXPAND = BUILD / "tests" / "hostlist_expand"
SCONTROL = shutil.which("scontrol")

pytestmark = pytest.mark.skipif(SCONTROL is None,
                                reason="scontrol not installed (Debian package slurm-client; make deps)")

SAME = [
    "n0",
    "n0,n2",
    "n[0-7,12]",
    "gpu-[01-16]",
    "r[1-2]n[01-03]",
    "n[8-10]",
    "n[08-10]",
    "n[8-010]",
    "n[01-3]",
    "n[007]",
    "n[099-101]",
    "n[01,2,003]",
    "n[9-11,010]",
    "n[5,1-3]",
    "n[1-2]-[3-4]",
    "n[1-3]a[5]",
    "a[1-2]b[1-2]c[1-2]",
    "[1-3][1-3]1[5]",
    "a[1-2],b,c[3]",
    "n[1-3],n2",
    "n[1-3],n[2-4],n1",
    "[1-3]",
    "rack_1.n[0-1]",
]

BOTH_REFUSE = [
    "n[2-1]",
    "n[010-8]",
    "n[a-b]",
    "n[0x1-3]",
    "n[-2]",
    "n[1-2-3]",
    "n[]",
    "n[1,,2]",
    "n[0-2]-ib",
    "n[1-3]]",
]


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory):
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=stage-test\nSlurmctldHost=localhost\n")
    env = dict(os.environ)
    env["SLURM_CONF"] = str(conf)
    return env


def ours(expr):
    if not os.access(EXPAND, os.X_OK):
        pytest.fail(f"not built: {EXPAND} (run `make`)", pytrace=False)
    cp = subprocess.run([str(EXPAND), expr], capture_output=True, text=True, timeout=30)
    assert sanitizer_report(cp.stderr) is None, cp.stderr
    assert cp.returncode in (0, 2), f"hostlist_expand {expr!r}: exit {cp.returncode}\n{cp.stderr}"
    return cp


def slurms(expr, env):
    """Slurm's names, or None when it refuses (it still exits 0: the message
    says so, and nothing is printed)."""
    cp = subprocess.run([SCONTROL, "show", "hostnames", expr], capture_output=True, text=True,
                        timeout=30, env=env)
    assert cp.returncode == 0, f"scontrol {expr!r}: exit {cp.returncode}\n{cp.stderr}"
    if "Invalid hostlist" in cp.stderr and not cp.stdout.strip():
        return None
    assert not cp.stderr.strip(), cp.stderr
    return cp.stdout.split()


def first_of_each(names):
    seen = set()
    return [n for n in names if not (n in seen or seen.add(n))]


@pytest.mark.parametrize("expr", SAME)
def test_expands_as_slurm_does(expr, slurm_env):
    want = slurms(expr, slurm_env)
    assert want is not None, f"scontrol refuses {expr!r}"
    cp = ours(expr)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split() == first_of_each(want)


@pytest.mark.parametrize("expr", BOTH_REFUSE)
def test_refused_as_slurm_refuses(expr, slurm_env):
    assert slurms(expr, slurm_env) is None, f"scontrol accepts {expr!r}"
    cp = ours(expr)
    assert cp.returncode == 2
    assert cp.stdout == ""
    assert cp.stderr.startswith(f"hostlist_expand: '{expr}': "), cp.stderr
