"""Pictures for the beginner lesson (``notebooks/beginner/01_one_rank_writes.ipynb``).

Each function draws one idea from numbers a real run of worker processes returned, with
labelled axes and a title that states the finding. They only draw: the workers, the
``if rank == 0:`` save, the barrier and the ``all_reduce`` stay in the notebook's cells.
Importing this module imports nothing heavy and changes no plotting settings.
"""

from __future__ import annotations

__all__ = ["how_far", "plot_read_outcomes", "plot_report", "plot_worker_losses", "plot_exam",
           "plot_timeline", "worker_colour"]

_OK, _MISSING, _TORN = "#4c956c", "#edae49", "#d1495b"
_TRUTH = "#2e4057"


def worker_colour(rank: int):
    import matplotlib

    return matplotlib.colormaps["tab10"](rank % 10)


def _axes(ax, size):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=size, layout="constrained")
    return ax


def how_far(value: float, truth: float) -> str:
    """Plain words for how far ``value`` is from ``truth``: "4% high", "10.3x too low"."""
    if truth == 0 or value == 0:
        return f"{value - truth:+.2f}"
    ratio = value / truth
    if 0.9 <= ratio <= 1.1:
        return f"{abs(ratio - 1) * 100:.0f}% {'high' if ratio >= 1 else 'low'}"
    if ratio > 1:
        return f"{ratio:.1f}x too high"
    return f"{1 / ratio:.1f}x too low"


def plot_read_outcomes(without_wait: list[str], with_wait: list[str], ax=None):
    """Two stacked bars: what the readers found (complete / missing / half-written) without and
    with the barrier."""
    ax = _axes(ax, (8, 2.6))
    rows = [("readers did not wait", without_wait), ("readers waited at dist.barrier()", with_wait)]
    for y, (_, outcomes) in enumerate(rows):
        left = 0
        for kind, colour, label in (("ok", _OK, "complete file"), ("missing", _MISSING, "no file yet"),
                                    ("torn", _TORN, "half-written file")):
            n = sum(1 for o in outcomes if o == kind)
            ax.barh(y, n, left=left, color=colour, height=0.55, label=label if y == 0 else None)
            if n:
                ax.text(left + n / 2, y, str(n), ha="center", va="center", color="white",
                        fontweight="bold")
            left += n
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("reads (one per waiting worker per trial)")
    ax.legend(loc="lower right", fontsize=8, ncols=3, bbox_to_anchor=(1, 1.02), frameon=False)
    bad_without = sum(1 for o in without_wait if o != "ok")
    bad_with = sum(1 for o in with_wait if o != "ok")
    ax.set_title(f"Without waiting, {bad_without} of {len(without_wait)} reads got a broken file; "
                 f"with the barrier, {bad_with} of {len(with_wait)}", fontsize=11, loc="left",
                 pad=22)
    return ax


def plot_report(writers: list[int], world_size: int, ax=None):
    """One coloured cell per line of the final report file, coloured by the clerk who wrote it."""
    from matplotlib.patches import Patch

    ax = _axes(ax, (8, 2.2))
    for i, clerk in enumerate(writers):
        ax.bar(i + 1, 1, width=0.92, color=worker_colour(clerk))
        ax.text(i + 1, 0.5, str(clerk), ha="center", va="center", color="white", fontsize=8)
    switches = sum(1 for a, b in zip(writers, writers[1:]) if a != b)
    ax.set_xlim(0.4, len(writers) + 0.6)
    ax.set_xticks(range(1, len(writers) + 1, max(1, len(writers) // 20)))
    ax.set_yticks([])
    ax.set_xlabel("line of the report file, top to bottom (the number is the clerk who wrote it)")
    ax.legend(handles=[Patch(color=worker_colour(r), label=f"clerk {r}") for r in range(world_size)],
              ncols=min(world_size, 8), fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0),
              frameon=False)
    clerks = len(set(writers))
    ax.set_title(f"One report file, {len(writers)} lines from {clerks} clerk{'s' * (clerks != 1)}: "
                 f"the writer changes {switches} time{'s' * (switches != 1)}", loc="left",
                 fontsize=11, pad=24)
    return ax


def plot_worker_losses(losses: list[float], truth: float, what: str = "", ax=None):
    """One bar per worker (its loss on its own slice) and a line across: the loss on all examples."""
    ax = _axes(ax, (8, 3.4))
    ranks = range(len(losses))
    ax.bar(ranks, losses, color=[worker_colour(r) for r in ranks], width=0.6)
    for r, v in zip(ranks, losses):
        ax.text(r, v, f"{v:.2f}", ha="center", va="bottom", fontsize=9)
    ax.axhline(truth, color=_TRUTH, linewidth=2, linestyle="--",
               label=f"all examples together: {truth:.2f}")
    ax.legend(loc="upper left", fontsize=9)
    ax.set_xticks(list(ranks), [f"worker {r}" for r in ranks])
    ax.set_ylabel("loss")
    ax.set_ylim(0, max(max(losses), truth) * 1.3)
    prefix = f"{what}: " if what else ""
    ax.set_title(f"{prefix}worker 0 would log {losses[0]:.2f}, the truth is {truth:.2f} "
                 f"({how_far(losses[0], truth)})", fontsize=11)
    return ax


def plot_exam(sections: list[list[float]], wrong: float, right: float, ax=None):
    """Each section a bar as wide as its headcount and as tall as its average mark, with the
    average of the averages and the whole-class average drawn across."""
    ax = _axes(ax, (8, 3.6))
    left = 0
    for i, marks in enumerate(sections):
        n, avg = len(marks), sum(marks) / len(marks)
        ax.bar(left, avg, width=n, align="edge", color=worker_colour(i), alpha=0.8,
               edgecolor="white")
        ax.text(left + n / 2, avg + 1.5, f"{'ABCDEFGH'[i]}\n{n} students\naverage {avg:.0f}",
                ha="center", va="bottom", fontsize=8, zorder=5,
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1})
        left += n
    ax.axhline(right, color=_TRUTH, linestyle="--", linewidth=2,
               label=f"all {left} students together: {right:.0f}")
    ax.axhline(wrong, color=_TORN, linestyle=":", linewidth=2.5,
               label=f"average of the {len(sections)} section averages: {wrong:.0f}")
    ax.legend(loc="upper right", fontsize=9, framealpha=1)
    ax.set_xlim(0, left + 1.5)
    ax.set_ylim(0, 125)
    ax.set_yticks(range(0, 101, 20))
    ax.set_xlabel("students (each section is as wide as its headcount)")
    ax.set_ylabel("mark out of 100")
    ax.set_title(f"Averaging the section averages says {wrong:.0f}; "
                 f"the {left} students really averaged {right:.0f}", fontsize=11)
    return ax


def plot_timeline(times: list[dict], ax=None):
    """One row per rank from a real run: when rank 0 wrote, when each rank waited at the
    barrier, and the moment they all went on. ``times[r]`` holds ``start``, ``at_barrier``,
    ``went_on`` and, for the writer, ``written`` (``time.time()`` values)."""
    ax = _axes(ax, (8, 0.9 + 0.55 * len(times)))
    t0 = min(t["start"] for t in times)
    for r, t in enumerate(times):
        if "written" in t:
            ax.barh(r, t["written"] - t["start"], left=t["start"] - t0, color=_OK, height=0.5,
                    label="writing the file" if r == 0 else None)
        wait = t["went_on"] - t["at_barrier"]
        ax.barh(r, wait, left=t["at_barrier"] - t0, color=_MISSING, alpha=0.5, hatch="//",
                edgecolor=_MISSING, height=0.5,
                label="waiting at dist.barrier()" if r == len(times) - 1 else None)
    go = max(t["went_on"] for t in times) - t0
    ax.axvline(go, color=_TRUTH, linestyle="--", linewidth=1.5)
    ax.text(go, -0.5, " everyone goes on", color=_TRUTH, fontsize=9, va="bottom")
    ax.set_yticks(range(len(times)), [f"rank {r}" for r in range(len(times))])
    ax.set_ylim(len(times) - 0.5, -0.9)
    ax.set_xlim(0, go * 1.6)
    ax.set_xlabel("seconds since the ranks started")
    ax.legend(loc="center right", fontsize=8)
    writer = next((r for r, t in enumerate(times) if "written" in t), None)
    took = times[writer]["written"] - times[writer]["start"] if writer is not None else 0.0
    others = [r for r in range(len(times)) if r != writer]
    who = f"rank {others[0]}" if len(others) == 1 else f"the other {len(others)}"
    ax.set_title(f"Rank {writer} wrote for {took:.2f} s; {who} waited at the barrier, "
                 f"then all went on together", fontsize=11)
    return ax
