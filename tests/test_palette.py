"""The figures' colours (helpers/lessons/figures.py: one palette, one list of worker colours).

- the palette's five meanings, and the eight worker colours, stay apart under simulated
  protanopia, deuteranopia and tritanopia;
- every figure of the course, drawn from sample numbers with eight workers, draws no two colours
  that merge under those simulations, and every text it writes on a colour (a count on a bar, a
  clerk's number) has WCAG's 4.5:1 contrast with what is under it.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

# Machado, Oliveira & Fernandes (2009), severity 1.0, applied to linear RGB.
CVD = {"protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                      [-0.003882, -0.048116, 1.051998]],
       "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                        [-0.011820, 0.042940, 0.968881]],
       "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602],
                      [0.004733, 0.691367, 0.303900]]}
#: CIE76 distance above which two flat colours are told apart at a glance (about 2.3 is just
#: noticeable; 10 is a clear difference).
MIN_DELTA_E = 10
#: WCAG 2.1 AA for text below 18 pt (14 pt bold): every text the figures write is 11 pt or less.
MIN_TEXT_CONTRAST = 4.5


def _lab(colour, matrix=None):
    import numpy as np
    from matplotlib.colors import to_rgb

    c = np.array(to_rgb(colour))
    c = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    if matrix is not None:
        c = np.clip(np.array(matrix) @ c, 0, 1)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ c
    f = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(f > 0.008856, np.cbrt(f), 7.787 * f + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _distance(a, b, vision: str | None = None) -> float:
    import numpy as np

    matrix = CVD[vision] if vision else None
    return float(np.linalg.norm(_lab(a, matrix) - _lab(b, matrix)))


def _merging(colours: dict) -> list[tuple]:
    """(vision, name, name, distance) for each pair closer than MIN_DELTA_E under a simulation."""
    return [(vision, a, b, round(_distance(colours[a], colours[b], vision), 1))
            for vision in CVD for a, b in itertools.combinations(colours, 2)
            if _distance(colours[a], colours[b], vision) < MIN_DELTA_E]


def test_palette_meanings_stay_apart_with_colour_vision_deficiencies():
    from helpers.lessons.figures import PALETTE

    assert set(PALETTE) == {"ok", "missing", "torn", "truth", "neutral"}
    close = _merging(PALETTE)
    assert not close, f"these colours of the palette look alike (CIE76 distance): {close}"


def test_worker_colours_stay_apart_with_colour_vision_deficiencies():
    from helpers.lessons.figures import WORKERS, worker_colour

    assert len(set(WORKERS)) == len(WORKERS) >= 8                  # the widgets go up to 8 ranks
    assert [worker_colour(r) for r in range(len(WORKERS))] == WORKERS
    close = _merging({f"rank {r}": c for r, c in enumerate(WORKERS)})
    assert not close, f"these worker colours look alike (CIE76 distance): {close}"


def test_the_simulation_tells_confusable_colours_apart():
    """The checks here can fail: matplotlib's tab10 (the worker colours before) has ranks 1 and 2
    merge under protanopia and 2 and 3 under deuteranopia; pure red and green merge too."""
    import matplotlib

    tab10 = {f"rank {r}": matplotlib.colormaps["tab10"](r) for r in range(8)}
    pairs = {(v, a, b) for v, a, b, _ in _merging(tab10)}
    assert {("protanopia", "rank 1", "rank 2"), ("deuteranopia", "rank 2", "rank 3")} <= pairs, pairs
    assert _distance("#d62728", "#2ca02c") > 50
    assert _distance("#ff0000", "#9c7a00", "deuteranopia") < MIN_DELTA_E


def test_contrast_is_wcag_and_text_colour_picks_the_readable_one():
    from helpers.lessons.figures import PALETTE, WORKERS, contrast, text_colour

    assert round(contrast("black", "white"), 1) == 21.0 and contrast("#777777", "#777777") == 1
    assert round(contrast("white", "#767676"), 1) == 4.5                # WCAG's own example grey
    assert contrast("white", PALETTE["missing"]) < 2.5                   # white on amber: unreadable
    for colour in [*PALETTE.values(), *WORKERS]:
        assert contrast(text_colour(colour), colour) >= MIN_TEXT_CONTRAST, colour


# ----------------------------------------------------------------------------- every figure, drawn
def _hang():
    ranks = [SimpleNamespace(rank=0, finished=False, seconds=None, line="dist.barrier()", function="main",
                             lineno=12),
             SimpleNamespace(rank=1, finished=True, seconds=0.4, line=None, function=None, lineno=None)]
    return SimpleNamespace(ranks=ranks, blocked=[ranks[0]], timeout=5.0)


_LOSSES = [0.4, 0.9, 1.3, 1.1, 0.7, 1.6, 0.5, 1.2]                           # eight workers
#: Each figure function with numbers like a lesson's, eight workers wherever workers are drawn.
SAMPLES = {
    "plot_hang": lambda f: f.plot_hang(_hang()),
    "plot_read_outcomes": lambda f: f.plot_read_outcomes(["ok", "missing", "torn", "ok", "torn"], ["ok"] * 5),
    "plot_report": lambda f: f.plot_report([r for r in range(8) for _ in range(3)], 8),
    "plot_worker_losses": lambda f: f.plot_worker_losses(_LOSSES, 1.0, "sorted data"),
    "plot_exam": lambda f: f.plot_exam([[60 + i + j for j in range(2 + i)] for i in range(8)], 70, 72),
    "plot_timeline": lambda f: f.plot_timeline(
        [{"start": 0.0, "written": 0.5, "at_barrier": 0.5, "went_on": 0.52},
         {"start": 0.01, "at_barrier": 0.02, "went_on": 0.52}]),
    "plot_reads": lambda f: f.plot_reads([["ok", "missing", "torn"], ["ok", "ok", "torn"]], "reads"),
    "plot_failure_rates": lambda f: f.plot_failure_rates(
        {(2, False): 0.5, (4, False): 0.8, (2, True): 0.0, (4, True): 0.0}, "failed reads",
        intervals={(2, False): (0.3, 0.7), (4, False): (0.6, 0.9), (2, True): (0, 0.1), (4, True): (0, 0.1)}),
    "plot_logged_loss": lambda f: f.plot_logged_loss([0.2, 0.5, 0.7], 0.45, "rank 0 logs 0.2"),
    "plot_stop_decisions": lambda f: f.plot_stop_decisions(
        [[2.0 - 0.1 * s - 0.05 * r for s in range(10)] for r in range(8)],
        [2.0 - 0.1 * s for s in range(10)], 1.3, 7, "every rank stops at step 7"),
    "plot_resume": lambda f: f.plot_resume([1.0 - 0.05 * s for s in range(10)], [1.0, 0.95, 0.9, 0.85],
                                           [0.8, 0.75, 0.7], [0.8, 0.9, 0.7], "resumed"),
    "plot_waste": lambda f: f.plot_waste([1, 10, 100], [0.3, 0.1, 0.2], [0.25, 0.09, 0.22], 12.0, 10.0, "waste"),
    "plot_gap_vs_samples": lambda f: f.plot_gap_vs_samples([10, 100, 1000], [0.3, 0.1, 0.03], [0.5, 0.5, 0.5],
                                                           "the gap"),
    "plot_dashboard": lambda f: f.plot_dashboard(
        {f"rank{r}": [(s, 1.0 / (s + 1) + 0.02 * r) for s in range(5)] for r in range(8)},
        [1.0 / (s + 1) for s in range(5)], "eight runs"),
    "plot_logging_cost": lambda f: f.plot_logging_cost([1, 10, 100], [0.02, 0.012, 0.011], 0.01, "cost"),
    "plot_announcements": lambda f: f.plot_announcements([0.4, None, 1.3, None, 0.7, 1.6, None, 1.2], 1.0,
                                                         "who announces"),
    "plot_smoothing": lambda f: f.plot_smoothing([1.0, 0.9, 3.0, 0.8, 0.7], [1.0, 0.95, 1.5, 1.2, 1.0],
                                                 [0.9, 0.85, 0.8, 0.75, 0.7], 1.1, 2, 0.6, "smoothing"),
    "plot_counts": lambda f: f.plot_counts([1e6, 2e7, 4e7], [1e6, 1.67e7, 1.67e7], "float32 stops"),
    "plot_collectives": lambda f: f.plot_collectives([1, 10, 100], {"every step": [100, 100, 100],
                                                                    "every k": [100, 10, 1],
                                                                    "at the end": [1, 1, 1]}, 100, "count"),
}


def test_every_figure_has_a_sample():
    from helpers.lessons import figures

    assert set(SAMPLES) == {n for n in figures.__all__ if n.startswith("plot_")}


def _over_white(rgba) -> tuple:
    r, g, b, a = rgba
    return tuple(a * c + (1 - a) for c in (r, g, b))


def _drawn(ax) -> dict[str, str]:
    """The colours an Axes draws its data in (bars, lines, markers, error bars, image cells),
    each once, as #rrggbb, named by what first drew it. Transparency is left out: a faint bar and
    a solid one of the same colour are one colour, told apart by their shade."""
    from matplotlib.colors import ListedColormap, to_hex, to_rgba

    found: dict[str, str] = {}

    def add(colour, what):
        rgba = to_rgba(colour)
        if rgba[3] == 0:
            return
        hexed = to_hex(rgba[:3])
        if hexed != "#ffffff":
            found.setdefault(hexed, f"{what} {hexed}")

    for patch in ax.patches:
        add(patch.get_facecolor(), "bar")
    for line in ax.lines:
        if line.get_linestyle() not in ("None", "") or line.get_marker() in ("None", "", None):
            add(line.get_color(), "line")
        if line.get_marker() not in ("None", "", None):
            add(line.get_markerfacecolor(), "marker")
    for coll in ax.collections:
        for colour in [*coll.get_edgecolor(), *coll.get_facecolor()]:
            add(colour, "mark")
    for image in ax.images:
        cmap = image.get_cmap()
        assert isinstance(cmap, ListedColormap), "an image in a continuous colour map: check it by hand"
        for colour in cmap.colors:
            add(colour, "cell")
    return found


def _text_backgrounds(fig, ax) -> list[tuple[str, object, tuple]]:
    """(text, its colour, the colour under it) for each text written inside the Axes: the text's
    own box if it has one, else the topmost bar under its middle, else the white of the figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    for text in ax.texts:
        if not text.get_visible() or not text.get_text().strip():
            continue
        box = text.get_bbox_patch()
        if box is not None:
            under = _over_white(box.get_facecolor())
        else:
            extent = text.get_window_extent(renderer)
            middle = ((extent.x0 + extent.x1) / 2, (extent.y0 + extent.y1) / 2)
            bars = [p for p in ax.patches if p.contains_point(middle)]
            top = max(bars, key=lambda p: p.get_zorder(), default=None)
            under = _over_white(top.get_facecolor()) if top is not None else (1.0, 1.0, 1.0)
        found.append((text.get_text(), text.get_color(), under))
    return found


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_figure_draws_colours_that_stay_apart_and_readable_text(name):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.lessons import figures

    with plt.rc_context({"figure.dpi": 50}):
        result = SAMPLES[name](figures)
        fig = (result if result is not None else plt.gca()).figure
        try:
            problems = []
            for ax in fig.axes:
                colours = {label: colour for colour, label in _drawn(ax).items()}
                problems += [f"{a} and {b} look alike with {v} ({d})" for v, a, b, d in _merging(colours)]
                for text, colour, under in _text_backgrounds(fig, ax):
                    ratio = figures.contrast(colour, under)
                    if ratio < MIN_TEXT_CONTRAST:
                        problems.append(f"text {text!r} has contrast {ratio:.1f}:1 with what is under it")
            drawn = {c for ax in fig.axes for c in _drawn(ax)}
        finally:
            plt.close(fig)
    assert not problems, f"{name}: " + "; ".join(problems)
    if name in ("plot_report", "plot_worker_losses", "plot_exam", "plot_stop_decisions", "plot_dashboard"):
        assert set(figures.WORKERS) <= drawn, f"{name} did not draw all eight worker colours: {drawn}"


def test_the_figure_check_finds_merged_colours_and_unreadable_text():
    """The check above can fail: tab10's ranks as bars, and white numbers on the amber of `missing`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.lessons.figures import PALETTE, contrast

    fig, ax = plt.subplots()
    try:
        for r in range(4):
            ax.bar(r, 1, color=f"C{r}")
        ax.text(0, 0.5, "3", color="white", ha="center")
        ax.bar(5, 1, color=PALETTE["missing"])
        ax.text(5, 0.5, "3", color="white", ha="center")
        merged = _merging({label: colour for colour, label in _drawn(ax).items()})
        texts = [(t, contrast(c, u)) for t, c, u in _text_backgrounds(fig, ax)]
    finally:
        plt.close(fig)
    assert {v for v, *_ in merged} >= {"protanopia", "deuteranopia"}, merged
    assert texts[0][1] > MIN_TEXT_CONTRAST and texts[1][1] < 2.5, texts   # white on blue is fine, on amber not
