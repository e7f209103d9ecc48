"""The instructor tools `make` runs: `make course` (course_tools.run_notebooks), `make release`
(course_tools.release) and the browser finder, each run for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import nbformat
import pytest

from tests.conftest import ROOT


def _course(*args, tmp_path):
    return subprocess.run([sys.executable, "-m", "course_tools.run_notebooks", "--quick",
                           "--out", str(tmp_path), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.notebook
def test_make_course_executes_the_chosen_notebook_and_tabulates_it(tmp_path):
    proc = _course("--only", "start/00", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = next(l for l in proc.stdout.splitlines() if l.startswith("solutions/start/00_start_here"))
    assert row.split()[-1] == "ok" and "1 ok, 0 failed" in proc.stdout
    executed = nbformat.read(tmp_path / "solutions/start/00_start_here.ipynb", as_version=4)
    assert any(c.get("outputs") for c in executed.cells if c.cell_type == "code")


@pytest.mark.notebook
def test_make_course_reports_a_failing_notebook_and_exits_1(tmp_path):
    """The learner version of an exercises notebook fails at its first test (the answers are empty)."""
    proc = _course("--tree", "notebooks", "--only", "beginner/03_exercises", tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = next(l for l in proc.stdout.splitlines() if l.startswith("notebooks/beginner/03_exercises"))
    assert "error in cell" in row, row
    assert "0 ok, 1 failed" in proc.stdout


def test_make_course_flags_notebooks_over_the_budget_and_counts_them():
    """The table's rows and last lines, from times given here (no notebook is run): a notebook over the
    budget is flagged, the count names it, and one within it (or exactly at it) is not."""
    from course_tools.run_notebooks import BUDGET, row_line, summary_lines

    assert BUDGET == 60
    rows = [("solutions/a.ipynb", 12.5, "ok"), ("solutions/b.ipynb", 60.0, "ok"),
            ("notebooks/c.ipynb", 71.3, "ok"), ("notebooks/d.ipynb", 90.0, "error in cell 4: ValueError")]
    lines = [row_line(*row) for row in rows]
    assert lines[0].split() == ["solutions/a.ipynb", "12.5", "s", "ok"]
    assert "OVER BUDGET" not in lines[0] + lines[1]
    assert lines[2].endswith("ok  OVER BUDGET (> 60 s)") and lines[3].endswith("ValueError  OVER BUDGET (> 60 s)")
    total, over = summary_lines(rows)
    assert total.split()[1:] == ["233.8", "s", "3", "ok,", "1", "failed"]
    assert over == "2 of 4 notebooks over the 60 s budget: notebooks/c.ipynb, notebooks/d.ipynb"
    assert summary_lines(rows[:2])[1] == "0 of 2 notebooks over the 60 s budget"
    assert "OVER BUDGET" in row_line("x.ipynb", 31, "ok", budget=30)


def test_make_course_refuses_a_filter_that_matches_nothing(tmp_path):
    proc = _course("--only", "no-such-notebook", tmp_path=tmp_path)
    assert proc.returncode == 2 and "no notebook matches" in proc.stderr


def _release(*args):
    return subprocess.run([sys.executable, "-m", "course_tools.release", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_make_release_replaces_depths_and_leaves_other_folders_alone(tmp_path):
    dest = tmp_path / "release"
    (dest / "mine").mkdir(parents=True)
    (dest / "mine" / "notes.ipynb").write_text(json.dumps({"cells": [], "metadata": {}}))
    (dest / "mine" / "keep.txt").write_text("not the course's")
    stale = dest / "old_depth"  # a depth released earlier, since removed from solutions/
    stale.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "x = 1", metadata={"nbgrader": {"grade": False, "solution": True, "grade_id": "x"}})])
    nbformat.write(nb, stale / "01_gone.ipynb")
    (dest / "beginner").mkdir()
    (dest / "beginner" / "99_leftover.ipynb").write_text("{}")

    proc = _release("--dest", str(dest), "beginner")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (dest / "mine" / "keep.txt").read_text() == "not the course's"
    assert (dest / "mine" / "notes.ipynb").exists()
    assert not stale.exists()
    released = sorted(p.name for p in (dest / "beginner").iterdir())
    assert released == sorted(p.name for p in (ROOT / "notebooks" / "beginner").iterdir()
                              if p.name != "__pycache__")
    for name in released:
        assert (dest / "beginner" / name).read_bytes() == (ROOT / "notebooks/beginner" / name).read_bytes()


def test_make_release_refuses_an_unknown_depth(tmp_path):
    proc = _release("--dest", str(tmp_path), "expert")
    assert proc.returncode == 2 and "unknown depth(s) expert" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def _find_browser(**env):
    full = {k: v for k, v in os.environ.items() if k != "COURSE_CHROMIUM"}
    full.update(env)
    return subprocess.run([sys.executable, "-m", "course_tools.browser"], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=60)


def test_browser_finder_honours_course_chromium(tmp_path):
    fake = tmp_path / "my-chrome"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    proc = _find_browser(COURSE_CHROMIUM=str(fake))
    assert proc.returncode == 0 and proc.stdout.strip() == str(fake)
    proc = _find_browser(COURSE_CHROMIUM=str(tmp_path / "missing"))
    assert proc.returncode == 1 and "is not an executable" in proc.stderr


def test_browser_finder_searches_path_for_the_usual_names(tmp_path, monkeypatch):
    """Where Debian's chromium is absent (GitHub's runners), a Chrome on PATH is found."""
    from course_tools.browser import CANDIDATES, find_chromium

    fake = tmp_path / "google-chrome"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.delenv("COURSE_CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    without_debian = [c for c in CANDIDATES if not os.path.isabs(c)]
    assert find_chromium(without_debian) == str(fake)
    fake.unlink()
    assert find_chromium(without_debian) is None


def test_graded_shown_gives_a_cells_output_and_says_why_when_it_cannot(tmp_path):
    """A failing grading test's message shows the cells' outputs; a cell it cannot read (no such
    grade id, no notebook) is named with the reason instead of failing the message itself."""
    from course_tools.temp_course import Graded

    cell = nbformat.v4.new_code_cell("check()", metadata={"nbgrader": {"grade_id": "test_a"}})
    cell.outputs = [nbformat.v4.new_output("error", ename="CheckFailed", evalue="rank 1 hung", traceback=[])]
    folder = tmp_path / "autograded" / "s1" / "beginner"
    folder.mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), folder / "03_exercises.ipynb")
    graded = Graded({"s1": {"test_a": 0.0}, "s2": {"test_a": 0.0}}, {"test_a": 1.0}, 0.0, tmp_path,
                    {"test_a": "03_exercises"}, "beginner")
    shown = graded.shown("s1", {"test_a", "test_b"})
    assert "rank 1 hung" in shown["test_a"]
    assert shown["test_b"].startswith("(nothing to show: KeyError")
    assert "FileNotFoundError" in graded.shown("s2", ["test_a"])["test_a"]
