"""The fork server: one process per caller that imported torch once and starts every rank.

The caller (a notebook kernel) starts it with :class:`Server` and talks to it over a Unix
socket pair: length-prefixed JSON frames, file descriptors passed with ``socket.send_fds``
(public since Python 3.9; nothing here depends on a private ``multiprocessing`` module).

Caller -> server: ``{"op": "start", ...}`` with five descriptors per rank (stdout, stderr,
stack and result pipes to write, the control pipe to read). The server first kills any rank
of an earlier pool that is still alive, then forks (or, where forking is unsafe, forks and
execs a fresh interpreter for) each rank, and answers ``{"op": "started", "pids": [...]}``.
Server -> caller: ``{"op": "ready", ...}`` once, then ``started`` answers and
``{"op": "exit", "pid": p, "code": c}`` for every child it reaps (negative code: a signal).

The server and the ranks are non-dumpable on Linux (:func:`platform.make_non_dumpable`): a
rank can neither read another rank's memory (its inputs) or descriptors nor take a copy of
the server's socket to the caller. The server is a child subreaper on Linux, so a process a rank started and orphaned becomes
the server's child and is still found (and killed) when the pool stops. When the caller goes
away (its end of the socket closes), the server kills every child and removes its scratch
folder.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys

from helpers._pool import platform

_LEN = struct.Struct(">I")
FDS_PER_RANK = 6
_PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "cloudpickle",
            "psutil", "helpers._pool.rank"]
# torch._dynamo is imported by DDP's constructor and costs about 1.5 s of CPU per rank
# otherwise; importing it here makes every forked rank start with it.

_BOOT_SERVER = ("import os, sys; sys.path[:0] = sys.argv[1].split(os.pathsep); "
                "from helpers._pool.server import main; main(int(sys.argv[2]))")
_BOOT_RANK = ("import json, sys; spec = json.loads(sys.argv[1]); sys.path[:0] = spec['boot_path']; "
              "from helpers._pool.rank import rank_main; rank_main(spec)")


# ----------------------------------------------------------------------------- framing


def send_frame(sock: socket.socket, obj: dict, fds: list[int] = ()) -> None:
    body = json.dumps(obj).encode()
    data = _LEN.pack(len(body)) + body
    if fds:
        sent = socket.send_fds(sock, [data[:_LEN.size]], list(fds))
        sock.sendall(data[sent:])
    else:
        sock.sendall(data)


def _recv_exactly(sock: socket.socket, n: int, fds: list[int] | None = None) -> bytes | None:
    buf = b""
    while len(buf) < n:
        if fds is not None and not buf:
            chunk, got, _, _ = socket.recv_fds(sock, n, 253)
            fds.extend(got)
        else:
            chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def recv_frame(sock: socket.socket, with_fds: bool = False) -> tuple[dict | None, list[int]]:
    """One frame (blocking); ``(None, [])`` at the end of the stream."""
    fds: list[int] = []
    head = _recv_exactly(sock, _LEN.size, fds if with_fds else None)
    if head is None:
        return None, fds
    body = _recv_exactly(sock, _LEN.unpack(head)[0])
    if body is None:
        return None, fds
    return json.loads(body), fds


class FrameReader:
    """Frames from a non-blocking socket, as they complete."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf, self.closed = sock, bytearray(), False

    def read(self) -> list[dict]:
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self.buf += chunk
        out = []
        while len(self.buf) >= _LEN.size:
            n = _LEN.unpack_from(self.buf)[0]
            if len(self.buf) < _LEN.size + n:
                break
            out.append(json.loads(bytes(self.buf[_LEN.size:_LEN.size + n])))
            del self.buf[:_LEN.size + n]
        return out


# ----------------------------------------------------------------------------- the caller's side


class Server:
    """The caller's handle on its fork server (started on first use, kept for later pools)."""

    def __init__(self, boot_path: list[str], ready_timeout: float = 600):
        platform.check_supported()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {**os.environ, **platform.QUIET_THREAD_POOLS}
        self.process = subprocess.Popen(
            [sys.executable, "-c", _BOOT_SERVER, os.pathsep.join(boot_path), str(theirs.fileno())],
            pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
            start_new_session=True,  # a terminal's ^C is for the caller, not the server
        )
        theirs.close()
        self.sock = ours
        self.owner = os.getpid()
        ours.settimeout(ready_timeout)
        try:
            ready, _ = recv_frame(ours)
        except (OSError, ValueError):
            ready = None
        if not ready or ready.get("op") != "ready":
            self.close()
            detail = ready.get("message") if ready else "it exited while importing torch"
            raise RuntimeError(f"The pool's fork server could not start: {detail}")
        ours.settimeout(None)
        self.pid: int = ready["pid"]
        self.threads: int = ready["threads"]
        self.start_method: str = ready["start"]
        self.reader = FrameReader(ours)
        self.pending: list[dict] = []  # frames read while waiting for another one
        ours.setblocking(False)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None and not self.reader.closed

    def fileno(self) -> int:
        return self.sock.fileno()

    def start_ranks(self, request: dict, fds: list[int], timeout: float) -> list[int]:
        import selectors as _sel

        self.sock.setblocking(True)
        try:
            send_frame(self.sock, {"op": "start", **request}, fds)
        finally:
            self.sock.setblocking(False)
        sel = _sel.DefaultSelector()
        sel.register(self.sock, _sel.EVENT_READ)
        try:
            import time

            deadline = time.monotonic() + timeout
            while True:
                for frame in self.reader.read():
                    if frame["op"] == "started":
                        return frame["pids"]
                    if frame["op"] == "error":
                        raise RuntimeError(f"The pool's fork server could not start the ranks: "
                                           f"{frame['message']}")
                    self.pending.append(frame)
                if self.reader.closed:
                    raise RuntimeError("The pool's fork server exited while starting the ranks.")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError("The pool's fork server did not answer within "
                                       f"{timeout:g} s.")
                sel.select(left)
        finally:
            sel.close()

    def events(self) -> list[dict]:
        """Frames received since the last call (exits of children)."""
        out, self.pending = self.pending + self.reader.read(), []
        return out

    def children(self) -> list[int]:
        """PIDs of live processes under the server: ranks and whatever they started."""
        import psutil

        try:
            kids = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []
        alive = []
        for p in kids:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p.pid)
            except psutil.Error:
                pass
        return alive

    def direct_children(self) -> list[int]:
        """PIDs of the server's own children (ranks, and orphans it adopted on Linux)."""
        try:  # Linux: one small read instead of a scan of every process
            with open(f"/proc/{self.pid}/task/{self.pid}/children") as f:
                pids = [int(x) for x in f.read().split()]
        except OSError:
            import psutil

            try:
                pids = [p.pid for p in psutil.Process(self.pid).children()]
            except psutil.Error:
                return []
        return [pid for pid in pids if not _is_zombie(pid)]

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# ----------------------------------------------------------------------------- the server


def _close_all_but(keep: set[int]) -> None:
    """Close every descriptor but 0, 1, 2 and ``keep`` (macOS closes them one by one: bound it
    by the process's own limit)."""
    try:
        top = min(os.sysconf("SC_OPEN_MAX"), 1 << 16)
    except (OSError, ValueError):
        top = 1 << 16
    top = max(top, max(keep, default=2) + 1)
    previous = 2
    for fd in sorted(k for k in keep if k > 2) + [top]:
        if fd > previous + 1:
            os.closerange(previous + 1, fd)
        previous = fd


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads, and ``pid`` itself (if it left the group)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _is_zombie(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True  # gone


def _become_subreaper() -> None:
    if not platform.orphans_adopted_by_server():
        return
    import ctypes

    try:
        PR_SET_CHILD_SUBREAPER = 36
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        pass


def main(sock_fd: int) -> None:
    """The server's loop: start ranks when asked, report every child that exits."""
    platform.make_non_dumpable()  # first: no rank reads this process's memory or descriptors
    sock = socket.socket(fileno=sock_fd)
    try:
        for name in _PRELOAD:
            __import__(name)
    except BaseException as e:  # noqa: BLE001 - told to the caller
        send_frame(sock, {"op": "error", "message": f"{type(e).__name__}: {e}"})
        return
    _become_subreaper()
    folders: set[str] = set()  # the pools' temp folders, removed here if the caller dies
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threads = platform.thread_count()
    send_frame(sock, {"op": "ready", "pid": os.getpid(), "threads": threads,
                      "start": platform.start_method(threads)})
    children: set[int] = set()
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, "caller")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    try:
        while True:
            for key, _ in sel.select():
                if key.data == "child":
                    while True:
                        try:
                            if not os.read(wake_r, 512):
                                break
                        except BlockingIOError:
                            break
                    _reap(sock, children)
                    continue
                request, fds = recv_frame(sock, with_fds=True)
                if request is None:
                    return  # the caller is gone
                _serve(sock, request, fds, children, folders)
    finally:
        for pid in children:
            kill_group(pid)
        import shutil

        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def _reap(sock: socket.socket, children: set[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        try:
            send_frame(sock, {"op": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})
        except OSError:
            pass


def _serve(sock, request: dict, fds: list[int], children: set[int], folders: set[str]) -> None:
    """Start one pool's ranks; first end whatever an earlier pool left (ranks, folders)."""
    import shutil

    for pid in list(children):
        kill_group(pid)
    for folder in folders:  # the caller runs one pool at a time: earlier ones are over
        shutil.rmtree(folder, ignore_errors=True)
    folders.clear()
    folders.add(request["common"]["folder"])
    pids = []
    try:
        method = platform.start_method(platform.thread_count())
        for i, spec in enumerate(request["ranks"]):
            rank_fds = fds[FDS_PER_RANK * i:FDS_PER_RANK * (i + 1)]
            spec = {**request["common"], **spec, "server_pid": os.getpid(),
                    "fds": dict(zip(("out", "err", "stack", "result", "control", "notify"), rank_fds))}
            pid = os.fork()
            if pid == 0:  # the rank
                code = 1
                try:
                    os.setpgrp()  # its own process group: the caller kills it with killpg
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    _close_all_but(set(rank_fds))
                    sock.detach()
                    if method == "exec":
                        for fd in rank_fds:
                            os.set_inheritable(fd, True)
                        os.execv(sys.executable, [sys.executable, "-c", _BOOT_RANK,
                                                  json.dumps(spec)])
                    from helpers._pool.rank import rank_main

                    rank_main(spec)
                    code = 0
                finally:
                    os._exit(code)
            children.add(pid)
            pids.append(pid)
    except OSError as e:
        for pid in pids:
            kill_group(pid)
        send_frame(sock, {"op": "error", "message": f"{type(e).__name__}: {e}"})
        return
    finally:
        for fd in fds:
            os.close(fd)
    send_frame(sock, {"op": "started", "pids": pids})
