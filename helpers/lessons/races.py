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

__all__ = ["slow_save", "slow_torch_save", "try_load", "LoadOutcome"]

DEFAULT_CHUNKS = 8
DEFAULT_PAUSE = 0.05  # seconds between chunks: 8 chunks -> the write takes about 0.4 s


_REAL_SAVES: list = []  # torch.save as it was before slow_torch_save blocks patched it


def _serialize(obj: Any) -> bytes:
    import torch

    save = _REAL_SAVES[0] if _REAL_SAVES else torch.save
    buf = io.BytesIO()
    save(obj, buf)
    return buf.getvalue()


def slow_save(obj: Any, f, chunks: int = DEFAULT_CHUNKS, pause: float = DEFAULT_PAUSE,
              **_ignored) -> None:
    """``torch.save(obj, f)``, written in ``chunks`` pieces with ``pause`` seconds between them.

    Each piece is flushed to the operating system before the pause, so another process
    that opens the file in the meantime sees exactly the bytes written so far.
    """
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    data = _serialize(obj)
    step = max(1, -(-len(data) // chunks))
    if hasattr(f, "write"):  # a file object, as torch.save also accepts
        for i in range(0, len(data), step):
            f.write(data[i:i + step])
            f.flush()
            if i + step < len(data):
                time.sleep(pause)
        return
    with open(os.fspath(f), "wb") as out:
        for i in range(0, len(data), step):
            out.write(data[i:i + step])
            out.flush()
            if i + step < len(data):
                time.sleep(pause)


@contextlib.contextmanager
def slow_torch_save(chunks: int = DEFAULT_CHUNKS, pause: float = DEFAULT_PAUSE) -> Iterator[None]:
    """Inside this block every ``torch.save`` (to a path or to a file object) is a :func:`slow_save`.

    Used inside a rank (e.g. by a grader) so that code which calls ``torch.save`` directly
    gets the slow write without being changed. Writes to in-memory buffers stay fast.
    """
    import torch
    import torch.serialization

    original = torch.save
    _REAL_SAVES.append(original)

    def patched(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)) or (hasattr(f, "write") and not isinstance(f, io.BytesIO)):
            return slow_save(obj, f, chunks=chunks, pause=pause)
        return original(obj, f, *args, **kwargs)

    torch.save = patched
    torch.serialization.save = patched
    try:
        yield
    finally:
        torch.save = original
        torch.serialization.save = original
        _REAL_SAVES.remove(original)


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
