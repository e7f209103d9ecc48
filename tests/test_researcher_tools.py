"""helpers.lessons.researcher (bitwise digests, small tables), and hang reports inside a library that is not torch."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
# a library outside torch, whose compute() all-gathers; imported here, so each rank imports it
# when it loads the test's function, before the hang's clock starts (a slow import under load
# was once still running when the clock ran out)
from torchmetrics import MeanMetric

from helpers.lessons.researcher import digest, median, table
from helpers.spawn import HangError, run


def test_digest_sees_every_bit():
    a = torch.tensor([1.0, 2.0, 3.0])
    assert digest([a]) == digest([a.clone()])
    assert digest([torch.tensor([0.0])]) != digest([torch.tensor([-0.0])])  # equal under ==
    b = a.clone()
    b.view(torch.int32)[1] ^= 1  # flip the lowest mantissa bit
    assert digest([a]) != digest([b])
    assert digest([a, a]) != digest([torch.cat([a, a])])  # shapes count
    assert digest([a.double()]) != digest([a])  # dtypes count
    assert digest([torch.arange(6).reshape(2, 3).t()]) == digest([torch.arange(6).reshape(2, 3).t().contiguous()])


def test_median_and_table():
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5
    with pytest.raises(ValueError):
        median([])
    text = table([(0, 1.5), (10, 2.25)], ["rank", "x"], ".2f").splitlines()
    assert text[0].split() == ["rank", "x"] and text[2].split() == ["0", "1.50"] and text[3].split() == ["10", "2.25"]
    assert len({len(line) for line in text}) == 1  # aligned


def _rank0_gathers_alone():
    metric = MeanMetric()
    metric.update(torch.tensor(float(dist.get_rank())))
    if dist.get_rank() == 0:
        metric.compute()
    return "done"


def test_a_hang_inside_torchmetrics_is_reported_at_the_learners_line():
    """torchmetrics' compute() all-gathers; rank 0 calling it alone is reported at that call, not inside the library."""
    with pytest.raises(HangError) as info:
        run(_rank0_gathers_alone, world_size=2, timeout=10, echo=False)
    state = info.value.blocked[0]
    assert state.rank == 0 and state.filename == __file__
    assert state.function == "_rank0_gathers_alone" and state.line == "metric.compute()"
    assert info.value.ranks[1].finished
    assert "metric.compute()" in str(info.value)
