"""The durable tier as the last holder, on real daemons: a restore takes
from it what no replica holds (every chunk checked), or what a replica
holds wrong (a flipped byte the fast survey cannot see), `--from durable`
takes it whole; verify --cluster shows it as a column and names a damaged
part; two neighbours lose their disks at once (an origin and its partner)
and `stage resume` brings both back, one from the durable tier, one from
the surviving partner, and the replicas they held are sent again."""
import json
import os
import shutil
import subprocess

import pytest

from helpers import F, ckpt, commit_wait, flip_byte, make_tree, wait_for

JOB = "llm"
STEP = "step-100"


def shards(d, seed, step=STEP):
    # 5 MiB: two chunks of the default 4 MiB, so a bad chunk is one of two.
    return make_tree(ckpt(d, JOB, step), [F(f"shard-{d.name}.pt", size=(5 << 20) + seed),
                                          F(f"meta-{d.name}.json", data=b'{"r": %d}\n' % seed)],
                     seed=seed)


def drained(root, node, step=STEP):
    return (root / JOB / step / ".stage" / f"manifest.{node}").exists()


def durable_nodes(make_cluster, tmp_path, n):
    """n started nodes, each partner of the next, draining to one root."""
    root = tmp_path / "nfs-ckpt"
    root.mkdir()
    nodes = make_cluster(n, replicas=1, transfer={"watch": "off"}, start=False)
    for d in nodes:
        d.durable = {"root": root}
        d.write_config()
        d.start()
    return nodes, root


@pytest.fixture
def dtrio(make_cluster, tmp_path):
    """n0 -> n1 -> n2 -> n0, each step drained to one durable root."""
    nodes, root = durable_nodes(make_cluster, tmp_path, 3)
    want = {}
    for i, d in enumerate(nodes):
        s = shards(d, i + 1)
        want[d.name] = {p.name: p.read_bytes() for p in s.iterdir() if p.is_file()}
        commit_wait(d, s)
    wait_for(lambda: all(drained(root, d.name) for d in nodes), 60, "every part drained")
    return nodes, root, want


def restore(d, *args, code=0):
    cp = d.run("restore", ckpt(d, JOB, STEP), *args, timeout=120)
    assert cp.returncode == code, f"exit {cp.returncode}\n{cp.stdout}{cp.stderr}\n{d.log()[-3000:]}"
    return cp


def intact(d, want):
    got = {p.name: p.read_bytes() for p in ckpt(d, JOB, STEP).iterdir() if p.is_file()}
    return got == want[d.name]


def test_restore_from_durable_when_no_replica_holds_it(dtrio):
    (n0, n1, n2), root, want = dtrio
    shutil.rmtree(n1.base / "replicas" / "n0" / JOB / STEP)
    (ckpt(n0, JOB, STEP) / "shard-n0.pt").unlink()
    cp = restore(n0)
    assert "restored" in cp.stderr and "from the durable tier" in cp.stderr, cp.stderr
    assert intact(n0, want)
    assert n0.run("verify", ckpt(n0, JOB, STEP)).returncode == 0
    # --from durable takes it from there even when a replica would do.
    flip_byte(ckpt(n1, JOB, STEP) / "shard-n1.pt", 100)
    cp = restore(n1, "--from", "durable")
    assert "from the durable tier" in cp.stderr, cp.stderr
    assert intact(n1, want)


def test_bad_replica_chunk_comes_from_durable(dtrio):
    """The replica on n1 has a flipped byte (mtime kept: its fast check says
    ok): the chunk it sends is refused, the rest comes from the durable tier."""
    (n0, n1, n2), root, want = dtrio
    flip_byte(n1.base / "replicas" / "n0" / JOB / STEP / "shard-n0.pt", (4 << 20) + 17)
    (ckpt(n0, JOB, STEP) / "shard-n0.pt").unlink()
    cp = restore(n0)
    assert "from n1 and the durable tier" in cp.stderr, cp.stderr
    assert "does not match the manifest" in cp.stderr and "taking the rest" in cp.stderr, cp.stderr
    assert intact(n0, want)
    assert n0.run("verify", ckpt(n0, JOB, STEP), "--deep").returncode == 0


def test_no_copy_anywhere_names_the_durable_tier(dtrio):
    (n0, n1, n2), root, want = dtrio
    shutil.rmtree(n1.base / "replicas" / "n0" / JOB / STEP)
    flip_byte(root / JOB / STEP / "shard-n0.pt", 5)     # and the durable copy rots
    (ckpt(n0, JOB, STEP) / "shard-n0.pt").unlink()
    cp = restore(n0, code=1)
    assert "does not match the manifest" in cp.stderr and "durable tier" in cp.stderr, cp.stderr
    assert not (ckpt(n0, JOB, STEP) / "shard-n0.pt").exists(), "a bad file under its name"
    n0.assert_serving()


def test_verify_cluster_durable_column(dtrio):
    (n0, n1, n2), root, want = dtrio
    cp = n0.run("verify", ckpt(n0, JOB, STEP), "--cluster", timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cp.stdout.splitlines()[0].split() == ["ORIGIN", "n0", "n1", "n2", "durable"], cp.stdout
    assert "verified on 3 nodes and the durable tier" in cp.stderr, cp.stderr
    cp = n0.run("verify", ckpt(n0, JOB, STEP), "--cluster", json=True, timeout=120)
    cells = {(o.get("origin"), o.get("holder")): o for o in map(json.loads, cp.stdout.splitlines())
             if o.get("event") == "copy"}
    assert all(cells[(n, "durable")]["state"] == "ok" for n in ("n0", "n1", "n2")), cells
    # A fifo or a link planted among the manifests hangs nothing and is no part.
    os.mkfifo(root / JOB / STEP / ".stage" / "manifest.n9")
    os.symlink("/etc/passwd", root / JOB / STEP / ".stage" / "manifest.n8")
    cp = n0.run("verify", ckpt(n0, JOB, STEP), "--cluster", timeout=60)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    # A part gone wrong on the durable tier is a problem, named.
    with open(root / JOB / STEP / "shard-n1.pt", "r+b") as f:
        f.truncate(1000)
    cp = n0.run("verify", ckpt(n0, JOB, STEP), "--cluster", timeout=120)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert "the copy of n1's step-100 on durable is damaged: shard-n1.pt: size 1000" in cp.stderr, \
        cp.stderr
    # The durable root unreadable: named, and the nodes' copies still shown.
    os.rename(root, str(root) + ".gone")
    cp = n0.run("verify", ckpt(n0, JOB, STEP), "--cluster", timeout=120)
    assert cp.returncode == 1 and "the durable tier" in cp.stderr and \
        "No such file or directory" in cp.stderr, cp.stderr


def wipe(d):
    """A replacement node: same name, empty disks."""
    d.stop()
    for p in (d.base / "ckpt", d.state_dir, d.base / "replicas"):
        shutil.rmtree(p)
        p.mkdir()
    d.start()


def test_two_neighbours_lose_disks(dtrio):
    """n0 and its partner n1 lose their disks at once: n0's shards are on no
    node any more, only on the durable tier; n1's are on n2."""
    (n0, n1, n2), root, want = dtrio
    wipe(n0)
    wipe(n1)
    cp = n2.run("resume", JOB, "--dry-run", timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert f"would restore {JOB}/{STEP} on n0 from durable" in cp.stderr, cp.stderr
    assert f"would restore {JOB}/{STEP} on n1 from n2" in cp.stderr, cp.stderr
    cp = n2.run("resume", JOB, timeout=180)
    assert cp.returncode == 0, cp.stdout + cp.stderr + n0.log()[-2000:]
    assert cp.stdout == str(ckpt(n2, JOB, STEP)) + "\n", cp.stdout
    assert "(2 repaired, 2 copies sent again)" in cp.stderr, cp.stderr
    assert intact(n0, want) and intact(n1, want)
    # The replicas they held come back: verify --cluster is clean again.
    wait_for(lambda: n2.run("verify", ckpt(n2, JOB, STEP), "--cluster",
                            timeout=120).returncode == 0, 90, "verify --cluster clean",
             interval=1)


TRAIN = r"""
import sys, torch
rank, path = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(rank)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
opt = torch.optim.AdamW(model.parameters())
for _ in range(5):
    loss = model(torch.randn(32, 256)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": 100},
           f"{path}/rank-{rank}.pt")
"""

LOAD = r"""
import sys, torch
def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
durable, *origs = sys.argv[1:]
for rank, orig in enumerate(origs):
    got = torch.load(f"{durable}/rank-{rank}.pt")
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    model.load_state_dict(got["model"])          # what a resuming job does with it
    assert same(got, torch.load(f"{orig}/rank-{rank}.pt")), rank
    print(f"rank {rank}: {sum(t.numel() for t in got['model'].values())} parameters equal")
"""


def test_pytorch_loads_the_durable_copy(make_cluster, tmp_path):
    """A real PyTorch job's checkpoint (Debian's python3-torch: torch.save
    per rank), drained, then loaded by torch from the durable root as it is:
    every tensor equal to the original's."""
    torch_ok = subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True)
    assert torch_ok.returncode == 0, "python3-torch is missing (tools/install-deps installs it)"
    nodes, root = durable_nodes(make_cluster, tmp_path, 2)
    for rank, d in enumerate(nodes):
        path = ckpt(d, JOB, STEP)
        path.mkdir(parents=True)
        subprocess.run(["/usr/bin/python3", "-c", TRAIN, str(rank), str(path)], check=True)
        commit_wait(d, path)
    wait_for(lambda: all(drained(root, d.name) for d in nodes), 60, "both ranks drained")
    cp = subprocess.run(["/usr/bin/python3", "-c", LOAD, str(root / JOB / STEP)] +
                        [str(ckpt(d, JOB, STEP)) for d in nodes], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "rank 1: " in cp.stdout and "parameters equal" in cp.stdout, cp.stdout
