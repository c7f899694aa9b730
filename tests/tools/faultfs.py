#!/usr/bin/python3
"""faultfs: a FUSE file system for the tests that fails the way disks and
NFS servers fail. It passes every call through to a backing directory and
takes orders, while mounted, on a Unix socket:

  cut               the power cut: every write not made durable is gone.
                    From then on every call fails with EIO (the machine is
                    off); the backing directory now holds what survived.
                    Unmount and mount again to "reboot".
  fail OP GLOB AFTER ERRNO
                    OP (read, write) on files whose path matches GLOB
                    (fnmatch, from the mount's root: "/src/a.bin", "*.bin")
                    fails with ERRNO (EIO, ENOSPC, ...) from byte AFTER of
                    the file on: a read that reaches it fails (the bytes
                    before it read well), a write across it is cut short
                    there and the next one fails.
  latency MS        every call waits MS milliseconds first.
  rate BYTES        reads and writes share a token bucket of BYTES/s.
  hang / release    every call blocks until released (an NFS server gone
                    away); calls already inside the backing file system
                    finish.
  clear             no fault rule, no latency, no rate, released.
  syncfs DEV        what syncfs(2) of a file system with st_dev DEV did:
                    the kernel does not pass syncfs on to a FUSE server
                    (it sends FUSE_SYNCFS to virtiofs only), so
                    tests/tools/syncfs_shim.c, preloaded into the daemon,
                    tells us after each one that succeeded.
  stats             one JSON object: calls, bytes, fsyncs, faults served,
                    calls blocked now, what is not yet durable.
  ping

--root-squash mounts it as an NFS export with root_squash (the default of
exports(5)): a call made by uid 0 is judged as if made by nobody
(65534:65534), so root reads only what others may read, while every other
user is judged by the kernel as usual (default_permissions); and what a
call creates is its caller's (root's: nobody's), as an NFS server makes it.

Each answer is one line, "ok ..." or "err WHY".

What a cut keeps. The model is the strict POSIX one that Jepsen's LazyFS
takes: a file's data and attributes are durable as of its last fsync or
fdatasync (or a syncfs), a directory's entries as of its last fsync (or a
syncfs); nothing else is. So a file created, written and fsync'd, whose
directory was never fsync'd, is gone after a cut, and a rename not followed
by an fsync of both directories is undone. What was there at mount counts as
durable. Symbolic links keep the target they were made with; a directory's
own mode and times are kept as they are at the cut.

How. The backing directory always holds the live state, so reads are plain
reads. Before the first change to something durable since its last sync, its
durable state is copied aside (a file's bytes and times into .faultfs-store/
next to the backing directory, a directory's entries into memory): copy on
write. A sync drops the copy, since the live state is then the durable one.
A cut builds the durable tree beside the backing directory (hard links for
files whose live bytes are their durable ones, the saved copies for the
rest, empty files for those never synced) and swaps it in.

Limits: one process, calls mutating the tree are serialised (the tests move
tens of MiB, not GiB); libfuse 2 (python3-fusepy) speaks FUSE 7.19, so the
kernel refuses renameat2's flags (RENAME_NOREPLACE, RENAME_EXCHANGE) with
EINVAL before asking us, as NFS does; fallocate and xattrs are not offered.
"""
import argparse
import contextlib
import errno
import faulthandler
import fnmatch
import json
import os
import shutil
import signal
import socket
import stat
import sys
import threading
import time

from fusepy import FUSE, FuseOSError, Operations, fuse_get_context

STORE_SUFFIX = ".faultfs-store"
CUT_SUFFIX = ".faultfs-cut"


class Gate:
    """Hang, latency, rate and the cut, applied before a call reaches the
    backing directory."""

    def __init__(self):
        self.cv = threading.Condition()
        self.hung = False
        self.off = False          # after a cut
        self.blocked = 0
        self.latency = 0.0
        self.rate = 0             # bytes/s, 0: none
        self.tokens = 0.0
        self.t_last = time.monotonic()

    def enter(self, nbytes=0):
        with self.cv:
            if self.hung:
                self.blocked += 1
                try:
                    while self.hung and not self.off:
                        self.cv.wait()
                finally:
                    self.blocked -= 1
            if self.off:
                raise FuseOSError(errno.EIO)
            lat, wait = self.latency, 0.0
            if self.rate and nbytes:
                now = time.monotonic()
                self.tokens = min(self.rate, self.tokens + (now - self.t_last) * self.rate)
                self.t_last = now
                self.tokens -= nbytes
                if self.tokens < 0:
                    wait = -self.tokens / self.rate
        if lat or wait:
            time.sleep(lat + wait)


class Rule:
    def __init__(self, op, glob, after, err):
        self.op, self.glob, self.after, self.err = op, glob, after, err
        self.hits = 0

    def limit(self, op, path, off, size):
        """How many of size bytes at off may pass (size: all of them)."""
        if op != self.op or not fnmatch.fnmatchcase(path, self.glob):
            return size
        # A short read is end of file to the kernel (it would take the file
        # for shorter), so a read that reaches AFTER fails whole; a short
        # write is passed on to the writer as one.
        if off >= self.after or (op == "read" and off + size > self.after):
            self.hits += 1
            raise FuseOSError(self.err)
        return min(size, self.after - off)


class FaultFS(Operations):
    use_ns = True

    def __init__(self, root):
        self.root = os.path.realpath(root)
        self.store = self.root + STORE_SUFFIX
        shutil.rmtree(self.store, ignore_errors=True)
        os.mkdir(self.store, 0o700)
        self.root_ino = os.lstat(self.root).st_ino
        self.gate = Gate()
        self.tree_lock = threading.RLock()   # the tree and its durable state
        self.rules = []
        # Durable state, for what changed since its last sync (absent: the
        # live state is the durable one):
        #   files[ino] = ("copy", store path) | ("none", mode) | ("link", target)
        #   dirs[ino]  = {name: (ino, S_IFMT)}
        self.files = {}
        self.dirs = {}
        self.pins = {}                  # ino -> its path in the store, once unlinked
        self.dev = None                 # st_dev of the mount, for syncfs
        self.mountpoint = None
        self.root_squash = False
        self.n = {"calls": 0, "read_bytes": 0, "write_bytes": 0, "fsync": 0, "fsyncdir": 0,
                  "syncfs": 0, "faults": 0, "cuts": 0}

    # ------------------------------------------------------------ helpers

    def _p(self, path):
        return self.root + path

    def _enter(self, nbytes=0):
        self.n["calls"] += 1
        self.gate.enter(nbytes)

    SQUASHED = 65534

    def _nobody_may(self, p, want):
        st = os.lstat(p)
        shift = 6 if st.st_uid == self.SQUASHED else 3 if st.st_gid == self.SQUASHED else 0
        return ((st.st_mode >> shift) & want) == want

    def _own(self, p):
        """root_squash: what a call creates is its caller's, as an NFS
        server makes it (root's is nobody's)."""
        if self.root_squash:
            uid, gid, _ = fuse_get_context()
            if uid == 0:
                uid = gid = self.SQUASHED
            os.lchown(p, uid, gid)

    def _squash(self, path, want=0, parent_want=0):
        """root_squash: root's call is judged as nobody's. Every directory on
        the way must let nobody search it; the parent must also allow
        parent_want, the entry itself want (os.R_OK, W_OK, X_OK bits)."""
        if not self.root_squash or fuse_get_context()[0] != 0:
            return
        parts = [c for c in path.split("/") if c]
        cur = self.root
        for i, c in enumerate(parts):
            need = os.X_OK | (parent_want if i == len(parts) - 1 else 0)
            if not self._nobody_may(cur, need):
                raise FuseOSError(errno.EACCES)
            cur = os.path.join(cur, c)
        if want and os.path.lexists(cur) and not self._nobody_may(cur, want):
            raise FuseOSError(errno.EACCES)

    @contextlib.contextmanager
    def _locked(self):
        """The tree lock, refused once the power is off (a call that passed
        the gate before the cut must not touch the surviving tree)."""
        with self.tree_lock:
            if self.gate.off:
                raise FuseOSError(errno.EIO)
            yield

    def _listing(self, dpath):
        out = {}
        for name in os.listdir(dpath):
            st = os.lstat(os.path.join(dpath, name))
            out[name] = (st.st_ino, stat.S_IFMT(st.st_mode))
        return out

    def _cow_dir(self, dpath):
        ino = os.lstat(dpath).st_ino
        if ino not in self.dirs:
            self.dirs[ino] = self._listing(dpath)

    def _cow_file(self, ino, live):
        """Before a change to file ino (live: a path or fd of it now)."""
        if ino in self.files:
            return
        dst = os.path.join(self.store, str(ino))
        if isinstance(live, int):
            st = os.fstat(live)
            with open(dst, "wb") as out:
                off = 0
                while True:
                    b = os.pread(live, 1 << 20, off)
                    if not b:
                        break
                    out.write(b)
                    off += len(b)
            os.chmod(dst, stat.S_IMODE(st.st_mode))
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        else:
            shutil.copy2(live, dst, follow_symlinks=False)
        self.files[ino] = ("copy", dst)

    def _cow_entry(self, path):
        """Before path's entry goes away or is replaced. If it was the last
        name of its inode, the inode is pinned in the store (a hard link, or
        the empty directory moved there): a durable entry may still name it,
        and a freed inode number would soon be another file's."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            return                      # rmdir pins it
        if stat.S_ISLNK(st.st_mode):
            self.files.setdefault(st.st_ino, ("link", os.readlink(path)))
        elif st.st_nlink <= 1:
            self._pin(path, st.st_ino, os.link)

    def _pin(self, path, ino, how):
        """Keeps inode ino alive in the store (how: os.link for a file,
        os.rename for an empty directory)."""
        pin = os.path.join(self.store, f"pin-{ino}")
        how(path, pin)
        self.pins[ino] = pin

    def _limit(self, op, path, off, size):
        """How many of size bytes at off the fault rules let through."""
        for r in self.rules:
            try:
                size = r.limit(op, path or "", off, size)
            except FuseOSError:
                self.n["faults"] += 1
                raise
        return size

    def _before_attrs(self, path):
        """Before a change of path's mode, owner or times: a regular file's
        durable attributes are kept with its bytes. Its backing path."""
        p = self._p(path)
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode):
            self._cow_file(st.st_ino, p)
        return p

    def _parent(self, path):
        return os.path.dirname(self._p(path)) or self.root

    # ------------------------------------------------------------ the cut

    def cut(self):
        with self.gate.cv:
            self.gate.off = True
            self.gate.cv.notify_all()
        with self.tree_lock:
            self.n["cuts"] += 1
            live = {}
            for d, dns, fns in os.walk(self.root):
                for name in dns + fns:
                    p = os.path.join(d, name)
                    live.setdefault(os.lstat(p).st_ino, p)
            for ino, pin in self.pins.items():
                live.setdefault(ino, pin)
            out = self.root + CUT_SUFFIX
            shutil.rmtree(out, ignore_errors=True)
            os.mkdir(out)
            lost = self._build(self.root_ino, self.root, out, live)
            shutil.copystat(self.root, out)
            old = self.root + ".faultfs-old"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(self.root, old)
            os.rename(out, self.root)
            shutil.rmtree(old, ignore_errors=True)
            self._forget()
            return lost

    def _build(self, dino, dpath, out, live):
        """Writes directory dino's durable entries into out; returns how
        many live entries did not survive (for the answer)."""
        entries = self.dirs.get(dino)
        if entries is None:
            entries = self._listing(dpath) if dpath and os.path.isdir(dpath) else {}
        lost = 0
        if dpath and os.path.isdir(dpath):
            lost += len(set(os.listdir(dpath)) - set(entries))
        for name, (ino, fmt) in sorted(entries.items()):
            dst = os.path.join(out, name)
            src = live.get(ino)
            if fmt == stat.S_IFDIR:
                os.mkdir(dst)
                lost += self._build(ino, src if src and os.path.isdir(src) else None, dst, live)
                if src:
                    shutil.copystat(src, dst)   # after its entries: their making moves the mtime
                continue
            state = self.files.get(ino)
            if state is None and fmt == stat.S_IFLNK and src:
                state = ("link", os.readlink(src))
            if state is None:
                if src is None:
                    continue            # cannot happen: a last name is kept
                os.link(src, dst, follow_symlinks=False)
            elif state[0] == "copy":
                shutil.copy2(state[1], dst)
            elif state[0] == "none":
                fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, state[1])
                os.close(fd)
                os.chmod(dst, state[1])
                lost += 1
            elif state[0] == "link":
                os.symlink(state[1], dst)
        return lost

    def syncfs(self):
        with self.tree_lock:
            self.n["syncfs"] += 1
            self._forget()

    def _forget(self):
        """Everything live is durable: no copy, no pin."""
        self.files.clear()
        self.dirs.clear()
        self.pins.clear()
        shutil.rmtree(self.store, ignore_errors=True)
        os.mkdir(self.store, 0o700)

    # ------------------------------------------------------------ calls that read

    def getattr(self, path, fh=None):
        self._enter()
        if fh is None:
            self._squash(path)
        st = os.fstat(fh) if fh is not None else os.lstat(self._p(path))
        return {k: getattr(st, k) for k in ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size",
                                            "st_atime", "st_mtime", "st_ctime")} | \
            {"st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

    def access(self, path, amode):
        self._enter()
        self._squash(path, amode)
        if not os.access(self._p(path), amode):
            raise FuseOSError(errno.EACCES)

    def readdir(self, path, fh):
        self._enter()
        self._squash(path, os.R_OK)
        return [".", ".."] + os.listdir(self._p(path))

    def readlink(self, path):
        self._enter()
        self._squash(path)
        return os.readlink(self._p(path))

    def statfs(self, path):
        self._enter()
        s = os.statvfs(self._p(path))
        return {k: getattr(s, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                            "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    def open(self, path, flags):
        self._enter()
        acc = flags & os.O_ACCMODE
        self._squash(path, (os.R_OK if acc != os.O_WRONLY else 0) | (os.W_OK if acc != os.O_RDONLY else 0))
        # The kernel did O_CREAT/O_EXCL/O_TRUNC (through create and
        # truncate) and gives each write its offset, O_APPEND included.
        fl = flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC | os.O_APPEND | os.O_DIRECT | os.O_NOATIME)
        return os.open(self._p(path), fl)

    def read(self, path, size, off, fh):
        self._enter(size)
        size = self._limit("read", path, off, size)
        b = os.pread(fh, size, off)
        self.n["read_bytes"] += len(b)
        return b

    def release(self, path, fh):
        os.close(fh)

    def flush(self, path, fh):
        self._enter()

    # ------------------------------------------------------------ calls that change

    def create(self, path, mode, fi=None):
        self._enter()
        self._squash(path, parent_want=os.W_OK)
        with self._locked():
            p = self._p(path)
            self._cow_dir(self._parent(path))
            try:
                fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
            except FileExistsError:     # made since the kernel looked
                return os.open(p, os.O_RDWR)
            self._own(p)
            self.files[os.fstat(fd).st_ino] = ("none", stat.S_IMODE(mode))
            return fd

    def write(self, path, data, off, fh):
        self._enter(len(data))
        with self._locked():
            n = self._limit("write", path, off, len(data))
            self._cow_file(os.fstat(fh).st_ino, fh)
            w = os.pwrite(fh, data[:n], off)
            self.n["write_bytes"] += w
            return w

    def truncate(self, path, length, fh=None):
        self._enter()
        with self._locked():
            if fh is not None:
                self._cow_file(os.fstat(fh).st_ino, fh)
                os.ftruncate(fh, length)
            else:
                p = self._p(path)
                self._cow_file(os.lstat(p).st_ino, p)
                os.truncate(p, length)

    def fsync(self, path, datasync, fh):
        self._enter()
        with self._locked():
            self.n["fsync"] += 1
            st = os.fstat(fh)
            self.files.pop(st.st_ino, None)

    def fsyncdir(self, path, datasync, fh):
        self._enter()
        with self._locked():
            self.n["fsyncdir"] += 1
            self.dirs.pop(os.lstat(self._p(path)).st_ino, None)

    def chmod(self, path, mode):
        self._enter()
        with self._locked():
            p = self._before_attrs(path)
            os.chmod(p, mode)

    def chown(self, path, uid, gid):
        self._enter()
        with self._locked():
            p = self._before_attrs(path)
            os.lchown(p, uid, gid)

    def utimens(self, path, times=None):
        self._enter()
        with self._locked():
            p = self._before_attrs(path)
            if times:
                os.utime(p, ns=times, follow_symlinks=False)
            else:
                os.utime(p, follow_symlinks=False)

    def mkdir(self, path, mode):
        self._enter()
        self._squash(path, parent_want=os.W_OK)
        with self._locked():
            self._cow_dir(self._parent(path))
            p = self._p(path)
            os.mkdir(p, mode)
            self._own(p)
            self.dirs[os.lstat(p).st_ino] = {}

    def mknod(self, path, mode, dev):
        self._enter()
        with self._locked():
            self._cow_dir(self._parent(path))
            os.mknod(self._p(path), mode, dev)
            self.files[os.lstat(self._p(path)).st_ino] = ("none", stat.S_IMODE(mode))

    def symlink(self, target, source):
        # fusepy: target is the new name, source what it points to.
        self._enter()
        with self._locked():
            self._cow_dir(self._parent(target))
            p = self._p(target)
            os.symlink(source, p)
            self._own(p)
            self.files[os.lstat(p).st_ino] = ("link", source)

    def link(self, target, source):
        # fusepy: target is the new name, source the existing file.
        self._enter()
        with self._locked():
            self._cow_dir(self._parent(target))
            os.link(self._p(source), self._p(target), follow_symlinks=False)

    def unlink(self, path):
        self._enter()
        with self._locked():
            self._cow_dir(self._parent(path))
            self._cow_entry(self._p(path))
            os.unlink(self._p(path))

    def rmdir(self, path):
        self._enter()
        with self._locked():
            p = self._p(path)
            st = os.lstat(p)
            if not stat.S_ISDIR(st.st_mode):
                raise FuseOSError(errno.ENOTDIR)
            if os.listdir(p):
                raise FuseOSError(errno.ENOTEMPTY)
            self._cow_dir(self._parent(path))
            self.dirs.setdefault(st.st_ino, {})
            self._pin(p, st.st_ino, os.rename)

    def rename(self, old, new):
        self._enter()
        with self._locked():
            po, pn = self._p(old), self._p(new)
            self._cow_dir(self._parent(old))
            self._cow_dir(self._parent(new))
            try:
                st = os.lstat(pn)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISDIR(st.st_mode) and st.st_ino != os.lstat(po).st_ino:
                if os.listdir(pn):
                    raise FuseOSError(errno.ENOTEMPTY)
                self.dirs.setdefault(st.st_ino, {})
                self._pin(pn, st.st_ino, os.rename)     # the empty directory replaced
            elif st is not None:
                self._cow_entry(pn)
            os.rename(po, pn)

    # ------------------------------------------------------------ control

    def command(self, words):
        op = words[0] if words else ""
        if op == "ping":
            return "ok"
        if op == "cut":
            lost = self.cut()
            return f"ok {lost} entries lost"
        if op == "fail" and len(words) == 5:
            if words[1] not in ("read", "write"):
                return f"err fail: no operation {words[1]!r} (read, write)"
            err = getattr(errno, words[4], None)
            if not isinstance(err, int):
                return f"err fail: no errno {words[4]!r}"
            self.rules.append(Rule(words[1], words[2], int(words[3]), err))
            return "ok"
        if op == "latency" and len(words) == 2:
            self.gate.latency = int(words[1]) / 1000.0
            return "ok"
        if op == "rate" and len(words) == 2:
            with self.gate.cv:
                self.gate.rate, self.gate.tokens = int(words[1]), 0.0
            return "ok"
        if op == "hang":
            with self.gate.cv:
                self.gate.hung = True
            return "ok"
        if op in ("release", "clear"):
            with self.gate.cv:
                self.gate.hung = False
                self.gate.cv.notify_all()
                if op == "clear":
                    self.gate.latency, self.gate.rate = 0.0, 0
                    self.rules = []
            return "ok"
        if op == "syncfs" and len(words) == 2:
            if self.dev is None:
                self.dev = os.stat(self.mountpoint).st_dev
            if int(words[1]) == self.dev:
                self.syncfs()
                return "ok synced"
            return "ok not ours"
        if op == "stats":
            with self.tree_lock:
                d = dict(self.n, blocked=self.gate.blocked, hung=self.gate.hung, off=self.gate.off,
                         unsynced_files=len(self.files), unsynced_dirs=len(self.dirs),
                         rule_hits=[r.hits for r in self.rules])
            return "ok " + json.dumps(d)
        return f"err unknown command {' '.join(words)!r}"


def serve_control(fs, path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o666)       # a daemon under another uid reports its syncfs
    srv.listen(64)

    def one(conn):
        with conn, conn.makefile("rw") as f:
            for line in f:
                try:
                    ans = fs.command(line.split())
                except Exception as ex:     # an answer, never a dead server
                    ans = f"err {type(ex).__name__}: {ex}"
                f.write(ans + "\n")
                f.flush()

    def loop():
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


def main():
    ap = argparse.ArgumentParser(description="a FUSE pass-through that fails on command")
    ap.add_argument("backing")
    ap.add_argument("mountpoint")
    ap.add_argument("--control", required=True, help="the Unix socket it takes orders on")
    ap.add_argument("--root-squash", action="store_true",
                    help="judge calls made by root as nobody's, as an NFS export with root_squash")
    ap.add_argument("--direct-io", action="store_true",
                    help="no page cache on the mount: every read reaches us and is counted, as "
                    "each node's first read reaches an NFS server (the shared storage of a "
                    "cluster pull's tests, whose nodes share this machine's cache)")
    a = ap.parse_args()
    faulthandler.register(signal.SIGUSR1)   # every thread's stack, for a test that hangs
    fs = FaultFS(a.backing)
    fs.root_squash = a.root_squash
    fs.mountpoint = a.mountpoint
    serve_control(fs, a.control)
    # attr and entry timeouts 0: the kernel asks each time, so what a test
    # changes in the backing directory (and a cut) is seen at once.
    FUSE(fs, a.mountpoint, foreground=True, nothreads=False, big_writes=True, use_ino=True,
         hard_remove=True, allow_other=True, default_permissions=True, attr_timeout=0,
         entry_timeout=0, negative_timeout=0, fsname="faultfs", subtype="faultfs",
         **({"direct_io": True} if a.direct_io else {}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
