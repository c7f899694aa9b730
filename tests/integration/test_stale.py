"""The newest step first ([transfer] stale = skip, the default; the rule is in
daemon/repl/repl_impl.h): when a trainer saves faster than its copies go, a
copy not yet begun whose job has a newer step ready for the same partner is
skipped, so the partner gets the newest step next instead of working
through the queue. Skipping is logged, saved, shown by `stage ls` and
counted; a copy someone waits for (`commit --wait`) is never skipped, nor
one begun and cut off; a skipped copy goes after all once the newer step's
copy fails for good, or when it is committed again (after the newer). Real
daemons on 127.0.0.1, n0's sender held behind by its rate cap while steps
are committed."""
import json
import re
import threading

from helpers import (F, after_kill9, assert_replica_of, ckpt, commit_wait, copy_cells, make_tree,
                     replica, wait_for, ls_find)
from test_hostile import Proxy

MiB = 1 << 20


def copy_state(d, step, peer="n1"):
    f = ls_find(d, f"job1/{step}")
    assert f, f"{step} not in {d.name}'s stage ls"
    m = re.search(rf"(?:^|,){peer}:(\w+)", f["copies"])
    return m.group(1) if m else None


def hashed(d, step):
    wait_for(lambda: (ls_find(d, f"job1/{step}") or {}).get("state") == "committed", 20,
             f"{step} to be hashed")


def committed(d, step):
    cp = d.run("commit", ckpt(d, step=step))
    assert cp.returncode == 0, f"commit {step}: {cp.stderr}"
    hashed(d, step)


def busy_sender(make_cluster, stale="skip", proxy=None):
    """n0 and n1, n0 capped at 4 MiB/s and sending a 32 MiB step-100 (8 s):
    what is committed meanwhile waits behind it. proxy: a function of n1's
    address giving a Proxy n0 reaches n1 through."""
    n0, n1 = make_cluster(2, keep=10, transfer={"watch": "off", "compress": "off", "stale": stale},
                          node_transfer={0: {"rate": "4MiB"}}, start=proxy is None)
    if proxy:
        real = n1.listen
        host, port = real.rsplit(":", 1)
        p = proxy((host, int(port)))
        hosts = n0.cluster["hosts"]
        hosts.write_text(hosts.read_text().replace(real, f"127.0.0.1:{p.port}"))
        n0.start()
        n1.start()
    step = make_tree(ckpt(n0, step="step-100"), [F("w.bin", size=32 * MiB)], seed=100)
    cp = n0.run("commit", ckpt(n0, step="step-100"))
    assert cp.returncode == 0, cp.stderr
    wait_for(lambda: "job1/step-100 to n1" in n0.status(timeout=20).stdout, 20,
             "n0 to be sending step-100")
    return n0, n1, step


def small_step(d, step, seed):
    return make_tree(ckpt(d, step=step), [F("w.bin", size=MiB + seed)], seed=seed)


def test_newest_step_goes_first(make_cluster):
    """While step-100 goes, step-200, step-250 (committed with --wait),
    step-300 and step-400 are committed: 200 and 300 are skipped, 250 and
    400 go, each exact; the skips are logged, counted, shown by ls, survive
    a restart, and a new commit of a skipped step sends it."""
    n0, n1, _ = busy_sender(make_cluster)
    steps = {s: small_step(n0, s, i) for i, s in enumerate(
        ["step-200", "step-250", "step-300", "step-400"], start=1)}
    committed(n0, "step-200")
    waited = {}
    t = threading.Thread(target=lambda: waited.update(
        cp=n0.run("commit", ckpt(n0, step="step-250"), "--wait", timeout=120)))
    t.start()
    hashed(n0, "step-250")
    committed(n0, "step-300")
    committed(n0, "step-400")
    assert copy_state(n0, "step-100") == "sending", \
        "step-100 was sent before the newer steps were ready: the test proved nothing"
    wait_for(lambda: copy_state(n0, "step-400") == "confirmed", 60,
             f"step-400 to reach n1:\n{n0.log()[-3000:]}")
    t.join(120)
    assert waited["cp"].returncode == 0, \
        f"commit --wait of step-250: {waited['cp'].stdout}{waited['cp'].stderr}"

    states = {s: copy_state(n0, s) for s in ["step-100", "step-200", "step-250", "step-300",
                                             "step-400"]}
    assert states == {"step-100": "confirmed", "step-200": "skipped", "step-250": "confirmed",
                      "step-300": "skipped", "step-400": "confirmed"}, states
    for s in ["step-250", "step-400"]:
        assert_replica_of(steps[s], replica(n1, n0, step=s))
    for s in ["step-200", "step-300"]:
        assert not replica(n1, n0, step=s).exists(), f"{s} reached n1 though skipped"
        assert re.search(rf"job1/{s} to n1: skipped, the newer job1/step-\d+ goes instead",
                         n0.log()), n0.log()[-3000:]
    m = re.search(r'^stage_replication_skipped_total\{peer="n1"\} (\d+)$',
                  n0.run("metrics").stdout, re.M)
    assert m and int(m.group(1)) == 2, m and m.group(0)

    n0.restart()
    assert copy_state(n0, "step-200") == "skipped" and copy_state(n0, "step-300") == "skipped", \
        "the skips were not saved"
    # Committed again, even without --wait: now committed after step-400, so
    # step-400 is no newer and step-300 goes.
    cp = n0.run("commit", ckpt(n0, step="step-300"))
    assert cp.returncode == 0, cp.stderr
    wait_for(lambda: copy_state(n0, "step-300") == "confirmed", 30, "step-300 to go")
    assert_replica_of(steps["step-300"], replica(n1, n0, step="step-300"))
    commit_wait(n0, ckpt(n0, step="step-200"))
    assert_replica_of(steps["step-200"], replica(n1, n0, step="step-200"))


def test_skipped_copy_goes_when_the_newer_fails(make_cluster):
    """step-200 is skipped for step-300, whose file then changes size: its
    copy fails for good (the step changed), so step-200 is pending again and
    reaches n1. What n1 received of step-300 stays in its .incoming until a
    newer step of the job is published there: then it goes."""
    n0, n1, _ = busy_sender(make_cluster)
    s200 = small_step(n0, "step-200", 1)
    small_step(n0, "step-300", 2)
    committed(n0, "step-200")
    committed(n0, "step-300")
    with open(ckpt(n0, step="step-300") / "w.bin", "ab") as f:
        f.write(b"changed after its commit")
    assert copy_state(n0, "step-100") == "sending", "the test proved nothing"
    wait_for(lambda: copy_state(n0, "step-200") == "confirmed", 60,
             f"step-200 to reach n1 after step-300 failed:\n{n0.log()[-3000:]}")
    assert copy_state(n0, "step-300") == "failed"
    log = n0.log()
    assert "job1/step-200 to n1: skipped, the newer job1/step-300 goes instead" in log, log[-3000:]
    assert "job1/step-200 to n1: no longer skipped" in log, log[-3000:]
    assert_replica_of(s200, replica(n1, n0, step="step-200"))
    given_up = n1.replica_root / ".incoming" / "n0" / "job1" / "step-300"
    assert given_up.is_dir(), "n1 kept nothing of step-300: the clean-up below proves nothing"
    s400 = small_step(n0, "step-400", 3)
    commit_wait(n0, ckpt(n0, step="step-400"))
    assert_replica_of(s400, replica(n1, n0, step="step-400"))
    assert not given_up.exists(), "the copy n0 gave up stays in n1's .incoming"
    assert "step-300: removing a copy its origin gave up (step-400 is newer)" in n1.log(), \
        n1.log()[-2000:]


def test_stale_send_sends_every_step(make_cluster):
    """stale = send: every step goes, in commit order."""
    n0, n1, _ = busy_sender(make_cluster, stale="send")
    steps = {s: small_step(n0, s, i) for i, s in enumerate(["step-200", "step-300"], start=1)}
    committed(n0, "step-200")
    committed(n0, "step-300")
    assert copy_state(n0, "step-100") == "sending", "the test proved nothing"
    wait_for(lambda: copy_state(n0, "step-300") == "confirmed", 60, "step-300 to reach n1")
    assert copy_state(n0, "step-200") == "confirmed"
    for s, d in steps.items():
        assert_replica_of(d, replica(n1, n0, step=s))
    assert "skipped" not in n0.log()


def test_a_copy_cut_off_is_not_skipped(make_cluster):
    """step-100's connection is cut after 24 MiB, once step-200 and step-300
    are ready: step-100 was begun (n1 holds part of it), so it resumes and
    lands rather than being skipped, step-200 is skipped, step-300 goes,
    and nothing is left half-received on n1."""
    proxies = []

    def proxy(target):
        proxies.append(Proxy(target, flip_at=1 << 62, cut_conn=1, cut_after=24 * MiB))
        return proxies[0]
    try:
        n0, n1, s100 = busy_sender(make_cluster, proxy=proxy)
        s300 = small_step(n0, "step-300", 2)
        small_step(n0, "step-200", 1)
        committed(n0, "step-200")
        committed(n0, "step-300")
        assert not proxies[0].cut, "the cut came before the newer steps were ready"
        wait_for(lambda: copy_state(n0, "step-300") == "confirmed", 90,
                 f"step-300 to reach n1:\n{n0.log()[-3000:]}")
        assert proxies[0].cut, "the proxy never cut the copy: the test proved nothing"
        assert copy_state(n0, "step-100") == "confirmed"
        assert copy_state(n0, "step-200") == "skipped"
        assert_replica_of(s100, replica(n1, n0, step="step-100"))
        assert_replica_of(s300, replica(n1, n0, step="step-300"))
        incoming = n1.replica_root / ".incoming"
        left = [p for p in incoming.rglob("*") if p.is_file()] if incoming.exists() else []
        assert not left, f"left half-received on n1: {left}"
    finally:
        for p in proxies:
            p.close()


def test_waiting_for_a_step_keep_drops_at_once(make_cluster):
    """keep = 2 and two newer steps committed: `commit --wait` of an older
    step is dropped by retention the moment it is committed; the wait says
    so (exit 1) and the daemon keeps serving."""
    n0, n1 = make_cluster(2, keep=2, transfer={"watch": "off", "stale": "skip"})
    for i, s in enumerate(["step-100", "step-300", "step-400"], start=1):
        small_step(n0, s, i)
    commit_wait(n0, ckpt(n0, step="step-300"))
    commit_wait(n0, ckpt(n0, step="step-400"))
    cp = n0.run("commit", ckpt(n0, step="step-100"), "--wait", timeout=60)
    assert cp.returncode == 1 and "newer steps of the job took its place" in cp.stderr, \
        f"exit {cp.returncode}: {cp.stdout}{cp.stderr}"
    assert n0.status(timeout=20).returncode == 0, "the daemon stopped serving"
    assert copy_state(n0, "step-400") == "confirmed"


def test_a_copy_begun_before_a_kill9_is_not_skipped(make_cluster):
    """n0 is killed (-9) while it sends step-100, with step-200 and step-300
    ready behind it: restarted, it knows step-100 was begun (its record says
    so), so step-100 resumes and lands, step-200 is skipped, step-300 goes."""
    n0, n1, s100 = busy_sender(make_cluster)
    small_step(n0, "step-200", 1)
    s300 = small_step(n0, "step-300", 2)
    committed(n0, "step-200")
    committed(n0, "step-300")
    assert copy_state(n0, "step-100") == "sending", "the test proved nothing"
    n0.kill9()
    after_kill9()
    n0.start()
    wait_for(lambda: copy_state(n0, "step-300") == "confirmed", 90,
             f"step-300 to reach n1:\n{n0.log()[-3000:]}")
    assert copy_state(n0, "step-100") == "confirmed", n0.log()[-3000:]
    assert copy_state(n0, "step-200") == "skipped"
    assert_replica_of(s100, replica(n1, n0, step="step-100"))
    assert_replica_of(s300, replica(n1, n0, step="step-300"))


def test_a_newer_step_hashed_again_keeps_the_older_skipped(make_cluster):
    """step-200 skipped for step-300, both settled; step-300 is committed
    again and, while it is hashed, the sender is idle: step-200 stays
    skipped (it does not go meanwhile), and step-300 goes again."""
    n0, n1, _ = busy_sender(make_cluster)
    small_step(n0, "step-200", 1)
    s300 = small_step(n0, "step-300", 2)
    committed(n0, "step-200")
    committed(n0, "step-300")
    wait_for(lambda: copy_state(n0, "step-300") == "confirmed", 90,
             f"step-300 to reach n1:\n{n0.log()[-3000:]}")
    assert copy_state(n0, "step-200") == "skipped"
    cp = n0.run("commit", ckpt(n0, step="step-300"))
    assert cp.returncode == 0, cp.stderr
    wait_for(lambda: "commit job1/step-300: manifest written" in n0.log().split(
        "commit job1/step-300: committed")[-1], 30, "step-300 to be hashed again")
    wait_for(lambda: copy_state(n0, "step-300") == "confirmed", 60, "step-300 to go again")
    assert copy_state(n0, "step-200") == "skipped", n0.log()[-3000:]
    assert not replica(n1, n0, step="step-200").exists(), "step-200 went while step-300 was hashed"
    assert_replica_of(s300, replica(n1, n0, step="step-300"))


def test_steps_queued_while_the_partner_is_down(make_cluster):
    """n1 is down while step-200, step-300 and step-400 are committed: n0's
    sender tries step-200 and fails to connect, again and again, but never
    reached n1 with it, so it is not begun: when n1 is back step-400 goes
    first and only, the two older ones are skipped."""
    n0, n1 = make_cluster(2, keep=10, transfer={"watch": "off", "stale": "skip"}, start=False)
    n0.start()
    steps = {s: small_step(n0, s, i) for i, s in enumerate(["step-200", "step-300", "step-400"],
                                                           start=1)}
    committed(n0, "step-200")
    wait_for(lambda: "job1/step-200 to n1" in n0.status(timeout=20).stdout or
             "down" in n0.status(timeout=20).stdout, 20, "n0 to try step-200")
    committed(n0, "step-300")
    committed(n0, "step-400")
    n1.start()
    wait_for(lambda: copy_state(n0, "step-400") == "confirmed", 60,
             f"step-400 to reach n1:\n{n0.log()[-3000:]}")
    assert copy_state(n0, "step-200") == "skipped", n0.log()[-3000:]
    assert copy_state(n0, "step-300") == "skipped", n0.log()[-3000:]
    assert_replica_of(steps["step-400"], replica(n1, n0, step="step-400"))
    assert not replica(n1, n0, step="step-200").exists()


def test_verify_cluster_names_copies_not_there_yet(make_cluster):
    """verify --cluster of a step whose copy to n1 is being sent, queued or
    skipped says so, from n0's replication (K_COPY notes in n0's answer),
    rather than calling the copy lost and advising a restore; asked on n0
    (which answers itself) and on n1 (n0's answer over the wire). Once the
    copies are confirmed the steps verify. (A copy is skipped when the sender
    picks its next, so step-200 is queued while step-100 goes.)"""
    n0, n1, _ = busy_sender(make_cluster)
    for i, s in enumerate(["step-200", "step-300"], start=1):
        small_step(n0, s, i)
        committed(n0, s)
    assert copy_state(n0, "step-100") == "sending", \
        "step-100 was sent before the questions: the test proved nothing"

    def verify(node, step):
        v = node.run("verify", "--cluster", ckpt(node, step=step), timeout=60)
        return v.returncode, v.stdout + v.stderr

    rc, out = verify(n0, "step-100")
    assert rc == 1, out
    assert re.search(r"n1 holds no copy of n0's step-100 yet: n0 is sending it "
                     r"\([\d.]+ of 32\.0 MiB sent\)", out), out
    assert "job1/step-100 is not on every node yet: 1 copy is on the way" in out, out
    assert "stage restore" not in out, out
    rc, out = verify(n1, "step-300")
    assert rc == 1, out
    assert "n1 holds no copy of n0's step-300 yet: it is queued on n0" in out, out
    assert copy_state(n0, "step-100") == "sending", \
        "step-100 was confirmed before the questions were answered: the test proved nothing"

    # Once step-100 is confirmed the sender picks step-300 and skips step-200.
    wait_for(lambda: copy_state(n0, "step-200") == "skipped", 60,
             f"step-200 to be skipped:\n{n0.log()[-3000:]}")
    rc, out = verify(n1, "step-200")
    assert rc == 1, out
    assert ("n1 holds no copy of n0's step-200: n0 skipped it: step-300 is newer and went "
            "first ([transfer] stale)") in out, out
    assert ("job1/step-200 is not on every node: its origin has not sent 1 copy (above); "
            "`stage commit --wait` of the step there sends it") in out, out
    v = n0.run("--json", "verify", "--cluster", ckpt(n0, step="step-200"), timeout=60)
    row = copy_cells(v.stdout)[("n0", "n1")]
    assert row["state"] == "missing" and \
        "skipped: step-300 is newer and went first" in json.dumps(row), row

    wait_for(lambda: copy_state(n0, "step-300") == "confirmed", 60,
             f"step-300 to reach n1:\n{n0.log()[-3000:]}")
    for node in (n0, n1):
        rc, out = verify(node, "step-300")
        assert rc == 0, out
