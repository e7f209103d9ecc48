"""The measuring tools of the developer lessons (helpers.lessons.developer), on real processes:
the race's confidence interval, a real torchrun launch, DDP's gradient buckets, and their figures."""

from __future__ import annotations

import psutil
import pytest

from helpers.lessons.developer import gradient_all_reduces, torchrun, wilson_interval


def test_wilson_interval_brackets_the_rate_and_stays_in_0_1():
    low, high = wilson_interval(20, 20)
    assert 0.8 < low < 1.0 and high == 1.0
    low, high = wilson_interval(0, 20)
    assert low == 0.0 and 0.0 < high < 0.2
    low, high = wilson_interval(13, 20)
    assert low < 13 / 20 < high
    assert wilson_interval(50, 100)[1] - wilson_interval(50, 100)[0] < high - low  # more runs, narrower


@pytest.mark.parametrize("failures, runs", [(1, 0), (-1, 5), (6, 5)])
def test_wilson_interval_refuses_impossible_counts(failures, runs):
    with pytest.raises(ValueError, match="must be"):
        wilson_interval(failures, runs)


def test_torchrun_runs_a_real_job_and_reports_what_it_printed():
    result = torchrun('''
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(1)
        dist.all_reduce(t)
        print(f"rank {dist.get_rank()} holds {t.item():.0f}")
        dist.destroy_process_group()
    ''', nproc=2)
    assert result.returncode == 0, result.output
    assert sorted(result.lines("holds")) == ["rank 0 holds 2", "rank 1 holds 2"]


def test_torchrun_shows_a_returning_rank_ending_a_waiting_one():
    """The lesson's claim: under torchrun, a rank waiting in a collective that another rank
    skipped fails at once with "Connection closed by peer" when that rank exits."""
    result = torchrun('''
        import torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 0:
            dist.barrier()
    ''', nproc=2)
    assert result.returncode != 0
    assert any("Connection closed by peer" in line for line in result.lines("Connection closed"))


def test_torchrun_timeout_kills_the_whole_job():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(TimeoutError, match="did not finish in 20 s"):
        torchrun('''
            import time
            time.sleep(600)
        ''', nproc=2, timeout=20)
    alive = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"]
             and any("torchrun-" in part and part.endswith("job.py") for part in p.info["cmdline"])
             and p.pid not in before]
    assert alive == [], f"torchrun's workers survived: {alive}"


def _count(cap):
    import torch
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(12)])
    return gradient_all_reduces(DDP(model, bucket_cap_mb=cap), torch.randn(32, 512))


def test_gradient_all_reduces_counts_ddp_buckets_and_overlap():
    from helpers.spawn import run

    default, small = (run(_count, cap, world_size=2, echo=False)[0] for cap in (25, 4))
    assert default["parameters"] == small["parameters"] == 24
    assert default["all_reduces"] == 1 and default["during_backward"] == 0
    assert 2 <= small["all_reduces"] < 24 and 0 < small["during_backward"] < small["all_reduces"]


def test_figures_of_the_measurements_label_their_axes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.lessons.figures import plot_failure_rates, plot_gap_vs_samples

    rates = {(2, False): 1.0, (2, True): 0.0, (4, False): 0.9, (4, True): 0.0}
    intervals = {k: wilson_interval(round(v * 20), 20) for k, v in rates.items()}
    ax = plot_failure_rates(rates, "title", intervals=intervals)
    assert "95%" in ax.get_ylabel() and ax.get_xlabel()
    ax = plot_gap_vs_samples([6, 24, 96], [0.3, 0.15, 0.08], [0.7, 0.7, 0.69], "noise shrinks")
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title() == "noise shrinks"
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    plt.close("all")
