"""Every notebook of the course, discovered automatically: a new lesson is covered with no edit here.

- instructor versions (solutions/) execute clean under papermill, from their own folder, with QUICK=True
  (a lesson, identical in both trees, through the site's cached execution step: one run serves this
  test and the site's build); the released exercises run with empty answers fail only in graded cells;
- learner lessons are their instructor version, unchanged; every learner notebook is run in JupyterLab
  by tests/test_browser.py, which also checks that an exercises notebook with empty answers fails only
  in its graded cells, and fails its tests;
- notebooks/ is exactly what nbgrader generates from solutions/, and holds no solution or hidden test;
- every notebook is committed without outputs or execution counts, and has a `parameters` cell.
"""

from __future__ import annotations

import json
import subprocess

import nbformat
import pytest

from tests.conftest import RELEASED, ROOT, SOLUTIONS, rel, session_started
from tests.nbrun import errors, run_papermill

ALL = SOLUTIONS + RELEASED


def test_course_has_notebooks():
    """The discovery below found the start notebook in both trees."""
    assert ROOT / "solutions/start/00_start_here.ipynb" in SOLUTIONS
    assert ROOT / "notebooks/start/00_start_here.ipynb" in RELEASED


# Instructor notebooks whose papermill run belongs to another module, which asserts the clean run
# too and more on the same outputs (one execution instead of two).
EXECUTED_ELSEWHERE = {ROOT / "solutions" / "developer" / "02_common_mistakes.ipynb": "tests/test_lint_lesson.py"}


def test_notebooks_executed_elsewhere_are_checked_clean_there():
    for path, module in EXECUTED_ELSEWHERE.items():
        text = (ROOT / module).read_text()
        assert path in SOLUTIONS and path.name in text and "assert not errors(executed)" in text, module


def _has_answer_cells(path) -> bool:
    from course_tools import is_answer_cell

    return any(is_answer_cell(c) for c in nbformat.read(path, as_version=4).cells)


WITH_ANSWERS = [p for p in RELEASED if _has_answer_cells(p)]
LESSONS = [p for p in RELEASED if p not in WITH_ANSWERS]


def _cells(path) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nbformat.read(path, as_version=4).cells]


def _learner_copy(path):
    return ROOT / "notebooks" / path.relative_to(ROOT / "solutions")


@pytest.mark.notebook
@pytest.mark.parametrize("path", [p for p in SOLUTIONS if p not in EXECUTED_ELSEWHERE], ids=rel)
def test_solution_notebook_executes_clean(path, tmp_path, quick_env):
    """The instructor version runs top to bottom under papermill with CI parameters.

    A lesson (no answer cells) reaches the learner unchanged (checked here first), so it runs as
    the learner's copy through the site's execution step (course_tools.site.execute: papermill,
    QUICK=True, from its own folder), once in this test run whichever test asks first; the site's
    build (tests/test_site.py) takes that run from its cache instead of running it again."""
    from course_tools import site

    learner = _learner_copy(path)
    if learner in LESSONS:
        assert _cells(learner) == _cells(path), f"{rel(learner)} differs from {rel(path)}: run `make release`"
        executed, how, seconds = site.execute(learner, fresh_after=session_started())
        nb = nbformat.read(executed, as_version=4)
    else:
        nb, seconds = run_papermill(path, tmp_path / path.name)
    assert not errors(nb)
    print(f"{rel(path)}: {seconds:.1f} s")


@pytest.mark.notebook
@pytest.mark.parametrize("path", WITH_ANSWERS, ids=rel)
def test_learner_exercises_fail_only_in_their_graded_cells(path, quick_env):
    """An exercises notebook as released, its answers empty, run as the site runs it (once in this
    test run, then in the site's cache): it fails only in the learner's answers and their tests
    (site.execute raises otherwise), and an empty answer fails its tests."""
    from course_tools import is_graded_cell, site

    executed, how, seconds = site.execute(path, fresh_after=session_started())
    nb = nbformat.read(executed, as_version=4)
    assert not site.errors_outside_graded(nb)
    failed = [c for c in nb.cells if c.cell_type == "code" and is_graded_cell(c)
              and any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    assert failed, f"{rel(path)}: no test fails on the empty answers"
    print(f"{rel(path)}: {seconds:.1f} s ({how})")


@pytest.mark.parametrize("path", LESSONS, ids=rel)
def test_learner_lesson_is_its_solution_notebook(path):
    """A lesson without answer cells reaches the learner unchanged, so executing the instructor
    version (above) and the browser test (every learner notebook in JupyterLab) cover it."""
    source = ROOT / "solutions" / path.relative_to(ROOT / "notebooks")
    got, want = _cells(path), _cells(source)
    assert got == want, f"{rel(path)} differs from {rel(source)}: run `make release`"


def test_release_matches_solutions(tmp_path):
    """notebooks/ is what `make release` (nbgrader generate_assignment) makes from solutions/."""
    from course_tools.release import generate

    generate(tmp_path)
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    have = sorted(p.relative_to(ROOT / "notebooks") for p in (ROOT / "notebooks").rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)
    assert made == have, "notebooks/ is stale: run `make release` and commit the result"
    for relpath in made:
        a, b = tmp_path / relpath, ROOT / "notebooks" / relpath
        if relpath.suffix != ".ipynb":
            assert a.read_bytes() == b.read_bytes(), f"{relpath} differs: run `make release`"
            continue
        got = [(c.cell_type, c.source) for c in nbformat.read(b, as_version=4).cells]
        want = [(c.cell_type, c.source) for c in nbformat.read(a, as_version=4).cells]
        assert got == want, f"notebooks/{relpath} differs from its source: run `make release`"


@pytest.mark.parametrize("path", RELEASED, ids=rel)
def test_learner_notebook_has_no_solution_or_hidden_test(path):
    text = path.read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text, f"{rel(path)} gives away its answers ({marker})"


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_notebook_committed_clean(path):
    """No outputs, no execution counts, and a `parameters` cell so CI can run it small."""
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{rel(path)}: cells {dirty} have outputs; clear them before committing"
    tags = [t for c in nb["cells"] for t in c.get("metadata", {}).get("tags", [])]
    assert "parameters" in tags, f"{rel(path)} has no cell tagged `parameters`"


def test_no_generated_files_tracked():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    junk = [f for f in files if f.endswith((".pt", ".pth", ".distcp", ".db"))
            or ".ipynb_checkpoints" in f or f.startswith(("submitted/", "autograded/", "feedback/"))]
    assert not junk, f"generated files are tracked: {junk}"
