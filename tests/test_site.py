"""The course site's build steps (course_tools/site.py) and the figures' palette.

- an execution is cached on the notebook's and helpers' content: unchanged, it is not run again;
  a changed helper runs it again (a real papermill run of a small notebook in a temporary course);
- a page shows what a widget drew as a static figure, not the widget; the learner's answers and
  tests appear as the learner gets them (no outputs, no solution, no hidden test);
- the project lists the pages in the course's order, with the README's depth table as landing page;
- the palette's four meanings stay apart under simulated protanopia, deuteranopia and tritanopia.
"""

from __future__ import annotations

import itertools
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from course_tools import site
from tests.conftest import RELEASED, ROOT, rel

WIDGET_CELL = """import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display
out = widgets.Output()
with out:
    plt.plot([0, 1], [1, 0]); plt.title("the line falls"); plt.show()
display(widgets.VBox([widgets.IntSlider(1), out]))"""


def _course(tmp_path: Path) -> Path:
    root = tmp_path / "course"
    (root / "helpers").mkdir(parents=True)
    (root / "helpers" / "tool.py").write_text("X = 1\n")
    (root / "notebooks" / "start").mkdir(parents=True)
    answer = nbformat.v4.new_code_cell("def f():\n    # YOUR CODE HERE\n    raise NotImplementedError()\nf()")
    answer.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "f", "locked": False}
    params = nbformat.v4.new_code_cell("QUICK = False")
    params.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# A page"), params,
        nbformat.v4.new_code_cell("print('quick' if QUICK else 'full')"),
        nbformat.v4.new_code_cell(WIDGET_CELL), answer])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "notebooks" / "start" / "00_a.ipynb")
    return root


def test_execution_is_cached_on_content_and_pages_show_widgets_as_figures(tmp_path, quick_env):
    root = _course(tmp_path)
    nb_path, cache = root / "notebooks/start/00_a.ipynb", tmp_path / "cache"
    executed, how, _ = site.execute(nb_path, root, cache)
    assert how == "ran"
    assert site.execute(nb_path, root, cache)[:2] == (executed, "cached")
    (root / "helpers" / "tool.py").write_text("X = 2\n")          # a helper changed: run again
    again, how, _ = site.execute(nb_path, root, cache)
    assert how == "ran" and again != executed and not executed.exists()
    assert sorted(p.name for p in again.parent.iterdir()) == [again.name]   # no partial file left

    shown = site.page(again, Path("notebooks/start/00_a.ipynb"))
    code = [c for c in shown.cells if c.cell_type == "code"]
    assert "quick" in code[1].outputs[0]["text"]                  # ran at the CI sizes
    widget = code[2]
    kinds = [k for o in widget.outputs for k in o.get("data", {})]
    assert "image/png" in kinds and site.WIDGET_VIEW not in kinds, kinds
    assert code[3].outputs == []                                   # the learner's answer: not run
    text = "\n".join(c.source for c in shown.cells if c.cell_type == "markdown")
    assert "QUICK = True" in text and "git-pull?repo=" in text and "{download}" in text


def test_a_failure_outside_the_graded_cells_fails_the_build(tmp_path, quick_env):
    root = _course(tmp_path)
    path = root / "notebooks/start/00_a.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(2, nbformat.v4.new_code_cell("1 / 0"))
    nbformat.write(nb, path)
    with pytest.raises(RuntimeError, match="fails outside its graded cells.*ZeroDivisionError"):
        site.execute(path, root, tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.ipynb"))        # nothing half-run is cached


def _hidden(source: Path) -> list[str]:
    """Each solution and hidden-test block of an instructor notebook, its lines stripped."""
    text = "\n".join(c.source for c in nbformat.read(source, as_version=4).cells)
    blocks = re.findall(r"### BEGIN (?:SOLUTION|HIDDEN TESTS)\n(.*?)### END", text, re.S)
    return ["\n".join(l.strip() for l in b.strip().splitlines()) for b in blocks if b.strip()]


WITH_HIDDEN = [p for p in RELEASED if _hidden(ROOT / "solutions" / p.relative_to(ROOT / "notebooks"))]


def test_exercises_have_solutions_to_look_for():
    assert len(WITH_HIDDEN) >= 3, WITH_HIDDEN


@pytest.mark.parametrize("path", WITH_HIDDEN, ids=rel)
def test_page_gives_away_no_solution_or_hidden_test(path):
    shown = site.page(path, path.relative_to(ROOT))
    text = "\n".join(l.strip() for c in shown.cells for l in c.source.splitlines())
    leaked = [b for b in _hidden(ROOT / "solutions" / path.relative_to(ROOT / "notebooks")) if b in text]
    assert not leaked, f"{rel(path)}'s page shows solution or hidden-test blocks: {leaked[:2]}"


def test_project_is_in_the_course_order_with_the_depth_table(tmp_path):
    pages = {r: site.page(ROOT / r, r) for r in site.lessons()}
    project = site.write_project(pages, tmp_path / "project")
    toc = [l.split("file: ")[1] for l in (project / "myst.yml").read_text().splitlines() if "file: " in l]
    assert toc[0] == "index.md" and toc[1].startswith("start/")
    depth_of = [t.split("/")[0] for t in toc[1:]]
    assert depth_of == sorted(depth_of, key=["start", "beginner", "developer", "researcher"].index)
    assert len(toc) == 1 + len(RELEASED)
    index = (project / "index.md").read_text()
    assert site.depth_table((ROOT / "README.md").read_text()).splitlines()[0] in index
    assert "(beginner/01_one_rank_writes.ipynb)" in index
    for r in site.lessons():                                       # the downloads are the clean notebooks
        assert (project / "downloads" / r.parent.name / r.name).read_bytes() == (ROOT / r).read_bytes()


# ----------------------------------------------------------------------------- colour vision
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


def _lab(hex_colour: str, matrix=None):
    import numpy as np

    c = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    c = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    if matrix is not None:
        c = np.clip(np.array(matrix) @ c, 0, 1)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ c
    f = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(f > 0.008856, np.cbrt(f), 7.787 * f + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


@pytest.mark.parametrize("vision", list(CVD))
def test_palette_meanings_stay_apart_with_colour_vision_deficiencies(vision):
    import numpy as np

    from helpers.lessons.figures import PALETTE

    meanings = ("ok", "missing", "torn", "truth")
    lab = {k: _lab(PALETTE[k], CVD[vision]) for k in meanings}
    close = [(a, b, round(float(np.linalg.norm(lab[a] - lab[b])), 1))
             for a, b in itertools.combinations(meanings, 2)
             if np.linalg.norm(lab[a] - lab[b]) < MIN_DELTA_E]
    assert not close, f"with {vision}, these colours of the palette look alike (CIE76 distance): {close}"


def test_the_simulation_tells_confusable_colours_apart():
    """The check above can fail: pure red and green, fine in normal vision, merge with deuteranopia."""
    import numpy as np

    normal = np.linalg.norm(_lab("#d62728") - _lab("#2ca02c"))
    deutan = np.linalg.norm(_lab("#ff0000", CVD["deuteranopia"]) - _lab("#9c7a00", CVD["deuteranopia"]))
    assert normal > 50 and deutan < MIN_DELTA_E, (normal, deutan)
