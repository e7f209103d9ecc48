"""Checks for the beginner exercises (``notebooks/beginner/03_exercises.ipynb``).

Each check runs the learner's function on every rank of a real gloo pool (through
:func:`helpers.grading.run_answer`, so a hang ends at the grader's timeout and a crash names
its rank), looks at what really happened, and raises ``AssertionError`` with a message a
beginner can act on.

* :func:`check_only_rank0_writes` -- ``save_once(obj, path)``: which ranks called
  ``torch.save`` (it is watched inside every rank, however it was imported), and does the
  file hold rank 0's object.
* :func:`check_everyone_waits` -- ``save_once(obj, path)``: rank 0's ``torch.save`` is made
  slow (:func:`helpers.lessons.races.slow_torch_save`) and every rank opens the file the moment
  ``save_once`` returns, so an answer without a barrier fails every time.
* :func:`check_combined_average` -- ``combined_average(loss, count)``: the same correct
  number on every rank; the usual wrong numbers are recognised and explained.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time

from helpers.grading import run_answer

__all__ = ["check_only_rank0_writes", "check_everyone_waits", "check_combined_average",
           "recording_saves"]


# ----------------------------------------------------------------------------- inside a rank


@contextlib.contextmanager
def recording_saves(fn, log: list, slow: dict | None = None):
    """Inside a rank: every ``torch.save`` made while this block runs is appended to ``log``
    (``{"target", "start", "end"}``); with ``slow={"chunks": c, "pause": p}`` it is written
    slowly. Catches ``torch.save``, ``torch.serialization.save`` and a bare ``save`` that
    ``fn``'s cell imported with ``from torch import save``."""
    import torch
    import torch.serialization

    from helpers.lessons.races import slow_save, slow_torch_save

    original = torch.save
    with contextlib.ExitStack() as stack:
        if slow:
            stack.enter_context(slow_torch_save(**slow))
        inner = torch.save  # the slow one for paths, if slow

        busy = []  # slow_save calls torch.save itself (into memory): let that one through

        def recorder(obj, f, *args, **kwargs):
            if busy:
                return original(obj, f, *args, **kwargs)
            target = os.fspath(f) if isinstance(f, (str, os.PathLike)) else type(f).__name__
            entry = {"target": target, "start": time.time(), "end": None}
            log.append(entry)
            busy.append(True)
            try:
                if slow and hasattr(f, "write"):  # a file object: slow it down too
                    slow_save(obj, f, **slow)
                else:
                    inner(obj, f, *args, **kwargs)
            finally:
                busy.pop()
            entry["end"] = time.time()

        names = getattr(fn, "__globals__", {})
        rebound = [k for k, v in list(names.items()) if v is original]
        torch.save = torch.serialization.save = recorder
        for k in rebound:
            names[k] = recorder
        try:
            yield log
        finally:
            for k in rebound:
                names[k] = original
            torch.save = torch.serialization.save = inner
    torch.save = torch.serialization.save = original


def _only_rank0_in_rank(save_once, path):
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    obj = {"weights": torch.arange(6.0), "saved_by_rank": rank}
    log: list = []
    with recording_saves(save_once, log):
        save_once(obj, path)
    return {"rank": rank, "saves": log}


def _waits_in_rank(save_once, path, chunks, pause):
    import torch
    import torch.distributed as dist

    from helpers.lessons.races import try_load

    rank = dist.get_rank()
    obj = {"weights": torch.arange(2000.0), "step": 7}  # the same on every rank, as in DDP
    log: list = []
    started = time.time()
    with recording_saves(save_once, log, slow={"chunks": chunks, "pause": pause}):
        save_once(obj, path)
    returned = time.time()
    outcome = try_load(path)  # the very next thing a training script would do
    same = None
    if outcome == "ok":
        got = torch.load(path, map_location="cpu", weights_only=True)
        same = (isinstance(got, dict) and set(got) == set(obj) and got["step"] == 7
                and torch.equal(got["weights"], obj["weights"]))
    return {"rank": rank, "saves": log, "outcome": str(outcome), "detail": outcome.detail,
            "started": started, "returned": returned, "same": same}


def _combined_in_rank(fn, losses, counts):
    import torch.distributed as dist

    rank = dist.get_rank()
    return fn(losses[rank], counts[rank])


# ----------------------------------------------------------------------------- in the grader


def _ranks(rs) -> str:
    rs = list(rs)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    return "ranks " + ", ".join(map(str, rs[:-1])) + f" and {rs[-1]}"


def _fresh_path(name: str = "ckpt.pt") -> tuple[str, str]:
    folder = tempfile.mkdtemp(prefix="save-once-")
    return folder, os.path.join(folder, name)


def check_only_rank0_writes(save_once, world_size: int = 3) -> None:
    """``save_once`` on ``world_size`` ranks: only rank 0 calls ``torch.save``, and the file
    afterwards holds rank 0's object (each rank passes an object tagged with its rank)."""
    import torch

    folder, path = _fresh_path()
    try:
        records = run_answer(_only_rank0_in_rank, save_once, path, name="save_once",
                             world_size=world_size, echo=False)
        writers = [r["rank"] for r in records if r["saves"]]
        if not writers:
            raise AssertionError(
                "No rank called torch.save. save_once must write obj with torch.save(obj, path) "
                "on rank 0.")
        if 0 not in writers:
            raise AssertionError(
                f"{_ranks(writers).capitalize()} wrote the file, but rank 0 did not. The rule is that "
                "rank 0 writes: check `dist.get_rank() == 0`.")
        if writers != [0]:
            others = [w for w in writers if w != 0]
            raise AssertionError(
                f"{_ranks(writers).capitalize()} all called torch.save: the file was written "
                f"{len(writers)} times. Only rank 0 should write; {_ranks(others)} already hold "
                "the same object and should skip the save (put it inside `if rank == 0:`).")
        if not os.path.exists(path):
            raise AssertionError(
                f"After save_once returned on every rank there was no file at the path it was "
                f"given. Rank 0 must save to exactly that path (torch.save(obj, path)).")
        got = torch.load(path, map_location="cpu", weights_only=True)
        if not (isinstance(got, dict) and got.get("saved_by_rank") == 0
                and torch.equal(got.get("weights", torch.zeros(0)), torch.arange(6.0))):
            raise AssertionError(
                "The file does not hold the object rank 0 passed to save_once. Save obj itself: "
                "torch.save(obj, path).")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def check_everyone_waits(save_once, world_size: int = 3, chunks: int = 10,
                         pause: float = 0.06) -> None:
    """``save_once`` on ``world_size`` ranks, rank 0's write made slow (``chunks`` pieces,
    ``pause`` s apart); every rank opens the file as soon as ``save_once`` returns and must find
    it complete, holding the object that was saved."""
    folder, path = _fresh_path()
    try:
        records = run_answer(_waits_in_rank, save_once, path, chunks, pause, name="save_once",
                             world_size=world_size, echo=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    writes = [s for r in records for s in r["saves"]]
    if not writes:
        raise AssertionError("No rank called torch.save: save_once must write obj with "
                             "torch.save(obj, path) on rank 0.")
    done = max(s["end"] for s in writes)
    for r in records:
        if r["outcome"] == "ok" and r["same"]:
            continue
        early = max(0.0, done - r["returned"])
        if r["outcome"] == "missing":
            found = "found no file at all"
        elif r["outcome"] == "torn":
            said = (r["detail"] or "").strip().rstrip(":") or "the loader hit the end of the file"
            found = f"found it only half-written (loading it failed with {said})"
        else:
            raise AssertionError(
                f"Rank {r['rank']} opened the file after save_once returned and it held something "
                "other than the object passed in. Save obj itself: torch.save(obj, path).")
        raise AssertionError(
            f"Rank {r['rank']} opened the file as soon as save_once returned and {found}: the "
            f"save was still going on for another {early:.2f} s. save_once must not return on any "
            "rank until the file is complete: after rank 0's torch.save, every rank (rank 0 "
            "too) must call dist.barrier().")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)


def _as_number(value, rank: int) -> float:
    import numbers

    try:
        import torch

        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return float(value.item())
    except ImportError:  # pragma: no cover - torch is always there in this course
        pass
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise AssertionError(
        f"combined_average() returned {value!r} ({type(value).__name__}) on rank {rank}; it "
        "should return one plain number, e.g. `(total / count).item()`.")


def check_combined_average(combined_average, losses: list[float], counts: list[int]) -> None:
    """``combined_average(losses[r], counts[r])`` on rank r of ``len(losses)`` ranks must return,
    on every rank, the average loss over all ``sum(counts)`` examples."""
    world = len(losses)
    values = run_answer(_combined_in_rank, combined_average, list(losses), list(counts),
                        name="combined_average", world_size=world, echo=False)
    got = [_as_number(v, r) for r, v in enumerate(values)]
    n = sum(counts)
    truth = sum(l * c for l, c in zip(losses, counts)) / n
    shown = ", ".join(f"rank {r}: {v:.4g}" for r, v in enumerate(got))
    setup = ("The workers' losses were " + ", ".join(f"{l:g} over {c} examples"
                                                      for l, c in zip(losses, counts)) + ".")
    if all(_close(v, truth) for v in got):
        return
    if all(_close(v, l) for v, l in zip(got, losses)):
        raise AssertionError(
            f"Each worker returned its own loss ({shown}): that number describes one worker's "
            f"slice only. {setup} Add up every worker's loss total and example count with "
            f"dist.all_reduce, then divide once: every worker should return {truth:.4g}.")
    if not all(_close(v, got[0]) for v in got):
        wrong_div = all(_close(v, truth * n / (c * world)) for v, c in zip(got, counts))
        hint = (f" You divided by count × world size, but the workers hold different numbers of "
                f"examples ({n} in all): add up the counts across workers too."
                if wrong_div else "")
        raise AssertionError(
            f"The workers returned different numbers ({shown}); every worker should return the "
            f"same combined average, {truth:.4g}. {setup}{hint}")
    value = got[0]
    if _close(value, sum(losses) / world):
        raise AssertionError(
            f"Every worker returned {value:.4g}, the average of the {world} workers' averages. "
            f"{setup} A worker with more examples must count for more: add up loss × count and "
            f"the counts across workers, then divide once. The average over all {n} examples is "
            f"{truth:.4g}.")
    raise AssertionError(
        f"Every worker returned {value:.4g}, but the average over all {n} examples is "
        f"{truth:.4g}. {setup} Add up loss × count and the counts across workers (dist.all_reduce), "
        "then divide the first total by the second.")
