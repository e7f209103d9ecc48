"""The course as a learner sees it: JupyterLab in headless Chromium, every learner notebook run for real.

For each notebook discovered under notebooks/ (a new lesson is covered with no edit here):
open it in Lab, wait for its kernel, Run All, wait for the run to finish, then check that
- every cell ran, and no cell outside the graded ones shows an error (the learner's answers are
  empty, so graded cells may fail; the copy tags them ``raises-exception`` so Run All goes on);
- the lesson's plots are on the page as ``data:image/png`` images;
- each ipywidgets control renders and, moved the way a learner moves it (slider handle + arrow key,
  dropdown choice, toggle click), changes the output it drives;
- a pool's per-rank output (``[rank 0] ...``) is in the page;
- every "Predict first" widget starts unanswered and, when a choice is clicked, says whether it was right
  and why; every review answer (a ``<details>`` block) starts collapsed, and opens when its question is
  clicked; a lesson (a notebook without graded cells) has predictions and review answers at all.
A screenshot of each notebook after its run goes to build/screenshots/<depth>__<name>.png, with a
.json of what was measured beside it. nbgrader's lab extensions are checked too: a learner's
Assignment List shows the assignments released to a temporary exchange (and fetches one), and the
instructor's Formgrader lists the course's assignments.

The server serves a temporary copy of the course with its own config, data, runtime, workspace,
IPython and matplotlib dirs and COURSE_QUICK=1 in its environment; it and everything it started
are stopped at the end, pass or fail. Needs /usr/bin/chromium (`make test` installs Debian's
package; COURSE_CHROMIUM=/path overrides it) and the Playwright Python package; never a browser
downloaded by Playwright. COURSE_BROWSER_TIMEOUT=<seconds> changes the per-notebook limit.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from tests.browser_support import (ROOT, LabServer, NotebookDriver, check_notebook, copy_course,
                                   graded_cells, chromium_session, learner_notebooks,
                                   mark_graded_cells_may_raise, release_assignments)

# The fixtures below are session-scoped: each xdist worker that gets browser tests (they are
# spread over the workers, see tests/conftest.py) starts one Lab and one Chromium, once,
# whatever other tests it runs in between.
pytestmark = [pytest.mark.browser]

NOTEBOOKS = learner_notebooks()
SHOTS = ROOT / "build" / "screenshots"
DEPTHS = sorted({p.parts[1] for p in NOTEBOOKS})  # notebooks/<depth>/... = nbgrader assignments
# Seconds. Generous (2 cores, other work running), but every wait is bounded.
TIMEOUTS = dict(open=120, kernel=180, start=30, run=900, widget=300, redraw=60)
PER_NOTEBOOK = 1500  # pytest-timeout for one notebook (the run, every widget, the screenshot)
LONG_OUTPUT = 40     # lines in one cell's output that make a wall


def shot_name(relpath: Path) -> str:
    return "__".join(relpath.parts[1:]).removesuffix(".ipynb")


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def course(tmp_path_factory):
    """A temporary copy of the course, its assignments released to a temporary exchange."""
    tmp = tmp_path_factory.mktemp("browser")
    copy = copy_course(tmp / "course")
    release_assignments(copy, tmp / "exchange", DEPTHS)
    for rel in NOTEBOOKS:
        mark_graded_cells_may_raise(copy / rel)
    return {"root": copy, "exchange": tmp / "exchange", "state": tmp / "state"}


@pytest.fixture(scope="session")
def lab(course):
    server = LabServer(course["root"], course["state"], exchange=course["exchange"])
    try:
        server.start()
        yield server
    finally:
        killed = server.stop()
        alive = server.leftovers()
        assert not alive, f"processes left behind by JupyterLab: {alive}"
        if killed:
            warnings.warn(f"had to kill what JupyterLab left running: {killed}")


@pytest.fixture(scope="session")
def browser(tmp_path_factory, playwright):
    yield from chromium_session(tmp_path_factory.mktemp("chromium-home"), playwright)


@pytest.fixture
def page(browser, lab):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(60_000)
    try:
        yield context.new_page()
    finally:
        context.close()
        lab.close_sessions()  # kernels outlive their pages


def open_lab(page, lab, wait_for_command: str) -> None:
    page.goto(lab.lab_url(), timeout=TIMEOUTS["open"] * 1000)
    page.wait_for_function(f"() => window.jupyterapp && jupyterapp.commands.hasCommand({wait_for_command!r})",
                           timeout=TIMEOUTS["open"] * 1000)


# ---------------------------------------------------------------------- nbgrader


def test_course_has_learner_notebooks():
    assert Path("notebooks/start/00_start_here.ipynb") in NOTEBOOKS


@pytest.mark.timeout(600)
def test_assignment_list_shows_released_assignments(page, lab, course):
    """A learner's Nbgrader > Assignment List shows every released depth and fetches one."""
    open_lab(page, lab, "nbgrader:open-assignment-list")
    page.evaluate("() => jupyterapp.commands.execute('nbgrader:open-assignment-list')")
    released = page.locator("#released_assignments_list")
    for depth in DEPTHS:
        released.locator(".list_item", has_text=depth).first.wait_for(timeout=120_000)
    text = released.inner_text()
    assert "one-rank" in text, text
    item = released.locator(".list_item", has_text="start").first
    item.get_by_role("button", name="Fetch").click()
    fetched = page.locator("#fetched_assignments_list")
    fetched.locator(".list_item", has_text="start").first.wait_for(timeout=120_000)
    assert (course["root"] / "start" / "00_start_here.ipynb").is_file(), \
        "Fetch did not put the assignment into the learner's folder"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "nbgrader__assignment_list.png"))


@pytest.mark.timeout(600)
def test_formgrader_lists_the_course_assignments(page, lab):
    """The instructor's Nbgrader > Formgrader tab loads and lists every assignment of solutions/."""
    open_lab(page, lab, "nbgrader:open-formgrader")
    page.evaluate("() => jupyterapp.commands.execute('nbgrader:open-formgrader')")
    page.wait_for_selector('iframe[src$="/formgrader"]', timeout=120_000)
    frame = page.frame_locator('iframe[src$="/formgrader"]')
    table = frame.locator("table")
    sources = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())
    for name in sources:
        table.locator("tr", has_text=name).first.wait_for(timeout=120_000)
    for depth in DEPTHS:
        row = table.locator("tr", has_text=depth).first
        assert "released" in row.inner_text(), f"formgrader does not show {depth} as released"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "nbgrader__formgrader.png"))


# ---------------------------------------------------------------------- every learner notebook


@pytest.mark.timeout(int(os.environ.get("COURSE_BROWSER_TIMEOUT", PER_NOTEBOOK)))
@pytest.mark.parametrize("relpath", NOTEBOOKS, ids=str)
def test_notebook_in_jupyterlab(relpath, page, lab, course):
    """Run All in Lab: every cell runs, errors only in graded cells, plots shown, widgets drive outputs."""
    driver = NotebookDriver(page, lab, str(relpath), TIMEOUTS)
    shot = SHOTS / f"{shot_name(relpath)}.png"
    report = check_notebook(driver, course["root"] / relpath, shot, long_output=LONG_OUTPUT)
    if not graded_cells(course["root"] / relpath):  # a lesson: it asks, and it reviews
        assert report.get("predictions", 0) > 0, f"{relpath}: no prediction widget on the page"
        assert report.get("review_answers", 0) >= 3, f"{relpath}: fewer than 3 review answers on the page"
    for note in report["notes"]:
        warnings.warn(f"{relpath}: {note}")
    print(f"{relpath}: run {report.get('run_seconds')} s, total {report['total_seconds']} s, "
          f"{len(report['widget_moves'])} widget moves")
    assert not report["problems"], (f"{relpath} in JupyterLab (screenshot {shot}):\n  "
                                    + "\n  ".join(report["problems"]))
