"""Hostile paths between nodes: a proxy between n0 and n1 that alters or
records what passes. Every frame after the handshake is sealed
(docs/PROTOCOL.md), on both wires, so an altered byte ends the connection;
the sender reconnects, the receiver's journal resumes the copy, and the
replica comes out exact. On an encrypted wire what the frames carry is not
on the path."""
import socket
import threading
import time

from helpers import F, assert_replica_of, ckpt, commit_wait, make_tree, replica, wait_for
import os
import pytest
import signal
import subprocess

MiB = 1 << 20


class Proxy:
    """127.0.0.1:port -> target; in the client-to-server direction, flips one
    byte at stream offset flip_at (counted over every connection), once;
    record: keeps every byte of that direction in self.recorded; cut_conn:
    the connection of that number (from 1, in accept order) is cut once
    cut_after bytes of it have passed that way; with stall, it is not cut
    but goes silent then (nothing more forwarded either way, nothing
    closed: a path that black-holes). rate: bytes per second each connection
    forwards that way at most (a path that holds each flow to a rate)."""

    def __init__(self, target, flip_at, record=False, cut_conn=None, cut_after=0, stall=False,
                 rate=0):
        self.target = target
        self.rate = rate
        self.flip_at = flip_at
        self.recorded = bytearray() if record else None
        self.cut_conn, self.cut_after, self.cut = cut_conn, cut_after, False
        self.stall = stall
        self.seen = 0
        self.flipped = False
        self.conns = 0
        self.live = 0                   # connections open now
        self.lock = threading.Lock()
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(8)
        self.port = self.ls.getsockname()[1]
        self.stop = False
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def accept_loop(self):
        while not self.stop:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            try:
                s = socket.create_connection(self.target, timeout=5)
            except OSError:
                c.close()
                continue
            s.settimeout(None)
            with self.lock:
                self.conns += 1
                self.live += 1
                num = self.conns
            threading.Thread(target=self.pump, args=(c, s, True, num), daemon=True).start()
            threading.Thread(target=self.pump, args=(s, c, False, num), daemon=True).start()

    def pump(self, src, dst, forward, num=0):
        passed = 0
        t0 = time.monotonic()
        moved = 0
        try:
            while True:
                b = src.recv(65536)
                if not b:
                    break
                if forward and self.rate:
                    moved += len(b)
                    ahead = moved / self.rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
                if num == self.cut_conn and self.stall and self.cut:
                    while not self.stop:
                        time.sleep(0.1)     # silent, and open
                    break
                if forward and num == self.cut_conn:
                    passed += len(b)
                    if passed >= self.cut_after:
                        self.cut = True
                        if self.stall:
                            continue
                        break
                if forward:
                    b = bytearray(b)
                    with self.lock:
                        start = self.seen
                        self.seen += len(b)
                        if not self.flipped and start <= self.flip_at < self.seen:
                            b[self.flip_at - start] ^= 0x20
                            self.flipped = True
                        if self.recorded is not None:
                            self.recorded += b
                dst.sendall(bytes(b))
        except OSError:
            pass
        for sk in (src, dst):
            try:
                sk.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if forward:
            with self.lock:
                self.live -= 1

    def close(self):
        self.stop = True
        self.ls.close()


def proxied(make_cluster, wires=("authenticated", "authenticated"), **proxy_args):
    """n0 and n1 ([cluster] wire per node), n0 reaching n1 through a Proxy;
    not started."""
    n0, n1 = make_cluster(2, transfer={"watch": "off", "compress": "off"}, start=False)
    n0.cluster["wire"], n1.cluster["wire"] = wires
    for d in (n0, n1):
        d.write_config()
    real = n1.listen
    host, port = real.rsplit(":", 1)
    proxy = Proxy((host, int(port)), **proxy_args)
    hosts = n0.cluster["hosts"]
    hosts.write_text(hosts.read_text().replace(real, f"127.0.0.1:{proxy.port}"))
    return n0, n1, proxy


@pytest.mark.parametrize("wire", ["authenticated", "encrypted"])
def test_byte_altered_in_transit(make_cluster, wire):
    """One byte of n0's stream to n1 altered mid-transfer: the sealed frame
    fails its tag, n1 drops the connection, n0 reconnects and resumes, and
    the replica is exact. Nothing altered ever lands. On both wires."""
    n0, n1, proxy = proxied(make_cluster, (wire, wire), flip_at=3 * MiB + 12345)
    try:
        n0.start()
        n1.start()
        step = make_tree(ckpt(n0), [F(f"t{i}.bin", size=3 * MiB + i) for i in range(3)])
        commit_wait(n0, step)
        assert proxy.flipped, "the proxy never altered a byte: the test proved nothing"
        assert proxy.conns >= 2, f"n0 did not reconnect after the altered frame ({proxy.conns})"
        assert_replica_of(step, replica(n1, n0))
        wait_for(lambda: "failed its seal" in n1.log() and "resuming" in n1.log(), 10,
                 f"n1 to say why it dropped the connection:\n{n1.log()[-2000:]}")
    finally:
        proxy.close()


@pytest.mark.parametrize("wires,encrypted", [
    (("encrypted", "authenticated"), True),
    (("authenticated", "encrypted"), True),
    (("authenticated", "authenticated"), False),
])
def test_wire_what_the_path_sees(make_cluster, wires, encrypted):
    """Everything n0 sends n1 recorded on the path: with [cluster] wire =
    encrypted on either end, neither the checkpoint's bytes nor its job's
    name are in it; with both ends at the default (authenticated) both are
    (the recording would show them: the test can fail). The replica is
    exact either way."""
    n0, n1, proxy = proxied(make_cluster, wires, flip_at=1 << 62, record=True)
    marker = b"the-weights-nobody-else-may-read:"
    try:
        n0.start()
        n1.start()
        step = make_tree(ckpt(n0, job="job-secret-name"),
                         [F("w.bin", data=marker * 4096), F("x.bin", size=MiB)])
        commit_wait(n0, step)
        assert_replica_of(step, replica(n1, n0, job="job-secret-name"))
        seen = bytes(proxy.recorded)
        assert len(seen) > len(marker) * 4096, f"the proxy saw {len(seen)} bytes only"
        if encrypted:
            assert marker not in seen, "checkpoint bytes crossed the encrypted wire in clear"
            assert b"job-secret-name" not in seen, "the job's name crossed in clear"
        else:
            assert seen.count(marker) >= 4000, "the authenticated wire should carry the bytes as they are"
            assert b"job-secret-name" in seen
    finally:
        proxy.close()


def threads_of(d):
    with open(f"/proc/{d.proc.pid}/status") as f:
        return int(next(ln for ln in f if ln.startswith("Threads:")).split()[1])


def test_connection_flood(make_cluster):
    """200 connections to n1's peer port that never prove the key: n1 takes
    only a few at a time (each costs a thread and buffers until its
    handshake times out), says so, keeps serving its clients, and once the
    flood is gone replicates as before."""
    n0, n1 = make_cluster(2, transfer={"watch": "off"})
    host, port = n1.listen.rsplit(":", 1)
    base = threads_of(n1)
    flood = []
    try:
        for _ in range(200):
            s = socket.create_connection((host, int(port)), timeout=5)
            flood.append(s)
        time.sleep(1)
        assert threads_of(n1) < base + 40, f"n1 runs {threads_of(n1)} threads under the flood"
        t0 = time.monotonic()
        st = n1.status(timeout=10)
        assert st.returncode == 0 and time.monotonic() - t0 < 5, st
        assert "refusing a peer connection" in n1.log(), n1.log()[-2000:]
    finally:
        for s in flood:
            s.close()
    step = make_tree(ckpt(n0), [F("a.bin", size=2 * MiB)])
    commit_wait(n0, step, timeout=60)
    assert_replica_of(step, replica(n1, n0))


def test_trickling_peer_is_dropped(make_cluster):
    """A connection that sends its first frame a byte a second (each byte
    well inside any per-read timeout) is dropped when the handshake's 10 s
    are up, not kept for as long as it trickles."""
    n0, n1 = make_cluster(2, transfer={"watch": "off"})
    host, port = n1.listen.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    t0 = time.monotonic()
    closed = None
    try:
        for i in range(40):                      # 40 s of trickling at most
            try:
                s.send(b"S")
                s.settimeout(1)
                if s.recv(4096) == b"":
                    closed = time.monotonic() - t0
                    break
            except socket.timeout:
                continue
            except OSError:
                closed = time.monotonic() - t0
                break
    finally:
        s.close()
    assert closed is not None, "n1 kept a trickling connection for 40 s"
    assert closed < 15, f"n1 dropped the trickling connection only after {closed:.1f} s"
    wait_for(lambda: "no answer within" in n1.log() or "malformed" in n1.log(), 5,
             f"n1 to say why:\n{n1.log()[-1500:]}")


@pytest.mark.timeout(120)
def test_client_that_stops_reading_cannot_wedge_a_job(daemon):
    """job.c send_or_hang_up() -> msg_send(): a blocking sendmsg on the
    client's socket with no send timeout (ctl.c sets only SO_RCVTIMEO). A
    client that stops reading (suspended with Ctrl-Z, or stuck writing its
    own output) while the job has more notes to send than the socket
    buffers hold blocks the job thread inside send: job_cancelled() is never
    reached, the pull keeps its lock, and SIGTERM cannot stop it (the daemon
    waits its 30 s grace and exits with the job still running)."""
    src = daemon.src_root / "ds"
    src.mkdir()
    for i in range(12000):                 # one "skipped ... not a regular file" note each
        os.mkfifo(src / f"fifo-with-a-long-enough-name-{i:05}")
    # The client's stderr is a pipe nobody reads: once it is full the client
    # stops reading the socket, as a suspended client would.
    proc = subprocess.Popen(daemon.cmd("pull", src), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(5)
        t0 = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        try:
            daemon.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        took = time.monotonic() - t0
    finally:
        proc.kill()                        # the job's send fails now: the daemon can exit
        proc.wait(60)
        proc.stderr.close()
        try:
            daemon.proc.wait(40)
            daemon.runs[-1][1] = "term"
        except subprocess.TimeoutExpired:
            pass
    assert took < 10, f"staged still running {took:.0f} s after SIGTERM: a job is stuck in send()"
