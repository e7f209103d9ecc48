"""During autograde, a failing exercise test also shows the linter's findings on the learner's answer:
checked on a notebook in memory and under a real ``nbgrader autograde`` of the beginner exercises."""

from __future__ import annotations

import nbformat
import pytest

from helpers.lint.feedback import HEADER, lint_feedback
from tests.grading_runs import SuiteView
from tests.nbgrade import cell_output
from tests.test_beginner_grading import (ONLY_RANK0, SAME, SAVE_EVERY_WORKER, SAVE_NO_BARRIER, STUDENTS,
                                         WAITS)


def graded_cell(source, failed=True, **meta):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "t", "points": 1, **meta}
    if failed:
        cell.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="no", traceback=[])]
    return cell


def answer_cell(source):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": False, "solution": True, "grade_id": "a"}
    return cell


def test_only_a_failed_test_of_a_flagged_answer_gets_findings():
    nb = nbformat.v4.new_notebook()
    other = answer_cell("def combined_average(loss, count):\n    return loss\n")
    nb.cells = [answer_cell(SAVE_EVERY_WORKER), other]
    failed = graded_cell('run_answer(check, save_once, name="save_once")')
    text = lint_feedback(nb, failed)
    assert text.startswith(f"{HEADER} (save_once):\n  line 3: ORK102 torch.save runs on every rank")
    assert lint_feedback(nb, graded_cell('run_answer(check, save_once, name="save_once")', failed=False)) is None
    assert lint_feedback(nb, graded_cell("combined_average(1.0, 2)")) is None      # nothing found there
    assert lint_feedback(nb, answer_cell(SAVE_EVERY_WORKER)) is None               # not a test


def submissions(depth: str = "beginner") -> dict:
    """No students of its own: the beginner suite's are read from the depth's shared autograde run
    (tests/grading_runs.py), with the course's real feedback hook."""
    return {}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return SuiteView("tests.test_beginner_grading", "beginner", tmp_path_factory)


def _student(save_once: str) -> str:
    return next(s for s, answers in STUDENTS.items() if answers and answers.get("save_once") == save_once)


@pytest.mark.grading
def test_autograde_feedback_adds_the_findings(graded):
    every_writer, no_barrier = _student(SAVE_EVERY_WORKER), _student(SAVE_NO_BARRIER)
    assert ONLY_RANK0 in graded.lost(every_writer)            # scores are the grader's, unchanged
    every = graded.notebook(every_writer)
    text = cell_output(every, ONLY_RANK0)
    assert "Only worker 0 should write" in text               # the grader's own feedback stays
    assert f"{HEADER} (save_once):" in text and "ORK102 torch.save runs on every rank" in text
    assert HEADER not in cell_output(every, SAME)             # a passing test: nothing added
    assert WAITS in graded.lost(no_barrier)
    assert HEADER not in cell_output(graded.notebook(no_barrier), WAITS)   # failed, but the linter finds nothing
