"""The course's execute step for ``nbgrader autograde``: bounded, honest, sandboxed and clean.

Configured in ``nbgrader_config.py`` in place of nbgrader's own ``Execute``; explained in the
README's instructor section. Every behaviour below is a configurable setting with help text
(``python -m course_tools.autograde`` prints them with their help):

* **Only notebooks with graded cells run** (``skip_ungraded``). The lesson notebooks of a
  depth carry no tests; executing their demos for every submission would grade nothing.
* **No learner code runs in the grading kernel** (``answers_in_workers``). A cell that is not
  one of the instructor's locked cells (checked against the gradebook) is never run in the
  kernel: the kernel records its source (:func:`helpers.grading.answers.record`), binding the
  names it defines to recorded answers, and each test ships that source as text to the worker
  processes, which run it there, as JupyterLab would (any valid Python), and call the answer.
  The instructor's locked setup cells run in the kernel and are recorded too (the workers run
  them before the answers); test cells run in the kernel only.
* **Each submission's kernel runs in a sandbox** (``sandbox``; :mod:`course_tools.sandbox`):
  the course (solutions, other submissions, the gradebook) is out of sight, the only writable
  place is the kernel's own temporary folder, every process lives in one PID namespace that
  ends with the notebook, with limits on processes, file size, CPU time and memory. Without
  bubblewrap the kernel's whole process tree is killed (this process is a child subreaper, so
  double-forked daemons are caught too) and the log says that grading is not sandboxed.
* **One submission never stops the class.** A kernel that dies, or a cell that does not stop
  when interrupted at its time limit, fails that cell and every later one ("not run"), so no
  later test counts as passed, while earlier tests keep their points; the log says which
  student and which cell.
* **Output is capped in bytes** per cell (``max_output_bytes``), on top of ``LimitOutput``'s lines.
* **Nothing is left behind**: the kernel's temporary folder is deleted, every process it
  started is killed.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
import tempfile

import psutil
from jupyter_client.manager import AsyncKernelManager
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import run_sync
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Bool, Enum, Integer, List, Unicode

from course_tools import ROOT, has_graded_cells
from helpers.lint.feedback import add_lint_feedback
from course_tools import sandbox as _sandbox

__all__ = ["CourseExecute", "TrustedMetadata", "HideHiddenTests"]

#: What the sandboxed kernel keeps of this process's environment (and every COURSE_* variable).
_KERNEL_ENV = {"LANG", "LC_ALL", "NBGRADER_EXECUTION", "PYTHONWARNINGS", "OMP_NUM_THREADS"}


def _error(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=[f"{ename}: {evalue}"])


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel command is wrapped in :func:`course_tools.sandbox.command`."""

    sandbox_options: dict = {}

    def format_kernel_cmd(self, extra_arguments=None):
        cmd = super().format_kernel_cmd(extra_arguments)
        opts = dict(self.sandbox_options)
        if not opts.get("bwrap"):  # no sandbox: resource limits only
            return opts["limits"].prlimit() + cmd
        connection = self.connection_file
        # the kernel reads its connection file as the sandbox's unprivileged user: a copy it owns
        private = opts.pop("private")
        copy = os.path.join(private, "kernel.json")
        shutil.copy(connection, copy)
        if os.geteuid() == 0:
            os.chown(copy, _sandbox.UNPRIVILEGED, _sandbox.UNPRIVILEGED)
        os.chmod(copy, 0o400)
        cmd = ["/run/kernel.json" if c == connection else c for c in cmd]
        return _sandbox.command(cmd, readable=opts["readable"] + [(copy, "/run/kernel.json")],
                                writable=opts["writable"], env=opts["env"], limits=opts["limits"])


def _set_child_subreaper() -> bool:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except OSError:
        return False


class CourseExecute(Execute):
    """nbgrader's ``Execute``, made safe for distributed answers (see the module docstring)."""

    skip_ungraded = Bool(True, help=(
        "Execute only notebooks that carry graded cells. A depth's lesson notebooks have no "
        "tests: running their demos for every submission would take minutes and grade nothing."
    )).tag(config=True)
    answers_in_workers = Bool(True, help=(
        "Never run a cell that is not one of the instructor's locked cells in the grading "
        "kernel: record its source instead (the names it defines become recorded answers) and "
        "let the tests run it in their worker processes, where any valid Python is allowed. "
        "Keeps every line a learner wrote out of the kernel that holds the tests. False runs "
        "every cell in the kernel, as nbgrader does: only for trying the execute step on "
        "notebooks of one's own, never for a class."
    )).tag(config=True)
    sandbox = Enum(["auto", "bwrap", "off"], "auto", help=(
        "Run each submission's kernel in a bubblewrap sandbox: 'bwrap' requires it (grading "
        "fails if it cannot be made), 'auto' uses it when it works and otherwise falls back "
        "to resource limits and killing the kernel's process tree, saying so in the log, "
        "'off' never uses it."
    )).tag(config=True)
    temp_workdir = Bool(True, help=(
        "Run the kernel in a fresh temporary folder, deleted afterwards, so that files an "
        "answer writes never land in the course (in the sandbox it is the only writable place)."
    )).tag(config=True)
    kill_processes = Bool(True, help=(
        "After each notebook, kill every process the kernel started, directly or not "
        "(double-forked daemons included: this process becomes a child subreaper)."
    )).tag(config=True)
    max_output_bytes = Integer(1_000_000, help=(
        "Bytes of output one cell may keep in the autograded notebook (and so in the feedback "
        "page); the rest is cut, with a note saying how much."
    )).tag(config=True)
    limit_processes = Integer(256, help="Processes the sandboxed user may run at once (RLIMIT_NPROC).").tag(config=True)
    limit_file_bytes = Integer(512 * 2**20, help="Largest file a sandboxed process may write (RLIMIT_FSIZE).").tag(config=True)
    limit_cpu_seconds = Integer(900, help="CPU seconds per sandboxed process (RLIMIT_CPU).").tag(config=True)
    limit_memory_bytes = Integer(16 * 2**30, help=(
        "Address space per sandboxed process (RLIMIT_AS); torch reserves far more than it uses."
    )).tag(config=True)
    sandbox_readable = List(Unicode(), help=(
        "Extra paths the sandboxed kernel may read (besides the system's, the Python "
        "environment and helpers/)."
    )).tag(config=True)

    # ------------------------------------------------------------------ one notebook

    def preprocess(self, nb, resources=None, km=None):
        if self.skip_ungraded and not has_graded_cells(nb):
            self.log.info("No graded cells: this lesson notebook is not executed for grading.")
            return nb, resources
        resources = resources if resources is not None else {}
        info = resources.get("nbgrader", {})
        self._who = f"{info.get('student', '?')}/{info.get('assignment', '?')}/{info.get('notebook', '?')}"
        self._trusted, self._tests = self._instructor_cells(info)
        meta = resources.setdefault("metadata", {})
        original_path = meta.get("path")
        self._private = tempfile.mkdtemp(prefix="course-grading-")
        workdir = os.path.join(self._private, "tmp")
        os.mkdir(workdir)
        self._stopped = None
        self._kernel_family: dict[int, psutil.Process] = {}
        self._use_sandbox = self._sandbox_wanted()
        if self._use_sandbox:
            if os.geteuid() == 0:
                os.chown(workdir, _sandbox.UNPRIVILEGED, _sandbox.UNPRIVILEGED)
            meta["path"] = self._private  # where bwrap starts; the kernel's cwd is inside the sandbox
        elif self.temp_workdir:
            meta["path"] = workdir
        self._workdir = workdir
        if self.kill_processes:
            _set_child_subreaper()
        self._children_before = {p.pid for p in self._own_children()}
        try:
            return super().preprocess(nb, resources, km)
        finally:
            self._kill_family()
            if original_path is None:
                meta.pop("path", None)
            else:
                meta["path"] = original_path
            shutil.rmtree(self._private, ignore_errors=True)

    def _sandbox_wanted(self) -> bool:
        if self.sandbox == "off":
            self.log.warning("Grading is NOT sandboxed (CourseExecute.sandbox = 'off'): %s", self._who)
            return False
        why = _sandbox.probe()
        if why is None:
            return True
        if self.sandbox == "bwrap":
            raise RuntimeError(f"CourseExecute.sandbox = 'bwrap' but the sandbox cannot be made: {why}")
        self.log.warning("Grading is NOT sandboxed (%s); falling back to resource limits and "
                         "killing the kernel's process tree: %s", why, self._who)
        return False

    def _instructor_cells(self, info: dict) -> tuple[set[str], set[str]]:
        """Sources of the instructor's locked code cells of this notebook, and of those among
        them that are tests (graded cells), from the gradebook."""
        if not info.get("db_url"):
            return set(), set()
        from nbgrader.api import Gradebook, MissingEntry

        try:
            with Gradebook(info["db_url"]) as gb:
                notebook = gb.find_notebook(info["notebook"], info["assignment"])
                graded = {c.name for c in notebook.grade_cells}
                locked = [c for c in notebook.source_cells if c.locked and c.cell_type == "code"]
                return ({c.source for c in locked}, {c.source for c in locked if c.name in graded})
        except MissingEntry:
            return set(), set()

    # ------------------------------------------------------------------ the kernel

    def _limits(self):
        return _sandbox.Limits(self.limit_processes, self.limit_file_bytes, self.limit_cpu_seconds,
                               self.limit_memory_bytes)

    def create_kernel_manager(self):
        self.kernel_manager_class = SandboxedKernelManager
        km = super().create_kernel_manager()
        env = {k: v for k, v in os.environ.items() if k in _KERNEL_ENV or k.startswith("COURSE_")}
        env.update({"HOME": "/tmp/home", "TMPDIR": "/tmp", "IPYTHONDIR": "/tmp/home/.ipython",
                    "MPLCONFIGDIR": "/tmp/home/.matplotlib", "COURSE_CELL_TIMEOUT": str(self.timeout),
                    "PATH": os.path.dirname(sys.executable) + ":/usr/local/bin:/usr/bin:/bin"})
        km.sandbox_options = {
            "bwrap": self._use_sandbox, "private": self._private, "writable": self._workdir,
            "env": env, "limits": self._limits(),
            "readable": [sys.prefix, str(ROOT / "helpers")] + list(self.sandbox_readable),
        }
        return km

    async def async_start_new_kernel(self, **kwargs):
        env = dict(kwargs.pop("env", None) or os.environ)
        env["COURSE_CELL_TIMEOUT"] = str(self.timeout)
        await super().async_start_new_kernel(env=env, **kwargs)

    start_new_kernel = run_sync(async_start_new_kernel)

    # ------------------------------------------------------------------ one cell

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, self.resources
        if self._stopped is not None:
            cell.outputs = [_error("NotRun", f"not run: {self._stopped}, so this cell earns no points.")]
            return cell, self.resources
        try:
            if self.answers_in_workers and cell.source not in self._tests:
                learners = cell.source not in self._trusted
                self._record(cell, resources, index, trusted=not learners)
                if learners:  # never run here: the tests run it in their workers
                    return cell, self.resources
            result = super().preprocess_cell(cell, resources, index)
            if any(o.get("ename") == "CellTimeoutError" for o in cell.get("outputs", [])):
                # nbgrader turns the timeout into an error output; the kernel may still be busy
                # (an interrupt it ignored): handled like a dead kernel, not waited for again
                raise CellTimeoutError.error_from_timeout_and_cell("", self.timeout, cell)
            add_lint_feedback(self.nb, cell)  # a failed test also shows the linter's findings
            return result
        except DeadKernelError:
            self._stopped = f"the kernel died in cell {index}"
            self.log.error("Kernel died in cell %d of %s; later cells are marked not run.", index, self._who)
            cell.outputs.append(_error(
                "KernelDied", "the kernel died while running this cell (it was killed, or crashed). "
                "Nothing after this cell was run."))
            return cell, self.resources
        except CellTimeoutError:
            self._stopped = f"cell {index} ran past its time limit"
            self.log.error("Cell %d of %s ran past its time limit; its kernel is stopped and later "
                           "cells are marked not run.", index, self._who)
            cell.outputs = [o for o in cell.get("outputs", []) if o.get("ename") != "CellTimeoutError"]
            cell.outputs.append(_error(
                "CellTimeoutError", f"this cell ran past its {self.timeout} s limit and was stopped. "
                "Nothing after it was run."))
            self._stop_kernel()
            return cell, self.resources
        finally:
            self._cap_output(cell)
            self._remember_family()

    def _record(self, cell, resources, index, trusted: bool) -> None:
        """Have the kernel keep the cell's source (helpers.grading.answers.record), unrun."""
        source = cell.source
        cell.source = (f"__import__('helpers.grading.answers', fromlist=['record']).record("
                       f"{index}, {source!r}, globals(), trusted={trusted})")
        try:
            super().preprocess_cell(cell, resources, index)
        finally:
            cell.source = source
        if not trusted:
            self.log.debug("Cell %d of %s recorded for the test workers", index, self._who)
            for out in cell.get("outputs", []):  # a syntax error: say where, in the learner's terms
                if out.get("output_type") == "error":
                    out["traceback"] = [f"{out.get('ename')}: {out.get('evalue')}"]
        else:
            cell.outputs = []

    def _cap_output(self, cell) -> None:
        budget, kept, cut = self.max_output_bytes, [], 0
        for out in cell.get("outputs", []):
            size = len(str(out).encode("utf-8", "replace"))
            if size <= budget:
                kept.append(out)
                budget -= size
                continue
            cut += size - max(budget, 0)
            if budget > 0 and out.get("output_type") == "stream":
                out["text"] = out["text"][:budget]
                kept.append(out)
            budget = 0
        if cut:
            kept.append(NotebookNode(output_type="stream", name="stderr",
                                     text=f"\n[output cut: {cut} more bytes than the grader keeps]\n"))
            cell.outputs = kept

    # ------------------------------------------------------------------ processes

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

    def _stop_kernel(self) -> None:
        pid = self._kernel_pid()
        if pid is not None:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except OSError:
                pass

    @staticmethod
    def _own_children() -> list:
        try:
            return psutil.Process().children(recursive=True)
        except psutil.Error:
            return []

    def _kill_family(self) -> None:
        if not self.kill_processes:
            return
        procs = list(self._kernel_family.values())
        # orphans re-parented to this process (a child subreaper): daemons the kernel made; the
        # children this process had before the notebook are not the kernel's and are left alone
        procs += [p for p in self._own_children() if p.pid not in self._children_before]
        alive = []
        for proc in procs:
            try:
                if proc.is_running() and proc.pid != os.getpid():
                    proc.kill()
                    alive.append(proc)
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=10)


class TrustedMetadata(NbGraderPreprocessor):
    """First of autograde's sanitizing steps: a cell whose nbgrader metadata nbgrader would choke
    on (a schema version from the future, wrong types, unknown keys) loses that metadata, with a
    line in the log, instead of aborting the whole class's autograde. Locked cells are restored
    from the gradebook afterwards as usual; a cell that lost its metadata counts as the learner's."""

    def preprocess(self, nb, resources):
        from nbgrader.nbgraderformat import MetadataValidator

        validator = MetadataValidator()
        who = "/".join(str(resources.get("nbgrader", {}).get(k, "?")) for k in ("student", "notebook"))
        for index, cell in enumerate(nb.cells):
            meta = cell.get("metadata", {}).get("nbgrader")
            if meta is None:
                continue
            try:
                if not isinstance(meta, dict):
                    raise ValueError("not a dict")
                validator.validate_cell(cell)
                if meta.get("schema_version") != validator.schema_version:
                    raise ValueError(f"schema version {meta.get('schema_version')!r}")
            except Exception as e:  # noqa: BLE001 - any bad metadata is the submission's problem
                self.log.warning("Submission %s: cell %d has nbgrader metadata that cannot be used "
                                 "(%s); it is treated as the learner's own cell.", who, index, e)
                del cell.metadata["nbgrader"]
        return nb, resources


class HideHiddenTests(NbGraderPreprocessor):
    """For ``generate_feedback``: the feedback page shows that a hidden test failed and its
    message, not the hidden test's source. The hidden region of every test cell is removed,
    and in such cells an error keeps only its message (a traceback quotes the failing line)."""

    begin = Unicode("### BEGIN HIDDEN TESTS").tag(config=True)
    end = Unicode("### END HIDDEN TESTS").tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code" or self.begin not in cell.source:
            return cell, resources
        lines, keep, hidden = cell.source.splitlines(), [], False
        for line in lines:
            if line.strip() == self.begin:
                hidden = True
                keep.append("# (hidden tests run here when graded)")
            elif line.strip() == self.end:
                hidden = False
            elif not hidden:
                keep.append(line)
        cell.source = "\n".join(keep)
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                out["traceback"] = [f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"]
        return cell, resources


if __name__ == "__main__":  # python -m course_tools.autograde: the settings, with their help
    print(CourseExecute.class_config_section())
