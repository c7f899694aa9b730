"""`stage metrics` and the textfile collector, against real daemons: the
counters move with what the daemons did (a pull's bytes, a verify's
findings, a commit and its replica on both ends, a partner that went down
and its lag), the text is well-formed Prometheus exposition, and Debian's
prometheus-node-exporter serves it from the file staged keeps rewriting.
Config mistakes about the file are refused at start-up by key; a directory
that cannot be written is a warning, and the daemon keeps serving.
"""
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import free_port
from helpers import F, ckpt, commit_wait, make_tree, staged_refuses, wait_for, after_kill9

NODE_EXPORTER = shutil.which("prometheus-node-exporter")
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def parse(text):
    """The exposition text as {(name, ((label, value), ...)): float}, checked
    as Prometheus reads it: HELP and TYPE before a family's samples, one
    TYPE per family, counters named *_total, no series twice, every line
    whole."""
    assert text.endswith("\n"), "the text does not end with a newline (cut short?)"
    types, out = {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            assert name not in types, f"TYPE of {name} twice"
            assert typ in ("counter", "gauge"), line
            assert typ != "counter" or name.endswith("_total"), f"counter {name} is not *_total"
            types[name] = typ
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels = m.group(1), ()
        assert name in types, f"{name}: a sample before its TYPE"
        if m.group(3):
            pairs = LABEL.findall(m.group(3))
            assert ",".join(f'{k}="{v}"' for k, v, _ in pairs) == m.group(3), f"labels of {line!r}"
            labels = tuple(sorted((k, v) for k, v, _ in pairs))
        key = (name, labels)
        assert key not in out, f"series {key} twice"
        out[key] = float(m.group(4))
    return out


def get(series, name, **labels):
    return series.get((name, tuple(sorted(labels.items()))))


def metrics(d):
    cp = d.run("metrics")
    assert cp.returncode == 0, f"stage metrics exited {cp.returncode}: {cp.stderr}"
    return parse(cp.stdout)


def tree_bytes(root):
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file() and ".stage" not in p.parts)


# ---------------------------------------------------------------- stage metrics

def test_counters_follow_a_pull_and_a_verify(daemon):
    m = metrics(daemon)
    info = [(dict(l), v) for (n, l), v in m.items() if n == "stage_info"]
    assert len(info) == 1 and info[0][0]["node"] == daemon.name and info[0][1] == 1, info
    assert get(m, "stage_pull_bytes_total") == 0
    assert get(m, "stage_requests_total", kind="pull", result="ok") == 0
    assert get(m, "stage_threads") >= 1 and get(m, "stage_resident_memory_bytes") > 1 << 20
    assert abs(get(m, "stage_start_time_seconds") - time.time()) < 120

    src = make_tree(daemon.src_root / "ds", [F("a.bin", size=300_000), F("sub/b.bin", size=4_321),
                                             F("c", data=b"x\n")])
    cp = daemon.pull(src)
    assert cp.returncode == 0, cp.stderr
    dest = Path(cp.stdout.strip().splitlines()[-1])
    m = metrics(daemon)
    assert get(m, "stage_pull_bytes_total") == tree_bytes(src) == 304_323
    assert get(m, "stage_pull_files_total") == 3
    assert get(m, "stage_requests_total", kind="pull", result="ok") == 1
    assert get(m, "stage_request_last_duration_seconds", kind="pull") > 0

    # A second pull of the same tree copies nothing: the bytes stay.
    assert daemon.pull(src).returncode == 0
    m = metrics(daemon)
    assert get(m, "stage_pull_bytes_total") == 304_323
    assert get(m, "stage_requests_total", kind="pull", result="ok") == 2

    # One file flipped, one removed: two findings of their kinds, a failed verify.
    b = dest / "sub" / "b.bin"
    data = bytearray(b.read_bytes())
    data[100] ^= 1
    st = b.stat()
    b.write_bytes(bytes(data))
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))
    (dest / "c").unlink()
    cp = daemon.run("verify", dest, "--deep")
    assert cp.returncode == 1, cp.stdout + cp.stderr
    # Each finding's line carries its cause, not only its kind and path.
    assert re.search(r"^damaged sub/b\.bin: content digest differs$", cp.stdout, re.M), cp.stdout
    assert re.search(r"^missing c$", cp.stdout, re.M), cp.stdout
    m = metrics(daemon)
    assert get(m, "stage_verify_findings_total", kind="damaged") == 1
    assert get(m, "stage_verify_findings_total", kind="missing") == 1
    assert get(m, "stage_verify_findings_total", kind="changed") == 0
    assert get(m, "stage_requests_total", kind="verify", result="failed") == 1
    # A usage mistake the daemon refuses counts as refused, not failed.
    assert daemon.run("pull", "/").returncode == 2
    assert get(metrics(daemon), "stage_requests_total", kind="pull", result="refused") == 1


def test_json_carries_the_same_text(daemon):
    cp = daemon.run("metrics", json=True)
    assert cp.returncode == 0, cp.stderr
    events = [json.loads(l) for l in cp.stdout.splitlines()]
    assert events[-1]["event"] == "result" and events[-1]["code"] == 0
    text = "".join(e["text"] for e in events if e["event"] == "metrics")
    assert get(parse(text), "stage_pull_bytes_total") == 0


# ---------------------------------------------------------------- replication

def test_replication_both_ends_and_a_partner_down(make_cluster):
    n0, n1 = make_cluster(2, transfer={"watch": "off"})
    step = make_tree(ckpt(n0), [F("model.pt", size=700_000), F("optim.pt", size=90_000)])
    size = tree_bytes(step)
    commit_wait(n0, step)

    m0, m1 = metrics(n0), metrics(n1)
    assert get(m0, "stage_commits_total") == 1
    assert get(m0, "stage_commit_bytes_total") == size
    assert get(m0, "stage_commit_last_duration_seconds") > 0
    assert get(m0, "stage_replication_last_duration_seconds") > 0
    assert get(m0, "stage_replication_confirmed_total", peer="n1") == 1
    assert get(m0, "stage_replicated_bytes_total", peer="n1") == size
    assert 0 < get(m0, "stage_replicated_wire_bytes_total", peer="n1")
    assert get(m0, "stage_partner_state", peer="n1", state="up") == 1
    assert get(m0, "stage_partner_state", peer="n1", state="down") == 0
    assert get(m0, "stage_replication_lag_copies", peer="n1") == 0
    assert get(m0, "stage_replication_lag_seconds", peer="n1") == 0
    assert get(m0, "stage_replication_failed_copies", peer="n1") == 0
    assert get(m0, "stage_requests_total", kind="commit", result="ok") == 1
    assert get(m1, "stage_replicas_received_total") == 1
    assert get(m1, "stage_replica_received_bytes_total") == size
    assert get(m1, "stage_replicas_failed_total") == 0

    # The partner dies: the next step waits, and the metrics say how much,
    # how long, and why.
    n1.kill9()
    step2 = make_tree(ckpt(n0, step="step-200"), [F("model.pt", size=500_000)], seed=2)
    assert n0.run("commit", step2).returncode == 0

    def down():
        m = metrics(n0)
        return get(m, "stage_partner_state", peer="n1", state="down") == 1 and \
            get(m, "stage_replication_failures_total", peer="n1", cause="connect") >= 1 and m
    m0 = wait_for(down, 30, "n0's metrics to show n1 down")
    assert get(m0, "stage_replication_lag_copies", peer="n1") == 1
    assert get(m0, "stage_replication_lag_bytes", peer="n1") == 500_000
    t0 = get(m0, "stage_replication_lag_seconds", peer="n1")
    assert t0 > 0
    time.sleep(1.1)
    assert get(metrics(n0), "stage_replication_lag_seconds", peer="n1") >= t0 + 1

    after_kill9()
    n1.start()
    wait_for(lambda: get(metrics(n0), "stage_replication_confirmed_total", peer="n1") == 2, 60,
             "the second step confirmed once n1 is back")
    m0 = metrics(n0)
    assert get(m0, "stage_replication_lag_copies", peer="n1") == 0
    assert get(m0, "stage_replication_lag_seconds", peer="n1") == 0
    assert get(m0, "stage_partner_state", peer="n1", state="up") == 1
    # n1's counters started again from 0 with its new process.
    assert get(metrics(n1), "stage_replicas_received_total") == 1

    # A shard lost and restored: the restore's figures, and none of the
    # checks it makes itself counted as verify findings (only the verifies
    # a client asks for are).
    (step / "optim.pt").unlink()
    cp = n0.run("restore", step)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    m0 = metrics(n0)
    assert get(m0, "stage_restore_files_total") == 1
    assert get(m0, "stage_restore_bytes_total") == 90_000
    assert get(m0, "stage_requests_total", kind="restore", result="ok") == 1
    assert sum(v for (n, _), v in m0.items() if n == "stage_verify_findings_total") == 0
    # Committed again unchanged: one more commit, however the hashing went.
    commit_wait(n0, step)
    assert get(metrics(n0), "stage_commits_total") == 3


# ---------------------------------------------------------------- the textfile

@pytest.fixture
def node_exporter(tmp_path):
    """prometheus-node-exporter with only its textfile collector, reading
    tmp_path/textfile; yields (directory, scrape())."""
    if not NODE_EXPORTER:
        pytest.skip("prometheus-node-exporter is not installed (tools/install-deps installs it)")
    tdir = tmp_path / "textfile"
    tdir.mkdir()
    port = free_port()
    log = open(tmp_path / "node_exporter.log", "wb")
    p = subprocess.Popen([NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile",
                          f"--collector.textfile.directory={tdir}",
                          f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log)

    def scrape():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()

    def up():
        try:
            return scrape()
        except OSError:
            assert p.poll() is None, (tmp_path / "node_exporter.log").read_text()
            return None
    wait_for(up, 20, "node_exporter to answer", interval=0.1)
    yield tdir, scrape
    p.terminate()
    p.wait(10)
    log.close()


def stage_series(text):
    """The stage_* samples of a node_exporter scrape, parsed like ours (its
    own families are left out: they are node_exporter's business)."""
    keep, fam = [], None
    for line in text.splitlines():
        if line.startswith("# "):
            fam = line.split(" ")[2]
        if (fam or "").startswith("stage_"):
            keep.append(line)
    return parse("\n".join(keep) + "\n") if keep else {}


def test_node_exporter_serves_the_textfile(make_daemon, node_exporter):
    tdir, scrape = node_exporter
    prom = tdir / "stage.prom"
    d = make_daemon(metrics={"textfile": prom, "interval": 1})
    version = re.search(r'version="([^"]+)"', d.run("metrics").stdout).group(1)
    wait_for(lambda: get(stage_series(scrape()), "stage_info", node=d.name, version=version) == 1,
             20, "node_exporter to serve stage_info")
    text = scrape()
    assert "node_textfile_scrape_error 0" in text
    assert re.search(r'^node_textfile_mtime_seconds\{file="%s"\}' % re.escape(str(prom)), text, re.M)

    src = make_tree(d.src_root / "ds", [F("a.bin", size=123_456), F("b.bin", size=1)])
    assert d.pull(src).returncode == 0
    # What node_exporter serves comes to be what `stage metrics` says (the
    # counters that do not move by themselves; the file is up to a second
    # behind).
    ours = metrics(d)
    assert get(ours, "stage_pull_bytes_total") == 123_457
    keys = [k for k in ours if k[0] in ("stage_pull_bytes_total", "stage_pull_files_total",
                                        "stage_requests_total", "stage_info")]

    def same():
        theirs = stage_series(scrape())
        return all(theirs.get(k) == ours[k] for k in keys)
    wait_for(same, 20, "node_exporter to serve what stage metrics says", interval=0.2)

    # Every read of the file, however it falls against a rewrite, is one
    # whole text: the rename replaces it at once.
    deadline = time.monotonic() + 2.5
    reads = 0
    while time.monotonic() < deadline:
        parse(prom.read_text())
        reads += 1
    assert reads > 50

    # Stopped, the daemon takes its file away: no stale figures pass for
    # live ones, and no temporary is left behind.
    assert d.stop() == 0
    assert list(tdir.iterdir()) == []
    wait_for(lambda: not stage_series(scrape()), 10, "node_exporter to stop serving stage_*")


def test_textfile_mistakes_refused_by_key(make_daemon, tmp_path):
    d = make_daemon(start=False)
    for value, why in [("stage.prom", "absolute"), (tmp_path / "stage.txt", ".prom"),
                       (tmp_path / ".prom", ".prom")]:
        d.metrics = {"textfile": value}
        d.write_config()
        out = staged_refuses(d, f"textfile = {value}")
        assert "textfile" in out and why in out, out
    d.metrics = {"textfile": tmp_path / "x.prom", "interval": 0}
    d.write_config()
    out = staged_refuses(d, "interval = 0")
    assert "interval" in out, out


def test_unwritable_textfile_warns_once_and_recovers(make_daemon, tmp_path):
    tdir = tmp_path / "not-yet"
    d = make_daemon(metrics={"textfile": tdir / "stage.prom", "interval": 1})
    wait_for(lambda: "metrics: cannot create" in d.log(), 10, "a warning about the textfile")
    time.sleep(2.5)             # two more rewrites fail the same way: no more lines
    warn = [l for l in d.log().splitlines() if "metrics:" in l and "cannot create" in l]
    assert len(warn) == 1, warn
    assert str(tdir) in warn[0] and "No such file or directory" in warn[0], warn[0]
    # The daemon serves on, `stage metrics` included.
    assert get(metrics(d), "stage_pull_bytes_total") == 0
    d.assert_serving()
    tdir.mkdir()
    wait_for(lambda: "metrics: writing %s again" % (tdir / "stage.prom") in d.log(), 10,
             "the textfile once its directory exists")
    parse((tdir / "stage.prom").read_text())
