"""python/examples/train.sbatch run as Slurm would run it, on real daemons:
the preflight, the dataset pulled, the newest step found damaged on the
job's node and repaired from its partner, then the launch. There is no
Slurm controller here, so two stand-ins take the scheduler's and the
trainer's place: `srun` runs its command once per node of
SLURM_JOB_NODELIST with that node's daemon, and `torchrun` records its
arguments. scontrol is Debian's own (it expands hostlists without a
controller). Everything stage does in the script is real."""
import os
import stat
import subprocess

from clockstate import synced_clock  # noqa: F401 (fixture)
from conftest import free_port
from helpers import F, REPO, STAGE, ckpt, commit_wait, make_tree

SBATCH = REPO / "python" / "examples" / "train.sbatch"
DOCTOR = {"duration_ms": 500, "storage_size": "16MiB", "port_sample": 2, "rate": "64MiB"}

SRUN = """#!/bin/bash
# srun on one machine: the command once per node of the job, each talking
# to that node's daemon.
while [[ $1 == --* ]]; do shift; done
rc=0
for n in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
	STAGE_SOCKET=$(cat "$SHIM_DIR/$n.sock") "$@" || rc=$?
done
exit $rc
"""
TORCHRUN = """#!/bin/bash
printf '%s\\n' "$@" > "$SHIM_DIR/torchrun.args"
echo "DATA_DIR=$DATA_DIR" >> "$SHIM_DIR/torchrun.args"
echo "RESUME_FROM=$RESUME_FROM" >> "$SHIM_DIR/torchrun.args"
"""


def shim(d, name, text):
    p = d / name
    p.write_text(text)
    p.chmod(p.stat().st_mode | stat.S_IXUSR)


def test_sbatch_repairs_the_newest_step_and_launches(make_cluster, synced_clock, tmp_path):
    n0, n1 = make_cluster(2, transfer={"watch": "off"}, start=False,
                          doctor={**DOCTOR, "ports": free_port(), "port_range": "none"})
    shared = tmp_path / "nfs"                  # the shared mount both nodes read
    for d in (n0, n1):
        d.source_roots = [shared]
        d.src_root = shared
        d.write_config()
        d.start()
    data = make_tree(shared / "datasets" / "tiny", [F("train/0.bin", size=50_000), F("val.bin", size=7)])
    # The job's last run left step-50 and step-100; step-100 was replicated
    # to n1 and then lost a shard on n0.
    old = make_tree(ckpt(n0, "demo", "step-50"), [F("model.pt", size=30_000)])
    commit_wait(n0, old)
    new = make_tree(ckpt(n0, "demo", "step-100"), [F("model.pt", size=40_000),
                                                    F("__0_0.distcp", size=90_000)], seed=3)
    commit_wait(n0, new)
    (new / "__0_0.distcp").unlink()

    sd = tmp_path / "shims"
    sd.mkdir()
    shim(sd, "srun", SRUN)
    shim(sd, "torchrun", TORCHRUN)
    (sd / "stage").symlink_to(STAGE)
    (sd / "n0.sock").write_text(str(n0.socket))
    # scontrol expands a hostlist without a controller, but not without a
    # slurm.conf.
    (sd / "slurm.conf").write_text("ClusterName=stage-test\nSlurmctldHost=localhost\n")
    env = {"SLURM_CONF": str(sd / "slurm.conf"),**os.environ, "PATH": f"{sd}:{os.environ['PATH']}", "SHIM_DIR": str(sd),
           "SLURM_JOB_NODELIST": "n0", "SLURM_NNODES": "1", "SLURM_SUBMIT_DIR": str(REPO / "python" / "examples"),
           "STAGE_SOCKET": str(n0.socket), "DATA": str(data), "CKPT_ROOT": str(n0.base / "ckpt")}
    # step-100 must sort after step-50 by number, whatever the path holds.
    cp = subprocess.run(["bash", str(SBATCH)], capture_output=True, text=True, env=env, timeout=300)
    assert cp.returncode == 0, f"exit {cp.returncode}\n{cp.stdout}\n{cp.stderr}\n{n0.log()[-3000:]}"
    # The shard came back from n1, byte for byte.
    assert (new / "__0_0.distcp").stat().st_size == 90_000
    assert n0.run("verify", new, "--cluster").returncode == 0
    # The dataset is on the node, and the trainer was pointed at it.
    local = n0.stage_root / "datasets" / "tiny"
    assert (local / "train" / "0.bin").stat().st_size == 50_000
    args = (sd / "torchrun.args").read_text().splitlines()
    assert "--rdzv-endpoint=n0:29500" in args and "--nnodes=1" in args, args
    assert args[-3].endswith("python/examples/train.py"), args
    assert args[-2] == f"DATA_DIR={local}", args
    # The trainer was told the step stage resume chose: the newest, repaired.
    assert args[-1] == f"RESUME_FROM={new}", args
