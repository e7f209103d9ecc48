"""Pictures of what the ranks did: where each rank waited when a job hung.

``plot_hang`` is first used in ``notebooks/start/00_start_here.ipynb`` and again wherever a
lesson catches a hang (barrier inside ``if rank == 0``, per-rank early stopping, a metric's
``compute()`` on one rank).
"""

from __future__ import annotations

from helpers.spawn import HangError

__all__ = ["plot_hang", "hang_title"]

_FINISHED = "#4c956c"
_BLOCKED = "#d1495b"


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
    import matplotlib.pyplot as plt

    if ax is None:
        n = len(err.ranks)
        _, ax = plt.subplots(figsize=(8, 0.6 + 0.55 * n), layout="constrained")
    for r in err.ranks:
        y = r.rank
        if r.finished:
            end = r.seconds or 0.0
            ax.barh(y, max(end, err.timeout * 0.01), color=_FINISHED, height=0.5)
            ax.barh(y, err.timeout - end, left=end, color=_FINISHED, alpha=0.15, height=0.5)
            ax.text(err.timeout * 0.02 + end, y, "returned; stays alive until the pool ends",
                    va="center", fontsize=9)
        else:
            ax.barh(y, err.timeout, color=_BLOCKED, alpha=0.35, hatch="//", height=0.5,
                    edgecolor=_BLOCKED)
            label = f"stuck at `{r.line}`" if r.line else "stuck (stack unreadable)"
            if r.function:
                label += f" in {r.function}(), line {r.lineno}"
            ax.text(err.timeout * 0.02, y, label, va="center", fontsize=9)
    ax.axvline(err.timeout, color="black", linestyle=":", linewidth=1)
    ax.text(err.timeout, len(err.ranks) - 0.45, " timeout", fontsize=8, va="bottom", ha="right")
    ax.set_yticks([r.rank for r in err.ranks], [f"rank {r.rank}" for r in err.ranks])
    ax.invert_yaxis()
    ax.set_xlim(0, err.timeout * 1.02)
    ax.set_xlabel("seconds since the ranks started")
    ax.set_title(title or hang_title(err), fontsize=11)
    return ax
