"""Skipping what did not change: when step N+1 of a job is replicated, the
receiver looks through its own replica store (the other steps of
ORIGIN/JOB first, then every other copy under replica_root) for chunks
whose XXH3-128 digest the offered manifest lists (a file of at most one
chunk counts as one chunk, its digest the file's), copies those from its
local copy, checking every chunk digest and the whole-file digest, and the
sender sends only the rest.

What the tests read: `stage status` on the sender ("peer: n1 HOST:PORT:
partner, up, ..., R bytes sent as W, H bytes held there": R raw bytes
ever sent to that partner, H bytes ever skipped because it held them) and
the receiver's log ("ORIGIN/JOB/STEP: received and published (N bytes
received, M from local copies)"). Every cluster here runs with
compress = off, so raw bytes are wire bytes, and with the watcher off.
"""
import os
import re
import shutil
import time

import pytest

from helpers import (CHUNK, F, assert_landed_match_source, flip_byte, landed_files,
                     make_tree, manifest_path, ckpt, replica, assert_replica_of, commit_wait,
                     bytes_sent_to, after_kill9)

MiB = 1 << 20


# ---------------------------------------------------------------- helpers

def cluster(make_cluster, n=2, transfer=None, **kw):
    """make_cluster with the watcher and compression off: a commit happens
    only when the test says so, and raw bytes sent are wire bytes."""
    return make_cluster(n, transfer={"watch": "off", "compress": "off", **(transfer or {})}, **kw)


def tensors(d, n=8, size=3 * MiB, step="step-100", seed=1):
    """A checkpoint step of n equal random tensor files and a small json."""
    return make_tree(ckpt(d, step=step), [F(f"model-{i:02d}.bin", size=size) for i in range(n)]
                     + [F("config.json", data=b'{"layers": 8, "dtype": "bf16"}\n')], seed=seed)


def next_step(prev, step, changed):
    """STEP next to PREV: a copy of it (mtimes kept, no .stage) in which the
    files named in `changed` are rewritten with new random bytes of the same
    size. Returns (path, bytes changed)."""
    new = prev.parent / step
    shutil.copytree(prev, new, ignore=shutil.ignore_patterns(".stage"))
    n = 0
    for name in changed:
        size = (new / name).stat().st_size
        (new / name).write_bytes(os.urandom(size))
        n += size
    return new, n


def file_bytes(top, names=None):
    """Bytes of the regular files beneath top (or of those named)."""
    files = landed_files(top)
    return sum(st.st_size for rel, st in files.items() if names is None or rel in names)


def verify_deep(d, path):
    v = d.run("verify", path, "--deep", timeout=60)
    assert v.returncode == 0, f"verify --deep {path} on {d.name}: {v.returncode}\n{v.stdout}{v.stderr}"


def peer_line(d, peer):
    st = d.status(timeout=20).stdout
    m = re.search(rf"^peer:\s+{peer.name} .*$", st, re.M)
    assert m, f"no peer line for {peer.name} in stage status on {d.name}:\n{st}"
    return m.group(0)


def bytes_held_by(d, peer):
    """Bytes d's sender has ever skipped because peer held them already."""
    line = peer_line(d, peer)
    m = re.search(r"\b(\d+) bytes held there", line)
    assert m, f"no 'bytes held there' in the status line: {line!r}"
    return int(m.group(1))


def published(holder, key):
    """(received, from local copies) of the last 'KEY: received and
    published (...)' in holder's log."""
    found = re.findall(rf"^.*{re.escape(key)}: received and published "
                       rf"\((\d+) bytes received, (\d+) from local copies\)", holder.log(), re.M)
    assert found, f"no '{key}: received and published (N bytes received, M from local copies)' " \
                  f"in {holder.name}'s log:\n{holder.log()[-3000:]}"
    return tuple(int(x) for x in found[-1])


CHANGED = [f"model-{i:02d}.bin" for i in (1, 3, 5, 7)]
UNCHANGED = [f"model-{i:02d}.bin" for i in (0, 2, 4, 6)]


# ---------------------------------------------------------------- half of the step unchanged

def test_half_unchanged_sends_at_most_55_percent(make_cluster):
    """Step-200 keeps 4 of step-100's 8 tensors: at most 55 % of its bytes
    cross the network (the 4 rewritten tensors must), the sender counts the
    rest as held by the partner, the receiver says it took them from local
    copies, and both replicas are exact: byte for byte, verify --deep, and
    verify --cluster on the origin."""
    n0, n1 = cluster(make_cluster, 2)
    s100 = tensors(n0)
    commit_wait(n0, s100)
    assert_replica_of(s100, replica(n1, n0))
    sent0, held0 = bytes_sent_to(n0, n1), bytes_held_by(n0, n1)

    s200, changed = next_step(s100, "step-200", CHANGED)
    total = file_bytes(s200)
    unchanged = file_bytes(s200, UNCHANGED)
    commit_wait(n0, s200)
    sent = bytes_sent_to(n0, n1) - sent0
    held = bytes_held_by(n0, n1) - held0
    assert changed <= sent <= 0.55 * total, \
        f"{sent} bytes sent for step-200 ({total} bytes, {changed} of them changed)"
    assert unchanged <= held <= total - changed, f"held there rose by {held}, {unchanged} unchanged"

    r200 = replica(n1, n0, step="step-200")
    assert_replica_of(s200, r200)
    assert_replica_of(s100, replica(n1, n0))           # the local source is untouched
    received, local = published(n1, "n0/job1/step-200")
    assert local >= unchanged and received >= changed, (received, local)
    assert received + local == total, f"{received} received + {local} local != {total} bytes"
    verify_deep(n1, replica(n1, n0))
    verify_deep(n1, r200)
    v = n0.run("verify", s200, "--cluster", timeout=120)
    assert v.returncode == 0, f"verify --cluster: {v.returncode}\n{v.stdout}{v.stderr}"


def test_one_changed_chunk_in_a_big_file(make_cluster):
    """A few bytes changed inside one chunk of a 256-chunk file: the next
    step costs less than two chunks on the wire, and its replica is exact."""
    n0, n1 = cluster(make_cluster, 2)
    s100 = make_tree(ckpt(n0), [F("model.bin", size=256 * CHUNK + 1234), F("meta.json", data=b'{"s": 1}\n')])
    commit_wait(n0, s100)
    sent0 = bytes_sent_to(n0, n1)

    s200, _ = next_step(s100, "step-200", [])
    with open(s200 / "model.bin", "r+b") as f:
        f.seek(100 * CHUNK + 1000)
        f.write(b"\x5a" * 16)
    commit_wait(n0, s200)
    sent = bytes_sent_to(n0, n1) - sent0
    assert sent < 2 * CHUNK + 64 * 1024, f"{sent} bytes sent for one changed chunk"
    assert_replica_of(s200, replica(n1, n0, step="step-200"))
    verify_deep(n1, replica(n1, n0, step="step-200"))


def test_content_found_anywhere_in_the_store(make_cluster):
    """Chunks are found in any copy under replica_root, not only in the same
    job's other steps: job2/step-1 holds, under another name, the content of
    a file of job1/step-100, and that content is not sent again."""
    n0, n1 = cluster(make_cluster, 2)
    s100 = make_tree(ckpt(n0), [F("weights.bin", size=64 * CHUNK + 77), F("meta.json", size=300)], seed=3)
    commit_wait(n0, s100)
    sent0 = bytes_sent_to(n0, n1)

    other = ckpt(n0, job="job2", step="step-1")
    other.mkdir(parents=True)
    shutil.copy2(s100 / "weights.bin", other / "renamed-shard.pt")
    (other / "notes.txt").write_bytes(b"another job\n")
    size = (other / "renamed-shard.pt").stat().st_size
    commit_wait(n0, other)
    sent = bytes_sent_to(n0, n1) - sent0
    assert sent < size / 4, f"{sent} bytes sent for a {size}-byte file n1 already holds elsewhere"
    r = replica(n1, n0, job="job2", step="step-1")
    assert_replica_of(other, r)
    verify_deep(n1, r)


# ---------------------------------------------------------------- a damaged local copy

def test_damaged_local_copy_is_fetched_instead(make_cluster):
    """Bit rot in the older replica (one byte of an unchanged tensor, size
    and mtime kept): the receiver notices the chunk does not match while
    copying it, refuses once, and on the sender's retry fetches what it
    lacks over the network; commit --wait still succeeds and the new
    replica is exact, without the rot."""
    n0, n1 = cluster(make_cluster, 2)
    s100 = tensors(n0, size=2 * MiB)
    commit_wait(n0, s100)
    r100 = replica(n1, n0)
    victim = r100 / UNCHANGED[1]
    flip_byte(victim, 5 * CHUNK + 17)            # puts size and mtime (ns) back as they were
    assert n1.run("verify", r100, "--deep", timeout=60).returncode == 1, "the flipped byte went unnoticed"
    sent0 = bytes_sent_to(n0, n1)
    seen0, seen1 = len(n0.log()), len(n1.log())   # that verify logged "does not match" already

    s200, changed = next_step(s100, "step-200", CHANGED)
    cp = n0.run("commit", s200, "--wait", timeout=60)
    assert cp.returncode == 0, \
        f"commit --wait exited {cp.returncode}\n{cp.stdout}{cp.stderr}\nn0:\n{n0.log()[-2000:]}\nn1:\n{n1.log()[-2000:]}"
    r200 = replica(n1, n0, step="step-200")
    assert_replica_of(s200, r200)
    verify_deep(n1, r200)
    log0, log1 = n0.log()[seen0:], n1.log()[seen1:]
    assert "fetching it instead" in log1, log1[-3000:]
    assert "does not match" in log0 + log1 + cp.stderr, f"the refusal is nowhere:\nn0:\n{log0}\nn1:\n{log1}"
    sent = bytes_sent_to(n0, n1) - sent0
    assert sent >= changed + CHUNK, f"{sent} bytes sent, {changed} changed: the damaged chunk was not fetched?"


# ---------------------------------------------------------------- kill -9 mid-transfer

@pytest.mark.timeout(180)
def test_kill9_receiver_mid_dedup_transfer_resumes(make_cluster):
    """kill -9 of the receiver in the middle of a step-200 whose half is
    held already (48 of 96 MiB to send at 20 MiB/s): nothing appears under
    the final name before the copy is complete, and after a restart the
    copy completes exact and commit --wait exits 0."""
    n0, n1 = cluster(make_cluster, 2, node_transfer={0: {"rate": "20MiB"}})
    s100 = tensors(n0, size=12 * MiB)
    commit_wait(n0, s100)
    sent0 = bytes_sent_to(n0, n1)

    s200, _ = next_step(s100, "step-200", CHANGED)
    final = replica(n1, n0, step="step-200")
    p = n0.popen("commit", s200, "--wait")

    deadline = time.monotonic() + 30
    while bytes_sent_to(n0, n1) - sent0 < 8 * MiB:
        assert not final.exists(), f"{final} exists before the copy is complete"
        assert p.poll() is None, f"commit ended early: {p.returncode} {p.err_path.read_text()}"
        assert time.monotonic() < deadline, "timed out waiting for 8 MiB of step-200 to be sent"
        time.sleep(0.02)
    n1.kill9()
    assert not final.exists(), f"{final} exists after kill -9 mid-transfer"
    assert p.poll() is None, f"commit --wait ended with the receiver down: {p.err_path.read_text()}"
    after_kill9()
    n1.start()

    deadline = time.monotonic() + 60
    while p.poll() is None:
        if final.exists():                     # published (a rename): complete at first sight
            assert manifest_path(final).read_bytes() == manifest_path(s200).read_bytes(), \
                "published without the origin's manifest"
            assert_landed_match_source(s200, final)
            break
        assert time.monotonic() < deadline, "commit --wait did not finish after the restart"
        time.sleep(0.02)
    p.wait(60)
    assert p.returncode == 0, f"commit --wait: {p.returncode}\n{p.err_path.read_text()}\n{n0.log()[-3000:]}"
    assert_replica_of(s200, final)
    assert_replica_of(s100, replica(n1, n0))
    assert not landed_files(n1.base / "replicas" / ".incoming"), "leftovers under .incoming"
    verify_deep(n1, final)


# ---------------------------------------------------------------- retention

def test_old_replica_removed_by_retention_is_not_needed_first(make_cluster):
    """keep = 1: step-100, which step-200 pushes out, is still there to copy
    from while step-200 is received (retention runs after publishing), so
    the unchanged half is held, and afterwards only step-200 is kept."""
    n0, n1 = cluster(make_cluster, 2, keep=1)
    s100 = tensors(n0, size=1 * MiB)
    commit_wait(n0, s100)
    sent0, held0 = bytes_sent_to(n0, n1), bytes_held_by(n0, n1)

    s200, changed = next_step(s100, "step-200", CHANGED)
    commit_wait(n0, s200)
    sent = bytes_sent_to(n0, n1) - sent0
    assert sent <= 0.55 * file_bytes(s200), f"{sent} bytes sent of {file_bytes(s200)}"
    assert bytes_held_by(n0, n1) - held0 >= file_bytes(s200, UNCHANGED)
    assert sorted(os.listdir(n1.base / "replicas" / "n0" / "job1")) == ["step-200"]
    assert_replica_of(s200, replica(n1, n0, step="step-200"))
