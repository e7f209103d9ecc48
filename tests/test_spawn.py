"""helpers.spawn.run on real gloo process groups: every promise of the pool, each able to fail.

Tests about notebooks run in real kernels (jupyter_client / nbclient).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from helpers.spawn import HangError, JoinTimeout, WorkerError, live_ranks, run


# ----------------------------------------------------------------------------- basics


def _rank_and_size():
    return dist.get_rank(), dist.get_world_size()


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_returns_values_in_rank_order(world_size):
    assert run(_rank_and_size, world_size=world_size, echo=False) == [
        (r, world_size) for r in range(world_size)
    ]


def test_args_and_kwargs_reach_every_rank():
    def f(a, b, *, scale):
        return (a + b) * scale + dist.get_rank()

    assert run(f, 1, 2, world_size=3, scale=10, echo=False) == [30, 31, 32]


def test_collectives_work_across_ranks():
    def f():
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return t.item()

    assert run(f, world_size=4, echo=False) == [10.0] * 4


def test_closures_and_lambdas_are_shipped_by_value():
    offset = 41

    def closure():
        return offset + dist.get_rank()

    assert run(closure, world_size=2, echo=False) == [41, 42]
    assert run(lambda: "lam", world_size=2, echo=False) == ["lam", "lam"]


def test_environment_is_torchrun_s():
    def env():
        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        return {k: os.environ[k] for k in keys}

    out = run(env, world_size=3, echo=False)
    assert [o["RANK"] for o in out] == ["0", "1", "2"]
    assert [o["LOCAL_RANK"] for o in out] == ["0", "1", "2"]
    assert {o["WORLD_SIZE"] for o in out} == {"3"}
    assert {o["MASTER_ADDR"] for o in out} == {"127.0.0.1"}
    assert len({o["MASTER_PORT"] for o in out}) == 1


def test_a_script_that_initialises_the_group_itself_runs_as_under_torchrun():
    def script():
        import torch.distributed as d

        d.init_process_group(backend="gloo")  # env://, exactly as a torchrun script does
        t = torch.ones(1)
        d.all_reduce(t)
        d.destroy_process_group()
        return t.item()

    assert run(script, world_size=3, init_process_group=False, echo=False) == [3.0] * 3


def test_one_intra_op_thread_per_rank_by_default():
    assert run(torch.get_num_threads, world_size=2, echo=False) == [1, 1]
    assert run(torch.get_num_threads, world_size=2, threads=2, echo=False) == [2, 2]


def test_rendezvous_never_collides_between_concurrent_pools(tmp_path):
    """Several processes each run pools back to back, all at the same time."""
    script = tmp_path / "pools.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        from helpers.spawn import run
        def f():
            t = torch.ones(1); dist.all_reduce(t); return t.item()
        for _ in range(5):
            assert run(f, world_size=2, echo=False) == [2.0, 2.0]
        print("ok")
    """))
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and out.strip() == "ok", err[-2000:]


# ----------------------------------------------------------------------------- output


class _Recorder:
    """A stand-in for sys.stdout that records lines and can react to one."""

    def __init__(self, on_line=None):
        self.lines, self.on_line, self._buf = [], on_line, ""

    def write(self, text):
        self._buf += text
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            self.lines.append(line)
            if self.on_line:
                self.on_line(line)

    def flush(self):
        pass


def test_output_is_streamed_while_ranks_run_and_tagged_by_rank(tmp_path, monkeypatch):
    """Rank 1 blocks until the caller has *seen* its first line: only streaming lets it finish."""
    flag = tmp_path / "seen"

    def react(line):
        if line == "[rank 1] waiting for the notebook to see me":
            flag.touch()

    rec = _Recorder(react)
    monkeypatch.setattr(sys, "stdout", rec)

    def f(path):
        import pathlib
        import select

        if dist.get_rank() == 1:
            print("waiting for the notebook to see me", flush=True)
            while not pathlib.Path(path).exists():
                select.select([], [], [], 0.01)
        print(f"done on {dist.get_rank()}")
        return dist.get_rank()

    assert run(f, str(flag), world_size=2, timeout=60) == [0, 1]
    assert "[rank 0] done on 0" in rec.lines and "[rank 1] done on 1" in rec.lines
    assert rec.lines.index("[rank 1] waiting for the notebook to see me") < rec.lines.index(
        "[rank 1] done on 1")


def test_stderr_is_tagged_and_gloo_chatter_is_hidden(capsys):
    def f():
        print("to stderr", file=sys.stderr)

    run(f, world_size=2)
    err = capsys.readouterr().err
    assert "[rank 0] to stderr" in err and "[rank 1] to stderr" in err
    assert "[Gloo]" not in err


def test_echo_false_prints_nothing(capsys):
    run(lambda: print("quiet"), world_size=2, echo=False)
    assert "quiet" not in capsys.readouterr().out


# ----------------------------------------------------------------------------- hangs


def _barrier_on_rank0_only():
    if dist.get_rank() == 0:
        dist.barrier()
    return "returned"


def test_hang_reports_where_each_rank_is_blocked():
    with pytest.raises(HangError) as info:
        run(_barrier_on_rank0_only, world_size=3, timeout=3, echo=False)
    err = info.value
    assert isinstance(err, TimeoutError)
    r0, r1, r2 = err.ranks
    assert not r0.finished and r1.finished and r2.finished
    assert r0.function == "_barrier_on_rank0_only"
    assert r0.line == "dist.barrier()"
    assert r0.filename == __file__ and isinstance(r0.lineno, int)
    assert r0.waiting_in == "barrier"
    text = str(err)
    assert "rank 0: blocked at `dist.barrier()` inside _barrier_on_rank0_only()" in text
    assert "rank 1: finished" in text and "rank 2: finished" in text
    assert live_ranks() == []


def test_finished_ranks_stay_alive_so_a_hang_is_a_hang_not_a_peer_crash():
    """Rank 1 returns at once; rank 0's barrier must wait (HangError), not fail with
    'Connection closed by peer' (WorkerError) as it would if rank 1 had exited."""
    with pytest.raises(HangError):
        run(_barrier_on_rank0_only, world_size=2, timeout=3, echo=False)


def test_the_pool_adds_no_collective_around_fn():
    """Rank 0 calls barrier twice, rank 1 once. A pool that ran its own barrier after fn
    would pair with rank 0's second call and let this finish; it must hang."""

    def f():
        dist.barrier()
        if dist.get_rank() == 0:
            dist.barrier()

    with pytest.raises(HangError) as info:
        run(f, world_size=2, timeout=3, echo=False)
    assert [r.rank for r in info.value.blocked] == [0]


def test_a_hang_in_plain_python_is_located_too():
    def spin():
        if dist.get_rank() == 1:
            while True:
                pass

    with pytest.raises(HangError) as info:
        run(spin, world_size=2, timeout=2, echo=False)
    blocked = info.value.blocked
    assert [r.rank for r in blocked] == [1]
    assert blocked[0].function == "spin" and blocked[0].line in ("while True:", "pass")


def test_next_run_works_after_a_hang():
    with pytest.raises(HangError):
        run(_barrier_on_rank0_only, world_size=2, timeout=2, echo=False)
    assert run(_rank_and_size, world_size=2, echo=False) == [(0, 2), (1, 2)]


# ----------------------------------------------------------------------------- crashes


def test_an_exception_on_one_rank_is_reported_at_once_with_its_traceback():
    """The other ranks sit in a barrier; with a 10-minute timeout only an immediate
    WorkerError (not HangError) can end this test in time."""

    def f():
        if dist.get_rank() == 2:
            raise ValueError("bad batch on purpose")
        dist.barrier()

    with pytest.raises(WorkerError) as info:
        run(f, world_size=3, timeout=600, echo=False)
    err = info.value
    assert err.rank == 2 and err.exc_type == "ValueError"
    assert err.exc_message == "bad batch on purpose"
    assert "raise ValueError" in err.remote_traceback and __file__ in err.remote_traceback
    assert "rank 2 raised ValueError: bad batch on purpose" in str(err)
    assert live_ranks() == []


def test_a_rank_killed_by_a_signal_is_named_not_its_peers_connection_errors():
    def f():
        if dist.get_rank() == 1:
            os.abort()
        dist.barrier()

    with pytest.raises(WorkerError) as info:
        run(f, world_size=3, timeout=600, echo=False)
    assert info.value.rank == 1
    assert "SIGABRT" in str(info.value)


def test_a_rank_that_exits_without_returning_is_reported():
    def f():
        if dist.get_rank() == 0:
            os._exit(3)
        dist.barrier()

    with pytest.raises(WorkerError) as info:
        run(f, world_size=2, timeout=600, echo=False)
    assert info.value.rank == 0 and "exited with code 3" in str(info.value)


def test_sys_exit_in_a_rank_is_an_error_not_a_silent_success():
    def f():
        sys.exit(2)

    with pytest.raises(WorkerError) as info:
        run(f, world_size=2, echo=False)
    assert info.value.exc_type == "SystemExit"


# ----------------------------------------------------------------------------- debug mode


def test_detail_debug_catches_a_collective_mismatch_at_once():
    def mismatch():
        if dist.get_rank() == 0:
            dist.barrier()
        else:
            dist.all_reduce(torch.ones(1))

    with pytest.raises(WorkerError) as info:
        run(mismatch, world_size=2, timeout=600, detail_debug=True, echo=False)
    assert "Detected mismatch between collectives" in str(info.value)


def test_without_detail_debug_the_same_mismatch_is_a_hang():
    def mismatch():
        if dist.get_rank() == 0:
            dist.barrier()
        else:
            dist.all_reduce(torch.ones(1))

    with pytest.raises(HangError):
        run(mismatch, world_size=2, timeout=3, echo=False)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad", [3, "train", None])
def test_a_non_callable_is_refused_with_advice(bad):
    with pytest.raises(TypeError, match="needs a function"):
        run(bad)


@pytest.mark.parametrize("ws", [0, -1])
def test_world_size_below_one_is_refused(ws):
    with pytest.raises(ValueError, match="world_size must be between 1"):
        run(_rank_and_size, world_size=ws)


def test_world_size_must_be_an_int():
    with pytest.raises(TypeError, match="whole number"):
        run(_rank_and_size, world_size=2.0)


def test_an_unsendable_return_value_names_the_rank_and_type():
    def f():
        import threading as th

        return th.Lock() if dist.get_rank() == 1 else 1

    with pytest.raises(WorkerError) as info:
        run(f, world_size=2, echo=False)
    assert info.value.rank == 1
    assert "rank 1 returned a lock" in str(info.value).lower() or "rank 1 returned a _thread.lock" in str(info.value)


def test_an_unsendable_function_is_refused_before_any_rank_starts():
    lock = threading.Lock()

    def f():
        return lock

    with pytest.raises(TypeError, match="cannot be sent to the ranks"):
        run(f, world_size=2)


# ----------------------------------------------------------------------------- interrupts


def _ready_then_wait():
    import select

    print("ready", flush=True)
    select.select([], [], [], 600)


def _interrupt_when(line: str):
    """A stdout stand-in that sends this process SIGINT when a rank prints `line`: the
    interrupt arrives exactly when the rank says it is running, with no timer."""
    import signal

    def react(seen):
        if seen == line:
            os.kill(os.getpid(), signal.SIGINT)

    return _Recorder(react)


@pytest.mark.usefixtures("sigint_raises")
def test_keyboard_interrupt_reaches_the_caller_and_kills_the_pool(monkeypatch):
    monkeypatch.setattr(sys, "stdout", _interrupt_when("[rank 1] ready"))
    with pytest.raises(KeyboardInterrupt):
        run(_ready_then_wait, world_size=2, timeout=300)
    assert live_ranks() == []
    assert run(_rank_and_size, world_size=2, echo=False) == [(0, 2), (1, 2)]


@pytest.mark.parametrize("during", ["stop", "_kill_the_rest", "_await_exits"])
@pytest.mark.usefixtures("sigint_raises")
def test_a_second_interrupt_while_the_pool_stops_cannot_leave_ranks_alive(monkeypatch, during):
    """The second SIGINT is sent from inside the stop (at its start, between the kills, while
    awaiting the exits): it is held until every rank is dead."""
    import signal

    from helpers._pool.pool import Pool

    original = getattr(Pool, during)
    seen = []

    def interrupted_again(self, *args, **kwargs):
        seen.append(during)
        os.kill(os.getpid(), signal.SIGINT)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Pool, during, interrupted_again)
    monkeypatch.setattr(sys, "stdout", _interrupt_when("[rank 2] ready"))
    with pytest.raises(KeyboardInterrupt):
        run(_ready_then_wait, world_size=3, timeout=300)
    assert seen == [during]
    assert live_ranks() == []


class _BlockWhileUnpickled:
    """Unpickling this (in the rank, before it joins the group) prints a line and blocks."""

    def __reduce__(self):
        return (_ready_then_wait, ())


@pytest.mark.usefixtures("sigint_raises")
def test_an_interrupt_during_start_up_kills_the_pool(monkeypatch):
    monkeypatch.setattr(sys, "stdout", _interrupt_when("[rank 0] ready"))
    with pytest.raises(KeyboardInterrupt):
        run(_rank_and_size, _BlockWhileUnpickled(), world_size=2, timeout=300)
    assert live_ranks() == []


def test_the_next_run_kills_what_an_earlier_pool_left_alive(monkeypatch):
    """A pool whose stop never ran (here: skipped on purpose) leaves ranks alive; the next
    run() ends them before it starts its own."""
    from helpers._pool.pool import Pool

    stop = Pool.stop
    monkeypatch.setattr(Pool, "stop", lambda self: None)
    assert run(_rank_and_size, world_size=2, echo=False) == [(0, 2), (1, 2)]
    left = live_ranks()
    assert len(left) == 2
    monkeypatch.setattr(Pool, "stop", stop)
    assert run(_rank_and_size, world_size=3, echo=False) == [(0, 3), (1, 3), (2, 3)]
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in left if psutil.pid_exists(p)],
                                    timeout=10)
    assert not alive and live_ranks() == []


def _start_a_daemon():
    """A process in its own session (outside the rank's process group), left running."""
    import subprocess as sp

    child = sp.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                     start_new_session=True)
    return child.pid


def test_a_process_a_rank_started_in_its_own_session_does_not_outlive_the_pool():
    pids = run(_start_a_daemon, world_size=2, echo=False)
    for pid in pids:
        try:
            p = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        assert p.status() == psutil.STATUS_ZOMBIE or not p.is_running(), p.cmdline()
    assert live_ranks() == []


# ----------------------------------------------------------------------------- the two clocks


class _SlowToUnpickle:
    """Unpickling this on rank 1 takes `seconds` of start-up (before the rank joins)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __reduce__(self):
        return (_start_slowly, (self.seconds,))


def _start_slowly(seconds):
    import select

    if os.environ["RANK"] == "1":
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # the delay under test, not a synchronisation
            select.select([], [], [], end - time.monotonic())
    return None


def test_the_hang_clock_starts_when_every_rank_has_joined():
    """Start-up that takes longer than `timeout` does not count against fn."""
    def f(_):
        dist.barrier()
        return dist.get_rank()

    assert run(f, _SlowToUnpickle(3), world_size=2, timeout=1, echo=False) == [0, 1]


def test_ranks_that_do_not_join_in_time_are_named_with_where_they_were():
    with pytest.raises(JoinTimeout) as info:
        run(_rank_and_size, _BlockWhileUnpickled(), world_size=2, start_timeout=2, echo=False)
    err = info.value
    assert not isinstance(err, HangError) and isinstance(err, TimeoutError)
    assert str(err).startswith("ranks 0, 1 did not join the process group within 2 s")
    assert all(r.phase == "starting" for r in err.ranks)
    assert live_ranks() == []


def test_a_rank_waiting_for_a_late_peer_is_shown_inside_init_process_group():
    with pytest.raises(JoinTimeout) as info:
        run(_rank_and_size, _SlowToUnpickle(600), world_size=2, start_timeout=3, echo=False)
    r0, r1 = info.value.ranks
    assert r0.waiting_in == "init_process_group"
    assert "rank 0: still starting, not yet in the process group (in init_process_group())" in str(info.value)
    assert str(info.value).startswith("ranks 0, 1 did not join")
    assert r1.function == "_start_slowly" and "rank 1: still starting, not yet in the process " \
        "group: at `select.select([], [], [], end - time.monotonic())` inside _start_slowly()" \
        in str(info.value)


def test_results_that_arrived_in_time_count_even_if_the_caller_reads_them_late(monkeypatch):
    """The caller is busy (its output sink takes longer than `timeout`) while the ranks
    return: at the deadline the results are waiting in the pipes, and they are used."""
    def slow_sink(line):
        end = time.monotonic() + 3
        while time.monotonic() < end:  # a caller busy elsewhere: the delay under test
            pass

    monkeypatch.setattr(sys, "stdout", _Recorder(slow_sink))

    def f():
        print("done")
        return dist.get_rank()

    assert run(f, world_size=2, timeout=1) == [0, 1]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1, 0, "3", True])
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused(bad):
    with pytest.raises(ValueError, match="positive, finite number of seconds"):
        run(_rank_and_size, timeout=bad)
    with pytest.raises(ValueError, match="start_timeout must be a positive, finite"):
        run(_rank_and_size, start_timeout=bad)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_threads_are_refused(bad):
    with pytest.raises(ValueError, match="threads must be a whole number"):
        run(_rank_and_size, threads=bad)


class _CountsItsPickling:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        with open(self.path, "a") as f:
            f.write("x")
        return (_CountsItsPickling, (self.path,))


def test_a_return_value_is_pickled_once(tmp_path):
    counter = tmp_path / "count"
    out = run(lambda: _CountsItsPickling(str(counter)), world_size=1, echo=False)
    assert isinstance(out[0], _CountsItsPickling)
    assert counter.read_text() == "x"


# ----------------------------------------------------------------------------- simulated nodes

_TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE",
                  "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                  "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_SIGNALS_TO_HANDLE",
                  "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS")
# Set by both, with values that name this launch (a port, an id, a path), not the layout.
_PER_LAUNCH_KEYS = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")

_WRITE_ENV = """
import json, os, sys
base = json.loads(open(sys.argv[1]).read())
with open(os.path.join(sys.argv[2], "rank" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump({k: v for k, v in os.environ.items() if base.get(k) != v}, f)
"""


def _env_added_by_the_launcher(base: dict) -> dict:
    return {k: v for k, v in os.environ.items() if base.get(k) != v}


def test_nodes_are_laid_out_exactly_as_two_torchrun_agents_lay_them_out(tmp_path):
    """Two real torchrun agents (--nnodes=2 --nproc_per_node=2, c10d rendezvous) against
    run(world_size=4, nproc_per_node=2): the same variables, the same values per rank."""
    import json
    import socket

    base = dict(os.environ)
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "script.py").write_text(_WRITE_ENV)
    (tmp_path / "out").mkdir()
    (tmp_path / "tmp").mkdir()  # the agents' own temp folders go here, removed with tmp_path
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=2",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=layout",
           str(tmp_path / "script.py"), str(tmp_path / "base.json"), str(tmp_path / "out")]
    agents = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=tmp_path, env={**base, "TMPDIR": str(tmp_path / "tmp")})
              for _ in range(2)]
    outs = [a.communicate(timeout=300) for a in agents]
    assert [a.returncode for a in agents] == [0, 0], [err[-2000:] for _, err in outs]
    theirs = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(4)]
    for env in theirs:
        del env["TMPDIR"]  # ours, for the agents
    ours = run(_env_added_by_the_launcher, base, world_size=4, nproc_per_node=2, echo=False)

    assert len(theirs) == 4
    assert set(_TORCHRUN_KEYS + _PER_LAUNCH_KEYS) <= set(theirs[0])
    # Every variable torchrun sets, we set (the pool adds its own few, such as NODE_LOCAL_DIR).
    assert set(theirs[0]) - {"SHLVL", "_"} <= set(ours[0])
    for t, o in zip(theirs, ours):
        assert {k: o[k] for k in _TORCHRUN_KEYS} == {k: t[k] for k in _TORCHRUN_KEYS}
    assert [(o["GROUP_RANK"], o["LOCAL_RANK"]) for o in ours] == [
        ("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]


def _layout():
    return {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                       "GROUP_WORLD_SIZE")}


def test_by_default_every_rank_is_on_one_node():
    out = run(_layout, world_size=3, echo=False)
    assert out == [{"RANK": str(r), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "3",
                    "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1"} for r in range(3)]


def _node_dirs():
    """Local rank 0 of each node leaves a file in the node's folder; every rank then lists it."""
    import pathlib

    here = pathlib.Path(os.environ["NODE_LOCAL_DIR"])
    empty_at_start = not any(here.iterdir())
    dist.barrier()
    if os.environ["LOCAL_RANK"] == "0":
        (here / f"from_rank_{dist.get_rank()}").write_text("x")
    dist.barrier()
    return str(here), empty_at_start, sorted(p.name for p in here.iterdir())


def test_each_simulated_node_has_its_own_scratch_folder_removed_at_the_end():
    out = run(_node_dirs, world_size=6, nproc_per_node=2, echo=False)
    folders = [o[0] for o in out]
    assert all(o[1] for o in out), "a node folder was not empty when the ranks started"
    assert folders[0] == folders[1] != folders[2] == folders[3] != folders[4] == folders[5]
    assert len(set(folders)) == 3
    assert [o[2] for o in out] == [["from_rank_0"]] * 2 + [["from_rank_2"]] * 2 + [["from_rank_4"]] * 2
    for f in folders:
        assert not os.path.exists(f)
        assert not os.path.exists(os.path.dirname(f))


def test_node_folders_are_removed_after_a_failure_too(monkeypatch):
    def fail():
        if dist.get_rank() == 1:
            print("DIR", os.environ["NODE_LOCAL_DIR"], flush=True)
            raise ValueError("on purpose")
        dist.barrier()

    rec = _Recorder()
    monkeypatch.setattr(sys, "stdout", rec)
    with pytest.raises(WorkerError):
        run(fail, world_size=2, timeout=600)
    folder = [l.split("DIR ", 1)[1] for l in rec.lines if "DIR " in l]
    assert len(folder) == 1 and not os.path.exists(folder[0])


@pytest.mark.parametrize("world_size, nproc, error, match", [
    (5, 2, ValueError, "does not divide world_size=5"),
    (4, 0, ValueError, "nproc_per_node=0 does not divide"),
    (4, -2, ValueError, "nproc_per_node=-2 does not divide"),
    (4, 8, ValueError, "nproc_per_node=8 does not divide"),
    (4, 2.0, TypeError, "nproc_per_node must be a whole number"),
    (4, True, TypeError, "nproc_per_node must be a whole number"),
])
def test_a_bad_layout_is_refused_with_advice(world_size, nproc, error, match):
    with pytest.raises(error, match=match):
        run(_layout, world_size=world_size, nproc_per_node=nproc)
