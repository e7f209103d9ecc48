"""Small tools for the researcher lessons (``notebooks/researcher/``).

- :func:`digest` fingerprints tensors bit for bit (01_why_rank0_is_enough: the replica invariant).
- :func:`blame_user_code` re-points a :class:`helpers.spawn.HangError` at the learner's own line
  when the rank was blocked inside a library that is not torch (02_metrics: torchmetrics'
  ``compute()`` called on rank 0 only).
- :func:`median` and :func:`table` keep the demo cells short.

Importing this module changes nothing and starts nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import linecache
import os
import sysconfig
from typing import Iterable, Sequence

__all__ = ["digest", "blame_user_code", "median", "table"]


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


_TORCH_DIST = os.sep + os.path.join("torch", "distributed") + os.sep


def _library_dirs() -> list[str]:
    dirs = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    return sorted(os.path.abspath(d) + os.sep for d in dirs if d)


def _is_library(filename: str) -> bool:
    if filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    if os.sep + "helpers" + os.sep + "spawn.py" in path:
        return True
    return any(path.startswith(d) for d in _library_dirs())


def _code_only(line: str) -> str:
    """The source line without its trailing comment."""
    import io
    import tokenize

    line = line.strip()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.type == tokenize.COMMENT:
                return line[: tok.start[1]].rstrip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return line


def blame_user_code(err):
    """The same hang, with each blocked rank pointed at the innermost line of *your* code.

    ``helpers.spawn`` treats only torch as a library, so a rank blocked inside torchmetrics
    (which calls ``all_gather`` for you) is reported at a line of torchmetrics. This walks
    the rank's stack outwards to the first frame outside site-packages and the standard
    library (a notebook cell, a script), and names the library call it was waiting in.
    Returns a new :class:`~helpers.spawn.HangError`; ``err`` is unchanged.
    """
    from helpers.spawn import HangError

    states = []
    for state in err.ranks:
        if state.finished or not state.stack:
            states.append(state)
            continue
        frames = state.stack  # innermost first
        for i, (file, line, func) in enumerate(frames):
            if _is_library(file):
                continue
            # the torch.distributed call it waits in (innermost), else the library call it made
            called = next((f for p, _, f in frames[:i] if _TORCH_DIST in p and "wrap" not in f),
                          None)
            for lib_file, _, lib_func in frames[:i] if called is None else ():
                if _is_library(lib_file) and not lib_file.startswith("<"):
                    called = lib_func
            text = _code_only(linecache.getline(file, line)) or None
            states.append(dataclasses.replace(state, function=func, filename=file, lineno=line,
                                              line=text, waiting_in=called or state.waiting_in))
            break
        else:
            states.append(state)
    return HangError(err.timeout, states, err.fn_name)


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
