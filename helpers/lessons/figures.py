"""Every figure of the course, in one palette.

Each function draws one idea from numbers that real ranks returned, with labelled axes and a
title that states the finding; the ranks, the ``if rank == 0:`` save, the barrier and the
``all_reduce`` stay in the notebooks' own cells.

* :func:`plot_hang`, :func:`hang_title`: where each rank waited when a job hung (first in
  ``start/00_start_here``, then wherever a lesson catches a hang).
* :func:`plot_read_outcomes`, :func:`plot_report`, :func:`plot_worker_losses`, :func:`plot_exam`,
  :func:`plot_timeline`, :func:`how_far`: the beginner lesson (``beginner/01_one_rank_writes``).
* :func:`plot_reads`, :func:`plot_failure_rates`, :func:`plot_logged_loss`,
  :func:`plot_stop_decisions`: the developer lesson (``developer/02_common_mistakes``).
* :func:`plot_resume`: exact resume (``developer/05_checkpointing_in_practice``); :func:`plot_waste`:
  how often to save (``researcher/05_how_often_to_save``).
* :func:`plot_announcements` (``beginner/02_every_clerk_talks``), :func:`plot_dashboard`,
  :func:`plot_logging_cost` (``developer/04_logging_from_one_rank``), :func:`plot_smoothing`,
  :func:`plot_counts`, :func:`plot_collectives` (``researcher/04_metrics_over_time``): logging.

Importing this module imports nothing heavy and changes no plotting settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from helpers.spawn import HangError

__all__ = ["PALETTE", "OUTCOME_COLORS", "WORKERS", "worker_colour", "text_colour",
           "contrast", "plot_hang", "hang_title", "how_far",
           "plot_read_outcomes", "plot_report", "plot_worker_losses", "plot_exam", "plot_timeline",
           "plot_reads", "plot_failure_rates", "plot_logged_loss", "plot_stop_decisions", "plot_resume",
           "plot_waste", "plot_gap_vs_samples", "plot_dashboard", "plot_logging_cost",
           "plot_announcements", "plot_smoothing", "plot_counts", "plot_collectives"]

#: The course's colours: what went right, what was not there yet, what went wrong, the truth
#: (the number over all samples), and a rank that is neither right nor wrong.
PALETTE = {"ok": "#4c956c", "missing": "#edae49", "torn": "#d1495b", "truth": "#2e4057",
           "neutral": "#8d99ae"}
_OK, _MISSING, _TORN, _TRUTH = PALETTE["ok"], PALETTE["missing"], PALETTE["torn"], PALETTE["truth"]
#: colours of the three outcomes of :func:`helpers.lessons.races.try_load`
OUTCOME_COLORS = {k: PALETTE[k] for k in ("ok", "missing", "torn")}
#: One colour per worker (rank, clerk, section, run), told apart with the common colour-vision
#: deficiencies: Okabe & Ito's qualitative palette, in an order that puts the strong colours first,
#: with its vermillion (which looks like ``torn`` under tritanopia) replaced by Paul Tol's dark
#: yellow. tests/test_palette.py draws every figure and checks that each pair of colours drawn
#: together stays apart under simulated protanopia, deuteranopia and tritanopia.
WORKERS = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#997700", "#000000", "#f0e442"]


def _axes(ax, size):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=size, layout="constrained")
    return ax


def hang_title(err: HangError) -> str:
    """One line that states the finding, e.g. "rank 0 waits at dist.barrier(); rank 1 had returned"."""
    blocked = err.blocked
    done = [r.rank for r in err.ranks if r.finished]
    where = {r.line or "an unknown line" for r in blocked}
    who = ", ".join(str(r.rank) for r in blocked)
    title = f"rank{'s' if len(blocked) > 1 else ''} {who} wait{'' if len(blocked) > 1 else 's'} at {' / '.join(sorted(where))}"
    if done:
        title += f"; rank{'s' if len(done) > 1 else ''} {', '.join(map(str, done))} had returned"
    return title


def plot_hang(err: HangError, ax=None, title: str | None = None):
    """Draw one bar per rank: green up to when it finished, red (hatched) where it waited.

    Returns the matplotlib Axes. The bars come from the pool's real timings and the
    faulthandler report of each blocked rank.
    """
    ax = _axes(ax, (8, 0.6 + 0.55 * len(err.ranks)))
    for r in err.ranks:
        y = r.rank
        if r.finished:
            end = r.seconds or 0.0
            ax.barh(y, max(end, err.timeout * 0.01), color=_OK, height=0.5)
            ax.barh(y, err.timeout - end, left=end, color=_OK, alpha=0.15, height=0.5)
            ax.text(err.timeout * 0.02 + end, y, "returned; stays alive until the pool ends",
                    va="center", fontsize=9)
        else:
            ax.barh(y, err.timeout, color=_TORN, alpha=0.35, hatch="//", height=0.5,
                    edgecolor=_TORN)
            label = f"stuck at `{r.line}`" if r.line else "stuck (stack unreadable)"
            if r.function:
                label += f" in {r.function}(), line {r.lineno}"
            ax.text(err.timeout * 0.02, y, label, va="center", fontsize=9)
    ax.axvline(err.timeout, color="black", linestyle=":", linewidth=1)
    ax.set_yticks([r.rank for r in err.ranks], [f"rank {r.rank}" for r in err.ranks])
    ax.invert_yaxis()
    ax.set_xlim(0, err.timeout * 1.02)
    # The timeout is a tick of its own ("5 s\ntimeout"); the regular ticks near it make room.
    ticks = [t for t in ax.get_xticks() if 0 <= t < err.timeout * 0.85]
    ax.set_xticks([*ticks, err.timeout], [f"{t:g}" for t in ticks] + [f"{err.timeout:g} s\ntimeout"])
    ax.set_xlabel("seconds since the ranks started")
    ax.set_title(title or hang_title(err), fontsize=11)
    return ax


def worker_colour(rank: int) -> str:
    """Worker ``rank``'s colour (:data:`WORKERS`; past eight ranks the colours repeat)."""
    return WORKERS[rank % len(WORKERS)]


def _luminance(colour) -> float:
    from matplotlib.colors import to_rgb

    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(colour)]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a, b) -> float:
    """WCAG 2.1's contrast ratio of two colours (1 to 21; text needs 4.5, large text 3)."""
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def text_colour(background) -> str:
    """Black or white, whichever reads better on ``background`` (always 4.5:1 or more)."""
    return "black" if contrast("black", background) >= contrast("white", background) else "white"


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
                ax.text(left + n / 2, y, str(n), ha="center", va="center", color=text_colour(colour),
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
        ax.text(i + 1, 0.5, str(clerk), ha="center", va="center", color=text_colour(worker_colour(clerk)),
                fontsize=8)
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


def plot_reads(outcomes: list[list[str]], title: str, ax=None):
    """One row per trial, one cell per rank: what that rank found when it read the checkpoint."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    kinds = list(OUTCOME_COLORS)
    grid = [[kinds.index(o) for o in row] for row in outcomes]
    ax = _axes(ax, (7, 0.9 + 0.35 * len(outcomes)))
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


def plot_failure_rates(rates: dict, title: str, ax=None, intervals: dict | None = None):
    """``rates[(world_size, with_barrier)]`` = fraction of runs where some rank's read failed;
    ``intervals`` (same keys): ``(low, high)`` confidence intervals, drawn as error bars."""
    ax = _axes(ax, (7, 3.5))
    for barrier, color, label in ((False, OUTCOME_COLORS["torn"], "no barrier"),
                                  (True, OUTCOME_COLORS["ok"], "dist.barrier() after the save")):
        sizes = sorted(ws for ws, b in rates if b == barrier)
        values = [100 * rates[(ws, barrier)] for ws in sizes]
        errors = None
        if intervals:
            errors = [[v - 100 * intervals[(ws, barrier)][0] for ws, v in zip(sizes, values)],
                      [100 * intervals[(ws, barrier)][1] - v for ws, v in zip(sizes, values)]]
        ax.errorbar(sizes, values, yerr=errors, fmt="o-", color=color, label=label, linewidth=2,
                    capsize=4)
    ax.set_xticks(sorted({ws for ws, _ in rates}))
    ax.set_ylim(-5, 105)
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("runs with a failed read (%)" + ("\nbars: 95% interval" if intervals else ""))
    ax.set_title(title, fontsize=11)
    ax.legend(frameon=False)
    return ax


def plot_logged_loss(per_rank: list[float], true_loss: float, title: str, ax=None):
    """Bars: each rank's own loss, next to the loss over every sample."""
    ax = _axes(ax, (7, 3.2))
    names = [f"rank {r}\n(its own samples)" for r in range(len(per_rank))] + ["all samples\n[sum, count]"]
    values = list(per_rank) + [true_loss]
    colors = [_TORN] + [PALETTE["neutral"]] * (len(per_rank) - 1) + [_OK]
    bars = ax.bar(names, values, color=colors)
    ax.bar_label(bars, fmt="%.4f")
    ax.set_ylabel("MSE loss on the step's batch\n(computed before opt.step())")
    ax.set_ylim(0, max(values) * 1.2)
    ax.set_title(title, fontsize=11)
    return ax


def plot_stop_decisions(curves: list[list[float]], global_curve: list[float], threshold: float,
                        stop: int, title: str, ax=None):
    """Each rank's own loss per step, the all-reduced loss, the threshold, the step where every
    rank stopped, and where each rank's own loss first fell below the threshold."""
    ax = _axes(ax, (8.5, 3.5))
    for r, curve in enumerate(curves):
        ax.plot(range(len(curve)), curve, "o-", color=worker_colour(r), label=f"rank {r}'s own loss", alpha=0.8)
        below = [i for i, v in enumerate(curve) if v < threshold]
        if below:
            ax.plot(below[0], curve[below[0]], "*", color=worker_colour(r), markersize=15,
                    label=f"rank {r} alone would stop here")
    ax.plot(range(len(global_curve)), global_curve, "s-", color=_TRUTH,
            label="loss over all samples (all_reduce)", linewidth=2)
    ax.axhline(threshold, color=_TORN, linestyle="--", label=f"threshold {threshold}")
    ax.axvline(stop, color=_TRUTH, linestyle=":", linewidth=1.5)      # decided on the loss over all samples
    ax.text(stop, ax.get_ylim()[1], "every rank stops ", va="top", ha="right", fontsize=9)
    ax.set_xticks(range(len(global_curve)))
    ax.set_xlabel("training step")
    ax.set_ylabel("MSE loss")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, frameon=False, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return ax


# ----------------------------------------------------------------------------- checkpointing in practice
# developer/05_checkpointing_in_practice and researcher/05_how_often_to_save


def plot_resume(full: list[float], first: list[float], right: list[float], wrong: list[float],
                title: str, ax=None):
    """One rank's loss per step: the uninterrupted run, the run stopped at ``len(first)`` steps,
    and two resumptions of it (every rank's RNG state restored, or rank 0's only)."""
    ax = _axes(ax, (8.5, 3.4))
    stop = len(first)
    ax.plot(range(len(full)), full, "-", color=_TRUTH, linewidth=6, alpha=0.25,
            label="uninterrupted run")
    ax.plot(range(stop), first, "o", color=PALETTE["neutral"], label="first job, stopped here")
    ax.plot(range(stop, stop + len(right)), right, "o", color=_OK,
            label="resumed with every rank's RNG state")
    ax.plot(range(stop, stop + len(wrong)), wrong, "x", color=_TORN, markersize=8,
            label="resumed with rank 0's RNG state only")
    ax.axvline(stop - 0.5, color="grey", linestyle=":", linewidth=1.5)
    ax.text(stop - 0.5, ax.get_ylim()[1], " stop / resume", va="top", fontsize=9)
    ax.set_xlabel("training step")
    ax.set_ylabel("this rank's loss")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, frameon=False, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return ax


def plot_waste(intervals, simulated, model, young: float, best: float, title: str, ax=None):
    """Wasted time (as a share of the useful work) against the checkpoint interval: the
    simulation's points, the first-order model's curve, Young's interval and the simulated best."""
    ax = _axes(ax, (8, 3.8))
    ax.plot(intervals, [100 * w for w in model], "-", color=PALETTE["neutral"], linewidth=2,
            label="first-order model: C/τ + τ/(2M)")
    ax.plot(intervals, [100 * w for w in simulated], "o", color=_TRUTH, markersize=5,
            label="simulated failures (mean)")
    ax.axvline(young, color=_OK, linestyle="--", linewidth=2, label=f"Young: √(2CM) = {young:.3g}")
    ax.axvline(best, color=_MISSING, linestyle=":", linewidth=2, label=f"simulated best = {best:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval τ (seconds of computation between saves)")
    ax.set_ylabel("wasted time (% of the work)")
    ax.set_title(title, fontsize=11)


# ----------------------------------------------------------------------------- logging lessons
# developer/04_logging_from_one_rank, beginner/02_every_clerk_talks, researcher/04_metrics_over_time


def plot_dashboard(runs: dict, truth: list[float], title: str, ax=None):
    """The runs TensorBoard lists and the ``(step, value)`` points each holds, against the loss
    the whole job really had (dashed). A run holding several values per step (several ranks'
    event files in one folder) is drawn as points only: which line the dashboard would draw
    through them says nothing more."""
    ax = _axes(ax, (8, 3.6))
    for i, (name, points) in enumerate(sorted(runs.items())):
        steps, values = zip(*points) if points else ((), ())
        merged = len(set(steps)) < len(steps)
        label = f"run {name!r}" + (f": {len(points)} points for {len(set(steps))} steps" if merged else "")
        colour = worker_colour(i) if len(runs) > 1 else PALETTE["neutral"]
        ax.plot(steps, values, "o" if merged else "o-", markersize=4 if merged else 3, linewidth=1.2,
                alpha=0.85, color=colour, label=label)
    ax.plot(range(len(truth)), truth, "--", color=_TRUTH, linewidth=2.5,
            label="the job's loss (all examples)")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("logged loss (log scale)")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, frameon=False, loc="upper right", ncols=1 + (len(runs) > 4))
    return ax


def plot_logging_cost(intervals: list, seconds_per_step: list[float], baseline: float, title: str,
                      ax=None):
    """Time per training step against the logging interval k (a reduction every k steps), with
    the same loop that never logs as a floor. Measured, so it moves with the machine's load."""
    ax = _axes(ax, (7.5, 3.4))
    ax.plot(intervals, [1000 * s for s in seconds_per_step], "o-", color=_TORN, linewidth=2,
            label="reduce [sum, count] and log every k steps")
    ax.axhline(1000 * baseline, color=_OK, linestyle="--", label="never log")
    ax.set_xscale("log")
    ax.set_xticks(intervals, [str(k) for k in intervals])
    ax.set_ylim(0, max(1000 * max(seconds_per_step), 1000 * baseline) * 1.25)
    ax.set_xlabel("logging interval k (steps)")
    ax.set_ylabel("milliseconds per step")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, frameon=False)
    return ax


def plot_announcements(announced: list, truth: float, title: str, ax=None):
    """One bar per clerk (worker): the number it announced, or a grey "silent" mark if it said
    nothing; the dashed line is the loss on all the forms together."""
    ax = _axes(ax, (8, 3.2))
    top = max([truth] + [v for v in announced if v is not None]) * 1.3
    for clerk, value in enumerate(announced):
        if value is None:
            ax.text(clerk, top * 0.04, "silent", ha="center", va="bottom", fontsize=9, style="italic")
            continue
        ax.bar(clerk, value, width=0.6, color=worker_colour(clerk))
        ax.text(clerk, value + top * 0.015, f"{value:.2f}", ha="center", va="bottom", fontsize=9)
    ax.axhline(truth, color=_TRUTH, linewidth=2, linestyle="--", label=f"all the forms together: {truth:.2f}")
    ax.set_xticks(range(len(announced)), [f"clerk {c}" for c in range(len(announced))])
    ax.set_xlim(-0.6, len(announced) - 0.4)
    ax.set_ylim(0, top)
    ax.set_ylabel("announced loss")
    ax.legend(loc="upper left", fontsize=9, frameon=False)
    ax.set_title(title, fontsize=11)
    return ax


def plot_smoothing(logged: list[float], smoothed: list[float], rank0_smoothed: list[float],
                   epoch_loss: float, spike_at: int, weight: float, title: str, ax=None):
    """A dashboard's loss chart: the logged per-step values (faint), their TensorBoard-style
    smoothing, the smoothing of rank 0's own values, and the epoch's loss as one
    ``[sum, count]`` over every sample (a level line)."""
    ax = _axes(ax, (9, 3.8))
    steps = range(len(logged))
    ax.plot(steps, logged, color=PALETTE["neutral"], linewidth=0.8, alpha=0.7,
            label="logged each step (all ranks, [sum, count])")
    ax.plot(steps, smoothed, color=_TRUTH, linewidth=2, label=f"the same, smoothed ({weight:g})")
    ax.plot(steps, rank0_smoothed, color=_TORN, linewidth=2, linestyle="-.",
            label=f"rank 0's own loss, smoothed ({weight:g})")
    ax.axhline(epoch_loss, color=_OK, linestyle="--", linewidth=2,
               label=f"the epoch's loss, one [sum, count]: {epoch_loss:.3f}")
    ax.annotate("one bad batch", (spike_at, logged[spike_at]), xytext=(spike_at + len(logged) * 0.04,
                logged[spike_at]), fontsize=9, va="center", arrowprops={"arrowstyle": "->"})
    ax.set_xlabel("step")
    ax.set_ylabel("loss per token")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, frameon=False, loc="upper right")
    return ax


def plot_counts(seen: list[float], counted: list[float], title: str, ax=None):
    """A float32 counter against the true count (both from a real run): where it stops counting."""
    ax = _axes(ax, (7.5, 3.4))
    ax.plot([s / 1e6 for s in seen], [s / 1e6 for s in seen], color=_OK, linewidth=2,
            label="seen (int64 counter)")
    ax.plot([s / 1e6 for s in seen], [c / 1e6 for c in counted], color=_TORN, linewidth=2,
            linestyle="--", label="counted by the float32 counter")
    ax.axhline(2 ** 24 / 1e6, color=PALETTE["neutral"], linestyle=":", linewidth=1)
    ax.text(0, 2 ** 24 / 1e6, " 2^24 = 16,777,216", va="bottom", fontsize=8)
    ax.set_xlabel("background pixels seen (millions)")
    ax.set_ylabel("count (millions)")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    return ax


def plot_collectives(intervals: list[int], counts: dict, floor: int, title: str, ax=None):
    """Collectives per epoch against the logging interval, one line per way of logging
    (``counts[way] = [count per interval]``), with the training's own collectives as a floor."""
    ax = _axes(ax, (7.5, 3.4))
    for i, (way, values) in enumerate(counts.items()):
        ax.plot(intervals, values, "o-", color=[_TORN, _TRUTH, _MISSING][i % 3], linewidth=2, label=way)
    ax.axhline(floor, color=_OK, linestyle="--", label=f"training alone (gradient all_reduce): {floor}")
    ax.set_xscale("log")
    ax.set_xticks(intervals, [str(k) for k in intervals])
    ax.set_xlabel("logging interval k (steps)")
    ax.set_ylabel("all-reduces in the epoch")
    ax.set_ylim(0, max(max(v) for v in counts.values()) * 1.15)
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, frameon=False)
    return ax


def plot_gap_vs_samples(sizes: list[int], shuffled: list[float], grouped: list[float], title: str,
                        ax=None):
    """How far rank 0's own loss is from the loss over all ranks, against the samples per rank:
    for shuffled (i.i.d.) shards, with the 1/sqrt(n) line through the first point, and for
    grouped (sorted) shards. (``developer/02_common_mistakes``, section 4.)"""
    ax = _axes(ax, (7.5, 3.6))
    ax.loglog(sizes, shuffled, "o-", color=PALETTE["neutral"], linewidth=2,
              label="shuffled shards: noise")
    ax.loglog(sizes, [shuffled[0] * (sizes[0] / n) ** 0.5 for n in sizes], ":", color="black",
              label="1/sqrt(n), through the first point")
    ax.loglog(sizes, grouped, "s-", color=_TORN, linewidth=2, label="sorted (grouped) shards")
    ax.set_xlabel("samples per rank, n")
    ax.set_ylabel("|rank 0's loss - loss over all|\n(mean over trials)")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, frameon=False)
    return ax
