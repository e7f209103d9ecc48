"""`python -m hub`'s command line where it is cheap: argument errors, what a user who is not root
is told (as `nobody` when the tests run as root), and `make hub-stop` with nothing running.
The real serve/stop path, which needs root and users, is in tests/test_hub.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hub import course_hub
from tests.browser_support import ROOT

NOBODY = 65534


def run(args: list[str], cwd: Path = ROOT, python: str = sys.executable, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "hub", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, **kw)


@pytest.mark.parametrize("args, error", [
    ([], "the following arguments are required: cmd"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["serve", "--port", "eighty"], "argument --port: invalid int value: 'eighty'"),
    (["users", "--delete"], "unrecognized arguments: --delete"),
    (["--learners", ",", "users"], "give the learners' user names, separated by commas"),
    # the form that used to swallow the command: told which word is not a command
    (["--learners", "a", "b", "serve"], "invalid choice: 'b'"),
])
def test_argument_errors_exit_2_saying_what_is_wrong(args, error):
    proc = run(args)
    assert proc.returncode == 2 and error in proc.stderr and "usage: python -m hub" in proc.stderr, proc


@pytest.fixture(scope="module")
def as_someone_else():
    """How to run `python -m hub` as a user who is not root: ourselves, or `nobody` from a copy
    of hub/ they can read (the checkout may be private) with the system's Python."""
    if os.geteuid() != 0:
        yield lambda args: run(args)
        return
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python, "no /usr/bin/python3 to run the hub's CLI as nobody"
    copy = Path(tempfile.mkdtemp(prefix="hub-cli-", dir="/tmp"))
    try:
        shutil.copytree(ROOT / "hub", copy / "hub", ignore=shutil.ignore_patterns(
            "node_modules", "__pycache__", "*.json", "*.yaml"))
        for path in [copy, *copy.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        yield lambda args: run(args, cwd=copy, python=python, user=NOBODY, group=NOBODY, extra_groups=[],
                               env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    finally:
        shutil.rmtree(copy, ignore_errors=True)


@pytest.mark.parametrize("args, said", [
    (["serve"], course_hub.NOT_ROOT),
    (["serve", "--users"], course_hub.NOT_ROOT),
    (["users", "--create"], f"cannot create users: {course_hub.NOT_ROOT}"),
    (["stop"], f"cannot stop the hub: {course_hub.NOT_ROOT}"),
])
def test_a_user_who_is_not_root_is_told_so(as_someone_else, args, said):
    proc = as_someone_else(args)
    assert proc.returncode == 1 and said in proc.stdout, proc
    assert "Traceback" not in proc.stderr, proc


def test_users_lists_who_is_missing(as_someone_else):
    proc = as_someone_else(["--instructor", "no-such-teacher-x", "--learners", "no-such-x1,no-such-x2", "users"])
    assert proc.returncode == 0, proc
    assert proc.stdout.splitlines() == ["[hub] no-such-teacher-x: missing", "[hub] no-such-x1: missing",
                                        "[hub] no-such-x2: missing"]


@pytest.mark.skipif(os.geteuid() != 0, reason="stop as a user who is not root is covered above; "
                    "this one reads the root-only state folder")
def test_make_hub_stop_with_nothing_running_fails_saying_so(tmp_path):
    proc = subprocess.run(["make", "-s", "hub-stop", f"HUB_ROOT={tmp_path}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0, proc
    assert f"[hub] nothing to stop: no hub was started from {tmp_path}" in proc.stdout, proc


@pytest.mark.skipif(os.geteuid() != 0, reason="the hub's environment is built as root (make hub-deps)")
def test_the_hub_environment_needs_a_python_every_user_can_run(tmp_path):
    """A Python in a private folder (as a pyenv under /root) cannot run the learners' servers:
    building the hub's environment from it stops before anything is made, saying what to use."""
    private = tmp_path / "private"
    private.mkdir()
    os.chmod(private, 0o700)
    (private / "python3.11").symlink_to(os.path.realpath(sys.executable))
    env = tmp_path / "venv"
    proc = run(["--env", str(env), "env"], env={**os.environ, "COURSE_HUB_PYTHON": str(private / "python3.11")})
    assert proc.returncode == 1, proc
    assert "but an unprivileged user cannot run it" in proc.stderr and "COURSE_HUB_PYTHON=" in proc.stderr, proc
    assert not env.exists()
    make = subprocess.run(["make", "-s", "hub-deps", "HUB_PYTHON=/nonexistent/python3.11", f"HUB_ROOT={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert make.returncode != 0, make
    assert "/nonexistent/python3.11 is not a Python 3.11 with venv" in make.stdout + make.stderr, make
