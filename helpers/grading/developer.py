"""What the graded tests of the developer lesson run on every rank
(``solutions/developer/06_exercises.ipynb``).

Each ``*_harness`` function is sent to a real gloo pool by ``helpers.grading.run_answer``
together with the learner's function. It sets up what a training job would have at that
point (a DDP model with unequal data per rank, an optimizer with state), calls the learner's
function exactly once, and returns what each rank saw, so that the test cell can say what went
wrong in words ("rank 2 read the file before rank 0 finished writing").

The harnesses use no collective after the learner's function returns: a rank stuck in a
barrier that the others never reach is then reported as the hang it is, instead of being
paired with a collective of the grader's.

Importing this module changes nothing (no seeding, no process started).
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import tempfile
from typing import Any, Iterator

from helpers.lessons.developer import first_difference, same

__all__ = ["TIMEOUT", "timeout", "fresh_path", "same", "first_difference", "save_harness", "write_checkpoint",
           "load_harness", "stop_harness", "weighted_loss", "counting_saves"]


#: Seconds a graded pool of this lesson may take. A correct answer finishes in 1 to 3 s (the
#: slowed-down writes of the "waits" test included); the margin is for a busy machine. It
#: stays well inside nbgrader's 30 s cell limit, so that a hanging answer is reported by the
#: pool (which rank waited on which line) rather than cut off by the cell's time limit. An
#: answer that hangs costs this once: ``run_answer`` does not run an answer again after it hung.
TIMEOUT = 15.0


def timeout() -> float:
    """The pool timeout for these tests: :data:`TIMEOUT`, or more if ``COURSE_GRADER_TIMEOUT`` says so
    (capped at 22 s, inside the cell limit)."""
    from helpers.grading.answers import GRADER_TIMEOUT

    return min(max(TIMEOUT, GRADER_TIMEOUT), 22.0)


# ----------------------------------------------------------------------------- small tools


def fresh_path(name: str = "ckpt.pt") -> str:
    """A path in a new temporary folder (nothing exists there yet)."""
    return os.path.join(tempfile.mkdtemp(prefix="grader-"), name)


def _optimizer(kind: str, params):
    import torch

    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.01)
    raise ValueError(f"unknown optimizer {kind!r}")


def _clone(state):
    return copy.deepcopy(state)


# ----------------------------------------------------------------------------- save_checkpoint


def _write_slowly(data: bytes, target, chunks: int, pause: float) -> None:
    """Write ``data`` to a path or an open file in ``chunks`` flushed pieces, pausing between them
    (the loop of :func:`helpers.lessons.races.slow_save`, for bytes that are already serialised)."""
    import time

    step = max(1, -(-len(data) // chunks))
    out = open(os.fspath(target), "wb") if isinstance(target, (str, os.PathLike)) else target
    try:
        for i in range(0, len(data), step):
            out.write(data[i:i + step])
            out.flush()
            if i + step < len(data):
                time.sleep(pause)
    finally:
        if out is not target:
            out.close()


@contextlib.contextmanager
def counting_saves(calls: list, slow: bool, chunks: int = 8, pause: float = 0.1) -> Iterator[None]:
    """Inside this block every ``torch.save`` to a path or a real file is recorded in ``calls``;
    with ``slow`` its bytes are also written in ``chunks`` flushed pieces with ``pause`` seconds
    between them, so that a rank which reads too early finds the file missing or half-written.

    The hook is ``torch.serialization._open_zipfile_writer``, which ``torch.save`` looks up at
    every call: it sees every save, however the learner imported ``torch.save``
    (``from torch import save`` included), whether to a path or to an open file.
    """
    import torch.serialization as ser

    original = ser._open_zipfile_writer

    class SlowTarget:
        """Serialise into memory, then write the bytes to the real target slowly."""

        def __init__(self, target):
            self.target, self.buffer = target, io.BytesIO()
            self.inner = ser._open_zipfile_writer_buffer(self.buffer)

        def __enter__(self):
            return self.inner.__enter__()

        def __exit__(self, *exc):
            self.inner.__exit__(*exc)
            if exc[0] is None:
                _write_slowly(self.buffer.getvalue(), self.target, chunks, pause)

    def opener(target):
        is_path = isinstance(target, (str, os.PathLike))
        if not is_path and isinstance(target, io.BytesIO):
            return original(target)  # serialising into memory is not writing the checkpoint
        calls.append(os.fspath(target) if is_path else getattr(target, "name", type(target).__name__))
        return SlowTarget(target) if slow else original(target)

    ser._open_zipfile_writer = opener
    try:
        yield
    finally:
        ser._open_zipfile_writer = original


def save_harness(save_checkpoint, path: str, step: int, slow: bool = False,
                 optimizer: str = "sgd", pause: float = 0.1) -> dict:
    """On every rank: one DDP step on unequal data, then ``save_checkpoint(ddp, opt, step, path)``.

    Returns this rank's ``rank``, how many ``writes`` (torch.save calls) it made, what it found
    when it read ``path`` right after the function returned (``read``: ok / missing / torn,
    with ``detail``), and the ``model`` (unwrapped) and ``opt`` state it should have saved.
    """
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from helpers.lessons.races import try_load

    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DDP(nn.Linear(4, 1))
    opt = _optimizer(optimizer, ddp.parameters())
    torch.manual_seed(100 + rank)
    n = 2 + 3 * rank  # unequal data: 2, 5, 8, ... samples
    x, y = torch.randn(n, 4), torch.randn(n, 1) + rank
    opt.zero_grad()
    nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
    expected = {"model": _clone(ddp.module.state_dict()), "opt": _clone(opt.state_dict())}
    calls: list = []
    with counting_saves(calls, slow=slow, pause=pause):
        save_checkpoint(ddp, opt, step, path)
    read = try_load(path)  # no barrier here: the learner's function must have waited
    return {"rank": rank, "writes": len(calls), "read": str(read), "detail": read.detail,
            **expected}


# ----------------------------------------------------------------------------- load_checkpoint


def write_checkpoint(path: str, step: int, optimizer: str = "sgd", on: str | None = None) -> dict:
    """Write a checkpoint as rank 0 of a finished job would (three steps of training), in this process.

    ``on="cuda:0"`` makes it look saved on a GPU (see :func:`helpers.lessons.developer.pretend_saved_on`).
    Returns what was saved.
    """
    import torch
    import torch.nn as nn

    from helpers.lessons.developer import pretend_saved_on

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = _optimizer(optimizer, model.parameters())
    torch.manual_seed(7)
    x, y = torch.randn(12, 4), torch.randn(12, 1)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    ckpt = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}
    with pretend_saved_on(on) if on else contextlib.nullcontext():
        torch.save(ckpt, path)
    return _clone(ckpt)


def load_harness(load_checkpoint, path: str, optimizer: str = "sgd") -> dict:
    """On every rank: a fresh plain model (different weights on each rank) and optimizer, then
    ``step = load_checkpoint(model, opt, path)``. Returns the step and the states after it."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    rank = dist.get_rank()
    torch.manual_seed(1000 + rank)  # a rank that does not load keeps weights nobody saved
    model = nn.Linear(4, 1)
    opt = _optimizer(optimizer, model.parameters())
    before = _clone(model.state_dict())
    step = load_checkpoint(model, opt, path)
    if isinstance(step, torch.Tensor) and step.numel() == 1:
        step = step.item()
    return {"rank": rank, "step": step, "model": _clone(model.state_dict()),
            "opt": _clone(opt.state_dict()), "before": before}


# ----------------------------------------------------------------------------- should_stop


def weighted_loss(losses, counts) -> float:
    """The loss over every sample: sum(n_r * loss_r) / sum(n_r)."""
    return sum(l * n for l, n in zip(losses, counts)) / sum(counts)


def stop_harness(should_stop, losses, counts, thresholds) -> dict:
    """On every rank r: ``should_stop(losses[r], counts[r], t)`` for each threshold ``t`` in turn."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    answers = []
    for t in thresholds:
        value = should_stop(losses[rank], counts[rank], t)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()  # a one-element tensor is a fine way to say it
        if type(value).__name__ == "bool_":  # numpy's bool
            value = bool(value)
        answers.append(value)
    return {"rank": rank, "answers": answers}
