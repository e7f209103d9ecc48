"""The learner's side of grading: the self-check (`make check`), `nbgrader validate`, and the copy of
the course handed to learners (`make learner-bundle`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import nbformat
import pytest

from course_tools import nbgrader
from tests.conftest import ROOT
from tests.grading_runs import NOTEBOOKS
from tests.nbgrade import fill, reference_answers

pytestmark = pytest.mark.grading

COURSE_ID = "one-rank"
GRADED_SOURCES = [NOTEBOOKS[d] for d in sorted(NOTEBOOKS)]


# ----------------------------------------------------------------------------- the learner's side


def test_make_check_grades_a_learner_copy_and_points_to_feedback(tmp_path):
    depth = "beginner"
    mine = tmp_path / "mine"
    shutil.copytree(ROOT / "notebooks" / depth, mine)
    source = NOTEBOOKS[depth]
    answers = reference_answers(source)
    first = next(iter(answers))  # answer only the first exercise
    nbformat.write(fill(mine / source.name, {first: answers[first]}), mine / source.name)
    out = subprocess.run([sys.executable, "-m", "course_tools.selfcheck", depth, "--notebooks", str(mine),
                          "--feedback", str(tmp_path / "fb")], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^\S+\.ipynb: (\w+)\s+([\d.]+) / ([\d.]+)", out.stdout, re.M)}
    assert set(rows) == set(answers), out.stdout
    assert rows[first][0] == rows[first][1] > 0
    assert all(score == 0 for name, (score, _) in rows.items() if name != first)
    assert str(tmp_path / "fb") in out.stdout
    assert (tmp_path / "fb" / source.with_suffix(".html").name).exists()


@pytest.mark.parametrize("source", GRADED_SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_validate_passes_on_solutions_and_fails_on_the_starter(source):
    depth = source.parent.name
    ok = nbgrader("validate", str(source), cwd=source.parent, log_level=None)
    assert "Success! Your notebook passes all the tests." in ok.stdout, ok.stdout[-3000:]
    starter = ROOT / "notebooks" / depth / source.name
    inv = nbgrader("validate", "--invert", str(starter), cwd=starter.parent, log_level=None, check=False)
    assert "Success! The notebook does not pass any tests." in inv.stdout, inv.stdout[-3000:]



def test_the_learner_bundle_gives_nothing_away_and_checks_with_the_visible_tests(tmp_path):
    from course_tools.learner_bundle import build

    bundle = build(tmp_path / "learner")
    assert not (bundle / "solutions").exists() and (bundle / "notebooks" / "beginner").is_dir()
    for path in bundle.rglob("*.ipynb"):
        text = path.read_text()
        assert "BEGIN HIDDEN TESTS" not in text and "BEGIN SOLUTION" not in text, path
    source = NOTEBOOKS["beginner"]
    mine = tmp_path / "mine"
    shutil.copytree(bundle / "notebooks" / "beginner", mine)
    nbformat.write(fill(mine / source.name, reference_answers(source)), mine / source.name)
    out = subprocess.run([sys.executable, "-m", "course_tools.selfcheck", "beginner", "--notebooks", str(mine),
                          "--feedback", str(tmp_path / "fb")], capture_output=True, text=True, cwd=bundle,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "hidden tests (the same ideas on other sizes and inputs) run when your instructor grades" in out.stdout
    total = re.search(r"^total\s+([\d.]+) / ([\d.]+)", out.stdout, re.M)
    assert total and total.group(1) == total.group(2) != "0", out.stdout
    page = (tmp_path / "fb" / "03_exercises.html").read_text()
    assert "world_size=5" not in page  # no hidden test was there to run
