"""Load (hardening issue): "8 concurrent pulls and a checkpoint committed every
second for a minute, with the daemon's memory staying within its budget and
every result verified."

One node (n0) does the work, its partner (n1) receives the copies. What is
proven: under that load every pull exits 0 and copies exactly what changed,
every commit returns at once and is confirmed on n1, the daemon answers
`stage status` throughout, every staged tree verifies (--deep) and equals its
source, every replica equals its origin step, and n0's peak RSS stays within a
bound derived from the configuration (RSS_BOUND below).
"""
import os
import random
import re
import threading
import time

import pytest

from helpers import (F, MTIME_BASE, assert_replica_of, assert_tree_equal, check_manifest_against, ckpt,
                     json_result, ls_entries, make_tree, replica, same_content)

MiB = 1 << 20
PULLS = 8                 # concurrent pulls, one dataset each
LOAD_SECS = 60
FILES = 300               # per dataset: 5 of 8-16 MiB, the rest 0-96 KiB
BIG = 5
SHARDS, SHARD = 4, 4 * MiB  # one checkpoint step

# The bound, from docs/ARCHITECTURE.md "Memory": every job that runs a copier
# holds at most `[transfer] memory` of I/O buffers (live plus cached, bufpool.c;
# one buffer over when a lone buffer exceeds it, which io_size <= memory rules
# out). Such jobs here: the 8 pulls and n0's committer (ckpt.c hashes each step
# through a copier with the same budget). Replication: the sender to n1 holds
# 4 MiB of read-ahead plus one encoded piece (~1 MiB, REPL_PIECE); a receiver
# 4 MiB of write buffers (n0 receives nothing, counted anyway). Files in
# flight, the retire window and the walk are kilobytes to a few MiB at 300
# files a tree. BASE covers the rest: binary and libraries, touched thread
# stacks, io_uring rings, zstd contexts, malloc bookkeeping.
MEMORY = 32 * MiB
COPIER_JOBS = PULLS + 1
REPL = 4 * MiB + 1 * MiB + 4 * MiB
BASE = 64 * MiB
RSS_BOUND = MEMORY * COPIER_JOBS + REPL + BASE


def dataset_entries(k):
    rng = random.Random(7000 + k)
    e = [F(f"big/b{i}.bin", size=rng.randint(8 * MiB, 16 * MiB)) for i in range(BIG)]
    e += [F(f"d{i % 10}/s{i:03}.bin", size=rng.randint(0, 96 * 1024)) for i in range(FILES - BIG)]
    return e


def touch_up(src, entries, k, rnd):
    """Changes two small files and one big one in place (same size, new bytes:
    the small ones whole, 4 KiB of the big one; a new mtime): the next pull
    must copy exactly these three."""
    rng = random.Random(k * 1_000_003 + rnd)
    rels = rng.sample([e.path for e in entries[BIG:]], 2) + [entries[rng.randrange(BIG)].path]
    for i, rel in enumerate(rels):
        p = src / rel
        size = p.stat().st_size
        with open(p, "r+b") as f:
            off = rng.randrange(max(1, size - 4096)) if i == 2 else 0
            f.seek(off)
            f.write(rng.randbytes(min(size, 4096) if i == 2 else size))
        t = MTIME_BASE + (rnd + 1) * 10**12 + k * 10**6 + i
        os.utime(p, ns=(t, t))
    return rels


def proc_status(pid):
    """{field: kB} of the VmXXX/Rss lines of /proc/PID/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            m = re.match(r"^(Vm\w+|Rss\w+|Threads):\s+(\d+)", line)
            if m:
                out[m.group(1)] = int(m.group(2))
    return out


def sanitized(pid):
    """The daemon runs under a sanitizer (CI's ASan build): shadow memory and
    quarantine make its RSS say nothing about the budget."""
    with open(f"/proc/{pid}/maps") as f:
        return re.search(r"lib[at]san\.so", f.read()) is not None


def memory_report(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            rollup = f.read()
    except OSError as ex:
        rollup = str(ex)
    return f"/proc/{pid}/status: {proc_status(pid)}\nsmaps_rollup:\n{rollup}"


class Sampler(threading.Thread):
    """VmRSS of a process every 0.5 s, as (seconds, kB)."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.samples, self.stop = pid, [], threading.Event()

    def run(self):
        t0 = time.monotonic()
        while not self.stop.is_set():
            try:
                self.samples.append((time.monotonic() - t0, proc_status(self.pid)["VmRSS"]))
            except (OSError, KeyError):
                pass
            self.stop.wait(0.5)


@pytest.mark.timeout(400)
def test_load(make_cluster):
    """8 pulls kept going (a thread each: pull, check, change 3 source files,
    pull again) and a step committed every second for 60 s on n0; then every
    result is verified and the peak RSS checked against RSS_BOUND = memory x
    (8 pulls + committer) + 9 MiB of replication buffers + 64 MiB base
    (= 361 MiB at memory = 32 MiB)."""
    n0, n1 = make_cluster(2, keep=1000, transfer={"watch": "off", "memory": f"{MEMORY // MiB}MiB"})
    pid = n0.proc.pid
    srcs, dests, entries = [], [], []
    for k in range(PULLS):
        entries.append(dataset_entries(k))
        srcs.append(make_tree(n0.src_root / f"ds{k}", entries[k], seed=100 + k))
        dests.append(n0.dest_of(srcs[k]))

    rounds = [0] * PULLS          # pulls completed per dataset
    pull_secs = []
    last_root = [None] * PULLS    # root digest of each dataset's latest pull
    errors = []
    stop = threading.Event()

    def puller(k):
        """Pulls dataset k until the minute is over. Each pull exits 0 and
        copies exactly the files changed since the last one (all of them the
        first time), which then hold the source's bytes."""
        changed = None
        try:
            while True:
                t = time.monotonic()
                cp = n0.pull(srcs[k], json=True, timeout=180)
                pull_secs.append(time.monotonic() - t)
                assert cp.returncode == 0, (f"pull of ds{k} (round {rounds[k]}) exited {cp.returncode}: "
                                            f"{cp.stderr}\nlog:\n{n0.log()[-3000:]}")
                res, _ = json_result(cp.stdout)
                want = FILES if changed is None else len(changed)
                assert res["code"] == 0 and res["files_copied"] == want, \
                    f"ds{k} round {rounds[k]}: {res}, want {want} copied"
                for rel in changed or []:
                    assert same_content(srcs[k] / rel, dests[k] / rel), f"ds{k}/{rel}: not the new bytes"
                last_root[k] = res["root"].lower()
                rounds[k] += 1
                # The last thing done is a pull: a change after it would
                # leave the staged tree behind its source at the end.
                if stop.is_set():
                    break
                changed = touch_up(srcs[k], entries[k], k, rounds[k])
        except BaseException as ex:          # reported by the main thread
            errors.append(ex)

    sampler = Sampler(pid)
    sampler.start()
    threads = [threading.Thread(target=puller, args=(k,), daemon=True) for k in range(PULLS)]
    steps, commit_secs, status_secs, jobs_seen = [], [], [], []
    t_start = time.monotonic()
    try:
        for t in threads:
            t.start()
        next_commit, next_status = t_start, t_start + 2.5
        while time.monotonic() - t_start < LOAD_SECS and not errors:
            now = time.monotonic()
            if now >= next_commit:
                name = f"step-{len(steps) + 1}"
                step = make_tree(ckpt(n0, "job1", name),
                                 [F(f"shard-{i}.bin", size=SHARD) for i in range(SHARDS)],
                                 seed=len(steps) + 1)
                t = time.monotonic()
                cp = n0.run("commit", step, timeout=30)
                commit_secs.append(time.monotonic() - t)
                assert cp.returncode == 0, f"commit {name}: {cp.returncode} {cp.stderr}\n{n0.log()[-3000:]}"
                steps.append(name)
                next_commit = max(next_commit + 1, now)
            if now >= next_status:
                t = time.monotonic()
                st = n0.status(timeout=20)
                status_secs.append(time.monotonic() - t)
                assert st.returncode == 0, f"stage status under load: {st.returncode} {st.stderr}"
                jobs_seen.append(len(re.findall(r"^\s*job:\s*pull ", st.stdout, re.M)))
                next_status += 5
            time.sleep(0.02)
        load_secs = time.monotonic() - t_start
        stop.set()
        for t in threads:                     # the pulls in flight finish
            t.join(120)
            assert not t.is_alive(), f"a pull still running 120 s after the load\n{n0.log()[-3000:]}"
        if errors:
            raise errors[0]

        # Every commit confirmed on n1, as n0's `stage ls` says.
        deadline, missing = time.monotonic() + 120, steps
        while missing:
            ls = {n: f for n, f in ls_entries(n0) if f.get("origin") == "n0"}
            missing = [s for s in steps if ls.get(f"job1/{s}", {}).get("copies") != "n1:confirmed"
                       or ls[f"job1/{s}"].get("state") != "committed"]
            assert not missing or time.monotonic() < deadline, \
                f"{len(missing)} of {len(steps)} steps not confirmed after 120 s: {missing[:5]}...\n" \
                f"{[ls.get('job1/' + s) for s in missing[:3]]}\nlog:\n{n0.log()[-3000:]}"
            time.sleep(0.5 if missing else 0)
        drain_secs = time.monotonic() - t_start - load_secs
    finally:
        stop.set()
        sampler.stop.set()
        sampler.join()
    hwm = proc_status(pid)["VmHWM"] * 1024
    peak_rss = max(kb for _, kb in sampler.samples) * 1024
    per10 = [max([kb for t, kb in sampler.samples if i <= t < i + 10] or [0]) // 1024
             for i in range(0, LOAD_SECS, 10)]
    print(f"\nload: {load_secs:.1f} s, then {drain_secs:.1f} s to finish the pulls and confirm every "
          f"copy; pulls completed {sum(rounds)} (per dataset {rounds}), took {min(pull_secs):.2f}-"
          f"{max(pull_secs):.2f} s; commits {len(steps)} made and confirmed, each returned within "
          f"{max(commit_secs):.3f} s; status answered {len(status_secs)}x within {max(status_secs):.3f} s, "
          f"pulls in flight {jobs_seen}; peak VmRSS {peak_rss / MiB:.1f} MiB ({len(sampler.samples)} "
          f"samples; max per 10 s {per10} MiB, idle after {proc_status(pid)['VmRSS'] // 1024} MiB), "
          f"VmHWM {hwm / MiB:.1f} MiB, bound {RSS_BOUND / MiB:.0f} MiB")
    noisy = [ln for d in (n0, n1) for ln in d.log().splitlines() if re.search(r"\] (warn|error): ", ln)]
    print(f"load: {len(noisy)} warn/error lines in the daemons' logs" + "".join(f"\n  {ln}" for ln in noisy[:10]))

    assert len(status_secs) >= 10 and max(status_secs) < 5, f"stage status under load: {status_secs}"
    # Concurrency was real: at a status sample, on average at least half the
    # pulls were in flight (a sample may fall between one pull and the next).
    assert sum(jobs_seen) >= len(jobs_seen) * PULLS / 2, f"pulls in flight at each status: {jobs_seen}"
    if sanitized(pid):
        print("load: staged runs under a sanitizer: its RSS is not checked against the bound")
    else:
        assert hwm <= RSS_BOUND, (
            f"staged's peak RSS (VmHWM) {hwm / MiB:.1f} MiB exceeds the bound {RSS_BOUND / MiB:.0f} MiB = "
            f"memory {MEMORY // MiB} MiB x {COPIER_JOBS} copier jobs + {REPL // MiB} MiB replication + "
            f"{BASE // MiB} MiB base; sampled peak VmRSS {peak_rss / MiB:.1f} MiB\n{memory_report(pid)}")

    # Every staged tree: verify --deep passes, it equals its source, and its
    # manifest describes the source (a sample of files digested with xxhsum)
    # with the root the last pull reported.
    for k in range(PULLS):
        v = n0.run("verify", dests[k], "--deep", timeout=120)
        assert v.returncode == 0, f"verify --deep ds{k}: {v.stdout}{v.stderr}"
        assert_tree_equal(srcs[k], dests[k])
        m = check_manifest_against(dests[k], srcs[k], digests=3)
        assert m.root == last_root[k], f"ds{k}: the manifest's root is not the last pull's"
    # Every replica on n1 is its origin step, byte for byte, same manifest.
    for name in steps:
        assert_replica_of(ckpt(n0, "job1", name), replica(n1, n0, "job1", name))
    n0.assert_serving()
    n1.assert_serving()
