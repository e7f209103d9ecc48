"""Small tools for the researcher lessons (``notebooks/researcher/``).

- :func:`digest` fingerprints tensors bit for bit (01_why_rank0_is_enough: the replica invariant).
- :func:`median` and :func:`table` keep the demo cells short.

Importing this module changes nothing and starts nothing.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

__all__ = ["digest", "median", "table"]


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
