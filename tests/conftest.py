"""Shared fixtures: where things are, and how to execute a notebook for real."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from course_tools import ROOT

sys.path.insert(0, str(ROOT))  # `helpers` is installed editable; this makes `tests.*` importable too

SOLUTIONS = sorted((ROOT / "solutions").rglob("*.ipynb"))
RELEASED = sorted((ROOT / "notebooks").rglob("*.ipynb"))


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


# Every temporary file of the run (tests, kernels, ranks, graders, browsers: they all honour
# TMPDIR) goes into one folder made for this run. At the end, the controller lists what is still
# there besides pytest's own tmp_path folders: each is something that did not clean up after
# itself, and fails the run. Then the folder is removed, so a run leaves nothing behind.
_RUN_TMP = "COURSE_TEST_TMPDIR"
# When the run started (the controller's clock, inherited by its xdist workers): a notebook run
# cached before then is not taken as this run's (tests/test_notebooks.py, course_tools.site.execute).
_STARTED = "COURSE_TEST_STARTED"


def session_started() -> float:
    """The ``time.time()`` at which this test run started."""
    return float(os.environ[_STARTED])


def pytest_configure(config):
    if hasattr(config, "workerinput") or os.environ.get(_RUN_TMP):
        return  # an xdist worker: it inherited the controller's folder
    os.environ[_STARTED] = repr(time.time())
    run_tmp = tempfile.mkdtemp(prefix="course-tests-")
    os.environ[_RUN_TMP] = os.environ["TMPDIR"] = run_tmp
    tempfile.tempdir = None  # forget the cached default
    config._course_run_tmp = run_tmp


# pytest's own tmp_path folders, and torch's compile cache (made once per user by importing
# torch._dynamo, reused by every later process: a cache, not a leak).
_NOT_LEFTOVERS = ("pytest-of-", "torchinductor_")
#: Leftovers fail the run (every part of the course cleans up after itself).
_LEFTOVERS_FAIL = True


def _leftovers(run_tmp: str) -> list[str]:
    return sorted(name for name in os.listdir(run_tmp) if not name.startswith(_NOT_LEFTOVERS))


def pytest_sessionfinish(session, exitstatus):
    run_tmp = getattr(session.config, "_course_run_tmp", None)
    if not run_tmp or not os.path.isdir(run_tmp):
        return
    left = _leftovers(run_tmp)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"temporary files left behind by the run (each should have been "
                                f"removed by what made it): {left}", red=True)
        if _LEFTOVERS_FAIL and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config):
    run_tmp = getattr(config, "_course_run_tmp", None)
    if run_tmp:
        shutil.rmtree(run_tmp, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_rank_left_behind():
    """Every test ends with no pool process alive in this test process."""
    yield
    from helpers.spawn import live_ranks

    left = live_ranks()
    assert left == [], f"rank processes left behind: {left}"


@pytest.fixture(scope="session")
def playwright():
    """The test process's one Playwright, shared by every browser test (each launches its own
    Chromium from it). Its sync API refuses to start a second one in a thread while the first
    lives, and the browser test keeps its Chromium for the whole session."""
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    yield pw
    pw.stop()


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt in this process, as in a kernel running a cell, whatever
    the run inherited: a command started in the background by a shell starts with SIGINT
    ignored, and an ignored interrupt would leave an interrupt test waiting for its timeout."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


#: The environment of a notebook the suite runs: the smallest sizes, no deprecation noise.
QUICK_ENV = {"COURSE_QUICK": "1", "PYTHONWARNINGS": "ignore::DeprecationWarning"}


@pytest.fixture
def quick_env(monkeypatch):
    for name, value in QUICK_ENV.items():
        monkeypatch.setenv(name, value)
    return dict(os.environ)


@pytest.fixture(scope="session", autouse=True)
def _repository_stays_clean():
    """Nothing a test runs (notebooks, graders, pools) writes into solutions/ or notebooks/."""
    import subprocess

    def untracked():
        out = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all",
                              "solutions", "notebooks"], cwd=ROOT, capture_output=True, text=True)
        return {l for l in out.stdout.splitlines() if "__pycache__" not in l}

    before = untracked()
    yield
    new = untracked() - before
    assert not new, f"tests wrote into the repository: {sorted(new)}"


# Test modules whose tests share an expensive fixture (an autograde of many students, a
# JupyterLab server) must run on one xdist worker each, so that the fixture runs once. xdist's
# `loadgroup` does not group them with the pinned versions (pytest-dev/pytest-xdist#1386), so the
# course schedules by scope itself: a module is one unit of work, except
# - the wrong-answer suites of one depth, which share that depth's autograde run
#   (tests/grading_runs.py): one unit per depth;
# - the modules listed here, whose tests are spread one by one over every worker (notebook runs
#   share nothing; each worker that gets browser tests starts its own Lab and Chromium once, a few
#   seconds, since those fixtures are session-scoped).
_SPREAD_MODULES = {"test_notebooks.py", "test_browser.py"}

# The longest units first, so that no long unit starts last while the other workers are idle
# (collection order is the order units are handed out; xdist's own reorder counts tests, not time).
# The site's build (test_site.py) comes after the notebook runs: test_notebooks.py runs every
# lesson and exercise notebook once, spread over the workers, through the site's cached execution
# step, so the build finds them there (a notebook another worker is still running, it waits for).
_FIRST = ["grading:developer", "grading:beginner", "grading:researcher", "test_grading_flow.py",
          "test_grading_attacks.py", "test_grading_robustness.py", "test_grading_learner.py", "test_grading_xss.py",
          "test_class_grading.py", "test_class_grading_control.py", "test_bench_class.py", "test_hub.py",
          "test_browser.py", "test_notebooks.py", "test_site.py"]


def _unit(nodeid: str) -> str:
    """The unit of work a test belongs to (see above)."""
    from tests.grading_runs import SUITES

    module = nodeid.split("::", 1)[0]
    name = module.rsplit("/", 1)[-1]
    if name in _SPREAD_MODULES:
        return nodeid
    depths = [d for d, mods in SUITES.items() if "tests." + name.removesuffix(".py") in mods]
    if len(depths) == 1:
        return f"grading:{depths[0]}"
    if depths:            # a suite of every depth: its tests are parametrized by depth first
        param = nodeid.partition("[")[2]
        depth = next((d for d in depths if param.startswith(d)), None)
        assert depth, f"{nodeid}: a suite of several depths must be parametrized by depth first"
        return f"grading:{depth}"
    return module


def _rank(unit: str) -> int:
    name = unit.split("::", 1)[0].rsplit("/", 1)[-1]
    return _FIRST.index(name) if name in _FIRST else _FIRST.index(unit) if unit in _FIRST else len(_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: _rank(_unit(item.nodeid)))      # stable: file order within a rank


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False      # keep the order above

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return UnitScheduling(config, log)
