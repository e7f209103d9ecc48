"""A gloo worker pool for notebooks: run one function on N real ranks, from a cell.

Taught in ``notebooks/start/00_start_here.ipynb``; used by every lesson of the course.

``run(fn, *args, world_size=2, timeout=60, **kwargs)`` starts ``world_size`` processes, joins
them into a fresh gloo process group (set up exactly as ``torchrun`` would: ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), calls ``fn(*args, **kwargs)``
on every rank, streams every rank's output into the calling cell, and returns the ranks'
return values in rank order.

``run(fn, world_size=4, nproc_per_node=2)`` lays the ranks out as two simulated nodes of two,
with the variables ``torchrun --nnodes=2 --nproc_per_node=2`` gives each worker
(``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` = the node's index, ``GROUP_WORLD_SIZE``,
``ROLE_*``, ``TORCHELASTIC_*``), and gives each node its own scratch folder in the environment
variable ``NODE_LOCAL_DIR`` (created empty before the ranks start, removed when the pool ends):
work done once per node (a download, a cache) goes there, by local rank 0.

``run(fn, plain_results=True)`` is for callers that must not trust the ranks' code (grading):
results must be plain data and are read with ``torch.load(weights_only=True)``. Whatever the
option, every message from a rank (results, errors, timings) is decoded without pickle.

How it stays fast and safe from a notebook kernel:

* Ranks are forked from a *fork server* that imported torch once and never ran a torch op,
  so forking is cheap (no per-rank ``import torch``) and safe (a kernel that already used
  torch's OpenMP pool is never forked, which would deadlock).
* ``fn`` is shipped by value with cloudpickle, so functions, closures and lambdas defined in
  notebook cells work (plain ``spawn`` cannot find them in ``__main__``).
* The pool adds no collective around ``fn``. Ranks that finish stay alive until every rank
  has finished, so a rank stuck in a barrier waits exactly as in a real job instead of
  failing because its peer exited.
* A hang becomes :class:`HangError` saying where each rank is blocked (read with
  :mod:`faulthandler`, which works while a rank is inside a C++ collective); an exception
  or a crash on any rank becomes :class:`WorkerError` at once. Either way the whole pool is
  killed; no process outlives a call, an interrupt (KeyboardInterrupt reaches the caller)
  or the kernel itself.
"""

from __future__ import annotations

import dataclasses
import linecache
import multiprocessing as mp
import os
import re
import selectors
import signal
import sys
import time
import traceback
from multiprocessing import context as mp_context, popen_forkserver
from multiprocessing.connection import Connection
from typing import Any, Callable

from helpers._pool import messages as _messages

__all__ = ["run", "HangError", "WorkerError", "RankRaised", "RankDied", "UnsendableResult",
           "BadMessage", "RankState", "MAX_WORLD_SIZE", "NODE_LOCAL_DIR", "live_ranks",
           "warm_up"]

MAX_WORLD_SIZE = 32
#: The environment variable that holds each simulated node's own scratch folder.
NODE_LOCAL_DIR = "NODE_LOCAL_DIR"
# Imported once by the fork server, so no rank pays for them. torch._dynamo is imported by
# DDP's constructor and costs about 1.5 s of CPU per rank otherwise.
_PRELOAD = ["helpers.spawn", "torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo",
            "cloudpickle"]
_MAX_LINES_PER_RANK = 2000  # per stream; more is drained but not shown

# Lines that gloo and torch print on every start-up. They say nothing about the lesson,
# so they are hidden unless show_warnings=True.
_NOISE = [
    re.compile(r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks"),
    re.compile(r"^\[W\d+ .*(ProcessGroupGloo|socket|TCPStore|Utils)\.c(pp|c)"),
    re.compile(r"^\[W\d+ .*(gloo/transport|c10d)"),
    re.compile(r"^\s*warnings\.warn\($"),
    re.compile(r"UserWarning: .*(set_num_threads|TypedStorage)"),
]


# ----------------------------------------------------------------------------- errors


@dataclasses.dataclass
class RankState:
    """Where one rank was when the pool stopped it."""

    rank: int
    finished: bool
    function: str | None = None  # the innermost function of the user's code
    filename: str | None = None
    lineno: int | None = None
    line: str | None = None  # that source line, stripped
    waiting_in: str | None = None  # the innermost library function (e.g. "barrier")
    stack: list[tuple[str, int, str]] = dataclasses.field(default_factory=list)
    seconds: float | None = None  # when it finished, from the start of fn

    def describe(self) -> str:
        if self.finished:
            return f"rank {self.rank}: finished" + (
                f" after {self.seconds:.2f} s" if self.seconds is not None else ""
            )
        if self.function is None:
            return f"rank {self.rank}: blocked (its stack could not be read)"
        where = f"{_place(self.filename)}, line {self.lineno}"
        what = f"`{self.line}`" if self.line else f"line {self.lineno}"
        inside = f" (waiting in {self.waiting_in}())" if self.waiting_in else ""
        return f"rank {self.rank}: blocked at {what} inside {self.function}() ({where}){inside}"


class HangError(TimeoutError):
    """The pool's function did not finish on every rank within ``timeout`` seconds.

    ``ranks`` holds a :class:`RankState` per rank: finished, or where it was blocked.
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

    ``type_name`` names the offending type (``"threading.Lock"``); ``exc_message`` says why.
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


# ----------------------------------------------------------------------------- the rank side


class _Fd:
    """A raw file descriptor that multiprocessing can hand to a forked rank."""

    def __init__(self, fd: int):
        self.conn = Connection(fd, readable=False)

    def take(self) -> int:
        return self.conn.fileno()


def _install_parent_death_signal() -> None:
    """Ask Linux to SIGKILL this rank when the fork server (its parent) dies."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the release pipe still ends the rank
        pass


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where one rank sits: its global rank and, on its simulated node, its local rank."""

    rank: int
    world_size: int
    nproc_per_node: int

    @property
    def local_rank(self) -> int:
        return self.rank % self.nproc_per_node

    @property
    def node(self) -> int:
        return self.rank // self.nproc_per_node

    @property
    def nnodes(self) -> int:
        return self.world_size // self.nproc_per_node

    def environment(self, port: int, run_id: str, node_dir: str, error_file: str) -> dict[str, str]:
        """The variables torchrun's elastic agent sets for this worker (torch 2.13,
        ``LocalElasticAgent._start_workers``), plus the node's scratch folder."""
        return {
            "RANK": str(self.rank), "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank), "LOCAL_WORLD_SIZE": str(self.nproc_per_node),
            "GROUP_RANK": str(self.node), "GROUP_WORLD_SIZE": str(self.nnodes),
            "ROLE_NAME": "default", "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_USE_AGENT_STORE": "True",  # the caller hosts the store, as the agent does
            "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
            "TORCHELASTIC_ERROR_FILE": error_file,
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            NODE_LOCAL_DIR: node_dir,
        }


def _rank_main(rank: int, payload: bytes, env: dict, cwd: str, path: list,
               out: _Fd, err: _Fd, stacks: _Fd, release: _Fd, results: _Fd,
               options: dict) -> None:
    """Entry point of one rank, inside a process forked by the fork server."""
    from helpers._pool import messages

    started = time.monotonic()
    server_pid = os.getppid()
    _install_parent_death_signal()
    if os.getppid() != server_pid:  # parent died before the signal was armed
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Jupyter's interrupt is for the kernel
    os.setpgrp()  # a terminal's ^C on the fork server must not reach ranks either

    os.dup2(out.take(), 1)
    os.dup2(err.take(), 2)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    import faulthandler

    stack_file = open(stacks.take(), "w", closefd=False)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable(file=sys.stderr, all_threads=False)  # a segfault prints its stack
    result_fd = results.take()

    os.environ.clear()
    os.environ.update(env)
    os.environ.update({"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": str(options["threads"])})
    if options["detail"]:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    sys.path[:] = path
    try:
        os.chdir(cwd)
    except OSError:
        pass

    import cloudpickle
    import torch
    import torch.distributed as dist

    torch.set_num_threads(options["threads"])
    dist.set_debug_level_from_env()

    t0 = time.monotonic()
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        if options["init"]:
            import datetime

            dist.init_process_group(
                "gloo", timeout=datetime.timedelta(seconds=options["group_timeout"])
            )
        messages.send(result_fd, messages.Joined(time.monotonic() - started))
        t0 = time.monotonic()
        value = fn(*args, **kwargs)
        sys.stdout.flush()
        sys.stderr.flush()
        msg = _result_message(value, options["plain"], time.monotonic() - t0)
    except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
        sys.stdout.flush()
        sys.stderr.flush()
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next))
        msg = messages.Raised(time.monotonic() - t0, type(e).__qualname__, str(e), tb)
    messages.send(result_fd, msg)
    sys.stdout.flush()
    sys.stderr.flush()
    # Stay alive until every rank has finished: a peer that exits early would make the
    # others fail with "Connection closed by peer" instead of showing the real hang.
    try:
        os.read(release.take(), 1)
    except OSError:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _result_message(value: Any, plain: bool, seconds: float):
    """``value`` serialised once with the pool's codec, or why it cannot be."""
    from helpers._pool import messages

    if plain:
        bad = messages.find_unplain(value)
        if bad is not None:
            where, type_name = bad
            inside = "" if where == "value" else f" (at {where.replace('value', 'the result', 1)})"
            return messages.Unsendable(seconds, type_name, f"is not plain data{inside}")
        dump = messages.dump_plain
    else:
        import cloudpickle

        dump = cloudpickle.dumps
    try:
        return messages.Returned(seconds, dump(value))
    except Exception as e:  # noqa: BLE001 - reported to the caller
        return messages.Unsendable(seconds, messages._type_name(value),
                                   f"cannot be serialised ({type(e).__name__}: {e})")


# ----------------------------------------------------------------------------- the caller side


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _launch_without_main(self, process_obj):
    """``popen_forkserver.Popen._launch``, minus re-running the caller's ``__main__``.

    multiprocessing re-imports the parent's main script in every child; ranks need nothing
    from it (the function travels by value), and a script without an
    ``if __name__ == "__main__":`` guard would start again in each rank.
    """
    import io
    from multiprocessing import forkserver, reduction, spawn as mp_spawn, util
    from multiprocessing.context import set_spawning_popen

    prep_data = mp_spawn.get_preparation_data(process_obj._name)
    prep_data.pop("init_main_from_path", None)
    prep_data.pop("init_main_from_name", None)
    buf = io.BytesIO()
    set_spawning_popen(self)
    try:
        reduction.dump(prep_data, buf)
        reduction.dump(process_obj, buf)
    finally:
        set_spawning_popen(None)
    self.sentinel, w = forkserver.connect_to_new_process(self._fds)
    parent_w = os.dup(w)
    self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
    with open(w, "wb", closefd=True) as f:
        f.write(buf.getbuffer())
    self.pid = forkserver.read_signed(self.sentinel)


class _Popen(popen_forkserver.Popen):
    _launch = _launch_without_main


class _RankProcess(mp_context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj):
        return _Popen(process_obj)


def _forget(sel, fileobj) -> None:
    try:
        sel.unregister(fileobj)
    except (KeyError, ValueError):
        pass


def _check(fn: Any, world_size: Any, timeout: Any, nproc_per_node: Any) -> int:
    """Refuse bad arguments with a message that says what to pass; the ranks per node."""
    import math

    if not callable(fn):
        hint = ""
        if fn is None or not isinstance(fn, (str, bytes, int, float)):
            hint = " Pass the function itself, e.g. run(train), not run(train())."
        raise TypeError(
            f"run() needs a function to call on every rank, got {type(fn).__name__} {fn!r:.60}."
            + hint
        )
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be a whole number of ranks, got {world_size!r}.")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(
            f"world_size must be between 1 and {MAX_WORLD_SIZE}, got {world_size}. "
            "Each rank is one process on this machine; 2 to 8 is plenty for every lesson."
        )
    if (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
            or not math.isfinite(timeout) or timeout <= 0):
        raise ValueError(
            f"timeout must be a positive, finite number of seconds, got {timeout!r}. "
            "It bounds how long fn may run on every rank before the pool reports a hang."
        )
    if nproc_per_node is None:
        return world_size
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int):
        raise TypeError(
            f"nproc_per_node must be a whole number of ranks per simulated node, got "
            f"{nproc_per_node!r}."
        )
    if nproc_per_node < 1 or world_size % nproc_per_node:
        raise ValueError(
            f"nproc_per_node={nproc_per_node} does not divide world_size={world_size} into "
            "nodes of equal size, as torchrun's --nproc_per_node does. Pass a positive divisor "
            f"of world_size (e.g. world_size=4, nproc_per_node=2 for 2 nodes of 2 ranks), or "
            "leave it out for one node."
        )
    return nproc_per_node


class _Stream:
    """Splits one rank's raw output into lines and prints them tagged with the rank."""

    def __init__(self, rank: int, name: str, sink, echo: bool, show_warnings: bool):
        self.rank, self.name, self.sink = rank, name, sink
        self.echo, self.show_warnings = echo, show_warnings
        self.buf = b""
        self.lines: list[str] = []
        self.hidden = 0

    def feed(self, data: bytes) -> None:
        self.buf += data
        *complete, self.buf = self.buf.split(b"\n")
        for raw in complete:
            self._line(raw.decode("utf-8", "replace").rstrip("\r"))

    def close(self) -> None:
        if self.buf:
            self._line(self.buf.decode("utf-8", "replace"))
            self.buf = b""
        if self.hidden:
            self._emit(f"[rank {self.rank}] ... {self.hidden} more lines not shown")

    def _line(self, text: str) -> None:
        if not self.show_warnings and any(p.search(text) for p in _NOISE):
            return
        if len(self.lines) >= _MAX_LINES_PER_RANK:
            self.hidden += 1
            return
        self.lines.append(text)
        self._emit(f"[rank {self.rank}] {text}")

    def _emit(self, text: str) -> None:
        if self.echo:
            print(text, file=self.sink, flush=True)


def _read_pipe(fd: int) -> tuple[bytes, bool]:
    """Everything readable now on a non-blocking pipe, and whether its writer has closed it."""
    chunks = []
    while True:
        try:
            data = os.read(fd, 1 << 20)
        except BlockingIOError:
            return b"".join(chunks), False
        except OSError:
            return b"".join(chunks), True
        if not data:
            return b"".join(chunks), True
        chunks.append(data)


def _read_available(fd: int) -> bytes:
    return _read_pipe(fd)[0]


_PEER_GONE = re.compile(r"Connection (reset|closed) by peer|Socket closed|Broken pipe")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+)$')
_TORCH_DIR = None
_HERE = os.path.abspath(__file__)


def _library_file(path: str) -> bool:
    global _TORCH_DIR
    if _TORCH_DIR is None:
        import torch

        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
    if path.startswith("<"):
        return True
    p = os.path.abspath(path)
    return p == _HERE or p.startswith(_TORCH_DIR) or p.startswith(_library_dirs())


_LIB_DIRS: tuple[str, ...] | None = None


def _library_dirs() -> tuple[str, ...]:
    """The standard library and site-packages: code that is not the learner's."""
    global _LIB_DIRS
    if _LIB_DIRS is None:
        import sysconfig

        paths = sysconfig.get_paths()
        dirs = {os.path.abspath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")
                if k in paths}
        _LIB_DIRS = tuple(sorted(dirs))
    return _LIB_DIRS


def _code_only(line: str) -> str:
    """A source line without its trailing comment and whitespace."""
    import io
    import tokenize

    line = line.strip()
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return line
    for tok in toks:
        if tok.type == tokenize.COMMENT:
            return line[: tok.start[1]].rstrip()
    return line


def _place(filename: str | None) -> str:
    """A readable place name: notebook cells are named as such, not by their temp file."""
    if filename and re.search(r"ipykernel_\d+", filename):
        return "a notebook cell"
    return filename or "?"


def _parse_stack(dump: str) -> list[tuple[str, int, str]]:
    """Frames (file, line, function) of the rank's main thread, innermost first."""
    blocks, current = [], []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            if current:
                blocks.append(current)
            current = []
            continue
        m = _FRAME.match(line)
        if m:
            current.append((m["file"], int(m["line"]), m["func"].strip()))
    if current:
        blocks.append(current)
    for frames in blocks:  # the main thread is the one running _rank_main
        if any(func == "_rank_main" for _, _, func in frames):
            return frames
    return blocks[0] if blocks else []


def _where(rank: int, frames: list[tuple[str, int, str]]) -> RankState:
    state = RankState(rank=rank, finished=False, stack=frames)
    inner_library = None
    for file, line, func in frames:  # innermost first
        if _library_file(file):
            if func not in ("wrapper", "_rank_main") and not file.startswith("<"):
                inner_library = inner_library or func
            continue
        state.function, state.filename, state.lineno = func, file, line
        state.line = _code_only(linecache.getline(file, line)) or None
        break
    if state.function is not None:
        # the library function the user's line called: the outermost library frame above it
        called = None
        for file, line, func in frames:
            if (file, line, func) == (state.filename, state.lineno, state.function):
                break
            if _library_file(file) and func != "wrapper":
                called = func
        state.waiting_in = called
    elif frames:
        state.waiting_in = inner_library
    return state


@dataclasses.dataclass(frozen=True)
class _Options:
    """How one call of :func:`run` runs (its keyword arguments, checked)."""

    world_size: int
    nproc_per_node: int
    timeout: float
    echo: bool = True
    detail: bool = False
    threads: int = 1
    init: bool = True
    show_warnings: bool = False
    plain: bool = False


@dataclasses.dataclass(eq=False)
class _Rank:
    """What the caller holds for one rank: its process, its pipes, what it has said."""

    rank: int
    process: Any
    stdout: _Stream
    stderr: _Stream
    stack_fd: int
    result_fd: int
    decoder: _messages.Decoder = dataclasses.field(default_factory=_messages.Decoder)
    joined: bool = False
    result: _messages.Returned | None = None

    @property
    def fds(self) -> list[int]:
        return [self.stack_fd, self.result_fd]


class _Pool:
    def __init__(self, fn, args, kwargs, options: _Options):
        import cloudpickle

        self.fn_name = getattr(fn, "__name__", type(fn).__name__)
        try:
            self.payload = cloudpickle.dumps((fn, args, kwargs))
        except Exception as e:
            raise TypeError(
                f"{self.fn_name} (or one of its arguments) cannot be sent to the ranks: "
                f"{type(e).__name__}: {e}. Pass plain data (numbers, tensors, lists, paths) and "
                "create locks, files and process groups inside the function."
            ) from e
        self.options = options
        self.ranks: list[_Rank] = []
        self.sel = selectors.DefaultSelector()
        self.store = None
        self.release_w: int | None = None
        self.scratch: str | None = None
        self.out_fds: list[int] = []
        self.t0 = 0.0
        self._blaming = False

    # -- lifecycle
    def start(self) -> None:
        import tempfile

        import torch.distributed as dist

        o = self.options
        # The store lives in the caller, on a port the OS picked and that stays bound:
        # two pools in two kernels can never pick the same rendezvous.
        self.store = dist.TCPStore("127.0.0.1", 0, o.world_size, True,
                                   wait_for_workers=False, use_libuv=True)
        self.scratch = tempfile.mkdtemp(prefix=f"helpers-spawn-{os.getpid()}-")
        for node in range(o.world_size // o.nproc_per_node):
            os.mkdir(os.path.join(self.scratch, f"node{node}"))
        os.mkdir(os.path.join(self.scratch, "errors"))
        ctx = _context()  # sets the fork server's preload
        release_r, self.release_w = os.pipe()
        release = _Fd(release_r)
        options = {"threads": o.threads, "detail": o.detail, "init": o.init, "plain": o.plain,
                   "group_timeout": o.timeout + 600}
        base_env = dict(os.environ)
        for rank in range(o.world_size):
            layout = _Layout(rank, o.world_size, o.nproc_per_node)
            env = {**base_env, **layout.environment(
                self.store.port, os.path.basename(self.scratch),
                os.path.join(self.scratch, f"node{layout.node}"),
                os.path.join(self.scratch, "errors", f"rank{rank}.json"))}
            pipes = [os.pipe() for _ in range(4)]  # stdout, stderr, stacks, results
            for r, _ in pipes:
                os.set_blocking(r, False)
            ends = [_Fd(w) for _, w in pipes]
            p = _RankProcess(
                target=_rank_main, name=f"helpers.spawn rank {rank}", daemon=False,
                args=(rank, self.payload, env, os.getcwd(), list(sys.path),
                      ends[0], ends[1], ends[2], release, ends[3], options),
            )
            record = _Rank(rank, p,
                           _Stream(rank, "stdout", sys.stdout, o.echo, o.show_warnings),
                           _Stream(rank, "stderr", sys.stderr, o.echo, o.show_warnings),
                           stack_fd=pipes[2][0], result_fd=pipes[3][0])
            self.ranks.append(record)
            self.out_fds += [pipes[0][0], pipes[1][0]]
            p.start()
            for end in ends:  # the rank holds its own copies now
                end.conn.close()
            self.sel.register(pipes[0][0], selectors.EVENT_READ, ("out", record.stdout))
            self.sel.register(pipes[1][0], selectors.EVENT_READ, ("out", record.stderr))
            self.sel.register(record.result_fd, selectors.EVENT_READ, ("result", record))
            self.sel.register(p.sentinel, selectors.EVENT_READ, ("exit", record))
        release.conn.close()
        self.t0 = time.monotonic()

    def wait(self) -> list:
        deadline = self.t0 + self.options.timeout
        while not all(r.result for r in self.ranks):
            left = deadline - time.monotonic()
            if left <= 0:
                self._read_results()  # what arrived in time counts
                if all(r.result for r in self.ranks):
                    break
                raise self._hang()
            for key, _ in self.sel.select(timeout=min(left, 0.5)):
                what, target = key.data
                if what == "out":
                    data = _read_available(key.fd)
                    if data:
                        target.feed(data)
                    else:
                        _forget(self.sel, key.fd)
                elif what == "result":
                    self._read_result(target)
                else:
                    _forget(self.sel, key.fileobj)
                    self._exited(target)
        self._drain()
        return [self._value(r) for r in self.ranks]

    # -- what ranks send
    def _read_results(self) -> None:
        for r in self.ranks:
            if r.result is None:
                self._read_result(r)

    def _read_result(self, r: _Rank) -> bool:
        """Read and act on whatever rank ``r`` has written on its result pipe; True at its end."""
        data, eof = _read_pipe(r.result_fd)
        if eof:
            _forget(self.sel, r.result_fd)
        if not data:
            return eof
        try:
            msgs = r.decoder.feed(data)
        except _messages.MessageError as e:
            self._drain()
            raise BadMessage(r.rank, str(e)) from None
        for msg in msgs:
            self._handle(r, msg)
        return eof

    def _handle(self, r: _Rank, msg) -> None:
        if isinstance(msg, _messages.Joined):
            r.joined = True
        elif isinstance(msg, _messages.Returned):
            if r.result is None:
                r.result = msg
        elif isinstance(msg, _messages.Unsendable):
            self._drain()
            raise UnsendableResult(r.rank, msg.type_name, msg.reason, self._advice())
        else:  # Raised
            if _PEER_GONE.search(msg.message):
                if self._blaming:
                    return  # one more rank that lost its peer: not the cause
                self._blame_a_dead_peer(r.rank)
            self._drain()
            raise RankRaised(r.rank, msg.exc_type, msg.message, msg.traceback)

    def _advice(self) -> str:
        if self.options.plain:
            return (f"Return plain data only: {_messages.PLAIN_TYPES} (e.g. float(x) for a "
                    "NumPy number, x.tolist() for an array).")
        return "Return plain data instead: numbers, lists, dicts, tensors."

    def _value(self, r: _Rank):
        """Rank ``r``'s return value, decoded with the pool's codec."""
        payload = r.result.payload
        if self.options.plain:
            try:
                return _messages.load_plain(payload)
            except ValueError as e:
                raise UnsendableResult(r.rank, "result", f"could not be read safely: {e}",
                                       self._advice()) from None
        import cloudpickle

        try:
            return cloudpickle.loads(payload)
        except Exception as e:  # noqa: BLE001 - e.g. a class the caller cannot import
            raise UnsendableResult(
                r.rank, "result", f"could not be loaded here ({type(e).__name__}: {e})",
                self._advice()) from None

    def _blame_a_dead_peer(self, rank: int) -> None:
        """This rank failed only because a peer's connection dropped: report the peer's failure.

        When a rank crashes (segfault, abort) or raises, its sockets close and its peers fail
        with "Connection closed by peer" a moment before the real failure is reported. For up
        to 2 s, wait for another rank to report something more telling: a death, or an
        exception that is not itself a dropped connection (either is raised from here).
        """
        deadline = time.monotonic() + 2.0
        peers = [r for r in self.ranks if r.rank != rank and r.result is None]
        watch = selectors.DefaultSelector()
        for r in peers:
            watch.register(r.result_fd, selectors.EVENT_READ, ("result", r))
            watch.register(r.process.sentinel, selectors.EVENT_READ, ("exit", r))
        self._blaming = True
        try:
            while watch.get_map() and time.monotonic() < deadline:
                for key, _ in watch.select(timeout=deadline - time.monotonic()):
                    what, r = key.data
                    if what == "result":
                        if self._read_result(r):  # raises a telling exception
                            _forget(watch, key.fileobj)  # nothing more will come
                    else:
                        _forget(watch, key.fileobj)
                        self._exited(r)  # raises the death as the cause
                    if r.result is not None:
                        for fileobj in (r.result_fd, r.process.sentinel):
                            _forget(watch, fileobj)
        finally:
            self._blaming = False
            watch.close()

    def _exited(self, r: _Rank) -> None:
        if r.result is not None:
            return
        self._read_result(r)  # the result may have arrived just before the exit
        if r.result is not None:
            return
        self._drain()
        code = r.process.exitcode
        if code is None:
            r.process.join(1)
            code = r.process.exitcode
        raise RankDied(r.rank, code, "\n".join(r.stderr.lines[-15:]))

    def _drain(self) -> None:
        for key in list(self.sel.get_map().values()):
            if key.data[0] == "out":
                data = _read_available(key.fd)
                if data:
                    key.data[1].feed(data)
        for r in self.ranks:
            r.stdout.close()
            r.stderr.close()

    def _hang(self) -> HangError:
        blocked = [r for r in self.ranks if r.result is None]
        dumps = {r.rank: b"" for r in blocked}
        for r in blocked:
            _read_available(r.stack_fd)  # discard anything stale
            try:
                os.kill(r.process.pid, signal.SIGUSR1)
            except (ProcessLookupError, TypeError):
                pass
        limit = time.monotonic() + 3.0
        pending = {r.rank: r for r in blocked}
        while pending and time.monotonic() < limit:
            ready = selectors.DefaultSelector()
            for r in pending.values():
                ready.register(r.stack_fd, selectors.EVENT_READ, r)
            for key, _ in ready.select(timeout=0.2):
                dumps[key.data.rank] += _read_available(key.fd)
            ready.close()
            for rank in list(pending):
                text = dumps[rank].decode("utf-8", "replace")
                if "_rank_main" in text and re.search(r"line \d+ in <module>\s*$", text):
                    del pending[rank]
        self._drain()
        states = []
        for r in self.ranks:
            if r.result is not None:
                states.append(RankState(rank=r.rank, finished=True, seconds=r.result.seconds))
            else:
                states.append(_where(r.rank, _parse_stack(dumps[r.rank].decode("utf-8", "replace"))))
        return HangError(self.options.timeout, states, self.fn_name)

    def stop(self) -> None:
        """Kill every rank (and anything it started) and free every resource."""
        import shutil

        if self.release_w is not None:
            try:
                os.close(self.release_w)
            except OSError:
                pass
        procs = [r.process for r in self.ranks]
        everyone = _descendants_of_ranks([p.pid for p in procs if p.pid is not None])
        # Every rank has sent its result (or the pool failed): nothing a rank still holds is
        # needed, so the ranks are killed rather than asked to tear gloo down politely.
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                try:
                    p.kill()
                except (ProcessLookupError, AttributeError):
                    pass
        for child in everyone:
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:  # already gone
                pass
        for p in procs:
            if p.pid is None:
                continue
            p.join(5)
            try:
                p.close()
            except ValueError:
                pass
        for fd in self.out_fds + [fd for r in self.ranks for fd in r.fds]:
            try:
                os.close(fd)
            except OSError:
                pass
        self.sel.close()
        self.store = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def run(fn: Callable, *args, world_size: int = 2, timeout: float = 60, echo: bool = True,
        detail_debug: bool = False, threads: int = 1, init_process_group: bool = True,
        show_warnings: bool = False, nproc_per_node: int | None = None,
        plain_results: bool = False, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on every rank of a fresh gloo group; return the values.

    world_size: number of ranks (processes), 1 to 32.
    timeout: seconds every rank gets to finish ``fn``; past it, :class:`HangError` says
        where each rank is blocked, and the pool is killed.
    echo: print each rank's output into the cell as it happens, as ``[rank r] ...``.
    detail_debug: run with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (collective mismatches are
        reported at once instead of hanging).
    threads: intra-op threads per rank (1 keeps N ranks from fighting over 2 cores).
    init_process_group: set False when ``fn`` calls ``dist.init_process_group("gloo")``
        itself, as a torchrun script does; the environment is set up as torchrun's.
    show_warnings: also show gloo and torch start-up chatter.
    nproc_per_node: lay the ranks out as ``world_size // nproc_per_node`` simulated nodes of
        ``nproc_per_node`` ranks each, numbered as ``torchrun --nnodes=N --nproc_per_node=P``
        numbers them: ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node's index),
        ``GROUP_WORLD_SIZE`` (the number of nodes). Each node gets its own scratch folder, in
        the environment variable ``NODE_LOCAL_DIR`` (what a cluster's node-local disk, often
        ``$TMPDIR``, is to a real job): empty when the ranks start, removed when the pool
        ends. Default: one node holding every rank.
    plain_results: each rank must return plain data (None, bool, int, float, str, bytes,
        tensors, and lists, tuples and dicts of these), sent with ``torch.save`` and read
        here with ``torch.load(weights_only=True)``: nothing a rank sends can run code in the
        caller. Anything else raises :class:`UnsendableResult`. Default: any value cloudpickle
        can send (the rank's code is trusted, as a learner's own code in their own kernel).

    Any other keyword argument is passed to ``fn``.

    Raises :class:`HangError` (a ``TimeoutError``) when ``fn`` does not finish in time, and a
    :class:`WorkerError` when a rank fails: :class:`RankRaised` (``fn`` raised),
    :class:`RankDied` (the process died), :class:`UnsendableResult` (the value cannot come
    back), :class:`BadMessage` (the rank wrote garbage on the pool's pipe).
    """
    nproc = _check(fn, world_size, timeout, nproc_per_node)
    options = _Options(world_size=world_size, nproc_per_node=nproc, timeout=float(timeout),
                       echo=echo, detail=detail_debug, threads=threads,
                       init=init_process_group, show_warnings=show_warnings,
                       plain=bool(plain_results))
    pool = _Pool(fn, args, kwargs, options)
    try:
        pool.start()
        return pool.wait()
    finally:
        pool.stop()


def _descendants_of_ranks(pids: list[int]) -> list[int]:
    """Processes the ranks started themselves (data loader workers, subprocesses): one /proc scan."""
    import psutil

    wanted, parent_of = set(pids), {}
    for proc in psutil.process_iter(["ppid"]):
        parent_of[proc.pid] = proc.info["ppid"]
    found = []
    for pid, ppid in parent_of.items():
        seen = set()
        while ppid and ppid not in seen:
            if ppid in wanted:
                found.append(pid)
                break
            seen.add(ppid)
            ppid = parent_of.get(ppid)
    return found


def live_ranks() -> list[int]:
    """PIDs of rank processes still alive (always ``[]`` between calls to :func:`run`)."""
    import psutil
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if not pid:
        return []
    try:
        server = psutil.Process(pid)
        return [p.pid for p in server.children(recursive=True) if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []


def warm_up() -> None:
    """Start the fork server now (it imports torch once, a few seconds) so later runs are fast."""
    run(_noop, world_size=1, echo=False)


def _noop() -> None:
    return None
