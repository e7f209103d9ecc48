"""Run nbgrader for real in a temporary course, for the tests of the graded exercises.

``autograde(notebook, submissions)`` copies the instructor notebook's depth into a temp course,
generates the learner version with ``nbgrader generate_assignment``, writes one submission per
student (the learner version with its answer cells filled in), runs ``nbgrader autograde`` once
for all of them, and returns each student's score per graded cell, read from the gradebook.
The course machinery itself lives in :mod:`course_tools.temp_course` (``make check`` uses it too).
"""

from __future__ import annotations

import time
from pathlib import Path

import nbformat

from course_tools import nbgrader, venv_env  # noqa: F401 - re-exported
from course_tools.temp_course import Graded, read_scores  # noqa: F401 - re-exported
from course_tools.temp_course import make_course as _make_course

SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def reference_answers(source: Path) -> dict[str, str]:
    """grade_id -> source of every solution cell of an instructor notebook, markers removed."""
    nb = nbformat.read(source, as_version=4)
    answers = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            lines = [l for l in cell.source.splitlines() if l.strip() not in SOLUTION_MARKERS]
            answers[meta["grade_id"]] = "\n".join(lines)
    return answers


def make_course(tmp: Path, depth: str) -> Path:
    return _make_course(tmp, [depth])


def fill(released: Path, answers: dict[str, str]) -> nbformat.NotebookNode:
    """The released notebook with these answer cells written in (others keep their stub)."""
    nb = nbformat.read(released, as_version=4)
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and meta.get("grade_id") in answers:
            cell.source = answers[meta["grade_id"]]
    return nb


def autograde(source: Path, submissions: dict[str, dict[str, str] | None], tmp: Path,
              timeout: float = 900) -> Graded:
    """Grade one notebook for several students.

    ``submissions`` maps a student id to ``{grade_id: answer source}`` for the answer cells
    they wrote (cells not named keep the released stub), or to ``None`` for the reference
    solutions.
    """
    depth = source.parent.name
    course = make_course(tmp, depth)
    released = course / "notebooks" / depth / source.name
    reference = reference_answers(source)
    for student, answers in submissions.items():
        dest = course / "submitted" / student / depth
        dest.mkdir(parents=True)
        nbformat.write(fill(released, reference if answers is None else answers), dest / source.name)
    t0 = time.monotonic()
    nbgrader("autograde", depth, "--force", cwd=course, timeout=timeout)
    seconds = time.monotonic() - t0
    return read_scores(course, depth, source.stem, list(submissions), seconds)


def cell_output(nb_path: Path, grade_id: str) -> str:
    """Everything a graded notebook's cell printed or raised (text, error values, tracebacks)."""
    nb = nbformat.read(nb_path, as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            parts = []
            for out in cell.get("outputs", []):
                parts.append(out.get("text", ""))
                parts.append(out.get("evalue", ""))
                parts.extend(out.get("traceback", []))
            return "\n".join(parts)
    raise KeyError(grade_id)
