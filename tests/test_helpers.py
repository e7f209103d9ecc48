"""The small helpers every lesson leans on: slow writes and torn reads, grading feedback,
hang pictures, the environment check. Real processes and real files throughout."""

from __future__ import annotations

import io
import re
import os

import pytest
import torch
import torch.distributed as dist

from helpers.lessons import races
from helpers.grading import call, run_answer
from helpers.grading.answers import feedback_for_hang
from helpers.spawn import HangError, run


# ----------------------------------------------------------------------------- races


def test_slow_save_writes_exactly_what_torch_save_writes(tmp_path):
    obj = {"w": torch.arange(1000.0), "step": 3}
    races.slow_save(obj, tmp_path / "a.pt", chunks=5, pause=0.0)
    buf = io.BytesIO()
    torch.save(obj, buf)
    assert (tmp_path / "a.pt").read_bytes() == buf.getvalue()
    assert races.try_load(tmp_path / "a.pt") == "ok"


def test_try_load_tells_missing_from_torn(tmp_path):
    assert races.try_load(tmp_path / "nope.pt") == "missing"
    races.slow_save({"w": torch.ones(100)}, tmp_path / "x.pt", pause=0.0)
    data = (tmp_path / "x.pt").read_bytes()
    (tmp_path / "x.pt").write_bytes(data[: len(data) // 2])
    outcome = races.try_load(tmp_path / "x.pt")
    assert outcome == "torn" and outcome.detail


def _write_and_read(path):
    """Rank 0 writes slowly; rank 1 reads as soon as the file appears, with no barrier."""
    import pathlib
    import select

    if dist.get_rank() == 0:
        races.slow_save({"w": torch.ones(10_000)}, path, chunks=8, pause=0.1)
        return "wrote"
    while not pathlib.Path(path).exists():
        select.select([], [], [], 0.005)
    return str(races.try_load(path))


def test_a_reader_during_a_slow_write_sees_a_torn_file(tmp_path):
    assert run(_write_and_read, str(tmp_path / "c.pt"), world_size=2, echo=False) == ["wrote", "torn"]
    assert races.try_load(tmp_path / "c.pt") == "ok"


def _saves_three_ways(path):
    """Rank 0 saves to a path, rank 1 to an open file via `from torch import save`, rank 2 to memory."""
    import torch.serialization
    from torch import save

    before = torch.serialization._open_zipfile_writer

    with races.watch_saves() as log:
        rank = dist.get_rank()
        if rank == 0:
            torch.save({"x": 1}, path)
        elif rank == 1:
            with open(path + ".1", "wb") as f:
                save({"x": 1}, f)
        else:
            torch.save({"x": 1}, io.BytesIO())
    return [e["target"] for e in log], torch.serialization._open_zipfile_writer is before


def test_watch_saves_sees_every_write_however_torch_save_was_imported(tmp_path):
    path = str(tmp_path / "c.pt")
    assert run(_saves_three_ways, path, world_size=3, echo=False) == [
        ([path], True), ([path + ".1"], True), ([], True)]
    assert torch.load(path + ".1", weights_only=True) == {"x": 1}


def _slow_save_then_read(path, barrier):
    dist.barrier()
    with races.watch_saves(chunks=8, pause=0.1) as log:
        if dist.get_rank() == 0:
            torch.save({"w": torch.arange(1000.0)}, path)
    if barrier:
        dist.barrier()
    took = [e["end"] - e["start"] for e in log]
    return str(races.try_load(path)), took


def test_a_slowed_save_is_seen_half_done_without_a_barrier(tmp_path):
    without = run(_slow_save_then_read, str(tmp_path / "a.pt"), False, world_size=3, echo=False)
    assert without[0][0] == "ok" and all(r in ("missing", "torn") for r, _ in without[1:])
    assert without[0][1][0] >= 7 * 0.1  # seven pauses between eight chunks
    assert [r for r, _ in run(_slow_save_then_read, str(tmp_path / "b.pt"), True, world_size=3,
                               echo=False)] == ["ok"] * 3
    assert torch.equal(torch.load(tmp_path / "b.pt", weights_only=True)["w"], torch.arange(1000.0))


def test_slow_torch_save_writes_the_same_bytes_to_paths_and_files(tmp_path):
    with races.slow_torch_save(chunks=4, pause=0.0):
        torch.save({"a": 1}, tmp_path / "p.pt")
        with open(tmp_path / "f.pt", "wb") as f:
            torch.save({"b": 2}, f)
    buf = io.BytesIO()
    torch.save({"a": 1}, buf)
    assert (tmp_path / "p.pt").read_bytes() == buf.getvalue()
    assert torch.load(tmp_path / "f.pt") == {"b": 2}


def test_slow_save_refuses_zero_chunks(tmp_path):
    with pytest.raises(ValueError, match="chunks"):
        races.slow_save({}, tmp_path / "z.pt", chunks=0)


# ----------------------------------------------------------------------------- grading


def _call_on_every_rank(answer):
    return answer()


def stuck_answer():
    if dist.get_rank() == 0:
        dist.barrier()


def test_a_hanging_answer_fails_with_advice_and_is_not_rerun(monkeypatch):
    with pytest.raises(AssertionError) as first:
        run_answer(_call_on_every_rank, stuck_answer, name="stuck_answer", world_size=3, timeout=3)
    msg = str(first.value)
    assert "stuck_answer() never finished" in msg
    assert "Rank 0 was stuck at `dist.barrier()`" in msg
    assert "not inside `if rank == 0:`" in msg
    with pytest.raises(AssertionError, match="^Not run again: stuck_answer"):
        run_answer(_call_on_every_rank, stuck_answer, name="stuck_answer", world_size=3, timeout=3)


def test_a_fixed_answer_is_run_again_after_a_hang():
    def answer():
        if dist.get_rank() == 0:
            dist.barrier()

    with pytest.raises(AssertionError):
        run_answer(_call_on_every_rank, answer, name="answer", timeout=3)

    def answer():  # noqa: F811 - the learner re-ran a fixed cell
        dist.barrier()
        return 1

    assert run_answer(_call_on_every_rank, answer, name="answer", timeout=30) == [1, 1, 1]


def test_an_exception_inside_a_rank_names_the_rank_the_error_and_the_line():
    def answer():
        if dist.get_rank() == 1:
            return {}["missing"]
        return 1

    with pytest.raises(AssertionError) as info:
        run_answer(_call_on_every_rank, answer, name="answer", world_size=2)
    text = str(info.value)
    assert text.startswith("answer() raised KeyError on rank 1: 'missing'")
    assert 'return {}["missing"]' in text


def test_an_answer_that_is_not_a_function_is_refused_before_anything_runs():
    class save_once:  # noqa: N801 - what a learner might write instead of a def
        pass

    with pytest.raises(AssertionError, match=r"save_once should be a function written with `def save_once\(...\):`"):
        run_answer(_call_on_every_rank, save_once, name="save_once", world_size=2)


def interrupts_the_grader(kernel_pid):
    """In the rank: interrupt the process that runs the check, as nbgrader does at a cell's limit,
    then wait as a hanging answer would."""
    import signal

    dist.barrier()  # every rank is up
    if dist.get_rank() == 1:
        os.kill(kernel_pid, signal.SIGINT)
    else:
        dist.barrier()  # waits for ever: rank 1 has returned


@pytest.mark.usefixtures("sigint_raises")
def test_run_answer_remembers_an_answer_that_was_interrupted():
    def harness(fn, pid):
        return fn(pid)

    with pytest.raises(KeyboardInterrupt):
        run_answer(harness, interrupts_the_grader, os.getpid(), name="slow", world_size=2, timeout=30)
    with pytest.raises(AssertionError, match=r"^Not run again: slow\(\) was still running when the cell's time limit"):
        run_answer(harness, interrupts_the_grader, os.getpid(), name="slow", world_size=2, timeout=30)


def test_an_unwritten_answer_says_so():
    def todo():
        raise NotImplementedError()

    with pytest.raises(AssertionError, match=r"todo\(\) is not written yet"):
        run_answer(_call_on_every_rank, todo, name="todo", world_size=2)


# ----------------------------------------------------------------------------- plots


def test_plot_hang_draws_one_bar_per_rank_and_states_the_finding():
    import matplotlib

    matplotlib.use("Agg")
    from helpers.lessons.figures import hang_title, plot_hang

    with pytest.raises(HangError) as info:
        run(stuck_answer, world_size=3, timeout=2, echo=False)
    ax = plot_hang(info.value)
    assert ax.get_title() == hang_title(info.value)
    assert ax.get_title() == "rank 0 waits at dist.barrier(); ranks 1, 2 had returned"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1", "rank 2"]
    assert feedback_for_hang(info.value, "x") == (
        "x() never finished: it hung for 2 s. Rank 0 was stuck at `dist.barrier()` (in stuck_answer(), "
        f"line {stuck_answer.__code__.co_firstlineno + 2}). Rank(s) 1, 2 had already returned, so they never "
        "reached that call. Every rank must reach every barrier and every collective: put dist.barrier() "
        "(or the all_reduce) where all ranks run it, not inside `if rank == 0:`.")


# ----------------------------------------------------------------------------- environment


def test_environment_check_passes_here(capsys):
    import platform

    from helpers.env_check import check

    results = check()
    assert all(c.ok for c in results)
    out = capsys.readouterr().out
    assert "2-rank gloo pool" in out and "FIX" not in out
    assert re.search(rf"ok +OS: Linux or macOS +{platform.system()} {re.escape(platform.release())}", out)


def test_environment_check_names_what_is_missing_and_how_to_fix_it(tmp_path):
    """A real failing check: a Python started without its site-packages (-S) finds the
    course's helpers but none of the packages; the check says what to install, and fails."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = subprocess.run(
        [sys.executable, "-S", "-c", "from helpers.env_check import check; check()"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 1
    assert "FIX   torch 2.13.0" in out.stdout and "missing" in out.stdout
    assert "2-rank gloo pool" not in out.stdout  # no pool is tried on a broken environment
    assert "EnvironmentProblem: This kernel cannot run the course yet:" in out.stderr
    assert "- torch 2.13.0: found missing. pip install torch==2.13.0  (or: From the course " \
        "folder run `make lab`" in out.stderr


def test_the_environment_check_refuses_windows_and_only_warns_about_a_cuda_build():
    import types

    from helpers.env_check import _os_check, _torch_build_check

    windows = _os_check("win32")
    assert not windows.ok and "WSL2" in windows.fix
    assert _os_check("darwin").ok
    cuda = _torch_build_check(types.SimpleNamespace(__version__="2.13.0+cu130",
                                                    version=types.SimpleNamespace(cuda="13.0")))
    assert cuda.ok and "CUDA 13.0" in cuda.found and "runs on the CPU" in cuda.warning
    cpu = _torch_build_check(types.SimpleNamespace(__version__="2.13.0+cpu",
                                                   version=types.SimpleNamespace(cuda=None)))
    assert cpu.ok and not cpu.warning


def test_call_bounds_an_endless_loop_outside_the_kernel():
    def pooled(xs):
        while True:
            pass

    with pytest.raises(AssertionError, match=r"pooled\(\) never finished: it hung for 2 s"):
        call(pooled, [1], name="pooled", timeout=2)
    with pytest.raises(AssertionError, match="^Not run again"):
        call(pooled, [1], name="pooled", timeout=2)


def test_call_returns_values_and_exceptions_as_data_from_another_process():
    def half(x):
        if x < 0:
            raise ValueError("negative")
        return x / 2, os.getpid()

    value = call(half, 4, name="half")["value"]
    assert value[0] == 2 and value[1] != os.getpid()
    assert call(half, -1, name="half") == {"raised": "ValueError", "is_value_error": True,
                                           "message": "negative"}


def test_in_a_kernel_a_check_prints_one_line_or_only_its_message():
    """What a learner sees under a test cell, in a real Jupyter kernel: one ✓ line when it passes;
    when it fails, the message alone (no traceback through helpers/grading)."""
    import nbformat
    from nbclient import NotebookClient

    answer = "def combined_average(loss, count):\n    return loss\n"
    right = ("import torch, torch.distributed as dist\n"
             "def right(loss, count):\n    t = torch.tensor([loss * count, count], dtype=torch.float64)\n"
             "    dist.all_reduce(t)\n    return (t[0] / t[1]).item()\n")
    calls = "from helpers.grading import beginner as check\ncheck.combined_average_unequal_counts({}, [0.5, 1.5], [1, 3])"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(answer + right),
                                         nbformat.v4.new_code_cell(calls.format("right")),
                                         nbformat.v4.new_code_cell(calls.format("combined_average"))])
    NotebookClient(nb, timeout=120, allow_errors=True, kernel_name="python3").execute()
    ok, failed = nb.cells[1].outputs, nb.cells[2].outputs
    assert [o.get("text") for o in ok] == ["✓ right with unequal counts too (2 workers, 4 examples)\n"]
    (err,) = [o for o in failed if o.output_type == "error"]
    assert err.ename == "CheckFailed" and err.evalue.startswith("Each worker returned its own loss")
    assert err.traceback == ["✗ " + err.evalue]
