"""Small tools for the researcher lessons (``notebooks/researcher/``).

- :func:`digest` fingerprints tensors bit for bit (01_why_rank0_is_enough: the replica invariant).
- :func:`median` and :func:`table` keep the demo cells short.
- :func:`durable_save`, :func:`young_interval`, :func:`daly_interval`, :func:`model_waste`,
  :func:`simulate_waste`: how often to save (05_how_often_to_save).

Importing this module changes nothing and starts nothing.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

__all__ = ["digest", "median", "table", "durable_save", "young_interval", "daly_interval", "model_waste",
           "simulate_waste"]


def digest(tensors: Iterable, length: int = 16) -> str:
    """A SHA-256 of the raw bytes of ``tensors`` (in order): equal digests mean equal bits.

    Two float tensors that differ in a single bit (even ``0.0`` against ``-0.0``) get
    different digests, which ``==`` would not show.
    """
    import torch

    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().contiguous().cpu()
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:length]


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence (the middle value, or the mean of the middle two)."""
    s = sorted(values)
    if not s:
        raise ValueError("median() of an empty sequence")
    mid = len(s) // 2
    return float(s[mid]) if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def table(rows: Sequence[Sequence], header: Sequence[str], floatfmt: str = ".6f") -> str:
    """Rows as an aligned plain-text table (floats formatted with ``floatfmt``); printed by the cells."""
    def fmt(v):
        return format(v, floatfmt) if isinstance(v, float) else str(v)

    cells = [[str(h) for h in header]] + [[fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- how often to save
# (05_how_often_to_save.ipynb)


def durable_save(obj, path: str) -> None:
    """``torch.save`` made atomic and durable: temp file in the same folder, flush, fsync,
    ``os.replace``, fsync of the folder (the publish taught in developer/05_checkpointing_in_practice).

    The temp file is opened with a plain ``open()``, so the checkpoint gets the umask's mode.
    """
    import contextlib
    import os

    import torch

    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def young_interval(cost: float, mtbf: float) -> float:
    """Young (1974): the first-order optimal time between checkpoints, sqrt(2 C M)."""
    import math

    return math.sqrt(2 * cost * mtbf)


def daly_interval(cost: float, mtbf: float) -> float:
    """Daly (2006), higher-order estimate of the optimal compute time between checkpoints:
    sqrt(2CM) [1 + sqrt(C/2M)/3 + (C/2M)/9] - C for C < 2M, and M otherwise."""
    import math

    if cost >= 2 * mtbf:
        return mtbf
    x = cost / (2 * mtbf)
    return math.sqrt(2 * cost * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - cost


def model_waste(interval: float, cost: float, mtbf: float) -> float:
    """The first-order model's wasted time per unit of work: C/τ (saving) + τ/(2M) (lost work)."""
    return cost / interval + interval / (2 * mtbf)


def simulate_waste(interval: float, cost: float, mtbf: float, work: float, trials: int = 400,
                   restart: float = 0.0, seed: int = 0) -> float:
    """Simulate ``trials`` jobs of ``work`` seconds of computation; return the mean wasted time
    (wall-clock time minus ``work``) as a fraction of ``work``.

    Each job computes for ``interval`` seconds, then saves for ``cost`` seconds (the last
    segment needs no save), over and over. Failures arrive as a Poisson process with mean
    time between failures ``mtbf`` (exponential, memoryless: a fresh draw for each segment is
    exact). A failure loses the segment in progress, save included, and costs ``restart``
    seconds; the job then continues from its last checkpoint. The same ``seed`` gives the same
    failures, so two intervals are compared on common random numbers.
    """
    import numpy as np

    if interval <= 0 or cost < 0 or mtbf <= 0 or work <= 0:
        raise ValueError("interval, mtbf and work must be positive, cost non-negative")
    rng = np.random.default_rng(seed)
    done = np.zeros(trials)
    clock = np.zeros(trials)
    active = np.ones(trials, dtype=bool)
    while active.any():
        left = work - done[active]
        segment = np.minimum(interval, left)
        need = segment + np.where(segment < left, cost, 0.0)
        failure = rng.exponential(mtbf, size=int(active.sum()))
        ok = failure >= need
        clock[active] += np.where(ok, need, failure + restart)
        done[active] += np.where(ok, segment, 0.0)
        active = done < work * (1 - 1e-12)
    return float((clock.mean() - work) / work)
