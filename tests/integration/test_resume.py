"""stage resume JOB on real daemons: the newest step every node of the job
can resume from, each node's own copy repaired from a partner's where it is
not intact (a lost shard, a flipped byte, a replacement node's empty disk),
the step's local path as the last line of stdout; older steps chosen when
the newest is incomplete somewhere; --dry-run changing nothing; --nodes
naming a node the hosts file lacks, a node down; directories that are not
steps beside them; bad input refused by exit 2."""
import json
import shutil

import pytest

from helpers import F, ckpt, commit_wait, flip_byte, make_tree

JOB = "llm"


def step_of(d, step, seed):
    return make_tree(ckpt(d, JOB, step), [F(f"shard-{d.name}.pt", size=150_000 + seed),
                                          F(".metadata", data=f"{d.name} {step}\n".encode())],
                     seed=seed)


@pytest.fixture
def job3(make_cluster):
    """Three nodes, each the origin of its shards of step-100 and step-200,
    each step replicated to one partner (n0 -> n1 -> n2 -> n0)."""
    nodes = make_cluster(3, replicas=1, transfer={"watch": "off"})
    for k, step in enumerate(("step-100", "step-200")):
        for i, d in enumerate(nodes):
            commit_wait(d, step_of(d, step, 10 * k + i))
    return nodes


def resume(d, *args, code=0):
    cp = d.run("resume", JOB, *args, timeout=120)
    assert cp.returncode == code, f"exit {cp.returncode}\n{cp.stdout}{cp.stderr}\n{d.log()[-2000:]}"
    return cp


def test_all_intact_newest_step(job3):
    n0 = job3[0]
    cp = resume(n0)
    assert cp.stdout.splitlines()[-1] == str(ckpt(n0, JOB, "step-200")), cp.stdout
    assert "resumes from step-200 on 3 nodes (0 repaired, 0 copies sent again)" in cp.stderr, \
        cp.stderr
    # --json for scripts: the path in the result.
    cp = n0.run("resume", JOB, json=True)
    res = [json.loads(l) for l in cp.stdout.splitlines()][-1]
    assert res["event"] == "result" and res["code"] == 0 and res["path"].endswith("/step-200"), res


def test_lost_and_damaged_shards_repaired_everywhere(job3):
    n0, n1, n2 = job3
    lost = ckpt(n1, JOB, "step-200") / "shard-n1.pt"
    want1 = lost.read_bytes()
    lost.unlink()
    bad = ckpt(n2, JOB, "step-200") / "shard-n2.pt"
    want2 = bad.read_bytes()
    flip_byte(bad, 1234)

    # A fast look sees the lost shard; the flipped byte (mtime kept, as
    # bit rot keeps it) only a look at every byte finds.
    cp = resume(n0, "--dry-run")
    assert "would restore llm/step-200 on n1 from n2" in cp.stderr, cp.stderr
    assert "on n2" not in cp.stderr, cp.stderr
    cp = resume(n0, "--dry-run", "--deep")
    assert "would restore llm/step-200 on n1 from n2" in cp.stderr, cp.stderr
    assert "would restore llm/step-200 on n2 from n0" in cp.stderr, cp.stderr
    assert not lost.exists(), "a dry run changed something"

    cp = resume(n0, "--deep")
    # The path is all of stdout: CKPT=$(stage resume JOB) takes it whole.
    assert cp.stdout == str(ckpt(n0, JOB, "step-200")) + "\n", cp.stdout
    assert "(2 repaired, 0 copies sent again)" in cp.stderr, cp.stderr
    assert lost.read_bytes() == want1
    assert bad.read_bytes() == want2
    for d in job3:
        assert d.run("verify", ckpt(d, JOB, "step-200")).returncode == 0


def test_replacement_node_gets_its_shards_and_holdings_back(job3):
    """A replacement node (same name, empty disks): its own shards come back
    from its partner's replica, and the replica it held for n1 is sent to it
    again by n1, so that verify --cluster is clean without another commit."""
    n0, n1, n2 = job3
    want = (ckpt(n2, JOB, "step-200") / "shard-n2.pt").read_bytes()
    n2.stop()
    for d in (n2.base / "ckpt", n2.state_dir, n2.base / "replicas"):
        shutil.rmtree(d)
        d.mkdir()
    n2.start()
    cp = resume(n0, "--dry-run")
    assert "would restore llm/step-200 on n2 from n0" in cp.stderr, cp.stderr
    assert "would have n1 send its llm/step-200 to n2 again" in cp.stderr, cp.stderr
    cp = resume(n1)                    # asked from another node: n2 is repaired remotely
    assert cp.stdout.splitlines()[-1] == str(ckpt(n1, JOB, "step-200"))
    assert "(1 repaired, 1 copy sent again)" in cp.stderr, cp.stderr
    assert (ckpt(n2, JOB, "step-200") / "shard-n2.pt").read_bytes() == want
    # resume returns once the copies it had sent again have landed, so that
    # a launch script's verify --cluster right after it is clean.
    cp = n0.run("verify", ckpt(n0, JOB, "step-200"), "--cluster")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert (n2.base / "replicas" / "n1" / JOB / "step-200" / "shard-n1.pt").exists()


def test_replacement_node_restore_gets_holdings_back(job3):
    """The same with `stage restore` on the replacement node: its shards come
    back, and n1 is asked to send the replica n2 held for it."""
    n0, n1, n2 = job3
    n2.stop()
    for d in (n2.base / "ckpt", n2.state_dir, n2.base / "replicas"):
        shutil.rmtree(d)
        d.mkdir()
    n2.start()
    cp = n2.run("restore", ckpt(n2, JOB, "step-200"), timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "n1: llm/step-200 sent to n2 again, confirmed there" in cp.stderr, cp.stderr
    cp = n0.run("verify", ckpt(n0, JOB, "step-200"), "--cluster")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert (n2.base / "replicas" / "n1" / JOB / "step-200" / "shard-n1.pt").exists()


def test_incomplete_newest_step_falls_back(job3):
    n0, n1, n2 = job3
    # step-300 reached n0 and n1 only: n2 died before it wrote its shards.
    for i, d in enumerate((n0, n1)):
        commit_wait(d, step_of(d, "step-300", 30 + i))
    cp = resume(n0)
    assert cp.stdout.splitlines()[-1] == str(ckpt(n0, JOB, "step-200")), cp.stdout + cp.stderr
    assert "step-300: no copy of n2's shards on any node" in cp.stderr, cp.stderr
    # A step whose shards of one node are intact nowhere is passed over too.
    for d in (n0, n1, n2):
        commit_wait(d, step_of(d, "step-400", 40 + int(d.name[1])))
    flip_byte(ckpt(n1, JOB, "step-400") / "shard-n1.pt", 7)
    flip_byte(n2.base / "replicas" / "n1" / JOB / "step-400" / "shard-n1.pt", 7)
    cp = resume(n0, "--deep")
    assert cp.stdout.splitlines()[-1] == str(ckpt(n0, JOB, "step-200")), cp.stdout + cp.stderr
    assert "step-400: no intact copy of n1's shards on any node (its own is damaged) " \
        "(every byte read)" in cp.stderr, cp.stderr


def test_other_directories_do_not_hide_steps(job3):
    """A trainer's tensorboard/ or tmp/ beside its steps sorts after step-N:
    the survey keeps steps with a manifest only, so they push none out."""
    n0 = job3[0]
    for k in range(20):
        (ckpt(n0, JOB, f"zz-tmp-{k}")).mkdir(parents=True)
    (ckpt(n0, JOB, "tensorboard") / "events").mkdir(parents=True)
    cp = resume(n0)
    assert cp.stdout.splitlines()[-1] == str(ckpt(n0, JOB, "step-200"))
    assert "(0 repaired, 0 copies sent again)" in cp.stderr, cp.stderr


def test_nodes_and_failures(job3, make_cluster):
    n0, n1, n2 = job3
    # --nodes: the job's nodes; one the hosts file lacks is a usage error.
    resume(n0, "--nodes", "n[0-2]")
    cp = resume(n0, "--nodes", "n[0-3]", code=2)
    assert "unknown node 'n3'" in cp.stderr, cp.stderr
    # A node down: its own copy is unknown, so nothing can be promised.
    n2.kill9()
    cp = resume(n0, code=1)
    assert "n2 could not be asked" in cp.stderr and "cannot resume" in cp.stderr, cp.stderr
    # Without it in the job, the others resume.
    cp = resume(n0, "--nodes", "n0,n1")
    assert cp.stdout.splitlines()[-1] == str(ckpt(n0, JOB, "step-200"))
    # Bad input.
    for args, words in [(("resume", "a/b"), "not a job name"), (("resume",), "missing operand"),
                        (("resume", JOB, "--cluster"), "does not apply")]:
        cp = n0.run(*args)
        assert cp.returncode == 2 and words in cp.stderr, (args, cp.stderr)
    cp = n0.run("resume", "nosuchjob")
    assert cp.returncode == 1 and "no node that answered holds any step" in cp.stderr, cp.stderr
    n0.assert_serving()
