"""bash completion (tools/install/stage.bash, `stage __complete`) in a real
bash, against real daemons: commands and each command's options exactly
as the parser takes them, codec names, paths under the roots the daemon
names, the checkpoints it knows (a deleted one included, for restore), node
names for --from, and a daemon that is down or wedged costing a TAB no more
than half a second.
"""
import os
import shutil
import socket
import subprocess
import time

import pytest

from helpers import F, REPO, STAGE, ckpt, commit_wait, make_tree

SCRIPT = REPO / "tools" / "install" / "stage.bash"


def complete(words, sock=None, cwd=None, timeout=10):
    """COMPREPLY for the line `words` (the last being the word completed),
    from _stage in a bash that sourced the script, bash-completion loaded
    when it is installed (as it is on a desktop), STAGE_SOCKET pointing at
    the daemon."""
    prog = "\n".join([
        "[ -r /usr/share/bash-completion/bash_completion ] && . /usr/share/bash-completion/bash_completion",
        f". {SCRIPT}",
        'COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 ))',
        "_stage",
        "printf '%s\\n' \"${COMPREPLY[@]}\"",
    ])
    env = {**os.environ, "STAGE_SOCKET": str(sock or "/nonexistent/staged.sock")}
    cp = subprocess.run(["bash", "-c", prog, "bash", str(STAGE), *words], capture_output=True,
                        text=True, env=env, cwd=cwd, timeout=timeout)
    assert cp.returncode == 0, cp.stderr
    return [l for l in cp.stdout.splitlines() if l]


def usage_commands():
    """The commands `stage --help` lists: what completion must offer."""
    out = subprocess.run([str(STAGE), "--help"], capture_output=True, text=True).stdout
    return {l.split()[1] for l in out.splitlines() if l.strip().startswith("stage ") and
            len(l.split()) > 1 and not l.split()[1].startswith("[")}


def test_commands_and_options_from_the_parser():
    got = complete([""])
    assert set(got) >= usage_commands() | {"codec"}, (got, usage_commands())
    assert complete(["ve"]) == ["verify"]
    assert complete(["rest"]) == ["restore"]
    assert sorted(complete(["re"])) == ["restore", "resume"]
    assert sorted(complete(["pull", "--"])) == sorted(["--socket", "--json", "--help", "--version",
                                                       "--to", "--verify", "--cluster", "--nodes"])
    assert sorted(complete(["verify", "x", "--"])) == sorted(["--socket", "--json", "--help",
                                                             "--version", "--deep", "--cluster",
                                                             "--nodes"])
    # Every option offered is one the parser takes for that command.
    for cmd in ("pull", "verify", "commit", "restore", "doctor", "manifest"):
        for opt in complete([cmd, "--"]):
            if opt in ("--help", "--version"):
                continue
            line = [cmd, opt] + (["x"] if opt in ("--to", "--from", "--nodes", "--ports", "--socket")
                                 else [])
            cp = subprocess.run([str(STAGE), *line], capture_output=True, text=True,
                                env={**os.environ, "STAGE_SOCKET": "/nonexistent/s"})
            assert "unrecognized option" not in cp.stderr and "does not apply" not in cp.stderr, \
                (line, cp.stderr)
    assert complete(["codec", ""]) == ["compress", "decompress", "bench"]
    assert complete(["codec", "compress", "--codec", ""]) == ["none", "zstd", "float"]
    assert complete(["codec", "compress", "--codec", "=", "f"]) == ["float"]
    assert complete(["status", ""]) == []


def test_paths_from_the_daemon(make_cluster, tmp_path):
    n0, n1 = make_cluster(2, transfer={"watch": "off"})
    make_tree(n0.src_root / "datasets" / "imagenet", [F("a", data=b"x")])
    # A pull's operand: the source roots, then the directories beneath.
    assert str(n0.src_root) in complete(["pull", ""], sock=n0.socket)
    assert complete(["pull", f"{n0.src_root}/da"], sock=n0.socket) == [f"{n0.src_root}/datasets"]
    # restore: the checkpoints this node knows, a deleted one included.
    step = make_tree(ckpt(n0), [F("model.pt", size=70_000)])
    commit_wait(n0, step)
    shutil.rmtree(step)
    got = complete(["restore", str(n0.base / "ckpt") + "/"], sock=n0.socket)
    assert str(step) in got, got
    # resume: the jobs it knows.
    assert complete(["resume", ""], sock=n0.socket) == ["job1"]
    # verify: the roots, and the replicas this node holds for others.
    got = complete(["verify", ""], sock=n1.socket)
    assert {str(n1.stage_root), str(n1.base / "ckpt"), str(n1.base / "replicas")} <= set(got), got
    assert str(n1.base / "replicas" / "n0" / "job1" / "step-100") in got, got
    # --from: the nodes, and the durable tier.
    assert complete(["restore", str(step), "--from", ""], sock=n0.socket) == ["n0", "n1", "durable"]
    assert complete(["doctor", "--nodes", "=", "n1"], sock=n0.socket) == ["n1"]
    # --socket on the line wins over STAGE_SOCKET.
    got = complete(["--socket", str(n1.socket), "verify", ""])
    assert str(n1.stage_root) in got, got


def test_no_daemon_or_a_wedged_one_costs_little(tmp_path):
    # Down: plain directory completion still works.
    (tmp_path / "dsets").mkdir()
    assert complete(["pull", str(tmp_path / "ds")]) == [str(tmp_path / "dsets")]
    # Wedged: a socket that accepts and never answers.
    path = tmp_path / "wedged.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(16)
    try:
        t0 = time.monotonic()
        got = complete(["verify", str(tmp_path / "ds")], sock=path)
        took = time.monotonic() - t0
        assert got == [str(tmp_path / "dsets")]
        # One question (the status) of 0.5 s at most: no ls after it
        # timed out. Plus bash and bash-completion's start.
        assert took < 2.0, f"a wedged daemon cost the TAB {took:.1f} s"
    finally:
        srv.close()
