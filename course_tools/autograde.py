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
  places are a size-capped ``/tmp`` and the kernel's socket folder, every process lives in one
  PID namespace that ends with the notebook and one network namespace with loopback only, with
  limits on file size, CPU time and memory per process. The kernel talks over unix sockets
  whose names, like its connection file, are removed before any cell runs, and it is
  non-dumpable, so no rank can find its key. Without bubblewrap the kernel's whole process tree
  is killed (this process is a child subreaper, so double-forked daemons are caught too) and
  the log says that grading is not sandboxed.
* **Each submission has one budget** (``budget*``; :mod:`course_tools.budget`): a cgroup that
  counts all its processes together (memory, processes and threads, CPU share); the cell during
  which a budget is exceeded fails and names it. Without cgroups the log says so.
* **A grader that cannot grade stops** (``preflight``): before the first submission of a
  notebook its reference answers run in the same sandbox; if a test fails, autograde exits
  with what is wrong and how to fix it, and grades nobody.
* **One submission never stops the class.** A kernel that dies, or a cell that does not stop
  when interrupted at its time limit, fails that cell and every later one ("not run"), so no
  later test counts as passed, while earlier tests keep their points; the log says which
  student and which cell.
* **Output is capped in bytes** per cell (``max_output_bytes``), on top of ``LimitOutput``'s lines.
* **Nothing is left behind**: the kernel's temporary folder is deleted whatever modes the
  learner left in it, every process it started is killed, its cgroup removed.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import sys
import tempfile
import time

import psutil
from jupyter_client.manager import AsyncKernelManager
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import run_sync
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Bool, Enum, Float, Integer, List, Unicode

from course_tools import ROOT, has_graded_cells
from helpers.lint.feedback import add_lint_feedback
from course_tools import budget as _budget
from course_tools import sandbox as _sandbox

__all__ = ["CourseExecute", "TrustedMetadata", "HideHiddenTests", "cpu_seconds"]

#: What the sandboxed kernel keeps of this process's environment (and every COURSE_* variable).
_KERNEL_ENV = {"LANG", "LC_ALL", "NBGRADER_EXECUTION", "PYTHONWARNINGS", "OMP_NUM_THREADS"}


#: (assignment, notebook) -> (what is wrong or None, seconds): one preflight per autograde run.
_PREFLIGHT: dict[tuple, tuple[str | None, float]] = {}


class _Cpu:
    """What the notebooks graded in this process used, counted by their cgroups (see :func:`cpu_seconds`)."""

    cgroups = 0.0  # CPU seconds of every notebook's cgroup (its kernel, ranks, every process in it)
    reaped = 0.0  # how much of it reached this process's RUSAGE_CHILDREN while the notebook ran
    exact = True  # False once a notebook was graded without a cgroup that could be read


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _account(group, children_before: float) -> None:
    """Add what ``group`` (removed) used: its exact CPU time, less what of it this process was
    charged already by waiting for its processes (counted once, not twice)."""
    if group is not None and group.cpu_used is not None:
        _Cpu.cgroups += group.cpu_used
        _Cpu.reaped += _children_cpu() - children_before
    else:
        _Cpu.exact = False


def cpu_seconds() -> tuple[float, bool]:
    """(CPU seconds this process and everything it started have used, whether that is exact).

    ``getrusage`` alone undercounts grading: the sandboxed kernel and its ranks live in their
    own PID namespace and are killed rather than waited for, so most of their time never
    reaches this process's ``RUSAGE_CHILDREN``. Each notebook's cgroup counts them exactly
    (:meth:`course_tools.budget.Group.cpu_seconds`), so the total is this process's own time,
    its children's outside those groups, and the groups'. Without readable cgroups it is the
    ``getrusage`` figure, a lower bound (``exact`` is then False)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    total = own.ru_utime + own.ru_stime + _children_cpu() - _Cpu.reaped + _Cpu.cgroups
    return total, _Cpu.exact


def _error(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=[f"{ename}: {evalue}"])


#: How the sandboxed kernel starts: it makes itself non-dumpable first (PR_SET_DUMPABLE 0), so a
#: process of the same user (a rank) can neither ptrace it nor read its /proc/<pid>/mem, environ
#: or fd, where the connection key would be; then it is ipykernel_launcher.
KERNEL_BOOT = (
    "import ctypes, sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:\n"
    "    sys.exit('the grading kernel could not make itself non-dumpable')\n"
    "if sys.path and sys.path[0] == '':\n"
    "    del sys.path[0]\n"
    "from ipykernel import kernelapp\n"
    "kernelapp.launch_new_instance()\n")
#: Where the sandboxed kernel finds its connection file (a read-only folder, emptied once the
#: kernel is ready) and makes its sockets (jupyter's IPC transport: the sandbox has no network).
KEY_DIR, SOCKET_DIR = "/run/key", "/run/kernel"
#: The longest folder the kernel's sockets can be made in: a unix socket's path holds at most
#: 107 bytes, and the names are ``k-<port>``.
_SOCKET_FOLDER_MAX = 96


def _socket_folder(private: str) -> str:
    """A new folder (mode 0700) for the kernel's sockets, as seen from this process: in the
    kernel's private folder, or where TMPDIR is too deep for a socket's path, in /tmp."""
    folder = os.path.join(private, "ipc")
    if len(folder) <= _SOCKET_FOLDER_MAX:
        os.mkdir(folder, 0o700)
        return folder
    return tempfile.mkdtemp(prefix="course-ipc-", dir="/tmp")


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel command is wrapped in :func:`course_tools.sandbox.command`.

    Sandboxed, the kernel talks over unix sockets in a folder bound into the sandbox
    (``transport="ipc"``); its connection file is a copy in a read-only folder of the sandbox
    that the grader empties as soon as the kernel has answered (:meth:`forget_key`), before
    any cell runs, and the kernel is non-dumpable (:data:`KERNEL_BOOT`). Nothing a rank can
    read then holds the key."""

    sandbox_options: dict = {}

    def format_kernel_cmd(self, extra_arguments=None):
        cmd = super().format_kernel_cmd(extra_arguments)
        opts = dict(self.sandbox_options)
        if not opts.get("bwrap"):  # no sandbox: resource limits only
            return _budget.join_command(opts.get("group"), opts["limits"].prlimit() + cmd)
        connection = self.connection_file
        key_dir, socket_dir = opts["key_dir"], opts["socket_dir"]
        with open(connection) as f:
            info = json.load(f)
        info["ip"] = os.path.join(SOCKET_DIR, os.path.basename(self.ip))
        copy = os.path.join(key_dir, "kernel.json")
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
        if os.geteuid() == 0:  # the kernel runs as the sandbox's unprivileged user
            os.chown(copy, _sandbox.UNPRIVILEGED, _sandbox.UNPRIVILEGED)
            os.chown(socket_dir, _sandbox.UNPRIVILEGED, _sandbox.UNPRIVILEGED)
        cmd = [os.path.join(KEY_DIR, "kernel.json") if c == connection else c for c in cmd]
        for i in range(len(cmd) - 1):
            if cmd[i] == "-m" and cmd[i + 1] == "ipykernel_launcher":
                cmd[i:i + 2] = ["-c", KERNEL_BOOT]
                break
        return _sandbox.command(cmd, readable=opts["readable"] + [(key_dir, KEY_DIR)],
                                rw=[(socket_dir, SOCKET_DIR)], writable=opts["writable"],
                                env=opts["env"], limits=opts["limits"],
                                scratch_bytes=opts["scratch_bytes"], cgroup=opts.get("group"))

    def forget_key(self) -> None:
        """Remove the kernel's connection file and its sockets' names from the sandbox: the
        connections made stay, no new one can be made (call once the client is connected)."""
        opts = self.sandbox_options
        if not opts.get("bwrap"):
            return
        for folder in (opts["key_dir"], opts["socket_dir"]):
            for name in os.listdir(folder):
                _sandbox.remove_tree(os.path.join(folder, name))


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
    limit_processes = Integer(256, help=(
        "Processes the sandboxed user may run at once (RLIMIT_NPROC, counted per user, so "
        "shared by every sandbox); used only where no cgroup budget counts the submission."
    )).tag(config=True)
    limit_file_bytes = Integer(512 * 2**20, help="Largest file a sandboxed process may write (RLIMIT_FSIZE).").tag(config=True)
    limit_cpu_seconds = Integer(900, help="CPU seconds per sandboxed process (RLIMIT_CPU).").tag(config=True)
    limit_memory_bytes = Integer(16 * 2**30, help=(
        "Address space per sandboxed process (RLIMIT_AS); torch reserves far more than it uses."
    )).tag(config=True)
    budget = Enum(["auto", "required", "off"], "auto", help=(
        "Give each submission one cgroup (course_tools/budget.py) that counts all its processes "
        "together: memory, processes and threads, CPU share. 'required': grading fails if the "
        "cgroup cannot be made; 'auto': without cgroups (a non-root grader without a delegated "
        "subtree) the log says the submission has no budget, and only the per-process limits "
        "hold; 'off': never."
    )).tag(config=True)
    budget_memory_bytes = Integer(4 * 2**30, help=(
        "Memory of all of one submission's processes together (cgroup memory.max, or "
        "memory.limit_in_bytes on cgroup v1; its scratch tmpfs counts too). Past it the "
        "system kills one of that submission's processes, the cell fails and says so."
    )).tag(config=True)
    budget_processes = Integer(512, help=(
        "Processes and threads one submission may run at once (cgroup pids.max); a fork past "
        "it fails and the cell says the process budget was reached (a fork bomb stops here)."
    )).tag(config=True)
    budget_cpu_weight = Integer(100, help=(
        "One submission's share of the CPU against everything else (cgroup cpu.weight, "
        "1-10000, 100 is the default share; cpu.shares = weight * 1024 / 100 on cgroup v1): "
        "a submission running many busy ranks gets no more CPU than one running two."
    )).tag(config=True)
    budget_cpus = Float(0.0, help=(
        "A hard cap on one submission's CPU time, in cores (cgroup cpu.max / cpu.cfs_quota_us); "
        "0: no cap beyond the share."
    )).tag(config=True)
    scratch_bytes = Integer(1 * 2**30, help=(
        "Size of the sandbox's /tmp (a tmpfs, bwrap --size; the only place a submission writes "
        "files): a write past it fails with 'No space left on device' and the cell says that "
        "the scratch budget was exceeded. Files vanish with the sandbox."
    )).tag(config=True)
    preflight = Bool(True, help=(
        "Before the first submission of each notebook, check that the sandbox can import "
        "helpers and run a 2-rank pool, and that the release's reference answers (the source "
        "notebook) pass every test in the same sandbox; if not, autograde stops (exit code 1) "
        "with what is wrong and how to fix it, and grades nobody. Once per autograde run."
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
        self._preflight(info)
        self._who = f"{info.get('student', '?')}/{info.get('assignment', '?')}/{info.get('notebook', '?')}"
        self._trusted, self._tests = self._instructor_cells(info)
        meta = resources.setdefault("metadata", {})
        original_path = meta.get("path")
        self._private = tempfile.mkdtemp(prefix="course-grading-")
        self._ipc = None
        workdir = os.path.join(self._private, "tmp")
        os.mkdir(workdir)
        self._stopped = None
        self._kernel_family: dict[int, psutil.Process] = {}
        self._use_sandbox = self._sandbox_wanted()
        children_cpu = _children_cpu()
        self._group = self._budget_group()
        self._seen = (0, 0)  # the group's OOM kills and refused forks before the current cell
        self._tmpfs_scratch = self._use_sandbox and _sandbox.sized_tmpfs()
        if self._use_sandbox:
            os.mkdir(os.path.join(self._private, "key"), 0o755)
            self._ipc = _socket_folder(self._private)
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
            if self._group is not None:
                peak = self._group.memory_peak()
                if not self._group.remove():
                    self.log.error("The cgroup of %s could not be removed: %s", self._who, self._group.folders)
                if peak is not None:
                    self.log.info("Budget of %s: peak memory %s of %s, CPU %s s", self._who, _budget.gib(peak),
                                  _budget.gib(self.budget_memory_bytes),
                                  "?" if self._group.cpu_used is None else f"{self._group.cpu_used:.1f}")
            _account(self._group, children_cpu)
            if original_path is None:
                meta.pop("path", None)
            else:
                meta["path"] = original_path
            _sandbox.remove_tree(self._private)
            ipc = getattr(self, "_ipc", None)
            if ipc and not ipc.startswith(self._private + os.sep) and os.path.isdir(ipc):
                _sandbox.remove_tree(ipc)

    def _budget_group(self):
        if self.budget == "off":
            return None
        group, why = _budget.create(self._budget())
        if group is None:
            if self.budget == "required":
                raise RuntimeError(f"CourseExecute.budget = 'required' but no cgroup can be made: {why}")
            self.log.warning("Grading has NO per-submission budget (%s): memory, processes and CPU "
                             "share are limited per process only, so one submission can starve "
                             "others graded beside it: %s", why, self._who)
        return group

    def _budget(self) -> _budget.Budget:
        return _budget.Budget(self.budget_memory_bytes, self.budget_processes, self.budget_cpu_weight,
                              self.budget_cpus)

    # ------------------------------------------------------------------ preflight

    def _preflight(self, info: dict) -> None:
        """Stop autograde before the first submission if this grader cannot grade (once per
        notebook per run): the reference answers must pass in the same sandbox."""
        if not self.preflight or getattr(self, "_in_preflight", False) or not info.get("assignment"):
            return
        key = (info["assignment"], info.get("notebook"))
        if key not in _PREFLIGHT:
            t0 = time.monotonic()
            problem = self._run_preflight(info)
            _PREFLIGHT[key] = (problem, time.monotonic() - t0)
            if problem is None:
                self.log.info("Preflight passed in %.1f s: the reference answers of %s/%s pass every "
                              "test in the grading sandbox.", _PREFLIGHT[key][1], *key)
            from helpers.spawn import can_watch_syscalls

            if not can_watch_syscalls():
                self.log.warning("Grading cannot see the ranks' system calls here (seccomp notifications "
                                 "need Linux on x86_64 or aarch64): a check of fsync calls relies on the "
                                 "rank's own log of them, which an answer could fake.")
        problem, seconds = _PREFLIGHT[key]
        if problem is None:
            return
        self.log.error("Autograde stopped before grading anyone (preflight, %.1f s): %s", seconds, problem)
        self._remove_partial(info)
        raise SystemExit(1)

    def _source_notebook(self, info: dict) -> str | None:
        from nbgrader.coursedir import CourseDirectory

        converter = getattr(getattr(self, "parent", None), "parent", None)
        coursedir = getattr(converter, "coursedir", None) or CourseDirectory(config=self.config)
        path = os.path.join(coursedir.format_path(coursedir.source_directory, ".", info["assignment"]),
                            f"{info['notebook']}.ipynb")
        return path if os.path.exists(path) else None

    def _remove_partial(self, info: dict) -> None:
        """The autograded folder nbgrader made for the submission it was about to grade."""
        converter = getattr(getattr(self, "parent", None), "parent", None)
        try:
            dest = converter._format_dest(info["assignment"], info["student"])
        except Exception:  # noqa: BLE001 - not run by nbgrader's autograde: nothing was made
            return
        if os.path.isdir(dest):
            _sandbox.remove_tree(dest)

    def _run_preflight(self, info: dict) -> str | None:
        """What is wrong, or ``None``: the source notebook (the reference answers and every
        test, hidden ones included) run through this same execute step; if a test fails, a
        small script in the same sandbox says whether helpers and a 2-rank pool work at all."""
        import nbformat

        source = self._source_notebook(info)
        if source is None:
            return None  # a course without its source notebooks (a learner's copy): nothing to compare
        step = type(self)(parent=getattr(self, "parent", None),
                          **{n: getattr(self, n) for n in self.trait_names(config=True)})
        step.log = self.log
        step._in_preflight = True
        nb = nbformat.read(source, as_version=4)
        if not any("BEGIN SOLUTION" in c.source for c in nb.cells
                   if c.get("metadata", {}).get("nbgrader", {}).get("solution")):
            # a learner's copy (make check): its "source" is the release, stubs and all
            self.log.info("Preflight: %s holds no reference answers; not run.", source)
            return None
        resources = {"nbgrader": {**info, "student": "(preflight: reference answers)"},
                     "metadata": {"path": os.path.dirname(source)}}
        nb, _ = step.preprocess(nb, resources)
        if not step._tests:  # no test was run: the reference answers proved nothing
            return (f"the gradebook ({info.get('db_url') or 'none given'}) holds no test cell of "
                    f"{info['assignment']}/{info['notebook']}, so the preflight could not run the "
                    f"tests on the reference answers: run `nbgrader generate_assignment "
                    f"{info['assignment']}` for this course before grading.")
        from nbgrader.utils import determine_grade

        failed = {}
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
                continue
            score, points = determine_grade(cell)  # nbgrader's own rule: an error or any stderr fails
            if score is not None and score < points:
                bad = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"
                       or o.get("name") == "stderr"]
                said = (f"{bad[0].get('ename')}: {bad[0].get('evalue', '')}" if bad and bad[0].get("ename")
                        else f"it wrote to stderr: {bad[0].get('text', '')}" if bad else "no points")
                failed[meta.get("grade_id", "?")] = said.strip()[:300]
        if not failed:
            return None
        why = self._smoke_test()
        shown = "; ".join(f"{g}: {e}" for g, e in list(failed.items())[:3])
        if why:
            return f"{why} (so the reference answers of {source} fail {len(failed)} tests, e.g. {shown})"
        return (f"the reference answers of {source} fail {len(failed)} of their tests in the grading "
                f"sandbox ({shown}), so every learner would lose those points too. Run the source "
                f"notebook (or `make check`) to see why; fix the course or its environment before "
                f"grading.")

    def _smoke_test(self) -> str | None:
        """Can the sandbox import helpers and run a 2-rank pool? ``None``, or what is wrong."""
        import subprocess

        script = ("import sys\n"
                  "try:\n    import helpers\n"
                  "except Exception as e:\n    print('IMPORT', type(e).__name__, e); sys.exit(3)\n"
                  "from helpers.spawn import run\n"
                  "def f():\n    import torch, torch.distributed as dist\n"
                  "    t = torch.ones(1)\n    dist.all_reduce(t)\n    return t.item()\n"
                  "print('POOL', run(f, world_size=2, timeout=60, echo=False))\n")
        cmd = [sys.executable, "-c", script]
        self._who = "(preflight: can the sandbox run helpers)"
        self._private = tempfile.mkdtemp(prefix="course-grading-")
        children_cpu = _children_cpu()
        self._group = self._budget_group()
        self._use_sandbox = self._sandbox_wanted()
        self._tmpfs_scratch = self._use_sandbox and _sandbox.sized_tmpfs()
        self._workdir = os.path.join(self._private, "tmp")
        os.mkdir(self._workdir)
        try:
            opts = self._sandbox_options(self._kernel_env())
            if self._use_sandbox:
                if os.geteuid() == 0:
                    os.chown(self._workdir, _sandbox.UNPRIVILEGED, _sandbox.UNPRIVILEGED)
                cmd = _sandbox.command(cmd, readable=opts["readable"], writable=opts["writable"],
                                       env=opts["env"], limits=opts["limits"],
                                       scratch_bytes=opts["scratch_bytes"], cgroup=opts["group"])
                env = _sandbox.CLEAN_ENV
            else:
                cmd, env = _budget.join_command(opts["group"], opts["limits"].prlimit() + cmd), opts["env"]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=self._private,
                                     timeout=self.startup_timeout + 120)
                text, code = out.stdout + out.stderr, out.returncode
            except subprocess.TimeoutExpired:
                text, code = "(no answer)", -1
        finally:
            if self._group is not None:
                self._group.remove()
            _account(self._group, children_cpu)
            _sandbox.remove_tree(self._private)
        if code == 0 and "POOL [2.0, 2.0]" in text:
            return None
        if "IMPORT" in text:
            error = text.split("IMPORT", 1)[1].strip().splitlines()[0]
            found = subprocess.run([sys.executable, "-I", "-c", "import helpers; print(helpers.__file__)"],
                                   capture_output=True, text=True, cwd="/").stdout.strip()
            ours = str(ROOT / "helpers")
            where = (f"that environment imports helpers from {os.path.dirname(found)} (another "
                     f"checkout's install?)" if found and not found.startswith(ours + os.sep)
                     else "that environment does not install helpers")
            return (f"the grading sandbox cannot import helpers ({error}): the sandbox shows this "
                    f"course's helpers ({ours}) and the Python environment {sys.prefix}, but "
                    f"{where}. Fix: install this course into the environment "
                    f"(`{sys.executable} -m pip install --no-deps -e {ROOT}`, or `make setup` in "
                    f"{ROOT}), or run autograde with the environment of the checkout it was made for")
        tail = "\n".join(text.strip().splitlines()[-6:])
        return (f"the grading sandbox could not run a 2-rank pool of helpers.spawn (exit code {code}): "
                f"{tail}. Check that the sandbox's user can read the Python environment "
                f"({os.path.realpath(sys.executable)}: a grader that is not root cannot read an "
                f"interpreter under /root) and that `python -m course_tools.sandbox` works")

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
        counted = self._group is not None and "pids" in self._group.folders
        return _sandbox.Limits(None if counted else self.limit_processes, self.limit_file_bytes,
                               self.limit_cpu_seconds, self.limit_memory_bytes)

    def create_kernel_manager(self):
        self.kernel_manager_class = SandboxedKernelManager
        km = super().create_kernel_manager()
        env = self._kernel_env()
        km.sandbox_options = self._sandbox_options(env)
        if self._use_sandbox:  # no network in the sandbox: the kernel's sockets are unix sockets
            km.transport = "ipc"
            km.connection_file = os.path.join(self._private, "kernel.json")
            km.ip = os.path.join(self._ipc, "k")
        return km

    def _kernel_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k in _KERNEL_ENV or k.startswith("COURSE_")}
        env.update({"HOME": "/tmp/home", "TMPDIR": "/tmp", "IPYTHONDIR": "/tmp/home/.ipython",
                    "MPLCONFIGDIR": "/tmp/home/.matplotlib", "COURSE_CELL_TIMEOUT": str(self.timeout),
                    "PATH": os.path.dirname(sys.executable) + ":/usr/local/bin:/usr/bin:/bin"})
        return env

    def _sandbox_options(self, env: dict) -> dict:
        return {
            "bwrap": self._use_sandbox, "group": self._group,
            "writable": None if self._tmpfs_scratch else self._workdir,
            "scratch_bytes": self.scratch_bytes, "env": env, "limits": self._limits(),
            "key_dir": os.path.join(self._private, "key"), "socket_dir": getattr(self, "_ipc", None),
            "readable": [sys.prefix, str(ROOT / "helpers")] + list(self.sandbox_readable),
        }

    async def async_start_new_kernel(self, **kwargs):
        env = dict(kwargs.pop("env", None) or os.environ)
        env["COURSE_CELL_TIMEOUT"] = str(self.timeout)
        await super().async_start_new_kernel(env=env, **kwargs)

    start_new_kernel = run_sync(async_start_new_kernel)

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        if self._use_sandbox:
            # every channel the grader uses is connected (the control channel answers too), so
            # the key and the sockets' names can go before any cell runs
            msg = kc.session.msg("kernel_info_request")
            kc.control_channel.send(msg)
            deadline = time.monotonic() + self.startup_timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError("the grading kernel did not answer on its control channel")
                try:
                    reply = await kc.control_channel.get_msg(timeout=left)
                except asyncio.TimeoutError:
                    continue
                except Exception:  # queue.Empty from jupyter_client
                    continue
                if reply.get("parent_header", {}).get("msg_id") == msg["header"]["msg_id"]:
                    break
            self.km.forget_key()
        return kc

    start_new_kernel_client = run_sync(async_start_new_kernel_client)

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
            self._check_budget(cell)
            self._cap_output(cell)
            self._remember_family()

    def _check_budget(self, cell) -> None:
        """A cell during which the submission exceeded a budget fails, saying which one."""
        errors = []
        if self._group is not None:
            seen = (self._group.oom_kills(), self._group.refused_forks())
            if seen[0] > self._seen[0]:
                errors.append(_error("MemoryBudgetExceeded", (
                    f"the submission's memory budget of {_budget.gib(self.budget_memory_bytes)} was "
                    "exceeded (all its processes together): the system killed one of them, so this "
                    "cell fails.")))
            if seen[1] > self._seen[1]:
                errors.append(_error("ProcessBudgetExceeded", (
                    f"the submission's process budget of {self.budget_processes} processes and "
                    "threads was reached: starting another one failed, so this cell fails.")))
            self._seen = seen
        if self._tmpfs_scratch and any("No space left on device" in str(o.get("evalue", "")) + str(o.get("text", ""))
                                       for o in cell.get("outputs", [])):
            errors.append(_error("ScratchBudgetExceeded", (
                f"the submission's scratch space of {_budget.gib(self.scratch_bytes)} (its /tmp, "
                "where every file it writes goes) was full, so this cell fails.")))
        if errors:
            cell.setdefault("outputs", []).extend(errors)
            self.log.warning("%s: %s", self._who, "; ".join(e["evalue"] for e in errors))

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
        if self._group is not None:  # every process of the submission, wherever it went
            for pid in self._group.pids():
                try:
                    procs.append(psutil.Process(pid))
                except psutil.Error:
                    pass
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
