"""tools/bench/benchlib.py: what the cluster benchmarks share (replicate, restore, trainer).

Not a program: tools/bench/replicate, tools/bench/restore and tools/bench/trainer import it
(standard library only, like them). It holds what was tools/bench/replicate's own until the
restore and trainer benchmarks needed the same: the paths of the build, running a command with
a timeout, a daemon of a loopback pair (`Node`: its config, start, stop, log, `stage --json`),
/proc readings (CPU time, peak RSS and its reset, I/O counters), dropping the page cache, the
fio bound (reading some files while writing as many bytes elsewhere, O_DIRECT) and the
machine's facts for a report. Moving it here changed nothing of what replicate does or prints.

Call set_name("NAME") first: log lines then start with "bench/NAME:", and daemon configs
say which benchmark wrote them.
"""
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("STAGE_BUILD", REPO / "build"))
STAGED = BUILD / "bin" / "staged"
STAGE = BUILD / "bin" / "stage"


def shown(path):
    """A path for a report: relative to the repository when it is inside it (a report names no
    path of the machine it ran on)."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


GEN_TREE = REPO / "tools" / "gen-tree"
GEN_TENSORS = REPO / "tools" / "gen-tensors"

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

NAME = "bench"


def set_name(name):
    global NAME
    NAME = name


class BenchError(Exception):
    pass


def log(msg):
    print(f"bench/{NAME}: {msg}", file=sys.stderr, flush=True)


def fmt_s(x):
    return "—" if x is None else f"{x:.3f}"


def fmt_mb(x):
    return "—" if x is None else f"{x / 1e6:,.0f}"


def fmt_cpu(x):
    return "?" if x is None else f"{x:.2f}"


def med(v):
    return statistics.median(v) if v else None


def human(n):
    for unit, m in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


def tail(text, n=2000):
    text = text or ""
    return text if len(text) <= n else "..." + text[-n:]


def run(cmd, timeout, check=True):
    """Runs cmd (a list, or a str for bash -o pipefail -c); returns (stdout, stderr)."""
    argv = ["bash", "-o", "pipefail", "-c", cmd] if isinstance(cmd, str) else [str(c) for c in cmd]
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"timed out after {timeout} s: {cmd}")
    except OSError as e:
        raise BenchError(f"cannot run {argv[0]}: {e}")
    if check and p.returncode != 0:
        raise BenchError(f"exit status {p.returncode}: {cmd if isinstance(cmd, str) else ' '.join(argv)}"
                         f"\n--- stderr ---\n{tail(p.stderr)}\n--- stdout ---\n{tail(p.stdout)}")
    return p.stdout, p.stderr


def rmtree(p):
    if os.path.lexists(p):
        shutil.rmtree(p)


def _pdeathsig():
    # If this script is killed outright, take what it started down with it.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except Exception:
        pass


_handed_out = set()


def free_port():
    """A port free now and not handed out before in this run (the kernel may give the same
    ephemeral port to two binds in a row, and two nodes of a hosts file must differ)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


# ----------------------------------------------------------------- /proc

def cpu_s(pid):
    """utime + stime of a process (all its threads), in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def cpu_split(pid):
    """(utime, stime) of a process (all its threads), in seconds; (None, None) if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tck = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / tck, int(fields[12]) / tck
    except (OSError, IndexError, ValueError):
        return None, None


def status_kb(pid, keys=("VmHWM", "VmRSS")):
    """Fields of /proc/PID/status, in kB ({} if the process is gone)."""
    vals = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in keys:
                    vals[k] = int(v.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return vals


def reset_hwm(pid):
    """Resets VmHWM to the current RSS (writes 5 to /proc/PID/clear_refs, as tools/bench/pull
    does); False if this kernel does not."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    v = status_kb(pid)
    return bool(v) and v["VmHWM"] <= v["VmRSS"] + 1024


def proc_io(pid):
    """(read_bytes, write_bytes) of /proc/PID/io: what the process made the block layer read
    and what it dirtied for writing; (None, None) if unreadable."""
    r = w = None
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k == "read_bytes":
                    r = int(v)
                elif k == "write_bytes":
                    w = int(v)
    except (OSError, ValueError):
        pass
    return r, w


def psi_io(what="io"):
    """/proc/pressure/WHAT's "some" line: (avg10, avg60) in %, or None (no PSI here)."""
    try:
        for line in Path(f"/proc/pressure/{what}").read_text().splitlines():
            if line.startswith("some "):
                kv = dict(x.split("=") for x in line.split()[1:])
                return float(kv["avg10"]), float(kv["avg60"])
    except (OSError, ValueError, KeyError):
        pass
    return None


def busy_text():
    """The load average and I/O pressure now, for a report: how quiet the machine was."""
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    p, c = psi_io(), psi_io("cpu")
    return (f"load average {load}"
            + (f", I/O pressure (PSI some) avg10 {p[0]:.0f} %, avg60 {p[1]:.0f} %" if p else "")
            + (f", CPU pressure avg10 {c[0]:.0f} %, avg60 {c[1]:.0f} %" if c else ""))


def page_reporting():
    """Whether the kernel reports free pages to a hypervisor (virtio-balloon free page
    reporting): then pages freed (drop_caches, deleted files) go back to the host, and the
    next page-cache pages cost the guest a host fault each, which makes buffered writes after
    a cache drop several times more expensive in CPU. A sentence, or "" if not reported."""
    d = Path("/sys/module/page_reporting/parameters")
    try:
        kib = int((d / "reported_kib").read_text())
    except (OSError, ValueError):
        return ""
    return (f"free page reporting to the hypervisor is on ({kib / (1 << 20):,.0f} GiB reported "
            f"since boot): page-cache pages allocated after a cache drop may each cost a fault "
            f"in the host (docs/BENCHMARKS.md, tools/bench/trainer)")


def schedstat(pid="self"):
    """(seconds on a CPU, seconds waiting for one on the run queue) of a process's main
    thread, from /proc/PID/schedstat; (None, None) without schedstats."""
    try:
        f = Path(f"/proc/{pid}/schedstat").read_text().split()
        return int(f[0]) / 1e9, int(f[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None, None


_START_CPUS = os.sched_getaffinity(0)


def parse_cpus(text):
    """A CPU list as taskset -c and /sys write it ("0-3,8,10-11") -> a set of CPU numbers,
    each one this process may run on; ValueError naming the list and the cause."""
    out = set()
    try:
        for part in text.split(","):
            a, _, b = part.strip().partition("-")
            lo, hi = int(a), int(b or a)
            if lo < 0 or hi < lo:
                raise ValueError
            out.update(range(lo, hi + 1))
    except ValueError:
        raise ValueError(f"{text!r} is not a CPU list (like 0-3,8)") from None
    allowed = os.sched_getaffinity(0)
    if not out or not out <= allowed:
        raise ValueError(f"CPU list {text!r}: this machine lets this process run on "
                         f"{cpus_text(allowed)} only")
    return out


def cpus_text(cpus):
    """A set of CPUs written as a list: {0, 1, 2, 5} -> "0-2,5"."""
    v, out = sorted(cpus), []
    for c in v:
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


# ----------------------------------------------------------------- the page cache

def drop_caches_check(smoke):
    """(can drop, why not): whether `echo 3 > /proc/sys/vm/drop_caches` works here. Outside
    smoke mode, not being able to is an error."""
    note = ""
    if os.geteuid() == 0:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
            return True, ""
        except OSError as e:
            note = f"drop_caches not writable here ({e.strerror})"
    else:
        note = "not root"
    if not smoke:
        raise BenchError(f"cold cache needs `echo 3 > /proc/sys/vm/drop_caches`: {note}")
    log(f"{note}: caches are not dropped (smoke mode)")
    return False, note


def cold(can_drop):
    """sync; echo 3 > /proc/sys/vm/drop_caches (the sync only, when it cannot drop)."""
    os.sync()
    if can_drop:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")


# ----------------------------------------------------------------- log lines

LOG_TS = r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z"


def log_ts(stamp):
    """A daemon log line's timestamp (the LOG_TS group) as epoch seconds."""
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=timezone.utc).timestamp()


def log_lines(path, offset=0):
    """[(epoch s, level, text)] of a daemon log from byte offset on."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    out = []
    for m in re.finditer(r"^" + LOG_TS + r" \S+ (\w+): (.*)$", text, re.M):
        out.append((log_ts(m.group(1)), m.group(2), m.group(3)))
    return out


# ----------------------------------------------------------------- the daemons

class Node:
    """One staged of a pair. netns: run it inside that network namespace."""

    def __init__(self, name, work, priv, ckpt_root, host, netns=None):
        self.name, self.work, self.priv = name, work / name, priv
        self.ckpt_root, self.host, self.netns = ckpt_root, host, netns
        self.port = free_port()
        self.conf = self.work / "daemon.conf"
        self.log_path = self.work / "daemon.log"
        self.socket = priv / f"{name}.sock"
        self.replica_root = self.work / "replicas"
        self.exe = priv / "bench-daemon"
        self.stage = priv / "stage"
        self.proc = None
        self.starts = 0
        self.cpus = None        # a set of CPUs to start staged on (sched_setaffinity), or all

    @property
    def addr(self):
        return f"{self.host}:{self.port}"

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def write_config(self, hosts, key, compress, settings=None):
        """The config: replicas = 1, keep = 3, watch = off, compress, rate = 0, the rest at
        the defaults. settings = {section: {key: value}} replaces or adds keys (a key given
        for a section replaces its line there; new keys and sections go last)."""
        w = self.work
        for d in ("state", "src", "stage", "replicas"):
            (w / d).mkdir(parents=True, exist_ok=True)
        conf = {
            "node": {"name": self.name, "socket": self.socket, "listen": self.addr,
                     "state_dir": w / "state", "log_level": "info"},
            "paths": {"source_roots": w / "src", "stage_root": w / "stage",
                      "ckpt_root": self.ckpt_root, "replica_root": self.replica_root},
            "cluster": {"hosts": hosts, "key_file": key, "replicas": 1, "keep": 3},
            "transfer": {"watch": "off", "compress": compress, "rate": 0},
        }
        for sec, kv in (settings or {}).items():
            conf.setdefault(sec, {}).update(kv)
        text = f"# written by tools/bench/{NAME}\n"
        for sec, kv in conf.items():
            text += f"[{sec}]\n" + "".join(f"{k} = {v}\n" for k, v in kv.items())
        self.conf.write_text(text)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self):
        try:
            return tail(self.log_path.read_text(errors="replace"), 3000)
        except OSError:
            return "(no log)"

    def log_size(self):
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def start(self, timeout=15):
        if self.socket.exists():
            self.socket.unlink()
        argv = [str(self.exe), "--config", str(self.conf), "--foreground"]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns] + argv     # execs it: same pid
        with open(self.log_path, "ab" if self.starts else "wb") as f:
            f.write(f"\n=== staged start {self.starts} at {datetime.now().isoformat()} ===\n".encode())
            f.flush()
            # Every CPU this script could use when it began, unless told: the
            # script may have pinned itself since (tools/bench/trainer).
            cpus = self.cpus or _START_CPUS

            def pre():
                _pdeathsig()
                os.sched_setaffinity(0, cpus)       # every thread staged starts inherits it
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f,
                                         stderr=subprocess.STDOUT, cwd=self.work,
                                         start_new_session=True, preexec_fn=pre)
        self.starts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name}: staged exited {self.proc.returncode} while "
                                 f"starting:\n{self.log_tail()}")
            if self.socket.exists():
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    try:
                        s.connect(str(self.socket))
                        return
                    except OSError:
                        pass
            time.sleep(0.02)
        raise BenchError(f"{self.name}: staged did not listen on {self.socket} within "
                         f"{timeout} s:\n{self.log_tail()}")

    def stop(self, timeout=20):
        """SIGTERM, then SIGKILL; returns staged's exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.proc = None
                raise BenchError(f"{self.name}: staged did not exit within {timeout} s of "
                                 f"SIGTERM; killed")
        rc = self.proc.returncode
        self.proc = None
        return rc

    def check_alive(self, what):
        if not self.alive():
            raise BenchError(f"{self.name}: staged died during {what} (exit "
                             f"{self.proc.returncode if self.proc else '?'}):\n{self.log_tail()}")

    def stage_json(self, *args, timeout=60):
        """`stage --json ARGS` against this node: its events, the result checked."""
        out, _ = run([self.stage, "--socket", self.socket, "--json", *args], timeout=timeout)
        events = []
        for line in out.splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
        return events

    def ls(self):
        """n0's `stage --json ls` as {"JOB/STEP": "origin=... state=... copies=..."}."""
        v = {}
        for ev in self.stage_json("ls"):
            if ev.get("event") == "ls":
                v.update({k: str(x) for k, x in ev.items() if k != "event"})
        return v

    def wire(self):
        """(raw bytes, wire bytes, codec, bytes held there) this node has sent its partner
        since it started; held: left out because the partner held them (None: not said)."""
        for ev in self.stage_json("status"):
            if ev.get("event") == "status":
                peer = str(ev.get("peer", ""))
                m = re.search(r"codec (\S+), (\d+) bytes sent as (\d+)", peer)
                if m:
                    h = re.search(r"(\d+) bytes held there", peer)
                    return (int(m.group(2)), int(m.group(3)), m.group(1),
                            int(h.group(1)) if h else None)
                return 0, 0, "-", 0
        raise BenchError(f"{self.name}: `stage --json status` printed no status")

    def print_config(self, section=None):
        """`bench-daemon --config CONF --print-config`, without comments; only [section]'s
        lines if given."""
        out, _ = run([self.exe, "--config", self.conf, "--print-config"], timeout=30)
        lines, cur = [], None
        for line in out.splitlines():
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            if s.startswith("["):
                cur = s.strip("[]")
                continue
            if section is None or cur == section:
                lines.append(s)
        return lines


def make_priv(prefix):
    """A private directory in /tmp (sun_path is 108 bytes) for the sockets, the hosts file, the
    key (64 hex digits, 0600) and copies of staged (named bench-daemon: someone's `pkill staged`
    on a shared machine must not stop these daemons mid-run) and of stage (a rebuild of build/
    while this runs must not mix two versions in one report). Returns (dir, key file)."""
    priv = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    shutil.copy2(STAGED, priv / "bench-daemon")
    shutil.copy2(STAGE, priv / "stage")
    key = priv / "cluster.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, (secrets.token_hex(32) + "\n").encode())
    os.close(fd)
    return priv, key


def timed_stage(node, args, timeout):
    """Runs `stage --socket S --json ARGS` against node, timed from just before its start to
    its exit. Returns {t0, t1, secs, rc, events (each with "_t": when its line was read),
    result (the result event or None), stderr}. rc < 0: killed after timeout s."""
    argv = [str(a) for a in (node.stage, "--socket", node.socket, "--json", *args)]
    events = []
    t0 = time.time()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            now = time.time()
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            ev["_t"] = now
            events.append(ev)
        err = proc.stderr.read()
        proc.wait()
        t1 = time.time()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result = next((e for e in events if e.get("event") == "result"), None)
    return {"t0": t0, "t1": t1, "secs": t1 - t0, "rc": proc.returncode, "events": events,
            "result": result, "stderr": err, "argv": argv}


class Sampler:
    """Samples /proc/PID/io (read_bytes, write_bytes) of some processes every `every` s on a
    thread, from start() to stop(): samples[pid] = [(epoch s, read, written)]."""

    def __init__(self, pids, every=0.01):
        self.pids, self.every = [p for p in pids if p], every
        self.samples = {p: [] for p in self.pids}
        self._stop = threading.Event()
        self._th = None

    def _take(self):
        now = time.time()
        for p in self.pids:
            r, w = proc_io(p)
            if r is not None:
                self.samples[p].append((now, r, w))

    def _loop(self):
        while not self._stop.wait(self.every):
            self._take()

    def start(self):
        self._take()
        self._th = threading.Thread(target=self._loop, daemon=True)
        self._th.start()
        return self

    def stop(self):
        self._stop.set()
        if self._th:
            self._th.join()
        self._take()
        return self

    def delta(self, pid):
        """(bytes read, bytes written) between the first and the last sample."""
        v = self.samples.get(pid) or []
        if len(v) < 2:
            return None, None
        return v[-1][1] - v[0][1], v[-1][2] - v[0][2]

    def first_growth(self, pid, after, what, threshold):
        """When pid's counter (1 read, 2 written) first stood `threshold` bytes above its
        value at time `after`; None if never."""
        base = None
        for t, *c in self.samples.get(pid) or []:
            if t <= after or base is None:
                base = c[what - 1]
            elif c[what - 1] - base >= threshold:
                return t
        return None


def parse_conf(items):
    """--conf KEY=VALUE (into [transfer]) or SECTION.KEY=VALUE, as {section: {key: value}}."""
    out = {}
    for it in items or []:
        k, eq, v = it.partition("=")
        k, v = k.strip(), v.strip()
        if not eq or not k:
            raise BenchError(f"--conf {it!r}: expected KEY=VALUE or SECTION.KEY=VALUE")
        sec, dot, key = k.rpartition(".")
        out.setdefault(sec if dot else "transfer", {})[key] = v
    return out


def conf_text(settings):
    return ", ".join(f"[{s}] {k} = {v}" for s, kv in settings.items() for k, v in kv.items())


# ----------------------------------------------------------------- fio

def fio_read_write(reads, out_dir, total, timeout, can_drop):
    """One fio run with two jobs at once, cold: reading the files `reads` and writing `total`
    bytes of new files in out_dir (as many files as reads), O_DIRECT, 4 MiB blocks, iodepth
    32, io_uring, end_fsync=1. {wall, runtime (the longer job's, without fio's start-up),
    read_gbs, read_s, write_gbs, write_s}. out_dir is made and removed."""
    rmtree(out_dir)
    out_dir.mkdir(parents=True)
    rd_names = ":".join(str(p) for p in reads)
    writes = ":".join(str(out_dir / f"w{i:06d}") for i in range(len(reads)))
    c = ["fio", "--output-format=json", "--ioengine=io_uring", "--direct=1", "--bs=4M",
         "--iodepth=32",
         "--name=read", "--rw=read", f"--filename={rd_names}", f"--size={total}",
         "--name=write", "--rw=write", f"--filename={writes}", f"--size={total}",
         "--end_fsync=1"]
    cold(can_drop)
    t0 = time.perf_counter()
    out, _ = run(c, timeout=timeout)
    secs = time.perf_counter() - t0
    try:
        js = json.loads(out[out.index("{"):])
        jobs = {j["jobname"]: j for j in js["jobs"]}
        rd, wr = jobs["read"], jobs["write"]
        if rd["read"]["io_bytes"] != total or wr["write"]["io_bytes"] != total:
            raise BenchError(f"fio moved {rd['read']['io_bytes']} bytes read and "
                             f"{wr['write']['io_bytes']} written, expected {total} each")
        f = {"wall": secs, "runtime": max(rd["job_runtime"], wr["job_runtime"]) / 1000,
             "read_gbs": rd["read"]["bw_bytes"] / 1e9, "read_s": rd["job_runtime"] / 1000,
             "write_gbs": wr["write"]["bw_bytes"] / 1e9, "write_s": wr["job_runtime"] / 1000}
    except (ValueError, KeyError, TypeError) as e:
        raise BenchError(f"cannot read fio's output ({e!r}):\n{tail(out)}")
    rmtree(out_dir)
    return f


# ----------------------------------------------------------------- the machine

def sh(c):
    try:
        return run(c, timeout=30, check=False)[0].strip()
    except BenchError:
        return "?"


def disk_of(path):
    """(device, its scheduler line) of the file system holding path, e.g. ("vda", "none
    [mq-deadline] kyber bfq"); the scheduler is looked up on the whole disk of a partition."""
    dev = sh(["findmnt", "-n", "-o", "SOURCE", "--target", path])
    name = os.path.basename(dev)
    for cand in (name, sh(["lsblk", "-n", "-d", "-o", "PKNAME", dev]) if dev.startswith("/dev/")
                 else ""):
        try:
            return name, Path(f"/sys/block/{cand}/queue/scheduler").read_text().strip()
        except OSError:
            continue
    return name or "?", "?"


def machine_facts(work, stage_exe, tools=()):
    """What a report says of the machine and the build. tools: names among "iperf3", "fio"
    whose version to take."""
    mem = "?"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
    fstype = sh(["findmnt", "-n", "-o", "FSTYPE", "--target", work])
    dev = sh(["findmnt", "-n", "-o", "SOURCE", "--target", work])
    rev = sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"])
    dirty = sh(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"])
    disk, sched = disk_of(work)
    m = {
        "nproc": str(os.cpu_count()),
        "ram": mem,
        "kernel": os.uname().release,
        "fs": f"{fstype} on {dev}",
        "lsblk": sh(["lsblk", "-d", "-o", "NAME,ROTA,MODEL"]),
        "git": rev + (" + uncommitted changes" if dirty else ""),
        "version": sh([stage_exe, "--version"]),
        "built": datetime.fromtimestamp(STAGED.stat().st_mtime).astimezone().strftime(
            "%Y-%m-%d %H:%M:%S %z"),
        "disk": disk,
        "scheduler": sched,
        "load": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
        "busy": busy_text(),
        "page_reporting": page_reporting(),
    }
    if "iperf3" in tools:
        m["iperf3"] = sh(["iperf3", "--version"]).splitlines()[0] if shutil.which("iperf3") else "?"
    if "fio" in tools:
        m["fio"] = sh(["fio", "--version"])
    return m
