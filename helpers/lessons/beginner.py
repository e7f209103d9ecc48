"""Small, fixed data sets for the beginner lesson (``notebooks/beginner/01_one_rank_writes.ipynb``).

* :func:`validation_set` and :func:`trained_model`: 48 validation examples recorded over 48
  days, kept in date order in their file, and a model that was trained on older data, so it
  does worse on recent days. Split in date order, each worker's slice has a very different
  loss; split at random, the slices look alike. ("The log is the bigger trap".)
* :func:`exam_sections`: the marks of three class sections of very different sizes.
  ("Exam results".)

Everything here is a pure function of its arguments (own ``torch.Generator``), so every
worker that calls it builds exactly the same data, and importing this module changes nothing.
"""

from __future__ import annotations

__all__ = ["DAYS", "validation_set", "trained_model", "exam_sections", "report_lines"]

DAYS = 48  # examples in the validation set, one per day


def validation_set(order: str = "sorted", n: int = DAYS):
    """``(x, y)``: ``n`` examples, one per day. ``order`` is ``"sorted"`` (date order, as stored)
    or ``"random"`` (shuffled once, with a fixed seed).

    The targets drift over the days, so a model fitted to the first days is off by more and more.
    """
    import torch

    if order not in ("sorted", "random"):
        raise ValueError(f'order must be "sorted" or "random", not {order!r}')
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    day = torch.arange(n, dtype=torch.float32) / max(n - 1, 1)  # 0 (oldest) .. 1 (newest)
    drift = 2.0 * day                                            # the world changed over time
    noise = 0.3 * torch.randn(n, generator=g)
    y = (x @ _weights() + _BIAS + drift + noise).unsqueeze(1)
    if order == "random":
        idx = torch.randperm(n, generator=torch.Generator().manual_seed(1))
        x, y = x[idx], y[idx]
    return x, y


def _weights():
    import torch

    return torch.tensor([0.5, -1.0, 0.25, 2.0])


_BIAS = 0.1


def trained_model():
    """A ``torch.nn.Linear(4, 1)`` that fits the oldest days well (it never saw the drift)."""
    import torch

    model = torch.nn.Linear(4, 1)
    with torch.no_grad():
        model.weight.copy_(_weights().unsqueeze(0))
        model.bias.fill_(_BIAS)
    return model


def exam_sections() -> list[list[float]]:
    """Marks (out of 100) of three sections: 28 students, 9 students, 3 students.

    The big section did well, the tiny one did badly, so the average of the three section
    averages is far below the average of the 40 students.
    """
    import torch

    g = torch.Generator().manual_seed(7)
    sections = []
    for size, centre in ((28, 78.0), (9, 62.0), (3, 34.0)):
        marks = (centre + 6.0 * torch.randn(size, generator=g)).clamp(0, 100).round()
        sections.append([float(m) for m in marks])
    return sections


def report_lines(clerk: int, lines: int = 5) -> list[str]:
    """The report one clerk files in the filing-cabinet demo, one line at a time."""
    return [f"clerk {clerk} | page {i} of {lines} | my forms are all in order\n"
            for i in range(1, lines + 1)]
