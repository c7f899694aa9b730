"""One copy on several connections ([transfer] streams, docs/PROTOCOL.md,
"Streams"): the pieces of a copy go on the streams in turns, a chunk's
pieces on one stream, each stream a sealed connection of its own served by a
thread of its own on both sides, which on the receiver decodes the pieces
and hashes their chunks. The copy must come out exact whatever the number of
streams and whether a chunk is smaller or bigger than a piece, with held
chunks left out; a further stream lost mid-copy (cut, or gone silent) hands
its turns to the streams left without a reconnect, and the offer's own
connection lost costs a resume from the receiver's journal, never a wrong
byte. And a commit hashed on several
threads ([transfer] hash_threads) writes the manifest one thread writes.
A partner whose replicas are on a tmpfs (no O_DIRECT there: its writes go
through the page cache) must build as exact a copy, and survive its kill -9
mid-copy.
Real daemons on 127.0.0.1; the stream is cut by a proxy on the path."""
import os
import re
import socket
import threading
import time

import pytest

from helpers import (CHUNK, F, assert_replica_of, bytes_sent_to, check_manifest_against, ckpt,
                     commit_wait, make_tree, replica, wait_for)
from test_hostile import Proxy

MiB = 1 << 20


def streams_said(d, peer):
    """What d's `stage status` says of its streams to peer: (n, why)."""
    st = d.status(timeout=20).stdout
    m = re.search(rf"^peer:\s+{peer.name} .*?, (\d+) streams? \((.*)\)$", st, re.M)
    assert m, f"no streams in the status line of {peer.name}:\n{st}"
    return int(m.group(1)), m.group(2)


def tree(d, step="step-100", seed=1):
    """Files of many pieces, of one piece, of a piece and a bit, and empty:
    the turns cross files and ranges."""
    return make_tree(ckpt(d, step=step), [
        F("a.bin", size=9 * MiB + 17),
        F("b.bin", size=3 * CHUNK),
        F("c/small.json", size=700),
        F("c/one.bin", size=MiB),
        F("d.bin", size=MiB + 1),
        F("empty", data=b""),
    ], seed=seed)


@pytest.mark.parametrize("n,chunk", [(2, "64KiB"), (3, "64KiB"), (16, "64KiB"), (3, "4MiB"),
                                     (2, "2MiB")])
def test_copy_on_streams(make_cluster, n, chunk):
    """A commit on n streams: the replica is exact, status says n streams
    and why, and n1 served the pieces on that many connections. Chunks of
    64 KiB: many in a piece, every piece its own turn; of 2 and 4 MiB: a
    turn is a chunk of 2 or 4 pieces (and a file's last, shorter chunk)."""
    n0, n1 = make_cluster(2, transfer={"watch": "off", "streams": n, "chunk_size": chunk})
    step = tree(n0)
    commit_wait(n0, step)
    assert_replica_of(step, replica(n1, n0))
    got, why = streams_said(n0, n1)
    assert got == n and why == f"[transfer] streams = {n}", (got, why)
    # and the next copy goes on the same connections
    step2 = tree(n0, step="step-200", seed=2)
    commit_wait(n0, step2)
    assert_replica_of(step2, replica(n1, n0, step="step-200"))
    assert "stream" not in n1.log().lower() or "refused" not in n1.log(), n1.log()[-2000:]


def test_streams_leave_out_held_chunks(make_cluster):
    """Held chunks (the partner copies them from its copy of the step
    before) are left out on three streams as on one: the second step, half
    of it unchanged, sends about half its bytes and comes out exact."""
    n0, n1 = make_cluster(2, transfer={"watch": "off", "streams": 3})
    files = [F(f"s{i}.bin", size=4 * CHUNK) for i in range(4)]
    s1 = make_tree(ckpt(n0, step="step-1"), files, seed=1)
    commit_wait(n0, s1)
    before = bytes_sent_to(n0, n1)
    s2 = make_tree(ckpt(n0, step="step-2"), files[:2], seed=1)          # unchanged
    make_tree(s2, [F(f"s{i}.bin", size=4 * CHUNK) for i in (2, 3)], seed=7)  # new bytes
    commit_wait(n0, s2)
    assert_replica_of(s2, replica(n1, n0, step="step-2"))
    sent = bytes_sent_to(n0, n1) - before
    assert sent <= 8 * CHUNK + MiB, f"{sent} bytes sent for 8 new chunks: held chunks went too"


def proxied_streams(make_cluster, chunk="64KiB", cluster_keys=None, node0=None, **proxy_args):
    """n0 (node0's [transfer] keys: by default 3 streams, 40 MiB/s) reaching
    n1 through a Proxy; started."""
    n0, n1 = make_cluster(2, transfer={"watch": "off", "compress": "off", "chunk_size": chunk},
                          node_transfer={0: node0 or {"streams": 3, "rate": "40MiB"}},
                          cluster_keys=cluster_keys, start=False)
    real = n1.listen
    host, port = real.rsplit(":", 1)
    proxy = Proxy((host, int(port)), flip_at=1 << 62, **proxy_args)
    hosts = n0.cluster["hosts"]
    hosts.write_text(hosts.read_text().replace(real, f"127.0.0.1:{proxy.port}"))
    n0.start()
    n1.start()
    return n0, n1, proxy


SIZES = [16 * MiB + i for i in range(4)]


@pytest.mark.parametrize("chunk", ["64KiB", "4MiB"])
def test_stream_cut_mid_copy_hands_its_turns_on(make_cluster, chunk):
    """The second connection n0 opens to n1 (its first further stream) is
    cut after 6 MiB: n1 names the lost stream and the point the pieces go on
    from (with chunks of 4 MiB, the start of the chunk it was in: part of it
    had come), n0 sends them on the two streams left without reconnecting
    or offering again, and the replica is exact. What went twice is only
    what was on its way: far less than the journal's 64 MiB. The next copy
    dials a third stream again."""
    n0, n1, proxy = proxied_streams(make_cluster, chunk, cut_conn=2, cut_after=6 * MiB)
    try:
        step = make_tree(ckpt(n0), [F(f"t{i}.bin", size=n) for i, n in enumerate(SIZES)])
        commit_wait(n0, step, timeout=120)
        assert proxy.cut, "the proxy never cut the stream: the test proved nothing"
        assert proxy.conns == 3, f"n0 reconnected ({proxy.conns} connections)"
        assert_replica_of(step, replica(n1, n0))
        m = re.search(r"stream 1 lost \((.*?)\); its turns go to the 2 streams left, from "
                      r"entry (\d+) byte (\d+)", n1.log())
        assert m, n1.log()[-3000:]
        if chunk == "4MiB":
            assert int(m.group(3)) % (4 * MiB) == 0, m.group(0)
        assert re.search(r"stream 1 lost; its turns go to the 2 left, from entry "
                         rf"{m.group(2)} byte {m.group(3)}", n0.log()), n0.log()[-3000:]
        assert "resuming" not in n1.log() and "refused" not in n0.log(), n1.log()[-3000:]
        again = bytes_sent_to(n0, n1) - sum(SIZES)
        assert 0 <= again <= 24 * MiB, f"{again} bytes sent twice"
        assert streams_said(n0, n1)[0] == 2
        step2 = make_tree(ckpt(n0, step="step-200"), [F("u.bin", size=8 * MiB)], seed=3)
        commit_wait(n0, step2, timeout=60)
        assert_replica_of(step2, replica(n1, n0, step="step-200"))
        assert streams_said(n0, n1)[0] == 3 and proxy.conns == 4, proxy.conns
    finally:
        proxy.close()


def test_stream_cut_among_held_chunks(make_cluster):
    """A second step of which every other file is held (the first step's
    bytes), its first further stream cut mid-copy: the pieces from the
    point go over the held files again, and n0 counts each held byte once
    (its log's "held there already" is exactly the held files' bytes), and
    the replica is exact."""
    n0, n1, proxy = proxied_streams(make_cluster, cut_after=3 * MiB)
    try:
        files = [F(f"f{i:02}.bin", size=2 * MiB) for i in range(12)]
        s1 = make_tree(ckpt(n0, step="step-1"), files, seed=1)
        commit_wait(n0, s1, timeout=120)
        proxy.cut_conn = 2              # from now: n0's first further stream
        s2 = make_tree(ckpt(n0, step="step-2"), files[0::2], seed=1)    # held
        make_tree(s2, files[1::2], seed=5)                               # new bytes
        commit_wait(n0, s2, timeout=120)
        assert proxy.cut, "the proxy never cut the stream: the test proved nothing"
        assert proxy.conns == 3, f"n0 reconnected ({proxy.conns} connections)"
        assert_replica_of(s2, replica(n1, n0, step="step-2"))
        assert re.search(r"stream 1 lost; its turns go to the 2 left", n0.log()), \
            n0.log()[-3000:]
        held = re.findall(r"job1/step-2 to n1: \d+ bytes sent, (\d+) held there already",
                          n0.log())
        assert held == [str(6 * 2 * MiB)], (held, n0.log()[-3000:])
    finally:
        proxy.close()


def test_stream_silent_mid_copy_hands_its_turns_on(make_cluster):
    """A further stream goes silent mid-copy (a path that drops everything,
    nothing closed): n1 gives it up after three quarters of the peer
    timeout, before n0's sends on stream 0 time out, and the copy goes on
    the two streams left; n0's thread stuck sending on the silent one is
    woken. The replica is exact, and nobody reconnected."""
    n0, n1, proxy = proxied_streams(make_cluster, "4MiB", cluster_keys={"peer_timeout": 4},
                                    cut_conn=3, cut_after=5 * MiB, stall=True)
    try:
        step = make_tree(ckpt(n0), [F(f"t{i}.bin", size=n) for i, n in enumerate(SIZES)])
        commit_wait(n0, step, timeout=120)
        assert proxy.cut, "the proxy never went silent: the test proved nothing"
        assert_replica_of(step, replica(n1, n0))
        assert re.search(r"stream 2 lost \(nothing came for the peer timeout\); its turns go "
                         r"to the 2 streams left", n1.log()), n1.log()[-3000:]
        assert proxy.conns == 3, f"n0 reconnected ({proxy.conns} connections)"
    finally:
        proxy.close()


def test_stream_0_cut_mid_copy_resumes(make_cluster):
    """The offer's own connection (stream 0) cut after 10 MiB: that loses the
    copy, as on one connection. n0 reconnects every stream, the copy resumes
    from n1's journal (a lost connection, not a refusal: no try counted),
    and the replica is exact."""
    n0, n1, proxy = proxied_streams(make_cluster, cut_conn=1, cut_after=10 * MiB)
    try:
        step = make_tree(ckpt(n0), [F(f"t{i}.bin", size=n) for i, n in enumerate(SIZES)])
        commit_wait(n0, step, timeout=120)
        assert proxy.cut, "the proxy never cut the stream: the test proved nothing"
        assert proxy.conns >= 4, f"n0 did not reconnect after the cut ({proxy.conns} connections)"
        assert_replica_of(step, replica(n1, n0))
        wait_for(lambda: "resuming" in n1.log(), 10, f"n1 to resume:\n{n1.log()[-3000:]}")
        assert "refused" not in n0.log(), n0.log()[-3000:]
    finally:
        proxy.close()


def test_streams_after_partner_restart(make_cluster):
    """A copy committed while its partner is down goes on two streams once
    the partner is back: the sender dials every stream again and the copy
    is exact."""
    n0, n1 = make_cluster(2, transfer={"watch": "off", "streams": 2})
    step = tree(n0)
    n1.stop()
    cp = n0.run("commit", step)
    assert cp.returncode == 0, cp.stderr
    time.sleep(0.5)
    n1.start()
    wait_for(lambda: replica(n1, n0).exists(), 60,
             f"the copy after n1's restart:\n{n0.log()[-2000:]}")
    assert_replica_of(step, replica(n1, n0))
    assert streams_said(n0, n1)[0] == 2


@pytest.mark.parametrize("threads,cache", [(1, "warm"), (3, "warm"), (3, "always"), (3, "auto")])
def test_commit_hashed_on_threads(make_cluster, threads, cache):
    """A step of many small files and a few big ones, committed with the
    files hashed on `threads` threads at once (and read through the page
    cache only where they are, always, or within the budget the threads
    share): the manifest lists every entry
    in order with the digests xxhsum gives, `stage verify` passes, and the
    replica is exact."""
    n0, n1 = make_cluster(2, transfer={"watch": "off", "hash_threads": threads,
                                       "cache_reads": cache})
    files = [F(f"shard-{i:03d}.bin", size=(i * 7919) % (3 * CHUNK) + i) for i in range(60)]
    files += [F("big/a.bin", size=9 * MiB + 3), F("big/b.bin", size=5 * MiB),
              F("big/c/d.bin", size=2 * CHUNK + 1), F("empty", data=b"")]
    step = make_tree(ckpt(n0), files, seed=5)
    commit_wait(n0, step)
    check_manifest_against(step, step)
    v = n0.run("verify", step)
    assert v.returncode == 0, v.stdout + v.stderr
    assert_replica_of(step, replica(n1, n0))


@pytest.mark.parametrize("pinned", [False, True])
def test_streams_by_default_follow_the_cores(make_cluster, pinned):
    """[transfer] streams = 0 (the default) adapts, from a quarter of the
    CPUs the daemon may run on (1 to 8) up to half of them (1 to 16); a copy
    this small (under 32 MiB) measures nothing, so the count stays; status
    says so, and the copy is exact. Pinned: the daemons started on one CPU
    (as under a cpuset or systemd's CPUAffinity=) count that one, not the
    machine's."""
    mine = os.sched_getaffinity(0)
    if pinned:
        os.sched_setaffinity(0, {min(mine)})        # the daemons inherit it
    try:
        n0, n1 = make_cluster(2, transfer={"watch": "off", "streams": 0})
    finally:
        os.sched_setaffinity(0, mine)
    cpus = 1 if pinned else len(mine)
    cap = min(16, max(1, cpus // 2))
    want = min(cap, min(8, max(1, cpus // 4)))
    step = tree(n0)
    commit_wait(n0, step)
    assert_replica_of(step, replica(n1, n0))
    got, why = streams_said(n0, n1)
    assert got == want and why == (f"adapting, 1 to {cap}, half the {cpus} "
                                   f"CPU{'' if cpus == 1 else 's'} it may run on: "
                                   + ("a cap of 1" if cap == 1 else "no copy measured yet")), \
        (got, why)


@pytest.mark.parametrize("n", [1, 3])
def test_copy_onto_a_tmpfs(big_tmpfs, make_cluster, n):
    """n1's replicas on a tmpfs: on 1 stream and on 3 the replica is exact,
    and so is a second step of the same files changed in part (held chunks
    copied from the first)."""
    n0, n1 = make_cluster(2, transfer={"watch": "off", "streams": n, "compress": "off"},
                          disks={1: big_tmpfs})
    step = tree(n0)
    commit_wait(n0, step)
    assert_replica_of(step, replica(n1, n0))
    files = [F(f"s{i}.bin", size=4 * CHUNK + i) for i in range(4)]
    s1 = make_tree(ckpt(n0, step="step-1"), files, seed=1)
    commit_wait(n0, s1)
    s2 = make_tree(ckpt(n0, step="step-2"), files[:2], seed=1)
    make_tree(s2, files[2:], seed=9)
    commit_wait(n0, s2)
    assert_replica_of(s2, replica(n1, n0, step="step-2"))


def test_partner_on_a_tmpfs_killed_mid_copy(big_tmpfs, make_cluster):
    """kill -9 of n1 while it copies into its tmpfs: restarted, it resumes
    from its journal, reading back what the journal vouches for, and the
    replica is exact."""
    n0, n1 = make_cluster(2, transfer={"watch": "off", "compress": "off", "streams": 3},
                          node_transfer={0: {"rate": "32MiB"}}, disks={1: big_tmpfs})
    step = make_tree(ckpt(n0), [F(f"t{i}.bin", size=12 * MiB + i) for i in range(3)])
    cp = n0.run("commit", step)
    assert cp.returncode == 0, cp.stderr
    inc = n1.replica_root / ".incoming" / n0.name / "job1" / "step-100"
    wait_for(lambda: (inc / ".stage" / "journal").exists() and
             len((inc / ".stage" / "journal").read_text().splitlines()) >= 2, 60,
             f"n1 to journal part of the copy:\n{n1.log()[-2000:]}")
    n1.kill9()
    assert not replica(n1, n0).exists()
    n1.start()
    wait_for(lambda: replica(n1, n0).exists(), 120,
             f"the copy after n1's restart:\n{n0.log()[-2000:]}\n{n1.log()[-2000:]}")
    assert_replica_of(step, replica(n1, n0))
    m = re.search(r"resuming at entry (\d+), byte (\d+)", n1.log())
    assert m and (int(m.group(1)), int(m.group(2))) > (1, 0), n1.log()[-3000:]
