"""Plumbing for the developer lesson's demos (``solutions/developer/01_save_log_resume.ipynb``,
``02_common_mistakes.ipynb``, ``03_sharded_checkpoints.ipynb``).

The lesson's point (the ``if rank == 0:`` save, the ``dist.barrier()``, the ``[sum, count]``
all_reduce) is written in the notebooks' own cells; this module only holds what is not the
lesson: running a torchrun script inside a pool's rank, making a checkpoint that looks as if it
was saved on a GPU, and comparing two state dicts (the figures are in :mod:`helpers.lessons.figures`).

Importing it changes nothing (no seeding, no plotting style, no process started).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import Any, Iterator

__all__ = ["pretend_saved_on", "run_script", "first_difference", "same"]


# ----------------------------------------------------------------------------- checkpoints


@contextlib.contextmanager
def pretend_saved_on(location: str = "cuda:0") -> Iterator[None]:
    """Inside this block, ``torch.save`` records every tensor's device as ``location``.

    A checkpoint written on a GPU stores, next to each tensor's bytes, the device it came
    from (``"cuda:0"``); ``torch.load`` puts the tensor back there unless ``map_location``
    says otherwise. This machine has no GPU, so the lesson makes such a file by registering a
    device tagger with ``torch.serialization.register_package`` (the mechanism torch itself
    uses to tag storages) for the duration of the block. The bytes are exactly what a GPU
    save writes for these tensors' location.
    """
    import torch.serialization as ser

    def tagger(storage):
        return location

    def no_restore(storage, where):  # loading is left to torch's own deserialisers
        return None

    ser.register_package(-1000, tagger, no_restore)
    entry = next(e for e in ser._package_registry if e[1] is tagger)
    try:
        yield
    finally:
        ser._package_registry.remove(entry)


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self):
        for s in self.streams:
            s.flush()


def run_script(script: str, workdir: str, args: tuple = ()) -> list[str]:
    """Run a torchrun-style script unchanged inside the calling rank, from ``workdir``.

    Meant for ``helpers.spawn.run(run_script, path, workdir, init_process_group=False)``:
    the pool sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``... as torchrun does, and the script
    calls ``dist.init_process_group`` itself. Its output still streams into the cell; the
    printed lines are also returned, so the notebook can assert them. ``args`` are the script's
    command-line arguments (its ``sys.argv[1:]``, e.g. ``("--backend", "gloo")``); a rank would
    otherwise see the notebook kernel's own arguments.
    """
    import runpy

    script = os.path.abspath(script)
    captured = io.StringIO()
    os.chdir(workdir)
    old, old_argv = sys.stdout, sys.argv
    sys.stdout = _Tee(old, captured)
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.stdout, sys.argv = old, old_argv
    return captured.getvalue().splitlines()


# ----------------------------------------------------------------------------- state dicts


def first_difference(a: Any, b: Any, where: str = "") -> str | None:
    """Where two (nested) state dicts differ, e.g. ``"['state'][0]['momentum_buffer']"``; None if equal."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return where or "(top level)"
        if a.shape != b.shape or not torch.equal(a.to(b.dtype), b):
            return where or "(top level)"
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{where} keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            found = first_difference(a[k], b[k], f"{where}[{k!r}]")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{where} (length {len(a)} vs {len(b)})"
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if a == b else (where or "(top level)")


def same(a: Any, b: Any) -> bool:
    """True when two (nested) state dicts hold equal tensors and values under the same keys."""
    return first_difference(a, b) is None
