"""A temporary nbgrader course: the engine of ``make check`` and of the grading tests.

A temporary course holds ``solutions/<depth>/`` (the instructor notebooks, so locked test
cells are restored from them and hidden tests run) and the course's ``nbgrader_config.py``;
``nbgrader generate_assignment`` registers the assignment, submissions go in
``submitted/<student>/<depth>/``, and :func:`read_scores` reads the gradebook.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from course_tools import ROOT, nbgrader

__all__ = ["make_course", "read_scores", "Graded", "exercise_of"]


def make_course(tmp: Path, depths: list[str], root: Path = ROOT) -> Path:
    """A course in ``tmp/course`` with these depths' instructor notebooks, assignments generated."""
    course = Path(tmp) / "course"
    (course / "solutions").mkdir(parents=True)
    for depth in depths:
        shutil.copytree(root / "solutions" / depth, course / "solutions" / depth,
                        ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    shutil.copy(root / "nbgrader_config.py", course / "nbgrader_config.py")
    for depth in depths:
        nbgrader("generate_assignment", depth, "--force", cwd=course)
    return course


@dataclass
class Graded:
    scores: dict[str, dict[str, float]]  # student -> grade_id -> score
    max_scores: dict[str, float]  # grade_id -> points
    seconds: float
    course: Path
    notebook_of: dict[str, str] = field(default_factory=dict)  # grade_id -> notebook name

    def total(self, student: str) -> float:
        return sum(self.scores[student].values())

    def lost(self, student: str) -> set[str]:
        """grade_ids where this student scored below the maximum."""
        return {g for g, s in self.scores[student].items() if s < self.max_scores[g]}


def read_scores(course: Path, depth: str, notebooks: list[str] | str, students: list[str],
                seconds: float = 0.0) -> Graded:
    """Scores of every graded cell of these notebooks (names without .ipynb) per student."""
    from nbgrader.api import Gradebook, MissingEntry

    if isinstance(notebooks, str):
        notebooks = [notebooks]
    scores, max_scores, notebook_of = {}, {}, {}
    with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
        for student in students:
            scores[student] = {}
            for nb in notebooks:
                try:
                    sub = gb.find_submission_notebook(nb, depth, student)
                except MissingEntry:
                    continue
                for g in sub.grades:
                    scores[student][g.name] = float(g.score)
                    max_scores[g.name] = float(g.max_score)
                    notebook_of[g.name] = nb
    return Graded(scores, max_scores, seconds, course, notebook_of)


def exercise_of(test_id: str, answer_ids: list[str]) -> str:
    """The exercise a test cell checks: the longest answer grade_id its own grade_id contains."""
    hits = [a for a in answer_ids if a in test_id]
    return max(hits, key=len) if hits else test_id
