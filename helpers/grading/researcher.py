"""Checks of the researcher exercises (``notebooks/researcher/06_exercises.ipynb``).

A test cell imports this module and calls one check, named after the cell (the cell
``test_pooled_mean_values`` calls :func:`pooled_mean_values`)::

    from helpers.grading import researcher as check
    check.pooled_mean_values(pooled_mean)

``pooled_mean`` and ``atomic_save`` are single-process functions: they run in worker processes
(:func:`helpers.grading.answers.call`, or several ranks each in its own folder), never in the
grading kernel. ``gather_unique`` runs on the ranks of a gloo pool. What comes back is plain
data; every comparison with the right answer is made here, in the kernel.
"""

from __future__ import annotations

import math
import os

from helpers.grading.answers import fail, passed, run_answer, scratch

__all__ = ["pooled_mean_values", "pooled_mean_errors", "gather_unique_padded",
           "gather_unique_dtypes", "atomic_save_roundtrip", "atomic_save_no_torn_reads",
           "atomic_save_no_leftovers", "ERROR_CASES", "distributed_mean_pooled",
           "distributed_mean_one_collective", "distributed_mean_past_2_24",
           "distributed_mean_no_samples", "distributed_mean_reset", "mean_harness", "PLANS"]

#: Inputs that have no pooled mean, by what is wrong with them.
ERROR_CASES = {
    "the lengths differ": ([1.0, 2.0], [1]),
    "a count is negative": ([1.0, 2.0], [3, -1]),
    "the counts sum to zero": ([1.0, 2.0], [0, 0]),
    "there are no groups at all": ([], []),
}


# ----------------------------------------------------------------------------- pooled_mean


def _not_written(result: dict, name: str) -> None:
    __tracebackhide__ = True
    if result.get("raised") == "NotImplementedError":
        fail(f"{name}() is not written yet: replace `raise NotImplementedError()` with your code.")


def _number(result: dict, call_text: str) -> float:
    __tracebackhide__ = True
    _not_written(result, "pooled_mean")
    if "raised" in result:
        fail(f"{call_text} raised {result['raised']}: {result['message']}. These inputs are valid: "
             "return their pooled mean.")
    value = result["value"]
    try:
        return float(value)
    except (TypeError, ValueError):
        fail(f"{call_text} returned {value!r:.60}; return a float.")


def _pooled_mean_cases(fn, cases):
    """In one worker: fn on each (losses, counts); the value or what it raised, per case."""
    from helpers.grading.answers import _call_in_worker

    return [_call_in_worker(fn, (losses, counts), {}) for losses, counts in cases]


def _pooled_on_ranks(pooled_mean):
    """Rank r holds 5, 20 or 75 per-sample losses; every rank pools the ranks' means."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    n = [5, 20, 75][rank]
    losses = torch.arange(n, dtype=torch.float64) / 10 + rank  # rank r's per-sample losses
    pairs = [None] * dist.get_world_size()
    dist.all_gather_object(pairs, (losses.mean().item(), n))
    got = pooled_mean([p[0] for p in pairs], [p[1] for p in pairs])
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    from helpers.grading.answers import plain

    return {"pairs": [list(p) for p in pairs], "got": plain(got)}


def pooled_mean_values(pooled_mean, cases=None) -> None:
    """pooled_mean weights every group by its sample count: checked on small inputs and on
    uneven shards of 3 real ranks. ``cases``: more ``(losses, counts, expected)``."""
    __tracebackhide__ = True
    fixed = [([0.59, 2.12], [3, 3], 1.355), ([1.0, 3.0], [1, 3], 2.5)] + list(cases or [])
    results = run_answer(_pooled_mean_cases, pooled_mean, [(l, c) for l, c, _ in fixed],
                         name="pooled_mean", world_size=1, init_process_group=False)[0]
    for (losses, counts, want), result in zip(fixed, results):
        got = _number(result, f"pooled_mean({losses}, {counts})")
        if not math.isclose(got, want, abs_tol=1e-9):
            hint = ""
            if math.isclose(got, sum(losses) / max(1, len(losses)), abs_tol=1e-9):
                hint = (f" Weight each loss by its count; the unweighted mean ({got}) ignores how "
                        "many samples each group has.")
            if 0 in counts:
                hint += " A group with count 0 must not count."
            fail(f"pooled_mean({losses}, {counts}) returned {got}, expected "
                 f"{' + '.join(f'{c}*{l}' for l, c in zip(losses, counts))} / {sum(counts)} = {want:g}.{hint}")
    ranks = run_answer(_pooled_on_ranks, pooled_mean, name="pooled_mean", world_size=3)
    pairs = ranks[0]["pairs"]
    everything = [i / 10 + r for r, m in enumerate([5, 20, 75]) for i in range(m)]
    truth = sum(everything) / len(everything)
    for r in ranks:
        try:
            got = float(r["got"])
        except (TypeError, ValueError):
            fail(f"On rank {ranks.index(r)} pooled_mean returned {r['got']!r:.60}; return a float.")
        if not math.isclose(got, truth, abs_tol=1e-9):
            fail(f"With per-rank means {[round(p[0], 3) for p in pairs]} over {[p[1] for p in pairs]} "
                 f"samples, pooled_mean returned {got:.6f}; the mean over all 100 samples is {truth:.6f}.")
    passed(f"pooled_mean weights every group by its count ({len(fixed)} inputs and 3 ranks)")


def pooled_mean_errors(pooled_mean, cases=("the lengths differ",)) -> None:
    """pooled_mean raises ValueError for inputs that have no pooled mean (``cases`` names them,
    from :data:`ERROR_CASES`), and still returns a number for a valid input."""
    __tracebackhide__ = True
    inputs = [ERROR_CASES[c] for c in cases] + [([1.0, 3.0], [1, 3])]
    results = run_answer(_pooled_mean_cases, pooled_mean, inputs, name="pooled_mean",
                         world_size=1, init_process_group=False)[0]
    for why, (losses, counts), result in zip(cases, inputs, results):
        _not_written(result, "pooled_mean")
        if "raised" not in result:
            fail(f"pooled_mean({losses}, {counts}) returned {result['value']!r:.40}; expected "
                 f"ValueError ({why}).")
        if not result["is_value_error"]:
            fail(f"pooled_mean({losses}, {counts}) raised {result['raised']}; expected ValueError ({why}).")
    _number(results[-1], "pooled_mean([1.0, 3.0], [1, 3])")
    passed(f"pooled_mean refuses what has no mean ({', '.join(cases)})")


# ----------------------------------------------------------------------------- gather_unique


def _gather_in_rank(gather_unique, preds, labels, idx):
    """This rank's shard only (its own predictions, labels and dataset indices)."""
    out = gather_unique(preds, labels, idx)
    if not (isinstance(out, tuple) and len(out) == 2):
        return {"returned": type(out).__name__}
    return {"preds": out[0], "labels": out[1]}


def _shards(n, shuffle, world_size, pred_dtype, label_dtype):
    """A data set of ``n`` samples with predictions and labels drawn from a fresh secret here,
    and each rank's shard as DistributedSampler deals it (padded): the full answer never leaves
    this kernel, and no rank can work it out without gathering."""
    import secrets

    import torch
    from torch.utils.data.distributed import DistributedSampler

    g = torch.Generator().manual_seed(secrets.randbits(63))
    preds = torch.rand(n, generator=g, dtype=torch.float64).to(getattr(torch, pred_dtype))
    dtype = getattr(torch, label_dtype)
    labels = (torch.rand(n, generator=g) < 0.4).to(dtype) if dtype == torch.bool \
        else torch.randint(0, 3, (n,), generator=g).to(dtype)
    shards = []
    for rank in range(world_size):
        idx = torch.tensor(list(DistributedSampler(range(n), num_replicas=world_size, rank=rank,
                                                   shuffle=shuffle, seed=7)))
        shards.append((preds[idx].clone(), labels[idx].clone(), idx))
    return preds, labels, shards


def _gather(gather_unique, n, shuffle, world_size, pred_dtype, label_dtype) -> None:
    __tracebackhide__ = True
    import torch

    p_want, l_want, shards = _shards(n, shuffle, world_size, pred_dtype, label_dtype)
    ranks = run_answer(_gather_in_rank, gather_unique, name="gather_unique", world_size=world_size,
                       rank_args=shards)
    shard = len(shards[0][2])
    for rank, r in enumerate(ranks):
        if "returned" in r:
            fail(f"gather_unique returned a {r['returned']} on rank {rank}: return a tuple (preds, labels).")
        p, l = r["preds"], r["labels"]
        if not (isinstance(p, torch.Tensor) and isinstance(l, torch.Tensor)):
            fail(f"gather_unique returned ({type(p).__name__}, {type(l).__name__}) on rank {rank}: "
                 "return two tensors.")
        if len(p) == shard < n:
            fail(f"Rank {rank} got back only its own {shard} samples; gather every rank's shard first.")
        if len(p) > n:
            fail(f"Got {len(p)} predictions for a data set of {n}: the {world_size * shard - n} "
                 "padded duplicates added by DistributedSampler were kept; keep each original index once.")
        if len(p) != n or len(l) != n:
            fail(f"Expected {n} predictions and labels, got {len(p)} and {len(l)}.")
        if p.dtype != p_want.dtype or l.dtype != l_want.dtype:
            fail(f"Dtypes changed: preds {p_want.dtype} -> {p.dtype}, labels {l_want.dtype} -> {l.dtype}.")
        if not torch.equal(p, p_want):
            fail("Predictions are not ordered by original index (or do not belong to their index).")
        if not torch.equal(l, l_want):
            fail("Labels are not ordered by original index.")


def gather_unique_padded(gather_unique, n: int = 10, world_size: int = 3,
                         shuffle: bool = False) -> None:
    """gather_unique drops the sampler's padding: ``n`` samples on ``world_size`` ranks."""
    __tracebackhide__ = True
    _gather(gather_unique, n, shuffle, world_size, "float32", "int64")
    pad = -n % world_size
    passed(f"{n} samples on {world_size} ranks, {pad} padded duplicate(s) dropped")


def gather_unique_dtypes(gather_unique, n: int = 9, world_size: int = 3, shuffle: bool = False,
                         pred_dtype: str = "float64", label_dtype: str = "bool") -> None:
    """gather_unique keeps the input dtypes (``pred_dtype``, ``label_dtype``: torch dtype names)."""
    __tracebackhide__ = True
    _gather(gather_unique, n, shuffle, world_size, pred_dtype, label_dtype)
    passed(f"dtypes kept: {pred_dtype} predictions, {label_dtype} labels ({n} samples)")


# ----------------------------------------------------------------------------- atomic_save


# Everything here is observed in the grading kernel: the files in each folder (read here once the
# ranks are done), every write, rename and removal in it (an inotify watch made here before the
# ranks start: helpers.grading.watch.Writes), and the file at ``path`` while a save is held open
# half-way (the object saved holds a gate token, which cannot be pickled until this kernel
# releases it: helpers.grading.watch.Gate). Nothing a rank reports is believed.


def _saves_in_rank(atomic_save, path, steps, tokens=()):
    """Each call of the answer saves ``{"step": s, "w": ...}`` to ``path`` (given to this rank
    alone), the i-th with ``tokens[i]`` (a gate token) in the object if there is one."""
    import torch

    for i, step in enumerate(steps):
        obj = {"step": step, "w": torch.full((4096,), float(step))}
        if i < len(tokens):
            obj["gate"] = tokens[i]
        atomic_save(obj, path)


def _holds(got, step: int) -> bool:
    import torch

    return (isinstance(got, dict) and got.get("step") == step
            and torch.equal(got.get("w", torch.zeros(0)), torch.full((4096,), float(step))))


def _read(path: str):
    """``(what torch.load read, or None; how it went: "ok", "missing" or "torn (...)")``."""
    import torch

    from helpers.lessons.races import try_load

    outcome = try_load(path)
    if outcome != "ok":
        return None, f"{outcome} ({(outcome.detail or '')[:80]})" if outcome == "torn" else str(outcome)
    try:
        return torch.load(path, map_location="cpu", weights_only=True), "ok"
    except Exception as e:  # noqa: BLE001 - replaced while it was read: torn after all
        return None, f"torn ({type(e).__name__})"


def _published_in_place(events, name: str) -> bool:
    """Whether ``name`` was ever written in place (opened for writing and closed under its own
    name), rather than only renamed onto, in the watched folder's ``events``."""
    return any(n == name and kind == "written" for n, kind in events)


def atomic_save_roundtrip(atomic_save, world_size: int = 3) -> None:
    """atomic_save writes a file torch.load can read back (rank 0: one save into an empty
    folder), and replaces an existing one (every other rank: two saves); the grader reads each
    file once the ranks are done."""
    __tracebackhide__ = True
    with scratch() as folder:
        paths = [os.path.join(folder, f"rank{rank}", "ckpt.pt") for rank in range(world_size)]
        for path in paths:
            os.mkdir(os.path.dirname(path))
        plans = [[1]] + [[1, 2]] * (world_size - 1)
        run_answer(_saves_in_rank, atomic_save, name="atomic_save", world_size=world_size,
                   rank_args=list(zip(paths, plans)))
        found = [_read(path) for path in paths]
    for plan, (got, how) in zip(plans, found):
        step = plan[-1]
        if how == "missing":
            fail(f"After atomic_save(obj, path) there is no file at path (step {step}).")
        if how != "ok" or not _holds(got, step):
            what = how if how != "ok" else repr(got)[:100]
            fail(f"Loading path after saving step 1 gave {what}." if step == 1 else
                 f"After a second atomic_save over an existing file, loading path gave {what}; it "
                 "should hold the new object (step 2).")
    passed("atomic_save writes a file torch.load reads back, and replaces an old one")


def atomic_save_no_torn_reads(atomic_save, saves: int = 1, world_size: int = 3) -> None:
    """While atomic_save is held half-way through each of ``saves`` saves (the grader holds the
    pickling of the object open), the grader reads ``path``: it must load the previous complete
    checkpoint; and ``path`` itself is never written in place, only renamed onto (seen by an
    inotify watch); at the end it holds the last save. ``world_size`` is kept for the test cells'
    calls: one process saves."""
    __tracebackhide__ = True
    import torch

    from helpers.grading.watch import Gate, Writes

    with scratch() as folder, Writes(folder) as writes:
        os.mkdir(os.path.join(folder, "rank0"))
        path = os.path.join(folder, "rank0", "ckpt.pt")
        torch.save({"step": 0, "w": torch.zeros(4096)}, path)  # the old checkpoint
        writes.watch(os.path.dirname(path))
        during: dict[int, tuple] = {}

        def look(step):  # while save `step` is held, before any byte of the object is out
            return lambda: during.setdefault(step, _read(path))

        gates = [Gate(folder, 0.3, name=f".gate{s}", on_open=look(s)).__enter__() for s in range(1, saves + 1)]
        try:
            run_answer(_saves_in_rank, atomic_save, path, list(range(1, saves + 1)), name="atomic_save",
                       world_size=1, init_process_group=False, rank_args=[([g.token() for g in gates],)])
        finally:
            for g in gates:
                g.__exit__(None, None, None)
        writes.read()
        events = [(n, kind) for f, n, kind, _ in writes.events if f == os.path.dirname(path)]
        final = _read(path)
    for step in range(1, saves + 1):
        if step not in during:
            fail(f"atomic_save never saved the object it was given (call {step}): save obj itself "
                 "with torch.save.")
        got, how = during[step]
        if how != "ok" or not _holds(got, step - 1):
            found = "no file at all" if how == "missing" else (
                f"a file that does not load ({how})" if how != "ok" else "a file that is not the previous save")
            fail(f"While atomic_save was writing (save {step} of {saves}), the grader loaded path and found "
                 f"{found}. A reader must see the previous complete file until the new one is complete: write "
                 "the whole file under a temporary name in the same folder, then os.replace() it onto path in "
                 "one step.")
    if _published_in_place(events, "ckpt.pt"):
        fail("path was written in place (opened for writing under its own name): a reader at that moment sees "
             "a partial file. Copying a finished temporary file onto path (shutil.copyfile) is such a write too. "
             "Write the temporary file, then os.replace() it onto path.")
    got, how = final
    if how != "ok" or not _holds(got, saves):
        fail(f"After {saves} call(s) of atomic_save the path should hold the last object saved "
             f"(step {saves}), but loading it gave {how if how != 'ok' else repr(got)[:100]}.")
    passed(f"no reader could see a partial file during {saves} save(s)")


def _leftovers_in_rank(atomic_save, folder, saves):
    import torch.distributed as dist

    mine = os.path.join(folder, f"rank{dist.get_rank()}")
    os.makedirs(mine)
    for step in range(saves):
        atomic_save({"step": step}, os.path.join(mine, "model.pt"))


def atomic_save_no_leftovers(atomic_save, saves: int = 3, world_size: int = 3) -> None:
    """After ``saves`` saves, each rank's folder holds only the checkpoint itself (looked at
    from here, after the ranks are gone), and it holds the last save."""
    __tracebackhide__ = True
    import torch

    with scratch() as folder:
        run_answer(_leftovers_in_rank, atomic_save, folder, saves, name="atomic_save",
                   world_size=world_size)
        for rank in range(world_size):
            mine = os.path.join(folder, f"rank{rank}")
            left = sorted(set(os.listdir(mine)) - {"model.pt"}) if os.path.isdir(mine) else []
            if left:
                fail(f"After {saves} calls of atomic_save the folder also holds {left}: remove (or "
                     "rename onto path) every temporary file you create.")
            if not os.path.isdir(mine) or "model.pt" not in os.listdir(mine):
                fail(f"After {saves} calls of atomic_save(obj, path) there is no file at path.")
            try:
                got = torch.load(os.path.join(mine, "model.pt"), weights_only=True)
            except Exception as e:  # noqa: BLE001 - reported to the learner
                got = f"{type(e).__name__}: {e}"
            if got != {"step": saves - 1}:
                fail(f"After {saves} saves the path holds {got!r:.60}, not the last object saved.")
    passed(f"after {saves} saves only the checkpoint is left ({world_size} folders)")


# ----------------------------------------------------------------------------- DistributedMean
# The logging lesson (``notebooks/researcher/04_metrics_over_time.ipynb``): a running
# [sum, count] metric, local updates, one collective per compute(), exact past 2**24 samples.

#: A plan is one list of operations per rank: ("update", batch_mean, n), ("compute",), ("reset",).
#: Every rank's plan holds the same compute() calls in the same order (they are collectives).
PLANS = {
    "pooled": [[("update", 0.5, 4), ("update", 1.5, 2), ("compute",)],
               [("update", 3.0, 1), ("compute",)],
               [("compute",)]],                                   # rank 2: no sample at all
    "pooled_hidden": [[("update", 0.25, 1), ("compute",)],
                      [("update", 2.0, 30), ("update", 1.0, 10), ("update", 4.0, 1), ("compute",)],
                      [("compute",)],
                      [("update", 0.75, 7), ("update", 0.5, 7), ("compute",)]],
    "collectives": [[("update", 1.0, 3), ("update", 2.0, 1), ("compute",), ("compute",),
                     ("update", 5.0, 2), ("compute",)],
                    [("update", 4.0, 2), ("compute",), ("compute",), ("compute",)],
                    [("compute",), ("compute",), ("update", 0.5, 6), ("compute",)]],
    "collectives_hidden": [[("update", 0.5, 2), ("compute",), ("compute",), ("compute",)],
                           [("compute",), ("update", 1.5, 5), ("compute",), ("compute",)],
                           [("update", 3.0, 1), ("update", 1.0, 1), ("compute",), ("compute",),
                            ("update", 2.0, 4), ("compute",)],
                           [("compute",), ("compute",), ("compute",)]],
    # past 2**24: rank 0's single samples vanish into a float32 count, and the total is odd
    "large": [[("update", 0.25, 2 ** 24)] + [("update", 4.0, 1)] * 100 + [("compute",)],
              [("update", 1.0, 7), ("compute",)],
              [("update", 2.0, 3_000_000), ("compute",)]],
    "large_hidden": [[("update", 1.0, 3)] * 40 + [("compute",)],
                     [("update", 1.5, 9_000_001), ("update", 0.5, 9_000_001)] + [("update", 2.0, 1)] * 60
                     + [("compute",)],
                     [("compute",)],
                     [("update", 3.0, 5), ("compute",)]],
    "empty": [[("compute",)], [("compute",)], [("compute",)]],
    "empty_hidden": [[("update", 2.0, 3), ("reset",), ("compute",)], [("compute",)], [("reset",), ("compute",)],
                     [("compute",)]],
    "reset": [[("update", 1.0, 5), ("compute",), ("reset",), ("update", 3.0, 1), ("compute",)],
              [("update", 2.0, 5), ("compute",), ("reset",), ("compute",)],
              [("compute",), ("reset",), ("update", 0.5, 3), ("compute",)]],
    "reset_hidden": [[("update", 1.0, 2), ("reset",), ("reset",), ("update", 2.0, 2), ("compute",),
                      ("reset",), ("compute",)],
                     [("update", 9.0, 9), ("reset",), ("compute",), ("reset",), ("update", 1.0, 3),
                      ("compute",)],
                     [("compute",), ("update", 4.0, 1), ("reset",), ("compute",)],
                     [("update", 6.0, 2), ("compute",), ("reset",), ("update", 0.5, 1), ("compute",)]],
}


def mean_harness(cls, plan):
    """On every rank: a fresh ``cls()``, then this rank's own plan (the only one it is given:
    the others' samples are not in its process to be added up instead of reduced), each method
    call watched for collectives (:func:`helpers.lessons.logs.count_collectives`). Returns, per
    call, its value or what it raised, and the collectives it ran."""
    import torch.distributed as dist

    from helpers.grading.answers import plain
    from helpers.lessons.logs import count_collectives

    rank = dist.get_rank()
    try:
        metric = cls()
    except Exception as e:  # noqa: BLE001 - reported to the learner
        return {"rank": rank, "constructing": f"{type(e).__name__}: {e}"[:300], "log": []}
    log = []
    for op, *args in plan:
        method = getattr(metric, op, None)
        if not callable(method):
            return {"rank": rank, "missing": op, "log": log}
        try:
            value, counted = count_collectives(method, *args)
        except Exception as e:  # noqa: BLE001
            log.append({"op": op, "raised": type(e).__name__[:80], "message": str(e)[:200],
                        "is_value_error": isinstance(e, ValueError)})
            continue
        entry = {"op": op, "collectives": dict(counted)}
        if op == "compute":
            entry["value"] = plain(value)
        log.append(entry)
    return {"rank": rank, "log": log}


def _expected(plans) -> list[dict]:
    """For each compute() (in order): the pooled mean over every rank's samples since its last
    reset (None: no samples anywhere), and what the usual wrong answers would give."""
    state = [[] for _ in plans]           # per rank: (batch_mean, n) since the last reset
    position = [0] * len(plans)
    out = []
    while True:
        for r, plan in enumerate(plans):  # run every rank up to its next compute()
            while position[r] < len(plan) and plan[position[r]][0] != "compute":
                op, *args = plan[position[r]]
                if op == "update":
                    state[r].append((args[0], args[1]))
                else:
                    state[r] = []
                position[r] += 1
        if any(position[r] >= len(plan) for r, plan in enumerate(plans)):
            return out
        batches = [b for s in state for b in s]
        n = sum(k for _, k in batches)
        local = [math.fsum(m * k for m, k in s) / sum(k for _, k in s) if s else None for s in state]
        means = [v for v in local if v is not None]
        out.append({"truth": math.fsum(m * k for m, k in batches) / n if n else None,
                    "local": local, "batch_means": (sum(m for m, _ in batches) / len(batches)) if batches else None,
                    "rank_means": sum(means) / len(means) if means else None,
                    "samples": [sum(k for _, k in s) for s in state], "n": n})
        position = [p + 1 for p in position]


def _mean_records(cls, plan: str) -> tuple[list[dict], list[dict]]:
    __tracebackhide__ = True
    from helpers.grading.answers import CheckFailed

    plans = PLANS[plan]
    try:
        records = run_answer(mean_harness, cls, name="DistributedMean", kind="class",
                             world_size=len(plans), rank_args=[(plan,) for plan in plans])
    except CheckFailed as e:
        if "never finished" not in str(e) and "was still running" not in str(e):
            raise
        fail(f"{e} compute() is a collective: every rank must reach its all_reduce at every "
             "call, a rank with no sample of its own too. Reduce first, then decide (about "
             "ValueError as well) from the totals, which every rank then holds.")
    for rank, r in enumerate(records):
        r["rank"] = rank  # the pool's order, not what the rank says
    for r in records:
        if r.get("constructing", "").startswith("NotImplementedError"):
            fail("DistributedMean is not written yet: replace `raise NotImplementedError()` with "
                 "your __init__, and add update(), compute() and reset().")
        if "constructing" in r:
            fail(f"DistributedMean() raised {r['constructing']} on rank {r['rank']}: the constructor "
                 "takes no argument and starts with no sample.")
        if "missing" in r:
            fail(f"DistributedMean has no method {r['missing']}(): it needs update(batch_mean, n), "
                 "compute() and reset().")
        for entry in r["log"]:
            if entry.get("raised") == "NotImplementedError":
                fail(f"DistributedMean.{entry['op']}() is not written yet: replace "
                     "`raise NotImplementedError()` with your code.")
    return records, _expected(plans)


#: Relative error allowed: float32 arithmetic is fine for ordinary counts; past 2**24 samples
#: only float64 (or exact integer) counting is right, and a float32 count is off by far more.
TOLERANCE, EXACT = 1e-6, 1e-10


def _close_mean(value, truth, rel: float = TOLERANCE) -> bool:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(value) and math.isclose(value, truth, rel_tol=rel, abs_tol=1e-12)


def _judge_computes(records, expected, what: str, rel: float = TOLERANCE) -> None:
    """Every compute() on every rank: the pooled mean, or ValueError when no rank has a sample."""
    __tracebackhide__ = True
    for r in records:
        computes = [e for e in r["log"] if e["op"] == "compute"]
        for k, (got, want) in enumerate(zip(computes, expected)):
            where = f"compute() call {k + 1} on rank {r['rank']} ({what})"
            state = (f"the ranks had seen {want['samples']} samples"
                     + (f" in all {want['n']:,}" if want["n"] else ""))
            if want["truth"] is None:
                if "raised" in got and got["is_value_error"]:
                    continue
                shown = f"raised {got['raised']}" if "raised" in got else f"returned {got.get('value')!r:.40}"
                fail(f"{where} {shown}, but no rank had seen a sample ({state}): there is no mean "
                     "of nothing. Raise ValueError, on every rank, once the collective has told "
                     "you that the total count is 0.")
            if "raised" in got:
                lonely = want["samples"][r["rank"]] == 0
                fail(f"{where} raised {got['raised']}: {got['message'][:120]}. "
                     + (f"This rank had no sample of its own, but the others had: {state}. "
                        "Raise only when the count over all ranks is 0; otherwise return the "
                        "pooled mean, on every rank." if lonely else
                        f"{state}; it should return {want['truth']:.10g}."))
            value = got.get("value")
            if _close_mean(value, want["truth"], rel):
                continue
            hint = ""
            if want["local"][r["rank"]] is not None and _close_mean(value, want["local"][r["rank"]]):
                hint = (" That is this rank's own mean: add up [sum, count] across the ranks "
                        "(one all_reduce) before dividing.")
            elif want["rank_means"] is not None and _close_mean(value, want["rank_means"]):
                hint = (" That is the mean of the ranks' own means: ranks with more samples must "
                        "count for more. Reduce the sums and the counts, then divide once.")
            elif want["batch_means"] is not None and _close_mean(value, want["batch_means"]):
                hint = (" That is the plain mean of the batch means: a batch of n samples adds "
                        "batch_mean * n to the sum and n to the count.")
            elif want["n"] > 2 ** 24 and isinstance(value, float) and math.isfinite(value) \
                    and math.isclose(value, want["truth"], rel_tol=1e-2):
                hint = (f" Close, but {want['n']:,} samples are past 2**24 = 16,777,216, where "
                        "float32 stops counting single samples: keep the sum and the count in "
                        "float64 (or Python numbers), and all_reduce a float64 tensor.")
            if not hint and k:
                hint = (" compute() had been called before on this rank: if it all-reduced the "
                        "running [sum, count] in place, this rank now holds every rank's totals "
                        "and counts them again. all_reduce a copy.")
            fail(f"{where} returned {value!r:.40}; {state}, whose pooled mean is "
                 f"{want['truth']:.10g}.{hint}")


def distributed_mean_pooled(DistributedMean, plan: str = "pooled") -> None:
    """Ranks with different numbers of update() calls, unequal counts and a rank with no sample:
    compute() returns the mean over every rank's samples, on every rank."""
    __tracebackhide__ = True
    records, expected = _mean_records(DistributedMean, plan)
    _judge_computes(records, expected, "uneven ranks")
    passed(f"the pooled mean over every rank's samples, on every rank ({len(records)} ranks)")


def distributed_mean_one_collective(DistributedMean, plan: str = "collectives") -> None:
    """update() runs no collective; every compute() runs exactly one, leaves the state as it was
    (twice in a row: the same value) and stays right after more updates."""
    __tracebackhide__ = True
    records, expected = _mean_records(DistributedMean, plan)
    for r in records:
        for entry in r["log"]:
            ran = sum(entry.get("collectives", {}).values())
            which = ", ".join(f"{n} {op}" for op, n in sorted(entry.get("collectives", {}).items()))
            if entry["op"] == "update" and ran:
                fail(f"update() ran {which} on rank {r['rank']}. update() is local: add the batch to "
                     "this rank's running sum and count, and leave the communication to compute().")
            if entry["op"] == "compute" and "raised" not in entry and ran != 1:
                extra = (" all_gather_object runs two collectives (the sizes, then the data)."
                         if "all_gather" in entry["collectives"] else "")
                fail(f"compute() ran {ran} collectives on rank {r['rank']} ({which or 'none'}); it "
                     "should run exactly one. Put the sum and the count in one float64 tensor and "
                     f"all_reduce it once.{extra}")
    for r in records:
        values = [e.get("value") for e in r["log"] if e["op"] == "compute"]
        for k, want in enumerate(expected[1:], start=1):
            if want["truth"] == expected[k - 1]["truth"] and values[k - 1] != values[k] \
                    and _close_mean(values[k - 1], want["truth"]):
                fail(f"On rank {r['rank']}, compute() returned {values[k - 1]!r:.30} and then, with no "
                     f"update in between, {values[k]!r:.30}. compute() must not change the metric: "
                     "all_reduce a copy of [sum, count] (a new tensor), not the running state itself.")
    _judge_computes(records, expected, "computed twice in a row, then after more updates")
    passed(f"update() is local, compute() is one collective and changes nothing ({len(records)} ranks)")


def distributed_mean_past_2_24(DistributedMean, plan: str = "large") -> None:
    """More samples than float32 can count (2**24 = 16,777,216 and more, single samples among
    them): the pooled mean is still exact."""
    __tracebackhide__ = True
    records, expected = _mean_records(DistributedMean, plan)
    _judge_computes(records, expected, f"{expected[-1]['n']:,} samples in all", rel=EXACT)
    passed(f"exact with {expected[-1]['n']:,} samples, past 2**24")


def distributed_mean_no_samples(DistributedMean, plan: str = "empty") -> None:
    """When no rank has a sample (nothing updated, or everything reset), compute() raises
    ValueError on every rank, without hanging."""
    __tracebackhide__ = True
    records, expected = _mean_records(DistributedMean, plan)
    _judge_computes(records, expected, "no sample on any rank")
    passed(f"no sample anywhere: ValueError on every rank ({len(records)} ranks)")


def distributed_mean_reset(DistributedMean, plan: str = "reset") -> None:
    """reset() forgets every sample: the next compute() pools only what came after it."""
    __tracebackhide__ = True
    records, expected = _mean_records(DistributedMean, plan)
    _judge_computes(records, expected, "after reset()")
    passed(f"reset() starts a new window ({len(records)} ranks)")
