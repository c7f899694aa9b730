"""Python client of staged: the control protocol of docs/PROTOCOL.md over the
daemon's Unix socket, standard library only. Each call is one request on
its own connection, as `stage` makes it; the answer comes back as plain
dicts, and a failure as a StageError carrying the daemon's message and the
CLI's exit code (1 failed, 2 usage, 3 unreachable)."""
import os
import socket as _socket
import struct

__all__ = ["StageError", "StageFailed", "StageUsageError", "StageUnreachable",
           "commit", "verify", "pull", "restore", "resume", "status", "ls", "doctor",
           "metrics", "socket_path"]

MAGIC = b"STG1"
HDR = struct.Struct("<4sHHII")
FIELD = struct.Struct("<HHI")
MAX_PAYLOAD = (1 << 20) + 4096

# Message types and keys (common/proto.h).
PULL, VERIFY, STATUS, COMMIT, LS, RESTORE, DOCTOR, METRICS, RESUME = 1, 2, 3, 4, 5, 6, 7, 8, 9
PROGRESS, NOTE, RESULT, STATUS_ANS, LS_ANS, CELLS, CHECK, MATRIX = 16, 17, 18, 19, 20, 21, 22, 23
METRICS_ANS, K_DATA = 24, 27
K_PATH, K_DEST, K_FLAGS, K_TEXT, K_CODE, K_LEVEL, K_PHASE = 1, 2, 3, 4, 5, 6, 7
K_ROOT, K_KIND, K_NAME, K_VALUE = 16, 17, 18, 19
K_ORIGIN, K_JOB, K_STEP, K_HOLDER, K_STATE = 21, 22, 23, 29, 30
K_CHECK, K_SUBJECT, K_ADVICE, K_NUM, K_ATTR, K_NODES, K_PORTS = 33, 34, 35, 36, 37, 38, 39
U64_KEYS = {K_FLAGS, K_CODE, K_LEVEL, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 28}
STATS = {8: "files_done", 9: "files", 10: "bytes_done", 11: "bytes", 12: "files_copied",
         13: "bytes_copied", 14: "files_removed", 15: "elapsed_ns"}
REQ_VERIFY, REQ_DEEP, REQ_WAIT, REQ_CLUSTER, REQ_QUICK, REQ_DRYRUN = 1, 4, 8, 16, 32, 64
LEVELS = ("error", "warn", "info", "debug")


class StageError(Exception):
    """A request that did not succeed: .code is what `stage` would exit
    with, .message the daemon's (or the connection's) words, .result what
    the daemon sent before its verdict (notes, tables), or None."""

    def __init__(self, code, message, result=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.result = result


class StageFailed(StageError):
    """Exit 1: the operation ran and failed (a step that does not verify, a
    copy that failed, problems found)."""


class StageUsageError(StageError):
    """Exit 2: the request was refused (a path outside the roots, a bad
    node list)."""


class StageUnreachable(StageError):
    """Exit 3: no daemon answers on the socket."""


_BY_CODE = {1: StageFailed, 2: StageUsageError, 3: StageUnreachable}


def socket_path(sock=None):
    """The socket a call uses: sock, $STAGE_SOCKET, or the daemon's default
    (/run/stage/staged.sock as root, else $XDG_RUNTIME_DIR/stage.sock or
    /tmp/stage-UID.sock)."""
    if sock:
        return str(sock)
    if os.environ.get("STAGE_SOCKET"):
        return os.environ["STAGE_SOCKET"]
    if os.geteuid() == 0:
        return "/run/stage/staged.sock"
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return f"{xdg}/stage.sock" if xdg else f"/tmp/stage-{os.getuid()}.sock"


def _frame(mtype, fields):
    body = b""
    for key, value in fields:
        if isinstance(value, int):
            value = struct.pack("<Q", value)
        elif isinstance(value, str):
            value = value.encode()
        body += FIELD.pack(key, 0, len(value)) + value
    return HDR.pack(MAGIC, mtype, 0, len(body), 0) + body


def _read(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the daemon closed the connection before the result")
        buf += chunk
    return buf


def _recv(sock):
    magic, mtype, _flags, length, reserved = HDR.unpack(_read(sock, HDR.size))
    if magic != MAGIC or reserved or length > MAX_PAYLOAD:
        raise ConnectionError("malformed reply (is staged of another version?)")
    body, fields, off = _read(sock, length), [], 0
    while off < length:
        key, _res, n = FIELD.unpack_from(body, off)
        off += FIELD.size
        value = body[off:off + n]
        off += n
        if key in U64_KEYS and n == 8:
            value = struct.unpack("<Q", value)[0]
        else:
            value = value.decode("utf-8", "replace")
        fields.append((key, value))
    return mtype, fields


def _first(fields, key, default=None):
    return next((v for k, v in fields if k == key), default)


def _pairs(fields):
    """K_NAME/K_VALUE pairs in order."""
    out, name = [], None
    for k, v in fields:
        if k == K_NAME:
            name = v
        elif k == K_VALUE and name is not None:
            out.append((name, v))
            name = None
    return out


def _member(raw):
    name, _, value = raw.partition("=")
    return name, value


def _number(value):
    if value in ("true", "false"):
        return value == "true"
    try:
        return float(value) if any(c in value for c in ".e") else int(value)
    except ValueError:
        return value


def _check(fields):
    c = {"check": _first(fields, K_CHECK, ""), "subject": _first(fields, K_SUBJECT, ""),
         "ok": _first(fields, K_CODE, 1) == 0, "text": _first(fields, K_TEXT, "")}
    advice = _first(fields, K_ADVICE)
    if advice:
        c["advice"] = advice
    for k, v in fields:
        if k not in (K_NUM, K_ATTR):
            continue
        name, value = _member(v)
        value = _number(value) if k == K_NUM else value
        if name.endswith("[]"):
            c.setdefault(name[:-2], []).append(value)
        elif "." in name:
            group, _, sub = name.partition(".")
            c.setdefault(group, {})[sub] = value
        else:
            c[name] = value
    return c


def _matrix(fields):
    nodes = [v for k, v in fields if k == K_HOLDER]
    cells = [v for k, v in fields if k == K_VALUE]
    unit = next((_member(v)[1] for k, v in fields if k == K_ATTR and v.startswith("unit=")), "")
    n = len(nodes)
    return {"name": _first(fields, K_NAME, ""), "unit": unit, "nodes": nodes,
            "cells": [cells[i * n:(i + 1) * n] for i in range(n)]}


def _copies(fields):
    """MSG_CELLS: one group per K_ORIGIN (docs/PROTOCOL.md, "Copy groups")."""
    groups = []
    names = {K_ORIGIN: "origin", K_HOLDER: "holder", K_STATE: "state", K_STEP: "step",
             K_ROOT: "root", 9: "files", 11: "bytes"}
    for k, v in fields:
        if k == K_ORIGIN:
            groups.append({"origin": v, "texts": []})
        elif groups and k == K_TEXT:
            groups[-1]["texts"].append(v)
        elif groups and k in names:
            groups[-1][names[k]] = v
    return groups


def _ask(mtype, fields, sock=None, timeout=None):
    """One request; everything the daemon sent, gathered. Raises StageError
    unless the result's code is 0."""
    path = socket_path(sock)
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            s.connect(path)
        except OSError as e:
            raise StageUnreachable(3, f"cannot reach staged at {path}: {e.strerror or e}. "
                                      "Is it running?") from None
        s.sendall(_frame(mtype, fields))
        out = {"notes": []}
        while True:
            try:
                t, f = _recv(s)
            except (ConnectionError, OSError) as e:
                raise StageFailed(1, f"lost the daemon at {path}: {e}", out) from None
            if t == NOTE:
                out["notes"].append({"level": LEVELS[min(_first(f, K_LEVEL, 2), 3)],
                                     "kind": _first(f, K_KIND), "path": _first(f, K_PATH),
                                     "text": _first(f, K_TEXT, "")})
            elif t in (STATUS_ANS, LS_ANS):
                out["pairs"] = _pairs(f)
            elif t == CELLS:
                out["copies"] = _copies(f)
            elif t == CHECK:
                out.setdefault("checks", []).append(_check(f))
            elif t == MATRIX:
                out.setdefault("matrices", []).append(_matrix(f))
            elif t == METRICS_ANS:
                out["metrics"] = out.get("metrics", "") + _first(f, K_DATA, "")
            elif t == RESULT:
                out["code"] = _first(f, K_CODE, 1)
                out["text"] = _first(f, K_TEXT, "")
                for key, name in ((K_PATH, "path"), (K_ROOT, "root")):
                    if _first(f, key) is not None:
                        out[name] = _first(f, key)
                for key, name in STATS.items():
                    if _first(f, key) is not None:
                        out[name] = _first(f, key)
                break
    finally:
        s.close()
    if out["code"] != 0:
        raise _BY_CODE.get(out["code"], StageFailed)(out["code"], out["text"], out)
    return out


def _abs(path):
    return os.path.abspath(os.fspath(path))


def commit(path, wait=False, sock=None, timeout=None):
    """DIR (ckpt_root/JOB/STEP) is a finished checkpoint: its manifest is
    written and its copies queued; wait=True returns once every copy is
    confirmed on disk. The result dict ("text", "path")."""
    return _ask(COMMIT, [(K_PATH, _abs(path)), (K_FLAGS, REQ_WAIT if wait else 0)], sock, timeout)


def verify(path, cluster=False, deep=False, sock=None, timeout=None):
    """Checks PATH against its manifest (deep: every byte again); cluster:
    every node's copies of the checkpoint step. Returns the result dict
    ("notes", and "copies" with cluster) when it verifies; raises
    StageFailed, whose .result holds the findings, when it does not."""
    flags = (REQ_DEEP if deep else 0) | (REQ_CLUSTER if cluster else 0)
    return _ask(VERIFY, [(K_PATH, _abs(path)), (K_FLAGS, flags)], sock, timeout)


def pull(src, to=None, verify=False, sock=None, timeout=None):
    """Stages SRC (beneath a source root) on this node; "path" is where it
    landed."""
    fields = [(K_PATH, _abs(src)), (K_FLAGS, REQ_VERIFY if verify else 0)]
    if to is not None:
        fields.append((K_DEST, _abs(to)))
    return _ask(PULL, fields, sock, timeout)


def restore(path, from_node=None, sock=None, timeout=None):
    """Brings checkpoint DIR back from its partners' copies."""
    fields = [(K_PATH, _abs(path)), (K_FLAGS, 0)]
    if from_node:
        fields.append((K_HOLDER, from_node))
    return _ask(RESTORE, fields, sock, timeout)


def status(sock=None, timeout=None):
    """The daemon's status lines as a dict; names that repeat (peer, job,
    sending, receiving) map to a list."""
    out, repeated = {}, {"peer", "job", "sending", "receiving"}
    for name, value in _ask(STATUS, [], sock, timeout).get("pairs", []):
        if name in repeated:
            out.setdefault(name, []).append(value)
        else:
            out[name] = value
    return out


def ls(sock=None, timeout=None):
    """The checkpoints this node knows: a dict per copy, "name" (JOB/STEP)
    and the words of `stage ls` (origin, state, root, files, bytes, copies
    or holder)."""
    out = []
    for name, value in _ask(LS, [], sock, timeout).get("pairs", []):
        entry = {"name": name}
        for word in value.split():
            k, _, v = word.partition("=")
            entry[k] = int(v) if v.isdigit() else v
        out.append(entry)
    return out


def resume(job, nodes=None, deep=False, dry_run=False, sock=None, timeout=None):
    """The newest step every node of JOB can resume from, each node's own
    copy repaired from a partner's where it is not intact; "path" is this
    node's copy of it (ckpt_root/JOB/STEP), "notes" what was restored.
    nodes: the job's nodes (names or a Slurm hostlist; default
    SLURM_JOB_NODELIST when set, else every node that holds any of it).
    Raises StageFailed when no step qualifies (its .result notes say why)."""
    nodes = nodes if nodes is not None else os.environ.get("SLURM_JOB_NODELIST")
    fields = [(K_JOB, job), (K_FLAGS, (REQ_DEEP if deep else 0) | (REQ_DRYRUN if dry_run else 0))]
    if nodes:
        fields.append((K_NODES, nodes if isinstance(nodes, str) else ",".join(nodes)))
    return _ask(RESUME, fields, sock, timeout)


def metrics(sock=None, timeout=None):
    """The daemon's counters in the Prometheus text format, as `stage
    metrics` prints them (a str)."""
    return _ask(METRICS, [], sock, timeout).get("metrics", "")


def doctor(nodes=None, ports=None, quick=False, sock=None, timeout=None):
    """The cluster preflight: {"ok", "code", "text", "checks": [...],
    "matrices": [...]}. Problems found are an answer (ok False), not an
    exception; a bad node or port list raises StageUsageError."""
    fields = [(K_FLAGS, REQ_QUICK if quick else 0)]
    if nodes:
        fields.append((K_NODES, nodes if isinstance(nodes, str) else ",".join(nodes)))
    if ports:
        fields.append((K_PORTS, ports if isinstance(ports, str) else ",".join(map(str, ports))))
    try:
        out = _ask(DOCTOR, fields, sock, timeout)
    except StageFailed as e:
        if not e.result or "checks" not in e.result:
            raise
        out = e.result
    out["ok"] = out.get("code") == 0
    return out
