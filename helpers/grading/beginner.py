"""Checks of the beginner exercises (``notebooks/beginner/03_exercises.ipynb``).

A test cell imports this module and calls one check, named after the cell (the cell
``test_save_once_only_rank0_writes`` calls :func:`save_once_only_rank0_writes`)::

    from helpers.grading import beginner as check
    check.save_once_only_rank0_writes(save_once, world_size=3)

Each check runs the learner's function on every rank of a real gloo pool
(:func:`helpers.grading.answers.run_answer`: a hang ends at the pool's timeout, a crash names
its rank), looks at what really happened, prints one ``✓`` line if it was right, and otherwise
raises an ``AssertionError`` a beginner can act on.
"""

from __future__ import annotations

import math
import os

from helpers.grading.answers import fail, passed, run_answer, scratch

__all__ = ["save_once_only_rank0_writes", "save_once_everyone_waits",
           "combined_average_same_on_every_worker", "combined_average_unequal_counts",
           "report_average_returns_combined", "report_average_only_worker0_prints"]

#: How long the grader holds worker 0's save open in :func:`save_once_everyone_waits`, seconds:
#: a short save, then a long one. An answer that makes the other workers sleep instead of waiting
#: at a barrier either returns before the long save is done or returns long after the short one
#: ended; only waiting for the save passes both.
SHORT_SAVE, LONG_SAVE = 0.5, 2.4
#: How soon after worker 0's save ends every worker must return (a barrier takes milliseconds).
PROMPT = 1.2

# What a rank does here is learner-controlled: the answer runs in the same process and can rewrite
# anything in it. So a rank gets only its own inputs, returns only the answer's own value, and
# every observation a check relies on is made in the grading kernel: the file the ranks leave,
# looked at when each rank's result arrives (``on_return``), the writes to it (an inotify watch,
# helpers.grading.watch.Writes), and when worker 0's save could finish at the earliest
# (helpers.grading.watch.Gate: the object it saves holds a secret the kernel releases).


# ----------------------------------------------------------------------------- inside a rank


def _save_in_rank(save_once, path, obj):
    save_once(obj, path)


def _combined_in_rank(fn, loss, count):
    from helpers.grading.answers import plain

    return plain(fn(loss, count))


# ----------------------------------------------------------------------------- in the grader


def _ranks(rs) -> str:
    rs = list(rs)
    if len(rs) == 1:
        return f"worker {rs[0]}"
    return "workers " + ", ".join(map(str, rs[:-1])) + f" and {rs[-1]}"


def _same_tensor(a, b) -> bool:
    import torch

    return isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def _load(path: str):
    """The checkpoint at ``path``, read here (plain data only), or None if it cannot be."""
    import torch

    from helpers.lessons.races import try_load

    outcome = try_load(path)
    if outcome != "ok":
        return outcome, None
    try:
        return outcome, torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - rewritten since: torn after all
        from helpers.lessons.races import LoadOutcome

        return LoadOutcome("torn", "it changed while it was read"), None


def save_once_only_rank0_writes(save_once, world_size: int = 3) -> None:
    """``save_once`` on ``world_size`` ranks: only rank 0 writes the file, once, and it holds
    rank 0's object. Each rank passes an object tagged with its rank and a secret only that
    rank is given; the grader counts the writes to the file itself (inotify)."""
    __tracebackhide__ = True
    import secrets

    import torch

    from helpers.grading.watch import Writes

    tokens = [bytearray(secrets.token_bytes(16)) for _ in range(world_size)]
    objs = [({"weights": torch.arange(6.0), "saved_by_rank": r, "token": tokens[r]},)
            for r in range(world_size)]
    with scratch() as folder, Writes(folder) as writes:
        path = os.path.join(folder, "ckpt.pt")
        run_answer(_save_in_rank, save_once, path, name="save_once", world_size=world_size,
                   rank_args=objs)
        count = writes.count("ckpt.pt")
        exists = os.path.exists(path)
        _, got = _load(path) if exists else (None, None)
    by = next((r for r, t in enumerate(tokens) if isinstance(got, dict) and got.get("token") == t), None)
    if not count and not exists:
        fail("No worker called torch.save. save_once must write obj with torch.save(obj, path) "
             "on worker 0.")
    if count > 1:
        last = f" (the last time by worker {by})" if by is not None else ""
        fail(f"The file was written {count} times{last}, once per worker that called torch.save. "
             "Only worker 0 should write; the other workers already hold the same object and "
             "should skip the save (put it inside `if rank == 0:`).")
    if by not in (0, None):
        fail(f"Worker {by} wrote the file, but worker 0 did not. The rule is that worker 0 writes: "
             "check `dist.get_rank() == 0`.")
    if not exists:
        fail("After save_once returned on every worker there was no file at the path it was "
             "given. Worker 0 must save to exactly that path (torch.save(obj, path)).")
    if not (by == 0 and got.get("saved_by_rank") == 0
            and _same_tensor(got.get("weights"), torch.arange(6.0))):
        fail("The file does not hold the object worker 0 passed to save_once. Save obj itself: "
             "torch.save(obj, path).")
    passed(f"only worker 0 wrote the file ({world_size} workers)")


def _one_timed_save(save_once, world_size: int, hold: float, step: int) -> None:
    """One run of :func:`save_once_everyone_waits`: worker 0's save is held open ``hold`` s."""
    __tracebackhide__ = True
    import time

    import torch

    from helpers.grading.watch import Gate

    weights = torch.arange(2000.0)
    seen: dict[int, tuple] = {}
    with scratch() as folder, Gate(folder, hold, name=".gate") as gate:
        path = os.path.join(folder, "ckpt.pt")

        def look(rank: int) -> None:  # in this kernel, as soon as the rank's result arrives
            returned = time.time()
            outcome, got = _load(path)
            same = (isinstance(got, dict) and got.get("token") == gate.secret
                    and got.get("step") == step and _same_tensor(got.get("weights"), weights))
            seen[rank] = (returned, outcome, same)

        # the same object on every rank, as in DDP; worker 0's also holds the gate's token
        objs = [({"weights": weights, "step": step, "token": gate.token() if r == 0 else bytearray()},)
                for r in range(world_size)]
        run_answer(_save_in_rank, save_once, path, name="save_once", world_size=world_size,
                   rank_args=objs, on_return=look)
    if gate.released is None:
        fail("Worker 0 never saved the object it was given: save_once must write obj with "
             "torch.save(obj, path) on worker 0.")
    for rank in sorted(seen):
        returned, outcome, same = seen[rank]
        if outcome == "ok" and same:
            late = returned - gate.released
            if late > PROMPT:
                fail(f"Worker {rank} returned {late:.1f} s after worker 0's save of about {hold:.1f} s "
                     "had ended. A save can take any time: a worker that sleeps a fixed time is "
                     "either too early or too late. Wait for the save itself: every worker calls "
                     "dist.barrier() after worker 0's torch.save.")
            continue
        if outcome == "missing":
            found = "found no file at all"
        elif outcome == "ok":
            found = ("found a file that was not worker 0's save (another worker's own save, or an "
                     "object other than obj)")
        else:
            said = (outcome.detail or "").strip().rstrip(":") or "the loader hit the end of the file"
            found = f"found it only half-written (loading it failed with {said})"
        still = max(0.0, gate.released - returned)
        fail(f"Worker {rank} returned from save_once before the file was complete: the grader "
             f"opened the file as soon as save_once returned there and {found}; worker 0's save "
             f"was still going on for another {still:.2f} s. save_once must not return on any "
             "worker until the file is complete: after worker 0's torch.save, every worker "
             "(worker 0 too) must call dist.barrier().")


def save_once_everyone_waits(save_once, world_size: int = 3) -> None:
    """``save_once`` on ``world_size`` ranks, twice: the grader holds rank 0's save open about
    0.5 s and then about 2.4 s (the object rank 0 saves holds a secret the grader releases then).
    As soon as each rank's ``save_once`` returns, the grader opens the file and must find it
    complete; and each rank must return promptly once the save ended (no fixed sleep passes
    both)."""
    __tracebackhide__ = True
    for i, hold in enumerate((SHORT_SAVE, LONG_SAVE)):
        _one_timed_save(save_once, world_size, hold, step=7 + i)
    passed(f"every worker found the file complete, short save and long ({world_size} workers)")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)


def _as_number(value, rank: int, name: str, should: str) -> float:
    """A rank's return value as a float, or a failure saying what ``name`` should return."""
    __tracebackhide__ = True
    import numbers

    import torch

    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.item())
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    shown = value if isinstance(value, str) and value.startswith("<") else f"{value!r:.60} ({type(value).__name__})"
    fail(f"{name}() returned {shown} on worker {rank}; it should return {should}.")


def _combined_average(combined_average, losses: list[float], counts: list[int]) -> None:
    __tracebackhide__ = True
    world = len(losses)
    values = run_answer(_combined_in_rank, combined_average, name="combined_average",
                        world_size=world, rank_args=list(zip(losses, counts)))
    got = [_as_number(v, r, "combined_average", "one plain number, e.g. `(total / count).item()`")
           for r, v in enumerate(values)]
    n = sum(counts)
    truth = sum(l * c for l, c in zip(losses, counts)) / n
    shown = ", ".join(f"worker {r}: {v:.4g}" for r, v in enumerate(got))
    setup = ("The workers' losses were " + ", ".join(f"{l:g} over {c} examples"
                                                      for l, c in zip(losses, counts)) + ".")
    if all(_close(v, truth) for v in got):
        return
    if all(_close(v, l) for v, l in zip(got, losses)):
        fail(f"Each worker returned its own loss ({shown}): that number describes one worker's "
             f"slice only. {setup} Add up every worker's loss total and example count with "
             f"dist.all_reduce, then divide once: every worker should return {truth:.4g}.")
    if not all(_close(v, got[0]) for v in got):
        wrong_div = all(_close(v, truth * n / (c * world)) for v, c in zip(got, counts))
        hint = (f" You divided by count × world size, but the workers hold different numbers of "
                f"examples ({n} in all): add up the counts across workers too."
                if wrong_div else "")
        fail(f"The workers returned different numbers ({shown}); every worker should return the "
             f"same combined average, {truth:.4g}. {setup}{hint}")
    value = got[0]
    if _close(value, sum(losses) / world):
        fail(f"Every worker returned {value:.4g}, the average of the {world} workers' averages. "
             f"{setup} A worker with more examples must count for more: add up loss × count and "
             f"the counts across workers, then divide once. The average over all {n} examples is "
             f"{truth:.4g}.")
    fail(f"Every worker returned {value:.4g}, but the average over all {n} examples is "
         f"{truth:.4g}. {setup} Add up loss × count and the counts across workers (dist.all_reduce), "
         "then divide the first total by the second.")


def combined_average_same_on_every_worker(combined_average, losses: list[float],
                                          counts: list[int]) -> None:
    """Workers holding the same number of examples: every one returns the combined average."""
    __tracebackhide__ = True
    if len(set(counts)) != 1:
        raise ValueError("this check is for equal counts; use combined_average_unequal_counts")
    _combined_average(combined_average, losses, counts)
    passed(f"every worker returned the combined average ({len(losses)} workers)")


def combined_average_unequal_counts(combined_average, losses: list[float],
                                    counts: list[int]) -> None:
    """Workers holding different numbers of examples: a worker with more counts for more."""
    __tracebackhide__ = True
    _combined_average(combined_average, losses, counts)
    passed(f"right with unequal counts too ({len(losses)} workers, {sum(counts)} examples)")


# ----------------------------------------------------------------------------- report_average
# The logging lesson (``notebooks/beginner/02_every_clerk_talks.ipynb``): every worker combines,
# worker 0 alone prints one line, every worker returns the combined value.

#: The one line worker 0 prints: ``average loss: 1.2345``.
REPORT_LINE = "average loss: {:.4f}"


def _report_in_rank(report_average, secret, loss, count):
    from helpers.grading.answers import announce, plain

    announce(secret)
    return plain(report_average(loss, count))


def _report(report_average, losses, counts) -> tuple[list[dict], float, str]:
    """Each worker's value and what it printed: its own output, read here from its pipes."""
    __tracebackhide__ = True
    from helpers.grading.answers import printed, secret

    if len(losses) != len(counts) or len(losses) < 2:
        raise ValueError("one loss and one count per worker, for at least 2 workers")
    nonce, outputs = secret(), []
    values = run_answer(_report_in_rank, report_average, nonce, name="report_average",
                        world_size=len(losses), rank_args=list(zip(losses, counts)),
                        outputs=outputs)
    records = [{"rank": r, "value": v, **said}
               for r, (v, said) in enumerate(zip(values, printed(outputs, nonce)))]
    truth = sum(l * c for l, c in zip(losses, counts)) / sum(counts)
    setup = ("The workers' losses were " + ", ".join(f"{l:g} over {c} examples"
                                                      for l, c in zip(losses, counts))
             + f", so the average over all {sum(counts)} examples is {truth:.4f}.")
    return records, truth, setup


def report_average_returns_combined(report_average, losses: list[float], counts: list[int]) -> None:
    """Every worker returns the average over all workers' examples (weighted by the counts)."""
    __tracebackhide__ = True
    records, truth, setup = _report(report_average, losses, counts)
    world = len(losses)
    silent = [r["rank"] for r in records if r["value"] is None]
    if silent:
        first = next((r for r in records if r["value"] is not None), None)
        also = (f" (worker {first['rank']} returned {first['value']!r:.40})" if first else "")
        fail(f"report_average() returned None on {_ranks(silent)}{also}. Every worker must return "
             "the combined average: only the print belongs inside `if rank == 0:`, the combining "
             "and the `return` come on every worker.")
    got = [_as_number(r["value"], r["rank"], "report_average", "the combined average as one plain number, "
                      "e.g. `(totals[0] / totals[1]).item()`") for r in records]
    shown = ", ".join(f"worker {r}: {v:.4f}" for r, v in enumerate(got))
    if all(_close(v, truth) for v in got):
        passed(f"every worker returned the combined average, {truth:.4f} ({world} workers)")
        return
    if all(_close(v, l) for v, l in zip(got, losses)):
        fail(f"Each worker returned its own loss ({shown}): that describes one worker's share only. "
             f"{setup} Combine first (dist.all_reduce of [loss × count, count]), then return the "
             "combined value on every worker.")
    if all(_close(v, sum(losses) / world) for v in got):
        fail(f"Every worker returned {got[0]:.4f}, the average of the {world} workers' averages. "
             f"{setup} A worker with more examples counts for more: add up loss × count and the "
             "counts, then divide once.")
    fail(f"The workers returned {shown}. {setup} Every worker should return that number.")


def report_average_only_worker0_prints(report_average, losses: list[float], counts: list[int]) -> None:
    """Worker 0 prints exactly one line, ``average loss: X.XXXX`` with the combined value, and
    no other worker prints anything."""
    __tracebackhide__ = True
    records, truth, setup = _report(report_average, losses, counts)
    lines = {r["rank"]: [line.strip() for line in r["stdout"].splitlines() if line.strip()]
             for r in records}
    talkers = [rank for rank, said in lines.items() if rank != 0 and said]
    if talkers:
        example = lines[talkers[0]][0]
        fail(f"{_ranks(talkers).capitalize()} printed too (worker {talkers[0]}: {example[:80]!r}): "
             f"{len(talkers) + bool(lines[0])} workers spoke for one job. Only worker 0 announces: put the "
             "print inside `if dist.get_rank() == 0:`, after the combining, which every worker "
             "still does.")
    said = lines[0]
    if not said:
        fail(f"Worker 0 printed nothing. After the combining, worker 0 prints one line: "
             f"`{REPORT_LINE.format(truth)}`.")
    if len(said) > 1:
        fail(f"Worker 0 printed {len(said)} lines ({said[0][:60]!r}, {said[1][:60]!r}, ...); it should "
             f"print exactly one: `{REPORT_LINE.format(truth)}`.")
    line, want = said[0], REPORT_LINE.format(truth)
    if line == want:
        passed(f"worker 0 alone printed `{want}` ({len(losses)} workers)")
        return
    if line == REPORT_LINE.format(losses[0]):
        fail(f"Worker 0 printed `{line}`: its own loss, the average over its {counts[0]} examples "
             f"only. {setup} Print the combined value: `{want}`.")
    fail(f"Worker 0 printed {line[:80]!r}; the line should read exactly `{want}` (the combined "
         "average with 4 decimals: f\"average loss: {value:.4f}\"). " + setup)
