"""The pool's platform choices (helpers/_pool/platform.py) and its stack reading
(helpers/_pool/stacks.py): pure functions, tested here for every platform, plus the two
start methods run for real on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from helpers._pool import platform, stacks


# ----------------------------------------------------------------------------- platforms


@pytest.mark.parametrize("name", ["win32", "cygwin"])
def test_windows_is_refused_with_advice_to_use_wsl2(name):
    with pytest.raises(OSError, match="WSL2"):
        platform.check_supported(name)


@pytest.mark.parametrize("name", ["linux", "darwin"])
def test_linux_and_macos_are_supported(name):
    platform.check_supported(name)


def test_gloo_uses_each_platform_s_loopback_interface():
    assert platform.loopback_interface("linux") == "lo"
    assert platform.loopback_interface("darwin") == "lo0"


def test_the_parent_death_signal_is_linux_only_and_can_be_turned_off():
    assert platform.has_parent_death_signal("linux", environ={})
    assert not platform.has_parent_death_signal("darwin", environ={})
    assert not platform.has_parent_death_signal("linux", environ={"HELPERS_SPAWN_NO_PDEATHSIG": "1"})


def test_ranks_are_forked_only_from_a_single_threaded_server():
    assert platform.start_method(1, environ={}) == "fork"
    assert platform.start_method(2, environ={}) == "exec"
    assert platform.start_method(1, environ={"HELPERS_SPAWN_START": "exec"}) == "exec"
    assert platform.start_method(3, environ={"HELPERS_SPAWN_START": "fork"}) == "exec"
    with pytest.raises(ValueError, match="HELPERS_SPAWN_START"):
        platform.start_method(1, environ={"HELPERS_SPAWN_START": "spawn"})


def test_this_machine_s_server_is_single_threaded_and_forks():
    """The quiet thread pools keep the server at one thread, so ranks are forked (on Linux;
    on macOS this reports what its libraries allow: fork exactly when single-threaded)."""
    from helpers.spawn import _server, run

    run(lambda: None, world_size=1, echo=False)
    server = _server()
    assert (server.start_method == "fork") == (server.threads == 1)
    if sys.platform.startswith("linux"):
        assert server.threads == 1 and server.start_method == "fork"
    print(f"fork server: {server.threads} thread(s), ranks started by {server.start_method}")


def _dumpable() -> int:
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_DUMPABLE is Linux's")
def test_ranks_are_non_dumpable_and_a_hang_is_still_located():
    """No rank can read another's memory or descriptors (nor ptrace it); where a rank is stuck
    is read by its own faulthandler, on a signal, so the hang report still names the line."""
    from helpers.spawn import HangError, run

    assert _dumpable() == 1  # this process is left as it was
    assert run(_dumpable, world_size=3, echo=False) == [0, 0, 0]
    with pytest.raises(HangError) as info:
        run(_stuck_on_rank1, world_size=2, timeout=2, echo=False)
    assert info.value.ranks[1].line == "dist.barrier()" and info.value.ranks[0].finished


def _stuck_on_rank1():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        dist.barrier()


_EXEC_SCRIPT = textwrap.dedent("""
    import ctypes, os, torch, torch.distributed as dist
    from helpers.spawn import HangError, _server, run
    def f():
        t = torch.ones(1); dist.all_reduce(t)
        return t.item(), os.environ["GROUP_RANK"], ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)
    assert run(f, world_size=4, nproc_per_node=2, echo=False) == [
        (4.0, "0", 0), (4.0, "0", 0), (4.0, "1", 0), (4.0, "1", 0)]  # exec'ed, still non-dumpable
    def stuck():
        if dist.get_rank() == 1:
            dist.barrier()
    try:
        run(stuck, world_size=2, timeout=2, echo=False)
    except HangError as e:
        assert e.blocked[0].line == "dist.barrier()", str(e)
    print("started by", _server().start_method)
""")


def test_the_exec_start_method_runs_pools_too(tmp_path):
    """Where forking is unsafe, each rank is a fresh interpreter: collectives, layout and
    hang reports work the same."""
    script = tmp_path / "pools.py"
    script.write_text(_EXEC_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "HELPERS_SPAWN_START": "exec"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "started by exec"


# ----------------------------------------------------------------------------- stacks

_USER = "/home/me/train.py"
_TORCH = os.path.dirname(__import__("torch").__file__)
_RANK_PY = os.path.join(os.path.dirname(platform.__file__), "rank.py")
_SERVER_PY = os.path.join(os.path.dirname(platform.__file__), "server.py")
_THREADING = os.path.join(os.path.dirname(os.__file__), "threading.py")


def _dump(*threads: list[tuple[str, int, str]]) -> str:
    """A faulthandler dump: the watchdog thread first, the main (current) thread last."""
    out = []
    for i, frames in enumerate(threads):
        head = "Current thread" if i == len(threads) - 1 else "Thread"
        out.append(f"{head} 0x00007f{i:06x} (most recent call first):")
        out += [f'  File "{f}", line {n} in {fn}' for f, n, fn in frames]
        out.append("")
    return "\n".join(out)


_WATCHDOG = [(_RANK_PY, 33, "_watchdog"), (_THREADING, 982, "run"),
             (_THREADING, 1045, "_bootstrap_inner"), (_THREADING, 1002, "_bootstrap")]
_BOTTOM = [(_RANK_PY, 96, "rank_main"), (_SERVER_PY, 260, "_serve"),
           (_SERVER_PY, 222, "main"), ("<string>", 1, "<module>")]


def test_a_rank_blocked_in_a_barrier_is_placed_on_the_learner_s_line():
    main = [(f"{_TORCH}/distributed/distributed_c10d.py", 4811, "barrier"),
            (f"{_TORCH}/distributed/c10d_logger.py", 81, "wrapper"),
            (_USER, 12, "save_once"), (_USER, 20, "train")] + _BOTTOM
    dump = _dump(_WATCHDOG, main)
    assert stacks.dump_complete(dump)
    frames = stacks.parse_stack(dump)
    assert frames[0][2] == "barrier"  # the main thread, not the watchdog
    state = stacks.where(3, frames)
    assert (state.function, state.lineno, state.waiting_in) == ("save_once", 12, "barrier")
    assert state.phase == "running" and "blocked at line 12 inside save_once()" in state.describe()


def test_a_dump_cut_short_is_not_complete():
    main = [(_USER, 12, "save_once")] + _BOTTOM
    dump = _dump(_WATCHDOG, main)
    assert not stacks.dump_complete(dump[: dump.index("<module>") - 20])
    assert not stacks.dump_complete(_dump(_WATCHDOG))


def test_a_rank_still_joining_the_group_says_so():
    main = [(f"{_TORCH}/distributed/rendezvous.py", 190, "_create_c10d_store"),
            (f"{_TORCH}/distributed/distributed_c10d.py", 1700, "init_process_group"),
            (f"{_TORCH}/distributed/c10d_logger.py", 95, "wrapper"),
            (f"{_TORCH}/distributed/c10d_logger.py", 81, "wrapper")] + _BOTTOM
    state = stacks.where(0, stacks.parse_stack(_dump(_WATCHDOG, main)), joined=False)
    assert state.phase == "starting" and state.waiting_in == "init_process_group"
    assert state.describe() == ("rank 0: still starting, not yet in the process group "
                                "(in init_process_group())")


def test_a_rank_sending_its_result_is_not_reported_as_unreadable():
    main = [(os.path.join(os.path.dirname(_RANK_PY), "messages.py"), 80, "send"),
            ] + _BOTTOM
    state = stacks.where(1, stacks.parse_stack(_dump(_WATCHDOG, main)), joined=True)
    assert state.phase == "returning"
    assert "had returned; it was still sending the result back" in state.describe()


def test_an_empty_dump_is_unreadable_and_said_so():
    state = stacks.where(2, stacks.parse_stack(""))
    assert state.describe() == "rank 2: blocked (its stack could not be read)"


def test_notebook_cells_are_named_as_such():
    cell = "/tmp/ipykernel_4242/123456.py"
    main = [(f"{_TORCH}/distributed/distributed_c10d.py", 4811, "barrier"), (cell, 3, "f")] + _BOTTOM
    state = stacks.where(0, stacks.parse_stack(_dump(_WATCHDOG, main)))
    assert "(a notebook cell, line 3)" in state.describe()
