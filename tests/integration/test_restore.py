"""stage verify --cluster and stage restore between real daemons, with real
damage: a flipped byte, a deleted checkpoint directory, a replacement node
with an empty disk, a node holding another step, a holder that is down, a
truncated or edited manifest.

Clusters come from conftest's make_cluster (nodes n0..nN-1 on loopback,
one hosts file, one key). With replicas = 1, n_i's copy goes to n_{i+1}.
"""
import json
import os
import re
import shutil
import signal
import time

import pytest

from helpers import CHUNK, D, F, L, assert_tree_equal, copy_cells, flip_byte, make_tree, wait_for

JOB, STEP = "job1", "step-100"


def ckpt(d, step=STEP, job=JOB):
    return d.base / "ckpt" / job / step


def replica(holder, origin, step=STEP, job=JOB):
    return holder.base / "replicas" / origin.name / job / step


def shards(root, rank, seed):
    """One rank's part of a checkpoint: a multi-chunk shard, small files,
    a subdirectory, a link."""
    return make_tree(root, [
        F(f"model-rank{rank}.pt", size=6 * CHUNK + 321),
        F(f"optim/rank{rank}.bin", size=2 * CHUNK),
        F("meta.json", data=b'{"step": 100}\n', mode=0o640),
        F("empty", data=b""),
        D("sub/deeper", mode=0o750),
        F("sub/deeper/x.txt", data=b"x" * 100),
        L("latest.pt", f"model-rank{rank}.pt"),
    ], seed=seed)


def commit(d, path, wait=True):
    args = ["commit", str(path)] + (["--wait"] if wait else [])
    cp = d.run(*args, timeout=120)
    assert cp.returncode == 0, f"commit on {d.name}: {cp.stderr}"


@pytest.fixture
def trio(make_cluster, tmp_path):
    """Three nodes, each with its own step-100 committed and replicated to
    its partner; the originals kept in tmp_path/orig for comparison."""
    nodes = make_cluster(3, replicas=1, transfer={"watch": "off"})
    for i, d in enumerate(nodes):
        shards(ckpt(d), i, seed=10 + i)
        shutil.copytree(ckpt(d), tmp_path / "orig" / d.name, symlinks=True)
        commit(d, ckpt(d))
    return nodes


def cverify(d, *extra, step=STEP, json_out=False):
    return d.run("verify", str(ckpt(d, step)), "--cluster", *extra, json=json_out, timeout=120)


def cells(cp):
    return copy_cells(cp.stdout)


# ------------------------------------------------------------ verify --cluster

def test_cluster_verify_all_intact(trio):
    n0, n1, n2 = trio
    cp = cverify(n0)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "verified on 3 nodes" in cp.stderr
    lines = cp.stdout.splitlines()
    assert lines[0].split() == ["ORIGIN", "n0", "n1", "n2"], cp.stdout
    assert lines[1].split() == ["n0", "ok", "ok", "-"], cp.stdout
    assert lines[2].split() == ["n1", "-", "ok", "ok"], cp.stdout
    assert lines[3].split() == ["n2", "ok", "-", "ok"], cp.stdout
    js = cverify(n1, json_out=True)
    assert js.returncode == 0, js.stderr
    c = cells(js)
    assert c[("n0", "n1")]["state"] == "ok" and c[("n0", "n0")]["state"] == "ok"
    assert c[("n0", "n0")]["root"] == c[("n0", "n1")]["root"]
    assert c[("n0", "n0")]["root"] != c[("n1", "n1")]["root"]
    assert c[("n2", "n2")]["files"] == 5
    res = [json.loads(x) for x in js.stdout.splitlines() if '"result"' in x][-1]
    assert res["code"] == 0
    # A replica's path names the same step.
    rp = n1.run("verify", str(replica(n1, n0)), "--cluster", timeout=60)
    assert rp.returncode == 0, rp.stderr


def test_cluster_verify_nodes_of_the_job(make_cluster):
    """--nodes (or SLURM_JOB_NODELIST) names the job's nodes: one that holds
    no copy of the step is a failure even if it never committed anything of
    the job, which without the list nothing can tell."""
    n0, n1, n2 = make_cluster(3, replicas=1, transfer={"watch": "off"})
    for i, d in enumerate((n0, n1)):
        shards(ckpt(d), i, seed=20 + i)
        commit(d, ckpt(d))
    assert cverify(n0).returncode == 0          # n2 took no part, as far as anyone knows
    for extra, env in [(("--nodes", "n[0-2]"), None), ((), {"SLURM_JOB_NODELIST": "n[0-2]"})]:
        cp = n0.run("verify", str(ckpt(n0)), "--cluster", *extra, env=env, timeout=120)
        assert cp.returncode == 1, cp.stdout + cp.stderr
        assert "n2 is one of the job's nodes (--nodes), but no node that answered holds " \
            "anything of it for step-100" in cp.stderr, cp.stderr
        assert "restore cannot repair everything" in cp.stderr, cp.stderr
    assert cverify(n0, "--nodes", "n0,n1").returncode == 0
    cp = cverify(n0, "--nodes", "n0,n9")
    assert cp.returncode == 2 and "unknown node 'n9'" in cp.stderr, cp.stderr
    cp = n0.run("verify", str(ckpt(n0)), "--nodes", "n0")
    assert cp.returncode == 2 and "--nodes names the job's nodes for --cluster" in cp.stderr


def test_flipped_byte_found_and_restored(trio, tmp_path):
    n0, n1, n2 = trio
    victim = ckpt(n1) / "model-rank1.pt"
    flip_byte(victim, 3 * CHUNK + 17)
    # Local deep verify names the file.
    cp = n1.run("verify", str(ckpt(n1)), "--deep")
    assert cp.returncode == 1 and "model-rank1.pt" in cp.stdout, cp.stdout + cp.stderr
    # Fast cluster verify cannot see a flipped byte under an unchanged mtime;
    # --deep can, and names the copy.
    cp = cverify(n0, "--deep")
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert cp.stdout.splitlines()[2].split() == ["n1", "-", "damaged", "ok"], cp.stdout
    assert "n1's own copy of step-100 is damaged" in cp.stderr
    assert "model-rank1.pt" in cp.stdout
    assert "restore" in cp.stderr           # says it is recoverable
    # Restore fetches the damaged chunk only.
    rs = n1.run("restore", str(ckpt(n1)), timeout=120)
    assert rs.returncode == 0, rs.stdout + rs.stderr
    assert "1 file patched in place, 1 chunk" in rs.stderr, rs.stderr
    assert "from n2" in rs.stderr
    assert_tree_equal(tmp_path / "orig" / "n1", ckpt(n1))
    assert n1.run("verify", str(ckpt(n1)), "--deep").returncode == 0
    assert cverify(n2, "--deep").returncode == 0
    # Idempotent: a second restore finds nothing to do.
    again = n1.run("restore", str(ckpt(n1)), timeout=120)
    assert again.returncode == 0 and "nothing to restore" in again.stderr, again.stderr
    assert not any((ckpt(n1) / ".stage" / "tmp").iterdir())


def test_restore_after_verify_deep_reads_only_what_changed(trio, tmp_path):
    """`stage verify --deep` of a checkpoint leaves the record of what it
    found (.stage/damage); a restore right after it repairs that without
    reading the step again, patching the bad chunk in place. A file changed
    after the verify (a byte flipped, its mtime put back: only its ctime
    tells) is not taken at the record's word: it is read and repaired too;
    so is a file in a directory renamed into the step after the verify (the
    file keeps its old ctime; the directory's tells)."""
    n0, n1, n2 = trio
    step = ckpt(n1)
    flip_byte(step / "model-rank1.pt", 3 * CHUNK + 17)
    # Ready before the verify (old ctimes): a copy of sub/ with x.txt damaged.
    shutil.copytree(step / "sub", tmp_path / "sub2", copy_function=shutil.copy2)
    flip_byte(tmp_path / "sub2" / "deeper" / "x.txt", 7)
    cp = n1.run("verify", str(step), "--deep")
    assert cp.returncode == 1 and "model-rank1.pt" in cp.stdout, cp.stdout + cp.stderr
    rec = (step / ".stage" / "damage").read_text()
    assert rec.startswith("stage-damage 1\n") and rec.endswith("end\n"), rec
    assert [x.split()[0] + " " + x.split()[3] + " " + x.split()[4]
            for x in rec.splitlines() if x.startswith("damaged")] == ["damaged 3 model-rank1.pt"]
    ino = os.stat(step / "model-rank1.pt").st_ino
    flip_byte(step / "optim" / "rank1.bin", CHUNK + 5)     # after the verify
    os.rename(step / "sub", tmp_path / "sub-old")
    os.rename(tmp_path / "sub2", step / "sub")
    rs = n1.run("restore", str(step), timeout=120)
    assert rs.returncode == 0, rs.stdout + rs.stderr
    # model-rank1.pt from the record; optim/rank1.bin and sub/deeper/x.txt
    # read again (x.txt, one chunk, rebuilt); meta.json and empty unchanged
    # since: not read.
    assert "1 file rebuilt, 2 files patched in place, 3 chunks" in rs.stderr, rs.stderr
    assert "3 files taken from the last verify --deep, not read again" in rs.stderr, rs.stderr
    assert os.stat(step / "model-rank1.pt").st_ino == ino       # in place, not rebuilt
    assert not (step / ".stage" / "damage").exists()            # used up
    assert_tree_equal(tmp_path / "orig" / "n1", step)
    assert n1.run("verify", str(step), "--deep").returncode == 0
    # The record of that clean verify: nothing found, so a restore with
    # nothing changed since reads nothing and says why it trusts it.
    again = n1.run("restore", str(step), timeout=120)
    assert again.returncode == 0 and "nothing to restore" in again.stderr, again.stderr
    assert "by the last verify --deep" in again.stderr, again.stderr


def test_deleted_checkpoint_dir_restored(trio, tmp_path):
    n0, n1, n2 = trio
    shutil.rmtree(ckpt(n0))
    cp = cverify(n1)
    assert cp.returncode == 1
    assert cp.stdout.splitlines()[1].split() == ["n0", "missing", "ok", "-"], cp.stdout
    assert "n0 has no checkpoint step-100" in cp.stderr
    # The path no longer exists; it is understood from its place under ckpt_root.
    rs = n0.run("restore", str(ckpt(n0)), timeout=120)
    assert rs.returncode == 0, rs.stdout + rs.stderr
    assert "from n1" in rs.stderr
    assert_tree_equal(tmp_path / "orig" / "n0", ckpt(n0))
    assert (ckpt(n0) / ".stage" / "manifest").read_bytes() == \
        (replica(n1, n0) / ".stage" / "manifest").read_bytes()
    assert cverify(n2, "--deep").returncode == 0


def test_replacement_node(trio, tmp_path):
    """n1 dies with its disk; a new n1 (same name, same key, empty disk) gets
    every shard back, and the restore has n0 send again the replica n1 held
    for it, so that verify --cluster is clean without another commit."""
    n0, n1, n2 = trio
    n1.kill9()
    time.sleep(0.5)     # see test_replicate.after_kill9
    for sub in ("ckpt", "replicas", "state"):
        shutil.rmtree(n1.base / sub, ignore_errors=True)
    n1.start()
    rs = n1.run("restore", str(ckpt(n1)), timeout=120)
    assert rs.returncode == 0, rs.stdout + rs.stderr
    assert_tree_equal(tmp_path / "orig" / "n1", ckpt(n1))
    ls = n1.run("ls")
    assert "job1/step-100" in ls.stdout and "state=committed" in ls.stdout, ls.stdout
    assert "n0: job1/step-100 sent to n1 again, confirmed there" in rs.stderr, rs.stderr
    # The restore returns once that copy has landed: clean at once.
    cp = cverify(n0)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cverify(n0, "--deep").returncode == 0


def test_node_with_another_step(make_cluster):
    n0, n1, n2 = make_cluster(3, replicas=1, transfer={"watch": "off"})
    for i, d in enumerate((n0, n1)):
        shards(ckpt(d), i, seed=i)
        commit(d, ckpt(d))
    shards(ckpt(n2, "step-90"), 2, seed=2)
    commit(n2, ckpt(n2, "step-90"))
    cp = cverify(n0)
    assert cp.returncode == 1
    rows = {l.split()[0]: l.split()[1:] for l in cp.stdout.splitlines()[1:4]}
    assert rows["n2"] == ["step-90", "-", "step-90"], cp.stdout
    assert "n2 has no step-100 (its latest checkpoint of the job is step-90)" in cp.stderr
    assert "intact on no node" in cp.stderr


def test_holder_down(trio):
    n0, n1, n2 = trio
    n2.kill9()
    t0 = time.monotonic()
    cp = cverify(n0, json_out=True)
    assert time.monotonic() - t0 < 10
    assert cp.returncode == 1
    c = cells(cp)
    assert c[("", "n2")]["state"] == "unreachable"
    assert c[("n0", "n0")]["state"] == "ok" and c[("n1", "n2")] if ("n1", "n2") in c else True
    text = cp.stdout + cp.stderr
    assert "n2 could not be asked" in text
    assert "its own copy and the replicas it holds are unknown" in text
    # Human form: n2's column is "?".
    hp = cverify(n0)
    assert hp.stdout.splitlines()[1].split() == ["n0", "ok", "ok", "?"], hp.stdout


@pytest.mark.parametrize("how", ["truncate", "edit"])
def test_damaged_manifest(trio, how):
    n0, n1, n2 = trio
    mf = ckpt(n0) / ".stage" / "manifest"
    good = mf.read_bytes()
    if how == "truncate":
        mf.write_bytes(good[: len(good) // 2])
    else:
        mf.write_bytes(good.replace(b"meta.json", b"meta.jsoN", 1))
    cp = n0.run("verify", str(ckpt(n0)))
    assert cp.returncode == 1 and "manifest" in cp.stderr, cp.stderr
    cv = cverify(n1)
    assert cv.returncode == 1
    assert cv.stdout.splitlines()[1].split()[1] == "damaged", cv.stdout
    rs = n0.run("restore", str(ckpt(n0)), timeout=120)
    assert rs.returncode == 0, rs.stdout + rs.stderr
    assert mf.read_bytes() == good
    assert cverify(n1, "--deep").returncode == 0


def test_restore_bad_input(trio, make_daemon, tmp_path):
    n0, n1, n2 = trio
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for args, code, words in [
        (("restore", str(outside)), 2, "not beneath ckpt_root"),
        (("restore", str(ckpt(n0)), "--from", "nosuch"), 2, "--from nosuch"),
        (("restore", str(ckpt(n0)), "--from", "n0"), 2, "names this node"),
        (("restore", str(n0.base / "ckpt" / JOB)), 2, "JOB/STEP"),
        (("verify", str(outside), "--cluster"), 2, "not a checkpoint"),
    ]:
        cp = n0.run(*args)
        assert cp.returncode == code, f"{args}: {cp.returncode} {cp.stderr}"
        assert words in cp.stderr, f"{args}: {cp.stderr}"
    # A step nobody holds a copy of.
    shards(ckpt(n0, "step-7"), 0, seed=7)
    cp = n0.run("restore", str(ckpt(n0, "step-7")))
    assert cp.returncode == 1 and "no other node holds an intact copy" in cp.stderr, cp.stderr
    # n1 holds other steps of n0's job, named as such, and the advice follows.
    assert re.search(r"n1 (holds step-\S+, not this step|: holds nothing of it)", cp.stderr), cp.stderr
    assert "was it committed and replicated?" in cp.stderr, cp.stderr
    # The daemon kept serving.
    assert n0.run("status").returncode == 0
    # A single node has no replicas.
    solo = make_daemon()
    p = solo.base / "ckpt" / JOB / STEP
    shards(p, 0, seed=1)
    cp = solo.run("restore", str(p))
    assert cp.returncode == 1 and "single node" in cp.stderr, cp.stderr


def test_restore_refuses_another_commit(trio, tmp_path):
    """n0 changed a file and committed again while its partner was down: the
    replica is of the older commit. Restore does not mix the two, and
    --from takes the replica's commit whole."""
    n0, n1, n2 = trio
    n1.kill9()
    time.sleep(0.5)
    (ckpt(n0) / "meta.json").write_bytes(b'{"step": 101}\n')
    commit(n0, ckpt(n0), wait=False)
    time.sleep(1)
    n1.start()
    # Right after the restart the sender may be backing off: the replica is
    # still the old commit for a moment. Damage n0's copy to give restore work.
    os.unlink(ckpt(n0) / "optim" / "rank0.bin")
    cp = n0.run("restore", str(ckpt(n0)), "--from", "n1", timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert (ckpt(n0) / "optim" / "rank0.bin").exists()


def test_interrupted_restore_resumes(make_cluster):
    """kill -9 of the origin's daemon in the middle of rebuilding a big file:
    nothing half-built appears under the file's name, and the next restore
    finishes the job (the files already rebuilt are not fetched again)."""
    # The holder serves at most 64 MiB/s (`rate`): the rebuild takes 3 s.
    # The watcher is on, with a short settle: it must not commit the
    # half-restored step, neither before nor after the restart.
    n0, n1 = make_cluster(2, replicas=1, transfer={"watch": "on", "settle": "1"},
                          node_transfer={1: {"rate": str(64 << 20)}})
    make_tree(ckpt(n0), [F("small.bin", size=3 * CHUNK), F("zbig.bin", size=192 << 20)], seed=5)
    commit(n0, ckpt(n0))
    orig = {p: (ckpt(n0) / p).read_bytes() for p in ("small.bin", "zbig.bin")}
    for p in orig:
        os.unlink(ckpt(n0) / p)
    tmp = ckpt(n0) / ".stage" / "tmp"
    client = n0.popen("restore", str(ckpt(n0)))

    def rebuilding():
        return any(t.name.startswith("rebuild.") and t.stat().st_size > (16 << 20)
                   for t in (tmp.iterdir() if tmp.exists() else []))

    wait_for(rebuilding, 60, "the restore to be half-way through zbig.bin")
    n0.kill9()
    client.wait(10)
    assert not (ckpt(n0) / "zbig.bin").exists(), "a half-built file under its final name"
    assert (ckpt(n0) / "small.bin").read_bytes() == orig["small.bin"]
    assert (ckpt(n0) / ".stage" / "restoring").exists()
    time.sleep(0.5)
    n0.start()
    time.sleep(3)                           # past settle: the watcher looked at it
    assert "is finished" not in n0.log(), n0.log()[-2000:]
    cm = n0.run("commit", str(ckpt(n0)))
    assert cm.returncode == 1 and "restore did not finish" in cm.stderr, cm.stderr
    rs = n0.run("restore", str(ckpt(n0)), timeout=120)
    assert rs.returncode == 0, rs.stdout + rs.stderr
    assert "1 file rebuilt" in rs.stderr, rs.stderr       # small.bin was done already
    for p, data in orig.items():
        assert (ckpt(n0) / p).read_bytes() == data
    assert not [t for t in tmp.iterdir() if t.name.startswith("rebuild.")]
    assert not (ckpt(n0) / ".stage" / "restoring").exists()
    assert n0.run("verify", str(ckpt(n0)), "--deep").returncode == 0


def test_restore_from_two_holders_at_once(make_cluster, tmp_path):
    """With two intact copies (replicas = 2) a restore's lanes
    (restore_streams = 4, the default) start on different holders in turn:
    both give bytes, and the result is the original, byte for byte."""
    # Each holder serves n0 at most 32 MiB/s: a 4 MiB file takes 1/8 s, far
    # longer than a lane takes to connect, so every lane gets files.
    n0, n1, n2 = make_cluster(3, replicas=2, transfer={"watch": "off"},
                              node_transfer={1: {"rate": str(32 << 20)},
                                             2: {"rate": str(32 << 20)}})
    make_tree(ckpt(n0), [F(f"shard-{i}.bin", size=(4 << 20) + 17 * i) for i in range(8)]
              + [F("meta.json", data=b"{}\n")], seed=21)
    shutil.copytree(ckpt(n0), tmp_path / "orig", symlinks=True)
    commit(n0, ckpt(n0))
    total = sum(p.stat().st_size for p in (tmp_path / "orig").iterdir())
    shutil.rmtree(ckpt(n0))
    rs = n0.run("restore", str(ckpt(n0)), timeout=120)
    assert rs.returncode == 0, rs.stdout + rs.stderr
    m = re.search(r"from n1 and n2 \((\d+) bytes from it\): 9 files rebuilt, \d+ chunks "
                  r"\((\d+) bytes\) fetched", rs.stderr)
    assert m, rs.stderr
    from_n2, fetched = int(m.group(1)), int(m.group(2))
    assert fetched == total and 0 < from_n2 < total, rs.stderr
    assert "taking the rest" not in rs.stderr, rs.stderr
    assert_tree_equal(tmp_path / "orig", ckpt(n0))
    assert n0.run("verify", str(ckpt(n0)), "--deep").returncode == 0


def test_restore_lane_holder_killed(make_cluster, tmp_path):
    """kill -9 of one of the two holders a restore is fetching from at
    once: the lanes that were on it take the rest from the other holder,
    starting at the chunk each was in, and the step comes back whole."""
    # Each holder serves n0 at most 16 MiB/s over all of n0's lanes to it
    # (one bucket per origin): 96 MiB take about 3 s.
    n0, n1, n2 = make_cluster(3, replicas=2, transfer={"watch": "off"},
                              node_transfer={1: {"rate": str(16 << 20)},
                                             2: {"rate": str(16 << 20)}})
    make_tree(ckpt(n0), [F(f"shard-{i}.bin", size=24 << 20) for i in range(4)], seed=22)
    shutil.copytree(ckpt(n0), tmp_path / "orig", symlinks=True)
    commit(n0, ckpt(n0))
    shutil.rmtree(ckpt(n0))
    client = n0.popen("restore", str(ckpt(n0)))
    tmp = ckpt(n0) / ".stage" / "tmp"

    def both_building():
        return len([t for t in (tmp.iterdir() if tmp.exists() else [])
                    if t.name.startswith("rebuild.") and t.stat().st_size > (4 << 20)]) >= 2

    wait_for(both_building, 60, "two files being rebuilt at once")
    n2.kill9()
    client.wait(120)
    err = client.err_path.read_text()
    assert client.returncode == 0, client.out_path.read_text() + err
    assert "taking the rest of" in err and "from the copy on n1" in err, err
    assert_tree_equal(tmp_path / "orig", ckpt(n0))
    assert not [t for t in tmp.iterdir() if t.name.startswith("rebuild.")]
    assert n0.run("verify", str(ckpt(n0)), "--deep").returncode == 0
    n0.assert_serving()


def test_restore_rate_holds_across_lanes(make_cluster, tmp_path):
    """`rate` on a holder caps what it serves one origin, however many lanes
    the origin's restore fetches over: four files of 16 MiB from a holder
    capped at 16 MiB/s take about 4 s (1 s if each connection had a cap
    of its own). Only a lower bound is asserted: a slow machine only adds."""
    n0, n1 = make_cluster(2, replicas=1, transfer={"watch": "off", "compress": "off"},
                          node_transfer={1: {"rate": str(16 << 20)}})
    make_tree(ckpt(n0), [F(f"shard-{i}.bin", size=16 << 20) for i in range(4)], seed=23)
    shutil.copytree(ckpt(n0), tmp_path / "orig", symlinks=True)
    commit(n0, ckpt(n0))
    shutil.rmtree(ckpt(n0))
    t0 = time.monotonic()
    rs = n0.run("restore", str(ckpt(n0)), timeout=120)
    took = time.monotonic() - t0
    assert rs.returncode == 0, rs.stdout + rs.stderr
    assert "4 files rebuilt" in rs.stderr, rs.stderr
    assert took > 3.0, f"64 MiB at 16 MiB/s in {took:.2f} s: the cap is per connection"
    assert_tree_equal(tmp_path / "orig", ckpt(n0))


def test_restore_moves_aside_what_is_in_the_way(trio, tmp_path):
    """A directory where the manifest has a file (and a file where it has a
    directory): restore moves them into .stage/displaced.N, deletes nothing,
    and names them."""
    n0, n1, n2 = trio
    f = ckpt(n0) / "optim" / "rank0.bin"
    f.unlink()
    f.mkdir()
    (f / "new-shard").write_bytes(b"written after the commit")
    shutil.rmtree(ckpt(n0) / "sub" / "deeper")
    (ckpt(n0) / "sub" / "deeper").write_bytes(b"a file now")
    rs = n0.run("restore", str(ckpt(n0)), timeout=120)
    assert rs.returncode == 0, rs.stdout + rs.stderr
    assert "displaced" in rs.stdout, rs.stdout
    assert_tree_equal(tmp_path / "orig" / "n0", ckpt(n0))
    kept = sorted((ckpt(n0) / ".stage").glob("displaced.*"))
    assert len(kept) == 2, kept
    contents = {p.name: (p / "new-shard").read_bytes() if p.is_dir() else p.read_bytes()
                for p in kept}
    assert sorted(contents.values()) == [b"a file now", b"written after the commit"]


def test_watcher_does_not_commit_a_restore(make_cluster, tmp_path):
    """With watch = on, the files a restore writes look like a trainer
    writing a step (.metadata and all); the watcher must not commit the
    step half-restored, nor again once it is whole."""
    n0, n1 = make_cluster(2, replicas=1, transfer={"watch": "on", "settle": "2"},
                          node_transfer={1: {"rate": str(64 << 20)}})
    make_tree(ckpt(n0), [F("rank0.distcp", size=128 << 20), F(".metadata", data=b"{}")], seed=3)
    commit(n0, ckpt(n0))
    shutil.copytree(ckpt(n0), tmp_path / "orig", symlinks=True)
    shutil.rmtree(ckpt(n0))
    # Only what the watcher says from here on counts: under load it may
    # notice the trainer's own step (above) before the explicit commit does.
    seen = len(n0.log())
    rs = n0.run("restore", str(ckpt(n0)), timeout=120)
    assert rs.returncode == 0, rs.stdout + rs.stderr
    time.sleep(4)                           # past the marker's 2 s of quiet and settle
    log = n0.log()[seen:]
    assert "job1/step-100 is finished" not in log, log[-2000:]
    assert_tree_equal(tmp_path / "orig", ckpt(n0))
    assert n0.run("verify", str(ckpt(n0)), "--deep").returncode == 0


def test_watcher_leaves_a_restored_step_alone_whatever_the_times(make_cluster, tmp_path):
    """The watcher judged "already committed" by times alone: a step is
    committed again when its last write seen is newer than its record. A
    restore's last writes (its mark removed) come after it records the step,
    and a watcher that reads its events late (a loaded node) took them for
    newer still, re-reading the whole step while the job restarts. Here the
    writes come well after the restore (a file made and removed in the step
    once it is whole, and its marker's times set and set back): the step
    still matches the manifest its record vouches for, so it is not
    committed again. A real change after that is."""
    n0, n1 = make_cluster(2, replicas=1, transfer={"watch": "on", "settle": "1"})
    make_tree(ckpt(n0), [F("rank0.distcp", size=4 << 20), F(".metadata", data=b"{}")], seed=5)
    commit(n0, ckpt(n0))
    shutil.rmtree(ckpt(n0))
    rs = n0.run("restore", str(ckpt(n0)), timeout=120)
    assert rs.returncode == 0, rs.stdout + rs.stderr
    time.sleep(3)                           # the restore's own events settled
    seen = len(n0.log())
    (ckpt(n0) / ".stage" / "touched").write_bytes(b"")
    os.unlink(ckpt(n0) / ".stage" / "touched")
    st = os.stat(ckpt(n0) / ".metadata")
    os.utime(ckpt(n0) / ".metadata")        # the marker touched, content and mtime kept
    os.utime(ckpt(n0) / ".metadata", ns=(st.st_atime_ns, st.st_mtime_ns))
    wait_for(lambda: re.search(r"unchanged since its commit or restore|step-100 is finished",
                               n0.log()[seen:]), 20, "the watcher to see the step again")
    log = n0.log()[seen:]
    assert "job1/step-100 is finished" not in log, log[-2000:]
    seen = len(n0.log())
    with open(ckpt(n0) / "rank0.distcp", "r+b") as f:
        f.write(b"new")
    wait_for(lambda: "job1/step-100 is finished" in n0.log()[seen:], 20,
             "the changed step committed")


def test_single_node_verify_cluster(make_daemon):
    """No hosts file: the cluster is this node; its own copy decides."""
    d = make_daemon(transfer={"watch": "off"})
    shards(ckpt(d), 0, seed=4)
    commit(d, ckpt(d))
    cp = cverify(d)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "verified on 1 node" in cp.stderr
    os.unlink(ckpt(d) / "meta.json")
    cp = cverify(d)
    assert cp.returncode == 1 and "own copy of step-100 is damaged" in cp.stderr, cp.stderr
