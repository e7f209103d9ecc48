"""Run a learner's answer in worker processes and turn what went wrong into feedback that teaches.

Used by every depth's checks (:mod:`helpers.grading.beginner`, ``developer``, ``researcher``),
which the exercises notebooks' test cells call. Each check runs the learner's function in
real processes through :func:`helpers.spawn.run`: on the ranks of a gloo pool
(:func:`run_answer`), or in one worker process for an answer that is not distributed
(:func:`call`). The learner's code never runs in the kernel that grades it, and every run
is bounded in time, so an answer that hangs fails its own test cell and the rest of the
notebook is still graded.

A check that passes prints one line, ``✓ ...`` (:func:`passed`); one that fails raises
:class:`CheckFailed`, an ``AssertionError`` that Jupyter shows as its message alone, without
a traceback through these helpers.
"""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Callable

from helpers.spawn import HangError, RankDied, UnsendableResult, WorkerError, run

__all__ = ["CheckFailed", "fail", "passed", "run_answer", "call", "pool_timeout", "cell_timeout",
           "feedback_for_hang", "feedback_for_error", "forget_hangs", "scratch", "plain", "Refused"]

#: Seconds nbgrader gives one cell when ``nbgrader_config.py`` cannot be read.
DEFAULT_CELL_TIMEOUT = 30.0


class CheckFailed(AssertionError):
    """A check that failed. Jupyter shows its message only: the learner reads what went wrong
    and what to do, not a traceback through the grader's code."""

    def _render_traceback_(self) -> list[str]:  # IPython's hook for custom tracebacks
        return ["✗ " + line if i == 0 else line for i, line in enumerate(str(self).splitlines())]


def fail(message: str) -> None:
    """Raise :class:`CheckFailed` with ``message``."""
    raise CheckFailed(message)


def passed(message: str) -> None:
    """The one line a passing check prints."""
    print(f"✓ {message}", flush=True)


# ----------------------------------------------------------------------------- time limits


def cell_timeout() -> float:
    """Seconds nbgrader gives one test cell: ``COURSE_CELL_TIMEOUT`` when the grader's execute
    step set it (it does, from its ``timeout``), else ``Execute.timeout`` in the course's
    ``nbgrader_config.py``, read now (not at import)."""
    value = os.environ.get("COURSE_CELL_TIMEOUT")
    if value:
        return float(value)
    config = Path(__file__).resolve().parents[2] / "nbgrader_config.py"
    try:
        from traitlets.config import Config

        c = Config()
        exec(compile(config.read_text(), str(config), "exec"), {"get_config": lambda: c})
        return float(c.Execute.timeout)
    except (OSError, ImportError, AttributeError, TypeError, ValueError):
        return DEFAULT_CELL_TIMEOUT


def pool_timeout() -> float:
    """Seconds one graded pool may take: half the cell's limit, so that a hanging answer is
    reported by the pool (which rank waited on which line) rather than cut off by the cell's
    limit, and a test cell's other runs still fit. A correct answer takes 1 to 4 s."""
    return cell_timeout() / 2


# ----------------------------------------------------------------------------- feedback


def feedback_for_hang(err: HangError, name: str) -> str:
    blocked = err.blocked
    done = [r.rank for r in err.ranks if r.finished]
    parts = [f"{name}() never finished: it hung for {err.timeout:g} s."]
    for r in blocked:
        if r.line:
            parts.append(f"Rank {r.rank} was stuck at `{r.line}` (in {r.function}(), line {r.lineno}).")
        else:
            parts.append(f"Rank {r.rank} was stuck.")
    if done:
        parts.append(
            f"Rank(s) {', '.join(map(str, done))} had already returned, so they never reached "
            "that call. Every rank must reach every barrier and every collective: put "
            "dist.barrier() (or the all_reduce) where all ranks run it, not inside `if rank == 0:`."
        )
    return " ".join(parts)


def feedback_for_error(err: WorkerError, name: str) -> str:
    if err.exc_type == "NotImplementedError":
        return f"{name}() is not written yet: replace `raise NotImplementedError()` with your code."
    if isinstance(err, UnsendableResult):
        return (f"{name}() on rank {err.rank} gave back something the grader cannot read safely: "
                f"{err.exc_message[:300]}. Return plain numbers, strings, tensors, or lists and "
                "dicts of these.")
    if isinstance(err, RankDied):
        text = f"{name}() ended rank {err.rank}'s process: it {err.exc_message[:200]}."
    else:
        text = f"{name}() raised {err.exc_type[:80]} on rank {err.rank}: {err.exc_message[:500]}"
    tb = [line[:200] for line in err.remote_traceback.strip().splitlines()]
    if tb:
        text += "\n" + "\n".join(tb[-6:])
    return text


# ----------------------------------------------------------------------------- running answers

#: Answers that already hung in this kernel, with the feedback they got. A second test of the
#: same answer fails at once instead of waiting for another timeout, so a notebook whose every
#: answer hangs is still graded in bounded, short time. Keyed by the answer's code: an answer
#: that was fixed and run again is tried afresh.
_HUNG: dict[tuple, str] = {}


def _answer_key(fn, name: str) -> tuple:
    if isinstance(fn, type):  # a class answer: the code of its methods
        return (name,) + tuple((k, f.__code__.co_code, repr(f.__code__.co_consts), f.__code__.co_names)
                               for k, f in sorted(vars(fn).items()) if type(f) is types.FunctionType)
    code = fn.__code__
    return (name, code.co_code, repr(code.co_consts), code.co_names)


class Refused:
    """What the grader binds to the names of an answer cell it did not run (an answer cell
    holding more than definitions, see ``course_tools.definitions``): every test of that
    answer fails with ``reason``."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason

    def __repr__(self) -> str:
        return f"<{self.name}: not run during grading>"


def _require_function(fn, name: str, kind: str = "function") -> None:
    __tracebackhide__ = True
    if type(fn) is Refused:
        fail(f"{name}: {fn.reason}")
    if kind == "class":
        if not isinstance(fn, type):
            fail(f"{name} should be a class written with `class {name}:`, but it is "
                 f"{type(fn).__name__!r}. Run the cell that defines it, then this test again.")
        return
    if type(fn) is not types.FunctionType:
        fail(f"{name} should be a function written with `def {name}(...):`, but it is "
             f"{type(fn).__name__!r}. Run the cell that defines it, then this test again.")


def run_answer(harness: Callable, fn: Callable, *args, name: str, world_size: int = 3,
               timeout: float | None = None, kind: str = "function", **kwargs) -> list:
    """``run(harness, fn, *args, ...)`` on ``world_size`` ranks; return each rank's value.

    ``fn`` is the learner's function (called ``name`` in the feedback), or with
    ``kind="class"`` the learner's class; the harness calls it on every rank. A hang or a crash
    becomes :class:`CheckFailed` with advice. If ``fn`` already hung in an earlier test in this
    kernel, this fails at once with the same advice.
    """
    __tracebackhide__ = True
    _require_function(fn, name, kind)
    key = _answer_key(fn, name)
    if key in _HUNG:
        fail(f"Not run again: {_HUNG[key]}")
    kwargs.setdefault("echo", False)
    try:
        return run(harness, fn, *args, world_size=world_size, plain_results=True,
                   timeout=pool_timeout() if timeout is None else timeout, **kwargs)
    except HangError as e:
        _HUNG[key] = feedback_for_hang(e, name)
        fail(_HUNG[key])
    except KeyboardInterrupt:
        # The grader interrupts a cell that runs past its time limit: that was this answer.
        _HUNG[key] = f"{name}() was still running when the cell's time limit interrupted it."
        raise
    except WorkerError as e:
        fail(feedback_for_error(e, name))


def plain(value):
    """In a rank: ``value`` as plain data the grader can read back safely. Numbers become
    ``float``/``int``, one-element tensors stay tensors; anything else that is not plain data
    (None, bool, int, float, str, tensors, lists, tuples and dicts of these) becomes a short
    description, ``"<type> repr"``, so that the check can say what came back."""
    import numbers

    import torch

    if value is None or type(value) in (bool, int, float, str, bytes, torch.Tensor):
        return value
    if type(value) in (list, tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, dict) and all(type(k) in (int, str) for k in value):
        return {k: plain(v) for k, v in value.items()}
    if type(value).__module__ == "numpy" and "bool" in type(value).__name__:
        return bool(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, torch.Tensor):
        return value.detach().clone().as_subclass(torch.Tensor)
    try:
        shown = repr(value)[:80]
    except Exception:  # noqa: BLE001 - a learner's __repr__ may fail
        shown = "?"
    return f"<{type(value).__name__}> {shown}"


def _call_in_worker(fn, args, kwargs):
    """In the worker: the answer's value, or the exception it raised (as data, not raised)."""
    try:
        return {"value": plain(fn(*args, **kwargs))}
    except Exception as e:  # noqa: BLE001 - what the answer raised is the result
        try:
            message = str(e)[:300]
        except Exception:  # noqa: BLE001 - a learner's __str__ may fail
            message = "?"
        return {"raised": type(e).__name__[:80], "is_value_error": isinstance(e, ValueError),
                "message": message}


def call(fn: Callable, *args, name: str, timeout: float | None = None, **kwargs) -> dict:
    """Call a single-process answer once, in a worker process (never in this kernel).

    Returns ``{"value": ...}`` or, if it raised an ``Exception``, ``{"raised": type name,
    "is_value_error": bool, "message": str}``. A hang is reported like :func:`run_answer`'s.
    """
    __tracebackhide__ = True
    return run_answer(_call_in_worker, fn, args, kwargs, name=name, world_size=1,
                      timeout=timeout, init_process_group=False)[0]


def forget_hangs() -> None:
    """Let every answer be tried again (after the learner re-ran a fixed answer cell)."""
    _HUNG.clear()


# ----------------------------------------------------------------------------- files


class scratch:
    """``with scratch() as folder:`` a new empty folder for one check, removed afterwards."""

    def __enter__(self) -> str:
        import tempfile

        self.folder = tempfile.mkdtemp(prefix="grader-")
        return self.folder

    def __exit__(self, *exc) -> None:
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)
