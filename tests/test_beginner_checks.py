"""The beginner helpers, on real pools: the exercise checks pass right answers in several styles
and fail each kind of wrong answer with the words a beginner needs; the lesson's data and
pictures say what the notebook claims."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
from torch import save as bare_save

from helpers.grading import beginner as checks
from helpers.lessons import beginner as data

# ---------------------------------------------------------------- save_once answers


def save_reference(obj, path):
    if dist.get_rank() == 0:
        torch.save(obj, path)
    dist.barrier()


def save_bare_import(obj, path):
    if dist.get_rank() == 0:
        bare_save(obj, path)
    dist.barrier()


def save_file_object(obj, path):
    if dist.get_rank() == 0:
        with open(path, "wb") as f:
            torch.save(obj, f)
    dist.barrier()


def save_file_object_no_barrier(obj, path):
    if dist.get_rank() == 0:
        with open(path, "wb") as f:
            torch.save(obj, f)


def save_no_barrier(obj, path):
    if dist.get_rank() == 0:
        torch.save(obj, path)


def save_everyone(obj, path):
    torch.save(obj, path)
    dist.barrier()


def save_wrong_rank(obj, path):
    if dist.get_rank() == 1:
        torch.save(obj, path)
    dist.barrier()


def save_nothing(obj, path):
    dist.barrier()


def save_something_else(obj, path):
    if dist.get_rank() == 0:
        torch.save({"not": "it"}, path)
    dist.barrier()


def save_barrier_only_rank0(obj, path):
    if dist.get_rank() == 0:
        torch.save(obj, path)
        dist.barrier()


def save_sleeps_instead(obj, path):
    """The lazy answer: the other workers sleep a fixed time instead of waiting for the save."""
    import time

    if dist.get_rank() == 0:
        torch.save(obj, path)
    else:
        time.sleep(float(os.environ.get("SLEEP", "1")))


@pytest.mark.parametrize("answer", [save_reference, save_bare_import, save_file_object],
                         ids=lambda f: f.__name__)
def test_right_save_once_passes_both_checks(answer, capsys):
    checks.save_once_only_rank0_writes(answer, world_size=3)
    checks.save_once_everyone_waits(answer, world_size=3)
    assert capsys.readouterr().out.splitlines() == [
        "✓ only worker 0 wrote the file (3 workers)",
        "✓ every worker found the file complete, short save and long (3 workers)"]


@pytest.mark.parametrize("answer,words", [
    (save_everyone, "The file was written 3 times"),
    (save_wrong_rank, "Worker 1 wrote the file, but worker 0 did not"),
    (save_nothing, "No worker called torch.save"),
    (save_something_else, "does not hold the object worker 0 passed"),
], ids=lambda x: getattr(x, "__name__", "words"))
def test_only_rank0_check_names_the_mistake(answer, words):
    with pytest.raises(AssertionError, match=words):
        checks.save_once_only_rank0_writes(answer, world_size=3)


@pytest.mark.parametrize("answer", [save_no_barrier, save_file_object_no_barrier],
                         ids=lambda f: f.__name__)
def test_a_missing_barrier_fails_every_time(answer):
    """Three runs in a row: the grader holds worker 0's save open, so the race shows on every one."""
    checks.save_once_only_rank0_writes(answer, world_size=3)  # it does write once...
    for _ in range(3):
        with pytest.raises(AssertionError, match="opened the file as soon as save_once returned"):
            checks.save_once_everyone_waits(answer, world_size=3)  # ...but nobody waits


@pytest.mark.parametrize("sleep,words", [
    ("0.1", "found it only half-written|found no file|not worker 0's save"),  # shorter than the short save
    ("3.5", r"returned \d\.\d s after worker 0's save"),   # long enough for both: too late after the short one
])
def test_no_fixed_sleep_passes_the_waiting_check(monkeypatch, sleep, words):
    monkeypatch.setenv("SLEEP", sleep)
    with pytest.raises(AssertionError, match=words):
        checks.save_once_everyone_waits(save_sleeps_instead, world_size=3)


def test_every_worker_writing_passes_the_waiting_check():
    """Its mistake is covered by the other check only: the other workers' saves end before worker 0's,
    which the grader holds open, and worker 0's overwrites them before anyone passes the barrier."""
    checks.save_once_everyone_waits(save_everyone, world_size=3)


def test_a_barrier_only_rank0_reaches_is_a_bounded_failure(monkeypatch):
    monkeypatch.setenv("COURSE_CELL_TIMEOUT", "8")  # the pool gets half: 4 s
    with pytest.raises(AssertionError, match=r"hung for 4 s\. Rank 0 was stuck at `dist.barrier\(\)`"):
        checks.save_once_only_rank0_writes(save_barrier_only_rank0, world_size=3)


# ---------------------------------------------------------------- combined_average answers


def avg_reference(loss, count):
    t = torch.tensor([loss * count, count], dtype=torch.float64)
    dist.all_reduce(t)
    return (t[0] / t[1]).item()


def avg_gather(loss, count):
    pairs = [None] * dist.get_world_size()
    dist.all_gather_object(pairs, (loss, count))
    return sum(l * c for l, c in pairs) / sum(c for _, c in pairs)


def avg_tensor_result(loss, count):
    t = torch.tensor([loss * count, float(count)])
    dist.all_reduce(t)
    return t[0] / t[1]  # a one-number tensor: accepted


def avg_of_avgs(loss, count):
    t = torch.tensor([loss])
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def avg_local(loss, count):
    return loss


def avg_count_x_world(loss, count):
    t = torch.tensor([loss * count])
    dist.all_reduce(t)
    return t.item() / (count * dist.get_world_size())


def avg_string(loss, count):
    return f"{loss:.2f}"


UNEQUAL = dict(losses=[0.59, 2.12, 1.0], counts=[10, 2, 5])
EQUAL = dict(losses=[0.5, 2.0, 1.1], counts=[4, 4, 4])


@pytest.mark.parametrize("answer", [avg_reference, avg_gather, avg_tensor_result],
                         ids=lambda f: f.__name__)
def test_right_combined_average_passes(answer):
    checks.combined_average_same_on_every_worker(answer, **EQUAL)
    checks.combined_average_unequal_counts(answer, **UNEQUAL)
    checks.combined_average_unequal_counts(answer, losses=[0.2, 3.5, 1.25, 0.9, 2.0], counts=[1, 7, 3, 12, 2])


@pytest.mark.parametrize("answer,equal_passes,words", [
    (avg_of_avgs, True, "the average of the 3 workers' averages"),
    (avg_local, False, "Each worker returned its own loss"),
    (avg_count_x_world, True, "You divided by count × world size"),
    (avg_string, False, "should return one plain number"),
], ids=lambda x: getattr(x, "__name__", str(x)))
def test_wrong_combined_average_is_explained(answer, equal_passes, words):
    if equal_passes:
        checks.combined_average_same_on_every_worker(answer, **EQUAL)
    else:
        with pytest.raises(AssertionError, match=words):
            checks.combined_average_same_on_every_worker(answer, **EQUAL)
    with pytest.raises(AssertionError, match=words):
        checks.combined_average_unequal_counts(answer, **UNEQUAL)


# ---------------------------------------------------------------- the lesson's data and pictures


def test_both_orders_hold_the_same_examples():
    xs, ys = data.validation_set("sorted")
    xr, yr = data.validation_set("random")
    assert len(xs) == data.DAYS
    key = lambda x, y: sorted(map(tuple, torch.cat([x, y], 1).tolist()))
    assert key(xs, ys) == key(xr, yr)
    assert not torch.equal(xs, xr)
    with pytest.raises(ValueError):
        data.validation_set("by colour")


@pytest.mark.parametrize("workers", range(2, 9))
def test_sorted_slices_lie_and_shuffled_ones_do_not(workers):
    """What section 4 asserts, for every value the widget offers."""
    model = data.trained_model()

    def slices(order):
        x, y = data.validation_set(order)
        with torch.no_grad():
            per = ((model(x) - y) ** 2).squeeze(1)
        return [per[i].mean().item() for i in torch.tensor_split(torch.arange(len(x)), workers)], per.mean().item()

    sorted_losses, truth = slices("sorted")
    random_losses, truth_r = slices("random")
    assert math.isclose(truth, truth_r, rel_tol=1e-5)
    far, near = abs(sorted_losses[0] - truth), abs(random_losses[0] - truth)
    assert far > truth / 2 and far > 2 * near


def test_exam_sections_are_unequal_and_the_shortcut_misses():
    sections = data.exam_sections()
    assert [len(s) for s in sections] == [28, 9, 3]
    marks = [m for s in sections for m in s]
    shortcut = sum(sum(s) / len(s) for s in sections) / len(sections)
    assert sum(marks) / len(marks) - shortcut > 10


def test_pictures_state_the_finding():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.lessons import figures as pictures

    ax = pictures.plot_worker_losses([0.14, 0.65, 1.83, 3.02], 1.41, "date order")
    assert ax.get_title() == "date order: worker 0 would log 0.14, the truth is 1.41 (10.1x too low)"
    ax = pictures.plot_read_outcomes(["missing", "torn", "torn"], ["ok"] * 3)
    assert "3 of 3 reads got a broken file; with the barrier, 0 of 3" in ax.get_title(loc="left")
    ax = pictures.plot_report([1, 0, 1, 0], 2)
    assert "4 lines from 2 clerks" in ax.get_title(loc="left") and "changes 3 times" in ax.get_title(loc="left")
    ax = pictures.plot_exam(data.exam_sections(), 57.46, 71.58)
    assert ax.get_title() == "Averaging the section averages says 57; the 40 students really averaged 72"
    times = [{"start": 0.0, "written": 0.4, "at_barrier": 0.4, "went_on": 0.41},
             {"start": 0.0, "at_barrier": 0.01, "went_on": 0.41}]
    ax = pictures.plot_timeline(times)
    assert ax.get_title().startswith("Rank 0 wrote for 0.40 s; rank 1 waited at the barrier")
    assert pictures.how_far(1.42, 1.41) == "1% high"
    plt.close("all")
