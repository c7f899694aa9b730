"""The trainer first ([transfer] yield, with watch = on): while a step under
this node's ckpt_root is being written (a trainer saving), replication here
pauses, on the sending side and on the receiving side, and catches up once
the writes stop. Real daemons on 127.0.0.1: n0 sends a 32 MiB step to n1 at
4 MiB/s while a writer appends to another step, on n0 or on n1, every 50 ms
for 3 s; how far the copy moves in that time is read from n1's `stage
status` (what its receiver has taken: the sender's figure also counts what
fills the sockets' buffers while the receiver waits)."""
import re
import threading
import time

import pytest

from helpers import F, assert_replica_of, ckpt, make_tree, replica, wait_for

MiB = 1 << 20


def sent_so_far(d):
    """Bytes of the copy n0 is sending, from its `stage status`, or None."""
    m = re.search(r"^sending:\s+job1/step-100 to n1: (\d+) of \d+ bytes",
                  d.status(timeout=20).stdout, re.M)
    return int(m.group(1)) if m else None


def taken_so_far(d):
    """Bytes of n0's step-100 that d's receiver has taken, or None."""
    m = re.search(r"^receiving:\s+n0/job1/step-100: (\d+) bytes so far",
                  d.status(timeout=20).stdout, re.M)
    return int(m.group(1)) if m else None


def yielded_seconds(d):
    """d's stage_replication_yielded_seconds_total."""
    m = re.search(r"^stage_replication_yielded_seconds_total (\S+)$", d.run("metrics").stdout,
                  re.M)
    assert m, f"no stage_replication_yielded_seconds_total on {d.name}"
    return float(m.group(1))


def writer(d, jobs, stop):
    """Trainers saving JOB/step-200 on d, for each job of jobs ("job1+job2"):
    64 KiB appended to each every 50 ms."""
    fs = []
    for job in jobs.split("+"):
        path = ckpt(d, job=job, step="step-200") / "w.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        fs.append(open(path, "ab"))
    try:
        while not stop.is_set():
            for f in fs:
                f.write(b"\x5a" * 65536)
                f.flush()
            time.sleep(0.05)
    finally:
        for f in fs:
            f.close()


@pytest.mark.parametrize("on,job,yield_", [("n0", "job1", "on"), ("n1", "job1", "on"),
                                           ("n0", "job1", "off"), ("n0", "job2", "on"),
                                           ("n0", "job1+job2", "on")])
def test_replication_yields_to_a_save(make_cluster, on, job, yield_):
    """With yield on, the copy of job1 moves at most a piece or two while
    another step of job1 is written (at 4 MiB/s it would move about 8 MiB),
    says so in status and metrics, then finishes exact; with yield off, or
    when the step written is another job's, it moves on. job1+job2: two
    jobs saving at once, each remembered (job2 written last in each round,
    so a table that kept one job would keep job2)."""
    n0, n1 = make_cluster(2, keep=10, transfer={"watch": "on", "compress": "off",
                                                "yield": yield_},
                          node_transfer={0: {"rate": "4MiB"}})
    d = n0 if on == "n0" else n1
    step = make_tree(ckpt(n0, step="step-100"), [F("w.bin", size=32 * MiB)], seed=100)
    cp = n0.run("commit", step)
    assert cp.returncode == 0, cp.stderr
    wait_for(lambda: (sent_so_far(n0) or 0) > 0, 20, "n0 to be sending step-100")
    stop = threading.Event()
    t = threading.Thread(target=writer, args=(d, job, stop))
    t.start()
    try:
        time.sleep(0.6)
        a = taken_so_far(n1)
        said = d.status(timeout=20).stdout
        time.sleep(2.0)
        b = taken_so_far(n1)
    finally:
        stop.set()
        t.join()
    assert a is not None and b is not None, "step-100 was sent before the writes ended"
    held = yield_ == "on" and "job1" in job.split("+")
    if held:
        assert b - a <= 2 * MiB, f"the copy moved {b - a} bytes while {d.name} wrote a step"
        assert re.search(r"^yield:\s+job1: a step is being written here", said, re.M), said
    else:
        assert b - a >= 4 * MiB, f"the copy moved only {b - a} bytes (yield {yield_}, {job})"
    wait_for(lambda: replica(n1, n0).is_dir(), 30, f"step-100 to reach n1:\n{n0.log()[-2000:]}")
    assert_replica_of(step, replica(n1, n0))
    yielded = yielded_seconds(d)
    if held:
        assert yielded >= 1.5, yielded
    else:       # at most a moment after step-100 itself was written
        assert yielded < 1.0, yielded
