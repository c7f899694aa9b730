"""A step just committed goes to a partner as it is hashed, its manifest
last ([transfer] read_once; docs/PROTOCOL.md, "The manifest last"): the
committer's lanes and one partner's sender read the step at the same time,
the pieces go at once, and the manifest follows them. The receiver hashes
what lands and publishes only what the manifest that came last vouches
for, entry for entry and digest for digest. With read_once = auto a job's
copies go so only where dedup would save little (its copies there that
went manifest first found less than an eighth held). A copy so sent that
cannot finish (a daemon killed, a file changed under it) leaves nothing
published that is wrong, and the step gets there the usual way. Real
daemons on 127.0.0.1."""
import os
import time

from helpers import (D, F, L, assert_replica_of, ckpt, commit_wait, make_tree, replica,
                     wait_for)

MiB = 1 << 20
LATE = "(sent as it was hashed, its manifest last)"


def late_confirmed(d, step):
    return [ln for ln in d.log().splitlines()
            if f"job1/{step}: confirmed on" in ln and LATE in ln]


def entries(size=6 * MiB):
    return [D("d", mode=0o750), F("d/a.bin", size=size), F("d/empty", size=0),
            F("one", size=1), F("b.bin", size=2 * MiB + 1, mode=0o600), L("ln", "d/a.bin"),
            D("d/e")]


def test_a_step_goes_as_it_is_hashed(make_cluster):
    """read_once = on, three streams, chunks of 1 MiB: the copy goes as it
    is hashed (n0 says so), and n1's copy is the step byte for byte with
    n0's manifest, not the digestless one it was offered."""
    n0, n1 = make_cluster(2, transfer={"read_once": "on", "streams": 3,
                                       "chunk_size": "1MiB", "compress": "off"})
    step = make_tree(ckpt(n0), entries(), seed=3)
    commit_wait(n0, step)
    assert_replica_of(step, replica(n1, n0))
    assert late_confirmed(n0, "step-100"), n0.log()[-3000:]
    assert "received and published" in n1.log()
    # Nothing of the offer is left in the copy: neither the digests that
    # landed nor the manifest under its name of transit.
    left = sorted(p.name for p in (replica(n1, n0) / ".stage").iterdir())
    assert left == ["manifest"], left


def test_off_sends_the_manifest_first(make_cluster):
    """read_once = off: the copy waits for the hash, as before."""
    n0, n1 = make_cluster(2, transfer={"read_once": "off"})
    step = make_tree(ckpt(n0), entries(size=MiB), seed=4)
    commit_wait(n0, step)
    assert_replica_of(step, replica(n1, n0))
    assert not late_confirmed(n0, "step-100")


def test_auto_goes_late_only_where_dedup_saves_little(make_cluster):
    """auto: a job's first two copies go manifest first (the second
    measures what the steps share). Steps of fresh bytes share nothing, so
    the third goes as it is hashed. Steps that share most of their bytes
    keep going manifest first, each sending only what changed."""
    n0, n1 = make_cluster(2, keep=10, transfer={"chunk_size": "1MiB", "compress": "off"})
    for i in range(1, 4):
        step = make_tree(ckpt(n0, job="job1", step=f"step-{i}"),
                         [F("w.bin", size=8 * MiB)], seed=10 + i)
        commit_wait(n0, step)
        assert_replica_of(step, replica(n1, n0, job="job1", step=f"step-{i}"))
    assert not late_confirmed(n0, "step-1") and not late_confirmed(n0, "step-2")
    assert late_confirmed(n0, "step-3"), n0.log()[-3000:]

    same = os.urandom(8 * MiB)
    for i in range(1, 4):
        data = bytearray(same)
        data[:4096] = os.urandom(4096)         # the first chunk changes, the rest stays
        step = make_tree(ckpt(n0, job="job2", step=f"step-{i}"),
                         [F("w.bin", data=bytes(data))], seed=1)
        commit_wait(n0, step)
        assert_replica_of(step, replica(n1, n0, job="job2", step=f"step-{i}"))
    log = n0.log()
    late2 = [ln for ln in log.splitlines() if "job2/" in ln and LATE in ln]
    assert not late2, late2
    held = [ln for ln in log.splitlines() if "job2/step-3 to n1:" in ln and "held there" in ln]
    assert held and " 7340032 held there already" in held[-1], held


def test_a_file_changed_after_its_hash_is_not_published(make_cluster):
    """The copy goes slowly (8 MiB/s); once the hash is written, the last
    MiB of the file changes (its size and mtime kept). The bytes sent are
    not what the manifest that came last says: n1 refuses the copy, names
    the file, and publishes nothing of it."""
    n0, n1 = make_cluster(2, transfer={"read_once": "on", "rate": "8MiB", "compress": "off",
                                       "chunk_size": "1MiB"})
    step = make_tree(ckpt(n0), [F("w.bin", size=24 * MiB)], seed=5)
    f = step / "w.bin"
    st = f.stat()
    cp = n0.popen("commit", step)
    wait_for(lambda: (step / ".stage" / "manifest").exists(), 20, "the hash")
    with open(f, "r+b") as fh:
        fh.seek(23 * MiB)
        fh.write(os.urandom(MiB))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    cp.wait(timeout=30)
    wait_for(lambda: "differs from the manifest that came last" in n0.log(), 30,
             "n1's refusal, heard by n0")
    assert "w.bin: its content differs from the manifest that came last" in n1.log(), \
        n1.log()[-3000:]
    time.sleep(1)
    assert not replica(n1, n0).exists()


def test_killed_mid_copy_the_step_still_gets_there(make_cluster):
    """kill -9 of the sender, then of the receiver, in the middle of a copy
    sent as it is hashed (8 MiB/s): each time the copy gets there, exact,
    once the daemon is back."""
    n0, n1 = make_cluster(2, transfer={"read_once": "on", "rate": "8MiB", "compress": "off"})
    for k, victim in enumerate((n0, n1)):
        name = f"step-{k + 1}"
        step = make_tree(ckpt(n0, step=name), [F("w.bin", size=24 * MiB), F("x", size=10)],
                         seed=20 + k)
        n0.popen("commit", step)
        inc = n1.replica_root / ".incoming" / "n0" / "job1" / name / "w.bin"
        wait_for(lambda: inc.exists() and inc.stat().st_size >= 4 * MiB, 20,
                 "the copy under way")
        victim.kill9()
        victim.start()
        if victim is n0:
            commit_wait(n0, step, timeout=90)
        else:
            wait_for(lambda: replica(n1, n0, step=name).exists(), 90, "the copy after n1's restart")
        assert_replica_of(step, replica(n1, n0, step=name))
