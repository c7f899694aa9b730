"""stage pull --cluster: SRC staged on every node, the shared storage read
once in all. The shared storage is a tests/tools/faultfs.py mount with no
page cache (--direct-io), so every byte any node reads through it is counted
by it, as each node's reads reach an NFS server; every node's source root is
that one mount."""
import json
import os
import re
import time

import pytest

from conftest import free_port
from helpers import (after_kill9, assert_tree_equal, json_result, make_tree, run_cmd, F, D, L,
                     wait_for)
from test_replicate import netns_pair  # noqa: F401


def dataset(root, n_small=40, big=(3 << 20, 1 << 20)):
    """Mixed files: small ones in two directories, a few big ones, a link."""
    entries = [D("a"), D("a/b"), D("c")]
    entries += [F(f"a/s{i:03d}", size=1000 + 37 * i) for i in range(n_small // 2)]
    entries += [F(f"a/b/t{i:03d}", size=3000 + 11 * i) for i in range(n_small // 2)]
    entries += [F(f"c/big{i}", size=size) for i, size in enumerate(big)]
    entries += [F("empty", size=0), L("c/link", "big0")]
    make_tree(root, entries)
    return sum(e.size for e in entries if isinstance(e, F))


@pytest.fixture
def shared(fault_mount):
    """The shared storage: (mount, SRC inside it, its size in bytes)."""
    m = fault_mount("nfs", direct_io=True)
    src = m.mnt / "ds"
    size = dataset(src)
    return m, src, size


def read_bytes(m):
    return m.stats()["read_bytes"]


def cluster_of(make_cluster, shared, n, **kw):
    m, src, size = shared
    return make_cluster(n, source_roots=[m.mnt], **kw)


def test_cluster_pull_reads_once_and_stages_everywhere(make_cluster, shared):
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 3)
    before = read_bytes(m)
    cp = nodes[0].run("--json", "pull", src, "--cluster", timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    res, events = json_result(cp.stdout)
    read = read_bytes(m) - before
    # Every byte of the tree read once through the mount, in all.
    assert read == size, f"read {read} bytes through the shared mount for a {size}-byte tree"
    for d in nodes:
        dest = d.dest_of(src)
        assert_tree_equal(src, dest)
        v = d.run("verify", dest)
        assert v.returncode == 0, v.stdout + v.stderr
    notes = [e["text"] for e in events if e["event"] == "note"]
    # Each node says what it read and what came from its peers.
    assert sorted(t.split(":")[0] for t in notes) == ["n0", "n1", "n2"], notes
    assert res["bytes_copied"] == size and res["bytes"] == size, res


def test_independent_pulls_read_n_times(make_cluster, shared):
    """The mount counts what it should: three plain pulls read it thrice."""
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 3)
    before = read_bytes(m)
    for d in nodes:
        cp = d.pull(src)
        assert cp.returncode == 0, cp.stderr
    assert read_bytes(m) - before == 3 * size


def pull_missing_one(nodes, m, src, size, missing, timeout):
    """A cluster pull from n0 that one node misses: exit 1 naming it, the
    source read once, the others' trees exact."""
    before = read_bytes(m)
    cp = nodes[0].run("pull", src, "--cluster", timeout=timeout)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert f"{missing}:" in cp.stderr and f"({missing})" in cp.stderr, cp.stderr
    assert read_bytes(m) - before == size
    for d in nodes:
        if d.name != missing:
            assert_tree_equal(src, d.dest_of(src))
            d.assert_serving()


def roots_of(nodes, src):
    """Each node's root digest of its staged copy (its manifest's last line)."""
    out = {}
    for d in nodes:
        cp = d.run("--json", "verify", d.dest_of(src))
        assert cp.returncode == 0, cp.stdout + cp.stderr
        out[d.name] = json_result(cp.stdout)[0].get("root")
    return out


def kill_mid_pull(nodes, shared, victim):
    """A cluster pull from n0 with the mount capped at 1 MB/s, and kill -9 of
    victim once a quarter of the tree is read: exit 1; its result event and
    all its events."""
    m, src, size = shared
    m.cmd("rate", 1_000_000)
    before = read_bytes(m)
    p = nodes[0].popen("--json", "pull", src, "--cluster")
    wait_for(lambda: read_bytes(m) - before > size // 4, 30, "a quarter of the tree read")
    victim.kill9()
    assert p.wait(120) == 1, p.out_path.read_text() + p.err_path.read_text()
    return json_result(p.out_path.read_text())


def test_node_killed_mid_pull_then_rerun_reads_nothing_again(make_cluster, shared):
    """kill -9 of a node while it reads its share of the source (the mount
    capped at 1 MB/s; the two big files hash to n1): the pull completes on
    the others, which read its share, and exits 1 naming it. Run again with
    it back: it is finished from its peers, and the source is not read
    again (its own share it finds on the node that read it in its place)."""
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 3)
    before = read_bytes(m)
    res, events = kill_mid_pull(nodes, shared, nodes[1])
    assert "n1" in res["text"] and "run it again" in res["text"], res["text"]
    first = read_bytes(m) - before
    m.cmd("clear")              # the checks below read the source too
    for d in (nodes[0], nodes[2]):
        assert_tree_equal(src, d.dest_of(src))
    # n1's share was read by the others; at most what n2 had in flight twice.
    assert size <= first < size + (3 << 20), f"read {first} bytes for a {size}-byte tree"
    after_kill9()
    nodes[1].start()
    before = read_bytes(m)
    cp = nodes[0].run("--json", "pull", src, "--cluster", timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert read_bytes(m) - before == 0, "the rerun read from the source what the nodes held"
    assert_tree_equal(src, nodes[1].dest_of(src))
    assert len(set(roots_of(nodes, src).values())) == 1
    for d in nodes:
        d.assert_serving()


def test_changed_source_repulled_moves_only_the_change(make_cluster, shared):
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 3)
    cp = nodes[1].run("pull", src, "--cluster", timeout=120)
    assert cp.returncode == 0, cp.stderr
    # One small file rewritten, one big one grown, one removed, one new.
    (src / "a" / "s003").write_bytes(b"changed" * 100)
    with open(src / "c" / "big1", "ab") as f:
        f.write(os.urandom(12345))
    (src / "a" / "b" / "t001").unlink()
    (src / "new").write_bytes(b"n" * 777)
    changed = 700 + (1 << 20) + 12345 + 777
    before = read_bytes(m)
    cp = nodes[1].run("--json", "pull", src, "--cluster", timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert read_bytes(m) - before == changed
    for d in nodes:
        assert_tree_equal(src, d.dest_of(src))
    assert len(set(roots_of(nodes, src).values())) == 1


def test_nodes_and_slurm_nodelist_choose_the_nodes(make_cluster, shared):
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 3)
    cp = nodes[0].run("pull", src, "--cluster", "--nodes", "n[0-1]", timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip().splitlines()[-1] == str(nodes[0].dest_of(src))
    assert_tree_equal(src, nodes[1].dest_of(src))
    assert not nodes[2].dest_of(src).exists()
    # Without --nodes, a Slurm job's own nodes (n1 asks for n2 and n1 only).
    before = read_bytes(m)
    cp = nodes[1].run("pull", src, "--cluster", env={"SLURM_JOB_NODELIST": "n[1-2]"}, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert read_bytes(m) - before == 0, "n2 got it all from n1"
    assert_tree_equal(src, nodes[2].dest_of(src))


def test_bad_node_lists_and_a_node_down(make_cluster, shared):
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 3)
    cp = nodes[0].run("pull", src, "--cluster", "--nodes", "n0,n7")
    assert cp.returncode == 2 and "n7" in cp.stderr and "hosts file" in cp.stderr, cp.stderr
    cp = nodes[0].run("pull", src, "--nodes", "n0")
    assert cp.returncode == 2 and "--cluster" in cp.stderr, cp.stderr
    cp = nodes[0].run("pull", "/etc", "--cluster")
    assert cp.returncode == 2, cp.stdout + cp.stderr
    nodes[2].stop()
    pull_missing_one(nodes, m, src, size, "n2", timeout=120)


def test_progress_of_the_whole_cluster(make_cluster, shared):
    """--json progress while the nodes pull (the mount capped at 2 MB/s):
    every node's bytes summed, what was forwarded, and the node furthest
    behind."""
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 3)
    m.cmd("rate", 2_000_000)
    cp = nodes[2].run("--json", "pull", src, "--cluster", timeout=120)
    m.cmd("clear")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    res, events = json_result(cp.stdout)
    prog = [e for e in events if e["event"] == "progress" and e.get("bytes_total")]
    assert prog, [e["event"] for e in events]
    assert max(e["bytes_total"] for e in prog) == 3 * size, prog[-1]
    assert any(e.get("slowest") in ("n0", "n1", "n2") for e in prog), prog[-1]
    assert any(0 < e.get("bytes_forwarded", 0) for e in prog), prog[-1]
    done = [e["bytes_done"] for e in prog]
    assert done == sorted(done) and done[-1] > done[0], done
    # With the readers slowed, small files wait in the queue: those queued
    # for one reader are asked for together.
    batched = [int(x) for d in nodes
               for x in re.findall(r"(\d+) small files came in \d+ batches", d.log())]
    assert sum(batched) > 0, "no small file came in a batch"


def test_a_node_whose_part_fails_early_costs_the_others_nothing(make_cluster, shared):
    """n2 cannot open its destination (a file stands where the tree goes):
    its part fails before it serves anything, and the others, asking it for
    its share, are told at once that it does not serve the pull (they read
    its share themselves) instead of waiting for each file."""
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 3)
    blocker = nodes[2].dest_of(src)
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_bytes(b"not a directory")
    pull_missing_one(nodes, m, src, size, "n2", timeout=60)
    assert blocker.read_bytes() == b"not a directory"


def asked_by(d):
    """Who asked node d to take part in its last cluster pull (its log)."""
    who = re.findall(r"cluster pull \w+ asked by (n\d+)", d.log())
    return who[-1] if who else None


def test_cluster_pull_through_relays(make_cluster, shared):
    """[cluster] fanout = 2 on six nodes: n0 asks n1 (relaying for n2) and n3
    (relaying for n4 and n5). Every tree exact, the source read once, one
    root; every node's answer reaches the asker, named; the progress is the
    six nodes' summed, with the slowest named."""
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 6, cluster_keys={"fanout": 2})
    m.cmd("rate", 4_000_000)
    before = read_bytes(m)
    cp = nodes[0].run("--json", "pull", src, "--cluster", timeout=120)
    m.cmd("clear")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert read_bytes(m) - before == size
    res, events = json_result(cp.stdout)
    assert "on 6 nodes" in res["text"], res["text"]
    for d in nodes:
        assert_tree_equal(src, d.dest_of(src))
    assert len(set(roots_of(nodes, src).values())) == 1
    notes = [e["text"] for e in events if e["event"] == "note"]
    assert sorted(t.split(":")[0] for t in notes) == [f"n{i}" for i in range(6)], notes
    assert {d.name: asked_by(d) for d in nodes[1:]} == \
        {"n1": "n0", "n2": "n1", "n3": "n0", "n4": "n3", "n5": "n3"}
    assert "relaying for 2 nodes" in nodes[3].log()
    prog = [e for e in events if e["event"] == "progress" and e.get("bytes_total")]
    assert max(e["bytes_total"] for e in prog) == 6 * size, prog[-1]
    assert any(e.get("slowest") in [d.name for d in nodes] for e in prog), prog[-1]
    done = [e["bytes_done"] for e in prog]
    assert done == sorted(done) and done[-1] > done[0], done
    for d in nodes:
        d.assert_serving()


def test_relay_down_before_the_pull(make_cluster, shared):
    """n3, which would relay for n4 and n5, is stopped: n0 cannot reach it,
    so the middle of its group, n5, relays for n4 in its place; only n3
    misses the pull."""
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 6, cluster_keys={"fanout": 2})
    nodes[3].stop()
    cp = nodes[0].run("--json", "pull", src, "--cluster", timeout=120)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    res, events = json_result(cp.stdout)
    assert "(n3)" in res["text"], [e["text"] for e in events if e["event"] == "note"]
    for d in nodes:
        if d is not nodes[3]:
            assert_tree_equal(src, d.dest_of(src))
    assert asked_by(nodes[5]) == "n0" and asked_by(nodes[4]) == "n5"


def test_relay_killed_mid_pull(make_cluster, shared):
    """kill -9 of n3, relaying for n4 and n5, while the nodes read (the mount
    at 1 MB/s): the pull ends, exit 1 naming n3 and the two it was asking
    for (asked through n3); n0, n1 and n2 are exact, having read the
    others' shares. Run again with n3 back, it finishes all six from what
    the nodes hold, reading less than the tree from the source."""
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 6, cluster_keys={"fanout": 2})
    res, events = kill_mid_pull(nodes, shared, nodes[3])
    m.cmd("clear")
    assert "(n3, n4, n5)" in res["text"], res["text"]
    notes = {e["text"].split(":")[0]: e["text"] for e in events if e["event"] == "note"}
    for n in ("n4", "n5"):
        assert "asked through n3" in notes[n], notes
    for d in nodes[:3]:
        assert_tree_equal(src, d.dest_of(src))
        d.assert_serving()
    after_kill9()
    nodes[3].start()
    before = read_bytes(m)
    cp = nodes[0].run("--json", "pull", src, "--cluster", timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert read_bytes(m) - before < size
    for d in nodes:
        assert_tree_equal(src, d.dest_of(src))
    assert len(set(roots_of(nodes, src).values())) == 1


@pytest.mark.timeout(120)
def test_link_down_mid_pull(netns_pair, shared, make_cluster):
    """n0 and n1 in one network namespace, n2 in another behind a veth link
    ([cluster] peer_timeout = 3). The link goes down while the nodes read
    (the mount at 1 MB/s): within a few timeouts n0 and n1 take n2 for gone,
    read its share, and the pull ends, exit 1 naming n2, the two exact. With
    the link back, the pull run again finishes n2 and every tree is the
    source's, one root. n2, meanwhile, has taken its asker for gone by
    itself (its reports not acknowledged for peer_timeout), with the link
    still down, and its part has stopped: before, it ran on, holding the
    destination, and the rerun was refused ("another pull into ... is in
    progress"). (The fixtures in this order: the daemons, each in a
    namespace with its own view of the mount, stop before it is unmounted,
    which otherwise waits 20 s for them.)"""
    na, nb, da, db, aa, ab = netns_pair
    m, src, size = shared
    nodes = make_cluster(3, source_roots=[m.mnt], cluster_keys={"peer_timeout": 3},
                         addrs=[f"{aa}:{free_port()}", f"{aa}:{free_port()}",
                                f"{ab}:{free_port()}"], netns=[na, na, nb])
    m.cmd("rate", 1_000_000)
    before = read_bytes(m)
    p = nodes[0].popen("--json", "pull", src, "--cluster")
    wait_for(lambda: read_bytes(m) - before > size // 4, 30, "a quarter of the tree read")
    run_cmd("ip", "-n", na, "link", "set", da, "down")
    try:
        assert p.wait(60) == 1, p.out_path.read_text() + p.err_path.read_text()
        first = re.search(r"cluster pull ([0-9a-f]{32}) asked by n0", nodes[2].log()).group(1)
        wait_for(lambda: f"cluster pull {first}: over here" in nodes[2].log(), 3 + 10,
                 "n2's part of the first pull to end with its asker out of reach")
        assert "has taken nothing sent to it for 3000 ms: taken for gone" in nodes[2].log()
    finally:
        run_cmd("ip", "-n", na, "link", "set", da, "up")
    m.cmd("clear")
    res, events = json_result(p.out_path.read_text())
    assert "(n2)" in res["text"], res["text"]
    for d in nodes[:2]:
        assert_tree_equal(src, d.dest_of(src))
        d.assert_serving()
    wait_for(lambda: all(" UP " in run_cmd("ip", "-n", ns, "-br", "link", "show", "dev", dev).stdout
                         for ns, dev in ((na, da), (nb, db))), 10, "the link back up", 0.1)
    cp = nodes[0].run("--json", "pull", src, "--cluster", timeout=90)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    for d in nodes:
        assert_tree_equal(src, d.dest_of(src))
    assert len(set(roots_of(nodes, src).values())) == 1


def test_two_pulls_into_one_destination(make_cluster, shared):
    """A cluster pull from n1 while one from n0 of the same source into the
    same destinations still runs (the mount slowed): every node's part of the
    second waits for the first's, at most peer_timeout and two reports (its
    asker might have given up on it), then refuses, naming it; the second
    pull exits 1, the first finishes exact. Run again once the first is
    over, the second succeeds."""
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 3, cluster_keys={"peer_timeout": 2})
    m.cmd("rate", 500_000)
    p = nodes[0].popen("--json", "pull", src, "--cluster")
    wait_for(lambda: all("cluster pull" in d.log() and "onto 3 nodes" in d.log() for d in nodes),
             30, "the first pull running on every node")
    t0 = time.monotonic()
    cp = nodes[1].run("--json", "pull", src, "--cluster", timeout=60)
    waited = time.monotonic() - t0
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert waited >= 2, f"refused after {waited:.1f} s, without waiting for the first pull"
    res, events = json_result(cp.stdout)
    notes = "\n".join(e.get("text", "") for e in events) + res["text"]
    for d in nodes:
        assert re.search(rf"{d.name}: .*cluster pull [0-9a-f]{{8}} of {re.escape(str(src))} into "
                         r"the same destination is still running here \(waited \d+ s", notes), \
            (d.name, notes)
    m.cmd("clear")
    assert p.wait(60) == 0, p.out_path.read_text() + p.err_path.read_text()
    for d in nodes:
        assert_tree_equal(src, d.dest_of(src))
    cp = nodes[1].run("--json", "pull", src, "--cluster", timeout=60)
    assert cp.returncode == 0, cp.stdout + cp.stderr


def test_a_file_its_reader_cannot_read_is_refused_at_once(make_cluster, shared):
    """Every read of one file of the tree fails with EIO on the shared mount.
    Its reader notes it, and its peers, asking it for the file, are told at
    once that it could not read it from the source (not kept waiting until
    the reader's whole pull ends); they try the next node or the source,
    where it fails too. The pull ends, exit 1, that file named on every
    node; every other file is staged everywhere."""
    m, src, size = shared
    nodes = cluster_of(make_cluster, shared, 3)
    m.cmd("fail", "read", "/ds/a/s003", 0, "EIO")
    m.cmd("rate", 2_000_000)
    marks = {d.name: len(d.log()) for d in nodes}
    cp = nodes[0].run("--json", "pull", src, "--cluster", timeout=120)
    m.cmd("clear")
    assert cp.returncode == 1, cp.stdout + cp.stderr
    res, events = json_result(cp.stdout)
    notes = [e["text"] for e in events if e["event"] == "note"]
    for d in nodes:
        assert any(t.startswith(f"{d.name}: 1 entries of") and "could not be copied" in t
                   for t in notes), (d.name, notes)
        assert "a/s003" in d.log()[marks[d.name]:], d.name
    told = [d.name for d in nodes
            if re.search(r"a/s003: .*could not read a/s003 from the source", d.log()[marks[d.name]:])]
    assert told, "no node was told at once that the reader could not read a/s003"
    for d in nodes:
        dest = d.dest_of(src)
        for f in ("a/s002", "a/b/t005", "c/big0", "c/big1"):
            assert (dest / f).read_bytes() == (src / f).read_bytes(), (d.name, f)
