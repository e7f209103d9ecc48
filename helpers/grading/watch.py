"""Observations the grading kernel makes itself, outside every rank (which runs learner code):
which files were written, and gates that decide when a save can finish.

* :class:`Writes` -- an inotify watch on a folder, made in the kernel before the ranks start:
  how many times each file in it was opened for writing and closed, or renamed into place, and
  every write, rename and removal in the order it happened (folders can be added while it runs).
  No rank can make a write it did not do disappear from it.
* :class:`Gate` -- a named pipe the kernel serves from a thread. An object holding a
  :class:`GateToken` cannot be pickled (so ``torch.save`` of it cannot finish) until the kernel
  releases the gate's secret, ``delay`` seconds after the first rank reached it: a slow save
  whose length the kernel sets, and whose end it knows, without trusting anything in a rank.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import struct
import threading
import time

__all__ = ["Writes", "Gate", "GateToken"]

_IN_MODIFY, _IN_CLOSE_WRITE, _IN_OPEN, _IN_MOVED_FROM, _IN_MOVED_TO, _IN_DELETE = (
    0x00000002, 0x00000008, 0x00000020, 0x00000040, 0x00000080, 0x00000200)
_KINDS = ((_IN_MODIFY, "modified"), (_IN_CLOSE_WRITE, "written"), (_IN_MOVED_FROM, "moved_from"),
          (_IN_MOVED_TO, "moved_to"), (_IN_DELETE, "deleted"))
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")
_SECRET_BYTES = 32  # what a gate hands out: 16 random bytes, in hex


class Writes:
    """``with Writes(folder) as w:`` ... ``w.count(name)``: the writes to ``folder/name`` (each
    close of the file after opening it for writing, and each rename onto it), read by a thread
    of this process as they happen (inotify merges two identical events only while unread)."""

    def __init__(self, folder: str):
        self.folder = folder
        self.counts: dict[str, int] = {}
        #: every event in the order it happened: (folder, name, kind, cookie), kind one of
        #: "modified" (bytes written), "written" (closed after a write), "moved_from",
        #: "moved_to", "deleted", or "mark" (folder None: :meth:`mark`'s label as the name)
        self.events: list[tuple[str, str, str, int]] = []
        self._folders: dict[int, str] = {}
        self._lock = threading.Lock()
        self._libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed: the grader cannot watch files")
        if not self.watch(folder):
            os.close(self.fd)
            raise OSError(ctypes.get_errno(), f"inotify_add_watch failed on {folder}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="grader file watch", daemon=True)
        self._thread.start()

    def watch(self, folder: str) -> bool:
        """Watch one more folder (False if it cannot be watched, e.g. it does not exist yet)."""
        mask = _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_MOVED_FROM | _IN_DELETE | _IN_MODIFY | _IN_OPEN
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(folder), mask)
        if wd < 0:
            return False
        self._folders[wd] = folder
        return True

    def __enter__(self) -> "Writes":
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.read()
        os.close(self.fd)

    def _follow(self) -> None:
        import select

        while not self._stop.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if ready:
                self.read()

    def read(self) -> None:
        """Take in every event queued so far."""
        with self._lock:
            self._drain()

    def _drain(self) -> None:
        """Take in every queued event (the caller holds the lock)."""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, cookie, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size: at + _EVENT.size + size].rstrip(b"\0").decode("utf-8", "replace")
                folder = self._folders.get(wd, "")
                if mask & (_IN_CLOSE_WRITE | _IN_MOVED_TO) and folder == self.folder:
                    self.counts[name] = self.counts.get(name, 0) + 1
                for bit, kind in _KINDS:
                    if mask & bit:
                        self.events.append((folder, name, kind, cookie))
                at += _EVENT.size + size

    def mark(self, label: str) -> None:
        """Note ``label`` in :attr:`events` after every event that has happened by now (a system
        call a rank is making, seen while it is held: what came before it is in the queue)."""
        with self._lock:
            self._drain()
            self.events.append((None, label, "mark", 0))

    def count(self, name: str) -> int:
        self.read()
        return self.counts.get(name, 0)


class GateToken:
    """Pickles, in a rank, only once the kernel has opened the gate, to the gate's secret. In the
    process that made it (the kernel, sending it to the rank) it pickles as itself."""

    def __init__(self, fifo: str, maker: int | None = None):
        self.fifo, self.maker = fifo, os.getpid() if maker is None else maker

    def __reduce__(self):
        if os.getpid() == self.maker:
            return (GateToken, (self.fifo, self.maker))
        with open(self.fifo, "rb") as f:  # blocks until the kernel writes the secret
            secret = f.read(_SECRET_BYTES)
        return (bytearray, (secret,))


class Gate:
    """A named pipe in ``folder``; the kernel hands out ``secret`` to each reader, ``delay``
    seconds after the first reader came (``on_open()`` is called then, before the wait: a look at
    the files while that save is held). ``opened``/``released``: ``time.time()`` of both."""

    def __init__(self, folder: str, delay: float, name: str = "gate", on_open=None):
        self.path = os.path.join(folder, name)
        self.on_open = on_open  # called here once, when the first reader came, before the wait
        os.mkfifo(self.path, 0o644)
        self.delay, self.secret = delay, secrets.token_hex(_SECRET_BYTES // 2).encode()
        self.opened: float | None = None
        self.released: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="grader gate", daemon=True)

    def token(self) -> GateToken:
        return GateToken(self.path)

    def __enter__(self) -> "Gate":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader yet
                time.sleep(0.005)
                continue
            if self.opened is None:
                self.opened = time.time()
                if self.on_open is not None:
                    self.on_open()
            wait = self.opened + self.delay - time.time()
            if wait > 0 and self._stop.wait(wait):
                os.close(fd)
                return
            try:
                os.set_blocking(fd, True)
                os.write(fd, self.secret)
            except OSError:
                pass
            finally:
                os.close(fd)
            if self.released is None:
                self.released = time.time()
            time.sleep(0.005)  # a reader still holding the pipe open lets the next open succeed
