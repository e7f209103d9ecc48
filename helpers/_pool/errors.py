"""The pool's exceptions and rank reports (re-exported by :mod:`helpers.spawn`).

Callers dispatch on the type: :class:`HangError` (fn did not finish in time),
:class:`JoinTimeout` (ranks did not even join the group), and :class:`WorkerError`'s
subclasses :class:`RankRaised`, :class:`RankDied`, :class:`UnsendableResult`,
:class:`BadMessage`. ``WorkerError.rank/exc_type/exc_message/remote_traceback`` hold for all.
"""

from __future__ import annotations

import dataclasses
import re
import signal

__all__ = ["RankState", "HangError", "JoinTimeout", "WorkerError", "RankRaised", "RankDied",
           "UnsendableResult", "BadMessage"]


def _place(filename: str | None) -> str:
    """A readable place name: notebook cells are named as such, not by their temp file."""
    if filename and (re.search(r"ipykernel_\d+", filename) or filename.startswith("/answer-cells/")):
        return "a notebook cell"
    return filename or "?"


@dataclasses.dataclass
class RankState:
    """Where one rank was when the pool stopped it.

    ``phase``: ``"starting"`` (not yet in the process group), ``"running"`` (inside fn),
    ``"returning"`` (fn returned; its result was still being sent) or ``"finished"``.
    """

    rank: int
    finished: bool
    function: str | None = None  # the innermost function of the user's code
    filename: str | None = None
    lineno: int | None = None
    line: str | None = None  # that source line, stripped
    waiting_in: str | None = None  # the innermost library function (e.g. "barrier")
    stack: list[tuple[str, int, str]] = dataclasses.field(default_factory=list)
    seconds: float | None = None  # when it finished, from the start of fn
    phase: str = "running"

    def __post_init__(self):
        if self.finished:
            self.phase = "finished"

    def describe(self) -> str:
        r = self.rank
        if self.finished:
            return f"rank {r}: finished" + (
                f" after {self.seconds:.2f} s" if self.seconds is not None else "")
        if self.phase == "starting":
            if self.function is not None:
                return f"rank {r}: still starting, not yet in the process group: at {self._at()}"
            inside = f" (in {self.waiting_in}())" if self.waiting_in else ""
            return f"rank {r}: still starting, not yet in the process group{inside}"
        if self.phase == "returning":
            return f"rank {r}: its function had returned; it was still sending the result back"
        if self.function is None:
            if self.waiting_in:
                return f"rank {r}: blocked in {self.waiting_in}() (no line of your code on its stack)"
            return f"rank {r}: blocked (its stack could not be read)"
        return f"rank {r}: blocked at {self._at()}"

    def _at(self) -> str:
        where = f"{_place(self.filename)}, line {self.lineno}"
        what = f"`{self.line}`" if self.line else f"line {self.lineno}"
        inside = f" (waiting in {self.waiting_in}())" if self.waiting_in else ""
        return f"{what} inside {self.function}() ({where}){inside}"


class HangError(TimeoutError):
    """The pool's function did not finish on every rank within ``timeout`` seconds.

    The clock starts once every rank has joined the process group. ``ranks`` holds a
    :class:`RankState` per rank: finished, or where it was blocked.
    """

    def __init__(self, timeout: float, ranks: list[RankState], fn_name: str):
        self.timeout = timeout
        self.ranks = ranks
        self.fn_name = fn_name
        blocked = [r.rank for r in ranks if not r.finished]
        lines = [
            f"{fn_name}() did not finish on rank(s) {', '.join(map(str, blocked))} "
            f"within {timeout:g} s. Where each rank was:"
        ]
        lines += ["  " + r.describe() for r in ranks]
        lines.append(
            "Every rank must reach every collective (barrier, all_reduce, ...) the same number "
            "of times. The pool was stopped; no process is left."
        )
        super().__init__("\n".join(lines))

    @property
    def blocked(self) -> list[RankState]:
        return [r for r in self.ranks if not r.finished]


class JoinTimeout(TimeoutError):
    """Some ranks did not join the process group within ``start_timeout`` seconds.

    This is the pool's start-up, before ``fn`` runs (with ``init_process_group=False``: before
    ``fn`` is called), so it says nothing about ``fn``. ``ranks`` as in :class:`HangError`.
    """

    def __init__(self, start_timeout: float, ranks: list[RankState], fn_name: str):
        self.start_timeout = start_timeout
        self.ranks = ranks
        self.fn_name = fn_name
        late = [r.rank for r in ranks if r.phase == "starting"]
        who = f"rank {late[0]} did" if len(late) == 1 else f"ranks {', '.join(map(str, late))} did"
        lines = [f"{who} not join the process group within {start_timeout:g} s, before "
                 f"{fn_name}() could start. Where each rank was:"]
        lines += ["  " + r.describe() for r in ranks]
        lines.append("The machine may be very busy: run again, or pass a larger start_timeout. "
                     "The pool was stopped; no process is left.")
        super().__init__("\n".join(lines))


class WorkerError(RuntimeError):
    """A rank raised an exception, died, or sent back something that cannot be used.

    ``rank``, ``exc_type``, ``exc_message`` and ``remote_traceback`` describe the first failure.
    Catch a subclass to tell the cases apart: :class:`RankRaised`, :class:`RankDied`,
    :class:`UnsendableResult`, :class:`BadMessage`.
    """

    def __init__(self, rank: int, exc_type: str, exc_message: str, remote_traceback: str = "",
                 summary: str | None = None):
        self.rank = rank
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.remote_traceback = remote_traceback
        head = summary or f"rank {rank} raised {exc_type}: {exc_message}"
        text = head
        if remote_traceback:
            text += f"\n\n--- traceback on rank {rank} ---\n{remote_traceback.rstrip()}"
        text += "\n\nThe other ranks were stopped; no process is left."
        super().__init__(text)


class RankRaised(WorkerError):
    """``fn`` raised an exception on ``rank`` (``SystemExit`` included).

    ``exc_type`` is the exception's class name; the exception object itself stays in the rank.
    """


class RankDied(WorkerError):
    """The rank's process ended without reporting a result: a crash, ``os._exit``, a kill.

    ``exitcode`` is the process's exit code, negative for a signal (``-9`` for SIGKILL);
    ``remote_traceback`` holds its last stderr lines. ``exc_type`` is ``"ProcessDied"``.
    """

    def __init__(self, rank: int, exitcode: int | None, stderr_tail: str):
        self.exitcode = exitcode
        if exitcode is not None and exitcode < 0:
            try:
                how = f"was killed by signal {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"was killed by signal {-exitcode}"
        else:
            how = f"exited with code {exitcode} before returning"
        super().__init__(
            rank, "ProcessDied", how, stderr_tail,
            summary=(f"rank {rank} {how} (a crash in C++ code, os._exit, or the machine "
                     "killing it). Its last stderr lines follow."),
        )


class UnsendableResult(WorkerError):
    """What ``fn`` returned on ``rank`` cannot be sent back or read safely.

    ``type_name`` names the offending type (``"_thread.lock"``); ``exc_message`` says why.
    With ``plain_results=True`` anything but plain data ends here.
    """

    def __init__(self, rank: int, type_name: str, reason: str, advice: str):
        self.type_name = type_name
        super().__init__(
            rank, "TypeError", reason,
            summary=f"rank {rank} returned a {type_name}, which {reason}. {advice}",
        )


class BadMessage(WorkerError):
    """Rank ``rank`` wrote bytes on its result pipe that are not a message of the pool.

    Only code that writes on the pool's private pipe does this (never a normal function);
    the bytes were decoded as JSON only, so nothing they hold ran in the caller.
    """

    def __init__(self, rank: int, what: str):
        super().__init__(
            rank, "BadMessage", what,
            summary=(f"rank {rank} wrote something on the pool's result pipe that is not a "
                     f"message of the pool: {what}. It was not read further."),
        )


for _cls in (RankState, HangError, JoinTimeout, WorkerError, RankRaised, RankDied,
             UnsendableResult, BadMessage):
    _cls.__module__ = "helpers.spawn"  # their public home, in reprs and tracebacks
