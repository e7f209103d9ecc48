"""Run a learner's answer in worker processes and turn what went wrong into feedback that teaches.

Used by every depth's checks (:mod:`helpers.grading.beginner`, ``developer``, ``researcher``),
which the exercises notebooks' test cells call. Each check runs the learner's function in
real processes through :func:`helpers.spawn.run`: on the ranks of a gloo pool
(:func:`run_answer`), or in one worker process for an answer that is not distributed
(:func:`call`). Every run is bounded in time, so an answer that hangs fails its own test cell
and the rest of the notebook is still graded.

Where the answer comes from:

* in JupyterLab (and ``nbgrader validate``) the learner ran their cell in their own kernel, and
  the test cell passes the function itself, which is shipped to the ranks with cloudpickle;
* under ``nbgrader autograde`` the grading kernel never runs a learner's cell: the course's
  execute step (:mod:`course_tools.autograde`) calls :func:`record` instead, which keeps the
  cell's source as text and binds each name the cell defines to a :class:`Recorded` answer.
  A check given a :class:`Recorded` answer ships the source to every rank, which runs the
  instructor's setup cells and the learner's cells the answer needs, in notebook order, as
  JupyterLab would (any valid Python: top-level code, decorators, base classes), each under
  ``/answer-cells/cell_<i>.py`` in :mod:`linecache` so that tracebacks and hang reports quote
  the learner's lines, with :data:`TOP_LEVEL_SECONDS` for a cell's top level, then looks the
  answer up by name.

A check that passes prints one line, ``✓ ...`` (:func:`passed`); one that fails raises
:class:`CheckFailed`, an ``AssertionError`` that Jupyter shows as its message alone, without
a traceback through these helpers.
"""

from __future__ import annotations

import ast
import linecache
import os
import types
from pathlib import Path
from typing import Callable

from helpers.spawn import HangError, RankDied, UnsendableResult, WorkerError, run

__all__ = ["CheckFailed", "fail", "passed", "run_answer", "call", "pool_timeout", "cell_timeout",
           "feedback_for_hang", "feedback_for_error", "forget_hangs", "scratch", "plain", "record",
           "Recorded", "TOP_LEVEL_SECONDS"]

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
    if type(fn) is Recorded:  # an answer recorded under autograde: the sources its ranks run
        return (name, fn.cell, tuple(c.source for c in _program(fn)))
    if isinstance(fn, type):  # a class answer: the code of its methods
        return (name,) + tuple((k, f.__code__.co_code, repr(f.__code__.co_consts), f.__code__.co_names)
                               for k, f in sorted(vars(fn).items()) if type(f) is types.FunctionType)
    code = fn.__code__
    return (name, code.co_code, repr(code.co_consts), code.co_names)


# ----------------------------------------------------------------------------- recorded cells
# Under autograde: what the kernel keeps of each cell instead of running a learner's (``record``),
# and what a rank does with it (``_load_answer``).

#: Seconds the top level of one cell may run in a rank before it is stopped (SIGALRM): a cell's
#: top level runs again in every rank of every test of its answer.
TOP_LEVEL_SECONDS = 5.0

#: Where a recorded cell's lines live in :mod:`linecache` (kernel and ranks): tracebacks and hang
#: reports quote them.
CELL_FILE = "/answer-cells/cell_{}.py"


class _Cell(tuple):
    """One recorded cell: ``(index, filename, source, trusted, binds, loads)``."""

    __slots__ = ()

    index = property(lambda self: self[0])
    filename = property(lambda self: self[1])
    source = property(lambda self: self[2])
    trusted = property(lambda self: self[3])  # the instructor's (setup) cell, run in the kernel too
    binds = property(lambda self: self[4])  # names the cell's top level may bind
    loads = property(lambda self: self[5])  # every name the cell reads, in functions too


#: The notebook's recorded cells, in the order the grader reached them (index -> cell).
_CELLS: dict[int, _Cell] = {}


class Recorded:
    """An answer the grading kernel did not run: the name a learner's cell defines. A check
    given it runs the cell in each rank and calls what the name holds there."""

    __slots__ = ("name", "cell")

    def __init__(self, name: str, cell: int):
        self.name, self.cell = name, cell

    def __repr__(self) -> str:
        return f"<{self.name}: recorded from cell {self.cell}; it runs in the test workers>"


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp,
           ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _top_level(tree: ast.Module):
    """The nodes of the module's own scope (not inside a function, class or comprehension)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))


def _names(tree: ast.Module) -> tuple[frozenset, frozenset, frozenset]:
    """(names the module scope binds, those bound by imports, names read anywhere)."""
    binds, imports = set(), set()
    for node in _top_level(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            binds.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            binds.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
    loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return frozenset(binds | imports), frozenset(imports), frozenset(loads)


def _literal_bindings(tree: ast.Module) -> dict:
    """``NAME = plain value`` statements of the cell's top level, as values (read, not run)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            out.update({t.id: value for t in node.targets})
    return out


def _remember_lines(filename: str, source: str) -> None:
    lines = source.splitlines(True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[filename] = (len(source), None, lines, filename)  # mtime None: never dropped


def record(index: int, source: str, namespace: dict, trusted: bool = False) -> None:
    """Keep cell ``index`` of the notebook being graded, without running it (the grader's execute
    step calls this in the grading kernel, for every code cell that is not a test).

    A learner's cell (``trusted=False``): each name it defines is bound in ``namespace`` to a
    :class:`Recorded` answer, and each ``NAME = plain value`` to that value (read with
    :func:`ast.literal_eval`, which runs nothing). An instructor's setup cell (``trusted=True``)
    runs in the kernel as usual; it is kept so that the ranks run it before the answers.
    A cell that is not Python raises its ``SyntaxError`` here, as it would in JupyterLab.
    """
    filename = CELL_FILE.format(index)
    _remember_lines(filename, source)
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError) as e:
        _CELLS.pop(index, None)
        if isinstance(e, SyntaxError):
            raise SyntaxError(f"{e.msg} (notebook commands such as `!pip` or `%time` are not run "
                              "when grading)", (filename, e.lineno, e.offset, e.text)) from None
        raise
    binds, imports, loads = _names(tree)
    _CELLS[index] = _Cell((index, filename, source, trusted, binds, loads))
    if trusted:
        return
    literal = _literal_bindings(tree)
    for name in sorted(binds - imports):
        if name.startswith("__") and name.endswith("__"):
            continue
        namespace[name] = literal[name] if name in literal else Recorded(name, index)


def _program(answer: Recorded) -> tuple:
    """The cells a rank runs for ``answer``, in notebook order: every instructor setup cell
    before the test, the answer's own cell, and (transitively) for each name these read that no
    instructor's cell binds, the learner's cell that bound it last (a helper, an import)."""
    cells = [c for c in sorted(_CELLS.values()) if c.trusted or c.index == answer.cell]
    if not any(c.index == answer.cell for c in cells):
        return ()
    wanted = {c.index for c in cells}
    todo = list(cells)
    while todo:
        cell = todo.pop()
        for name in cell.loads:
            binders = [c for c in _CELLS.values() if name in c.binds and c.index != cell.index
                       and (c.index < cell.index or not cell.trusted)]
            if not binders or (not cell.trusted and any(c.trusted for c in binders)):
                continue
            last = max(binders)
            if last.index not in wanted and not last.trusted:
                wanted.add(last.index)
                todo.append(last)
    return tuple(sorted(c for c in _CELLS.values() if c.index in wanted))


class AnswerCellFailed(Exception):
    """In a rank: a recorded cell could not be run or did not define the answer (its message
    is the test's feedback)."""


class _TopLevelTooLong(BaseException):
    """In a rank: SIGALRM, the top level of a cell ran past :data:`TOP_LEVEL_SECONDS`."""


def _too_long(signum, frame):
    raise _TopLevelTooLong


def _load_answer(cells: tuple, name: str, kind: str, answer_cell: int, seconds: float):
    """In a rank: run ``cells`` in one fresh namespace, as the notebook's kernel would, and
    return what ``name`` holds."""
    import signal
    import traceback

    import builtins

    namespace = {"__name__": "__main__", "__builtins__": builtins}
    for cell in cells:
        _remember_lines(cell.filename, cell.source)
        whose = "the cell that defines " + name if cell.index == answer_cell else f"cell {cell.index}"
        previous = signal.signal(signal.SIGALRM, _too_long)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            exec(compile(cell.source, cell.filename, "exec"), namespace)
        except _TopLevelTooLong:
            raise AnswerCellFailed(
                f"The top level of {whose} was still running after {seconds:g} s in a worker, "
                f"so it was stopped and {name} was never defined. During grading each worker runs "
                "your answer cell before every test, as Jupyter runs it when you press Shift-Enter: "
                "code outside your functions (a loop, a long computation, a call of a training "
                "run) must finish at once. Move it inside a function, or delete it."
            ) from None
        except Exception as e:  # noqa: BLE001 - what the cell raised is the feedback
            if cell.trusted:
                raise
            tb = traceback.format_exception(type(e), e, e.__traceback__.tb_next)
            raise AnswerCellFailed(
                f"Running {whose} in a worker raised {type(e).__name__}, so {name} was never "
                f"defined: {str(e)[:300]}\n" + "".join(tb[-4:])[-1500:]
                + "\nRun that cell in Jupyter: it must run without an error on its own."
            ) from None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    if name not in namespace:
        raise AnswerCellFailed(f"After its cell ran, {name} was not defined: write `def {name}(...):` "
                               "at the top level of the answer cell (not inside an `if`).")
    fn = namespace[name]
    problem = _not_the_kind(fn, name, kind)
    if problem:
        raise AnswerCellFailed(problem)
    return fn


def _recorded_in_rank(harness, cells, name, kind, answer_cell, seconds, *args, **kwargs):
    """In a rank: the recorded answer, then the check's harness on it."""
    fn = _load_answer(cells, name, kind, answer_cell, seconds)
    return harness(fn, *args, **kwargs)


def _not_the_kind(fn, name: str, kind: str) -> str | None:
    if kind == "class":
        if not isinstance(fn, type):
            return (f"{name} should be a class written with `class {name}:`, but it is "
                    f"{type(fn).__name__!r}. Run the cell that defines it, then this test again.")
        return None
    if type(fn) is not types.FunctionType:
        return (f"{name} should be a function written with `def {name}(...):`, but it is "
                f"{type(fn).__name__!r}. Run the cell that defines it, then this test again.")
    return None


def _require_function(fn, name: str, kind: str = "function") -> None:
    __tracebackhide__ = True
    if type(fn) is Recorded:
        return  # checked in the ranks, where it is defined
    problem = _not_the_kind(fn, name, kind)
    if problem:
        fail(problem)


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
    if type(fn) is Recorded:
        cells = _program(fn)
        if not cells:
            fail(f"{name}: its cell was not recorded by the grader. Run the cell that defines it, "
                 "then this test again.")
        key = _answer_key(fn, name)
        args = (harness, cells, name, kind, fn.cell, TOP_LEVEL_SECONDS, *args)
        harness, fn = _recorded_in_rank, None
    else:
        key = _answer_key(fn, name)
    if key in _HUNG:
        fail(f"Not run again: {_HUNG[key]}")
    kwargs.setdefault("echo", False)
    try:
        if fn is None:
            return run(harness, *args, world_size=world_size, plain_results=True,
                       timeout=pool_timeout() if timeout is None else timeout, **kwargs)
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
        if e.exc_type == "AnswerCellFailed":
            fail(e.exc_message[:2500])
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


# ----------------------------------------------------------------------------- what ranks print
# Who prints what is read in the kernel, from each rank's own output pipes (``run(outputs=...)``),
# never from a capture inside the rank, which the answer running there could rewrite. A harness
# writes a line holding a secret of the kernel's on both streams right before it calls the
# answer: what comes after the first such line is what the call (and anything after it) wrote.
# The answer's cell ran its top level earlier, so its prints there come before and do not count;
# nothing a rank does can move a line it wrote after the marker to before it.


def marker(secret: str) -> str:
    """The line a harness writes before calling the answer (``secret``: the kernel's nonce)."""
    return f"[grader {secret}] the answer is called now"


def announce(secret: str) -> None:
    """In a rank, right before the harness calls the answer: write :func:`marker` on both
    streams, after whatever is still buffered."""
    import sys

    line = (marker(secret) + "\n").encode()
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
        os.write(fd, line)


def printed(outputs: list, secret: str) -> list[dict]:
    """Per rank, ``{"stdout": text, "stderr": text}``: what it wrote after its marker (all it
    wrote if the marker never came: nothing a rank withholds makes it look quieter)."""
    line = marker(secret)
    said = []
    for out in outputs:
        streams = {}
        for name in ("stdout", "stderr"):
            lines = out.get(name, [])
            at = next((i for i, text in enumerate(lines) if text == line), None)
            streams[name] = "\n".join(lines if at is None else lines[at + 1:])
        said.append(streams)
    return said


def secret() -> str:
    """A fresh nonce of the kernel's."""
    import secrets

    return secrets.token_hex(8)


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
