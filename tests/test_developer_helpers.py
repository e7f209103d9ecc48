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


def test_figures_draw_the_data_they_are_given():
    import matplotlib.pyplot as plt

    from helpers.lessons.figures import OUTCOME_COLORS

    ax = plot_reads([["ok", "missing"], ["ok", "torn"]], "reads")
    grid = ax.images[0].get_array()
    kinds = list(OUTCOME_COLORS)
    assert grid.tolist() == [[kinds.index("ok"), kinds.index("missing")], [kinds.index("ok"), kinds.index("torn")]]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["rank 0", "rank 1"]

    ax = plot_failure_rates({(2, False): 1.0, (2, True): 0.0, (4, False): 0.5, (4, True): 0.0}, "rates")
    lines = {c.get_label(): c.lines[0].get_ydata().tolist() for c in ax.containers}
    assert lines == {"no barrier": [100.0, 50.0], "dist.barrier() after the save": [0.0, 0.0]}

    ax = plot_logged_loss([0.5934, 2.1151], 1.3542, "loss")
    assert [round(p.get_height(), 4) for p in ax.patches] == [0.5934, 2.1151, 1.3542]
    assert [t.get_text() for t in ax.texts] == ["0.5934", "2.1151", "1.3542"]

    ax = plot_stop_decisions([[0.6, 0.3], [2.1, 1.4]], [1.35, 0.86], 0.5, 1, "stop")
    labels = [l.get_label() for l in ax.get_lines()]
    assert "rank 0 alone would stop here" in labels and "rank 1 alone would stop here" not in labels
    plt.close("all")


# ----------------------------------------------------------------------------- grading.developer


def test_first_difference_names_the_place():
    a = {"state": {0: {"momentum_buffer": torch.ones(2)}}, "param_groups": [{"lr": 0.1}]}
    b = {"state": {0: {"momentum_buffer": torch.zeros(2)}}, "param_groups": [{"lr": 0.1}]}
    assert ex.first_difference(a, a) is None and ex.same(a, a)
    assert ex.first_difference(a, b) == "['state'][0]['momentum_buffer']"
    assert "keys" in ex.first_difference({"x": 1}, {"y": 1})
    assert not ex.same({"w": torch.ones(2)}, {"w": torch.ones(3)})


def good_save(ddp_model, optimizer, step, path):
    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.module.state_dict(), "opt": optimizer.state_dict(),
                    "step": step}, path)
    dist.barrier()


def every_rank_saves_no_barrier(ddp_model, optimizer, step, path):
    torch.save({"model": ddp_model.state_dict(), "opt": optimizer.state_dict(), "step": step}, path)


def test_save_harness_reports_what_each_rank_did(tmp_path):
    good = run(ex.save_harness, good_save, str(tmp_path), 4, slow=[(4, 0.05)], world_size=3, echo=False)
    assert [(r["rank"], r["calls"][0]["writes"], r["calls"][0]["read"]) for r in good] == \
        [(0, 1, "ok"), (1, 0, "ok"), (2, 0, "ok")]
    ended = good[0]["calls"][0]["ended"][0]
    assert all(r["calls"][0]["returned"] >= ended for r in good)  # the barrier held every rank
    saved = torch.load(good[0]["calls"][0]["path"], weights_only=True)
    assert saved["step"] == 4 and ex.same(saved["model"], good[0]["model"])
    assert ex.same(saved["opt"], good[0]["opt"]) and saved["opt"]["state"]  # momentum buffers
    assert all(ex.same(r["model"], good[0]["model"]) for r in good)  # DDP replicas

    bad = run(ex.save_harness, every_rank_saves_no_barrier, str(tmp_path), 4, world_size=3,
              echo=False)
    assert [r["calls"][0]["writes"] for r in bad] == [1, 1, 1]


def sleeps_instead(ddp_model, optimizer, step, path):
    import time

    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.module.state_dict(), "opt": optimizer.state_dict(),
                    "step": step}, path)
    else:
        time.sleep(3.5)


def test_save_checks_pass_a_right_answer_and_no_fixed_sleep():
    ex.save_checkpoint_waits(good_save, world_size=3)
    ex.save_checkpoint_one_writer(good_save, world_size=3)
    with pytest.raises(AssertionError, match=r"Rank [12] returned \d\.\d s after rank 0's write"):
        ex.save_checkpoint_waits(sleeps_instead, world_size=3)


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
    ranks = run(ex.stop_harness, odd_types, [0.5], world_size=3, echo=False,
                rank_args=[(1.0, 1), (1.0, 2), (1.0, 3)])
    assert [r["answers"] for r in ranks] == [[True], [False], [None]]
    assert ex.weighted_loss([5.0, 1.0, 0.5], [1, 9, 2]) == pytest.approx(1.25)


def never_stops(local_loss, n_samples, threshold):
    return False


def stop_on_own_loss(local_loss, n_samples, threshold):
    return local_loss < threshold


def test_should_stop_consistency_needs_the_right_answer_where_it_is_clear():
    """Agreeing on False everywhere is consistent, but wrong where every loss is below the threshold."""
    with pytest.raises(AssertionError, match="every rank's loss is below it, so every rank should return True"):
        ex.should_stop_same_on_every_rank(never_stops, [0.2, 0.9, 3.0], [6, 3, 1], [1.0, 0.5])
    with pytest.raises(AssertionError, match="the ranks disagree"):
        ex.should_stop_same_on_every_rank(stop_on_own_loss, [0.2, 0.9, 3.0], [6, 3, 1], [1.0, 0.5])


def returns_zero(model, optimizer, path):
    return 0


def test_the_missing_file_check_does_not_pass_an_answer_that_never_loads():
    with pytest.raises(AssertionError, match="with one saved at step 5 rank 0 returned 0"):
        ex.load_checkpoint_missing_file(returns_zero, world_size=2)


def _writes_under_a_size_limit(folder):
    import errno

    from helpers.lessons.developer import file_size_limit

    path = os.path.join(folder, f"rank{dist.get_rank()}.bin")
    with file_size_limit(4096):
        try:
            with open(path, "wb") as f:
                f.write(b"x" * 10_000)
            refused = None
        except OSError as err:
            refused = err.errno
        try:
            torch.save(torch.zeros(4096), path + ".pt")   # 16 KB of data
            save_refused = False
        except RuntimeError:
            save_refused = True
    torch.save(torch.zeros(4096), path + ".pt")           # the limit is gone again
    return refused == errno.EFBIG, save_refused, os.path.getsize(path), os.path.getsize(path + ".pt")


def test_file_size_limit_makes_the_kernel_refuse_big_writes_and_is_lifted_after(tmp_path):
    from helpers.lessons.developer import file_size_limit

    for efbig, save_refused, size, after in run(_writes_under_a_size_limit, str(tmp_path), world_size=2, echo=False):
        assert efbig and save_refused
        assert size == 4096 and after > 16_384
    with pytest.raises(ValueError, match="number of bytes"):
        with file_size_limit(-1):
            pass
