"""A tests/tools/faultfs.py mount for a test: mount, give orders, cut the
power, reboot (unmount, mount again), unmount at teardown."""
import os
import socket
import subprocess
from pathlib import Path

from helpers import BUILD, REPO, wait_for

FAULTFS = REPO / "tests" / "tools" / "faultfs.py"
SYNCFS_SHIM = BUILD / "tests" / "syncfs_shim.so"


def mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


class FaultMount:
    """backing: the directory faultfs passes through to; mnt: where it is
    mounted; control: its Unix socket."""

    def __init__(self, base, name="disk", direct_io=False, root_squash=False):
        base = Path(base)
        self.backing = base / f"{name}.backing"
        self.mnt = base / name
        self.control = Path(f"/tmp/ffs-{os.getpid()}-{id(self):x}.sock")
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.proc = None
        self.log_path = base / f"{name}.faultfs.log"
        self.direct_io = direct_io
        self.root_squash = root_squash

    def mount(self):
        assert not mounted(self.mnt), f"{self.mnt} is mounted already"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(["/usr/bin/python3", str(FAULTFS), str(self.backing), str(self.mnt),
                                      "--control", str(self.control)] +
                                     (["--direct-io"] if self.direct_io else []) +
                                     (["--root-squash"] if self.root_squash else []),
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def up():
            assert self.proc.poll() is None, \
                f"faultfs exited {self.proc.returncode}: {self.log_path.read_text(errors='replace')[-2000:]}"
            return mounted(self.mnt) and self.control.exists()
        wait_for(up, 20, f"faultfs on {self.mnt}")
        self.cmd("ping")
        return self

    def cmd(self, *words):
        """One order; its answer's words after "ok" (an "err" fails)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(60)
            s.connect(str(self.control))
            s.sendall((" ".join(str(w) for w in words) + "\n").encode())
            ans = b""
            while not ans.endswith(b"\n"):
                b = s.recv(65536)
                if not b:
                    break
                ans += b
        ans = ans.decode().strip()
        assert ans.startswith("ok"), f"faultfs {' '.join(map(str, words))}: {ans}"
        return ans[2:].strip()

    def stats(self):
        import json
        return json.loads(self.cmd("stats"))

    def cut(self):
        """The power cut: what was not durable is gone, and every call on
        the mount fails with EIO until reboot()."""
        return self.cmd("cut")

    def umount(self):
        if self.proc is None:
            return
        if mounted(self.mnt):
            # Lazily: a process killed mid-call may still be leaving.
            subprocess.run(["umount", "-l", str(self.mnt)], check=False, capture_output=True)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        wait_for(lambda: not mounted(self.mnt), 10, f"{self.mnt} to be unmounted")

    def reboot(self):
        """After cut(): the machine comes back with what survived."""
        self.umount()
        return self.mount()

    def env_prefix(self, asan_ok=True):
        """The argv to put before a daemon that must tell faultfs of its
        syncfs calls (see tests/tools/syncfs_shim.c)."""
        env = ["env", f"LD_PRELOAD={SYNCFS_SHIM}", f"FAULTFS_CONTROL={self.control}"]
        # ASan wants its runtime first in the list; the shim does no
        # allocation of its own and may come before it.
        opts = os.environ.get("ASAN_OPTIONS", "")
        env.append(f"ASAN_OPTIONS={opts + ':' if opts else ''}verify_asan_link_order=0")
        return env

    def close(self):
        try:
            if self.proc is not None:
                self.cmd("clear") if self.proc.poll() is None else None
        except (OSError, AssertionError):
            pass
        self.umount()
        try:
            self.control.unlink()
        except FileNotFoundError:
            pass

