"""The grader's rules, without running anything: which learner cells run during autograde
(course_tools.definitions), and where the pools' time limit comes from (helpers.grading)."""

from __future__ import annotations

import pytest
from traitlets.config.loader import PyFileConfigLoader

from course_tools.definitions import bound_names, problems
from tests.conftest import ROOT

RUN = [
    'def save_once(obj, path):\n    """Doc."""\n    import os\n    os._exit(1)  # a body runs in a worker, later\n',
    "import os\nimport torch.distributed as dist\nfrom torch import save\n",
    "N = 3\nNAMES = ('a', 'b')\nLIMITS = {'x': [1, -2.5]}\n",
    "def f(x, y=3, *args, z=(1, 2), **kw):\n    return x\n",
    'class Helper:\n    """Doc."""\n    SIZE = 4\n    def go(self):\n        return 1\n',
    '"""A docstring."""\npass\n',
]

REFUSED = {
    "import os\nos._exit(1)\n": "line 2: top-level code (expr)",
    "while True:\n    pass\n": "line 1: top-level code (while)",
    "import helpers.grading.beginner as check\ncheck.save_once_only_rank0_writes = print\n":
        "line 2: an assignment that is not `name = plain value`",
    "get_ipython().input_transformers_post.append(lambda lines: ['pass'])\n": "line 1: top-level code (expr)",
    "!pip install cheats\n": "line 1: it is not plain Python",
    "%time f()\n": "line 1: it is not plain Python",
    "@staticmethod\ndef f():\n    pass\n": "the decorator on f()",
    "def f(x=print('now')):\n    pass\n": "a default value of f() that is not a plain value",
    "def f(x: int) -> int:\n    return x\n": "the annotations of f()",
    "class A(object):\n    pass\n": "the decorators, base classes or keywords of class A",
    "class A:\n    print('now')\n": "code in the body of class A",
    "__builtins__ = {}\n": "an assignment that is not `name = plain value`",
    "def __getattr__(name):\n    return 1\n": "the name __getattr__",
    "import antigravity\n": "line 1: import antigravity",
    "from . import secrets\n": "line 1: from . import ...",
    "N = len([1])\n": "an assignment that is not `name = plain value`",
    "try:\n    pass\nexcept Exception:\n    pass\n": "top-level code (try)",
}


@pytest.mark.parametrize("source", RUN)
def test_definitions_run(source):
    assert problems(source) == []


@pytest.mark.parametrize("source", list(REFUSED))
def test_anything_else_is_refused_with_its_line(source):
    found = problems(source)
    assert found and any(REFUSED[source] in p for p in found), found


def test_a_refused_cell_names_what_it_would_have_defined():
    assert bound_names("import os\nos._exit(1)\ndef save_once(obj, path):\n    pass\nN = 3\n") == ["save_once", "N"]
    assert bound_names("!ls\n") == []


def test_every_reference_answer_runs_under_the_rule():
    from course_tools.selfcheck import graded_notebooks
    from course_tools.temp_course import reference_answers

    for depth in ("beginner", "developer", "researcher"):
        for source in graded_notebooks(ROOT / "solutions" / depth):
            for grade_id, answer in reference_answers(source).items():
                assert problems(answer) == [], (source.name, grade_id)


def test_the_pool_limit_is_half_the_configured_cell_limit(monkeypatch):
    from helpers.grading import cell_timeout, pool_timeout

    monkeypatch.delenv("COURSE_CELL_TIMEOUT", raising=False)
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert cell_timeout() == config.Execute.timeout
    assert pool_timeout() == config.Execute.timeout / 2
    monkeypatch.setenv("COURSE_CELL_TIMEOUT", "12")  # what the grader's execute step sets
    assert pool_timeout() == 6
