"""nbgrader end to end as instructors use it, on a local exchange in a temp dir: release -> fetch ->
submit -> collect -> autograde -> feedback -> fetch_feedback."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from course_tools import nbgrader
from course_tools.temp_course import make_course
from tests.grading_runs import NOTEBOOKS, SUITES
from tests.nbgrade import fill, reference_answers

pytestmark = pytest.mark.grading

COURSE_ID = "one-rank"
GRADED_DEPTHS = sorted(NOTEBOOKS)   # every depth with graded cells, as the course discovers them
# The exchange steps are the same for every depth, so the flow goes through one (the beginner
# exercises, the quickest to grade). Every depth's reference answers are graded full marks by its
# wrong-answer suites' shared autograde run (tests/grading_runs.py, its first student) and by
# `make bench`, which grades a whole submission of every depth.
EXERCISE_DEPTHS = ["beginner"]
GRADED_SOURCES = [NOTEBOOKS[d] for d in EXERCISE_DEPTHS]


def test_there_are_exercises_to_grade():
    assert set(EXERCISE_DEPTHS) <= set(GRADED_DEPTHS) and GRADED_SOURCES
    assert set(GRADED_DEPTHS) == {"beginner", "developer", "researcher"} == set(SUITES)


def test_every_depths_first_shared_student_is_the_reference():
    """What the flow leaves to the shared runs: their first submission holds every reference answer."""
    from tests.grading_runs import merged

    for depth in GRADED_DEPTHS:
        submissions, _ = merged(depth)
        assert next(iter(submissions.values())) == reference_answers(NOTEBOOKS[depth]), depth


# ----------------------------------------------------------------------------- the instructor flow


def _feedback_score(html: Path) -> tuple[float, float]:
    text = re.sub(r"<[^>]+>", " ", html.read_text())
    m = re.search(r"Score:\s*([\d.]+)\s*/\s*([\d.]+)", text)
    assert m, f"no score in {html}"
    return float(m.group(1)), float(m.group(2))


def test_release_collect_grade_and_feedback_through_an_exchange(tmp_path):
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    ex = f"--Exchange.root={exchange}"
    course = make_course(tmp_path, EXERCISE_DEPTHS)  # what `make release` does, in a temp copy
    for depth in EXERCISE_DEPTHS:
        nbgrader("release_assignment", depth, ex, cwd=course)

    homes = {s: tmp_path / s for s in ("alice", "bob")}
    # each learner has their own nbgrader cache, as separate accounts would
    cache = {s: f"--Exchange.cache={home / '.nbgrader_cache'}" for s, home in homes.items()}
    for student, home in homes.items():
        home.mkdir()
        for depth in EXERCISE_DEPTHS:
            nbgrader("fetch_assignment", depth, f"--course={COURSE_ID}", ex, cache[student], cwd=home)
            assert (home / depth).is_dir()
    # alice writes every answer (the reference solutions); bob submits what he fetched.
    for source in GRADED_SOURCES:
        mine = homes["alice"] / source.parent.name / source.name
        nbformat.write(fill(mine, reference_answers(source)), mine)
    for student, home in homes.items():
        for depth in EXERCISE_DEPTHS:
            nbgrader("submit", depth, f"--course={COURSE_ID}", ex, cache[student],
                     f"--student={student}", cwd=home)

    for depth in EXERCISE_DEPTHS:
        nbgrader("collect", depth, ex, cwd=course)
        nbgrader("autograde", depth, "--force", cwd=course)
        nbgrader("generate_feedback", depth, "--force", cwd=course)
        nbgrader("release_feedback", depth, ex, cwd=course)

    for student, home in homes.items():
        for depth in EXERCISE_DEPTHS:
            nbgrader("fetch_feedback", depth, f"--course={COURSE_ID}", ex, cache[student],
                     f"--student={student}", cwd=home)
        for source in GRADED_SOURCES:
            pages = list((home / source.parent.name / "feedback").rglob(source.stem + ".html"))
            assert len(pages) == 1, f"{student} got no feedback for {source.name}"
            score, most = _feedback_score(pages[0])
            assert most > 0
            if student == "alice":
                assert score == most, f"reference solutions lost points in {source.name}"
            else:
                assert score == 0, f"untouched {source.name} earned {score}"
