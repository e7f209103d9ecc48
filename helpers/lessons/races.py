"""Make a checkpoint write slow on purpose, and read a file to see whether it was complete.

Taught in the developer lesson ("forgetting the barrier") and the beginner lesson (the
filing-cabinet mess); the researcher lesson uses it for torn reads on a shared filesystem.

A race that fails one run in twenty teaches nothing in a classroom or in CI. Here rank 0's
``torch.save`` writes its bytes in chunks with a short pause between them, so a reader that
does not wait at the barrier finds the file missing or half-written every time, while a
reader that waits always finds it whole. The pause widens the window the real race has; it
is not used to order anything.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import time
import zipfile
from typing import Any, Iterator

__all__ = ["slow_save", "slow_torch_save", "watch_saves", "hook_torch_save", "BufferedSave", "write_slowly",
           "try_load", "LoadOutcome"]

DEFAULT_CHUNKS = 8
DEFAULT_PAUSE = 0.05  # seconds between chunks: 8 chunks -> the write takes about 0.4 s


def write_slowly(data: bytes, target, chunks: int = DEFAULT_CHUNKS,
                 pause: float = DEFAULT_PAUSE) -> None:
    """Write ``data`` to a path or an open file in ``chunks`` pieces, ``pause`` seconds apart.

    Each piece is flushed to the operating system before the pause, so another process
    that opens the file in the meantime sees exactly the bytes written so far.
    """
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    step = max(1, -(-len(data) // chunks))
    out = target if hasattr(target, "write") else open(os.fspath(target), "wb")
    try:
        for i in range(0, len(data), step):
            out.write(data[i:i + step])
            out.flush()
            if i + step < len(data):
                time.sleep(pause)
    finally:
        if out is not target:
            out.close()


def slow_save(obj: Any, f, chunks: int = DEFAULT_CHUNKS, pause: float = DEFAULT_PAUSE,
              **_ignored) -> None:
    """``torch.save(obj, f)``, written in ``chunks`` pieces with ``pause`` seconds between them
    (to a path or to an open file, as ``torch.save`` accepts)."""
    import torch

    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    buf = io.BytesIO()  # serialising into memory is not a checkpoint write: never slowed or logged
    torch.save(obj, buf)
    write_slowly(buf.getvalue(), f, chunks, pause)


class BufferedSave:
    """The writer ``torch.save`` gets inside :func:`hook_torch_save` for a file: the checkpoint is
    serialised into memory, and when the save has not failed, :meth:`publish` puts its bytes in
    the target (a path or an open file) its own way: slowly, half and then a full disk, half and
    then a ``SIGKILL``."""

    def __init__(self, target, original):
        self.target = target
        self.buffer = io.BytesIO()
        self.inner = original(self.buffer)

    def __enter__(self):
        return self.inner.__enter__()

    def __exit__(self, *exc):
        self.inner.__exit__(*exc)
        if exc[0] is None:
            self.publish(self.buffer.getvalue())
        return False

    def publish(self, data: bytes) -> None:
        raise NotImplementedError


@contextlib.contextmanager
def hook_torch_save(writer) -> Iterator[None]:
    """Inside this block, ``writer(target, original)`` makes the writer of every ``torch.save`` to
    a path or an open file (a :class:`BufferedSave`, or ``original(target)`` wrapped); saves into
    an ``io.BytesIO`` are left alone.

    The hook is ``torch.serialization._open_zipfile_writer``, which ``torch.save`` looks up at
    every call: it sees every save however ``torch.save`` was imported (``from torch import
    save`` included), to a path or to an open file. The one hook of the lessons and the grader.
    """
    import torch.serialization as ser

    original = ser._open_zipfile_writer

    def opener(target):
        if isinstance(target, io.BytesIO):
            return original(target)
        return writer(target, original)

    ser._open_zipfile_writer = opener
    try:
        yield
    finally:
        ser._open_zipfile_writer = original


class _Timed:
    """A real ``torch.save`` write, with the time its last byte was written noted in ``entry``."""

    def __init__(self, inner, entry: dict):
        self.inner, self.entry = inner, entry

    def __enter__(self):
        return self.inner.__enter__()

    def __exit__(self, *exc):
        self.inner.__exit__(*exc)
        self.entry["end"] = time.time()
        return False


class _SlowSave(BufferedSave):
    def __init__(self, target, original, entry: dict, chunks: int, pause: float):
        super().__init__(target, original)
        self.entry, self.chunks, self.pause = entry, chunks, pause

    def publish(self, data: bytes) -> None:
        write_slowly(data, self.target, self.chunks, self.pause)

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self.entry["end"] = time.time()


@contextlib.contextmanager
def watch_saves(log: list | None = None, chunks: int | None = None,
                pause: float = DEFAULT_PAUSE) -> Iterator[list]:
    """Inside this block every ``torch.save`` to a path or a real file is seen, and may be slowed.

    Each save is appended to ``log`` as ``{"target", "start", "end"}`` (``time.time()`` when it
    began and when its last byte was written). With ``chunks``, its bytes are written in that
    many flushed pieces ``pause`` seconds apart (:func:`write_slowly`), so that a reader that
    does not wait finds the file missing or half-written; without, the save writes at its own
    speed. Saves into an ``io.BytesIO`` are neither logged nor slowed (:func:`hook_torch_save`).
    """
    log = [] if log is None else log

    def writer(target, original):
        name = (os.fspath(target) if isinstance(target, (str, os.PathLike))
                else str(getattr(target, "name", type(target).__name__)))
        entry = {"target": name, "start": time.time(), "end": None}
        log.append(entry)
        if chunks:
            return _SlowSave(target, original, entry, chunks, pause)
        return _Timed(original(target), entry)

    with hook_torch_save(writer):
        yield log


def slow_torch_save(chunks: int = DEFAULT_CHUNKS, pause: float = DEFAULT_PAUSE):
    """Inside this ``with`` block every ``torch.save`` (to a path or to a file object) is a
    :func:`slow_save`; writes to in-memory buffers stay fast. Used inside a rank, so that code
    which calls ``torch.save`` directly gets the slow write without being changed."""
    return watch_saves(chunks=chunks, pause=pause)


class LoadOutcome(str):
    """``"ok"``, ``"missing"`` or ``"torn"``; ``.detail`` says what the loader reported."""

    detail: str = ""

    def __new__(cls, kind: str, detail: str = "") -> "LoadOutcome":
        obj = super().__new__(cls, kind)
        obj.detail = detail
        return obj


def try_load(path, **load_kwargs) -> LoadOutcome:
    """Load ``path`` with ``torch.load`` and say whether the file was there and complete.

    A file still being written fails to load with an ``EOFError`` (often with an empty
    message), an unpickling error, or a zip "failed finding central directory" error:
    all of them are reported as ``"torn"``.
    """
    import torch

    load_kwargs.setdefault("map_location", "cpu")
    load_kwargs.setdefault("weights_only", True)
    try:
        torch.load(path, **load_kwargs)
    except FileNotFoundError as e:
        return LoadOutcome("missing", f"FileNotFoundError: {e}")
    except (EOFError, RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile, OSError,
            ValueError) as e:
        return LoadOutcome("torn", f"{type(e).__name__}: {e}".strip())
    return LoadOutcome("ok")
