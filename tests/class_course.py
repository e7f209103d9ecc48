"""A small class for the class-grading tests: a two-exercise assignment, four submissions.

The assignment (``tiny``) has two answer cells and two test cells (one with a hidden test) that call the
answers in a worker process, as every check of the course does (the grading kernel never runs a
learner's cell), so a submission grades in seconds. Its course is the course's own ``nbgrader_config.py`` (execute step,
sandbox, sanitizing) with a 30 s cell limit (each test's pool gets half of it) and late submissions scored zero. The students:
``s1`` right and on time, ``s2`` right but late (a score of zero after the penalty), ``s3`` with
a hanging ``halve`` (its test's pool times out; the loop is one line, so where the rank was stuck
is the same line whenever its stack is read), ``s4`` a file that is not a notebook.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

import nbformat

from course_tools import ROOT, nbgrader, venv_env
from course_tools.temp_course import fill

ASSIGNMENT = "tiny"
NOTEBOOK = "tiny.ipynb"
DUE = datetime.datetime(2026, 1, 10, 12, 0, 0)
#: The course's config, with what this class needs on top.
EXTRA_CONFIG = """
c.Execute.timeout = 30
c.LateSubmissionPlugin.penalty_method = "zero"
"""


def _meta(grade_id: str, *, solution=False, grade=False, points=0, locked=False) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3,
            "solution": solution}
    if grade:
        meta["points"] = points
    return {"nbgrader": meta}


def source_notebook():
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = nbformat.v4.new_code_cell
    nb.cells = [
        nbformat.v4.new_markdown_cell("Two small exercises."),
        cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
             metadata=_meta("double", solution=True)),
        cell('"""double doubles"""\nfrom helpers.grading.answers import call\n'
             'assert call(double, 3, name="double")["value"] == 6',
             metadata=_meta("test_double", grade=True, points=2, locked=True)),
        cell("def halve(x):\n    ### BEGIN SOLUTION\n    return x / 2\n    ### END SOLUTION",
             metadata=_meta("halve", solution=True)),
        cell('"""halve halves"""\nfrom helpers.grading.answers import call\n'
             'assert call(halve, 4, name="halve")["value"] == 2\n'
             '### BEGIN HIDDEN TESTS\nassert call(halve, 5, name="halve")["value"] == 2.5\n'
             '### END HIDDEN TESTS', metadata=_meta("test_halve", grade=True, points=1, locked=True)),
    ]
    return nb


ANSWERS = {
    "s1": ({"double": "def double(x):\n    return x + x", "halve": "def halve(x):\n    return x / 2"},
           datetime.datetime(2026, 1, 10, 11, 0, 0)),
    "s2": ({"double": "def double(x):\n    return 2 * x", "halve": "def halve(x):\n    return 0.5 * x"},
           datetime.datetime(2026, 1, 11, 9, 30, 0)),
    "s3": ({"double": "def double(x):\n    return 2 * x",
            "halve": "def halve(x):\n    while True: pass"}, None),
    "s4": (None, None),
}


def make_class(folder: Path, db_url: str | None = None, students=tuple(ANSWERS), extra_config: str = "") -> Path:
    """A course in ``folder`` with the assignment generated, due at ``DUE``, and the submissions
    (``extra_config``: more lines for its ``nbgrader_config.py``)."""
    from nbgrader.api import Gradebook

    course = Path(folder)
    (course / "solutions" / ASSIGNMENT).mkdir(parents=True)
    nbformat.write(source_notebook(), course / "solutions" / ASSIGNMENT / NOTEBOOK)
    config = (ROOT / "nbgrader_config.py").read_text() + EXTRA_CONFIG + extra_config
    if db_url:
        config += f"c.CourseDirectory.db_url = {db_url!r}\n"
    (course / "nbgrader_config.py").write_text(config)
    nbgrader("generate_assignment", ASSIGNMENT, "--force", cwd=course)
    with Gradebook(db_url or f"sqlite:///{course}/gradebook.db") as gb:
        gb.update_or_create_assignment(ASSIGNMENT, duedate=DUE)
    for student in students:
        answers, when = ANSWERS[student]
        dest = course / "submitted" / student / ASSIGNMENT
        dest.mkdir(parents=True)
        if answers is None:
            (dest / NOTEBOOK).write_text("this is not a notebook")
        else:
            nbformat.write(fill(course / "notebooks" / ASSIGNMENT / NOTEBOOK, answers), dest / NOTEBOOK)
        if when is not None:
            (dest / "timestamp.txt").write_text(when.strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
    return course


def gradebook_rows(db_url: str, students) -> dict[str, dict]:
    """Per student what the gradebook holds of the submission: per-cell scores, the late
    penalty, the timestamp, seconds late, the total; ``None`` for no submission."""
    from nbgrader.api import Gradebook, MissingEntry

    rows = {}
    with Gradebook(db_url) as gb:
        for student in students:
            try:
                sub = gb.find_submission(ASSIGNMENT, student)
            except MissingEntry:
                rows[student] = None
                continue
            rows[student] = {
                "grades": {g.name: (g.auto_score, g.manual_score, g.needs_manual_grade)
                           for nb in sub.notebooks for g in nb.grades},
                "penalty": sub.late_submission_penalty, "timestamp": sub.timestamp,
                "seconds_late": sub.total_seconds_late, "score": sub.score,
                "grade_rows": sum(len(nb.grades) for nb in sub.notebooks),
            }
    return rows


def grade(course: Path, *args, env=None, timeout=600) -> subprocess.CompletedProcess:
    """``python -m course_tools.grade tiny ARGS`` in ``course``; its output is printed."""
    proc = subprocess.run([sys.executable, "-m", "course_tools.grade", ASSIGNMENT, *args], cwd=course,
                          capture_output=True, text=True, timeout=timeout, env=env or venv_env())
    print(proc.stdout, proc.stderr)
    return proc


def marked(mark: str, parent: int | None = None) -> list:
    """Every process started for a grading run marked ``mark`` (kernels and ranks included);
    with ``parent``, only its children."""
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("COURSE_GRADE_TASK") == mark and parent in (None, p.ppid()):
                found.append(p)
        except psutil.Error:
            pass
    return found
