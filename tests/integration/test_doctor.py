"""stage doctor, the preflight: real faults, each of which it must name.

Four nodes in network namespaces (n0..n3, 10.231.9.1-4/24), each with one
veth whose other end is a port of a Linux bridge in a fifth namespace, so
every pair of nodes can talk. n0 is the asker (its daemon coordinates). The
faults, all real:

  - the slow pair n1-n2: an htb class of 100 Mbit/s on n1's veth for packets
    to n2 and on n2's for packets to n1 (u32 on the destination; pure ACKs
    aside, Net.shape says why), every other pair unshaped; iperf3 over it,
    run by the test (one way and both ways at once, as the doctor
    measures), is the reference figure the doctor's must be within 20 % of;
  - port 29500 blocked inside n3: an nftables input rule that drops it;
  - n2's daemon under libfaketime, its clock 3 s ahead;
  - a fact that differs: each node's [doctor] facts has `image: file
    BASE/image`, n1's file says something else;
  - n3's daemon killed (the last test): named as down, the rest still checked.

The namespaces and daemons are set up once for the module (the `net`
fixture); each test puts in the faults it wants (net.faults(True/False) is
idempotent), so any test also runs alone. Every netns test needs root and
skips with the reason otherwise; the loopback tests (a healthy --quick run,
fact values, node lists, bad input, a doctor already running) run anywhere.

The doctor gives a check a line of its own when it is a problem and folds
what passed into one summary line per check (subject "all"); so a pair, a
port or a fact that passed is found as "no problem line, the check made"
(passed()), and the figures of every pair in the matrices.

The host's own clock: a node's clock check is a problem when the kernel says
it is not synchronized (adjtimex, STA_UNSYNC), and the namespaces share the
host's clock. On a host whose clock is not synchronized (a VM with no NTP)
every node's clock is rightly a problem, so there "healthy" means: nothing
else is, and those are the only problems, each with "synced": false
(HOST_SYNCED below). The test does not touch the host's clock discipline.
"""
import ctypes
import glob
import json
import os
import re
import shutil
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from clockstate import clock_unsynced, synced_clock  # noqa: F401 (fixtures)
from conftest import Daemon, free_port, need_root
from helpers import STAGE, client_env, json_lines, rm_tree, run_cmd, staged_refuses, wait_for, \
    write_hosts, write_key

PORT = 29500                     # the job's port ([doctor] ports' default)
PEER_PORT = 7431
SUBNET = "10.231.9"
SLOW = (1, 2)                    # the shaped pair
SLOW_RATE = "100mbit"
FIREWALLED = 3                   # drops PORT
SKEWED = 2                       # under faketime
SKEW_S = 3
ODD = 1                          # its image fact differs
DOWN = 3                         # killed in the last test
IMAGE, ODD_IMAGE = "img-2024.06-cuda12.4", "img-2024.05-cuda12.1"
NODES = [f"n{i}" for i in range(4)]
# Quick runs: half-second measurements, 16 MiB per storage root, two sampled
# ephemeral ports, and a cap of 64 MiB/s (0.54 Gbit/s) per direction of a
# pair: every unshaped pair then measures the cap, whatever the 2 CPUs have
# free (a 1 GiB/s cap left them CPU-bound, and under ASan one direction read
# 0.66 against a median of 1.70: "far below"), still far above the slow
# pair's 100 Mbit/s (200 left too little room: a loaded ASan run read an
# unshaped pair at 0.37 against the 2 x 0.19 the test asks).
DOCTOR = {"duration_ms": 500, "storage_size": "16MiB", "port_sample": 2, "rate": "64MiB"}
# Summary checks ("bandwidth / all", "latency / all"): present, not held to a
# particular ok when a pair is a problem.
SUMMARY = "all"


def host_clock_synced():
    """What adjtimex(2) says of this kernel's clock (read only: modes 0):
    False when it returns TIME_ERROR (STA_UNSYNC set: nothing disciplines
    it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(512)    # struct timex, zeroed: modes = 0
        return libc.adjtimex(buf) not in (-1, 5)
    except (OSError, AttributeError):
        return True


HOST_SYNCED = host_clock_synced()


# ---------------------------------------------------------------- output

def checks_of(events):
    return [e for e in events if e["event"] == "check"]


def by_key(events):
    """{(check, subject): event}; asserts no check is reported twice."""
    out = {}
    for e in checks_of(events):
        k = (e["check"], e["subject"])
        assert k not in out, f"check {k} reported twice: {out[k]} and {e}"
        out[k] = e
    return out


def matrix(events, name):
    ms = [e for e in events if e["event"] == "matrix" and e["name"] == name]
    assert len(ms) == 1, f"want one {name!r} matrix, got {len(ms)}: " \
                         f"{[e['name'] for e in events if e['event'] == 'matrix']}"
    return ms[0]


def doctor_json(cp):
    """The events of a `stage doctor --json` run, checking the contract's
    shape: one object per line, check objects with check/subject/ok/text,
    matrices square with an empty diagonal, one result last whose code is
    the exit status. (That every problem has advice: no_advice, asserted
    at the end of each test, after its other findings.)"""
    ev = json_lines(cp.stdout)
    res = [e for e in ev if e["event"] == "result"]
    assert len(res) == 1 and ev[-1]["event"] == "result", f"want one result, last: {ev[-1]}"
    assert res[0]["code"] == cp.returncode, f"result {res[0]} but exit {cp.returncode}"
    for e in checks_of(ev):
        for k, t in (("check", str), ("subject", str), ("ok", bool), ("text", str)):
            assert isinstance(e.get(k), t), f"check event without a {t.__name__} {k!r}: {e}"
    for m in (e for e in ev if e["event"] == "matrix"):
        n = len(m["nodes"])
        assert isinstance(m.get("unit"), str), m
        assert len(m["cells"]) == n and all(len(r) == n for r in m["cells"]), f"matrix not {n}x{n}: {m}"
        if m["name"].startswith(("bandwidth", "latency")):
            assert all(m["cells"][i][i] == "" for i in range(n)), f"non-empty diagonal: {m}"
    return ev


def no_advice(events):
    """The problems without advice ("for each problem an indented line
    starting with → with advice")."""
    return [e for e in checks_of(events) if not e["ok"] and not (isinstance(e.get("advice"), str)
                                                                 and e["advice"].strip())]


def assert_advised(events, what):
    bad = no_advice(events)
    assert not bad, f"{what}: problems with no advice:\n  " + "\n  ".join(json.dumps(e) for e in bad)


def problems(events):
    return {(e["check"], e["subject"]): e for e in checks_of(events) if not e["ok"]}


def passed(c, check, subject):
    """subject passed check: its own event is ok, or there is none (the
    doctor gives a line of its own only to a problem, and folds what passed
    into one summary line, or none when something failed), but the check
    was made."""
    assert any(k[0] == check for k in c), f"no {check} check at all: {sorted(c)}"
    return c.get((check, subject), {"ok": True})["ok"]


def unsynced_clock(e):
    """A clock problem that is only the host's unsynchronized clock."""
    return (not HOST_SYNCED and e["check"] == "clock" and e.get("synced") is False
            and abs(e.get("offset_ms", 1e9)) <= 50)


def assert_only_problems(events, want, what):
    """The problems are exactly `want` (set of (check, subject)), besides
    summaries and the host's unsynchronized clock."""
    got = {k for k, e in problems(events).items() if k[1] != SUMMARY and not unsynced_clock(e)}
    assert got == set(want), (f"{what}: problems {sorted(got)}, want {sorted(want)}; unexpected:\n  " +
                              "\n  ".join(json.dumps(problems(events)[k]) for k in sorted(got - set(want))))


def expected_code(want):
    """Exit status when `want` problems are all there is."""
    return 1 if want or not HOST_SYNCED else 0


def assert_result(cp, events, n_nodes):
    res = events[-1]
    p = problems(events)
    if cp.returncode == 0:
        assert not p, f"exit 0 with problems: {list(p)}"
        return
    m = re.match(r"^(\d+) problems? found on (\d+) nodes?$", res["text"])
    assert m, f"result text {res['text']!r}"
    # Counted with or without the summaries.
    assert int(m.group(1)) in (len(p), len([k for k in p if k[1] != SUMMARY])), \
        f"{res['text']!r} but {len(p)} checks not ok: {sorted(p)}"
    assert int(m.group(2)) == n_nodes, res["text"]


def cell(m, a, b):
    return m["cells"][m["nodes"].index(a)][m["nodes"].index(b)]


MARKS = ("✓", "✗")


def human_checks(text):
    """(checks, faults) of a human run. checks: [(mark, line)], one line per
    check beginning with ✓ or ✗. faults: what breaks the layout: a ✗ line
    not followed by an indented line beginning with "→ " (its advice), an
    advice line after a ✓ line or standing alone."""
    lines = text.split("\n")
    out, faults = [], []
    for i, line in enumerate(lines):
        if line.lstrip().startswith(MARKS):
            mark = line.lstrip()[0]
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            has = re.match(r"^\s+→ \S", nxt) is not None
            if mark == "✗" and not has:
                faults.append(f"✗ line without an indented '→ ' advice line after it: {line!r}")
            out.append((mark, line))
        elif re.match(r"^\s*→ ", line):
            if not (i > 0 and lines[i - 1].lstrip().startswith("✗")):
                faults.append(f"advice line {i + 1} not right after a ✗ line: {line!r}")
            if not re.match(r"^\s+→ ", line):
                faults.append(f"advice line {i + 1} not indented: {line!r}")
    assert out, f"no ✓/✗ check line in:\n{text}"
    return out, faults


def masked(s):
    """s with its numbers replaced: two runs' figures differ, their words not."""
    return re.sub(r"[+-]?\d+(?:\.\d+)?", "#", s)


# ---------------------------------------------------------------- the topology

class Net:
    """The five namespaces, the four daemons, the faults. Commands inside a
    node's namespace: net.x(i, argv...)."""

    def __init__(self, base, tag):
        self.base = Path(base)
        self.br = f"stgdr-br{tag}"
        self.ns = [f"stgdr-n{i}-{tag}" for i in range(4)]
        self.addr = [f"{SUBNET}.{i + 1}" for i in range(4)]
        self.made = []
        self.nodes = []
        self.ref = {}               # (a, b): iperf3's Gbit/s from a to b
        self.on = {"shaped": False, "firewall": False, "skew": False, "odd": False}

    def x(self, i, *argv, **kw):
        return run_cmd("ip", "netns", "exec", self.ns[i], *argv, **kw)

    def up(self):
        for ns in [self.br] + self.ns:
            r = run_cmd("ip", "netns", "add", ns, check=False)
            if r.returncode != 0:
                pytest.skip(f"cannot create a network namespace: {r.stderr.strip()}")
            self.made.append(ns)
            run_cmd("ip", "-n", ns, "link", "set", "lo", "up")
        run_cmd("ip", "-n", self.br, "link", "add", "br0", "type", "bridge")
        run_cmd("ip", "-n", self.br, "link", "set", "br0", "up")
        for i, ns in enumerate(self.ns):
            # Both ends are made in their namespaces: no name in ours.
            run_cmd("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}",
                    "netns", self.br)
            run_cmd("ip", "-n", self.br, "link", "set", f"p{i}", "master", "br0")
            run_cmd("ip", "-n", self.br, "link", "set", f"p{i}", "up")
            run_cmd("ip", "-n", ns, "addr", "add", f"{self.addr[i]}/24", "dev", "eth0")
            run_cmd("ip", "-n", ns, "link", "set", "eth0", "up")
        wait_for(lambda: all(" UP " in run_cmd("ip", "-n", ns, "-br", "link", "show", "dev", "eth0").stdout
                             for ns in self.ns), 10, "the veth links to come up", 0.05)

    def start_daemons(self):
        key = write_key(self.base / "cluster.key")
        hosts = write_hosts(self.base / "hosts", [(NODES[i], f"{self.addr[i]}:{PEER_PORT}", None)
                                                  for i in range(4)])
        for i in range(4):
            nb = self.base / NODES[i]
            nb.mkdir(parents=True, exist_ok=True)
            (nb / "image").write_text(IMAGE + "\n")
            d = Daemon(nb, name=NODES[i], listen=f"{self.addr[i]}:{PEER_PORT}", netns=self.ns[i],
                       cluster={"hosts": hosts, "key_file": key}, transfer={"watch": "off"},
                       doctor={**DOCTOR, "facts": f"kernel: file /proc/sys/kernel/osrelease | "
                                                  f"image: file {nb / 'image'}"})
            # The source roots stay empty: the four nodes share this
            # machine's one disk and the doctor probes them all at once, so
            # a source probe here contends with three other nodes' storage
            # probes and can read at less than half what stage_root read
            # a moment earlier (seen: 160-400 MB/s against 0.6-1.1 GB/s),
            # which on real nodes, each with its own disk, it would not.
            self.nodes.append(d)
        for d in self.nodes:
            d.start()

    # ------------------------------------------------------------ faults

    def shape(self, on):
        """SLOW_RATE each way between the SLOW pair, on each one's egress
        for packets to the other. No default class: everything else leaves
        unshaped. Pure ACKs (TCP, IP length < 128) to the other go in a
        class of their own, not behind the data: the doctor measures both
        directions of a pair at once, and in one FIFO at 100 Mbit/s the
        reverse direction's ACKs wait behind this direction's data (a
        deep buffer, not a slow link: iperf3 --bidir then gets 0.19 one
        way and 0.12 the other, the doctor 0.10-0.19 with four streams)."""
        if self.on["shaped"] == on:
            return
        a, b = SLOW
        for src, dst in ((a, b), (b, a)):
            if on:
                dev = ("dev", "eth0", "parent", "1:")
                self.x(src, "tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb")
                self.x(src, "tc", "class", "add", *dev, "classid", "1:20", "htb", "rate", SLOW_RATE,
                       "quantum", "60000")
                self.x(src, "tc", "class", "add", *dev, "classid", "1:10", "htb", "rate", "10gbit",
                       "quantum", "60000")
                self.x(src, "tc", "filter", "add", *dev, "protocol", "ip", "prio", "1", "u32",
                       "match", "ip", "dst", f"{self.addr[dst]}/32", "match", "ip", "protocol", "6", "0xff",
                       "match", "u16", "0x0000", "0xff80", "at", "2", "flowid", "1:10")
                self.x(src, "tc", "filter", "add", *dev, "protocol", "ip", "prio", "2", "u32",
                       "match", "ip", "dst", f"{self.addr[dst]}/32", "flowid", "1:20")
            else:
                self.x(src, "tc", "qdisc", "del", "dev", "eth0", "root")
        self.on["shaped"] = on

    def firewall(self, on):
        if self.on["firewall"] == on:
            return
        i = FIREWALLED
        if on:
            self.x(i, "nft", "add", "table", "inet", "t")
            self.x(i, "nft", "add", "chain", "inet", "t", "in", "{ type filter hook input priority 0; }")
            self.x(i, "nft", "add", "rule", "inet", "t", "in", "tcp", "dport", str(PORT), "drop")
        else:
            self.x(i, "nft", "delete", "table", "inet", "t")
        self.on["firewall"] = on

    def skew(self, on):
        if self.on["skew"] == on:
            return
        d = self.nodes[SKEWED]
        if d.running:
            rc = d.stop()
            assert rc == 0, f"{d.name} exited {rc} on SIGTERM"
        d.exec_prefix = faketime_prefix(SKEW_S) if on else []
        self.start(SKEWED)
        self.on["skew"] = on

    def start(self, i):
        """Starts node i's daemon once its peer port is free again: a daemon
        that just exited may hold its listening socket a little longer
        (conftest.after_kill9), longer on a busy machine."""
        wait_for(lambda: f":{PEER_PORT} " not in self.x(i, "ss", "-Hltn").stdout, 10,
                 f"port {PEER_PORT} to be free in {self.ns[i]}", 0.05)
        self.nodes[i].start()

    def odd_fact(self, on):
        (self.base / NODES[ODD] / "image").write_text((ODD_IMAGE if on else IMAGE) + "\n")
        self.on["odd"] = on

    def faults(self, on):
        self.shape(on)
        self.firewall(on)
        self.skew(on)
        self.odd_fact(on)

    def all_up(self):
        for i, d in enumerate(self.nodes):
            if not d.running:
                self.start(i)

    # ------------------------------------------------------------ measuring

    def iperf3(self, a, b, secs=2, streams=4, bidir=False):
        """iperf3 from node a to node b: the Gbit/s b received (bidir: and
        the Gbit/s a received from b at the same time)."""
        port = 5201
        srv = subprocess.Popen(["ip", "netns", "exec", self.ns[b], "iperf3", "-s", "-1", "-p", str(port)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: f":{port} " in self.x(b, "ss", "-Hltn").stdout, 10, "iperf3 -s to listen", 0.02)
            cp = self.x(a, "iperf3", "-c", self.addr[b], "-p", port, "-t", secs, "-P", streams, "-J",
                        *(["--bidir"] if bidir else []), check=False, timeout=secs + 30)
            j = json.loads(cp.stdout)
            assert "error" not in j, f"iperf3 n{a}>n{b}: {j['error']}"
            fwd = j["end"]["sum_received"]["bits_per_second"] / 1e9
            return (fwd, j["end"]["sum_received_bidir_reverse"]["bits_per_second"] / 1e9) if bidir else fwd
        finally:
            if srv.poll() is None:
                srv.kill()
            srv.wait(10)

    def dial(self, i, host, ports):
        """{port: "open" | "timeout" | "refused"}: TCP connects from node i."""
        code = ("import socket, sys\n"
                "for p in sys.argv[2:]:\n"
                "    try:\n"
                "        socket.create_connection((sys.argv[1], int(p)), timeout=1.5).close(); r = 'open'\n"
                "    except socket.timeout: r = 'timeout'\n"
                "    except ConnectionRefusedError: r = 'refused'\n"
                "    print(p, r)\n")
        out = self.x(i, "python3", "-c", code, host, *ports, timeout=30).stdout
        return {int(p): r for p, r in (line.split() for line in out.splitlines())}

    def doctor(self, *args, timeout=90, asker=0):
        d = self.nodes[asker]
        cp = d.run("doctor", *args, timeout=timeout)
        assert cp.returncode in (0, 1), \
            f"stage doctor {' '.join(args)} exited {cp.returncode}\nstdout:\n{cp.stdout}\nstderr:\n{cp.stderr}\n" \
            f"{d.name}'s log:\n{d.log()[-3000:]}"
        return cp

    def close(self):
        problems = []
        try:
            for d in self.nodes:
                problems += d.close()
        finally:
            for ns in self.made:
                run_cmd("ip", "netns", "del", ns, check=False)
        return problems


NS_RE = re.compile(r"^stgdr-(?:br|n\d-)(\d+)$")


def remove_stale_namespaces():
    """Namespaces of this module left by a run that was killed before its
    teardown (their tag is the pid of a pytest that is gone)."""
    for line in run_cmd("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = NS_RE.match(name)
        if m and not os.path.exists(f"/proc/{m.group(1)}") and \
                not run_cmd("ip", "netns", "pids", name, check=False).stdout.strip():
            run_cmd("ip", "netns", "del", name, check=False)


def libfaketime():
    """libfaketime's thread-safe variant (the daemon has threads), or None."""
    for pat in ("/usr/lib/*/faketime/libfaketimeMT.so.1", "/usr/lib/faketime/libfaketimeMT.so.1",
                "/usr/local/lib/faketime/libfaketimeMT.so.1"):
        found = sorted(glob.glob(pat))
        if found:
            return found[0]
    return None


def faketime_prefix(secs):
    """What runs a daemon with its clock secs ahead: libfaketime preloaded.
    Not the faketime program: it forks and waits, so the SIGTERM the test
    sends would end faketime and orphan the daemon. An ASan build wants its
    runtime first among the libraries; with libfaketime preloaded it is
    not, which is harmless here, so that check is off."""
    asan = os.environ.get("ASAN_OPTIONS", "")
    asan = f"{asan}:verify_asan_link_order=0" if asan else "verify_asan_link_order=0"
    return ["env", f"LD_PRELOAD={libfaketime()}", f"FAKETIME=+{secs}s", f"ASAN_OPTIONS={asan}"]


def first_log_time(d):
    """The wall clock of d's first log line (the daemon's own clock)."""
    line = d.log().split("\n", 1)[0]
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z ", line)
    assert m, f"no timestamp in {line!r}"
    return datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    need_root("network namespaces, tc, nftables")
    for prog in ("ip", "tc", "nft", "iperf3", "ss"):
        if not shutil.which(prog):
            pytest.skip(f"`{prog}` is not installed (tools/install-deps installs it)")
    if not libfaketime():
        pytest.skip("libfaketime is not installed (tools/install-deps installs faketime)")
    if run_cmd("ip", "netns", "list", check=False).returncode != 0:
        pytest.skip("`ip netns` is not available")
    remove_stale_namespaces()
    base = tmp_path_factory.mktemp("doctor-net")
    n = Net(base, str(os.getpid()))
    problems = []
    try:
        n.up()
        n.start_daemons()
        yield n
    finally:
        problems = n.close()
    if problems:
        pytest.fail("daemon teardown:\n" + "\n".join(problems), pytrace=False)
    rm_tree(base)


# ---------------------------------------------------------------- the harness itself

@pytest.mark.timeout(60)
def test_netns_topology_is_what_the_faults_say(net):
    """Before any doctor: the topology and faults are real. Unshaped pairs are
    fast; the shaped pair carries ~100 Mbit/s each way, one way at a time
    and both at once (as the doctor measures), while the others stay fast
    (iperf3; kept as the reference); the nft rule drops port 29500 on n3
    only (a connect times out; another port answers, a third is refused);
    libfaketime puts a process's clock 3 s ahead inside a namespace, and a
    daemon started under it logs with that clock and still serves."""
    net.faults(False)
    net.all_up()
    fast = net.iperf3(0, 1)
    net.shape(True)
    slow_ab = net.iperf3(*SLOW)
    slow_ba = net.iperf3(*reversed(SLOW))
    bi_ab, bi_ba = net.iperf3(*SLOW, bidir=True)
    other = net.iperf3(SLOW[0], 3)
    net.ref.update({SLOW: slow_ab, tuple(reversed(SLOW)): slow_ba})
    print(f"\niperf3: n0>n1 {fast:.2f} Gbit/s unshaped, n1>n3 {other:.2f} with n1 shaped; "
          f"slow pair n1>n2 {slow_ab:.3f}, n2>n1 {slow_ba:.3f}, both at once {bi_ab:.3f} / {bi_ba:.3f}")
    # Unshaped: far above the shaped rate (how far depends on the CPUs free).
    assert fast > 1.0, f"an unshaped pair carries only {fast:.2f} Gbit/s"
    assert other > 1.0, f"n1>n3 carries only {other:.2f} Gbit/s with the n1-n2 shaping on"
    for v in (slow_ab, slow_ba, bi_ab, bi_ba):
        assert 0.075 < v < 0.105, f"the shaped pair carries {v:.3f} Gbit/s, want about 0.1"

    # Port 29500 dropped inside n3, only there and only that port.
    net.firewall(True)
    lst = subprocess.Popen(["ip", "netns", "exec", net.ns[FIREWALLED], "python3", "-c",
                            "import socket, sys, time\n"
                            "ls = [socket.create_server(('0.0.0.0', p)) for p in (29500, 29501)]\n"
                            "print('ready', flush=True); time.sleep(30)"],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert lst.stdout.readline().strip() == "ready"
        got = net.dial(0, net.addr[FIREWALLED], [PORT, PORT + 1, PORT + 2])
        assert got == {PORT: "timeout", PORT + 1: "open", PORT + 2: "refused"}, got
    finally:
        lst.kill()
        lst.wait(10)

    # libfaketime shifts the clock of a process inside a namespace ...
    t0 = time.time()
    faked = float(net.x(0, *faketime_prefix(SKEW_S), "date", "+%s.%N").stdout)
    t1 = time.time()
    assert SKEW_S - 0.1 < faked - (t0 + t1) / 2 < SKEW_S + 0.3, f"faketime: {faked - t0:.3f} s ahead"

    # ... and of a daemon started under it, which still joins the cluster.
    t0 = time.time()
    net.skew(True)
    ahead = first_log_time(net.nodes[SKEWED]) - t0
    assert SKEW_S - 0.1 < ahead < SKEW_S + 1.5, f"the daemon under faketime logs {ahead:.3f} s ahead"
    for d in net.nodes:
        d.assert_serving()


# ---------------------------------------------------------------- the doctor over the namespaces

def assert_clocks_right(c, skewed=None, nodes=NODES):
    """Every node's clock within 50 ms of the asker's, but `skewed`; a
    node's own clock check, where there is one, not a problem but for the
    host's unsynchronized clock."""
    for n in nodes:
        e = c.get(("clock", n))
        if e is None:
            assert passed(c, "clock", n), f"clock of {n}"
        elif n != skewed:
            assert abs(e["offset_ms"]) <= 50 and (e["ok"] or unsynced_clock(e)), f"a right clock: {e}"


@pytest.mark.timeout(60)
def test_netns_healthy_cluster(net):
    """No fault: every check passes (exit 0) — the host's unsynchronized
    clock aside (module docstring) — with every node answering, every pair
    measured fast, port 29500 open everywhere, the facts the same."""
    net.faults(False)
    net.all_up()
    cp = net.doctor("--json")
    ev = doctor_json(cp)
    assert_only_problems(ev, set(), "healthy cluster")
    assert cp.returncode == expected_code(set()), cp.stdout
    assert_result(cp, ev, 4)
    c = by_key(ev)
    for n in NODES:
        assert passed(c, "nodes", n), n
        assert passed(c, "port", f"{PORT}@{n}"), n
        assert passed(c, "fact", "image") and passed(c, "fact", "kernel")
    assert_clocks_right(c)
    for k in ("bandwidth", "latency", "link", "port", "fact", "nodes"):
        assert c[(k, SUMMARY)]["ok"], c[(k, SUMMARY)]
    assert c[("bandwidth", SUMMARY)].get("directions") == 12, c[("bandwidth", SUMMARY)]
    for name in ("bandwidth", "bandwidth, one stream"):
        m = matrix(ev, name)
        assert m["nodes"] == NODES and m["unit"] == "Gbit/s", m
        for a in NODES:
            for b in NODES:
                if a != b:
                    assert float(cell(m, a, b)) > 0.1, f"{name} {a}>{b}: {m}"
    m = matrix(ev, f"port {PORT}")
    assert all(cell(m, a, b) == "open" for a in NODES for b in NODES if a != b), m
    assert_advised(ev, "healthy cluster")


def fault_problems():
    a, b = SLOW
    return {("bandwidth", f"n{a}>n{b}"), ("bandwidth", f"n{b}>n{a}"), ("port", f"{PORT}@n{FIREWALLED}"),
            ("clock", f"n{SKEWED}"), ("fact", "image")}


def assert_slow_pair(c, ev, ref, nodes=NODES):
    """The slow pair named both ways, its figure within 20 % of iperf3's;
    every other measured pair far faster (the matrix: the doctor reports a
    pair on its own line only when it is a problem)."""
    a, b = SLOW
    slow = {(f"n{a}", f"n{b}"), (f"n{b}", f"n{a}")}
    m = matrix(ev, "bandwidth")
    for src, dst in ((a, b), (b, a)):
        bw = c[("bandwidth", f"n{src}>n{dst}")]
        want = ref[(src, dst)]
        assert not bw["ok"], bw
        assert isinstance(bw["gbps"], (int, float)) and abs(bw["gbps"] - want) <= 0.2 * want, \
            f"n{src}>n{dst}: doctor {bw['gbps']} Gbit/s, iperf3 {want:.3f}: {bw}"
        assert isinstance(bw.get("one_stream_gbps"), (int, float)) and bw.get("streams") == 4, bw
        assert f"n{src}" in bw["text"] and f"n{dst}" in bw["text"], bw
        v = cell(m, f"n{src}", f"n{dst}")
        assert abs(float(v) - want) <= 0.2 * want, f"matrix cell n{src}>n{dst} {v!r}, iperf3 {want:.3f}"
    for x in nodes:
        for y in nodes:
            if x != y and (x, y) not in slow:
                assert float(cell(m, x, y)) > 2 * max(ref.values()), f"unshaped {x}>{y}: {cell(m, x, y)}\n{m}"


def assert_skewed_clock(c, nodes=NODES):
    e = c[("clock", f"n{SKEWED}")]
    assert not e["ok"], e
    assert abs(e["offset_ms"] - SKEW_S * 1000) <= 50, f"offset {e['offset_ms']} ms, want {SKEW_S * 1000} ± 50: {e}"
    assert isinstance(e.get("delay_ms"), (int, float)) and isinstance(e.get("synced"), bool), e
    assert_clocks_right(c, skewed=f"n{SKEWED}", nodes=nodes)


def assert_odd_fact(c, nodes):
    """image named with the odd node, its value and the majority's; kernel
    the same everywhere."""
    e = c[("fact", "image")]
    assert not e["ok"], e
    want = {n: (ODD_IMAGE if n == f"n{ODD}" else IMAGE) for n in nodes}
    assert e["values"] == want, e
    for s in (f"n{ODD}", ODD_IMAGE, IMAGE):
        assert s in e["text"], f"the fact problem does not name {s!r}: {e['text']!r}"
    assert passed(c, "fact", "kernel")


def ensure_ref(net):
    a, b = SLOW
    for src, dst in ((a, b), (b, a)):
        if (src, dst) not in net.ref:
            net.ref[(src, dst)] = net.iperf3(src, dst)


@pytest.mark.timeout(75)
def test_netns_faults_named(net):
    """All four faults at once, --json: each named with its figures, and
    nothing else a problem (exit 1)."""
    net.all_up()
    net.faults(True)
    ensure_ref(net)          # iperf3 over the slow pair, before the doctor
    cp = net.doctor("--json")
    ev = doctor_json(cp)
    net.last_json = ev
    assert_only_problems(ev, fault_problems(), "four faults")
    assert cp.returncode == 1
    assert_result(cp, ev, 4)
    c = by_key(ev)
    for n in NODES:
        assert passed(c, "nodes", n), n
    assert_slow_pair(c, ev, net.ref)

    p = c[("port", f"{PORT}@n{FIREWALLED}")]
    assert p["state"] == "dropped" and p["cause"] == "a firewall drops it", p
    assert p["port"] == PORT and p["node"] == f"n{FIREWALLED}", p
    assert sorted(p["from"]) == [n for n in NODES if n != f"n{FIREWALLED}"], p
    assert "firewall" in p["text"] and f"n{FIREWALLED}" in p["text"] and str(PORT) in p["text"], p
    for n in NODES:
        if n != f"n{FIREWALLED}":
            assert passed(c, "port", f"{PORT}@{n}"), n
    m = matrix(ev, f"port {PORT}")
    for a in NODES:
        for b in NODES:
            if a != b:
                assert cell(m, a, b) == ("dropped" if b == f"n{FIREWALLED}" else "open"), f"{a}>{b}: {m}"

    assert_skewed_clock(c)
    assert_odd_fact(c, NODES)
    for e in checks_of(ev):
        if e["check"] == "link" and e["subject"] != SUMMARY:
            assert e["ok"] and e["mbps"] == 10000 and e["mtu"] == 1500, f"a veth is 10000 Mb/s: {e}"
    assert_advised(ev, "four faults")


@pytest.mark.timeout(60)
def test_netns_faults_human(net):
    """The same faults, the human output of a --quick run: a ✗ line for each
    problem the --json run named (same words), each followed by its
    indented advice line "→ ...", the checks that passed ✓."""
    net.all_up()
    net.faults(True)
    ev = getattr(net, "last_json", None)
    if ev is None:           # run alone: the --json run to compare with
        ev = doctor_json(net.doctor("--json"))
    cp = net.doctor("--quick")
    assert cp.returncode == 1, cp.stdout + cp.stderr
    lines, faults = human_checks(cp.stdout)
    bad = [line for mark, line in lines if mark == "✗"]
    for k in sorted(fault_problems()):
        text = masked(problems(ev)[k]["text"])
        assert any(text in masked(line) and k[1] in line for line in bad), \
            f"no ✗ line says {problems(ev)[k]['text']!r} ({k}):\n{cp.stdout}"
    assert any(mark == "✓" for mark, _ in lines), f"no ✓ line:\n{cp.stdout}"
    assert not faults, "\n".join(faults) + "\n\n" + cp.stdout


@pytest.mark.timeout(75)
def test_netns_node_down_rest_checked(net):
    """n3's daemon killed (its firewall stays): n3 is named as down, and the
    other faults are still found among n0..n2: the slow pair, n2's clock,
    n1's fact."""
    net.all_up()
    net.faults(True)
    ensure_ref(net)
    net.nodes[DOWN].kill9()
    cp = net.doctor("--json")
    ev = doctor_json(cp)
    a, b = SLOW
    down = f"n{DOWN}"
    up = [n for n in NODES if n != down]
    want = {("nodes", down), ("bandwidth", f"n{a}>n{b}"), ("bandwidth", f"n{b}>n{a}"),
            ("clock", f"n{SKEWED}"), ("fact", "image")}
    assert_only_problems(ev, want, f"{down} down")
    assert cp.returncode == 1
    assert_result(cp, ev, 4)
    c = by_key(ev)
    e = c[("nodes", down)]
    assert e["state"] == "down" and isinstance(e.get("why"), str) and e["why"], e
    assert down in e["text"] or down in e["why"], e
    for n in up:
        assert c.get(("nodes", n), {"ok": True})["ok"], c[("nodes", n)]
    assert_slow_pair(c, ev, net.ref, nodes=up)
    assert_skewed_clock(c, nodes=up)
    assert_odd_fact(c, up)
    for n in up:
        assert passed(c, "port", f"{PORT}@{n}"), n
    assert c[("bandwidth", SUMMARY)].get("directions") == 6, c[("bandwidth", SUMMARY)]
    m = matrix(ev, "bandwidth")
    assert all(cell(m, down, n) == "" and cell(m, n, down) == "" for n in up), m
    assert_advised(ev, f"{down} down")


# ---------------------------------------------------------------- loopback

@pytest.fixture
def loop4(make_cluster):
    """Four daemons on 127.0.0.1 with the default facts. They share the
    host's ports, so the job's port is a free one (not 29500, which
    something else on the machine may hold) and no ephemeral sample."""
    return make_cluster(4, transfer={"watch": "off"},
                        doctor={**DOCTOR, "ports": free_port(), "port_range": "none"})


@pytest.mark.timeout(60)
def test_loopback_healthy_quick(loop4):
    """Four healthy daemons on loopback, --quick: exit 0, every check line
    ✓ and no advice line (the host's unsynchronized clock aside); --json:
    every check ok, one result; the default facts (kernel, gpu, rdma)
    agree."""
    n0 = loop4[0]
    cp = n0.run("doctor", "--quick", timeout=60)
    want_code = expected_code(set())
    assert cp.returncode == want_code, f"exit {cp.returncode}\n{cp.stdout}{cp.stderr}"
    lines, faults = human_checks(cp.stdout)
    bad = [line for mark, line in lines if mark == "✗"]
    if HOST_SYNCED:
        assert not bad, cp.stdout
    else:
        assert all(re.match(r"^✗ clock\s+n\d\s+not synchroni[sz]ed", line.lstrip()) for line in bad), \
            f"✗ lines other than the unsynchronized clock:\n{cp.stdout}"
    assert not faults, "\n".join(faults) + "\n\n" + cp.stdout
    cp = n0.run("doctor", "--quick", "--json", timeout=60)
    ev = doctor_json(cp)
    assert_only_problems(ev, set(), "healthy loopback cluster")
    assert cp.returncode == want_code
    assert_result(cp, ev, 4)
    c = by_key(ev)
    for n in NODES:
        assert passed(c, "nodes", n)
    for f in ("kernel", "gpu", "rdma"):
        assert passed(c, "fact", f), f
        assert f in c[("fact", SUMMARY)]["text"], c[("fact", SUMMARY)]
    assert matrix(ev, "bandwidth")["nodes"] == NODES
    assert_advised(ev, "healthy loopback")


@pytest.mark.timeout(60)
def test_loopback_asked_two_at_a_time(make_cluster):
    """[cluster] fanout = 2: n0 asks the three others on two threads, each
    taking the next node when done; every node is still checked, and the
    same problems (none but the host's clock) are found."""
    nodes = make_cluster(4, transfer={"watch": "off"}, cluster_keys={"fanout": 2},
                         doctor={**DOCTOR, "ports": free_port(), "port_range": "none"})
    cp = nodes[0].run("doctor", "--quick", "--json", timeout=60)
    ev = doctor_json(cp)
    assert_only_problems(ev, set(), "healthy loopback cluster, fanout 2")
    assert cp.returncode == expected_code(set())
    c = by_key(ev)
    for n in NODES:
        assert passed(c, "nodes", n)
        assert passed(c, "port", f"{nodes[0].doctor['ports']}@{n}"), n
    assert matrix(ev, "bandwidth")["nodes"] == NODES


@pytest.mark.timeout(60)
def test_loopback_healthy_exit_0_with_a_synchronised_clock(loop4, synced_clock):
    """The healthy cluster as the issue says it: with the kernel clock marked
    synchronised (as an NTP daemon marks it), exit 0 and every line ✓."""
    cp = loop4[0].run("doctor", "--quick", timeout=60)
    assert cp.returncode == 0, f"exit {cp.returncode}\n{cp.stdout}{cp.stderr}"
    lines, faults = human_checks(cp.stdout)
    assert lines and all(mark == "✓" for mark, _ in lines), cp.stdout
    assert not faults, cp.stdout
    assert "→" not in cp.stdout, cp.stdout


@pytest.mark.timeout(60)
def test_loopback_unsynchronised_clock_named(loop4, clock_unsynced):
    """The machine's own unsynchronised kernel clock (no NTP daemon) is a
    problem on every node, with synced false and advice."""
    cp = loop4[0].run("doctor", "--quick", "--json", timeout=60)
    ev = doctor_json(cp)
    assert cp.returncode == 1
    bad = problems(ev)
    for n in NODES:
        assert bad[("clock", n)]["synced"] is False, bad
        assert "timedatectl" in bad[("clock", n)]["advice"]
    assert_advised(ev, "unsynchronised clock")


@pytest.mark.timeout(60)
def test_loopback_fact_values(make_cluster, tmp_path):
    """A fact's value as the contract says — trimmed, lines joined with
    "; ", "(not installed)", "(none)", "(exit 1)" — and one differing on
    n3 named with n3's value and the others'."""
    for i in range(4):
        (tmp_path / f"f{i}").write_text("  alpha \n\n beta\n" if i < 3 else "alpha\ngamma\n")
    (tmp_path / "dir").mkdir()
    for name in ("b", "a"):
        (tmp_path / "dir" / name).write_text("")
    facts = {i: {"facts": f"lines: file {tmp_path / f'f{i}'} | names: dir {tmp_path / 'dir'} | "
                          f"gone: dir {tmp_path / 'no-such-dir'} | "
                          + ("tool: run false" if i < 3 else "tool: run stage-no-such-program")}
             for i in range(4)}
    nodes = make_cluster(4, transfer={"watch": "off"}, node_doctor=facts,
                         doctor={**DOCTOR, "ports": free_port(), "port_range": "none"})
    cp = nodes[0].run("doctor", "--quick", "--json", timeout=60)
    ev = doctor_json(cp)
    assert_only_problems(ev, {("fact", "lines"), ("fact", "tool")}, "two facts differ on n3")
    c = by_key(ev)
    e = c[("fact", "lines")]
    assert e["values"] == {"n0": "alpha; beta", "n1": "alpha; beta", "n2": "alpha; beta", "n3": "alpha; gamma"}, e
    assert all(s in e["text"] for s in ("n3", "alpha; gamma", "alpha; beta")), e
    e = c[("fact", "tool")]
    assert e["values"] == {"n0": "(exit 1)", "n1": "(exit 1)", "n2": "(exit 1)", "n3": "(not installed)"}, e
    assert all(s in e["text"] for s in ("n3", "(not installed)", "(exit 1)")), e
    assert passed(c, "fact", "names") and passed(c, "fact", "gone")
    assert_advised(ev, "facts")


@pytest.mark.timeout(60)
def test_loopback_node_lists(loop4):
    """--nodes takes hostlist expressions; SLURM_JOB_NODELIST is the default
    and --nodes wins over it."""
    n0 = loop4[0]
    cp = n0.run("doctor", "--quick", "--json", timeout=60, env={"SLURM_JOB_NODELIST": "n[0-1],n3"})
    ev = doctor_json(cp)
    assert matrix(ev, "bandwidth")["nodes"] == ["n0", "n1", "n3"], cp.stdout
    s = by_key(ev)[("nodes", SUMMARY)]
    assert s["ok"] and s.get("nodes") == 3, s
    cp = n0.run("doctor", "--quick", "--json", "--nodes", "n[0,2]", timeout=60,
                env={"SLURM_JOB_NODELIST": "n[0-3]"})
    ev = doctor_json(cp)
    assert matrix(ev, "bandwidth")["nodes"] == ["n0", "n2"], cp.stdout


def test_bad_input(loop4, tmp_path):
    """Usage errors exit 2 with the contract's message and measure nothing:
    an unknown node in --nodes (a name, a hostlist), a port list that does
    not parse or has more than 64 ports; no daemon: exit 3."""
    n0 = loop4[0]
    hosts = n0.cluster["hosts"]
    for nodes, bad in (("n0,n9", "n9"), ("n[0-4]", "n4")):
        cp = n0.run("doctor", "--nodes", nodes, timeout=20)
        assert cp.returncode == 2, f"--nodes {nodes}: exit {cp.returncode}\n{cp.stdout}{cp.stderr}"
        want = f"stage: --nodes: unknown node '{bad}' (not in the hosts file {hosts})"
        assert want in cp.stderr.splitlines(), f"want {want!r}, stderr:\n{cp.stderr}"
        assert "✓" not in cp.stdout and "✗" not in cp.stdout, cp.stdout
    for ports, bad in (("29500,abc", "abc"), ("0", "0"), ("29500,70000", "70000"), ("29500,", "")):
        cp = n0.run("doctor", "--ports", ports, timeout=20)
        assert cp.returncode == 2, f"--ports {ports}: exit {cp.returncode}\n{cp.stdout}{cp.stderr}"
        if bad:
            want = f"stage: --ports '{ports}': '{bad}' is not a port number (1-65535)"
            assert want in cp.stderr.splitlines(), f"want {want!r}, stderr:\n{cp.stderr}"
        else:
            assert cp.stderr.startswith(f"stage: --ports '{ports}': "), cp.stderr
    cp = n0.run("doctor", "--ports", "1000-1100", timeout=20)           # 101 ports: at most 64
    assert cp.returncode == 2 and cp.stderr.startswith("stage: --ports '1000-1100': "), cp.stderr
    r = subprocess.run([str(STAGE), "--socket", str(tmp_path / "none.sock"), "doctor"], capture_output=True,
                       text=True, timeout=20, env=client_env())
    assert r.returncode == 3, f"no daemon: exit {r.returncode}\n{r.stderr}"


def test_bad_doctor_config(make_daemon):
    """A [doctor] key that does not parse keeps the daemon from starting."""
    for key, value in (("ports", "29500,abc"), ("port_range", "10-x"), ("streams", "17")):
        d = make_daemon(start=False, doctor={key: value})
        out = staged_refuses(d, f"[doctor] {key} = {value}")
        assert key in out, out


@pytest.mark.timeout(75)
def test_doctor_already_running(loop4):
    """A doctor asked from n1 while n0's runs: exit 1, "a doctor is already
    running on n1 (asked by n0); try again when it ends". n0's run is not
    disturbed, and once it ends a doctor from n1 runs (the session was
    released on every node)."""
    n0, n1 = loop4[0], loop4[1]
    first = n0.popen("doctor")
    try:
        time.sleep(0.3)
        assert first.poll() is None, "the first doctor ended too soon to be raced"
        cp = n1.run("doctor", "--quick", timeout=60)
        still = first.poll() is None
        assert cp.returncode == 1, f"second doctor: exit {cp.returncode}\n{cp.stdout}{cp.stderr}"
        msg = re.search(r"a doctor is already running on (n\d) \(asked by n0\); try again when it ends",
                        cp.stdout + cp.stderr)
        assert msg, f"second doctor:\n{cp.stdout}{cp.stderr}"
        print(f"\nrefused: {msg.group(0)}")
        assert still, "the first doctor ended while the second was refused: inconclusive"
        first.wait(60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    out = first.out_path.read_text()
    assert first.returncode == expected_code(set()), f"first doctor: exit {first.returncode}\n{out}" \
                                                     f"{first.err_path.read_text()}"
    lines, faults = human_checks(out)
    assert not faults, "\n".join(faults) + "\n\n" + out
    cp = n1.run("doctor", "--quick", "--json", timeout=60)
    ev = doctor_json(cp)
    assert cp.returncode == expected_code(set()), cp.stdout + cp.stderr
    assert_only_problems(ev, set(), "a doctor after the first ended")


@pytest.mark.timeout(60)
def test_client_gone_ends_the_doctor(make_cluster):
    """A doctor whose client is killed mid-run stops at the next round (its
    bandwidth tests go no further) and releases every node, so a doctor from
    another node runs at once rather than 30 s later; its daemon keeps
    serving."""
    nodes = make_cluster(4, transfer={"watch": "off"},
                         doctor={**DOCTOR, "duration_ms": 3000, "ports": free_port(),
                                 "port_range": "none"})
    n0, n1 = nodes[0], nodes[1]
    first = n0.popen("doctor")
    wait_for(lambda: "doctor" in n0.status().stdout, 10, "the first doctor to start", 0.05)
    time.sleep(1.0)
    first.kill()
    first.wait()
    t0 = time.monotonic()

    def second_runs():
        cp = n1.run("doctor", "--quick", "--json", timeout=60)
        return "already running" not in cp.stdout + cp.stderr and cp

    cp = wait_for(second_runs, 20, "a second doctor to be let in after the first client died", 0.2)
    took = time.monotonic() - t0
    assert took < 15, f"the first doctor's session outlived its client by {took:.1f} s"
    ev = doctor_json(cp)
    assert matrix(ev, "bandwidth")["nodes"] == NODES
    n0.assert_serving()


@pytest.mark.timeout(60)
def test_single_node_checks_what_one_node_can(make_daemon):
    """A daemon without a hosts file: stage doctor checks what one node can
    (its clock, facts, a port, its disks and source root), measures no pair,
    and --nodes naming another node is a usage error."""
    d = make_daemon(doctor={**DOCTOR, "ports": free_port(), "port_range": "none"})
    (d.src_root / "data.bin").write_bytes(os.urandom(4 << 20))
    cp = d.run("doctor", "--quick", "--json", timeout=60)
    ev = doctor_json(cp)
    assert cp.returncode == expected_code(set()), cp.stdout + cp.stderr
    assert_only_problems(ev, set(), "one node")
    c = by_key(ev)
    assert c[("nodes", SUMMARY)]["answered"] == [d.name], c[("nodes", SUMMARY)]
    assert ("fact", SUMMARY) in c and ("port", SUMMARY) in c
    st = c[("storage", f"{d.name}:stage_root")]
    assert st["write_mbps"] > 0 and st["read_mbps"] > 0, st
    src = c[("source", f"{d.name}:{d.src_root}")]
    assert src["read_mbps"] > 0 and src["files_per_s"] > 0, src
    assert not [e for e in ev if e["event"] == "matrix"], "a matrix with one node"
    assert not [e for e in checks_of(ev) if e["check"] == "bandwidth"]
    cp = d.run("doctor", "--nodes", "elsewhere", timeout=30)
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert "--nodes" in cp.stderr and "no hosts file" in cp.stderr, cp.stderr
    d.assert_serving()
