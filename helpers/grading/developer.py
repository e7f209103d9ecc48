"""Checks of the developer exercises (``notebooks/developer/06_exercises.ipynb``).

A test cell imports this module and calls one check, named after the cell (the cell
``test_save_checkpoint_contents`` calls :func:`save_checkpoint_contents`)::

    from helpers.grading import developer as check
    check.save_checkpoint_contents(save_checkpoint, world_size=3, optimizer="sgd", step=7)

Each ``*_harness`` function runs on every rank of a real gloo pool together with the learner's
function. It sets up what a training job would have at that point (a DDP model with unequal
data per rank, an optimizer with state), calls the learner's function, and returns plain data
(numbers, strings, tensors, state dicts) saying what each rank saw; the check compares it,
in the grading kernel, with what is right and says what went wrong in words ("rank 2 read the
file before rank 0 finished writing").

The harnesses use no collective after the learner's function returns: a rank stuck in a
barrier that the others never reach is then reported as the hang it is, instead of being
paired with a collective of the grader's.

Importing this module changes nothing (no seeding, no process started).
"""

from __future__ import annotations

import contextlib
import copy
import os

from helpers.grading.answers import fail, passed, run_answer, scratch
from helpers.lessons.developer import first_difference, same

__all__ = ["save_checkpoint_contents", "save_checkpoint_waits", "save_checkpoint_one_writer",
           "load_checkpoint_model_and_step", "load_checkpoint_optimizer",
           "load_checkpoint_missing_file", "should_stop_same_on_every_rank", "should_stop_weighted",
           "save_harness", "load_harness", "stop_harness", "write_checkpoint", "weighted_loss",
           "same", "first_difference"]

#: Rank 0's slowed-down writes in :func:`save_checkpoint_waits`: (chunks, pause) for a short
#: write (about 0.2 s) and a long one (about 2.4 s). Ranks that sleep instead of waiting at a
#: barrier are either too early for the long write or too late after the short one.
SHORT_SAVE, LONG_SAVE = (4, 0.05), (12, 0.2)
#: How soon after rank 0's write ends every rank must have returned (a barrier takes ms).
PROMPT = 1.2


# ----------------------------------------------------------------------------- small tools


def _optimizer(kind: str, params):
    import torch

    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.01)
    raise ValueError(f"unknown optimizer {kind!r}")


def _clone(state):
    """A deep copy as plain data (state dicts are OrderedDicts: sent back as dicts)."""
    import collections

    state = copy.deepcopy(state)

    def plain(v):
        if isinstance(v, collections.OrderedDict) or type(v) is dict:
            return {k: plain(x) for k, x in v.items()}
        if type(v) in (list, tuple):
            return type(v)(plain(x) for x in v)
        return v

    return plain(state)


# ----------------------------------------------------------------------------- save_checkpoint


def save_harness(save_checkpoint, folder: str, step: int, optimizer: str = "sgd",
                 slow: tuple = ()) -> dict:
    """On every rank: one DDP step on unequal data, then ``save_checkpoint(ddp, opt, step, path)``
    once per entry of ``slow`` (``(chunks, pause)`` of rank 0's slowed-down write, into a new
    file each time), or once at full speed if ``slow`` is empty.

    Returns this rank's ``rank``, the ``model`` (unwrapped) and ``opt`` state it should have
    saved, and per call: how many ``writes`` (torch.save calls) it made, when they ``ended``,
    when the function ``returned``, and what it found when it read the file right after
    (``read``: ok / missing / torn, with ``detail``).
    """
    import time

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from helpers.lessons.races import try_load, watch_saves

    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DDP(nn.Linear(4, 1))
    opt = _optimizer(optimizer, ddp.parameters())
    torch.manual_seed(100 + rank)
    n = 2 + 3 * rank  # unequal data: 2, 5, 8, ... samples
    x, y = torch.randn(n, 4), torch.randn(n, 1) + rank
    opt.zero_grad()
    nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
    calls = []
    for i, (chunks, pause) in enumerate(slow or [(None, 0.0)]):
        path = os.path.join(folder, f"ckpt-{i}.pt")
        with watch_saves(chunks=chunks, pause=pause) as log:
            save_checkpoint(ddp, opt, step, path)
        returned = time.time()
        read = try_load(path)  # no barrier here: the learner's function must have waited
        calls.append({"path": path, "writes": len(log), "returned": returned, "read": str(read),
                      "detail": read.detail, "seconds": (chunks or 0) * pause,
                      "ended": [s["end"] for s in log if s["end"] is not None]})
    return {"rank": rank, "calls": calls, "model": _clone(ddp.module.state_dict()),
            "opt": _clone(opt.state_dict())}


def save_checkpoint_contents(save_checkpoint, world_size: int = 3, optimizer: str = "sgd",
                             step: int = 7) -> None:
    """The file holds the plain model's weights (keys without "module."), the optimizer's
    state and the step."""
    __tracebackhide__ = True
    import torch

    with scratch() as folder:
        ranks = run_answer(save_harness, save_checkpoint, folder, step, optimizer=optimizer,
                           name="save_checkpoint", world_size=world_size)
        path = ranks[0]["calls"][0]["path"]
        if not os.path.exists(path):
            fail("No file was written at `path`: rank 0 should torch.save the checkpoint there.")
        saved = torch.load(path, map_location="cpu", weights_only=True)
    if not (isinstance(saved, dict) and {"model", "opt", "step"} <= set(saved)):
        fail(f"The checkpoint should be a dict with keys 'model', 'opt' and 'step', not {saved!r:.80}.")
    if list(saved["model"]) != ["weight", "bias"]:
        fail(f"The saved model's keys are {list(saved['model'])}: save ddp_model.module.state_dict(). "
             "The 'module.' prefix belongs to the DDP wrapper, and a plain model refuses those keys "
             "when it loads them.")
    if saved["step"] != step:
        fail(f"'step' is {saved['step']!r}, but save_checkpoint was called with step={step}.")
    if not same(saved["model"], ranks[0]["model"]):
        fail("The saved weights are not the model's current weights.")
    where = first_difference(saved["opt"], ranks[0]["opt"])
    if where is not None:
        fail(f"'opt' is not optimizer.state_dict(): it differs at {where}.")
    passed(f"the file holds the model, the optimizer and the step ({world_size} ranks, {optimizer})")


def save_checkpoint_waits(save_checkpoint, world_size: int = 3) -> None:
    """Every rank can read the complete file the moment save_checkpoint returns, and returns
    promptly once rank 0's write ends; rank 0's write is slowed down, short then long."""
    __tracebackhide__ = True
    with scratch() as folder:
        ranks = run_answer(save_harness, save_checkpoint, folder, 3, slow=(SHORT_SAVE, LONG_SAVE),
                           name="save_checkpoint", world_size=world_size)
    for i in range(2):
        ended = [t for r in ranks for t in r["calls"][i]["ended"]]
        if not ended:
            fail("No rank called torch.save: rank 0 should write the checkpoint with torch.save.")
        for r in ranks:
            c = r["calls"][i]
            if c["read"] != "ok":
                fail(f"Rank {r['rank']} read the file before rank 0 finished writing: right after "
                     f"save_checkpoint returned, it found the file {c['read']} ({c['detail'][:70]}). "
                     "Every rank must wait until rank 0's torch.save is done: call dist.barrier() "
                     "after the save, on every rank.")
            late = c["returned"] - max(ended)
            if late > PROMPT:
                fail(f"Rank {r['rank']} returned {late:.1f} s after rank 0's write of about "
                     f"{c['seconds']:.1f} s had ended. A write can take any time, so a fixed sleep is "
                     "too short for some and wastes time after others: wait for the write itself "
                     "with dist.barrier() after the save, on every rank.")
    passed(f"every rank read the complete file as soon as save_checkpoint returned ({world_size} ranks)")


def save_checkpoint_one_writer(save_checkpoint, world_size: int = 3) -> None:
    """Only rank 0 writes: every rank's torch.save calls are counted."""
    __tracebackhide__ = True
    with scratch() as folder:
        ranks = run_answer(save_harness, save_checkpoint, folder, 3, name="save_checkpoint",
                           world_size=world_size)
    writers = [r["rank"] for r in ranks if r["calls"][0]["writes"]]
    if not writers:
        fail("No rank called torch.save: rank 0 should write the checkpoint with torch.save.")
    if writers != [0]:
        fail(f"Ranks {writers} all called torch.save. Only rank 0 should write "
             "(`if dist.get_rank() == 0:`): ranks writing the same path at once can leave a file "
             "that is a mix of their writes, and waste the I/O.")
    passed(f"only rank 0 wrote ({world_size} ranks)")


# ----------------------------------------------------------------------------- load_checkpoint


def write_checkpoint(path: str, step: int, optimizer: str = "sgd", on: str | None = None) -> dict:
    """Write a checkpoint as rank 0 of a finished job would (three steps of training), in this process.

    ``on="cuda:0"`` makes it look saved on a GPU (see :func:`helpers.lessons.developer.pretend_saved_on`).
    Returns what was saved.
    """
    import torch
    import torch.nn as nn

    from helpers.lessons.developer import pretend_saved_on

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = _optimizer(optimizer, model.parameters())
    torch.manual_seed(7)
    x, y = torch.randn(12, 4), torch.randn(12, 1)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    ckpt = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}
    with pretend_saved_on(on) if on else contextlib.nullcontext():
        torch.save(ckpt, path)
    return _clone(ckpt)


def load_harness(load_checkpoint, path: str, optimizer: str = "sgd") -> dict:
    """On every rank: a fresh plain model (different weights on each rank) and optimizer, then
    ``step = load_checkpoint(model, opt, path)``. Returns the step and the states after it."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    rank = dist.get_rank()
    torch.manual_seed(1000 + rank)  # a rank that does not load keeps weights nobody saved
    model = nn.Linear(4, 1)
    opt = _optimizer(optimizer, model.parameters())
    before = _clone(model.state_dict())
    from helpers.grading.answers import plain

    step = load_checkpoint(model, opt, path)
    if isinstance(step, torch.Tensor) and step.numel() == 1:
        step = step.item()
    step = plain(step)
    return {"rank": rank, "step": step, "model": _clone(model.state_dict()),
            "opt": _clone(opt.state_dict()), "before": before}


def _loaded(load_checkpoint, world_size, optimizer, on=None, missing=None):
    """Run load_harness; return (what was saved or None, each rank's report). ``missing``:
    no checkpoint, its folder there ("file") or not created yet either ("folder")."""
    __tracebackhide__ = True
    with scratch() as folder:
        path = os.path.join(folder, "ckpt.pt")
        if missing:
            if missing == "folder":
                path = os.path.join(folder, "not-created-yet", "ckpt.pt")
            saved = None
        else:
            saved = write_checkpoint(path, step=5, optimizer=optimizer, on=on)
        ranks = run_answer(load_harness, load_checkpoint, path, optimizer, name="load_checkpoint",
                           world_size=world_size)
    return saved, ranks


def load_checkpoint_model_and_step(load_checkpoint, world_size: int = 3, optimizer: str = "sgd",
                                   saved_on: str | None = None) -> None:
    """Every rank gets the saved weights and returns the saved step (each rank starts from
    different weights). ``saved_on="cuda:0"``: the checkpoint looks written on a GPU."""
    __tracebackhide__ = True
    try:
        saved, ranks = _loaded(load_checkpoint, world_size, optimizer, on=saved_on)
        for r in ranks:
            hint = " Every rank must load the checkpoint, not only rank 0." if r["rank"] and r["step"] == 0 else ""
            if r["step"] != 5:
                fail(f"Rank {r['rank']} returned {r['step']!r}, not the saved step 5.{hint}")
            if not same(r["model"], saved["model"]):
                fail(f"Rank {r['rank']}'s model does not hold the saved weights after load_checkpoint: "
                     "call model.load_state_dict(ckpt['model']) on every rank.")
    except AssertionError as err:
        if not saved_on:
            raise
        fail(f"Loading a checkpoint that was saved on {saved_on} failed. Load with map_location='cpu' "
             f"so every rank gets the tensors on the CPU. {err}")
    where = f", saved on {saved_on}" if saved_on else ""
    passed(f"every rank loaded the weights and the step ({world_size} ranks{where})")


def load_checkpoint_optimizer(load_checkpoint, world_size: int = 3, optimizer: str = "sgd") -> None:
    """Every rank's optimizer gets the saved state back (momentum buffers, step counts)."""
    __tracebackhide__ = True
    saved, ranks = _loaded(load_checkpoint, world_size, optimizer)
    for r in ranks:
        if not r["opt"]["state"]:
            fail(f"Rank {r['rank']}'s optimizer has no state after load_checkpoint: call "
                 "optimizer.load_state_dict(ckpt['opt']) on every rank. Without it the resumed run "
                 "restarts its momentum from zero, and the ranks' weights drift apart.")
        where = first_difference(r["opt"], saved["opt"])
        if where is not None:
            fail(f"Rank {r['rank']}'s optimizer state differs from the saved one at {where}.")
    passed(f"every rank's optimizer got its saved state back ({world_size} ranks, {optimizer})")


def load_checkpoint_missing_file(load_checkpoint, world_size: int = 3,
                                 folder_missing: bool = False) -> None:
    """With no checkpoint yet (a fresh run; ``folder_missing``: not even its folder) every rank
    returns 0 and leaves its model as it was; with one, it returns the saved step (so that
    always returning 0 does not pass)."""
    __tracebackhide__ = True
    try:
        _, ranks = _loaded(load_checkpoint, world_size, "sgd",
                           missing="folder" if folder_missing else "file")
    except AssertionError as err:
        fail("There is no file at `path` (the first run of a job): load_checkpoint must return 0 "
             f"instead of failing. {err}")
    for r in ranks:
        if r["step"] != 0:
            fail(f"With no checkpoint, rank {r['rank']} returned {r['step']!r} instead of 0.")
        if not same(r["model"], r["before"]):
            fail(f"Rank {r['rank']}'s model changed although there was no checkpoint.")
    _, ranks = _loaded(load_checkpoint, world_size, "sgd")
    if ranks[0]["step"] != 5:
        fail(f"With no checkpoint every rank returned 0, but with one saved at step 5 rank 0 "
             f"returned {ranks[0]['step']!r:.40}: return the saved step when the file exists.")
    passed(f"with no checkpoint yet every rank returned 0 ({world_size} ranks)")


# ----------------------------------------------------------------------------- should_stop


def weighted_loss(losses, counts) -> float:
    """The loss over every sample: sum(n_r * loss_r) / sum(n_r)."""
    return sum(l * n for l, n in zip(losses, counts)) / sum(counts)


def stop_harness(should_stop, losses, counts, thresholds) -> dict:
    """On every rank r: ``should_stop(losses[r], counts[r], t)`` for each threshold ``t`` in turn."""
    import torch
    import torch.distributed as dist

    from helpers.grading.answers import plain

    rank = dist.get_rank()
    answers = []
    for t in thresholds:
        value = should_stop(losses[rank], counts[rank], t)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()  # a one-element tensor is a fine way to say it
        answers.append(plain(value))
    return {"rank": rank, "answers": answers}


def _decisions(should_stop, losses, counts, thresholds) -> list[list[bool]]:
    """Per threshold, every rank's answer; anything but True/False fails."""
    __tracebackhide__ = True
    ranks = run_answer(stop_harness, should_stop, list(losses), list(counts), list(thresholds),
                       name="should_stop", world_size=len(losses))
    for r in ranks:
        for got in r["answers"]:
            if not isinstance(got, bool):
                fail(f"should_stop returned {got!r:.40} on rank {r['rank']}: return True or False.")
    return [list(per_t) for per_t in zip(*[r["answers"] for r in ranks])]


def should_stop_same_on_every_rank(should_stop, losses, counts, thresholds) -> None:
    """Every rank gets the same True/False, even when the ranks' own losses fall on both sides
    of the threshold; and where every rank's loss is below (or above) it, that answer is True
    (or False), so that an answer that never stops does not pass."""
    __tracebackhide__ = True
    clear = [max(losses) * 2 + 1, min(losses) / 2]  # every loss below / above these
    got = _decisions(should_stop, losses, counts, list(thresholds) + clear)
    for t, answers in zip(thresholds, got):
        if len(set(answers)) != 1:
            fail(f"With threshold {t} the ranks disagree: {dict(enumerate(answers))}. The ranks that "
                 "return True stop training while the others wait forever in their next collective: "
                 "decide from the all-reduced loss, so that every rank reaches the same answer.")
    for t, answers, want in zip(clear, got[len(thresholds):], (True, False)):
        if set(answers) != {want}:
            fail(f"With threshold {t:g} every rank's loss is {'below' if want else 'above'} it, so every "
                 f"rank should return {want}; they returned {dict(enumerate(answers))}.")
    passed(f"every rank gave the same answer ({len(losses)} ranks, {len(thresholds) + 2} thresholds)")


def should_stop_weighted(should_stop, losses, counts, thresholds) -> None:
    """The decision uses the loss over all samples, sum(n * loss) / sum(n), not the plain mean
    of the ranks' losses."""
    __tracebackhide__ = True
    got = _decisions(should_stop, losses, counts, thresholds)
    truth, plain = weighted_loss(losses, counts), sum(losses) / len(losses)
    for t, answers in zip(thresholds, got):
        if len(set(answers)) != 1:
            fail(f"With threshold {t} the ranks disagree: {dict(enumerate(answers))}.")
        if answers[0] != (truth < t):
            fail(f"With threshold {t} every rank returned {answers[0]}, but the loss over all "
                 f"{sum(counts)} samples is {truth:.3f}. The plain mean of the ranks' losses "
                 f"({plain:.3f}) gives a rank with {min(counts)} samples as much say as one with "
                 f"{max(counts)}: weight each rank's loss by its n_samples.")
    passed(f"the decision follows the loss over all {sum(counts)} samples ({len(losses)} ranks)")
