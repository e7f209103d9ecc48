"""The repository's own promises: pinned, consistent environment files; a config with no machine paths."""

from __future__ import annotations

import re

import yaml

from tests.conftest import ROOT

CONDA_NAMES = {"torch": "pytorch"}  # pip name -> conda-forge name, where they differ


def pip_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            assert "==" in line, f"requirements.txt must pin exact versions: {line!r}"
            name, version = (s.strip() for s in line.split("=="))
            pins[CONDA_NAMES.get(name.lower(), name.lower())] = version
    return pins


def conda_pins() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    pins = {}
    for dep in env["dependencies"]:
        assert isinstance(dep, str), "keep every package in the conda list, pinned"
        name, _, version = dep.partition("=")
        if name in ("python", "pip"):
            continue
        pins[name.lower()] = version
    return pins


def test_environment_yml_matches_requirements():
    assert conda_pins() == pip_pins()


def test_environment_yml_is_python_311():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python=3.11" in env["dependencies"]


def test_the_installed_torch_is_the_pinned_cpu_build():
    """`make` installed exactly the pinned torch, and a CPU build (an unpinned or ranged torch pulls
    a multi-GB CUDA build from the registry)."""
    import torch

    assert torch.__version__.split("+")[0] == pip_pins()["pytorch"], torch.__version__
    assert torch.version.cuda is None, f"a CUDA build of torch was installed ({torch.version.cuda})"


def test_nbgrader_config_has_no_machine_paths():
    text = (ROOT / "nbgrader_config.py").read_text()
    assert 'source_directory = "solutions"' in text
    assert 'release_directory = "notebooks"' in text
    assert not re.search(r"[\"'](/home|/root|/work|/tmp|[A-Z]:\\\\)", text)


def test_readme_starts_with_the_two_commands():
    lines = [l.strip() for l in (ROOT / "README.md").read_text().splitlines()]
    commands = [l for l in lines if l in ("make lab", "make test")]
    assert commands[:2] == ["make lab", "make test"]
    first_code = next(i for i, l in enumerate(lines) if l.startswith("```"))
    assert lines[first_code + 1: first_code + 3] == ["make lab", "make test"]


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci/run").read_text()
    wf = yaml.safe_load((ROOT / ".github/workflows/ci.yml").read_text())
    steps = [s.get("run", "") for job in wf["jobs"].values() for s in job["steps"]]
    assert any("make test" in s for s in steps)


def test_importing_helpers_changes_nothing():
    """No seeding, no plotting style, no process started at import time."""
    import subprocess
    import sys

    code = (
        "import random, sys; state = random.getstate(); import helpers, helpers.spawn, "
        "helpers.lessons.races, helpers.lessons.figures, helpers.grading, helpers.grading.beginner, helpers.grading.developer; "
        "assert random.getstate() == state; "
        "assert 'matplotlib.pyplot' not in sys.modules; "
        "import multiprocessing.forkserver as f; assert f._forkserver._forkserver_pid is None; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.stdout.strip() == "ok", out.stderr
