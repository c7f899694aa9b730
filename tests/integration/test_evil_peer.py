"""Hostile input from a peer that HOLDS the cluster key.

docs/SECURITY.md trusts every key holder alike for what it may claim (any
node's name, any data as its own), but what it sends against the protocol
must still be refused: with a log line naming the peer and the cause,
nothing written outside replica_root, nothing published (a hostile offer
stays in .incoming, never under a final name), no crash or sanitizer report
(the daemon teardown checks), and the daemon goes on serving: `stage status`
answers and a real commit afterwards replicates exactly.

The hostile peer is build/tests/evilpeer (tests/tools/evilpeer*.c): the
daemon's own handshake, sealing and frames, playing one scenario each run.
It exits 0 when the daemon answered as the scenario expects on the wire
(refused, closed, or for the *_ok controls: accepted). The cluster is
n0 -> n1 -> n2 (replicas = 1); n2 is the evil node: a hosts-file entry with
the shared key whose daemon is never started.
"""
import os
import re
import stat
import subprocess
import time

import pytest

from helpers import (BUILD, F, assert_replica_of, ckpt, commit_wait, ls_find, make_tree, replica,
                     sanitizer_report, snapshot, wait_for)

EVIL = BUILD / "tests" / "evilpeer"
JOB = "evil-job"


class Trio:
    def __init__(self, make_cluster, tmp_path):
        if not os.access(EVIL, os.X_OK):
            pytest.fail(f"not built: {EVIL} (run `make`)", pytrace=False)
        self.n0, self.n1, self.ev = make_cluster(3, replicas=1, keep=100,
                                                 transfer={"watch": "off"}, start=False)
        self.n0.start()
        self.n1.start()
        # Where every hostile path and link points: nothing may change here.
        self.outside = tmp_path / "outside"
        make_tree(self.outside, [F("secret", b"not for peers\n")])
        self.steps = 0

    def evil(self, scenario, step=None, peer="n1", timeout=60):
        cp = subprocess.run([EVIL, "--job", JOB, "--step", step or scenario, "--outside", self.outside,
                             self.ev.config_path, peer, scenario],
                            capture_output=True, text=True, timeout=timeout)
        assert cp.returncode in (0, 1), f"evilpeer {scenario} could not run ({cp.returncode}):\n" \
                                        f"{cp.stdout}{cp.stderr}"
        assert sanitizer_report(cp.stderr) is None, cp.stderr
        return cp

    def watched(self):
        """What no peer may touch: outside, and n1's own trees."""
        return {str(p): snapshot(p) for p in [self.outside, self.n1.base / "ckpt", self.n1.stage_root,
                                              self.n1.src_root]}

    def published(self):
        d = self.n1.base / "replicas" / self.ev.name / JOB
        return sorted(os.listdir(d)) if d.is_dir() else []

    def legit_commit(self):
        """A real commit n0 -> n1 replicates exactly, after whatever came before."""
        self.steps += 1
        step = make_tree(ckpt(self.n0, step=f"step-{self.steps}"),
                         [F("w.bin", size=300_000), F("sub/opt.bin", size=70_000)], seed=self.steps)
        commit_wait(self.n0, step)
        assert_replica_of(step, replica(self.n1, self.n0, step=f"step-{self.steps}"))


@pytest.fixture
def trio(make_cluster, tmp_path):
    return Trio(make_cluster, tmp_path)


def refused(t, scenario, log, step=None):
    """Runs a scenario the daemon must refuse; '' or what went wrong."""
    step = step or scenario
    mark = len(t.n1.log())
    cp = t.evil(scenario, step)
    out = f"{scenario}:\n{cp.stdout}"
    if cp.returncode != 0:
        return f"the daemon did not refuse {out}"
    try:
        wait_for(lambda: re.search(log, t.n1.log()[mark:]), 5, f"log line /{log}/")
    except AssertionError:
        return f"no log line /{log}/ for {out}n1 log:\n{t.n1.log()[mark:][-1500:]}"
    rep = t.n1.base / "replicas" / t.ev.name / JOB / step
    inc = t.n1.base / "replicas" / ".incoming" / t.ev.name / JOB / step
    if rep.exists() or (inc / ".stage" / "manifest").exists():
        return f"{scenario}: published a hostile offer ({rep})"
    if (inc / ".stage" / "offer.new").exists():
        return f"{scenario}: the refused manifest stays on disk ({inc}/.stage/offer.new)"
    return ""


def run_refusals(t, table):
    before = t.watched()
    problems = [p for p in (refused(t, s, log) for s, log in table) if p]
    assert not problems, "\n\n".join(problems)
    assert t.watched() == before, "something outside replica_root changed"
    t.n1.assert_serving()


def mf(step, why):
    return rf"from n2: the offered manifest of {JOB}/{step} does not read: offer\.new:\d+: {why}"


def test_offers_and_manifests_refused(trio):
    """(a) manifests naming paths that escape, (b) manifests that do not
    read or are absurd, and offers whose own fields lie. The well-formed
    control is published, so the refusals are about the lies alone."""
    t = trio
    cp = t.evil("offer_ok")
    assert cp.returncode == 0, cp.stdout
    run_refusals(t, [
        ("path_dotdot", mf("path_dotdot", r"path has a '\.' or '\.\.' component")),
        ("path_absolute", mf("path_absolute", "path has an empty component")),
        ("path_inner_dotdot", mf("path_inner_dotdot", r"path has a '\.' or '\.\.' component")),
        ("path_stage", mf("path_stage", r"path under \.stage")),
        ("path_dot", mf("path_dot", r"path has a '\.' or '\.\.' component")),
        ("path_empty_component", mf("path_empty_component", "path has an empty component")),
        ("path_beneath_link", mf("path_beneath_link", "entry beneath a file or a link")),
        ("mf_garbage", mf("mf_garbage", "not a stage manifest")),
        ("mf_truncated", mf("mf_truncated", r"truncated \(no end line\)")),
        ("mf_long_line", mf("mf_long_line", "line longer than 65536 bytes")),
        ("mf_root_mismatch", rf"from n2: the offered manifest of {JOB}/mf_root_mismatch is not the offered root"),
        ("mf_short", "from n2: a manifest slice out of order"),
        ("mf_overrun", "from n2: a manifest slice out of order"),
        ("mf_bad_offset", "from n2: a manifest slice out of order"),
        ("mf_huge_file", r"from n2: huge\.bin: bytes 1048576 to 1125899906842624 were neither sent nor held"),
        ("offer_other_origin", "from n2: node n2 may offer only its own checkpoints, not n0's"),
        ("offer_dup_origin", "from n2: node n2 may offer only its own checkpoints, not n0's"),
        ("offer_bad_job", "from n2: a malformed offer"),
        ("offer_bad_step", "from n2: a malformed offer"),
        ("offer_bad_root", "from n2: a malformed offer"),
        ("offer_no_size", "from n2: a malformed offer"),
        ("offer_size_4_bytes", "from n2: a malformed offer"),
        ("offer_size_zero", "from n2: a manifest of 0 bytes"),
        ("offer_size_huge", "from n2: a manifest of 268435457 bytes"),
    ])
    # 1 PiB declared: what landed is the one piece sent, nothing reserved.
    huge = t.n1.base / "replicas" / ".incoming" / "n2" / JOB / "mf_huge_file" / "huge.bin"
    assert not huge.exists() or huge.stat().st_blocks * 512 <= 2 << 20, huge.stat()
    assert t.published() == ["offer_ok"]
    t.legit_commit()


def test_data_not_matching_refused(trio):
    """(c) DATA that does not match the manifest. Then the same step
    offered honestly resumes from the receiver's journal and publishes an
    exact copy: a refused piece leaves nothing behind that is trusted."""
    t = trio
    run_refusals(t, [
        ("data_bad_chunk", r"from n2: dir/a\.bin: chunk 0 does not match its digest"),
        ("data_bad_frame", r"from n2: dir/a\.bin: chunk 2 does not match its digest"),
        ("data_past_end", r"from n2: dir/a\.bin: the piece at 8192 is damaged"),
        ("data_index_range", "from n2: DATA for entry 6, which is not a file with data"),
        ("data_index_huge", "from n2: DATA for entry 18446744073709551615, which is not a file"),
        ("data_not_file", "from n2: DATA for entry 0, which is not a file with data"),
        ("data_gap", r"from n2: dir/a\.bin: bytes 0 to 4096 were neither sent nor held here"),
        ("data_backwards", "from n2: a piece for entry 1 out of order"),
        ("data_duplicate", r"from n2: dir/a\.bin: piece at 0, expected 4096"),
        ("data_end_early", r"from n2: dir/a\.bin: bytes 0 to 10000 were neither sent nor held"),
        ("data_end_mid_file", r"from n2: dir/a\.bin: bytes 4096 to 10000 were neither sent nor held"),
        ("data_bomb", r"from n2: dir/a\.bin: the piece at 0 is damaged"),
        ("data_no_fields", "from n2: a DATA frame without its fields"),
        ("data_zero_length", r"from n2: dir/a\.bin: the piece at 0 is damaged"),
        ("data_unknown_type", "from n2: unexpected frame type 999"),
        ("data_done_from_sender", "from n2: unexpected frame type 40"),
    ])
    assert t.published() == []
    # Resume over the refused pieces: the control sends what WANT asks.
    for s in ("data_bad_chunk", "data_end_mid_file"):
        cp = t.evil("offer_ok", step=s)
        assert cp.returncode == 0, cp.stdout
        r = t.n1.run("verify", "--deep", t.n1.base / "replicas" / "n2" / JOB / s)
        assert r.returncode == 0, r.stdout + r.stderr
    # Right bytes under a frame digest that does not match them: taken,
    # since the receiver checks every byte against the manifest's digests
    # and not the frame's (a second pass over the same bytes).
    cp = t.evil("data_bad_digest")
    assert cp.returncode == 0, cp.stdout
    r = t.n1.run("verify", "--deep", t.n1.base / "replicas" / "n2" / JOB / "data_bad_digest")
    assert r.returncode == 0, r.stdout + r.stderr
    assert t.published() == ["data_bad_chunk", "data_bad_digest", "data_end_mid_file"]
    t.legit_commit()


def test_streams_refused(trio):
    """Streams (docs/PROTOCOL.md, "Streams") that break their rules: a
    stream of an offer nobody made, an offer on more than 16, a stream
    beyond the offer's count, a piece on stream 0 in stream 1's turn
    after stream 1 ended, a chunk's pieces split over two streams, and a
    hand-off's mark (MSG_MARK) that no MSG_RESTREAM asked for. Each is refused, naming what was wrong; nothing is
    published; a real commit then replicates."""
    t = trio
    run_refusals(t, [
        ("stream_no_offer", rf"from n2: no offer of n2/{JOB}/stream_no_offer is being received"),
        ("stream_too_many", r"from n2: an offer on 17 streams \(1 to 16\)"),
        ("stream_index_range", "from n2: stream 2 of an offer of 2 streams"),
        ("stream_out_of_turn", "from n2: frame type 37 after the streams ended"),
        ("stream_chunk_split", r"from n2: stream 1: a piece after another stream ended "
                               r"\(out of its turn\)"),
        ("stream_mark_unasked", r"from n2: stream 1: a MSG_MARK out of place"),
    ])
    assert t.published() == []
    t.legit_commit()


def test_frames_out_of_place_refused(trio):
    """(d) After the handshake: frames of an unknown or wrong type (sealed,
    so they reach the protocol layer), and frames the framing layer refuses
    whole (too long, a reserved word set, no seal). Unknown and repeated
    keys in a good offer are skipped, as docs/PROTOCOL.md says."""
    t = trio
    cp = t.evil("offer_unknown_keys")
    assert cp.returncode == 0, cp.stdout
    run_refusals(t, [
        ("frame_unknown_first", "peer n2: frame type 999 where a request is due"),
        ("frame_data_first", "peer n2: frame type 37 where a request is due"),
        ("frame_hello_again", "peer n2: frame type 32 where a request is due"),
        ("frame_oversized", r"peer n2 \(\S+\): a frame failed its seal or is malformed"),
        ("frame_reserved", r"peer n2 \(\S+\): a frame failed its seal or is malformed"),
        ("frame_unsealed", r"peer n2 \(\S+\): a frame failed its seal or is malformed"),
        ("frame_oversized_mid_offer", "from n2: receiving the manifest: Bad message"),
    ])
    assert t.published() == ["offer_unknown_keys"]
    t.legit_commit()


def test_requests_refused(trio):
    """(e) The evil node as a requester, against its own published copy
    (dir/out links to `outside`): paths that escape, a link on the way,
    .stage, another origin's copy, another commit, a step that is not
    there, ranges past the end or absurd, names that are not names; a
    flood of questions is answered. The controls fetch the copy back."""
    t = trio
    for s in ("offer_ok", "fetch_manifest_ok", "fetch_range_ok", "fetch_range_no_sum", "hold_flood",
              "hold_names"):
        cp = t.evil(s, step="good")
        assert cp.returncode == 0, cp.stdout
    malformed = "fetch from n2 refused: a path that is absolute, has an empty, '.' or '..' component"
    good = re.escape(str(t.n1.base / "replicas" / "n2" / JOB / "good"))
    table = [
        ("fetch_dotdot", malformed),
        ("fetch_absolute", malformed),
        ("fetch_inner_dotdot", malformed),
        ("fetch_stage", malformed),
        ("fetch_via_link", rf"restore of n2/{JOB}/good for n2: dir/out/secret: Too many levels of symbolic links"),
        ("fetch_link", rf"restore of n2/{JOB}/good for n2: dir/out: Too many levels of symbolic links"),
        ("fetch_dir", rf"restore of n2/{JOB}/good for n2: dir: not a file of that size here"),
        ("fetch_past_end", rf"restore of n2/{JOB}/good for n2: dir/a\.bin: not a file of that size"),
        ("fetch_huge_size", rf"restore of n2/{JOB}/good for n2: dir/a\.bin: not a file of that size"),
        ("fetch_huge_offset", rf"restore of n2/{JOB}/good for n2: dir/a\.bin: not a file of that size"),
        ("fetch_other_origin", "fetch from n2 refused: it may fetch only its own checkpoints, not n0's"),
        ("fetch_wrong_root", f"fetch from n2 refused: {good}: holds another commit of this step"),
        ("fetch_no_step", "fetch from n2 refused: .*/no-such-step: no copy here"),
        ("fetch_bad_job", "fetch from n2 refused: no valid origin, job or step name"),
        ("hold_bad_job", "question from n2 refused: no valid job or step name"),
    ]
    before = t.watched()
    requests_refused(t, table)
    assert t.watched() == before
    t.n1.assert_serving()
    t.legit_commit()


def requests_refused(t, table):
    """Each (scenario, log regex) of table, against the published copy
    "good": refused, with that log line on n1."""
    problems = []
    for s, log in table:
        mark = len(t.n1.log())
        cp = t.evil(s, step="good")
        if cp.returncode != 0:
            problems.append(f"the daemon did not refuse {s}:\n{cp.stdout}")
        elif not re.search(log, t.n1.log()[mark:]):
            problems.append(f"{s}: no log line /{log}/:\n{t.n1.log()[mark:][-1000:]}")
    assert not problems, "\n\n".join(problems)


def test_relay_requests_refused(trio):
    """A key holder asking n1 to relay (MSG_RELAY): a question passed on to
    n0 comes back as two answers and an end; a node not in the hosts file,
    the relay itself, a node named twice, a request that is not relayed
    (a fetch), a question that does not parse and no time limit are each
    refused with a log line naming the peer, and n1 goes on serving."""
    t = trio
    cp = t.evil("relay_ok", step="good")
    assert cp.returncode == 0, cp.stdout
    assert "n2 asks this node to relay a question to 1 node" in t.n1.log()
    table = [
        ("relay_unknown_node", "relay from n2 refused: node 'no-such-node' is not in the hosts file"),
        ("relay_self", "relay from n2 refused: node 'n1' is the relay itself"),
        ("relay_twice", "relay from n2 refused: node 'n0' is named twice"),
        ("relay_not_relayed", "relay from n2 refused: frame type 44 is not relayed"),
        ("relay_bad_question", "relay from n2 refused: a malformed request"),
        ("relay_no_timeout", "relay from n2 refused: a malformed request"),
    ]
    requests_refused(t, table)
    t.n1.assert_serving()
    t.legit_commit()


def test_setid_bits_never_taken_from_a_peer(trio):
    """DAEMON BUG (fixed in repl_build.c): a received copy kept the set-id
    bits its manifest asked for, on files the receiver creates as itself:
    a daemon run as root let any key holder plant a set-uid-root program on
    every partner. Restore drops them "on another node's word"; the
    receiver now does too (the rest of the mode is kept)."""
    t = trio
    cp = t.evil("offer_setid")
    assert cp.returncode == 0, cp.stdout
    top = t.n1.base / "replicas" / "n2" / JOB / "offer_setid"
    modes = {p: stat.S_IMODE(os.lstat(top / p).st_mode) for p in ("sgid", "sgid/tool", "suid")}
    assert modes == {"sgid": 0o775, "sgid/tool": 0o755, "suid": 0o755}, \
        {p: oct(m) for p, m in modes.items()}
    t.legit_commit()


def start_partner(t, scenario, count=None):
    """evilpeer listening as n2 for n1's sender; returns once it listens."""
    p = subprocess.Popen([EVIL, "--job", JOB, "--outside", t.outside] +
                         (["--count", str(count)] if count else []) +
                         [t.ev.config_path, "n1", scenario],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in p.stdout:
        lines.append(line)
        if "listening on" in line:
            break
    else:
        p.wait(10)
        pytest.fail(f"evilpeer {scenario} did not listen:\n{''.join(lines)}")
    p.lines = lines
    return p


def partner_done(p, scenario, timeout=60):
    out = "".join(p.lines) + p.stdout.read()
    rc = p.wait(timeout)
    assert rc == 0, f"{scenario}: n1's sender did not keep to the WANT ({rc}):\n{out}"


def test_lying_partner(trio):
    """(f) The evil node as n1's partner, for a real sender: a WANT whose
    K_HELD claims every chunk (exact length, 64 KiB long), claims chunk 0
    only (one byte), or resumes beyond the end, then vanishes without DONE;
    one that vanishes mid-copy; one that says K_FRAME_SUM 0 (every frame
    then carries 0 for its digest; without it, every frame's digest is
    right: it goes first, so that its no_sum would show if it stuck to the
    copies after it). The sender sends exactly what each WANT
    asks, neither crashes nor hangs, and never counts the copy as confirmed:
    it stays pending (docs/PROTOCOL.md: only DONE 0 confirms) and is
    offered again. n1 meanwhile still receives n0's commits."""
    t = trio
    step = make_tree(ckpt(t.n1, step="s1"), [F("a.bin", size=300_000), F("b.bin", size=5000)])
    for i, s in enumerate(["recv_no_sum", "recv_held_all", "recv_held_long", "recv_held_short",
                           "recv_want_beyond", "recv_vanish_mid"]):
        p = start_partner(t, s)
        if i == 0:
            cp = t.n1.run("commit", step)
            assert cp.returncode == 0, cp.stderr
        partner_done(p, s)
        f = ls_find(t.n1, "job1/s1")
        assert f and f["state"] == "committed" and f["copies"] in ("n2:pending", "n2:sending"), f
    wait_for(lambda: "job1/s1 to n2:" in t.n1.log(), 5, "n1 to log the lost copy")
    assert "confirmed on n2" not in t.n1.log()
    t.n1.assert_serving()
    t.legit_commit()


def test_refusing_partner_fails_the_copy(trio):
    """(f) A partner that refuses every offer: after five refusals the copy
    is failed for good and `commit --wait` says so (exit 1), not success."""
    t = trio
    step = make_tree(ckpt(t.n1, step="s1"), [F("a.bin", size=100_000)])
    p = start_partner(t, "recv_refuse", count=5)
    cp = t.n1.run("commit", step, "--wait", timeout=60)
    partner_done(p, "recv_refuse")
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert "an evil partner refuses" in cp.stdout + cp.stderr + t.n1.log()
    f = ls_find(t.n1, "job1/s1")
    assert f and f["copies"] == "n2:failed", f
    t.n1.assert_serving()
    t.legit_commit()


def test_lying_answers_to_a_question(trio):
    """The evil node answers n1's `verify --cluster` question with copy
    groups that lie: a state no node sends (the answer is malformed), or a
    frame full of valid groups from 44,000 made-up origins. DAEMON BUG
    (fixed in repl_ask.c): the decision over the groups costs their square
    (cverify.c, one_origin -> find): one such answer kept the verify busy
    for 38 s and logged 132,962 lines. An answer of more groups than a hosts
    file can name nodes (4096) is now refused as a lie. Either way n1
    answers at once, says which node lied, and goes on serving."""
    t = trio
    for s, why in [("recv_hold_garbage", "n2: a malformed answer"),
                   ("recv_hold_flood", r"n2: an answer of \d+ copy groups \(at most 4096\)")]:
        p = start_partner(t, s)
        t0 = time.monotonic()
        cp = t.n1.run("verify", "--cluster", ckpt(t.n1, step="s1"), timeout=60)
        took = time.monotonic() - t0
        partner_done(p, s)
        assert cp.returncode == 1 and re.search(why, cp.stdout + cp.stderr), cp.stdout + cp.stderr
        assert took < 10, f"{s}: verify --cluster took {took:.1f} s"
    t.n1.assert_serving()
    t.legit_commit()
