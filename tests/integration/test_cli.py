"""The daemon's start-up, its socket, `stage status`, and the client's exit codes."""
import os
import signal
import socket
import stat
import subprocess

import pytest

from conftest import free_port
from helpers import STAGE, STAGED, F, client_env, json_lines, make_tree, walk, wait_for
import threading


def test_status_answers(daemon):
    cp = daemon.status()
    assert cp.returncode == 0, cp.stderr
    assert daemon.name in cp.stdout, f"status does not name the node: {cp.stdout!r}"
    cp = daemon.status(json=True)
    assert cp.returncode == 0, cp.stderr
    json_lines(cp.stdout)


def test_socket_not_accessible_to_others(daemon):
    st = os.stat(daemon.socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert st.st_mode & 0o007 == 0, f"socket mode {stat.S_IMODE(st.st_mode):o} lets others in"


def test_stage_socket_environment_variable(daemon):
    cp = subprocess.run([str(STAGE), "status"], capture_output=True, text=True, timeout=30,
                        env=client_env({"STAGE_SOCKET": str(daemon.socket)}))
    assert cp.returncode == 0, cp.stderr


def stale_socket(tmp_path):
    p = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(p))
    s.close()
    return p


def plain_file(tmp_path):
    p = tmp_path / "not-a-socket"
    p.write_text("x")
    return p


@pytest.mark.parametrize("where", [
    lambda t: t / "no-such-dir/staged.sock",
    stale_socket,
    plain_file,
], ids=["missing", "stale", "regular-file"])
@pytest.mark.parametrize("args", [("status",), ("pull", "/tmp")], ids=lambda a: a[0])
def test_daemon_unreachable_exits_3(tmp_path, where, args):
    sock = where(tmp_path)
    cp = subprocess.run([str(STAGE), "--socket", str(sock), *args], capture_output=True, text=True,
                        timeout=30, env=client_env())
    assert cp.returncode == 3, f"exit {cp.returncode}: {cp.stderr}"
    assert str(sock) in cp.stderr, f"the hint should name the socket: {cp.stderr!r}"


def bad_configs():
    # (lines, index of the offending line, what the message must say)
    return {
        "unknown_key": (["[node]", "name = x", "bogus = 1"], 2, "key 'node.bogus'"),
        # The section line is the offence: naming it there is as good as naming the key.
        "unknown_section": (["[paths]", "stage_root = /tmp/x", "[nosuch]", "", "key = 1"], 2, "nosuch"),
        "chunk_not_power_of_two": (["[transfer]", "chunk_size = 96KiB"], 1, "key 'transfer.chunk_size'"),
        "chunk_below_4k": (["[transfer]", "", "# comment", "chunk_size = 2KiB"], 3, "key 'transfer.chunk_size'"),
        "bad_size": (["[transfer]", "memory = lots"], 1, "key 'transfer.memory'"),
        "negative_count": (["[transfer]", "files_in_flight = -3"], 1, "key 'transfer.files_in_flight'"),
        "bad_enum": (["[transfer]", "transport = carrier-pigeon"], 1, "key 'transfer.transport'"),
    }


@pytest.mark.parametrize("case", sorted(bad_configs()))
def test_bad_config_names_file_line_key(tmp_path, case):
    lines, bad, what = bad_configs()[case]
    sock = tmp_path / "s.sock"
    # A socket of our own first, so a daemon that wrongly starts binds nothing shared.
    head = ["[node]", f"socket = {sock}", f"state_dir = {tmp_path / 'state'}"]
    cfg = tmp_path / "bad.conf"
    cfg.write_text("\n".join(head + lines) + "\n")
    cp = subprocess.run([str(STAGED), "--config", str(cfg), "--foreground"], capture_output=True, text=True,
                        timeout=20)
    assert cp.returncode == 2, f"exit {cp.returncode}: {cp.stderr}"
    where = f"{cfg}:{len(head) + bad + 1}: "
    assert any(where in l and what in l.split(where, 1)[1] for l in cp.stderr.splitlines()), \
        f"want {where + what!r} in stderr: {cp.stderr!r}"
    assert not sock.exists()


def test_missing_config_file(tmp_path):
    cfg = tmp_path / "nope.conf"
    cp = subprocess.run([str(STAGED), "--config", str(cfg), "--foreground"], capture_output=True, text=True,
                        timeout=20)
    assert cp.returncode == 2
    assert str(cfg) in cp.stderr


def test_print_config_round_trips(make_daemon, tmp_path):
    d = make_daemon(start=False, transfer={"memory": "32MiB", "files_in_flight": "16", "io_size": "1MiB"})
    cp = subprocess.run([str(STAGED), "--config", str(d.config_path), "--print-config"],
                        capture_output=True, text=True, timeout=20)
    assert cp.returncode == 0, cp.stderr
    for s in [str(d.stage_root), str(d.socket), str(d.src_root), d.name]:
        assert s in cp.stdout, f"{s} missing from --print-config"
    again = tmp_path / "printed.conf"
    again.write_text(cp.stdout)
    cp2 = subprocess.run([str(STAGED), "--config", str(again), "--print-config"],
                         capture_output=True, text=True, timeout=20)
    assert cp2.returncode == 0, cp2.stderr
    assert cp2.stdout == cp.stdout


@pytest.mark.parametrize("args", [
    (), ("pull",), ("frobnicate",), ("pull", "{src}", "--no-such-option"), ("pull", "{src}", "--to"),
    ("verify",), ("pull", "{src}", "--deep"),
], ids=["nothing", "pull-no-src", "unknown-command", "unknown-option", "to-without-value",
        "verify-no-path", "option-of-another-command"])
def test_usage_errors_exit_2(daemon, args):
    make_tree(daemon.src_root / "ds", [F("a", b"a")])
    args = [a.format(src=daemon.src_root / "ds") for a in args]
    cp = daemon.run(*args)
    assert cp.returncode == 2, f"exit {cp.returncode}: {cp.stdout} {cp.stderr}"
    assert cp.stderr.strip()
    assert walk(daemon.stage_root) == {}


def test_daemon_survives_garbage_and_idle_connections(daemon):
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    idle.connect(str(daemon.socket))
    half = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    half.connect(str(daemon.socket))
    half.sendall(b"STG1\x03\x00")                      # a header cut short, then silence
    try:
        daemon.assert_serving()                         # one idle client must not block the others
        for junk in [os.urandom(4096), b"STG1" + b"\xff" * 12 + os.urandom(64),
                     b"GET / HTTP/1.0\r\n\r\n", b"\0" * 16 + b"x" * 100]:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(10)
                s.connect(str(daemon.socket))
                try:
                    s.sendall(junk)
                    s.shutdown(socket.SHUT_WR)
                    while s.recv(4096):                 # whatever it answers, it must close
                        pass
                except (BrokenPipeError, ConnectionResetError):
                    pass
            daemon.assert_serving()
    finally:
        idle.close()
        half.close()
    daemon.assert_serving()


def test_daemonized_start_up_failure_is_said_on_the_terminal(tmp_path):
    """Without --foreground staged forks; a hosts file or key file refused
    after the fork used to end the daemon silently with the parent's exit 0.
    Now the parent waits for the child's word: the reason on stderr, exit 2,
    no daemon left behind. A good start still exits 0 with a daemon serving."""
    sock, state = tmp_path / "s.sock", tmp_path / "state"
    hosts = tmp_path / "hosts"
    hosts.write_text("n0 127.0.0.1:%d\nn1 127.0.0.1:%d\n" % (free_port(), free_port()))
    key = tmp_path / "cluster.key"
    key.write_text("ab" * 32 + "\n")
    key.chmod(0o644)
    cfg = tmp_path / "c.conf"
    cfg.write_text(f"[node]\nname = n0\nsocket = {sock}\nstate_dir = {state}\n"
                   f"[paths]\nstage_root = {tmp_path / 'st'}\nckpt_root = {tmp_path / 'ck'}\n"
                   f"replica_root = {tmp_path / 'rp'}\n"
                   f"[cluster]\nhosts = {hosts}\nkey_file = {key}\n")
    cp = subprocess.run([str(STAGED), "--config", str(cfg)], capture_output=True, text=True, timeout=20)
    assert cp.returncode == 2, f"exit {cp.returncode}: {cp.stderr}"
    assert f"key file {key} has mode 0644" in cp.stderr and "chmod 600" in cp.stderr, cp.stderr
    assert subprocess.run([str(STAGE), "--socket", str(sock), "status"],
                          capture_output=True).returncode == 3
    key.chmod(0o600)
    cp = subprocess.run([str(STAGED), "--config", str(cfg)], capture_output=True, text=True, timeout=20)
    assert cp.returncode == 0 and cp.stderr == "", cp.stderr
    try:
        st = subprocess.run([str(STAGE), "--socket", str(sock), "status"], capture_output=True,
                            text=True, timeout=20)
        assert st.returncode == 0 and "n0" in st.stdout, st.stderr
    finally:
        # The daemon, found by its command line whatever the status said.
        for p in os.listdir("/proc"):
            try:
                if p.isdigit() and str(cfg).encode() in open(f"/proc/{p}/cmdline", "rb").read():
                    os.kill(int(p), signal.SIGTERM)
            except OSError:
                pass
        wait_for(lambda: subprocess.run([str(STAGE), "--socket", str(sock), "status"],
                                        capture_output=True).returncode == 3, 20, "the daemon to stop")


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
