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
from helpers.grading import feedback_for_hang, run_answer
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


def test_slow_torch_save_patches_and_restores(tmp_path):
    original = torch.save
    with races.slow_torch_save(chunks=4, pause=0.0):
        assert torch.save is not original
        torch.save({"a": 1}, tmp_path / "p.pt")
        with open(tmp_path / "f.pt", "wb") as f:
            torch.save({"b": 2}, f)
    assert torch.save is original
    assert torch.load(tmp_path / "p.pt") == {"a": 1}
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


def test_an_assertion_inside_a_rank_becomes_plain_feedback():
    def check(answer):
        assert answer() == 2, f"you returned {answer()}"

    with pytest.raises(AssertionError, match=r"^On rank \d: you returned 1"):
        run_answer(check, lambda: 1, name="f", world_size=2)


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
    assert "feedback" not in feedback_for_hang(info.value, "x")


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


def test_call_answer_bounds_an_endless_loop_in_the_kernel():
    from helpers.grading import call_answer

    def pooled(xs):
        while True:
            pass

    with pytest.raises(AssertionError, match=r"pooled\(\) did not return within 1 s"):
        call_answer(pooled, [1], name="pooled", timeout=1)
    with pytest.raises(AssertionError, match="^Not run again"):
        call_answer(pooled, [1], name="pooled", timeout=1)


def test_call_answer_passes_values_and_exceptions_through():
    from helpers.grading import call_answer

    def half(x):
        if x < 0:
            raise ValueError("negative")
        return x / 2

    assert call_answer(half, 4, name="half") == 2
    with pytest.raises(ValueError, match="negative"):
        call_answer(half, -1, name="half")
