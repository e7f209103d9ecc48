"""Run nbgrader for real in a temporary course, for the tests of the graded exercises.

``autograde(notebook, submissions)`` copies the instructor notebook's depth into a temp course,
generates the learner version with ``nbgrader generate_assignment``, writes one submission per
student (the learner version with its answer cells filled in), runs ``nbgrader autograde`` once
for all of them, and returns each student's score per graded cell, read from the gradebook.
The course machinery itself lives in :mod:`course_tools.temp_course` (``make check`` and
``make bench`` use it too).
"""

from __future__ import annotations

import time
from pathlib import Path

import nbformat

from course_tools import is_graded_cell, nbgrader, venv_env  # noqa: F401 - re-exported
from course_tools.temp_course import (Graded, cell_output, fill, make_course, read_scores,  # noqa: F401
                                      reference_answers, submit)


def grading_bound(notebooks: list[Path], students: int, config=None) -> float:
    """Seconds an autograde of these notebooks for ``students`` students may take, from the
    configured limits: every code cell of every notebook at its cell timeout, plus a kernel
    start each (``Execute.timeout``, ``Execute.startup_timeout`` in nbgrader_config.py)."""
    from traitlets.config import Config

    from course_tools import ROOT

    c = Config()
    path = Path(config or ROOT / "nbgrader_config.py")
    exec(compile(path.read_text(), str(path), "exec"), {"get_config": lambda: c})
    cells = sum(sum(cell.cell_type == "code" for cell in nbformat.read(nb, as_version=4).cells)
                for nb in notebooks)
    return students * (cells * c.Execute.timeout + len(notebooks) * c.Execute.startup_timeout)


def autograde(source: Path, submissions: dict[str, dict[str, str] | None], tmp: Path,
              extra: tuple = (), timeout: float | None = None) -> Graded:
    """Grade one notebook for several students.

    ``submissions`` maps a student id to ``{grade_id: answer source}`` for the answer cells
    they wrote (cells not named keep the released stub), or to ``None`` for the reference
    solutions. ``extra``: more arguments for ``nbgrader autograde``; ``timeout``: its bound in
    seconds (default: :func:`grading_bound` of the configured limits).
    """
    depth = source.parent.name
    course = make_course(tmp, [depth])
    reference = reference_answers(source)
    for student, answers in submissions.items():
        submit(course, student, depth, source.name, reference if answers is None else answers)
    t0 = time.monotonic()
    nbgrader("autograde", depth, "--force", *extra, cwd=course,
             timeout=timeout or grading_bound([source], len(submissions)))
    seconds = time.monotonic() - t0
    print(f"autograde of {len(submissions)} submissions of {source.name}: {seconds:.0f} s")
    return read_scores(course, depth, source.stem, list(submissions), seconds)
