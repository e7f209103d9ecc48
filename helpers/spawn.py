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

* Ranks are forked from a *fork server* (``helpers/_pool/server.py``), a process started once
  per kernel that imported torch and never ran a torch op or started a thread, so forking is
  cheap (no per-rank ``import torch``) and safe (the kernel, whose OpenMP pool may be running,
  is never forked). Where a platform's libraries leave a thread running in the server, each
  rank starts as a fresh interpreter instead (see ``helpers/_pool/platform.py``).
* ``fn`` is shipped by value with cloudpickle, so functions, closures and lambdas defined in
  notebook cells work (plain ``spawn`` cannot find them in ``__main__``).
* The pool adds no collective around ``fn``. Ranks that finish stay alive until every rank
  has finished (the pool then kills them), so a rank stuck in a barrier waits exactly as in a
  real job instead of failing because its peer exited.
* Two clocks: ``start_timeout`` until every rank has joined the process group, then
  ``timeout`` for ``fn``. A hang becomes :class:`HangError` saying where each rank is blocked
  (read with :mod:`faulthandler`, which works while a rank is inside a C++ collective); an
  exception or a crash on any rank becomes a :class:`WorkerError` at once.
* Nothing is left behind: each rank leads its own process group and is killed with it; a
  watchdog thread in every rank ends it when the caller's end of its control pipe closes (the
  kernel died), with Linux's parent-death signal as a second line; an interrupt while the
  pool is being stopped is held until it is stopped; the next ``run`` kills anything an
  earlier pool left.

Linux and macOS (Python 3.11 to 3.13); on Windows, use WSL2.
"""

from __future__ import annotations

import math
import os
import signal
import threading
from typing import Any, Callable

from helpers._pool.errors import (BadMessage, HangError, JoinTimeout, RankDied, RankRaised,
                                  RankState, UnsendableResult, WorkerError)
from helpers._pool.pool import NODE_LOCAL_DIR, Options, Pool

__all__ = ["run", "HangError", "JoinTimeout", "WorkerError", "RankRaised", "RankDied",
           "UnsendableResult", "BadMessage", "RankState", "MAX_WORLD_SIZE", "NODE_LOCAL_DIR",
           "live_ranks", "can_watch_syscalls"]

MAX_WORLD_SIZE = 32
_SERVER = None  # this process's fork server, started by the first run()
_SERVER_LOCK = threading.Lock()
_ONE_POOL_AT_A_TIME = threading.Lock()  # the server ends an earlier pool when one starts


def run(fn: Callable, *args, world_size: int = 2, timeout: float = 60, echo: bool = True,
        detail_debug: bool = False, threads: int = 1, init_process_group: bool = True,
        show_warnings: bool = False, nproc_per_node: int | None = None,
        plain_results: bool = False, start_timeout: float = 60, rank_args: list | None = None,
        on_return: Callable[[int], None] | None = None, outputs: list | None = None,
        on_syscall: Callable[[int, str, int], None] | None = None,
        watch_syscalls: tuple = ("fsync", "fdatasync"), watch_ranks: tuple = (0,),
        on_start: Callable[[list[int]], None] | None = None, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on every rank of a fresh gloo group; return the values.

    world_size: number of ranks (processes), 1 to 32.
    timeout: seconds every rank gets to finish ``fn``, counted from the moment every rank has
        joined the process group; past it, :class:`HangError` says where each rank is
        blocked, and the pool is killed.
    start_timeout: seconds the ranks get to start and join the group; past it,
        :class:`JoinTimeout` ("rank 2 did not join within 60 s").
    echo: print each rank's output into the cell as it happens, as ``[rank r] ...``.
    detail_debug: run with ``TORCH_DISTRIBUTED_DEBUG=DETAIL``: collectives that differ in
        kind or size between ranks are reported at once, instead of waiting, aborting or
        returning wrong data; two calls of the same kind and size still pair silently.
    threads: intra-op threads per rank (1 keeps N ranks from fighting over a few cores).
    init_process_group: set False when ``fn`` calls ``dist.init_process_group("gloo")``
        itself, as a torchrun script does; the environment is set up as torchrun's, and
        ``timeout`` then starts when every rank is about to call ``fn``.
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

    rank_args: one tuple per rank, appended to ``args`` on that rank only: rank ``r`` calls
        ``fn(*args, *rank_args[r], **kwargs)``, and no rank's process ever holds another
        rank's tuple (each rank's job file is unlinked before the group forms). For callers
        that must not trust the ranks' code (grading: each rank gets only its own inputs).
    on_return: called here, in the caller, with a rank's number as soon as that rank's
        result arrives (before the other ranks have finished): the moment to look, from
        outside the ranks, at what they left (the grader inspects a checkpoint file then).
    outputs: a list, filled here once the pool has ended (whether ``fn`` returned, raised or
        hung) with one ``{"stdout": [lines], "stderr": [lines]}`` per rank: what the rank wrote
        on its own output pipes, as this process read them (start-up chatter left out unless
        ``show_warnings``). Nothing a rank does can change what another rank wrote, or take
        back what it wrote itself.
    on_start: called here with the ranks' process ids, in rank order, as soon as they are
        started (before they have joined the group).
    on_syscall: called here, from a thread of this process, as ``on_syscall(rank, name,
        first_argument)`` each time one of ``watch_ranks`` (or a thread or child of it) makes
        one of the system calls ``watch_syscalls`` (``fsync``, ``fdatasync``); the call waits
        until ``on_syscall`` has returned, then runs unchanged. Seen with a seccomp filter the
        rank installs before it runs anything it was given (Linux only: see
        :func:`can_watch_syscalls`), so no code in the rank can hide a call or fake one.

    Any other keyword argument is passed to ``fn``.

    Raises :class:`HangError` (a ``TimeoutError``) when ``fn`` does not finish in time,
    :class:`JoinTimeout` when the ranks do not start in time, and a :class:`WorkerError` when
    a rank fails: :class:`RankRaised` (``fn`` raised), :class:`RankDied` (the process died),
    :class:`UnsendableResult` (the value cannot come back), :class:`BadMessage` (the rank
    wrote garbage on the pool's pipe). ``KeyboardInterrupt`` (the kernel's interrupt button)
    stops the pool and reaches the caller.
    """
    nproc = _check(fn, world_size, timeout, start_timeout, threads, nproc_per_node)
    if rank_args is not None and len(rank_args) != world_size:
        raise ValueError(f"rank_args needs one tuple per rank: {world_size} ranks, got "
                         f"{len(rank_args)} tuples.")
    watched: tuple = ()
    if on_syscall is not None:
        from helpers._pool.syscalls import WATCHABLE

        unknown = sorted(set(watch_syscalls) - set(WATCHABLE))
        if unknown or not watch_syscalls:
            raise ValueError(f"watch_syscalls can name {', '.join(WATCHABLE)}, not {unknown or 'nothing'}.")
        if any(not isinstance(r, int) or not 0 <= r < world_size for r in watch_ranks):
            raise ValueError(f"watch_ranks must be ranks of the pool (0 to {world_size - 1}), not {watch_ranks}.")
        if not can_watch_syscalls():
            raise RuntimeError("system calls cannot be watched here (seccomp notifications need "
                               "Linux on x86_64 or aarch64); check can_watch_syscalls() first.")
        watched = tuple(sorted(set(watch_ranks)))
    options = Options(world_size=world_size, nproc_per_node=nproc, timeout=float(timeout),
                      start_timeout=float(start_timeout), echo=echo, detail=detail_debug,
                      threads=threads, init=init_process_group, show_warnings=show_warnings,
                      plain=bool(plain_results), syscalls=tuple(watch_syscalls) if watched else (),
                      syscall_ranks=watched)
    with _ONE_POOL_AT_A_TIME:  # threads of one process take turns
        pool = Pool(fn, args, kwargs, options, _server(), rank_args=rank_args, on_return=on_return,
                    on_syscall=on_syscall, on_start=on_start)
        with _interrupts_held_while(pool):
            try:
                pool.start()
                return pool.wait()
            finally:
                pool.stop()
                if outputs is not None:
                    outputs[:] = [{"stdout": list(r.stdout.lines), "stderr": list(r.stderr.lines)}
                                  for r in pool.ranks]


class _interrupts_held_while:
    """Turn the first SIGINT into KeyboardInterrupt; hold any SIGINT once the pool is stopping.

    Jupyter's interrupt button sends SIGINT. The first one interrupts ``run`` (and marks the
    pool as stopping before raising); one that arrives while the pool is being stopped (a
    second press) is held until the ranks are dead, then raised if nothing else was, so no
    interrupt can cut a stop short and leave ranks alive. Only the main thread gets signals.
    """

    def __init__(self, pool: Pool):
        self.pool, self.held, self.previous = pool, False, None

    def _handler(self, signum, frame):
        if self.pool.stopping:
            self.held = True
            return
        self.pool.stopping = True
        raise KeyboardInterrupt

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous in (signal.default_int_handler, signal.SIG_DFL):
                self.previous = previous
                signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, etype, exc, tb):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        if self.held and etype is None:
            raise KeyboardInterrupt
        return False


def _server():
    """This process's fork server, started on first use (and again after a fork or a death)."""
    global _SERVER
    from helpers._pool.platform import check_supported
    from helpers._pool.server import Server

    check_supported()
    with _SERVER_LOCK:
        s = _SERVER
        if s is None or s.owner != os.getpid() or not s.alive:
            if s is not None and s.owner == os.getpid():
                s.close()
            from helpers._pool.pool import _package_parent

            _SERVER = s = Server([_package_parent()])
        return s


def _check(fn: Any, world_size: Any, timeout: Any, start_timeout: Any, threads: Any,
           nproc_per_node: Any) -> int:
    """Refuse bad arguments with a message that says what to pass; the ranks per node."""
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
    for name, value, what in (("timeout", timeout, "how long fn may run on every rank"),
                              ("start_timeout", start_timeout, "how long the ranks may take "
                               "to start and join the group")):
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not math.isfinite(value) or value <= 0):
            raise ValueError(
                f"{name} must be a positive, finite number of seconds, got {value!r}. "
                f"It bounds {what} before the pool stops them and says where they were."
            )
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(
            f"threads must be a whole number of intra-op threads per rank, at least 1, got "
            f"{threads!r}. 1 (the default) keeps the ranks from competing for the cores."
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


def can_watch_syscalls() -> bool:
    """Whether ``run(on_syscall=...)`` can watch a rank's system calls on this machine."""
    from helpers._pool.syscalls import available

    return available()


def live_ranks() -> list[int]:
    """PIDs of rank processes (and processes they started) still alive.

    Always ``[]`` between calls to :func:`run`.
    """
    s = _SERVER
    if s is None or s.owner != os.getpid():
        return []
    return s.children()
