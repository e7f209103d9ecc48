"""The developer lesson's helper modules, on real ranks: `helpers.lessons.developer` (the "GPU"
checkpoint, running a torchrun script in a pool, the figures) and `helpers.grading.developer`
(what the graded tests run on every rank)."""

from __future__ import annotations

import os
import textwrap

import matplotlib
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.grading import developer as ex
from helpers.lessons.developer import pretend_saved_on, run_script
from helpers.lessons.figures import plot_failure_rates, plot_logged_loss, plot_reads, plot_stop_decisions
from helpers.spawn import run

matplotlib.use("Agg")


# ----------------------------------------------------------------------------- lessons.developer


def test_pretend_saved_on_tags_tensors_like_a_gpu_save(tmp_path):
    path = tmp_path / "gpu.pt"
    with pretend_saved_on("cuda:0"):
        torch.save({"w": torch.arange(3.0)}, path)
    seen = []
    torch.load(path, weights_only=True, map_location=lambda s, loc: seen.append(loc) or s)
    assert seen == ["cuda:0"]
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(path, weights_only=True)  # this machine has no GPU
    assert torch.equal(torch.load(path, map_location="cpu", weights_only=True)["w"], torch.arange(3.0))


def test_pretend_saved_on_leaves_torch_as_it_was(tmp_path):
    with pretend_saved_on("cuda:1"):
        pass
    torch.save(torch.ones(2), tmp_path / "cpu.pt")
    seen = []
    torch.load(tmp_path / "cpu.pt", weights_only=True, map_location=lambda s, loc: seen.append(loc) or s)
    assert seen == ["cpu"]


def test_run_script_runs_a_torchrun_script_unchanged_and_returns_its_lines(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import os
        import torch.distributed as dist
        dist.init_process_group("gloo")
        open(f"made-by-{dist.get_rank()}", "w").close()
        print(f"rank {dist.get_rank()} of {dist.get_world_size()} in {os.path.basename(os.getcwd())}")
        dist.destroy_process_group()
    """))
    work = tmp_path / "work"
    work.mkdir()
    out = run(run_script, str(script), str(work), world_size=3, init_process_group=False, echo=False)
    assert out == [[f"rank {r} of 3 in work"] for r in range(3)]
    assert sorted(os.listdir(work)) == ["made-by-0", "made-by-1", "made-by-2"]


def test_figures_draw_with_titles():
    import matplotlib.pyplot as plt

    axes = [
        plot_reads([["ok", "missing"], ["ok", "torn"]], "reads"),
        plot_failure_rates({(2, False): 1.0, (2, True): 0.0, (4, False): 1.0, (4, True): 0.0}, "rates"),
        plot_logged_loss([0.5934, 2.1151], 1.3542, "loss"),
        plot_stop_decisions([[0.6, 0.3], [2.1, 1.4]], [1.35, 0.86], 0.5, 1, "stop"),
    ]
    assert [ax.get_title() for ax in axes] == ["reads", "rates", "loss", "stop"]
    plt.close("all")


# ----------------------------------------------------------------------------- grading.developer


def test_first_difference_names_the_place():
    a = {"state": {0: {"momentum_buffer": torch.ones(2)}}, "param_groups": [{"lr": 0.1}]}
    b = {"state": {0: {"momentum_buffer": torch.zeros(2)}}, "param_groups": [{"lr": 0.1}]}
    assert ex.first_difference(a, a) is None and ex.same(a, a)
    assert ex.first_difference(a, b) == "['state'][0]['momentum_buffer']"
    assert "keys" in ex.first_difference({"x": 1}, {"y": 1})
    assert not ex.same({"w": torch.ones(2)}, {"w": torch.ones(3)})


def _saves_three_ways(path):
    """Rank 0 saves to a path, rank 1 to an open file via `from torch import save`, rank 2 to memory."""
    import io

    from torch import save

    calls = []
    with ex.counting_saves(calls, slow=False):
        rank = dist.get_rank()
        if rank == 0:
            torch.save({"x": 1}, path)
        elif rank == 1:
            with open(path + ".1", "wb") as f:
                save({"x": 1}, f)
        else:
            torch.save({"x": 1}, io.BytesIO())
    return len(calls)


def test_counting_saves_sees_every_write_however_torch_save_was_imported(tmp_path):
    assert run(_saves_three_ways, str(tmp_path / "c.pt"), world_size=3, echo=False) == [1, 1, 0]
    assert torch.load(tmp_path / "c.pt.1", weights_only=True) == {"x": 1}


def _slow_save_then_read(path, barrier):
    from helpers.lessons.races import try_load

    calls = []
    dist.barrier()
    with ex.counting_saves(calls, slow=True, pause=0.1):
        if dist.get_rank() == 0:
            torch.save({"w": torch.arange(1000.0)}, path)
    if barrier:
        dist.barrier()
    return str(try_load(path))


def test_counting_saves_slow_write_is_seen_half_done_without_a_barrier(tmp_path):
    without = run(_slow_save_then_read, str(tmp_path / "a.pt"), False, world_size=3, echo=False)
    assert without[0] == "ok" and all(r in ("missing", "torn") for r in without[1:])
    assert run(_slow_save_then_read, str(tmp_path / "b.pt"), True, world_size=3, echo=False) == ["ok"] * 3
    assert torch.equal(torch.load(tmp_path / "b.pt", weights_only=True)["w"], torch.arange(1000.0))


def good_save(ddp_model, optimizer, step, path):
    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.module.state_dict(), "opt": optimizer.state_dict(),
                    "step": step}, path)
    dist.barrier()


def every_rank_saves_no_barrier(ddp_model, optimizer, step, path):
    torch.save({"model": ddp_model.state_dict(), "opt": optimizer.state_dict(), "step": step}, path)


def test_save_harness_reports_what_each_rank_did(tmp_path):
    good = run(ex.save_harness, good_save, str(tmp_path / "g.pt"), 4, slow=True, world_size=3, echo=False)
    assert [(r["rank"], r["writes"], r["read"]) for r in good] == [(0, 1, "ok"), (1, 0, "ok"), (2, 0, "ok")]
    saved = torch.load(tmp_path / "g.pt", weights_only=True)
    assert saved["step"] == 4 and ex.same(saved["model"], good[0]["model"])
    assert ex.same(saved["opt"], good[0]["opt"]) and saved["opt"]["state"]  # momentum buffers
    assert all(ex.same(r["model"], good[0]["model"]) for r in good)  # DDP replicas

    bad = run(ex.save_harness, every_rank_saves_no_barrier, str(tmp_path / "b.pt"), 4, world_size=3,
              echo=False)
    assert [r["writes"] for r in bad] == [1, 1, 1]


def good_load(model, optimizer, path):
    if not os.path.exists(path):
        return 0
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["opt"])
    return ckpt["step"]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_load_harness_round_trip(tmp_path, optimizer):
    path = str(tmp_path / "ckpt.pt")
    saved = ex.write_checkpoint(path, step=5, optimizer=optimizer, on="cuda:0")
    assert saved["opt"]["state"]
    ranks = run(ex.load_harness, good_load, path, optimizer, world_size=3, echo=False)
    for r in ranks:
        assert r["step"] == 5 and ex.same(r["model"], saved["model"]) and ex.same(r["opt"], saved["opt"])
        assert not ex.same(r["before"], saved["model"])  # each rank started elsewhere
    missing = run(ex.load_harness, good_load, str(tmp_path / "none.pt"), world_size=3, echo=False)
    assert all(r["step"] == 0 and ex.same(r["model"], r["before"]) for r in missing)


def odd_types(local_loss, n_samples, threshold):
    import numpy as np

    return [np.bool_(True), torch.tensor(False), None][dist.get_rank()]


def test_stop_harness_passes_answers_through_as_plain_values():
    ranks = run(ex.stop_harness, odd_types, [1.0, 1.0, 1.0], [1, 2, 3], [0.5], world_size=3, echo=False)
    assert [r["answers"] for r in ranks] == [[True], [False], [None]]
    assert ex.weighted_loss([5.0, 1.0, 0.5], [1, 9, 2]) == pytest.approx(1.25)


def test_pool_timeout_stays_inside_the_cell_limit(monkeypatch):
    """A hang must be reported by the pool (where each rank waited), not cut off by nbgrader's 30 s."""
    import helpers.grading.answers

    assert ex.timeout() == max(ex.TIMEOUT, helpers.grading.answers.GRADER_TIMEOUT) <= 22
    monkeypatch.setattr(helpers.grading.answers, "GRADER_TIMEOUT", 60.0)
    assert ex.timeout() == 22
