"""The measuring tools of the developer lessons (helpers.lessons.developer), on real processes:
the race's confidence interval, a real torchrun launch, DDP's gradient buckets, and their figures."""

from __future__ import annotations

import re

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
    # both ranks print into torchrun's one stdout: a line's text and its newline are separate
    # writes, so two ranks' lines can run together; look for each rank's words, not for lines
    assert sorted(re.findall(r"rank \d holds \d", result.output)) == ["rank 0 holds 2", "rank 1 holds 2"]


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


@pytest.mark.parametrize("timeout", [20, 2, 3])   # 2 and 3 s: while torchrun may still be starting its workers
def test_torchrun_timeout_kills_the_whole_job(timeout, tmp_path, monkeypatch):
    """Every worker the launch started is gone when torchrun() raises. The workers write their
    pids to a file of this test's own: other tests may run torchrun jobs at the same time."""
    pids = tmp_path / "pids"
    monkeypatch.setenv("COURSE_TEST_PIDS", str(pids))
    with pytest.raises(TimeoutError, match=f"did not finish in {timeout} s"):
        torchrun('''
            import os, time
            with open(os.environ["COURSE_TEST_PIDS"], "a") as f:
                f.write(f"{os.getpid()}\\n")
            time.sleep(600)
        ''', nproc=2, timeout=timeout)
    started = [int(pid) for pid in pids.read_text().split()] if pids.exists() else []
    if timeout == 20:
        assert len(started) == 2, "both workers should have started within 20 s"
    alive = [pid for pid in started if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
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
