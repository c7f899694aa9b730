"""Questions to many nodes through relays (daemon/cluster/fanout.c): with
[cluster] fanout = 2, nine nodes are asked as a tree three levels deep, so
every path of it is taken on a few daemons: n0 dials n1 and n5 only; n1
relays to n2 directly and to n4 through n3; n5 likewise.

What must hold: the answer through relays is the answer a direct survey
gives (every copy, every root); a relay or a node under one killed with -9
is named, with why, and everything else is still reported, the killed
relay's group asked again through its next node; restore finds its holder
through relays; and the asking node dials no more than `fanout` nodes.
"""
import json
import re
import shutil

from helpers import F, copy_cells, make_tree, wait_for

JOB, STEP = "job1", "step-100"
N = 9


def ckpt(d, step=STEP, job=JOB):
    return d.base / "ckpt" / job / step


def asked_by(nodes, asker, marks):
    """The nodes whose log, since marks, says asker asked them directly."""
    pat = f"{asker.name} asks what this node holds of {JOB}/{STEP}"
    return sorted(d.name for d in nodes if d is not asker and pat in d.log()[marks[d.name]:])


def cells(cp):
    return copy_cells(cp.stdout)


def nine(make_cluster, fanout=2):
    nodes = make_cluster(N, replicas=1, transfer={"watch": "off"},
                         cluster_keys={"fanout": fanout})
    for i, d in enumerate(nodes):
        make_tree(ckpt(d), [F(f"model-rank{i}.pt", size=3 * 65536 + i),
                            F("meta.json", data=b'{"step": 100}\n')], seed=40 + i)
        cp = d.run("commit", str(ckpt(d)), "--wait", timeout=120)
        assert cp.returncode == 0, cp.stderr
    return nodes


def cverify(d, *extra):
    return d.run("--json", "verify", str(ckpt(d)), "--cluster", *extra, timeout=120)


def test_relayed_survey_is_the_direct_one(make_cluster):
    nodes = nine(make_cluster)
    n0 = nodes[0]
    marks = {d.name: len(d.log()) for d in nodes}
    cp = cverify(n0)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert f"verified on {N} nodes" in cp.stdout, cp.stdout
    got = cells(cp)
    want = {(d.name, nodes[(i + j) % N].name) for i, d in enumerate(nodes) for j in (0, 1)}
    assert {k for k, c in got.items() if c["state"] == "ok"} == want, got
    assert asked_by(nodes, n0, marks) == ["n1", "n5"]
    # n1 relays to n2 itself and to n4 through n3: a tree three deep.
    assert re.search(r"n0 asks this node to relay a question to 3 nodes", nodes[1].log())
    assert re.search(r"n1 asks this node to relay a question to 1 node\b", nodes[3].log())
    assert "n3 asks what this node holds" in nodes[4].log()
    roots_relayed = {k: c["root"] for k, c in got.items()}

    # The same cluster asked directly (fanout 16 > 8): the same table.
    for d in nodes:
        d.cluster["fanout"] = 16
        d.write_config()
        d.restart()
    marks = {d.name: len(d.log()) for d in nodes}
    cp = cverify(n0)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert {k: c["root"] for k, c in cells(cp).items()} == roots_relayed
    assert asked_by(nodes, n0, marks) == [d.name for d in nodes[1:]]


def test_relay_killed(make_cluster):
    """n1, the relay of n0's first group, dies: n2..n4 are asked through the
    middle one of them, n3, instead (the nodes next to a lost relay may be
    lost with it), and only n1 is unknown."""
    nodes = nine(make_cluster)
    n0, n1 = nodes[0], nodes[1]
    n1.kill9()
    cp = cverify(n0)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    got = cells(cp)
    assert got[("", "n1")]["state"] == "unreachable", got
    for i in range(2, N):
        for j in (0, 1):
            holder = nodes[(i + j) % N].name
            if holder != "n1":
                assert got[(f"n{i}", holder)]["state"] == "ok", (i, holder, got)
    res = [json.loads(x) for x in cp.stdout.splitlines() if '"result"' in x][-1]
    assert "cannot be verified: 1 node could not be asked" in res["text"], res
    assert "n0 asks this node to relay a question to 2 nodes" in nodes[3].log()
    assert "n3 asks what this node holds" in nodes[2].log()
    for d in nodes[2:]:
        d.assert_serving()


def test_node_under_a_relay_killed(make_cluster):
    """n4 sits two relays down (n0 -> n1 -> n3 -> n4): it is named, with the
    relay it was asked through, and everything else is reported."""
    nodes = nine(make_cluster)
    nodes[4].kill9()
    cp = cverify(nodes[0])
    assert cp.returncode == 1, cp.stdout + cp.stderr
    got = cells(cp)
    assert got[("", "n4")]["state"] == "unreachable", got
    notes = [json.loads(x) for x in cp.stdout.splitlines() if '"note"' in x]
    texts = " ".join(str(n.get("text", "")) for n in notes)
    assert re.search(r"n4 could not be asked \(.*\(asked through n3\) \(asked through n1\)\)", texts), texts
    assert all(got[(f"n{i}", f"n{i}")]["state"] == "ok" for i in range(N) if i != 4), got


def test_restore_through_relays(make_cluster, tmp_path):
    """n6 loses its step; restore asks the cluster (through relays) where
    its copy is, and repairs it from n7."""
    nodes = nine(make_cluster)
    n6 = nodes[6]
    orig = tmp_path / "orig"
    shutil.copytree(ckpt(n6), orig, symlinks=True)
    shutil.rmtree(ckpt(n6))
    cp = n6.run("restore", str(ckpt(n6)), timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert "n7" in cp.stderr, cp.stderr
    assert (ckpt(n6) / "model-rank6.pt").read_bytes() == (orig / "model-rank6.pt").read_bytes()
    wait_for(lambda: cverify(nodes[0]).returncode == 0, 30, "verify --cluster after restore")
