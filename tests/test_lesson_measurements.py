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


def _reduce_and_gather(n, shift):
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(n, generator=g) * 10.0 ** torch.randint(-3, 4, (n,), generator=g)
    inputs = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(inputs, x)
    moved = torch.roll(x, shift)                      # the same values, at other positions
    dist.all_reduce(x)
    dist.all_reduce(moved)
    return x, torch.roll(moved, -shift), inputs


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_gloo_all_reduce_gives_every_rank_the_same_bits_added_in_an_order_set_by_position(world_size):
    """researcher/01, section 1: the same bits on every rank; each chunk's sum ends with its own rank."""
    import itertools

    import torch

    from helpers.spawn import run

    n = 1000 * world_size
    results = run(_reduce_and_gather, n, 123, world_size=world_size, echo=False)
    total, moved, inputs = results[0]
    assert all(torch.equal(t.view(torch.int32), total.view(torch.int32)) for t, _, _ in results)
    changed = int((moved != total).sum())
    assert changed == 0 if world_size == 2 else changed > 0   # two ranks: a + b == b + a exactly
    for c, chunk in enumerate(total.chunk(world_size) if world_size > 2 else []):   # two ranks: both orders fit
        fits = []
        for order in itertools.permutations(range(world_size)):
            acc = inputs[order[0]].clone()
            for r in order[1:]:
                acc = acc + inputs[r]
            if torch.equal(acc.chunk(world_size)[c], chunk):
                fits.append(order)
        assert fits and all(order[-1] == c for order in fits), (c, fits)


def _gradient_in_both_layouts(find_unused):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(dist.get_rank()))
    grads = []
    for warm_up in (0, 1):
        torch.manual_seed(0)
        ddp = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)), find_unused_parameters=find_unused)
        for _ in range(warm_up + 1):
            ddp.zero_grad()
            ddp(x).pow(2).mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in ddp.parameters()]))
    return grads


def test_ddp_rebuilt_bucket_changes_gradient_bits_unless_find_unused_parameters():
    """researcher/01, section 1: a new DDP reduces in another layout than one that has rebuilt its bucket."""
    import torch

    from helpers.spawn import run

    default = run(_gradient_in_both_layouts, False, world_size=4, echo=False)
    fixed = run(_gradient_in_both_layouts, True, world_size=4, echo=False)
    first, rebuilt = default[0]
    assert 0 < int((first != rebuilt).sum()) < first.numel()
    assert ((first - rebuilt).abs() / first.abs()).max().item() < 1e-5        # the last bits only
    assert all(torch.equal(f, r) for f, r in fixed)
    assert all(torch.equal(a, b) for pair in (default, fixed) for a, b in zip(pair[0], pair[1]))  # rank 0 == rank 1
