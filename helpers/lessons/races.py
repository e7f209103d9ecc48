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

__all__ = ["slow_save", "slow_torch_save", "watch_saves", "write_slowly", "try_load", "LoadOutcome"]

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


@contextlib.contextmanager
def watch_saves(log: list | None = None, chunks: int | None = None,
                pause: float = DEFAULT_PAUSE) -> Iterator[list]:
    """Inside this block every ``torch.save`` to a path or a real file is seen, and may be slowed.

    Each save is appended to ``log`` as ``{"target", "start", "end"}`` (``time.time()`` when it
    began and when its last byte was written). With ``chunks``, its bytes are written in that
    many flushed pieces ``pause`` seconds apart (:func:`write_slowly`), so that a reader that
    does not wait finds the file missing or half-written. Saves into an ``io.BytesIO`` are
    neither logged nor slowed.

    The hook is ``torch.serialization._open_zipfile_writer``, which ``torch.save`` looks up at
    every call: it sees every save however ``torch.save`` was imported (``from torch import
    save`` included), to a path or to an open file. One hook for the lessons and the grader.
    """
    import torch.serialization as ser

    log = [] if log is None else log
    original = ser._open_zipfile_writer

    class Watched:
        def __init__(self, target):
            self.target = target
            self.entry = {"target": os.fspath(target) if isinstance(target, (str, os.PathLike))
                          else str(getattr(target, "name", type(target).__name__)),
                          "start": time.time(), "end": None}
            log.append(self.entry)
            self.buffer = io.BytesIO() if chunks else None
            self.inner = original(self.buffer if chunks else target)

        def __enter__(self):
            return self.inner.__enter__()

        def __exit__(self, *exc):
            self.inner.__exit__(*exc)
            if exc[0] is None and chunks:
                write_slowly(self.buffer.getvalue(), self.target, chunks, pause)
            self.entry["end"] = time.time()
            return False

    def opener(target):
        if isinstance(target, io.BytesIO):
            return original(target)
        return Watched(target)

    ser._open_zipfile_writer = opener
    try:
        yield log
    finally:
        ser._open_zipfile_writer = original


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
