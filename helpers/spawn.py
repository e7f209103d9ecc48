"""A gloo worker pool for notebooks: run one function on N real ranks, from a cell.

Taught in ``notebooks/start/00_start_here.ipynb``; used by every lesson of the course.

``run(fn, *args, world_size=2, timeout=60, **kwargs)`` starts ``world_size`` processes, joins
them into a fresh gloo process group (set up exactly as ``torchrun`` would: ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), calls ``fn(*args, **kwargs)``
on every rank, streams every rank's output into the calling cell, and returns the ranks'
return values in rank order.

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

__all__ = ["run", "HangError", "WorkerError", "RankState", "MAX_WORLD_SIZE", "live_ranks",
           "warm_up"]

MAX_WORLD_SIZE = 32
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
    """A rank raised an exception, died, or returned something that cannot be sent back.

    ``rank``, ``exc_type``, ``exc_message`` and ``remote_traceback`` describe the first failure.
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


def _rank_main(rank: int, world_size: int, payload: bytes, env: dict, cwd: str,
               path: list, out: _Fd, err: _Fd, stacks: _Fd, release: _Fd,
               results: Connection, options: dict) -> None:
    """Entry point of one rank, inside a process forked by the fork server."""
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

    os.environ.clear()
    os.environ.update(env)
    os.environ.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
        "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(options["port"]),
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # the kernel hosts the store, as torchrun's agent does
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": str(options["threads"]),
    })
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
        value = fn(*args, **kwargs)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            blob = cloudpickle.dumps(value)
        except Exception as e:  # noqa: BLE001 - reported to the caller
            results.send(("unsendable", type(value).__qualname__, f"{type(e).__name__}: {e}",
                          time.monotonic() - t0))
        else:
            results.send(("ok", blob, time.monotonic() - t0))
    except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
        sys.stdout.flush()
        sys.stderr.flush()
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next))
        results.send(("error", type(e).__qualname__, str(e), tb,
                      time.monotonic() - t0))
    sys.stdout.flush()
    sys.stderr.flush()
    # Stay alive until every rank has finished: a peer that exits early would make the
    # others fail with "Connection closed by peer" instead of showing the real hang.
    try:
        os.read(release.take(), 1)
    except OSError:
        pass
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the pool is ending anyway
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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


def _check(fn: Any, world_size: Any, timeout: Any) -> None:
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
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}.")


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


def _read_available(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            break
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


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


class _Pool:
    def __init__(self, fn, args, kwargs, world_size, timeout, echo, detail, threads, init,
                 show_warnings):
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
        self.world_size, self.timeout = world_size, timeout
        self.echo, self.detail, self.threads, self.init = echo, detail, threads, init
        self.show_warnings = show_warnings
        self.procs: list = []
        self.fds: list[int] = []
        self.results: dict[int, tuple] = {}
        self.finish_time: dict[int, float] = {}

    # -- lifecycle
    def start(self) -> None:
        import torch.distributed as dist

        # The store lives in the caller, on a port the OS picked and that stays bound:
        # two pools in two kernels can never pick the same rendezvous.
        self.store = dist.TCPStore("127.0.0.1", 0, self.world_size, True,
                                   wait_for_workers=False, use_libuv=True)
        ctx = _context()  # sets the fork server's preload
        release_r, self.release_w = os.pipe()
        release = _Fd(release_r)
        options = {"port": self.store.port, "threads": self.threads, "detail": self.detail,
                   "init": self.init, "group_timeout": self.timeout + 600}
        self.streams, self.stack_fds, self.conns = [], [], []
        self.sel = selectors.DefaultSelector()
        env = dict(os.environ)
        for rank in range(self.world_size):
            pipes = [os.pipe() for _ in range(3)]
            for r, _ in pipes:
                os.set_blocking(r, False)
            ends = [_Fd(w) for _, w in pipes]
            recv, send = ctx.Pipe(duplex=False)
            p = _RankProcess(
                target=_rank_main, name=f"helpers.spawn rank {rank}", daemon=False,
                args=(rank, self.world_size, self.payload, env, os.getcwd(), list(sys.path),
                      *ends, release, send, options),
            )
            self.procs.append(p)
            p.start()
            send.close()
            for end in ends:  # the rank holds its own copies now
                end.conn.close()
            out = _Stream(rank, "stdout", sys.stdout, self.echo, self.show_warnings)
            err = _Stream(rank, "stderr", sys.stderr, self.echo, self.show_warnings)
            self.streams += [out, err]
            self.sel.register(pipes[0][0], selectors.EVENT_READ, out)
            self.sel.register(pipes[1][0], selectors.EVENT_READ, err)
            self.stack_fds.append(pipes[2][0])
            self.sel.register(recv, selectors.EVENT_READ, ("result", rank))
            self.sel.register(p.sentinel, selectors.EVENT_READ, ("exit", rank))
            self.conns.append(recv)
            self.fds += [pipes[0][0], pipes[1][0], pipes[2][0]]
        release.conn.close()
        self.t0 = time.monotonic()

    def wait(self) -> list:
        deadline = self.t0 + self.timeout
        while len(self.results) < self.world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._hang()
            for key, _ in self.sel.select(timeout=min(left, 0.5)):
                tag = key.data
                if isinstance(tag, _Stream):
                    data = _read_available(key.fd)
                    if data:
                        tag.feed(data)
                    else:
                        self.sel.unregister(key.fd)
                elif tag[0] == "result":
                    self._result(tag[1], key.fileobj)
                elif tag[0] == "exit":
                    _forget(self.sel, key.fileobj)
                    self._exited(tag[1])
        self._drain()
        values = []
        for rank in range(self.world_size):
            res = self.results[rank]
            import cloudpickle

            values.append(cloudpickle.loads(res[1]))
        return values

    def _result(self, rank: int, conn) -> None:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            _forget(self.sel, conn)
            return  # its exit is reported by the sentinel
        _forget(self.sel, conn)
        kind = msg[0]
        self.finish_time[rank] = msg[-1]
        if kind == "ok":
            self.results[rank] = msg
        elif kind == "unsendable":
            self._drain()
            raise WorkerError(
                rank, "TypeError", msg[2],
                summary=(f"rank {rank} returned a {msg[1]}, which cannot be sent back to the "
                         f"notebook ({msg[2]}). Return plain data instead: numbers, lists, "
                         "dicts, tensors."),
            )
        else:
            _, etype, emsg, tb, _ = msg
            if _PEER_GONE.search(emsg):
                self._blame_a_dead_peer(rank)
            self._drain()
            raise WorkerError(rank, etype, emsg, tb)

    def _blame_a_dead_peer(self, rank: int) -> None:
        """This rank failed only because a peer's connection dropped: report the peer's failure.

        When a rank crashes (segfault, abort) or raises, its sockets close and its peers fail
        with "Connection closed by peer" a moment before the real failure is reported. For up
        to 2 s, wait for another rank to report something more telling: a death, or an
        exception that is not itself a dropped connection.
        """
        from multiprocessing.connection import wait as wait_any

        deadline = time.monotonic() + 2.0
        peers = {r for r in range(self.world_size) if r != rank and r not in self.results}
        while peers and time.monotonic() < deadline:
            waitables = {}
            for r in peers:
                if not self.conns[r].closed:
                    waitables[self.conns[r]] = r
                waitables[self.procs[r].sentinel] = r
            for ready in wait_any(list(waitables), timeout=deadline - time.monotonic()):
                r = waitables[ready]
                if r not in peers:
                    continue
                conn = self.conns[r]
                if not conn.closed and conn.poll(0):
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError):
                        conn.close()
                        continue
                    if msg[0] == "ok":
                        self.results[r] = msg
                        self.finish_time[r] = msg[-1]
                    elif msg[0] == "error" and not _PEER_GONE.search(msg[2]):
                        self._drain()
                        raise WorkerError(r, msg[1], msg[2], msg[3])
                    peers.discard(r)
                elif self.procs[r].exitcode is not None:
                    self._exited(r)  # raises the death as the cause
                    peers.discard(r)

    def _exited(self, rank: int) -> None:
        if rank in self.results:
            return
        conn = self.conns[rank]
        try:
            pending = not conn.closed and conn.poll(0)
        except OSError:
            pending = False
        if pending:  # the result may have arrived just before the exit
            self._result(rank, conn)
            if rank in self.results:
                return
        self._drain()
        code = self.procs[rank].exitcode
        if code is None:
            self.procs[rank].join(1)
            code = self.procs[rank].exitcode
        if code is not None and code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code} before returning"
        tail = "\n".join(self.streams[2 * rank + 1].lines[-15:])
        raise WorkerError(
            rank, "ProcessDied", how, tail,
            summary=(f"rank {rank} {how} (a crash in C++ code, os._exit, or the machine "
                     "killing it). Its last stderr lines follow."),
        )

    def _drain(self) -> None:
        for key in list(self.sel.get_map().values()):
            if isinstance(key.data, _Stream):
                data = _read_available(key.fd)
                if data:
                    key.data.feed(data)
        for s in self.streams:
            s.close()

    def _hang(self) -> HangError:
        blocked = [r for r in range(self.world_size) if r not in self.results]
        dumps = {r: b"" for r in blocked}
        for r in blocked:
            _read_available(self.stack_fds[r])  # discard anything stale
            try:
                os.kill(self.procs[r].pid, signal.SIGUSR1)
            except (ProcessLookupError, TypeError):
                pass
        limit = time.monotonic() + 3.0
        pending = set(blocked)
        while pending and time.monotonic() < limit:
            ready = selectors.DefaultSelector()
            for r in pending:
                ready.register(self.stack_fds[r], selectors.EVENT_READ, r)
            for key, _ in ready.select(timeout=0.2):
                dumps[key.data] += _read_available(key.fd)
            ready.close()
            for r in list(pending):
                text = dumps[r].decode("utf-8", "replace")
                if "_rank_main" in text and re.search(r"line \d+ in <module>\s*$", text):
                    pending.discard(r)
        self._drain()
        states = []
        for r in range(self.world_size):
            if r in self.results:
                states.append(RankState(rank=r, finished=True, seconds=self.finish_time.get(r)))
            else:
                states.append(_where(r, _parse_stack(dumps[r].decode("utf-8", "replace"))))
        return HangError(self.timeout, states, self.fn_name)

    def stop(self) -> None:
        """Kill every rank (and anything it started) and free every resource."""
        try:
            os.close(self.release_w)  # finished ranks exit cleanly on their own
        except (OSError, AttributeError):
            pass
        everyone = _descendants_of_ranks([p.pid for p in self.procs if p.pid is not None])
        # Every rank has sent its result (or the pool failed): nothing a rank still holds is
        # needed, so the ranks are killed rather than asked to tear gloo down politely.
        for p in self.procs:
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
        for p in self.procs:
            if p.pid is None:
                continue
            p.join(5)
            try:
                p.close()
            except ValueError:
                pass
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        for c in getattr(self, "conns", []):
            c.close()
        if hasattr(self, "sel"):
            self.sel.close()
        if hasattr(self, "store"):
            del self.store


def run(fn: Callable, *args, world_size: int = 2, timeout: float = 60, echo: bool = True,
        detail_debug: bool = False, threads: int = 1, init_process_group: bool = True,
        show_warnings: bool = False, **kwargs) -> list:
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

    Any other keyword argument is passed to ``fn``.
    """
    _check(fn, world_size, timeout)
    pool = _Pool(fn, args, kwargs, world_size, float(timeout), echo, detail_debug, threads,
                 init_process_group, show_warnings)
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
