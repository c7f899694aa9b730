"""A shared node: one staged as root, many users. Every request acts as the
user who asked (the kernel's word for it), and no user can read, overwrite,
commit, restore or resume what belongs to another. Each test is one or more
rows of docs/SECURITY.md's ownership table, named there.

The users are real: alice and bob (in the group "stagers", which the
control socket is given), carol (not in it), made with useradd if this
machine lacks them. Their files live under a directory of /tmp that they
can reach (pytest's own is root's, 0700). Root only.
"""
import os
import pwd
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from helpers import (IS_ROOT, STAGE, client_env, last_line, replica, rm_tree, snapshot,
                     wait_for)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

GROUP = "stagers"

pytestmark = pytest.mark.skipif(not IS_ROOT, reason="needs root: real users, setuid, chown")


def ensure_user(name, in_group):
    if subprocess.run(["getent", "group", GROUP], capture_output=True).returncode != 0:
        subprocess.run(["groupadd", GROUP], check=True)
    if subprocess.run(["id", name], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-M", "-N", "-g", "users", "-s", "/usr/sbin/nologin"] +
                       (["-G", GROUP] if in_group else []) + [name], check=True)
    pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid


@pytest.fixture(scope="module")
def users():
    return {"alice": ensure_user("alice", True), "bob": ensure_user("bob", True),
            "carol": ensure_user("carol", False)}


@pytest.fixture
def shared():
    """A directory every user can reach; removed after the test."""
    base = Path(tempfile.mkdtemp(prefix="stage-users-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield base
    rm_tree(base)


def open_to_users(d):
    """What an admin does for a shared node: the socket's group, the
    socket's directory searchable, ckpt_root as /tmp is."""
    d.node_extra = {"socket_group": GROUP}
    d.write_config()
    os.chmod(d.sock_dir, 0o755)
    os.chmod(d.ckpt_root, 0o1777)
    return d


def node(make_daemon, base, name="d0", start=True, **kw):
    d = make_daemon(base=base / name, start=False, source_roots=[base / name / "src"], **kw)
    open_to_users(d)
    if start:
        d.start()
    return d


def as_user(d, user, *args, json=False, timeout=60, cwd=None):
    """`stage ARGS` run as user (their groups from the user database)."""
    argv = ["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--init-groups",
            str(STAGE), "--socket", str(d.socket)] + (["--json"] if json else []) + [str(a) for a in args]
    return subprocess.run(argv, capture_output=True, timeout=timeout, cwd=cwd or "/", env=client_env(),
                          encoding="utf-8", errors="surrogateescape")


def make_owned(root, rel, owner, files, dmode=0o755, fmode=0o644):
    """root/rel with files {name: bytes}, owned by owner's uid and gid."""
    top = Path(root) / rel
    top.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        p = top / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    for dirpath, dirs, fnames in os.walk(top):
        os.chown(dirpath, *owner)
        os.chmod(dirpath, dmode)
        for f in fnames:
            os.chown(os.path.join(dirpath, f), *owner)
            os.chmod(os.path.join(dirpath, f), fmode)
    # every directory on the way from root to top is theirs too
    p = top.parent
    while p != Path(root) and Path(root) in p.parents:
        os.chown(p, *owner)
        p = p.parent
    return top


def owners(top):
    """{uid} of everything under top, .stage included."""
    out = set()
    for dirpath, dirs, files in os.walk(top):
        out.add(os.lstat(dirpath).st_uid)
        out.update(os.lstat(os.path.join(dirpath, f)).st_uid for f in files)
    return out


def files_of(top):
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(Path(top).rglob("*"))
            if p.is_file() and ".stage" not in p.parts}


SECRET = b"bob's secret weights " * 100


# -------------------------------------------------------------- pulls

def test_a_user_cannot_pull_what_they_cannot_read(shared, users, make_daemon):
    """Rows 1-2: alice pulls bob's private dataset: refused naming the file
    and 'Permission denied', nothing staged; bob pulls it, and it is his."""
    d = node(make_daemon, shared)
    make_owned(d.src_root, "bob/ds", users["bob"], {"w.bin": SECRET, "sub/x": b"x"}, 0o700, 0o600)
    cp = as_user(d, "alice", "pull", d.src_root / "bob/ds", "--to", d.stage_root / "alicecopy")
    assert cp.returncode != 0, cp.stdout
    assert "Permission denied" in cp.stderr and "bob/ds" in cp.stderr, cp.stderr
    assert not (d.stage_root / "alicecopy" / "w.bin").exists()
    cp = as_user(d, "bob", "pull", d.src_root / "bob/ds", "--to", d.stage_root / "bobds")
    assert cp.returncode == 0, cp.stderr
    assert files_of(d.stage_root / "bobds") == {"w.bin": SECRET, "sub/x": b"x"}
    assert owners(d.stage_root / "bobds") == {users["bob"][0]}
    d.assert_serving()


def test_a_pull_never_writes_into_another_users_destination(shared, users, make_daemon):
    """Rows 3-5: the issue's scene (alice pulls --to bob's staged tree): exit 2
    naming bob, his tree byte-identical; the same when bob's tree is mode
    0777 (the rule is ownership, not the mode); and a destination inside
    his tree is refused too."""
    d = node(make_daemon, shared)
    make_owned(d.src_root, "bob/ds", users["bob"], {"w.bin": SECRET})
    make_owned(d.src_root, "alice/ds", users["alice"], {"w.bin": b"alice"})
    assert as_user(d, "bob", "pull", d.src_root / "bob/ds", "--to", d.stage_root / "bobds").returncode == 0
    before = snapshot(d.stage_root / "bobds")
    for mode in (None, 0o777):
        if mode:
            for dirpath, dirs, files in os.walk(d.stage_root / "bobds"):
                os.chmod(dirpath, mode)
                for f in files:
                    os.chmod(os.path.join(dirpath, f), mode)
            before = snapshot(d.stage_root / "bobds")
        cp = as_user(d, "alice", "pull", d.src_root / "alice/ds", "--to", d.stage_root / "bobds")
        assert cp.returncode == 2, (mode, cp.stdout, cp.stderr)
        assert "belongs to bob" in cp.stderr and "bobds" in cp.stderr, cp.stderr
        assert snapshot(d.stage_root / "bobds") == before
    cp = as_user(d, "alice", "pull", d.src_root / "alice/ds", "--to", d.stage_root / "bobds/inner")
    assert cp.returncode == 2, cp.stdout
    assert "lies in a directory of bob" in cp.stderr, cp.stderr
    assert not (d.stage_root / "bobds/inner").exists()
    assert snapshot(d.stage_root / "bobds") == before
    d.assert_serving()


def test_a_users_pull_is_theirs(shared, users, make_daemon):
    """Row 6: what alice's pull creates is hers, the manifest included; the
    directory right beneath stage_root is made for her; stage_root stays
    root's."""
    d = node(make_daemon, shared)
    make_owned(d.src_root, "alice/ds", users["alice"], {"a": b"1" * 5000, "d/b": b"2"})
    cp = as_user(d, "alice", "pull", d.src_root / "alice/ds")
    assert cp.returncode == 0, cp.stderr
    dest = Path(last_line(cp.stdout))
    assert dest == d.stage_root / "alice/ds"
    assert owners(d.stage_root / "alice") == {users["alice"][0]}
    assert (dest / ".stage/manifest").stat().st_uid == users["alice"][0]
    assert d.stage_root.stat().st_uid == 0
    assert as_user(d, "alice", "verify", dest).returncode == 0


def test_a_private_dataset_on_a_root_squashing_mount(shared, users, make_daemon):
    """Row 7: a shared mount that squashes root (as NFS exports do by
    default). Root cannot read alice's 0600 dataset there; alice stages it
    through the daemon."""
    from faultmount import FaultMount
    m = FaultMount(shared, "nfs", root_squash=True).mount()
    try:
        os.chmod(m.backing, 0o755)     # made on the server's side, as its admin would
        make_owned(m.backing, "alice/ds", users["alice"], {"w.bin": os.urandom(300_000), "e": b""},
                   0o700, 0o600)
        want = files_of(m.backing / "alice/ds")
        d = make_daemon(base=shared / "d0", start=False, source_roots=[m.mnt])
        open_to_users(d)
        d.start()
        cp = d.pull(m.mnt / "alice/ds", "--to", d.stage_root / "rootcopy")
        assert cp.returncode != 0 and "Permission denied" in cp.stderr, (cp.stdout, cp.stderr)
        cp = as_user(d, "alice", "pull", m.mnt / "alice/ds")
        assert cp.returncode == 0, cp.stderr
        dest = Path(last_line(cp.stdout))
        assert files_of(dest) == want
        assert owners(dest) == {users["alice"][0]}
        d.stop()
    finally:
        m.close()


def test_a_symlink_swapped_in_during_a_users_pull_reaches_nothing_of_theirs(shared, users, make_daemon):
    """Row 8, a seeded campaign (STAGE_RACE_ROUNDS, default 12): while alice
    pulls her dataset, a directory of it is swapped again and again for a
    symbolic link to bob's private dataset. A pull acting as alice can never
    stage a byte of bob's."""
    rounds = int(os.environ.get("STAGE_RACE_ROUNDS", "12"))
    rng = random.Random(int(os.environ.get("STAGE_RACE_SEED", "32")))
    d = node(make_daemon, shared)
    bob = make_owned(d.src_root, "bob/priv", users["bob"], {"w.bin": SECRET}, 0o700, 0o600)
    ds = make_owned(d.src_root, "alice/ds", users["alice"],
                    {f"f{i}": os.urandom(rng.randrange(1, 20000)) for i in range(20)})
    stop = threading.Event()

    def swapper():
        real, link, aside = ds / "sub", ds / "sub.link", ds / "sub.real"
        aside.mkdir()
        (aside / "mine").write_bytes(b"alice's own")
        os.chown(aside, *users["alice"])
        os.symlink(bob, link)
        while not stop.is_set():
            os.rename(aside, real)
            time.sleep(rng.random() / 1000)
            os.rename(real, aside)
            os.rename(link, real)
            time.sleep(rng.random() / 1000)
            os.rename(real, link)

    t = threading.Thread(target=swapper)
    t.start()
    try:
        for i in range(rounds):
            dest = d.stage_root / f"alice-{i}"
            as_user(d, "alice", "pull", ds, "--to", dest, timeout=60)
            for p in dest.rglob("*") if dest.exists() else []:
                if p.is_file() and not p.is_symlink():
                    assert SECRET[:20] not in p.read_bytes(), f"round {i}: {p} holds bob's bytes"
    finally:
        stop.set()
        t.join()
    d.assert_serving()


# -------------------------------------------------------------- what a user sees

def test_status_and_ls_show_a_user_their_own(shared, users, make_daemon):
    """Rows 9-10: while bob's pull runs (a slow mount), alice's `stage
    status` lists no job of his, his own and root's do; `stage ls` shows
    each user their own checkpoints and root all."""
    from faultmount import FaultMount
    m = FaultMount(shared, "slow").mount()
    try:
        os.chmod(m.backing, 0o755)
        make_owned(m.backing, "bob/ds", users["bob"], {f"f{i}": b"x" * 1000 for i in range(40)})
        d = make_daemon(base=shared / "d0", start=False, source_roots=[m.mnt])
        open_to_users(d)
        d.start()
        for who in ("alice", "bob"):
            make_owned(d.ckpt_root, f"{who}job/step-1", users[who], {"s.bin": who.encode()})
            cp = as_user(d, who, "commit", d.ckpt_root / f"{who}job/step-1", "--wait")
            assert cp.returncode == 0, cp.stderr
        m.cmd("latency", "150")
        p = subprocess.Popen(["setpriv", "--reuid=bob", f"--regid={users['bob'][1]}", "--init-groups",
                              str(STAGE), "--socket", str(d.socket), "pull", str(m.mnt / "bob/ds")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")
        try:
            wait_for(lambda: "pull " in d.status().stdout, 20, "bob's pull in root's status")
            assert "pull " in as_user(d, "bob", "status").stdout
            alice = as_user(d, "alice", "status").stdout
            assert "pull " not in alice and "bob/ds" not in alice, alice
            assert "jobs:         0" in alice or "jobs: 0" in alice.replace("  ", " "), alice
        finally:
            m.cmd("clear")
            p.wait(60)
        ls = {who: as_user(d, who, "ls").stdout for who in ("alice", "bob")}
        assert "alicejob" in ls["alice"] and "bobjob" not in ls["alice"], ls
        assert "bobjob" in ls["bob"] and "alicejob" not in ls["bob"], ls
        root = d.run("ls").stdout
        assert "alicejob" in root and "bobjob" in root, root
        d.stop()
    finally:
        m.close()


# -------------------------------------------------------------- checkpoints

def test_checkpoint_commands_on_another_users_job_are_refused(shared, users, make_daemon):
    """Rows 11-16: bob commits and verifies his job; alice's commit,
    verify, verify --deep, restore and resume of it are refused (exit 2,
    naming bob), though its modes would let her read it, and change
    nothing. A root daemon makes a missing ckpt_root sticky and writable by
    all, as /tmp."""
    d = node(make_daemon, shared, start=False)
    os.rmdir(d.ckpt_root)
    d.start()
    assert d.ckpt_root.stat().st_mode & 0o7777 == 0o1777
    step = make_owned(d.ckpt_root, "bobjob/step-100", users["bob"], {"r0.bin": b"w" * 70000})
    cp = as_user(d, "bob", "commit", step, "--wait")
    assert cp.returncode == 0, cp.stderr
    mf = step / ".stage/manifest"
    assert mf.stat().st_uid == users["bob"][0]
    assert as_user(d, "bob", "verify", step).returncode == 0
    before = snapshot(step)
    for args in (["commit", step], ["commit", step, "--wait"], ["verify", step],
                 ["verify", step, "--deep"], ["restore", step], ["resume", "bobjob"]):
        cp = as_user(d, "alice", *args)
        assert cp.returncode == 2, (args, cp.stdout, cp.stderr)
        assert "belongs to bob" in cp.stderr, (args, cp.stderr)
    assert snapshot(step) == before
    assert "alice" not in d.log()
    d.assert_serving()


def test_the_watcher_commits_a_step_as_its_owner(shared, users, make_daemon):
    """Row 17: what the daemon does on its own acts as the owner of what it
    works on: the manifest the watcher writes into alice's step is hers."""
    d = node(make_daemon, shared, transfer={"watch": "on", "settle": "1"})
    step = make_owned(d.ckpt_root, "ajob/step-5", users["alice"], {"r0.bin": b"a" * 10000})
    wait_for(lambda: (step / ".stage/manifest").exists(), 30, "the watcher's commit")
    st = (step / ".stage/manifest").stat()
    assert (st.st_uid, st.st_gid) == users["alice"]
    assert (step / ".stage").stat().st_uid == users["alice"][0]


def test_a_request_cannot_claim_another_uid(shared, users, make_daemon):
    """Row 18: a request frame that carries bob's uid and gid (as an offer
    would) is still alice's: who asks is the kernel's word."""
    d = node(make_daemon, shared)
    step = make_owned(d.ckpt_root, "bobjob/step-1", users["bob"], {"r.bin": b"b" * 1000})
    uid, gid = users["bob"]
    # The frame is built by the Python client's own encoder; the type and
    # key numbers are read from common/proto.h so that they cannot drift.
    proto = (REPO / "common/proto.h").read_text()

    def num(name):
        return int(re.search(rf"\b{name}\s*=\s*(\d+)", proto).group(1))
    code = f"""
import socket, sys
sys.path.insert(0, {str(REPO / 'python')!r})
from stage import _frame, _recv
s = socket.socket(socket.AF_UNIX)
s.connect({str(d.socket)!r})
s.sendall(_frame({num('MSG_COMMIT_REQ')}, [({num('K_PATH')}, {str(step)!r}), ({num('K_UID')}, {uid}),
                                          ({num('K_GID')}, {gid}), ({num('K_FLAGS')}, 0)]))
while True:
    t, fields = _recv(s)
    if t == {num('MSG_RESULT')}:
        print(dict((k, v) for k, v in fields))
        break
"""
    cp = subprocess.run(["setpriv", "--reuid=alice", f"--regid={users['alice'][1]}", "--init-groups",
                         "/usr/bin/python3", "-c", code], capture_output=True, text=True, timeout=30,
                        cwd="/")
    assert cp.returncode == 0, cp.stderr
    assert "belongs to bob" in cp.stdout, cp.stdout
    assert not (step / ".stage/manifest").exists()
    d.assert_serving()


def test_a_daemon_of_an_ordinary_user_serves_that_user_alone(shared, users, make_daemon):
    """Row 19: staged started by alice works for alice; bob, though in the
    socket's group (alice's own, "users", which bob is in too), is refused
    naming both."""
    d = make_daemon(base=shared / "d0", start=False, user=users["alice"],
                    source_roots=[shared / "d0" / "src"])
    assert users["alice"][1] == users["bob"][1]
    os.chmod(d.sock_dir, 0o755)
    d.start()
    make_owned(d.src_root, "ds", users["alice"], {"a": b"a"})
    cp = as_user(d, "alice", "pull", d.src_root / "ds")
    assert cp.returncode == 0, cp.stderr
    cp = as_user(d, "bob", "status")
    assert cp.returncode == 2, cp.stdout
    assert "alice" in cp.stderr and "bob" in cp.stderr and "alone" in cp.stderr, cp.stderr


def test_a_user_outside_the_group_cannot_reach_the_daemon(shared, users, make_daemon):
    """Row 20: carol is not in the socket's group: she cannot connect."""
    d = node(make_daemon, shared)
    cp = as_user(d, "carol", "status")
    assert cp.returncode == 3, (cp.stdout, cp.stderr)
    assert "Permission denied" in cp.stderr, cp.stderr


def test_replicas_keep_their_owner_and_only_the_owner_restores(shared, users, make_cluster):
    """Rows 21-22 and 28: alice's replicated commit: the partner's copy is hers
    (numeric uid and gid of every file and of its manifest; its directories
    stay the daemon's); she restores a deleted shard, which comes back
    hers; bob's restore of her step is refused; on the partner, `stage ls`
    shows her the copy and not bob. Her job gone from its node, bob's
    restore of it there is refused by the holder (the copy is hers)."""
    n0, n1 = make_cluster(2, disks={0: shared / "n0", 1: shared / "n1"}, start=False)
    for d in (n0, n1):
        open_to_users(d)
        d.start()
    step = make_owned(n0.ckpt_root, "ajob/step-7", users["alice"],
                      {"r0.bin": os.urandom(200_000), "sub/r1.bin": os.urandom(1000)},
                      dmode=0o700)
    want = files_of(step)
    cp = as_user(n0, "alice", "commit", step, "--wait")
    assert cp.returncode == 0, cp.stderr
    rep = replica(n1, n0, job="ajob", step="step-7")
    # hers to verify, though its directories (0700, the daemon's) are not
    # hers to enter; and the cluster's verify of her step is clean
    cp = as_user(n1, "alice", "verify", rep)
    assert cp.returncode == 0, (cp.stdout, cp.stderr)
    cp = as_user(n0, "alice", "verify", step, "--cluster")
    assert cp.returncode == 0, (cp.stdout, cp.stderr)
    assert files_of(rep) == want
    # files and the manifest hers; directories the daemon's (one of hers,
    # reached by path as root, could be swapped for a link)
    files = [p for p in rep.rglob("*") if not p.is_dir()]
    assert {(os.lstat(p).st_uid, os.lstat(p).st_gid) for p in files} == {users["alice"]}, files
    assert {os.lstat(p).st_uid for p in [rep, *rep.rglob("*")] if p.is_dir()} == {0}
    (step / "r0.bin").unlink()
    cp = as_user(n0, "bob", "restore", step)
    assert cp.returncode == 2 and "belongs to alice" in cp.stderr, (cp.stdout, cp.stderr)
    assert not (step / "r0.bin").exists()
    cp = as_user(n0, "alice", "restore", step)
    assert cp.returncode == 0, cp.stderr
    assert files_of(step) == want
    assert owners(step) == {users["alice"][0]}, [(str(p), os.lstat(p).st_uid) for p in step.rglob("*")]
    assert "step-7" in as_user(n1, "alice", "ls").stdout
    assert "step-7" not in as_user(n1, "bob", "ls").stdout
    cp = as_user(n1, "bob", "verify", rep)
    assert cp.returncode == 2 and "belongs to alice" in cp.stderr, cp.stderr
    # alice's job gone from n0 (a disk replaced): bob restoring it there is
    # refused by the holder, whose copy is hers
    rm_tree(n0.ckpt_root / "ajob")
    cp = as_user(n0, "bob", "restore", step)
    assert cp.returncode != 0, (cp.stdout, cp.stderr)
    assert "belongs to uid" in cp.stderr, cp.stderr
    got = [p for p in (n0.ckpt_root / "ajob").rglob("*") if p.is_file()] \
        if (n0.ckpt_root / "ajob").exists() else []
    assert not [p for p in got if ".stage" not in p.parts], got


def test_a_cluster_pull_acts_as_its_user_on_every_node(shared, users, make_cluster):
    """Rows 23-24: alice's `pull --cluster` of her private dataset (0700,
    0600) from the shared storage: every node's copy exact and hers (each
    node's part acts as alice, the user the asker's kernel named); bob's
    cluster pull of it is refused on every node, naming the source and
    "Permission denied", and stages nothing anywhere."""
    src = shared / "nfs"
    src.mkdir()
    os.chmod(src, 0o755)
    ds = make_owned(src, "alice/ds", users["alice"],
                    {f"f{i}": os.urandom(20_000 + i) for i in range(12)} | {"big.bin": os.urandom(600_000)},
                    0o700, 0o600)
    want = files_of(ds)
    nodes = make_cluster(3, disks={i: shared / f"n{i}" for i in range(3)}, source_roots=[src],
                         start=False)
    for d in nodes:
        open_to_users(d)
        d.start()
    cp = as_user(nodes[0], "bob", "pull", ds, "--cluster", "--to", nodes[0].stage_root / "bobcopy")
    assert cp.returncode != 0, cp.stdout
    for d in nodes:             # each node's part refused it, as bob
        assert f"{d.name}: source '{ds}': Permission denied" in cp.stderr, cp.stderr
    for d in nodes:
        assert not (d.stage_root / "bobcopy" / "big.bin").exists()
    cp = as_user(nodes[0], "alice", "pull", ds, "--cluster", timeout=120)
    assert cp.returncode == 0, (cp.stdout, cp.stderr)
    for d in nodes:
        dest = d.stage_root / "alice/ds"
        assert files_of(dest) == want, d.name
        assert owners(d.stage_root / "alice") == {users["alice"][0]}, d.name


def test_the_durable_drain_writes_as_the_jobs_owner(shared, users, make_daemon):
    """Row 25: the durable tier on a shared mount that squashes root (its
    directory writable by all and sticky, as users' scratch space on NFS
    is): alice's committed step is drained there as alice, every file hers,
    which the daemon as root (squashed to nobody) would have written as
    nobody."""
    from faultmount import FaultMount
    m = FaultMount(shared, "durable", root_squash=True).mount()
    try:
        os.chmod(m.backing, 0o1777)
        d = node(make_daemon, shared, start=False)
        d.durable = {"root": m.mnt}
        d.write_config()
        d.start()
        step = make_owned(d.ckpt_root, "ajob/step-3", users["alice"],
                          {"r0.bin": os.urandom(300_000), "opt/m.bin": os.urandom(5000)})
        assert as_user(d, "alice", "commit", step, "--wait").returncode == 0
        out = m.backing / "ajob/step-3"
        try:
            wait_for(lambda: (out / ".stage" / f"manifest.{d.name}").exists(), 30, "the drain")
        except AssertionError:
            raise AssertionError(f"not drained; log:\n{d.log()[-3000:]}")
        assert files_of(out) == files_of(step)
        assert owners(m.backing / "ajob") == {users["alice"][0]}
        d.stop()
    finally:
        m.close()


def test_a_users_resume_repairs_every_node_as_that_user(shared, users, make_cluster):
    """Row 26: alice's job on two nodes, each node's shard replicated to the
    other; n1 loses a file of its own. `stage resume` by alice on n0 has n1
    restore it from n0's copy: it comes back exact and alice's (n1's restore
    acts as the user the resume's asker named); bob's resume of her job is
    refused before anything is asked of any node."""
    nodes = make_cluster(2, disks={i: shared / f"n{i}" for i in range(2)}, start=False)
    for d in nodes:
        open_to_users(d)
        d.start()
    steps = []
    for i, d in enumerate(nodes):
        s = make_owned(d.ckpt_root, "ajob/step-10", users["alice"],
                       {f"rank{i}.bin": os.urandom(150_000), f"meta{i}": b"m"})
        cp = as_user(d, "alice", "commit", s, "--wait")
        assert cp.returncode == 0, cp.stderr
        steps.append(s)
    want = files_of(steps[1])
    (steps[1] / "rank1.bin").unlink()
    cp = as_user(nodes[0], "bob", "resume", "ajob")
    assert cp.returncode == 2 and "belongs to alice" in cp.stderr, (cp.stdout, cp.stderr)
    assert not (steps[1] / "rank1.bin").exists()
    cp = as_user(nodes[0], "alice", "resume", "ajob", timeout=120)
    assert cp.returncode == 0, (cp.stdout, cp.stderr)
    assert files_of(steps[1]) == want
    assert owners(steps[1]) == {users["alice"][0]}


def test_status_shows_a_user_only_their_own_transfers(shared, users, make_cluster):
    """Row 27: while bob's step is being replicated (the link capped), the
    sending side's `stage status` shows the transfer to bob and root, not to
    alice, and so does the receiving side."""
    n0, n1 = make_cluster(2, disks={0: shared / "n0", 1: shared / "n1"}, transfer={"rate": "400KiB"},
                          start=False)
    for d in (n0, n1):
        open_to_users(d)
        d.start()
    step = make_owned(n0.ckpt_root, "bobjob/step-1", users["bob"], {"w.bin": os.urandom(4 << 20)})
    assert as_user(n0, "bob", "commit", step).returncode == 0
    wait_for(lambda: "bobjob/step-1 to n1" in n0.status().stdout, 30, "bob's copy being sent")
    wait_for(lambda: "bobjob/step-1" in n1.status().stdout, 30, "bob's copy being received")
    seen = {who: (as_user(n0, who, "status").stdout, as_user(n1, who, "status").stdout)
            for who in ("alice", "bob")}
    assert "bobjob" in seen["bob"][0] and "bobjob" in seen["bob"][1], seen["bob"]
    assert "bobjob" not in seen["alice"][0] and "bobjob" not in seen["alice"][1], seen["alice"]


def test_a_link_swapped_in_during_commits_never_commits_another_users_job(shared, users, make_daemon):
    """Row 29, a seeded campaign (STAGE_RACE_ROUNDS, default 12, times 3):
    alice's job directory and a link to bob's job are swapped again and
    again under her commits of flip/step-1. Whatever each commit resolves,
    bob's step is never committed: the request checks the job it resolved
    to, not only the path it was given."""
    rounds = 3 * int(os.environ.get("STAGE_RACE_ROUNDS", "12"))
    rng = random.Random(int(os.environ.get("STAGE_RACE_SEED", "29")))
    d = node(make_daemon, shared)
    bob = make_owned(d.ckpt_root, "bobjob/step-1", users["bob"], {"w.bin": SECRET})
    mine = make_owned(d.ckpt_root, "flip.real/step-1", users["alice"], {"a.bin": b"alice"})
    link = d.ckpt_root / "flip.link"
    os.symlink(bob.parent, link)
    flip = d.ckpt_root / "flip"
    stop = threading.Event()
    swaps, errors = [0], []

    def swapper():
        try:
            while not stop.is_set():
                os.rename(mine.parent, flip)
                time.sleep(rng.random() / 2000)
                os.rename(flip, mine.parent)
                os.rename(link, flip)
                time.sleep(rng.random() / 2000)
                os.rename(flip, link)
                swaps[0] += 1
        except OSError as e:
            errors.append(e)

    t = threading.Thread(target=swapper)
    t.start()
    try:
        codes = [as_user(d, "alice", "commit", flip / "step-1").returncode for _ in range(rounds)]
    finally:
        stop.set()
        t.join()
    assert not errors and swaps[0] > rounds, (errors, swaps)
    # Each commit either took alice's own job (0) or was refused (2, bob's
    # job or a link where a job belongs); some took hers.
    assert set(codes) <= {0, 2} and 0 in codes, codes
    wait_for(lambda: "state=hashing" not in d.run("ls").stdout, 30, "the commits hashed")
    assert not (bob / ".stage/manifest").exists(), codes
    assert "bobjob" not in d.run("ls").stdout, codes
    d.assert_serving()


def test_a_durable_job_directory_of_roots_is_still_drained(shared, users, make_daemon):
    """Row 30: a durable job directory that is root's (made by a staged that
    drained as root, or by the admin) is still written: the drain of alice's
    job writes there as the daemon, as before, rather than fail as alice."""
    durable = shared / "durable"
    (durable / "ajob").mkdir(parents=True)
    d = node(make_daemon, shared, start=False)
    d.durable = {"root": durable}
    d.write_config()
    d.start()
    step = make_owned(d.ckpt_root, "ajob/step-4", users["alice"], {"r0.bin": os.urandom(50_000)})
    assert as_user(d, "alice", "commit", step, "--wait").returncode == 0
    out = durable / "ajob/step-4"
    wait_for(lambda: (out / ".stage" / f"manifest.{d.name}").exists(), 30, "the drain")
    assert files_of(out) == files_of(step)
