"""One real ``nbgrader autograde`` per depth, shared by every wrong-answer suite of that depth.

Each suite (tests/test_<depth>_grading.py, test_checkpointing_exercise_grading.py,
test_logging_exercises_grading.py) writes answers for its own exercises only and leaves the other
exercises' tests out of every comparison it makes. So one submission can carry one student of
each suite at once: the k-th students of a depth's suites share a notebook, each suite's answers
in its own exercises' answer cells (the exercises are independent: each test runs its own pool,
a hang costs one timeout for its own function only). A depth then costs one autograde of as many
submissions as its largest suite has students, instead of one autograde per suite.

tests/conftest.py keeps a depth's suites on one xdist worker, so each depth is graded once per
run. Each suite reads the shared run through :class:`SuiteView`, by its own student names.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from course_tools import depths
from course_tools.selfcheck import graded_notebooks
from tests.conftest import ROOT
from tests.nbgrade import autograde, reference_answers


def _exercises() -> dict[str, Path]:
    """Each depth with graded cells -> its one graded notebook (its exercises), as the course
    discovers them (``make check`` and the release use the same discovery)."""
    found = {}
    for depth in depths():
        notebooks = graded_notebooks(ROOT / "solutions" / depth)
        if notebooks:
            (found[depth],) = notebooks
    return found


NOTEBOOKS = _exercises()

# depth -> the suites graded in its shared run (each has ``submissions(depth)``; a module that only
# reads another suite's students returns none)
SUITES = {
    "beginner": ["tests.test_beginner_grading", "tests.test_logging_exercises_grading",
                 "tests.test_lint_feedback"],
    "developer": ["tests.test_developer_grading", "tests.test_checkpointing_exercise_grading",
                  "tests.test_logging_exercises_grading"],
    "researcher": ["tests.test_researcher_grading", "tests.test_logging_exercises_grading"],
}

_RUNS: dict[str, tuple] = {}


def merged(depth: str) -> tuple[dict[str, dict[str, str]], dict[tuple[str, str], str]]:
    """(submissions, who): one submission per position across the depth's suites, and
    (suite module, suite's student) -> the submission that carries that student's answers."""
    reference = reference_answers(NOTEBOOKS[depth])
    submissions: dict[str, dict[str, str]] = {}
    who: dict[tuple[str, str], str] = {}
    owners: dict[str, str] = {}
    for module in SUITES[depth]:
        students = importlib.import_module(module).submissions(depth)
        own = {gid for answers in students.values() if answers for gid in answers}
        for gid in own:
            if owners.setdefault(gid, module) != module:
                raise AssertionError(f"{gid} is written by two suites, {owners[gid]} and {module}: "
                                     "each exercise belongs to one suite")
        for k, (student, answers) in enumerate(students.items(), start=1):
            sid = f"student{k:02d}"
            filled = {gid: reference[gid] for gid in own} if answers is None else answers
            submissions.setdefault(sid, {}).update(filled)
            who[module, student] = sid
    return submissions, who


def graded_run(depth: str, tmp_path_factory):
    """The depth's shared autograde run, graded the first time a suite asks for it."""
    if depth not in _RUNS:
        submissions, who = merged(depth)
        _RUNS[depth] = (autograde(NOTEBOOKS[depth], submissions, tmp_path_factory.mktemp(f"{depth}-grading")), who)
    return _RUNS[depth]


class SuiteView:
    """One suite's students in its depth's shared run, by the suite's own names."""

    def __init__(self, module: str, depth: str, tmp_path_factory):
        self.depth = depth
        self.run, who = graded_run(depth, tmp_path_factory)
        self.ids = {student: sid for (mod, student), sid in who.items() if mod == module}
        self.max_scores = self.run.max_scores
        self.scores = {student: self.run.scores[sid] for student, sid in self.ids.items()}

    def lost(self, student: str) -> set[str]:
        return self.run.lost(self.ids[student])

    def shown(self, student: str, grade_ids, limit: int | None = 1200) -> dict[str, str]:
        """What these test cells showed for the student (:meth:`Graded.shown`)."""
        return self.run.shown(self.ids[student], grade_ids, limit)

    def notebook(self, student: str) -> Path:
        """The student's autograded notebook (its outputs are what the feedback shows)."""
        return self.run.notebook(self.ids[student], NOTEBOOKS[self.depth].stem)
