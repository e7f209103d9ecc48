"""The course's execute step for ``nbgrader autograde``: bounded, honest, and clean.

Configured in ``nbgrader_config.py`` in place of nbgrader's own ``Execute``; explained in the
README's instructor section. It changes four things:

* **Only notebooks with graded cells run.** The lesson notebooks of a depth carry no tests;
  executing their demos for every submission would cost minutes and grade nothing.
* **A kernel that dies does not hand out points.** nbgrader's stock behaviour when an answer
  kills the kernel (``os._exit``, a segfault) is to abort the whole notebook
  (jupyter/nbgrader#427). Here the cell that killed it gets an error saying so, every later
  cell gets an error "not run: the kernel died in cell N", so no later test counts as
  passed, and the tests that passed before it keep their points.
* **No process outlives grading.** Every process the kernel started (directly or through
  its children) is killed when the notebook is done, whatever the answer did.
* **Nothing is written into the course.** The kernel runs in a fresh temporary folder that
  is deleted afterwards, so files an answer writes do not land in ``autograded/``.

Per-cell time is bounded by ``Execute.timeout`` (the kernel is interrupted and the cell
fails); the kernel is told that limit (``COURSE_CELL_TIMEOUT``), and each pool a test runs
gets half of it (``helpers.grading.pool_timeout``).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import psutil
from nbclient.exceptions import DeadKernelError
from nbclient.util import run_sync
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute

from course_tools import has_graded_cells
from helpers.lint.feedback import add_lint_feedback

__all__ = ["CourseExecute"]


def _error(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=[f"{ename}: {evalue}"])


class CourseExecute(Execute):
    """nbgrader's ``Execute``, made safe for distributed answers (see the module docstring)."""

    def preprocess(self, nb, resources=None, km=None):
        if not has_graded_cells(nb):
            self.log.info("No graded cells: this lesson notebook is not executed for grading.")
            return nb, resources
        resources = resources if resources is not None else {}
        meta = resources.setdefault("metadata", {})
        original_path = meta.get("path")
        workdir = tempfile.mkdtemp(prefix="course-grading-")
        meta["path"] = workdir
        self._dead_at = None
        self._kernel_family: dict[int, psutil.Process] = {}
        try:
            return super().preprocess(nb, resources, km)
        finally:
            self._kill_family()
            if original_path is None:
                meta.pop("path", None)
            else:
                meta["path"] = original_path
            shutil.rmtree(workdir, ignore_errors=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, self.resources
        if self._dead_at is not None:
            cell.outputs = [_error(
                "KernelDied",
                f"not run: the kernel died in cell {self._dead_at} (an answer called os._exit, "
                "crashed the interpreter, or was killed), so this cell earns no points.")]
            return cell, self.resources
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
            add_lint_feedback(self.nb, cell)  # a failed test also shows the linter's findings
            return cell, resources
        except DeadKernelError:
            self._dead_at = index
            cell.outputs.append(_error(
                "KernelDied",
                "the kernel died while running this cell: the code called os._exit(), crashed "
                "the Python interpreter, or was killed. Nothing after this cell was run."))
            return cell, self.resources
        finally:
            self._remember_family()

    async def async_start_new_kernel(self, **kwargs):
        env = dict(kwargs.pop("env", None) or os.environ)
        env["COURSE_CELL_TIMEOUT"] = str(self.timeout)
        await super().async_start_new_kernel(env=env, **kwargs)

    start_new_kernel = run_sync(async_start_new_kernel)

    # -- processes the kernel started
    def _kernel_pid(self) -> int | None:
        try:
            return self.km.provisioner.process.pid
        except AttributeError:
            return None

    def _remember_family(self) -> None:
        pid = self._kernel_pid()
        if pid is None:
            return
        try:
            for child in psutil.Process(pid).children(recursive=True):
                self._kernel_family.setdefault(child.pid, child)
        except psutil.Error:
            pass

    def _kill_family(self) -> None:
        alive = []
        for proc in self._kernel_family.values():
            try:
                if proc.is_running():
                    proc.kill()
                    alive.append(proc)
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=10)
