"""The course's instructor tools: what only ``make`` and nbgrader run, never a notebook.

* :mod:`course_tools.release` -- ``make release``: ``solutions/`` -> ``notebooks/``.
* :mod:`course_tools.run_notebooks` -- ``make course``: every notebook under papermill.
* :mod:`course_tools.selfcheck` -- ``make check``: grade your own copy with the real grader.
* :mod:`course_tools.temp_course` -- a throw-away nbgrader course (``make check``, the tests).
* :mod:`course_tools.autograde` -- the execute step ``nbgrader autograde`` runs (``nbgrader_config.py``).

This module holds the one copy of what they share: where the course is, the environment
nbgrader needs, how to run it, which depths exist, and which notebooks and cells are graded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "venv_env", "nbgrader", "depths", "has_graded_cells", "is_graded_cell",
           "is_answer_cell", "answer_ids"]

#: The course's root folder (where ``nbgrader_config.py`` and ``solutions/`` are).
ROOT = Path(__file__).resolve().parent.parent


def venv_env(**extra) -> dict:
    """This environment, with this interpreter's ``bin/`` first on PATH (nbgrader runs ``alembic``)."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


def nbgrader(*args, cwd: Path, timeout: float = 900, check: bool = True, env=None,
             log_level: str | None = "WARN") -> subprocess.CompletedProcess:
    """Run one nbgrader command; raise with its output if it fails (when ``check``).

    ``log_level=None`` for the commands that take no ``--log-level`` (``validate``).
    """
    cmd = [sys.executable, "-m", "nbgrader", *args]
    if log_level is not None:
        cmd.append(f"--log-level={log_level}")
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env or venv_env())
    if check and proc.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed ({proc.returncode}):\n"
                           f"{proc.stdout}\n{proc.stderr}")
    return proc


def depths(root: Path = ROOT, tree: str = "solutions") -> list[str]:
    """The assignment folders under ``solutions/`` (or ``tree``; one per depth, plus ``start``), in order."""
    return sorted(p.name for p in (root / tree).iterdir()
                  if p.is_dir() and not p.name.startswith((".", "_")))


def _nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_graded_cell(cell) -> bool:
    """A test cell that carries points."""
    return bool(_nbgrader_meta(cell).get("grade"))


def is_answer_cell(cell) -> bool:
    """A cell the learner writes (nbgrader's ``solution`` cells)."""
    return bool(_nbgrader_meta(cell).get("solution"))


def has_graded_cells(nb) -> bool:
    """An exercises notebook (lesson notebooks carry no graded cells)."""
    return any(is_graded_cell(c) for c in nb.cells)


def answer_ids(nb) -> list[str]:
    """The ``grade_id`` of every answer cell, in order."""
    return [_nbgrader_meta(c)["grade_id"] for c in nb.cells if is_answer_cell(c)]
