"""Run nbgrader for real in a temporary course, for the tests of the graded exercises.

``autograde(notebook, submissions)`` copies the instructor notebook's depth into a temp course,
generates the learner version with ``nbgrader generate_assignment``, writes one submission per
student (the learner version with its answer cells filled in), runs ``nbgrader autograde`` once
for all of them, and returns each student's score per graded cell, read from the gradebook.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from tests.conftest import ROOT

SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def venv_env(**extra) -> dict:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


def nbgrader(*args, cwd: Path, timeout: float = 900, check: bool = True, env=None):
    cmd = [sys.executable, "-m", "nbgrader", *args, "--log-level=WARN"]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env or venv_env())
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


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


@dataclass
class Graded:
    scores: dict[str, dict[str, float]]  # student -> grade_id -> score
    max_scores: dict[str, float]  # grade_id -> points
    seconds: float
    course: Path

    def total(self, student: str) -> float:
        return sum(self.scores[student].values())

    def lost(self, student: str) -> set[str]:
        """grade_ids where this student scored below the maximum."""
        return {g for g, s in self.scores[student].items() if s < self.max_scores[g]}


def make_course(tmp: Path, depth: str) -> Path:
    course = tmp / "course"
    (course / "solutions").mkdir(parents=True)
    shutil.copytree(ROOT / "solutions" / depth, course / "solutions" / depth,
                    ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    shutil.copy(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    nbgrader("generate_assignment", depth, "--force", cwd=course)
    return course


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
        nb = nbformat.read(released, as_version=4)
        fill = reference if answers is None else answers
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if cell.metadata.get("nbgrader", {}).get("solution") and gid in fill:
                cell.source = fill[gid]
        dest = course / "submitted" / student / depth
        dest.mkdir(parents=True)
        nbformat.write(nb, dest / source.name)
    t0 = time.monotonic()
    nbgrader("autograde", depth, "--force", cwd=course, timeout=timeout)
    seconds = time.monotonic() - t0
    return read_scores(course, depth, source.stem, list(submissions), seconds)


def read_scores(course: Path, depth: str, notebook: str, students: list[str],
                seconds: float = 0.0) -> Graded:
    from nbgrader.api import Gradebook

    scores, max_scores = {}, {}
    with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
        for student in students:
            sub = gb.find_submission_notebook(notebook, depth, student)
            scores[student] = {g.name: float(g.score) for g in sub.grades}
            for g in sub.grades:
                max_scores[g.name] = float(g.max_score)
    return Graded(scores, max_scores, seconds, course)
