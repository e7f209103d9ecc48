"""One call of :func:`helpers.spawn.run`: start the ranks, watch them, stop them.

The caller holds one :class:`RankRecord` per rank (its pid, its pipes, what it has said) and
reads four kinds of events in one ``select`` loop: output lines, result messages, exits
reported by the fork server, and the clock. Two clocks: ``start_timeout`` until every rank
has joined the process group, then ``timeout`` for the function.
"""

from __future__ import annotations

import dataclasses
import os
import re
import selectors
import signal
import socket
import sys
import time

from helpers._pool import messages, stacks
from helpers._pool.errors import (BadMessage, HangError, JoinTimeout, RankDied, RankRaised,
                                  RankState, UnsendableResult)
from helpers._pool.platform import loopback_interface, orphans_adopted_by_server
from helpers._pool.server import Server, kill_group as _kill_group

_MAX_LINES_PER_RANK = 2000  # per stream; more is drained but not shown
_MAX_LINE = 20_000  # characters of one line that are shown

# Lines that gloo and torch print on every start-up. They say nothing about the lesson,
# so they are hidden unless show_warnings=True.
_NOISE = [
    re.compile(r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks"),
    re.compile(r"^\[W\d+ .*(ProcessGroupGloo|socket|TCPStore|Utils)\.c(pp|c)"),
    re.compile(r"^\[W\d+ .*(gloo/transport|c10d)"),
    re.compile(r"^\s*warnings\.warn\($"),
    re.compile(r"UserWarning: .*(set_num_threads|TypedStorage)"),
]
_PEER_GONE = re.compile(r"Connection (reset|closed) by peer|Socket closed|Broken pipe")
NODE_LOCAL_DIR = "NODE_LOCAL_DIR"


@dataclasses.dataclass(frozen=True)
class Options:
    """How one call of ``run`` runs (its keyword arguments, checked)."""

    world_size: int
    nproc_per_node: int
    timeout: float
    start_timeout: float = 60.0
    echo: bool = True
    detail: bool = False
    threads: int = 1
    init: bool = True
    show_warnings: bool = False
    plain: bool = False
    syscalls: tuple = ()  # names of the system calls watched (helpers._pool.syscalls)
    syscall_ranks: tuple = ()  # the ranks whose calls are watched


@dataclasses.dataclass(frozen=True)
class Layout:
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


class Stream:
    """Splits one rank's raw output into lines and prints them tagged with the rank."""

    def __init__(self, rank: int, sink, echo: bool, show_warnings: bool):
        self.rank, self.sink = rank, sink
        self.echo, self.show_warnings = echo, show_warnings
        self.buf = bytearray()
        self.lines: list[str] = []
        self.hidden = 0

    def feed(self, data: bytes) -> None:
        self.buf += data
        start = 0
        while True:
            end = self.buf.find(b"\n", start)
            if end < 0:
                break
            self._line(bytes(self.buf[start:end]))
            start = end + 1
        del self.buf[:start]
        if len(self.buf) > 4 * _MAX_LINE:  # an endless line: show its start, drop the rest
            self._line(bytes(self.buf[:_MAX_LINE]))
            self.buf.clear()

    def close(self) -> None:
        if self.buf:
            self._line(bytes(self.buf))
            self.buf.clear()
        if self.hidden:
            self._emit(f"[rank {self.rank}] ... {self.hidden} more lines not shown")
            self.hidden = 0

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if len(text) > _MAX_LINE:
            text = text[:_MAX_LINE] + f" [... {len(text) - _MAX_LINE} more characters]"
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


def read_pipe(fd: int) -> tuple[bytes, bool]:
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


@dataclasses.dataclass(eq=False)
class RankRecord:
    """What the caller holds for one rank: its process, its pipes, what it has said."""

    rank: int
    stdout: Stream
    stderr: Stream
    out_fd: int
    err_fd: int
    stack_fd: int
    result_fd: int
    control_fd: int  # the write end of the rank's control pipe; closing it ends the rank
    notify_fd: int = -1  # the caller's end of the socket the rank's seccomp listener comes on
    pid: int | None = None
    decoder: messages.Decoder = dataclasses.field(default_factory=messages.Decoder)
    joined: bool = False
    result: messages.Returned | None = None
    exitcode: int | None = None
    exited: bool = False

    @property
    def fds(self) -> list[int]:
        return [self.out_fd, self.err_fd, self.stack_fd, self.result_fd, self.control_fd, self.notify_fd]


def _forget(sel: selectors.BaseSelector, fileobj) -> None:
    try:
        sel.unregister(fileobj)
    except (KeyError, ValueError):
        pass


class Pool:
    """Start, watch and stop the ranks of one call of ``run``."""

    def __init__(self, fn, args, kwargs, options: Options, server: Server,
                 rank_args: list | None = None, on_return=None, on_syscall=None, on_start=None):
        import cloudpickle

        self.fn_name = getattr(fn, "__name__", type(fn).__name__)
        self.on_return = on_return
        self.on_syscall = on_syscall
        self.on_start = on_start
        self.supervisors: list = []
        try:
            # one job per rank: each rank reads its own and unlinks it before it joins the group,
            # so no rank's code ever finds another rank's arguments
            if rank_args is None:
                self.payloads = [cloudpickle.dumps((fn, args, kwargs))] * options.world_size
            else:
                self.payloads = [cloudpickle.dumps((fn, tuple(args) + tuple(rank_args[r]), kwargs))
                                 for r in range(options.world_size)]
        except Exception as e:
            raise TypeError(
                f"{self.fn_name} (or one of its arguments) cannot be sent to the ranks: "
                f"{type(e).__name__}: {e}. Pass plain data (numbers, tensors, lists, paths) and "
                "create locks, files and process groups inside the function."
            ) from e
        self.options = options
        self.server = server
        self.ranks: list[RankRecord] = []
        self.sel = selectors.DefaultSelector()
        self.store = None
        self.folder: str | None = None
        self.t0 = 0.0
        self.deadline: float | None = None  # set when the last rank joins
        self.stopping = False  # set once the pool is being stopped (interrupts are deferred)
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
        self.folder = tempfile.mkdtemp(prefix=f"helpers-spawn-{os.getpid()}-")
        for node in range(o.world_size // o.nproc_per_node):
            os.mkdir(os.path.join(self.folder, f"node{node}"))
        os.mkdir(os.path.join(self.folder, "errors"))
        jobs = []
        for rank, payload in enumerate(self.payloads):
            jobs.append(os.path.join(self.folder, f"job{rank}.pkl"))
            with open(jobs[-1], "wb") as f:
                f.write(payload)
        env = dict(os.environ)
        env.update(GLOO_SOCKET_IFNAME=loopback_interface(), OMP_NUM_THREADS=str(o.threads))
        if o.detail:
            env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        common = {"folder": self.folder, "cwd": os.getcwd(), "path": list(sys.path),
                  "env": env, "threads": o.threads, "init": o.init, "plain": o.plain,
                  "group_timeout": o.start_timeout + o.timeout + 600,
                  "boot_path": [_package_parent()]}
        specs, passed = [], []
        for rank in range(o.world_size):
            layout = Layout(rank, o.world_size, o.nproc_per_node)
            pipes = [os.pipe() for _ in range(4)]  # stdout, stderr, stacks, results: rank writes
            control_r, control_w = os.pipe()  # the caller holds the only write end
            notify_ours, notify_theirs = socket.socketpair()
            for r, _ in pipes:
                os.set_blocking(r, False)
            record = RankRecord(rank, Stream(rank, sys.stdout, o.echo, o.show_warnings),
                                Stream(rank, sys.stderr, o.echo, o.show_warnings),
                                *(r for r, _ in pipes), control_fd=control_w,
                                notify_fd=notify_ours.detach())
            self.ranks.append(record)
            passed += [w for _, w in pipes] + [control_r, notify_theirs.detach()]
            specs.append({"rank": rank, "job": jobs[rank],
                          "syscalls": list(o.syscalls) if rank in o.syscall_ranks else [],
                          "layout_env": layout.environment(
                self.store.port, os.path.basename(self.folder),
                os.path.join(self.folder, f"node{layout.node}"),
                os.path.join(self.folder, "errors", f"rank{rank}.json"))})
        try:
            pids = self.server.start_ranks({"common": common, "ranks": specs}, passed,
                                           timeout=o.start_timeout)
        finally:
            for fd in passed:  # the ranks hold their own copies now
                os.close(fd)
        for record, pid in zip(self.ranks, pids):
            record.pid = pid
            self.sel.register(record.out_fd, selectors.EVENT_READ, ("out", record.stdout))
            self.sel.register(record.err_fd, selectors.EVENT_READ, ("out", record.stderr))
            self.sel.register(record.result_fd, selectors.EVENT_READ, ("result", record))
        self.sel.register(self.server.sock, selectors.EVENT_READ, ("server", None))
        if self.on_start is not None:
            self.on_start(list(pids))
        for rank in o.syscall_ranks:
            self._supervise(self.ranks[rank])
        self.t0 = time.monotonic()

    def _supervise(self, r: RankRecord) -> None:
        """Take rank ``r``'s seccomp listener and watch its calls from a thread of this process."""
        from helpers._pool.syscalls import Supervisor

        sock = socket.socket(fileno=os.dup(r.notify_fd))
        try:
            sock.settimeout(self.options.start_timeout)
            msg, fds, _, _ = socket.recv_fds(sock, 600, 1)
        except OSError as e:
            raise RuntimeError(f"rank {r.rank} did not hand over its system-call watch: {e}") from None
        finally:
            sock.close()
        if msg != b"k" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise RuntimeError(f"rank {r.rank} could not watch its system calls: "
                               f"{msg[1:].decode('utf-8', 'replace') or 'no answer'}")
        rank = r.rank
        self.supervisors.append(Supervisor(fds[0], lambda pid, name, arg: self.on_syscall(rank, name, arg)))

    def wait(self) -> list:
        o = self.options
        while not all(r.result for r in self.ranks):
            if self.server.pending:  # exits read while the ranks were being started
                self._server_events()
            now = time.monotonic()
            limit = self.deadline if self.deadline is not None else self.t0 + o.start_timeout
            if now >= limit:
                self._read_results()  # what arrived in time counts
                if all(r.result for r in self.ranks):
                    break
                self.stopping = True
                raise self._diagnose()
            for key, _ in self.sel.select(timeout=min(limit - now, 0.5)):
                what, target = key.data
                if what == "out":
                    data, eof = read_pipe(key.fd)
                    target.feed(data)
                    if eof:
                        _forget(self.sel, key.fd)
                elif what == "result":
                    self._read_result(target)
                else:
                    self._server_events()
        self.stopping = True
        self._drain()
        return [self._value(r) for r in self.ranks]

    # -- what ranks and the server send
    def _server_events(self) -> None:
        by_pid = {r.pid: r for r in self.ranks}
        for event in self.server.events():
            r = by_pid.get(event.get("pid"))
            if event.get("op") == "exit" and r is not None:
                r.exited, r.exitcode = True, event["code"]
                self._exited(r)
        if self.server.reader.closed:
            _forget(self.sel, self.server.sock)
            self.stopping = True
            raise RuntimeError(
                f"The pool's fork server (pid {self.server.pid}) exited while {self.fn_name}() "
                "ran; the ranks were stopped. Run again: a new server starts.")

    def _read_results(self) -> None:
        for r in self.ranks:
            if r.result is None:
                self._read_result(r)

    def _read_result(self, r: RankRecord) -> bool:
        """Read and act on whatever rank ``r`` has written on its result pipe; True at its end."""
        data, eof = read_pipe(r.result_fd)
        if eof:
            _forget(self.sel, r.result_fd)
        if data:
            try:
                msgs = r.decoder.feed(data)
            except messages.MessageError as e:
                self._fail()
                raise BadMessage(r.rank, str(e)) from None
            for msg in msgs:
                self._handle(r, msg)
        return eof

    def _handle(self, r: RankRecord, msg: messages.Message) -> None:
        if isinstance(msg, messages.Joined):
            if not r.joined:
                r.joined = True
                if self.deadline is None and all(x.joined for x in self.ranks):
                    self.deadline = time.monotonic() + self.options.timeout
        elif isinstance(msg, messages.Returned):
            if r.result is None:
                r.result = msg
                if self.on_return is not None:
                    self.on_return(r.rank)  # the caller's own look, as soon as rank r says it is done
        elif isinstance(msg, messages.Unsendable):
            self._fail()
            raise UnsendableResult(r.rank, msg.type_name, msg.reason, self._advice())
        else:  # Raised
            if _PEER_GONE.search(msg.message):
                if self._blaming:
                    return  # one more rank that lost its peer: not the cause
                self._blame_a_dead_peer(r.rank)
            self._fail()
            raise RankRaised(r.rank, msg.exc_type, msg.message, msg.traceback)

    def _advice(self) -> str:
        if self.options.plain:
            return (f"Return plain data only: {messages.PLAIN_TYPES} (e.g. float(x) for a "
                    "NumPy number, x.tolist() for an array).")
        return "Return plain data instead: numbers, lists, dicts, tensors."

    def _value(self, r: RankRecord):
        """Rank ``r``'s return value, decoded with the pool's codec."""
        payload = r.result.payload
        if self.options.plain:
            try:
                return messages.load_plain(payload)
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
        watch = selectors.DefaultSelector()
        for r in self.ranks:
            if r.rank != rank and r.result is None:
                watch.register(r.result_fd, selectors.EVENT_READ, r)
        watch.register(self.server.sock, selectors.EVENT_READ, None)
        self._blaming = True
        try:
            # A peer is settled once it has sent a result; one whose pipe closed without a
            # result is dying, and its death (reported by the server) is raised from here.
            while time.monotonic() < deadline and any(
                    r.result is None and not r.exited for r in self.ranks if r.rank != rank):
                if self.server.pending:
                    self._server_events()
                for key, _ in watch.select(timeout=max(0.0, deadline - time.monotonic())):
                    r = key.data
                    if r is None:
                        self._server_events()
                    elif self._read_result(r) or r.result is not None:
                        _forget(watch, key.fileobj)
        finally:
            self._blaming = False
            watch.close()

    def _exited(self, r: RankRecord) -> None:
        if r.result is not None:
            return
        self._read_result(r)  # the result may have arrived just before the exit
        if r.result is not None:
            return
        self._fail()
        raise RankDied(r.rank, r.exitcode, "\n".join(r.stderr.lines[-15:]))

    def _fail(self) -> None:
        self.stopping = True
        self._drain()

    def _drain(self) -> None:
        for key in list(self.sel.get_map().values()):
            if key.data[0] == "out":
                key.data[1].feed(read_pipe(key.fd)[0])
        for r in self.ranks:
            r.stdout.close()
            r.stderr.close()

    # -- hangs
    def _diagnose(self) -> HangError | JoinTimeout:
        """Where every unfinished rank is, read from a faulthandler dump of its stack."""
        blocked = [r for r in self.ranks if r.result is None]
        dumps = {r.rank: b"" for r in blocked}
        for r in blocked:
            read_pipe(r.stack_fd)  # discard anything stale
            try:
                os.kill(r.pid, signal.SIGUSR1)
            except (ProcessLookupError, TypeError):
                pass
        limit = time.monotonic() + 3.0
        pending = {r.rank: r for r in blocked}
        while pending and time.monotonic() < limit:
            ready = selectors.DefaultSelector()
            for r in pending.values():
                ready.register(r.stack_fd, selectors.EVENT_READ, r)
            for key, _ in ready.select(timeout=0.2):
                dumps[key.data.rank] += read_pipe(key.fd)[0]
            ready.close()
            for rank in list(pending):
                if stacks.dump_complete(dumps[rank].decode("utf-8", "replace")):
                    del pending[rank]
        self._drain()
        states = []
        for r in self.ranks:
            if r.result is not None:
                states.append(RankState(rank=r.rank, finished=True, seconds=r.result.seconds))
            else:
                frames = stacks.parse_stack(dumps[r.rank].decode("utf-8", "replace"))
                states.append(stacks.where(r.rank, frames, joined=r.joined))
        if self.deadline is None:
            return JoinTimeout(self.options.start_timeout, states, self.fn_name)
        return HangError(self.options.timeout, states, self.fn_name)

    # -- the end
    def stop(self) -> None:
        """Kill every rank and everything it started, then free every resource.

        Kill first: each rank leads its own process group, so one ``killpg(SIGKILL)`` per
        rank ends it and the workers it started. Then the control pipes close (a rank's
        watchdog would end it too), the server reports the ranks reaped, and any process that
        had left its rank's group is killed: on Linux the server adopts such orphans (it is a
        child subreaper), so they are its children now; elsewhere they are looked up, before
        the kill, among the server's descendants. The caller holds interrupts meanwhile (see
        ``helpers.spawn.run``), so nothing here can be cut short.
        """
        import shutil

        self.stopping = True
        before = [] if orphans_adopted_by_server() else self.server.children()
        for r in self.ranks:
            if r.pid is not None:
                _kill_group(r.pid)
        for pid in before:
            _kill_group(pid)
        for r in self.ranks:
            _close(r.control_fd)
        self._await_exits(limit=10.0)
        self._kill_the_rest()
        for supervisor in self.supervisors:
            supervisor.stop()
        for r in self.ranks:
            for fd in r.fds:
                _close(fd)
        self.sel.close()
        self.store = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _kill_the_rest(self) -> None:
        """Kill what is still under the server once the ranks are reaped (adopted orphans)."""
        import psutil

        for _ in range(5):  # an orphan's own children are adopted once it dies: a few rounds
            left = []
            for pid in self.server.direct_children():
                _kill_group(pid)
                try:
                    left.append(psutil.Process(pid))
                except psutil.Error:
                    pass
            if not left:
                return
            psutil.wait_procs(left, timeout=5)

    def _await_exits(self, limit: float) -> None:
        """Until the server has reaped every rank (so none is left even as a zombie)."""
        waiting = {r.pid for r in self.ranks if r.pid is not None and not r.exited}
        deadline = time.monotonic() + limit
        sel = selectors.DefaultSelector()
        sel.register(self.server.sock, selectors.EVENT_READ)
        try:
            while waiting and not self.server.reader.closed and time.monotonic() < deadline:
                for event in self.server.events():
                    if event.get("op") == "exit":
                        waiting.discard(event.get("pid"))
                if waiting:
                    sel.select(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
        finally:
            sel.close()


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _package_parent() -> str:
    """The folder that holds the ``helpers`` package (so the server and ranks import it)."""
    import helpers

    return os.path.dirname(os.path.dirname(os.path.abspath(helpers.__file__)))
