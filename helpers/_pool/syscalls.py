"""Seeing, from the caller, the system calls a rank makes (Linux only): ``run(syscalls=...)``.

A rank's own code cannot be trusted to report what it did (the grader runs a learner's code
there), and a rank is non-dumpable, so nothing outside it may look at its memory or descriptors.
The kernel's seccomp "user notification" lets the caller see some system calls anyway: before the
rank runs anything it was given, it installs a seccomp filter that turns each call of the watched
system calls (``fsync``, ``fdatasync``) into a notification, and hands the filter's listener to
the caller over a socket it then closes. A filter cannot be removed once installed, and every
thread and child of the rank inherits it. The caller's :class:`Supervisor` thread receives each
notification while the call is held, tells the caller (who can note what else has happened by
then: the order is exact, the call has not run yet), and lets the call go on unchanged.

Nothing about the call is changed: it runs as it would have, only the caller knows it happened.
"""

from __future__ import annotations

import ctypes
import os
import platform as _platform
import select
import struct
import subprocess
import sys
import threading
from typing import Callable

__all__ = ["available", "install", "Supervisor", "WATCHABLE"]

# Per architecture: the audit arch of seccomp_data, the seccomp syscall, the watchable calls.
_ARCH = {
    "x86_64": (0xC000003E, 317, {"fsync": 74, "fdatasync": 75}),
    "aarch64": (0xC00000B7, 277, {"fsync": 82, "fdatasync": 83}),
}
#: The system calls a caller may watch.
WATCHABLE = ("fsync", "fdatasync")

_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_GET_NOTIF_SIZES = 3
_SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_USER_NOTIF = 0x7FC00000
_SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_RET_K = 0x20, 0x15, 0x06


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def _arch():
    return _ARCH.get(_platform.machine()) if sys.platform.startswith("linux") else None


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def install(names: list[str]) -> int:
    """In a rank, before it runs anything it was given: from now on each call of ``names`` in
    this process (every thread, every child) waits for the caller's supervisor. Returns the
    listener's file descriptor, to be handed to the caller."""
    arch = _arch()
    if arch is None:
        raise OSError(f"seccomp notifications are not available on {sys.platform} {_platform.machine()}")
    audit, seccomp_nr, numbers = arch
    program = [_Filter(_BPF_LD_W_ABS, 0, 0, 4)]  # seccomp_data.arch
    # another architecture's calls (x32, i386 on x86_64): allowed, as the others are
    program.append(_Filter(_BPF_JEQ_K, 1, 0, audit))
    program.append(_Filter(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW))
    program.append(_Filter(_BPF_LD_W_ABS, 0, 0, 0))  # seccomp_data.nr
    wanted = [numbers[n] for n in names]
    for i, nr in enumerate(wanted):  # jump to the USER_NOTIF return if it is one of them
        program.append(_Filter(_BPF_JEQ_K, len(wanted) - i, 0, nr))
    program.append(_Filter(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW))
    program.append(_Filter(_BPF_RET_K, 0, 0, _SECCOMP_RET_USER_NOTIF))
    filters = (_Filter * len(program))(*program)
    prog = _Program(len(program), filters)
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    fd = libc.syscall(seccomp_nr, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_NEW_LISTENER,
                      ctypes.byref(prog))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER) failed")
    return fd


_PROBE = ("import os, sys; sys.path.insert(0, sys.argv[1]); "
          "from helpers._pool.syscalls import install; os.close(install(['fsync']))")


_AVAILABLE: bool | None = None


def available() -> bool:
    """Whether a rank can be watched here (checked once, in a short-lived child process)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        if _arch() is None:
            _AVAILABLE = False
        else:
            import helpers

            parent = os.path.dirname(os.path.dirname(os.path.abspath(helpers.__file__)))
            try:
                out = subprocess.run([sys.executable, "-S", "-c", _PROBE, parent],
                                     capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
                _AVAILABLE = out.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                _AVAILABLE = False
    return _AVAILABLE


def _ioctl_numbers(notif: int, resp: int) -> tuple[int, int]:
    def iowr(nr: int, size: int) -> int:
        return (3 << 30) | (size << 16) | (ord("!") << 8) | nr

    return iowr(0, notif), iowr(1, resp)


class Supervisor:
    """In the caller: receives the notifications of one rank's listener, calls
    ``on_call(pid, name, first_argument)`` for each while the call is held, then lets it go on.
    ``stop()`` ends the thread and closes the listener."""

    def __init__(self, listener: int, on_call: Callable[[int, str, int], None]):
        self.listener, self.on_call = listener, on_call
        _, _, numbers = _arch()
        self.names = {nr: name for name, nr in numbers.items()}
        libc = _libc()
        sizes = (ctypes.c_ushort * 3)()
        _, seccomp_nr, _ = _arch()
        if libc.syscall(seccomp_nr, _SECCOMP_GET_NOTIF_SIZES, 0, ctypes.byref(sizes)) != 0:
            sizes[0], sizes[1] = 80, 24
        self.notif_size, self.resp_size = max(80, sizes[0]), max(24, sizes[1])
        self.recv_nr, self.send_nr = _ioctl_numbers(80, 24)  # the uapi's fixed sizes
        self.libc = libc
        self._stop = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._serve, name="helpers.spawn syscalls", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import errno

        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        notif = ctypes.create_string_buffer(self.notif_size)
        resp = ctypes.create_string_buffer(self.resp_size)
        while not self._stop.is_set():
            events = poller.poll(50)
            if not events:
                continue
            if any(flags & (select.POLLHUP | select.POLLERR) for _, flags in events):
                return  # every process that held the filter is gone
            ctypes.memset(notif, 0, self.notif_size)
            if self.libc.ioctl(self.listener, self.recv_nr, notif) != 0:
                if ctypes.get_errno() in (errno.EINTR, errno.ENOENT):
                    continue  # interrupted, or the call's process died meanwhile
                self.error = os.strerror(ctypes.get_errno())
                return
            nid, pid, _flags, nr, _arch_, _ip = struct.unpack_from("=QIIiIQ", notif.raw)
            first = struct.unpack_from("=Q", notif.raw, 32)[0]
            try:
                self.on_call(pid, self.names.get(nr, str(nr)), first)
            finally:
                ctypes.memset(resp, 0, self.resp_size)
                struct.pack_into("=QqiI", resp, 0, nid, 0, 0, _SECCOMP_USER_NOTIF_FLAG_CONTINUE)
                self.libc.ioctl(self.listener, self.send_nr, resp)  # ENOENT: its process died

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            os.close(self.listener)
        except OSError:
            pass
