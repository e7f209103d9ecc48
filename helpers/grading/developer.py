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
           "save_harness", "waits_harness", "load_harness", "stop_harness", "write_checkpoint", "weighted_loss",
           "same", "first_difference",
           "save_rotating_files", "save_rotating_waits", "save_rotating_one_writer", "save_rotating_atomic",
           "save_rotating_durable", "save_rotating_mode", "save_rotating_failure", "rotating_harness",
           "setup_logging_console_and_files", "setup_logging_twice", "logging_harness",
           "rank_zero_only_runs_on_rank_0", "rank_zero_only_keeps_name_and_doc",
           "rank_zero_only_before_init", "rank_zero_only_decides_at_each_call",
           "rank_zero_only_harness"]

#: How long the grader holds rank 0's save open in :func:`save_checkpoint_waits`, seconds: a
#: short save, then a long one. Ranks that sleep instead of waiting at a barrier are either too
#: early for the long save or too late after the short one.
HOLDS = (0.2, 2.4)
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


def expected_after_step(world_size: int, optimizer: str = "sgd") -> tuple[dict, dict]:
    """The plain model's and the optimizer's state after :func:`save_harness`'s DDP step on
    ``world_size`` ranks, worked out here, in one process, without any rank: the same initial
    weights, each rank's own batch, the gradients averaged as DDP averages them, one step. The
    grading kernel's random state is left as it was."""
    import torch
    import torch.nn as nn

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
    opt = _optimizer(optimizer, model.parameters())
    grads = [torch.zeros_like(p) for p in model.parameters()]
    for rank in range(world_size):
        g = torch.Generator().manual_seed(100 + rank)
        n = 2 + 3 * rank
        x, y = torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g) + rank
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        for total, p in zip(grads, model.parameters()):
            total += p.grad / world_size
    for p, grad in zip(model.parameters(), grads):
        p.grad = grad
    opt.step()
    return _clone(model.state_dict()), _clone(opt.state_dict())


def save_checkpoint_contents(save_checkpoint, world_size: int = 3, optimizer: str = "sgd",
                             step: int = 7) -> None:
    """The file holds the plain model's weights (keys without "module."), the optimizer's
    state and the step: the file is read here, and compared with the state worked out here
    (:func:`expected_after_step`), not with anything a rank reports."""
    __tracebackhide__ = True
    import torch

    with scratch() as folder:
        run_answer(save_harness, save_checkpoint, folder, step, optimizer=optimizer,
                   name="save_checkpoint", world_size=world_size)
        path = os.path.join(folder, "ckpt-0.pt")
        if not os.path.exists(path):
            fail("No file was written at `path`: rank 0 should torch.save the checkpoint there.")
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - what the learner wrote is what is checked
            fail(f"The checkpoint at `path` does not load with torch.load(path, weights_only=True): "
                 f"{type(e).__name__}: {str(e)[:200]}. Save a dict of state dicts and plain values.")
    model, opt = expected_after_step(world_size, optimizer)
    if not (isinstance(saved, dict) and {"model", "opt", "step"} <= set(saved)):
        fail(f"The checkpoint should be a dict with keys 'model', 'opt' and 'step', not {saved!r:.80}.")
    if list(saved["model"]) != ["weight", "bias"]:
        fail(f"The saved model's keys are {list(saved['model'])}: save ddp_model.module.state_dict(). "
             "The 'module.' prefix belongs to the DDP wrapper, and a plain model refuses those keys "
             "when it loads them.")
    if saved["step"] != step:
        fail(f"'step' is {saved['step']!r}, but save_checkpoint was called with step={step}.")
    if first_difference(saved["model"], model, close=True) is not None:
        fail("The saved weights are not the model's current weights (after the training step): "
             "save ddp_model.module.state_dict() when save_checkpoint is called.")
    where = first_difference(saved["opt"], opt, close=True)
    if where is not None:
        fail(f"'opt' is not optimizer.state_dict(): it differs at {where}.")
    passed(f"the file holds the model, the optimizer and the step ({world_size} ranks, {optimizer})")


def waits_harness(save_checkpoint, folder: str, step: int, token) -> None:
    """On every rank: one DDP step on unequal data, then ``save_checkpoint(ddp, opt, step, path)``.
    Rank 0 alone is given ``token`` (a :class:`helpers.grading.watch.GateToken`), put in its
    optimizer's first param group: its ``optimizer.state_dict()`` cannot be pickled, so its save
    cannot end, until the grading kernel releases the gate. Nothing is observed here."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DDP(nn.Linear(4, 1))
    opt = _optimizer("sgd", ddp.parameters())
    torch.manual_seed(100 + rank)
    n = 2 + 3 * rank
    x, y = torch.randn(n, 4), torch.randn(n, 1) + rank
    opt.zero_grad()
    nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
    if token is not None:
        opt.param_groups[0]["grader_gate"] = token
    save_checkpoint(ddp, opt, step, os.path.join(folder, "ckpt.pt"))


def _one_timed_save(save_checkpoint, world_size: int, hold: float, step: int) -> None:
    """One run of :func:`save_checkpoint_waits`: rank 0's save is held open ``hold`` s."""
    __tracebackhide__ = True
    import time

    from helpers.grading.beginner import _load
    from helpers.grading.watch import Gate

    seen: dict[int, tuple] = {}
    with scratch() as folder, Gate(folder, hold, name=".gate") as gate:
        path = os.path.join(folder, "ckpt.pt")

        def look(rank: int) -> None:  # in this kernel, as soon as the rank's result arrives
            returned = time.time()
            outcome, got = _load(path)
            try:
                same = got["step"] == step and got["opt"]["param_groups"][0]["grader_gate"] == gate.secret
            except (KeyError, IndexError, TypeError):
                same = False
            seen[rank] = (returned, outcome, same)

        run_answer(waits_harness, save_checkpoint, folder, step, name="save_checkpoint",
                   world_size=world_size, on_return=look,
                   rank_args=[(gate.token() if r == 0 else None,) for r in range(world_size)])
    if gate.released is None:
        fail("Rank 0 never saved optimizer.state_dict(): rank 0 should torch.save the checkpoint "
             "(the model's, the optimizer's state and the step) at `path`.")
    for rank in sorted(seen):
        returned, outcome, same = seen[rank]
        if outcome == "ok" and same:
            late = returned - gate.released
            if late > PROMPT:
                fail(f"Rank {rank} returned {late:.1f} s after rank 0's write of about {hold:.1f} s "
                     "had ended. A write can take any time, so a fixed sleep is too short for some "
                     "and wastes time after others: wait for the write itself with dist.barrier() "
                     "after the save, on every rank.")
            continue
        found = {"missing": "no file at all", "ok": "a file that was not rank 0's checkpoint"}.get(
            str(outcome), "it half-written")
        fail(f"Rank {rank} read the file before rank 0 finished writing: the grader opened it as soon "
             f"as save_checkpoint returned there and found {found}; rank 0's write went on for "
             f"another {max(0.0, gate.released - returned):.2f} s. Every rank must wait until rank "
             "0's torch.save is done: call dist.barrier() after the save, on every rank.")


def save_checkpoint_waits(save_checkpoint, world_size: int = 3) -> None:
    """Every rank returns only once the checkpoint is complete, and promptly after: the grading
    kernel holds rank 0's save open (its optimizer state holds a secret the kernel releases after
    about 0.2 s, then 2.4 s) and opens the file itself the moment each rank's result arrives."""
    __tracebackhide__ = True
    for i, hold in enumerate(HOLDS):
        _one_timed_save(save_checkpoint, world_size, hold, step=3 + i)
    passed(f"every rank read the complete file as soon as save_checkpoint returned ({world_size} ranks)")


def save_checkpoint_one_writer(save_checkpoint, world_size: int = 3) -> None:
    """Only rank 0 writes, once: the writes to the checkpoint's path are counted in the grading
    kernel (an inotify watch on the folder, :class:`helpers.grading.watch.Writes`), where no
    rank's code can reach the count."""
    __tracebackhide__ = True
    from helpers.grading.watch import Writes

    with scratch() as folder, Writes(folder) as writes:
        run_answer(save_harness, save_checkpoint, folder, 3, name="save_checkpoint",
                   world_size=world_size)
        count = writes.count("ckpt-0.pt")
    if not count:
        fail("No rank wrote the checkpoint at `path`: rank 0 should torch.save it there.")
    if count > 1:
        fail(f"The checkpoint was written {count} times, once per rank that called torch.save. "
             "Only rank 0 should write (`if dist.get_rank() == 0:`), once: ranks writing the same "
             "path at once can leave a file that is a mix of their writes, and waste the I/O.")
    passed(f"only one rank wrote ({world_size} ranks)")


# ----------------------------------------------------------------------------- load_checkpoint


def write_checkpoint(path: str, step: int, optimizer: str = "sgd", on: str | None = None) -> dict:
    """Write a checkpoint as rank 0 of a finished job would (three steps of training), in this process.

    Every tensor of it is then nudged by noise from a fresh secret of this process's, so that
    the only way to hold those values is to read the file (no rank can work them out from the
    course's code). ``on="cuda:0"`` makes it look saved on a GPU (see
    :func:`helpers.lessons.developer.pretend_saved_on`). Returns what was saved. This process's
    random state is left as it was.
    """
    import secrets

    import torch
    import torch.nn as nn

    from helpers.lessons.developer import pretend_saved_on

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        opt = _optimizer(optimizer, model.parameters())
        torch.manual_seed(7)
        x, y = torch.randn(12, 4), torch.randn(12, 1)
        for _ in range(3):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    noise = torch.Generator().manual_seed(secrets.randbits(63))
    tensors = list(model.state_dict().values()) + [t for s in opt.state.values() for t in s.values()
                                                    if isinstance(t, torch.Tensor) and t.is_floating_point()
                                                    and t.dim() > 0]
    with torch.no_grad():
        for t in tensors:
            t.add_(torch.randn(t.shape, generator=noise, dtype=t.dtype) * 0.01)
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
    for rank, r in enumerate(ranks):
        r["rank"] = rank  # the pool's order, not what the rank says
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


def stop_harness(should_stop, thresholds, loss, count) -> dict:
    """On every rank: ``should_stop(loss, count, t)`` for each threshold ``t`` in turn, where
    ``loss`` and ``count`` are this rank's own (each rank is given only its own: ``run(...,
    rank_args=...)``; the loss over every sample is worked out in the grading kernel)."""
    import torch
    import torch.distributed as dist

    from helpers.grading.answers import plain

    answers = []
    for t in thresholds:
        value = should_stop(loss, count, t)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()  # a one-element tensor is a fine way to say it
        answers.append(plain(value))
    return {"rank": dist.get_rank(), "answers": answers}


def _decisions(should_stop, losses, counts, thresholds) -> list[list[bool]]:
    """Per threshold, every rank's answer; anything but True/False fails. Rank r gets only
    ``losses[r]`` and ``counts[r]``: the others' are not in its process to be read instead of
    all-reduced."""
    __tracebackhide__ = True
    ranks = run_answer(stop_harness, should_stop, list(thresholds), name="should_stop",
                       world_size=len(losses), rank_args=list(zip(losses, counts)))
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
                 "return True stop training while the others go on to a collective that no longer has "
                 "every rank: it waits until the timeout, fails when a stopped rank exits, or pairs with "
                 "the next collective the stopped ranks call and returns wrong data. Decide from the "
                 "all-reduced loss, so that every rank reaches the same answer.")
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


# ----------------------------------------------------------------------------- save_rotating
# (Exercise 4: developer/05_checkpointing_in_practice)

#: How long the grading kernel holds rank 0's save of the last checkpoint of a run, seconds.
ROTATING_HOLD = 0.4
#: The file-size limit (bytes) the grading kernel puts on rank 0 when its last save begins in
#: save_rotating_failure: the checkpoint (about 9 KB) cannot be written past it, as on a full disk.
FULL_DISK_AT = 4096

_OBSERVED: dict[tuple, object] = {}  # (answer's code, run settings) -> observations or CheckFailed


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"fd {fd}"


@contextlib.contextmanager
def _watched_fsyncs(fn, log: list):
    """Where the kernel cannot see a rank's system calls (not Linux): every ``os.fsync`` /
    ``os.fdatasync`` in this process is logged as ``(path, size on disk)``, however the answer
    imported it (``from os import fsync`` included). A note made in the rank, so the answer
    could fake it: on Linux the kernel watches the calls themselves instead."""
    originals = {"fsync": os.fsync, "fdatasync": getattr(os, "fdatasync", None)}

    def wrap(real):
        def watched(fd):
            fileno = fd if isinstance(fd, int) else fd.fileno()
            log.append((_fd_path(fileno), os.fstat(fileno).st_size))
            return real(fd)
        return watched

    wrappers = {name: wrap(real) for name, real in originals.items() if real is not None}
    swapped = []
    for name, wrapper in wrappers.items():
        setattr(os, name, wrapper)
    for key, value in list(fn.__globals__.items()):
        for name, real in originals.items():
            if real is not None and value is real:
                fn.__globals__[key] = wrappers[name]
                swapped.append((key, real))
    try:
        yield log
    finally:
        for name, real in originals.items():
            if real is not None:
                setattr(os, name, real)
        for key, real in swapped:
            fn.__globals__[key] = real


def _rotating_state(step: int, token=None) -> dict:
    import torch

    state = {"step": step, "weights": torch.full((2048,), float(step))}
    if token is not None:
        state["gate"] = token  # a GateToken: this state cannot be pickled until the kernel says
    return state


def _listing(folder: str) -> list[str]:
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def rotating_harness(save_rotating, ckpt_dir: str, steps: list, keep, umask: int,
                     first=None, last=None, log_fsyncs: bool = False) -> dict:
    """On every rank: ``save_rotating(state, ckpt_dir, step[, keep])`` for each step in turn
    (``keep=None``: the default is used), with this process's umask set to ``umask``.

    ``first`` and ``last`` are the grading kernel's gate tokens (:mod:`helpers.grading.watch`),
    put in the state of the first call (every rank) and of the last (``last``: rank 0 only): a
    save of those states waits for the kernel, which meanwhile watches ckpt_dir and looks at it
    (and, in save_rotating_failure, limits rank 0's file size). Everything the checks decide on
    is observed in the kernel (the writes, renames and removals, rank 0's fsyncs, the folder
    while the last save is held, the files when each rank returned); what comes back is each
    call's return value (and, where the kernel cannot watch system calls, rank 0's fsyncs). No
    collective after the answer.
    """
    import torch.distributed as dist

    os.umask(umask)
    rank = dist.get_rank()
    seen = {"rank": rank, "returned": [], "fsyncs": []}
    for i, step in enumerate(steps):
        token = first if i == 0 else last if last and i == len(steps) - 1 else None
        args = (_rotating_state(step, token), ckpt_dir, step) + (() if keep is None else (keep,))
        watch = _watched_fsyncs(save_rotating, seen["fsyncs"]) if log_fsyncs and rank == 0 \
            else contextlib.nullcontext()
        with watch:
            returned = save_rotating(*args)
        seen["returned"].append(os.path.realpath(os.fspath(returned))
                                if isinstance(returned, (str, os.PathLike)) else repr(returned)[:80])
    return seen


def _read_latest(ckpt_dir: str):
    try:
        with open(os.path.join(ckpt_dir, "latest")) as f:
            return f.read().strip()
    except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
        return None


def _inspect(ckpt_dir: str) -> dict:
    """Each file of ckpt_dir: its permission bits, and the step a checkpoint holds ("torn" if it
    does not load)."""
    import torch

    files = {}
    for name in _listing(ckpt_dir):
        path = os.path.join(ckpt_dir, name)
        files[name] = {"mode": os.stat(path).st_mode & 0o777, "loads": None}
        if name.startswith("step_") and name.endswith(".pt"):
            try:
                files[name]["loads"] = torch.load(path, map_location="cpu", weights_only=True)["step"]
            except Exception:  # noqa: BLE001 - a torn or foreign file is what is being checked
                files[name]["loads"] = "torn"
    return files


def _ckpt_name(step: int) -> str:
    return f"step_{step:08d}.pt"


def _observe(save_rotating, world_size: int, steps: list, keep, umask: int, fail_last: bool = False):
    """Run :func:`rotating_harness` once per answer and settings (the checks share the run)."""
    __tracebackhide__ = True
    from helpers.grading.answers import CheckFailed, _answer_key

    import resource
    import threading
    import time

    from helpers.grading.watch import Gate, Writes
    from helpers.lessons.races import try_load
    from helpers.spawn import can_watch_syscalls

    key = (_answer_key(save_rotating, "save_rotating"), world_size, tuple(steps), keep, umask, fail_last)
    if key not in _OBSERVED:
        with scratch() as root, Writes(root) as writes:
            ckpt_dir = os.path.realpath(os.path.join(root, "run-1", "checkpoints"))  # not there yet
            watched, half, after, stop = [], {}, {}, threading.Event()

            def watch_ckpt_dir():  # in this kernel, while the first save is held: from now on every
                def follow():      # write, rename and removal in ckpt_dir is seen here
                    while not stop.is_set():
                        if os.path.isdir(ckpt_dir) and writes.watch(ckpt_dir):
                            watched.append(time.time())
                            return
                        stop.wait(0.005)
                if os.path.isdir(ckpt_dir) and writes.watch(ckpt_dir):
                    watched.append(time.time())
                else:  # created only later: watched from then on
                    threading.Thread(target=follow, daemon=True).start()

            pids, started, limited = [], threading.Event(), []
            syscalls = can_watch_syscalls()

            def on_start(ranks):
                pids.extend(ranks)
                started.set()

            def look_half():  # while rank 0's last save is held, before any byte of it is written
                half.update(listing=_listing(ckpt_dir), latest=_read_latest(ckpt_dir))
                if fail_last and started.wait(60):  # a full disk, for rank 0 alone: from now on
                    # no file of its can grow past FULL_DISK_AT bytes (its hard limit too)
                    resource.prlimit(pids[0], resource.RLIMIT_FSIZE, (FULL_DISK_AT, FULL_DISK_AT))
                    limited.append(True)

            def look(rank):  # as soon as the rank's result arrives
                name = _read_latest(ckpt_dir)
                after[rank] = {"latest": name,
                               "loads": str(try_load(os.path.join(ckpt_dir, name)) if name else "missing")}

            watch = dict(on_syscall=lambda rank, call, fd: writes.mark(call)) if syscalls else {}
            with Gate(root, 0.0, name=".first", on_open=watch_ckpt_dir) as first, \
                    Gate(root, ROTATING_HOLD, name=".last", on_open=look_half) as last:
                try:
                    ranks = run_answer(rotating_harness, save_rotating, ckpt_dir, list(steps), keep, umask,
                                       name="save_rotating", world_size=world_size, on_start=on_start,
                                       on_return=look, log_fsyncs=not syscalls, **watch,
                                       rank_args=[(first.token(), last.token() if r == 0 else None)
                                                  for r in range(world_size)])
                    crashed = None
                except CheckFailed as err:
                    if not limited:
                        _OBSERVED[key] = err
                        raise
                    ranks, crashed = None, str(err)      # the failed write ended the job, as it would
                finally:
                    stop.set()
            writes.read()
            _OBSERVED[key] = {"ranks": ranks, "files": _inspect(ckpt_dir), "latest": _read_latest(ckpt_dir),
                              "ckpt_dir": ckpt_dir, "crashed": crashed, "steps": list(steps),
                              "keep": 3 if keep is None else keep, "umask": umask,
                              "watched": bool(watched), "held": last.opened is not None,
                              "half": half or None, "after": after,
                              "syscalls": syscalls,
                              "events": [(n, kind, c) for f, n, kind, c in writes.events
                                         if f == ckpt_dir or kind == "mark"]}
    found = _OBSERVED[key]
    if isinstance(found, CheckFailed):
        raise found
    return found


#: The runs the checks share: visible (3 ranks, the default keep) and hidden (4 ranks, keep=2).
_RUNS = {3: dict(steps=[1, 2, 3, 4, 5], keep=None, umask=0o022),
         4: dict(steps=[10, 20, 30], keep=2, umask=0o027)}


def _run(save_rotating, world_size: int):
    __tracebackhide__ = True
    settings = _RUNS.get(world_size, _RUNS[3])
    return _observe(save_rotating, world_size, **settings)


def save_rotating_files(save_rotating, world_size: int = 3) -> None:
    """The folder holds the last ``keep`` checkpoints and ``latest``; each holds its own step; every
    rank returns the new checkpoint's path; ``ckpt_dir`` is created if needed."""
    __tracebackhide__ = True
    seen = _run(save_rotating, world_size)
    steps, keep, ckpt_dir = seen["steps"], seen["keep"], seen["ckpt_dir"]
    want = [_ckpt_name(s) for s in steps[-keep:]] + ["latest"]
    got = sorted(seen["files"])
    if not got:
        fail(f"Nothing was written in ckpt_dir ({ckpt_dir}, which did not exist yet): rank 0 should create "
             "it (os.makedirs(ckpt_dir, exist_ok=True)) and write step_{step:08d}.pt there.")
    if got != sorted(want):
        extra = sorted(set(got) - set(want))
        missing = sorted(set(want) - set(got))
        fail(f"After saving steps {steps} with keep={keep}, ckpt_dir holds {got}; it should hold exactly "
             f"{sorted(want)}. " + (f"Not expected: {extra}. " if extra else "")
             + (f"Missing: {missing}. " if missing else "")
             + "Name each checkpoint step_{step:08d}.pt, keep the newest `keep` of them, remove the older "
             "ones, and leave no temp file behind.")
    for s in steps[-keep:]:
        loads = seen["files"][_ckpt_name(s)]["loads"]
        if loads != s:
            fail(f"{_ckpt_name(s)} holds {'a file that does not load' if loads == 'torn' else f'step {loads!r}'}: "
                 f"it should be torch.save(state, ...) of the state passed with step={s}.")
    if seen["latest"] != _ckpt_name(steps[-1]):
        fail(f"`latest` holds {seen['latest']!r}; it should hold the newest checkpoint's file name, "
             f"{_ckpt_name(steps[-1])!r} (the name only, not a path).")
    expected = os.path.join(ckpt_dir, _ckpt_name(steps[-1]))
    for r in seen["ranks"]:
        if r["returned"][-1] != expected:
            fail(f"Rank {r['rank']} returned {r['returned'][-1]!r}; every rank should return the new "
                 f"checkpoint's path, os.path.join(ckpt_dir, {_ckpt_name(steps[-1])!r}).")
    passed(f"the last {keep} checkpoints and `latest` are there, and every rank returned the path "
           f"({world_size} ranks)")


def save_rotating_waits(save_rotating, world_size: int = 3) -> None:
    """Every rank returns only once the new checkpoint is complete and ``latest`` names it: the
    grading kernel holds rank 0's last save open and looks at the folder itself the moment each
    rank's result arrives."""
    __tracebackhide__ = True
    seen = _run(save_rotating, world_size)
    name = _ckpt_name(seen["steps"][-1])
    for rank, after in sorted(seen["after"].items()):
        if after["latest"] != name or after["loads"] != "ok":
            found = ("there was no `latest` yet" if after["latest"] is None else
                     f"`latest` named {after['latest']!r} (not {name!r}) and that file was {after['loads']}")
            fail(f"Rank {rank} returned before the save was finished: when save_rotating returned there, the "
                 f"grader looked and {found}. Every "
                 "rank must wait until rank 0 has written the checkpoint and `latest`: call dist.barrier() after "
                 "rank 0's work, on every rank.")
    passed(f"every rank returned only once {name} and `latest` were complete ({world_size} ranks)")


def _publications(seen, name: str) -> list[tuple[str, str | None]]:
    """How ``name`` came to be in ckpt_dir, in order (seen by the kernel's inotify watch): one
    ``("written", None)`` per write of the file under that name, one ``("renamed", temp)`` per
    rename onto it (``temp``: the file's name in ckpt_dir before, None if it came from outside)."""
    events, out = seen["events"], []
    for i, (n, kind, cookie) in enumerate(events):
        if n != name or kind not in ("written", "moved_to"):
            continue
        if kind == "written":
            out.append(("written", None))
            continue
        temp = next((m for m, k, c in reversed(events[:i]) if k == "moved_from" and c == cookie and cookie), None)
        out.append(("renamed", temp))
    return out


def save_rotating_one_writer(save_rotating, world_size: int = 3) -> None:
    """Only rank 0 writes, once per step: the grading kernel watches ckpt_dir (inotify, from the
    first save on) and counts the writes and renames onto each checkpoint's name."""
    __tracebackhide__ = True
    seen = _run(save_rotating, world_size)
    if not seen["watched"]:
        fail("No rank called torch.save in ckpt_dir: rank 0 should create ckpt_dir "
             "(os.makedirs(ckpt_dir, exist_ok=True)) and write each checkpoint there with torch.save.")
    counts = {s: len(_publications(seen, _ckpt_name(s))) for s in seen["steps"]}
    if not any(counts.values()):
        fail("No checkpoint was ever written in ckpt_dir: rank 0 should write each one with torch.save.")
    many = {s: n for s, n in counts.items() if n > 1}
    if many:
        step, n = max(many.items(), key=lambda kv: kv[1])
        fail(f"{_ckpt_name(step)} was written {n} times, once per rank that saved it. Only rank 0 should write "
             "(`if dist.get_rank() == 0:`): ranks writing the same files at once can leave a mix of their "
             "writes, and every rank's rotation removes files the others are still writing.")
    passed(f"each checkpoint was written once ({world_size} ranks)")


def save_rotating_atomic(save_rotating, world_size: int = 3) -> None:
    """Rank 0 writes a temp file in ckpt_dir and renames it into place; ``latest`` is replaced
    the same way; the old checkpoints are still there while the new one is written. Observed in
    the grading kernel: the renames and writes in ckpt_dir (inotify), and the folder while it
    holds rank 0's last save open."""
    __tracebackhide__ = True
    seen = _run(save_rotating, world_size)
    steps, keep = seen["steps"], seen["keep"]
    half, name = seen["half"], _ckpt_name(steps[-1])
    if half is None:
        fail("Rank 0 never called torch.save for the last checkpoint: write it with torch.save.")
    published = _publications(seen, name)
    if published and published[0][0] == "written":
        fail(f"Rank 0 wrote straight to the final name {name}: while it is being written, "
             "that name holds a half-written file, and a crash leaves it torn. Write to a temp file in ckpt_dir, "
             "then os.replace(tmp, final).")
    if published and published[0][1] is None:
        fail(f"Rank 0 renamed {name} into ckpt_dir from another folder: os.replace is only atomic "
             "within one filesystem, so write the temp file in ckpt_dir itself.")
    before = [n for n in half["listing"] if n.startswith("step_") and n.endswith(".pt")]
    earlier = [_ckpt_name(s) for s in steps[:-1]][-keep:]
    if sorted(before) != sorted(earlier):
        fail(f"While the new checkpoint was being saved, ckpt_dir held {sorted(before)} instead of the "
             f"{len(earlier)} earlier ones {earlier}: old checkpoints were removed before the new one was "
             "complete. Remove the oldest only after the new checkpoint and `latest` are in place.")
    if half["latest"] != earlier[-1]:
        fail(f"While the new checkpoint was being saved, `latest` held {half['latest']!r} instead of "
             f"{earlier[-1]!r}: point `latest` at the new checkpoint only once it is complete.")
    in_place = sum(1 for n, kind, _ in seen["events"] if n == "latest" and kind == "written")
    if in_place > 1:
        fail("`latest` was rewritten in place (the same file, truncated and written again): a reader, or a "
             "crash, can find it empty. Write the new name to a temp file in ckpt_dir and os.replace it onto "
             "`latest`, as for the checkpoint.")
    passed(f"checkpoint and `latest` are published through a temp file and a rename; nothing old was removed "
           f"early ({world_size} ranks)")


def _synced(seen, name: str) -> tuple[str | None, bool]:
    """How the checkpoint ``name`` reached ckpt_dir, and whether rank 0 made it durable:
    ``(temp, synced)``, ``temp`` the name of the file of ckpt_dir first renamed onto ``name``
    (``name`` itself if it was written in place; None if neither was seen), ``synced`` whether
    rank 0 made an fsync (or fdatasync) call after that file's last write and before the rename
    (written in place: before rank 0 wrote any other file). Seen in the kernel: rank 0's calls
    are marks among the inotify events (a seccomp watch); where the kernel cannot watch system
    calls, rank 0's own log of them is used instead."""
    events = seen["events"]
    temp, end = None, None
    for i, (n, kind, cookie) in enumerate(events):
        if n == name and kind == "moved_to" and cookie:
            j = next((k for k in range(i - 1, -1, -1) if events[k][1] == "moved_from" and events[k][2] == cookie), None)
            if j is not None:
                temp, end = events[j][0], j
                break
        if n == name and kind == "written":
            temp = name
            break
    if temp is None:
        return None, False
    if not seen["syscalls"]:
        path = os.path.join(seen["ckpt_dir"], temp)
        return temp, any(p == path for p, _ in seen["ranks"][0]["fsyncs"])
    last_write = max((k for k, e in enumerate(events) if e[:2] == (temp, "modified")
                      and (end is None or k < end)), default=-1)
    if end is None:  # in place: the window closes when rank 0 writes another file
        end = next((k for k in range(last_write + 1, len(events))
                    if events[k][1] == "modified" and events[k][0] != temp), len(events))
    return temp, any(events[k][1] == "mark" for k in range(last_write + 1, end))


def save_rotating_durable(save_rotating, world_size: int = 3) -> None:
    """Rank 0 fsyncs the checkpoint after writing it, before renaming it into place: the grading
    kernel sees rank 0's fsync calls (a seccomp watch) among the writes and renames in ckpt_dir
    (inotify), in the order they happened."""
    __tracebackhide__ = True
    seen = _run(save_rotating, world_size)
    name = _ckpt_name(seen["steps"][-1])
    temp, synced = _synced(seen, name)
    if temp is None:
        fail(f"No write of {name} was seen in ckpt_dir: rank 0 should write each checkpoint there.")
    if not synced:
        fail("Rank 0 never called os.fsync on the checkpoint's temp file before renaming it. os.replace makes "
             "the switch atomic, but without f.flush() and os.fsync(f.fileno()) the bytes may still be only "
             "in memory: after a crash, the new name can point to an empty or partial file.")
    passed(f"rank 0 fsynced the checkpoint before publishing it ({world_size} ranks)")


def save_rotating_mode(save_rotating, world_size: int = 3) -> None:
    """The checkpoint and ``latest`` get the permissions a plain open() gives (0o666 minus the umask)."""
    __tracebackhide__ = True
    seen = _run(save_rotating, world_size)
    want = 0o666 & ~seen["umask"]
    for name, info in sorted(seen["files"].items()):
        if info["mode"] != want:
            fail(f"{name} has mode 0o{info['mode']:03o}; with the job's umask 0o{seen['umask']:03o} a plain "
                 f"open() gives 0o{want:03o}. " + ("That is owner-only: tempfile.mkstemp and NamedTemporaryFile create "
                                           "files with mode 0o600, unreadable to the rest of a team on a shared "
                                           "cluster. Open the temp file with a plain open(tmp, 'wb')."
                                           if info["mode"] == 0o600 else "Create files with a plain open()."))
    passed(f"the files have the mode a plain open() gives, 0o{want:03o} ({world_size} ranks)")


_FAILING = {3: dict(steps=[1, 2, 3, 4], keep=None, umask=0o022),
            4: dict(steps=[5, 10, 15], keep=2, umask=0o022)}


def save_rotating_failure(save_rotating, world_size: int = 3) -> None:
    """A write that fails half-way (a full disk) leaves every earlier checkpoint, the previous
    ``latest``, and no temp file."""
    __tracebackhide__ = True
    settings = _FAILING.get(world_size, _FAILING[3])
    seen = _observe(save_rotating, world_size, fail_last=True, **settings)
    steps, keep = seen["steps"], seen["keep"]
    earlier = [_ckpt_name(s) for s in steps[:-1]][-keep:]
    got = sorted(seen["files"])
    if sorted(earlier + ["latest"]) != got:
        extra = sorted(set(got) - set(earlier) - {"latest"})
        lost = sorted(set(earlier) - set(got))
        new = _ckpt_name(steps[-1])
        torn = (f"A half-written {new} was left under the final name: write to a temp file, and rename it "
                "only once it is complete. " if new in extra else "")
        temps = [n for n in extra if n != new]
        fail(f"Rank 0's write of {new} failed half-way (the grader limited its file size, as a full disk would). "
             f"Afterwards ckpt_dir holds {got}; it should hold the earlier checkpoints {earlier} and `latest`, "
             "nothing else. " + torn + (f"Left behind: {temps}: remove the temp file when the write fails "
                                        "(try/finally). " if temps else "")
             + (f"Lost: {lost}: remove old checkpoints only after the new one is complete. " if lost else ""))
    if any(seen["files"][n]["loads"] == "torn" for n in earlier):
        fail("An earlier checkpoint no longer loads after the failed write.")
    if seen["latest"] != earlier[-1]:
        fail(f"After the failed write, `latest` holds {seen['latest']!r} instead of {earlier[-1]!r}: update "
             "`latest` only once the new checkpoint is complete.")
    passed(f"a write that failed half-way left the earlier checkpoints, `latest` and no temp file "
           f"({world_size} ranks)")


# ----------------------------------------------------------------------------- setup_logging
# The logging lesson (``notebooks/developer/04_logging_from_one_rank.ipynb`` §3): rank 0 talks on
# stdout at INFO, every rank writes DEBUG to its own file, every record names its rank, a second
# call adds nothing, and nothing goes through the root logger.


def logging_harness(setup_logging, secret, log_dir, calls, tag):
    """On every rank: a handler on the root logger (what ``logging.basicConfig`` leaves) writes
    to stderr whatever reaches it, marked with the kernel's ``secret``; ``setup_logging(rank,
    log_dir)`` is called ``calls`` times; the last logger returned logs one DEBUG, one INFO and
    one WARNING record carrying ``tag``. What the rank printed and wrote to its file is read in
    the grading kernel; what is returned here is only the answer's claim about its logger."""
    import logging

    import torch.distributed as dist

    from helpers.grading.answers import announce

    rank = dist.get_rank()
    watch = logging.StreamHandler(open(2, "w", buffering=1, closefd=False))
    watch.setLevel(logging.DEBUG)
    watch.setFormatter(logging.Formatter(f"[root {secret}] %(name)s: %(message)s"))
    logging.getLogger().addHandler(watch)
    announce(secret)
    handlers, kind, name = [], None, None
    for _ in range(calls):
        logger = setup_logging(rank, log_dir)
        handlers.append(len(logger.handlers) if isinstance(logger, logging.Logger) else None)
    kind, name = type(logger).__name__, getattr(logger, "name", None)
    if isinstance(logger, logging.Logger):
        for level, word in ((logging.DEBUG, "debug"), (logging.INFO, "info"),
                            (logging.WARNING, "warning")):
            logger.log(level, "%s %s record", tag, word)
        for handler in logger.handlers:
            handler.flush()
    logging.getLogger().removeHandler(watch)
    return {"rank": rank, "kind": kind, "name": name, "same": logger is logging.getLogger("train"),
            "propagate": bool(getattr(logger, "propagate", False)), "handlers": handlers}


def _logging_records(setup_logging, world_size: int, calls: int, missing: str) -> tuple[list[dict], str]:
    """``missing``: the part of log_dir that does not exist yet ("" for an existing folder).
    Each rank's record: its claims about the logger, and what the kernel read itself: the rank's
    ``stdout`` and ``stderr`` after its marker, its ``file`` (``log_dir/rank{r}.log``), the
    records that reached the root logger's handler (``root``)."""
    __tracebackhide__ = True
    from helpers.grading.answers import printed, secret

    tag, nonce, outputs = "check-7f3a", secret(), []
    with scratch() as folder:
        log_dir = os.path.join(folder, missing) if missing else folder
        records = run_answer(logging_harness, setup_logging, nonce, log_dir, calls, tag,
                             name="setup_logging", world_size=world_size, outputs=outputs)
        made = os.path.isdir(log_dir)
        files = []
        for rank in range(world_size):
            path = os.path.join(log_dir, f"rank{rank}.log")
            files.append(open(path, errors="replace").read()[:20000] if os.path.isfile(path) else None)
    root = f"[root {nonce}] "
    for rank, (r, said, text) in enumerate(zip(records, printed(outputs, nonce), files)):
        reached = [line[len(root):] for line in said["stderr"].splitlines() if line.startswith(root)]
        said["stderr"] = "\n".join(line for line in said["stderr"].splitlines() if not line.startswith(root))
        r.update(said, rank=rank, file=text, root=reached[:10])
    for r in records:
        if r["kind"] != "Logger" or r["name"] != "train" or not r["same"]:
            got = f"a {r['kind']} named {r['name']!r}" if r["kind"] else "nothing"
            fail(f"setup_logging() returned {got} on rank {r['rank']}. It should configure and "
                 "return the logger named \"train\": `logger = logging.getLogger(\"train\")` ... "
                 "`return logger`.")
        if not made:
            fail("After setup_logging() ran on every rank, log_dir did not exist. Create it when "
                 "it is missing: os.makedirs(log_dir, exist_ok=True) (exist_ok: every rank does it).")
        if r["root"] or r["propagate"]:
            seen = f" ({r['root'][0]!r})" if r["root"] else ""
            fail(f"On rank {r['rank']}, records also went through the root logger{seen}, "
                 "so any handler there (logging.basicConfig, a library's) prints them again. Set "
                 "`logger.propagate = False` on the \"train\" logger and attach your handlers to it.")
    return records, tag


def _lines_with(text: str, needle: str) -> list[str]:
    return [line for line in (text or "").splitlines() if needle in line]


def setup_logging_console_and_files(setup_logging, world_size: int = 3, missing: str = "logs") -> None:
    """One call per rank, ``log_dir`` missing its last ``missing`` part(s): rank 0 shows INFO and
    WARNING on stdout, the other ranks nothing on stdout; every rank's ``log_dir/rank{rank}.log``
    holds its DEBUG, INFO and WARNING records; every line, on screen and in the files, says
    ``rank {rank}``."""
    __tracebackhide__ = True
    records, tag = _logging_records(setup_logging, world_size, 1, missing)
    for r in records:
        rank, label = r["rank"], f"rank {r['rank']}"
        if r["file"] is None:
            fail(f"There is no log_dir/rank{rank}.log after rank {rank} logged. Every rank writes its "
                 f"records to its own file: logging.FileHandler(os.path.join(log_dir, f\"rank{{rank}}.log\")).")
        for word in ("debug", "info", "warning"):
            found = _lines_with(r["file"], f"{tag} {word} record")
            if not found:
                fail(f"Rank {rank}'s file rank{rank}.log is missing its {word.upper()} record. The "
                     "file takes every record from DEBUG up: set the logger's level and the file "
                     "handler's to logging.DEBUG.")
            if label not in found[0]:
                fail(f"A line of rank{rank}.log does not say `{label}`: {found[0][:100]!r}. Every "
                     f"record must name its rank: put it in the format, e.g. "
                     f"logging.Formatter(f\"rank {{rank}} %(levelname)s %(message)s\").")
        talk = [line for line in r["stdout"].splitlines() if line.strip()]
        if rank != 0 and talk:
            fail(f"Rank {rank} printed to stdout ({talk[0][:80]!r}). Only rank 0 talks on the console; "
                 "the other ranks write to their files only.")
    out = records[0]["stdout"]
    if _lines_with(out, f"{tag} debug record"):
        fail("Rank 0 printed a DEBUG record on stdout. The console shows INFO and above: set the "
             "console handler's level to logging.INFO (the file keeps DEBUG).")
    for word in ("info", "warning"):
        found = _lines_with(out, f"{tag} {word} record")
        if not found:
            elsewhere = " (it went to stderr: use logging.StreamHandler(sys.stdout))" \
                if _lines_with(records[0]["stderr"], f"{tag} {word} record") else ""
            fail(f"Rank 0 did not print its {word.upper()} record on stdout{elsewhere}. On rank 0, a "
                 "handler on stdout shows INFO and above.")
        if "rank 0" not in found[0]:
            fail(f"Rank 0's console line does not say `rank 0`: {found[0][:100]!r}. Use the same "
                 "format, with the rank, for the console and the file.")
        if len(found) > 1:
            fail(f"Rank 0 printed its {word.upper()} record {len(found)} times. Attach one console "
                 "handler, once.")
    passed(f"rank 0 on the console, every rank in its own file, each line with its rank ({world_size} ranks)")


def setup_logging_twice(setup_logging, world_size: int = 3) -> None:
    """``setup_logging`` called twice on every rank: the logger keeps the handlers of one call,
    and every record appears once on rank 0's stdout and once in each rank's file."""
    __tracebackhide__ = True
    records, tag = _logging_records(setup_logging, world_size, 2, "")
    for r in records:
        first, second = r["handlers"]
        if second != first:
            fail(f"On rank {r['rank']} the \"train\" logger had {first} handler(s) after the first call "
                 f"and {second} after the second. Calling setup_logging() again must not add handlers: "
                 "remove (and close) the ones a previous call attached, or return the logger as it is.")
        for where, text in (("its file", r["file"]), ("stdout", r["stdout"] if r["rank"] == 0 else "")):
            found = _lines_with(text, f"{tag} info record")
            if len(found) > 1:
                fail(f"After two calls, rank {r['rank']}'s INFO record appears {len(found)} times in "
                     f"{where}: each call added its handlers again. Remove the handlers a previous "
                     "call attached (or return early when they are there).")
    passed(f"set up twice, every line still once ({world_size} ranks)")


# ----------------------------------------------------------------------------- rank_zero_only
# The logging lesson's table (Lightning's rank_zero_only) and §2: a decorator that runs the
# function on rank 0 only, deciding at each call, with or without a process group.


def rank_zero_only_harness(rank_zero_only, secret):
    """On every rank of a pool started *without* a process group: the decorator is applied
    while neither ``RANK`` nor a process group exists (as at import time); the wrapped function
    is then called with neither, with ``RANK`` set (before ``init_process_group``), and after
    ``dist.init_process_group``. Returns what each call returned or raised (the answer's claim);
    whether the function ran is also seen in the kernel: it prints a line with ``secret``."""
    import torch.distributed as dist

    from helpers.grading.answers import announce, plain

    rank = int(os.environ["RANK"])
    # what launchers set; all of it absent while decorating, as in a process no launcher started
    launcher = {k: os.environ.pop(k) for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "SLURM_PROCID")
                if k in os.environ}
    ran = []

    def log_metrics(step, scale=1):
        """Write one line of metrics (the decorated function of the test)."""
        ran.append(step)
        os.write(1, f"[ran {secret}] {step}\n".encode())
        return step * scale

    out = {"rank": rank, "phases": {}}
    announce(secret)
    try:
        wrapped = rank_zero_only(log_metrics)
    except Exception as e:  # noqa: BLE001 - what the answer raised is the result
        out["decorating"] = f"{type(e).__name__}: {e}"[:300]
        return out
    out["name"], out["doc"] = plain(getattr(wrapped, "__name__", None)), plain(getattr(wrapped, "__doc__", None))
    out["callable"] = callable(wrapped)

    def attempt(phase, step):
        before = len(ran)
        try:
            value = plain(wrapped(step, scale=10))
        except Exception as e:  # noqa: BLE001
            out["phases"][phase] = {"raised": f"{type(e).__name__}: {e}"[:300]}
            return
        out["phases"][phase] = {"value": value, "ran": len(ran) > before}

    if out["callable"]:
        attempt("neither", 1)                  # no RANK, no process group: a lone process
        os.environ.update(launcher)
        attempt("env", 2)                      # the launcher's RANK, before init_process_group
        dist.init_process_group("gloo")
        attempt("group", 3)                    # after init_process_group
    return out


_PHASES = {"neither": "with neither RANK in the environment nor a process group (a lone process)",
           "env": "with RANK set by the launcher, before init_process_group",
           "group": "after init_process_group"}


def _decorated(rank_zero_only, world_size: int) -> list[dict]:
    """Each rank's claims, with ``ran``: the steps the kernel saw the function print for."""
    __tracebackhide__ = True
    from helpers.grading.answers import printed, secret

    nonce, outputs = secret(), []
    records = run_answer(rank_zero_only_harness, rank_zero_only, nonce, name="rank_zero_only",
                         world_size=world_size, init_process_group=False, outputs=outputs)
    mark = f"[ran {nonce}] "
    for rank, (r, said) in enumerate(zip(records, printed(outputs, nonce))):
        r["rank"] = rank
        r["ran"] = {int(line[len(mark):]) for line in said["stdout"].splitlines()
                    if line.startswith(mark) and line[len(mark):].isdigit()}
    for r in records:
        if r.get("decorating", "").startswith("NotImplementedError"):
            fail("rank_zero_only() is not written yet: replace `raise NotImplementedError()` with your code.")
        if "decorating" in r:
            fail(f"rank_zero_only(fn) raised {r['decorating']} on rank {r['rank']}, when it was applied "
                 "before the process group existed (as `@rank_zero_only` at import time does). Decide "
                 "nothing when decorating: return a wrapper that looks up the rank each time it is called.")
        if not r["callable"]:
            fail(f"rank_zero_only(fn) returned something that cannot be called on rank {r['rank']}: "
                 "return the wrapper function.")
    return records


def _phase(records, phase: str, step: int) -> None:
    """Rank 0 runs the function and gets its value; the other ranks get None without running it."""
    __tracebackhide__ = True
    when = _PHASES[phase]
    for r in records:
        got = r["phases"].get(phase, {})
        if "raised" in got:
            hint = (" Before init_process_group, dist.get_rank() raises: read the launcher's "
                    "RANK from the environment then, and treat a process with neither as rank 0, "
                    "e.g. int(os.environ.get(\"RANK\", 0))." if phase != "group" else "")
            fail(f"Called {when}, the decorated function raised {got['raised']} on rank "
                 f"{r['rank']}.{hint}")
        should_run = phase == "neither" or r["rank"] == 0
        ran = step in r["ran"]  # seen in the kernel: the function printed its line
        if should_run and (not ran or not got.get("ran") or got.get("value") != step * 10):
            fail(f"Called {when}, the decorated function did not run on rank {r['rank']} "
                 f"(it returned {got.get('value')!r}). "
                 + ("A process with neither RANK nor a process group is rank 0: it runs the function."
                    if phase == "neither" else "Rank 0 runs the function and returns its value."))
        if not should_run and (ran or got.get("ran") or got.get("value") is not None):
            fail(f"Called {when}, the decorated function ran on rank {r['rank']} (it returned "
                 f"{got.get('value')!r}). On every rank but 0 the wrapper must return None without "
                 "calling the function.")


def rank_zero_only_runs_on_rank_0(rank_zero_only, world_size: int = 3) -> None:
    """After ``init_process_group``: rank 0 runs the function and returns its value (arguments
    passed through), every other rank returns ``None`` and does not run it."""
    __tracebackhide__ = True
    records = _decorated(rank_zero_only, world_size)
    _phase(records, "group", 3)
    passed(f"the function ran on rank 0 only, and returned its value there ({world_size} ranks)")


def rank_zero_only_keeps_name_and_doc(rank_zero_only, world_size: int = 3) -> None:
    """The wrapper keeps the function's ``__name__`` and ``__doc__`` (``functools.wraps``)."""
    __tracebackhide__ = True
    records = _decorated(rank_zero_only, world_size)
    r = records[0]
    if r["name"] != "log_metrics" or r["doc"] != "Write one line of metrics (the decorated function of the test).":
        fail(f"The decorated function is called {r['name']!r} with the docstring {str(r['doc'])[:60]!r}; "
             "it should keep the original's name and docstring (log_metrics). Decorate your wrapper "
             "with @functools.wraps(fn).")
    passed("the wrapper keeps the function's name and docstring")


def rank_zero_only_before_init(rank_zero_only, world_size: int = 3) -> None:
    """Before ``init_process_group``: with the launcher's ``RANK`` in the environment only rank 0
    runs the function; with neither ``RANK`` nor a process group the process is rank 0."""
    __tracebackhide__ = True
    records = _decorated(rank_zero_only, world_size)
    _phase(records, "neither", 1)
    _phase(records, "env", 2)
    passed(f"before init_process_group too: RANK from the environment, rank 0 by default ({world_size} ranks)")


def rank_zero_only_decides_at_each_call(rank_zero_only, world_size: int = 3) -> None:
    """Decorated while the rank was not known yet (no ``RANK``, no process group), the wrapper
    still runs the function on rank 0 only once the rank is known: it decides at each call."""
    __tracebackhide__ = True
    records = _decorated(rank_zero_only, world_size)
    if all(r["phases"].get("group", {}).get("value") is not None for r in records):
        fail("The function was decorated before the rank was known (no RANK, no process group, as "
             "at import time), and after init_process_group it ran on every rank. The wrapper "
             "decided once, when decorating. Look up the rank inside the wrapper, at each call.")
    _phase(records, "group", 3)
    passed(f"decorated before the ranks existed, it still decides at each call ({world_size} ranks)")
