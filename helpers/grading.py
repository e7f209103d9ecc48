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

__all__ = ["run_answer", "GRADER_TIMEOUT", "feedback_for_hang", "feedback_for_error"]

#: Seconds a graded pool may take. Answers here are tiny; anything slower is a hang.
GRADER_TIMEOUT = float(os.environ.get("COURSE_GRADER_TIMEOUT", "20"))


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


def run_answer(harness: Callable, *args, name: str, world_size: int = 3,
               timeout: float | None = None, **kwargs) -> list:
    """``run(harness, *args, ...)``; a hang or a crash becomes an ``AssertionError`` with advice.

    ``name`` is the learner's function's name, used in the feedback.
    """
    try:
        return run(harness, *args, world_size=world_size,
                   timeout=GRADER_TIMEOUT if timeout is None else timeout, **kwargs)
    except HangError as e:
        raise AssertionError(feedback_for_hang(e, name)) from None
    except WorkerError as e:
        raise AssertionError(feedback_for_error(e, name)) from None
