"""The kernel clock's NTP discipline state, read and (as root) marked
synchronised the way an NTP daemon does, for stage doctor's clock check.

All network namespaces of the test cluster share one kernel clock, so what
adjtimex says here is what every node's daemon reports. The test machines
run no NTP daemon: the kernel has STA_UNSYNC set and adjtimex returns
TIME_ERROR, which doctor rightly names as a problem on every node. Tests
that expect a healthy cluster (exit 0, every line ✓) take `synced_clock`;
the test of the problem itself takes `clock_unsynced`.

The change is the whole machine's while a test holds the fixture, which is
why the tests run one at a time; a killed run leaves the clock marked
synchronised until the kernel itself marks it unsynchronised again (its
maxerror past 16 s, about 9 hours) or an NTP daemon takes over.
"""
import ctypes
import errno
import os

import pytest

# <sys/timex.h>
ADJ_MAXERROR = 0x0004
ADJ_ESTERROR = 0x0008
ADJ_STATUS = 0x0010
STA_UNSYNC = 0x0040
TIME_OK = 0
TIME_ERROR = 5


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    # struct timex of glibc on Linux, in order; ctypes adds the same padding
    # the C compiler does (after modes, status, shift). The trailing 11 ints
    # are the kernel's reserved space: without them adjtimex writes past the
    # buffer. x86_64: 208 bytes, status at 40, tai at 160.
    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time", _Timeval),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("_reserved", ctypes.c_int * 11),
    ]


if ctypes.sizeof(ctypes.c_long) == 8:
    assert ctypes.sizeof(_Timex) == 208 and _Timex.status.offset == 40 and _Timex.tai.offset == 160

_libc = ctypes.CDLL(None, use_errno=True)
_libc.adjtimex.argtypes = [ctypes.POINTER(_Timex)]
_libc.adjtimex.restype = ctypes.c_int


def _adjtimex(tx):
    """adjtimex(2) on tx (filled in place); the clock state, or OSError."""
    r = _libc.adjtimex(ctypes.byref(tx))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"adjtimex(modes={tx.modes:#x}): {os.strerror(e)}")
    return r


def adjtimex_state():
    """The kernel clock's discipline, read only (modes 0, no privilege):
    {"state": 0 TIME_OK .. 5 TIME_ERROR, "status": the STA_ bits,
    "synced": what doctor calls synced (state not TIME_ERROR, STA_UNSYNC
    clear), "maxerror_us", "esterror_us"}."""
    tx = _Timex()
    state = _adjtimex(tx)
    return {"state": state, "status": tx.status,
            "synced": state != TIME_ERROR and not tx.status & STA_UNSYNC,
            "maxerror_us": tx.maxerror, "esterror_us": tx.esterror}


def _set_discipline(status, maxerror_us, esterror_us):
    tx = _Timex()
    tx.modes = ADJ_STATUS | ADJ_MAXERROR | ADJ_ESTERROR
    tx.status = status
    tx.maxerror = maxerror_us
    tx.esterror = esterror_us
    _adjtimex(tx)


def mark_synced():
    """As an NTP daemon does once locked: STA_UNSYNC cleared, small error
    bounds (the kernel grows maxerror by 500 us each second and sets
    STA_UNSYNC itself past 16 s, so this holds for about 9 hours). Changes
    no time and no frequency. Returns the state before, for restore()."""
    before = adjtimex_state()
    _set_discipline(before["status"] & ~STA_UNSYNC, 1000, 100)
    return before


def restore(before):
    """Put back the STA_UNSYNC bit (set it again if it was set) and the
    error bounds that mark_synced found."""
    now = adjtimex_state()
    status = (now["status"] & ~STA_UNSYNC) | (before["status"] & STA_UNSYNC)
    _set_discipline(status, before["maxerror_us"], before["esterror_us"])


@pytest.fixture
def synced_clock():
    """The kernel clock marked synchronised for the test (root, with
    CAP_SYS_TIME), its previous state put back at teardown, pass or fail.
    Yields the state during the test."""
    if os.geteuid() != 0:
        pytest.skip("needs root: marking the kernel clock synchronised (adjtimex ADJ_STATUS)")
    try:
        before = mark_synced()
    except OSError as e:
        if e.errno == errno.EPERM:
            pytest.skip("needs CAP_SYS_TIME: marking the kernel clock synchronised")
        raise
    try:
        now = adjtimex_state()
        assert now["synced"] and now["state"] == TIME_OK, \
            f"kernel clock still unsynchronised after clearing STA_UNSYNC: before {before}, now {now}"
        yield now
    finally:
        restore(before)


@pytest.fixture
def clock_unsynced():
    """The kernel clock as the machine has it, when that is unsynchronised;
    the test is skipped (with the reason) when it is synchronised, by an NTP
    daemon or otherwise, since it cannot be unsynchronised without breaking
    that daemon's work. Yields the state."""
    st = adjtimex_state()
    if st["synced"]:
        pytest.skip(f"the kernel clock is synchronised here (adjtimex state {st['state']}, "
                    f"status {st['status']:#x}): nothing unsynchronised to report")
    yield st
