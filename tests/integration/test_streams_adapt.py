"""How many streams a copy goes on when [transfer] streams is 0: the count
adapts to what the copies move, from a quarter of the CPUs the daemon may
run on up to [transfer] streams_max (docs/ARCHITECTURE.md, "Streams"). On a
path that holds each connection to a rate, more streams move more, and the
count climbs to the cap; under a rate for the whole partner ([transfer]
rate), one stream moves as much as more, and the count comes down to one.
`stage status` says the count and why, and the log each change. Every copy
stays exact. Real daemons on 127.0.0.1; copies of 40 MiB of fresh bytes (a
copy under 32 MiB measures nothing)."""
import re
import time

from helpers import F, assert_replica_of, ckpt, commit_wait, make_tree, replica, wait_for
from test_streams import proxied_streams, streams_said
from test_yield import yielded_seconds

MiB = 1 << 20
SIZE = 40 * MiB


def copies_until_settled(n0, n1, most):
    """Commits fresh steps until n0's status no longer says it is trying a
    count: (n, why) of status after each copy."""
    seen = []
    for i in range(most):
        name = f"step-{i + 1}"
        step = make_tree(ckpt(n0, step=name), [F("w.bin", size=SIZE)], seed=100 + i)
        commit_wait(n0, step, timeout=120)
        assert_replica_of(step, replica(n1, n0, step=name))
        seen.append(streams_said(n0, n1))
        # Every stream asked for opened: status says the next count and
        # why, not the last copy's.
        assert seen[-1][1].startswith("adapting, 1 to 4, "), seen
        if "; measured: " in seen[-1][1] and "trying" not in seen[-1][1]:
            return seen
    raise AssertionError(f"no count settled on in {most} copies: {seen}")


def test_one_stream_when_one_moves_the_partners_rate(make_cluster):
    """[transfer] rate = 24 MiB/s for the partner, shared by its streams:
    two move no more than one, so the count settles on one (from wherever
    the machine's cores start it), and says so. The next copy goes on one,
    and the connections it no longer needs are closed."""
    n0, n1, proxy = proxied_streams(make_cluster,
                                    node0={"streams": 0, "streams_max": 4, "rate": "24MiB"})
    try:
        seen = copies_until_settled(n0, n1, 6)
        n, why = seen[-1]
        assert n == 1 and why.startswith("adapting, 1 to 4, [transfer] streams_max = 4: "), seen
        assert re.search(r": (2 moved less than 10 % more than 1|1 moved as much as 2) \(\d+ "
                         r"MB/s against \d+ MB/s\); measured: 1 at \d+ MB/s, 2 at \d+ MB/s",
                         why), seen
        assert "the next copy on 1 stream: " in n0.log(), n0.log()[-3000:]
        assert proxy.conns >= 2, proxy.conns       # it did try more than one
        step = make_tree(ckpt(n0, step="step-last"), [F("w.bin", size=SIZE)], seed=99)
        commit_wait(n0, step, timeout=120)
        assert_replica_of(step, replica(n1, n0, step="step-last"))
        wait_for(lambda: proxy.live == 1, 10, f"n0 to close the streams it no longer uses "
                 f"({proxy.live} open)")
    finally:
        proxy.close()


def test_more_streams_when_each_is_held_to_a_rate(make_cluster):
    """A path that holds each connection to 12 MiB/s (a proxy, as a
    per-flow limit on a link would): each doubling of the streams moves
    about twice as much, so the count climbs to the cap of 4 and stays."""
    n0, n1, proxy = proxied_streams(make_cluster, node0={"streams": 0, "streams_max": 4},
                                    rate=12 * MiB)
    try:
        seen = copies_until_settled(n0, n1, 6)
        n, why = seen[-1]
        assert n == 4, seen
        assert re.search(r": (4 moved [\d.]+ [MG]B/s, 2 [\d.]+ [MG]B/s: each doubling moved "
                         r"10 % more, up to the cap|2 moved less than 4)", why), seen
        rates = {int(k): float(v) for k, v in re.findall(r"(\d+) at (\d+) MB/s", why)}
        assert rates.get(4, 0) > 1.5 * rates.get(2, rates.get(1, 1e9)), rates
        assert "the next copy on 4 streams: " in n0.log() or seen[0][0] == 4, n0.log()[-3000:]
    finally:
        proxy.close()


def test_a_copy_the_receiver_paused_measures_nothing(make_cluster):
    """A copy during which the receiver stood aside for its own trainer
    (n1 saving a step of the same job: [transfer] yield) measured the
    trainer, not the streams: n1 says so in its MSG_DONE (K_PAUSED) and n0
    leaves the copy out of the count's measure. The next copy, with nothing
    written on n1, is measured."""
    n0, n1 = make_cluster(2, keep=10, transfer={"watch": "on", "compress": "off"},
                          node_transfer={0: {"streams": 0, "streams_max": 4, "rate": "24MiB"}})
    saving = ckpt(n1, step="step-200") / "w.bin"
    saving.parent.mkdir(parents=True)
    step = make_tree(ckpt(n0, step="step-1"), [F("w.bin", size=SIZE)], seed=1)
    time.sleep(1)       # n0's own writes of it over: n0 has nothing to stand aside for
    with open(saving, "ab") as f:
        f.write(b"\x5a" * 65536)
        f.flush()
        cp = n0.popen("commit", step, "--wait")
        # n1's trainer saves for 2 s: 64 KiB every 50 ms
        for _ in range(40):
            f.write(b"\x5a" * 65536)
            f.flush()
            time.sleep(0.05)
    assert cp.wait(timeout=120) == 0, \
        f"{cp.out_path.read_text()}\n{cp.err_path.read_text()}\n{n0.log()[-3000:]}"
    assert_replica_of(step, replica(n1, n0, step="step-1"))
    assert yielded_seconds(n1) >= 1.0, "n1 did not stand aside"
    assert yielded_seconds(n0) < 0.25, "n0 stood aside itself"
    n, why = streams_said(n0, n1)
    assert why.endswith(": no copy measured yet"), (n, why)
    assert "the next copy on" not in n0.log(), n0.log()[-3000:]

    step = make_tree(ckpt(n0, step="step-2"), [F("w.bin", size=SIZE)], seed=2)
    time.sleep(1)
    commit_wait(n0, step, timeout=120)
    assert_replica_of(step, replica(n1, n0, step="step-2"))
    n, why = streams_said(n0, n1)
    assert re.search(rf": \d+ moved \d+ MB/s: trying {n}; measured: \d+ at \d+ MB/s$", why), \
        (n, why)
