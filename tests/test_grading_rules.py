"""The grader's rules, without running anything: what the grading kernel keeps of a learner's cell
instead of running it (helpers.grading.answers.record), which cells a rank runs for an answer, and
where the pools' time limit comes from (helpers.grading)."""

from __future__ import annotations

import pytest
from traitlets.config.loader import PyFileConfigLoader

from helpers.grading import answers
from tests.conftest import ROOT

SETUP = "import os\nimport torch.distributed as dist\nfrom helpers.lessons.interact import quick\nQUICK = quick(QUICK)\n"


@pytest.fixture
def cells():
    """A fresh record of cells (the module keeps one per kernel)."""
    saved = dict(answers._CELLS)
    answers._CELLS.clear()
    yield answers._CELLS
    answers._CELLS.clear()
    answers._CELLS.update(saved)


def test_a_learner_cell_is_recorded_not_run(cells):
    ns = {}
    source = ("import os\nos._exit(1)\nwhile True:\n    pass\n@staticmethod\ndef save_once(obj, path=print('now')):\n"
              "    pass\nclass _Rank(object):\n    print('now')\nN = len([1])\nQUICK = True\n__builtins__ = {}\n")
    answers.record(3, source, ns)  # would end this process if it ran anything
    assert {k: type(v).__name__ for k, v in ns.items()} == {
        "save_once": "Recorded", "_Rank": "Recorded", "N": "Recorded", "QUICK": "bool"}
    assert ns["QUICK"] is True and ns["save_once"].cell == 3  # plain values are read, not run
    assert cells[3].source == source


def test_a_cell_that_is_not_python_says_where():
    with pytest.raises(SyntaxError, match="notebook commands such as `!pip`") as e:
        answers.record(5, "!pip install cheats\n", {})
    assert e.value.filename == "/answer-cells/cell_5.py"


def test_a_rank_runs_the_setup_and_what_the_answer_needs_not_the_other_answers(cells):
    ns = {}
    answers.record(1, "QUICK = False\n", ns)
    answers.record(2, SETUP, ns, trusted=True)
    answers.record(4, "def helper(x):\n    return x\nwhile True:\n    pass\n", ns)
    answers.record(6, "import logging\nclass _Rank(logging.Filter):\n    pass\n"
                      "def save_once(obj, path):\n    return helper(dist.get_rank())\n", ns)
    answers.record(8, "def combined_average(loss, count):\n    return os.getpid()\n", ns)
    program = lambda name: [c.index for c in answers._program(ns[name])]  # noqa: E731
    assert program("save_once") == [1, 2, 4, 6]  # QUICK for the setup cell, helper for the answer
    assert program("combined_average") == [1, 2, 8]  # os is the setup cell's: no other answer runs
    assert program("helper") == [1, 2, 4]


def test_the_pool_limit_is_half_the_configured_cell_limit(monkeypatch):
    from helpers.grading import cell_timeout, pool_timeout

    monkeypatch.delenv("COURSE_CELL_TIMEOUT", raising=False)
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert cell_timeout() == config.Execute.timeout
    assert pool_timeout() == config.Execute.timeout / 2
    monkeypatch.setenv("COURSE_CELL_TIMEOUT", "12")  # what the grader's execute step sets
    assert pool_timeout() == 6
