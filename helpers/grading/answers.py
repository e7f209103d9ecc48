"""Run a learner's answer on real ranks and turn what went wrong into feedback that teaches.

Used by the graded cells of every lesson (visible and hidden tests); see
``solutions/*/`` for the exercises. Every check runs the learner's function in a real gloo
pool through :func:`helpers.spawn.run`, with a bounded timeout, so an answer that hangs fails
its own test cell and the rest of the notebook is still graded.
"""

from __future__ import annotations

import os
from typing import Callable

from helpers.spawn import HangError, WorkerError, run

__all__ = ["run_answer", "GRADER_TIMEOUT", "feedback_for_hang", "feedback_for_error",
           "forget_hangs", "call_answer"]

#: Seconds a graded pool may take. Answers here are tiny (a correct one, slow writes
#: included, finishes in about 2 s); anything slower is a hang.
GRADER_TIMEOUT = float(os.environ.get("COURSE_GRADER_TIMEOUT", "10"))

#: Answers that already hung in this kernel, with the feedback they got. A second test of
#: the same answer fails at once instead of waiting for another timeout, so a notebook
#: whose every answer hangs is still graded in bounded, short time.
_HUNG: dict[str, str] = {}


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
    if err.exc_type == "AssertionError":  # a check the grader ran inside the rank
        return f"On rank {err.rank}: {err.exc_message}"
    text = f"{name}() raised {err.exc_type} on rank {err.rank}: {err.exc_message}"
    tb = err.remote_traceback.strip().splitlines()
    if tb:
        text += "\n" + "\n".join(tb[-6:])
    return text


def _answer_key(name: str, args, kwargs) -> tuple:
    """The answer's name and its code: a redefined (fixed) answer is tried afresh."""
    import sys

    candidates = [a for a in list(args) + list(kwargs.values()) if getattr(a, "__name__", None) == name]
    if not candidates:  # the harness calls the answer as a notebook global
        main = sys.modules.get("__main__")
        found = getattr(main, name, None) if main is not None else None
        candidates = [found] if found is not None else []
    codes = []
    for a in candidates:
        code = getattr(a, "__code__", None)
        if code is not None:
            codes.append((code.co_code, repr(code.co_consts), code.co_names))
    return (name, tuple(codes))


def run_answer(harness: Callable, *args, name: str, world_size: int = 3,
               timeout: float | None = None, **kwargs) -> list:
    """``run(harness, *args, ...)``; a hang or a crash becomes an ``AssertionError`` with advice.

    ``name`` is the learner's function's name, used in the feedback. If that function
    already hung in an earlier test in this kernel, this fails at once with the same advice.
    """
    key = _answer_key(name, args, kwargs)
    if key in _HUNG:
        raise AssertionError(f"Not run again: {_HUNG[key]}")
    try:
        return run(harness, *args, world_size=world_size,
                   timeout=GRADER_TIMEOUT if timeout is None else timeout, **kwargs)
    except HangError as e:
        _HUNG[key] = feedback_for_hang(e, name)
        raise AssertionError(_HUNG[key]) from None
    except KeyboardInterrupt:
        # The grader interrupts a cell that runs past its time limit: that was this answer.
        _HUNG[key] = f"{name}() was still running when the cell's time limit interrupted it."
        raise
    except WorkerError as e:
        raise AssertionError(feedback_for_error(e, name)) from None


def call_answer(fn: Callable, *args, name: str, timeout: float | None = None, **kwargs):
    """Call a single-process answer in this kernel, bounded in time like :func:`run_answer`.

    An answer still running after ``timeout`` seconds (an endless loop) is stopped with an
    ``AssertionError`` that says so, and is not called again by later tests of this kernel;
    an exception it raises propagates unchanged (tests may expect a ``ValueError``).
    Uses ``SIGALRM``, so call it from the main thread (as notebook cells run).
    """
    import signal
    import threading

    key = _answer_key(name, (fn,), {})
    if key in _HUNG:
        raise AssertionError(f"Not run again: {_HUNG[key]}")
    limit = GRADER_TIMEOUT if timeout is None else timeout
    if threading.current_thread() is not threading.main_thread():
        return fn(*args, **kwargs)

    class _TooSlow(BaseException):
        pass

    def alarm(signum, frame):
        raise _TooSlow()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        return fn(*args, **kwargs)
    except _TooSlow:
        _HUNG[key] = (f"{name}() did not return within {limit:g} s: look for a loop that never "
                      "ends or a wait for something that never comes.")
        raise AssertionError(_HUNG[key]) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def forget_hangs() -> None:
    """Let every answer be tried again (after the learner re-ran a fixed answer cell)."""
    _HUNG.clear()
