"""make install: the programs, a systemd unit that systemd itself accepts,
and a sample config that the installed daemon parses, under PREFIX and
SYSCONFDIR (a scratch tree here: nothing is installed on the machine)."""
import os
import re
import shutil
import stat
import subprocess

import pytest

from helpers import BUILD, REPO


def install(prefix, sysconf):
    # BIN= : install what the build made (the tests' build, with its own
    # flags), never rebuild it here.
    cp = subprocess.run(["make", "--no-print-directory", "-C", str(REPO), f"BUILD={BUILD}", "BIN=",
                         "install", f"PREFIX={prefix}", f"SYSCONFDIR={sysconf}", "DESTDIR="],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    return cp


def test_install_tree_and_unit(tmp_path):
    prefix, sysconf = tmp_path / "usr", tmp_path / "etc"
    install(prefix, sysconf)
    for prog in ("staged", "stage"):
        p = prefix / "bin" / prog
        assert p.is_file() and os.stat(p).st_mode & stat.S_IXUSR, p
    # bash-completion loads share/bash-completion/completions/NAME for NAME.
    comp = prefix / "share" / "bash-completion" / "completions" / "stage"
    assert comp.is_file() and "complete -F _stage stage" in comp.read_text()
    unit = prefix / "lib" / "systemd" / "system" / "staged.service"
    text = unit.read_text()
    assert re.search(rf"^ExecStart={re.escape(str(prefix))}/bin/staged --config "
                     rf"{re.escape(str(sysconf))}/stage/staged.conf --foreground$", text, re.M), text
    assert "@" not in text, "a placeholder left in the unit"
    for line in ("ProtectSystem=strict", "NoNewPrivileges=yes", "RuntimeDirectory=stage",
                 "StateDirectory=stage", "ReadWritePaths=/var/lib/stage", "PrivateTmp=yes"):
        assert re.search(rf"^{re.escape(line)}$", text, re.M), line
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (tools/install-deps installs systemd)")
    cp = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 0 and "staged.service" not in cp.stderr, cp.stdout + cp.stderr


def test_sample_config_parses_and_is_kept(tmp_path):
    prefix, sysconf = tmp_path / "usr", tmp_path / "etc"
    install(prefix, sysconf)
    conf = sysconf / "stage" / "staged.conf"
    assert conf.read_text() == (sysconf / "stage" / "staged.conf.sample").read_text()
    cp = subprocess.run([str(prefix / "bin" / "staged"), "--config", str(conf), "--print-config"],
                        capture_output=True, text=True, timeout=30)
    assert cp.returncode == 0, cp.stderr
    assert re.search(r"^ports = 29500$", cp.stdout, re.M), cp.stdout
    # A site's own config survives the next install; the sample is refreshed.
    conf.write_text("[node]\nname = mine\n")
    install(prefix, sysconf)
    assert conf.read_text() == "[node]\nname = mine\n"
    assert "[doctor]" in (sysconf / "stage" / "staged.conf.sample").read_text()
