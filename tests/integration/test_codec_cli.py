"""`stage codec` as a user runs it: no daemon, real files.

Round trips of tensor-like and arbitrary data through every codec, the
self-describing file checked on the way back, damaged input refused with
exit 1 and no output left behind, usage errors with exit 2."""
import math
import os
import random
import struct
import subprocess

import pytest

from helpers import STAGE


def stage(*args, timeout=60):
    return subprocess.run([str(STAGE), *map(str, args)], capture_output=True, timeout=timeout)


def bf16_gaussian(n, sigma=0.02, seed=1):
    rnd = random.Random(seed)
    out = bytearray()
    for _ in range(n):
        f = struct.pack("<f", rnd.gauss(0.0, sigma))
        out += f[2:4]                     # bf16 is the high half of an fp32
    return bytes(out)


def specials_fp32():
    vals = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45, 3.4e38, 1.0, -2.5]
    return b"".join(struct.pack("<f", v) for v in vals) * 1000 + b"\x01\x02\x03"   # odd tail


@pytest.mark.parametrize("codec", [None, "none", "zstd", "float"])
@pytest.mark.parametrize("kind", ["bf16", "fp32-specials", "random", "empty"])
def test_round_trip(tmp_path, codec, kind):
    data = {"bf16": bf16_gaussian(300_000), "fp32-specials": specials_fp32(),
            "random": os.urandom(1_000_003), "empty": b""}[kind]
    src, packed, back = tmp_path / "in", tmp_path / "packed", tmp_path / "out"
    src.write_bytes(data)
    args = ["codec", "compress"] + (["--codec", codec] if codec else []) + [src, packed]
    cp = stage(*args)
    assert cp.returncode == 0, cp.stderr
    cp = stage("codec", "decompress", packed, back)
    assert cp.returncode == 0, cp.stderr
    assert back.read_bytes() == data
    if kind == "bf16" and codec in (None, "float"):
        # Gaussian bf16 is what the float codec is for: it must beat 1.4x.
        assert len(data) / packed.stat().st_size > 1.4, cp.stdout


def test_damage_is_refused_and_leaves_no_output(tmp_path):
    src, packed, back = tmp_path / "in", tmp_path / "packed", tmp_path / "out"
    src.write_bytes(bf16_gaussian(200_000))
    assert stage("codec", "compress", src, packed).returncode == 0
    raw = bytearray(packed.read_bytes())
    for pos in (20, len(raw) // 2, len(raw) - 5):
        bad = bytearray(raw)
        bad[pos] ^= 0x40
        packed.write_bytes(bad)
        cp = stage("codec", "decompress", packed, back)
        assert cp.returncode == 1, f"flip at {pos} accepted"
        assert not back.exists(), "a failed decompress left its output"
        assert str(packed) in cp.stderr.decode()
    packed.write_bytes(raw[: len(raw) // 3])                   # truncated
    assert stage("codec", "decompress", packed, back).returncode == 1
    assert not back.exists()


def test_usage_errors(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x")
    assert stage("codec").returncode == 2
    assert stage("codec", "compress", f).returncode == 2                      # OUT missing
    assert stage("codec", "compress", "--codec", "lz4", f, tmp_path / "o").returncode == 2
    assert stage("codec", "compress", f, f).returncode in (1, 2)              # IN is OUT
    assert f.read_bytes() == b"x", "compressing a file onto itself destroyed it"
    cp = stage("codec", "decompress", tmp_path / "missing", tmp_path / "o")
    assert cp.returncode == 1 and b"missing" in cp.stderr


def test_bench_lists_every_codec(tmp_path):
    f = tmp_path / "w.bin"
    f.write_bytes(bf16_gaussian(200_000))
    cp = stage("codec", "bench", f, timeout=120)
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout.decode()
    for name in ("none", "zstd", "float"):
        assert name in out
