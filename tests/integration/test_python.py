"""The Python client (python/stage) against real daemons: every call over
the control socket, plain dicts back, failures as exceptions that carry the
daemon's message and the CLI's exit code; and the package installs with pip
from the repository."""
import os
import shutil
import subprocess
import sys

import pytest

from helpers import REPO, ckpt, flip_byte

sys.path.insert(0, str(REPO / "python"))
import stage  # noqa: E402


def shards(d, step, n=3, size=300_000):
    path = ckpt(d, step=step)
    path.mkdir(parents=True)
    for i in range(n):
        (path / f"rank{i}.distcp").write_bytes(os.urandom(size))
    (path / ".metadata").write_bytes(b"meta")
    return path


@pytest.mark.timeout(120)
def test_commit_verify_status_ls(make_cluster):
    n0, n1 = make_cluster(2, transfer={"watch": "off"})
    path = shards(n0, "step-100")
    r = stage.commit(path, wait=True, sock=n0.socket)
    assert r["code"] == 0 and "confirmed" in r["text"], r
    v = stage.verify(path, cluster=True, sock=n0.socket)
    assert v["code"] == 0
    held = {(c["origin"], c["holder"]): c["state"] for c in v["copies"]}
    assert held[("n0", "n0")] == "ok" and held[("n0", "n1")] == "ok", v["copies"]
    st = stage.status(sock=n0.socket)
    assert st["node"] == "n0" and any(p.startswith("n1 ") for p in st["peer"]), st
    entries = stage.ls(sock=n0.socket)
    e = next(e for e in entries if e["name"] == "job1/step-100")
    assert e["origin"] == "n0" and e["state"] == "committed" and e["files"] == 4, e
    # The same text `stage metrics` prints; the step's copy counted on both ends.
    text = stage.metrics(sock=n0.socket)
    assert 'stage_replication_confirmed_total{peer="n1"} 1\n' in text, text[:2000]
    assert "\nstage_replicas_received_total 1\n" in stage.metrics(sock=n1.socket)
    # Where to resume from: this step, as the CLI's last line says it.
    r = stage.resume("job1", sock=n0.socket)
    assert r["code"] == 0 and r["path"] == str(path), r
    with pytest.raises(stage.StageFailed) as e:
        stage.resume("nosuchjob", sock=n0.socket)
    assert "cannot resume" in e.value.message and e.value.code == 1


@pytest.mark.timeout(120)
def test_failures_raise_with_message_and_code(make_cluster, tmp_path):
    (n0,) = make_cluster(1, transfer={"watch": "off"})
    path = shards(n0, "step-7")
    stage.commit(path, wait=True, sock=n0.socket)
    flip_byte(path / "rank1.distcp", 1000)
    with pytest.raises(stage.StageFailed) as e:
        stage.verify(path, deep=True, sock=n0.socket)
    assert e.value.code == 1 and "rank1.distcp" in str(e.value.result["notes"]), e.value.result
    assert any(n["kind"] == "damaged" and n["path"] == "rank1.distcp"
               for n in e.value.result["notes"]), e.value.result["notes"]
    with pytest.raises(stage.StageUsageError) as e:
        stage.pull("/etc", sock=n0.socket)
    assert e.value.code == 2 and "/etc" in e.value.message, e.value.message
    with pytest.raises(stage.StageUnreachable) as e:
        stage.status(sock=tmp_path / "no-daemon.sock")
    assert e.value.code == 3 and "no-daemon.sock" in e.value.message
    n0.assert_serving()


@pytest.mark.timeout(120)
def test_pull_and_doctor(make_cluster):
    n0, n1 = make_cluster(2, transfer={"watch": "off"})
    src = n0.src_root / "ds"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(70_000))
    r = stage.pull(src, sock=n0.socket)
    assert r["code"] == 0 and r["files"] == 1 and (os.path.exists(r["path"])), r
    d = stage.doctor(quick=True, sock=n0.socket)
    assert d["code"] in (0, 1) and d["ok"] == (d["code"] == 0)
    checks = {(c["check"], c["subject"]) for c in d["checks"]}
    assert ("nodes", "all") in checks and ("bandwidth", "all") in checks, checks
    bw = next(m for m in d["matrices"] if m["name"] == "bandwidth")
    assert bw["nodes"] == ["n0", "n1"] and float(bw["cells"][0][1]) > 0, bw
    with pytest.raises(stage.StageUsageError):
        stage.doctor(nodes="n9", sock=n0.socket)


def test_pip_installs_the_package(tmp_path):
    """pip builds and installs it from the repository, offline (setuptools
    of the system), and the installed copy imports. Built from a copy: the
    build leaves its files beside the sources."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "python", src, ignore=shutil.ignore_patterns("__pycache__"))
    cp = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                         "--no-index", "--target", str(tmp_path / "site"), str(src)],
                        capture_output=True, text=True, timeout=300)
    if cp.returncode != 0 and "No module named pip" in cp.stderr:
        pytest.skip("pip is not installed")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = subprocess.run([sys.executable, "-c", "import stage, sys; print(stage.__file__)"],
                        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
                        cwd=tmp_path, timeout=60)
    assert cp.returncode == 0 and str(tmp_path / "site") in cp.stdout, cp.stdout + cp.stderr
