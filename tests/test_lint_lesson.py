"""The developer lesson on common mistakes (developer/02) under papermill, with the linter it loads:
each mistake it runs is flagged above the output of the cell that defines it, before that cell
runs; and its "check your own script" section runs the command on the learner's script."""

from __future__ import annotations

import pytest

from tests.conftest import QUICK_ENV, ROOT, session_started
from tests.nbrun import errors

LESSON = ROOT / "solutions" / "developer" / "02_common_mistakes.ipynb"
LEARNER = ROOT / "notebooks" / "developer" / "02_common_mistakes.ipynb"

# the function a mistake cell defines -> the code the linter must print above its output
FLAGGED = {
    "def every_rank_saves(": "ORK102",
    "def save_then_load(": "ORK103",
    "def save_with_barrier_inside(": "ORK101",
    "def others_carry_on(": "ORK101",
    "def logged_step(": "ORK104",
    "def train_until(": "ORK105",
}
CLEAN = ("def rank0_saves(", "def save_with_barrier_outside(", "def one_step_losses(", "def averaged_step(")


@pytest.fixture(scope="module")
def executed():
    """The lesson's one papermill run in the test suite (tests/test_notebooks.py leaves it to this
    module), with the same settings as every other notebook's: QUICK=True, from its own folder.
    The learner's copy is the same notebook (tests/test_notebooks.py checks it), run through the
    site's execution step once in this test run, so the site's build takes it from the cache."""
    import nbformat

    from course_tools import site

    with pytest.MonkeyPatch.context() as mp:
        for name, value in QUICK_ENV.items():
            mp.setenv(name, value)
        path, how, seconds = site.execute(LEARNER, fresh_after=session_started())
    print(f"{LESSON.name}: {seconds:.1f} s ({how})")
    return nbformat.read(path, as_version=4)


@pytest.mark.notebook
def test_the_lesson_executes_clean(executed):
    assert not errors(executed)


def streams(cell, name):
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == name)


def cell_defining(nb, head):
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and head in c.source]
    return cell


@pytest.mark.notebook
def test_the_lesson_loads_the_extension(executed):
    loads = [i for i, c in enumerate(executed.cells) if c.cell_type == "code" and "%load_ext helpers.lint" in c.source]
    first_mistake = next(i for i, c in enumerate(executed.cells) if "def every_rank_saves(" in c.source)
    assert len(loads) == 1 and loads[0] < first_mistake


@pytest.mark.notebook
@pytest.mark.parametrize("head", list(FLAGGED))
def test_each_mistake_is_flagged_before_it_runs(executed, head):
    cell = cell_defining(executed, head)
    first = cell.outputs[0]
    assert first.output_type == "stream" and first.name == "stderr"       # above anything the cell prints
    assert first.text.startswith("helpers.lint, before this cell runs:")
    codes = {w for w in first.text.split() if w.startswith("ORK")}
    assert codes == {FLAGGED[head]}


@pytest.mark.notebook
@pytest.mark.parametrize("head", CLEAN)
def test_the_fixes_are_not_flagged(executed, head):
    assert "helpers.lint" not in streams(cell_defining(executed, head), "stderr")


@pytest.mark.notebook
def test_check_your_own_script(executed):
    i = next(i for i, c in enumerate(executed.cells) if c.cell_type == "markdown"
             and c.source.startswith("## Check your own script"))
    write, _, check = executed.cells[i + 1], executed.cells[i + 2], executed.cells[i + 3]
    assert write.source.startswith("%%writefile {WORKDIR}/my_train.py")
    out = streams(check, "stdout")
    assert "my_train.py:8:1: ORK104" in out and "my_train.py:9:1: ORK102" in out
    assert "(exit status 1)" in out
