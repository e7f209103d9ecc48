"""Plumbing for the developer lesson's demos (``solutions/developer/01_save_log_resume.ipynb``,
``02_common_mistakes.ipynb``, ``03_sharded_checkpoints.ipynb``).

The lesson's point (the ``if rank == 0:`` save, the ``dist.barrier()``, the ``[sum, count]``
all_reduce) is written in the notebooks' own cells; this module only holds what is not the
lesson: running a torchrun script inside a pool's rank, making a checkpoint that looks as if it
was saved on a GPU, and the figures.

Importing it changes nothing (no seeding, no plotting style, no process started).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import Iterator

__all__ = ["pretend_saved_on", "run_script", "OUTCOME_COLORS", "plot_reads",
           "plot_failure_rates", "plot_logged_loss", "plot_stop_decisions"]


# ----------------------------------------------------------------------------- checkpoints


@contextlib.contextmanager
def pretend_saved_on(location: str = "cuda:0") -> Iterator[None]:
    """Inside this block, ``torch.save`` records every tensor's device as ``location``.

    A checkpoint written on a GPU stores, next to each tensor's bytes, the device it came
    from (``"cuda:0"``); ``torch.load`` puts the tensor back there unless ``map_location``
    says otherwise. This machine has no GPU, so the lesson makes such a file by registering a
    device tagger with ``torch.serialization.register_package`` (the mechanism torch itself
    uses to tag storages) for the duration of the block. The bytes are exactly what a GPU
    save writes for these tensors' location.
    """
    import torch.serialization as ser

    def tagger(storage):
        return location

    def no_restore(storage, where):  # loading is left to torch's own deserialisers
        return None

    ser.register_package(-1000, tagger, no_restore)
    entry = next(e for e in ser._package_registry if e[1] is tagger)
    try:
        yield
    finally:
        ser._package_registry.remove(entry)


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self):
        for s in self.streams:
            s.flush()


def run_script(script: str, workdir: str) -> list[str]:
    """Run a torchrun-style script unchanged inside the calling rank, from ``workdir``.

    Meant for ``helpers.spawn.run(run_script, path, workdir, init_process_group=False)``:
    the pool sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``... as torchrun does, and the script
    calls ``dist.init_process_group`` itself. Its output still streams into the cell; the
    printed lines are also returned, so the notebook can assert them.
    """
    import runpy

    script = os.path.abspath(script)
    captured = io.StringIO()
    os.chdir(workdir)
    old = sys.stdout
    sys.stdout = _Tee(old, captured)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.stdout = old
    return captured.getvalue().splitlines()


# ----------------------------------------------------------------------------- figures

#: colours of the three outcomes of ``helpers.races.try_load``
OUTCOME_COLORS = {"ok": "#4c956c", "missing": "#edae49", "torn": "#d1495b"}


def plot_reads(outcomes: list[list[str]], title: str, ax=None):
    """One row per trial, one cell per rank: what that rank found when it read the checkpoint."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    kinds = list(OUTCOME_COLORS)
    grid = [[kinds.index(o) for o in row] for row in outcomes]
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.9 + 0.35 * len(outcomes)), layout="constrained")
    ax.imshow(grid, cmap=ListedColormap(list(OUTCOME_COLORS.values())), vmin=0,
              vmax=len(kinds) - 1, aspect="auto")
    n_ranks = len(outcomes[0])
    ax.set_xticks(range(n_ranks), [f"rank {r}" for r in range(n_ranks)])
    ax.set_yticks(range(len(outcomes)), [f"run {i + 1}" for i in range(len(outcomes))])
    ax.set_xlabel("which rank read the checkpoint")
    ax.set_title(title, fontsize=11)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in OUTCOME_COLORS.items()],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=9, frameon=False)
    return ax


def plot_failure_rates(rates: dict, title: str, ax=None):
    """``rates[(world_size, with_barrier)]`` = fraction of runs where some rank's read failed."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5), layout="constrained")
    for barrier, color, label in ((False, OUTCOME_COLORS["torn"], "no barrier"),
                                  (True, OUTCOME_COLORS["ok"], "dist.barrier() after the save")):
        sizes = sorted(ws for ws, b in rates if b == barrier)
        ax.plot(sizes, [100 * rates[(ws, barrier)] for ws in sizes], "o-", color=color,
                label=label, linewidth=2)
    ax.set_xticks(sorted({ws for ws, _ in rates}))
    ax.set_ylim(-5, 105)
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("runs with a failed read (%)")
    ax.set_title(title, fontsize=11)
    ax.legend(frameon=False)
    return ax


def plot_logged_loss(per_rank: list[float], true_loss: float, title: str, ax=None):
    """Bars: each rank's own loss, next to the loss over every sample."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
    names = [f"rank {r}\n(its own samples)" for r in range(len(per_rank))] + ["all samples\n[sum, count]"]
    values = list(per_rank) + [true_loss]
    colors = ["#d1495b"] + ["#8d99ae"] * (len(per_rank) - 1) + ["#4c956c"]
    bars = ax.bar(names, values, color=colors)
    ax.bar_label(bars, fmt="%.4f")
    ax.set_ylabel("MSE loss after the step")
    ax.set_ylim(0, max(values) * 1.2)
    ax.set_title(title, fontsize=11)
    return ax


def plot_stop_decisions(curves: list[list[float]], global_curve: list[float], threshold: float,
                        stop: int, title: str, ax=None):
    """Each rank's own loss per step, the all-reduced loss, the threshold, the step where every
    rank stopped, and where each rank's own loss first fell below the threshold."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8.5, 3.5), layout="constrained")
    for r, curve in enumerate(curves):
        ax.plot(range(len(curve)), curve, "o-", color=f"C{r}", label=f"rank {r}'s own loss", alpha=0.8)
        below = [i for i, v in enumerate(curve) if v < threshold]
        if below:
            ax.plot(below[0], curve[below[0]], "*", color=f"C{r}", markersize=15,
                    label=f"rank {r} alone would stop here")
    ax.plot(range(len(global_curve)), global_curve, "s-", color="black",
            label="loss over all samples (all_reduce)", linewidth=2)
    ax.axhline(threshold, color="#d1495b", linestyle="--", label=f"threshold {threshold}")
    ax.axvline(stop, color="grey", linestyle=":", linewidth=1.5)
    ax.text(stop, ax.get_ylim()[1], "every rank stops ", va="top", ha="right", fontsize=9)
    ax.set_xticks(range(len(global_curve)))
    ax.set_xlabel("training step")
    ax.set_ylabel("MSE loss")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, frameon=False, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return ax
