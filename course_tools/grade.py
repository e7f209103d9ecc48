"""``python -m course_tools.grade ASSIGNMENT``: grade a whole class, several submissions at a time.

Run in the course folder (where ``nbgrader_config.py`` is). Each submission is graded by
nbgrader's own autograde converter, with the course's execute step and sandbox, in a private
copy of the course made for it alone: its submitted files, the assignment's non-notebook source
files, the course's ``nbgrader_config.py`` (without ``c.CourseDirectory.db_url``: the real
gradebook's URL and password stay here) and a private SQLite gradebook holding the
assignment's definition (notebooks, cells, locked sources) copied from the real one. Nothing
else travels, so the same task runs in a thread here (``--workers N``, default
:func:`slots_allowed`) or on any worker of a Dask distributed cluster
(``--scheduler tcp://HOST:PORT``) that has the course's environment. A task reports its
submission's CPU time, the sandboxed kernel and ranks counted by their cgroups.

What comes back is, per notebook, the notebook as the execute step left it. This process is the
only one that writes the real gradebook: for each result it runs nbgrader's autograde converter
on the course's own ``submitted/`` folder, exactly as ``nbgrader autograde --student ID
--force`` would (sanitizing, overwriting locked cells, the submission's timestamp, the late
penalty of ``LateSubmissionPlugin``, ``SaveAutoGrades``, the ``autograded/`` files), except
that its execute step hands back the notebook the worker executed (:class:`Replay`, which
checks first that the worker executed this very notebook). So the rows are nbgrader's, written
by one writer (with SQLite, a second run on the same gradebook is refused), and no stop leaves a
half-written submission: Ctrl-C, SIGTERM and SIGHUP are held while one is written (running
tasks are then stopped, their kernels and every process they started end), and a write becomes
visible (its ``autograded/`` folder moved into place) only once it is whole and checked, so even
a SIGKILL mid-write leaves a submission the next run grades again. A rerun grades only what is
missing (``--force`` regrades everything).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

__all__ = ["run_task", "grade", "main", "Replay", "Capture", "Fingerprint"]

#: nbgrader's gradebook tables that define an assignment (copied into each task's gradebook).
DEFINITION_TABLES = ("course", "assignment", "notebook", "base_cell", "grade_cells",
                     "solution_cells", "task_cells", "source_cell")
#: Memory one grading slot may need (a developer submission's pools of 4 ranks): caps the default.
SLOT_BYTES = 3 * 2**30
#: The most ranks a test's pool runs in this course (the hidden tests' world_size=5).
POOL_RANKS = 5
#: Set in every process a task starts (kernels and ranks keep COURSE_* variables): finds leftovers.
TASK_MARK = "COURSE_GRADE_TASK"
#: Seconds a stopped task has to end by itself before its processes are killed.
STOP_GRACE = 30
#: Where the writer builds a submission's ``autograded/`` folder (under the course root); the folder
#: is moved into ``autograded/`` only once its gradebook rows are complete and checked, so a
#: submission is never seen as graded half-way (:meth:`Course.write`).
STAGING = ".autograded-partial"
#: Signals that stop a run as Ctrl-C does: each ends the running tasks and the run, and is held
#: while a submission is written, which finishes first.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: (for the tests) A FIFO: the writer stops there in the middle of writing a submission (its
#: submission row committed, its scores not yet) until someone opens the FIFO to say go on.
PAUSE_WRITE = "COURSE_GRADE_TEST_PAUSE_WRITE"

# ============================================================================ notebooks


def fingerprint(nb) -> str:
    """What grading depends on in a notebook: its cells' types, sources and nbgrader metadata."""
    cells = [(c.get("cell_type"), c.get("source"), c.get("metadata", {}).get("nbgrader"))
             for c in nb.cells]
    return hashlib.sha256(json.dumps(cells, sort_keys=True, default=str).encode()).hexdigest()


def _preprocessor():
    from nbgrader.preprocessors import NbGraderPreprocessor
    return NbGraderPreprocessor


class Fingerprint(_preprocessor()):
    """(in a task) Remembers the fingerprint of each notebook the execute step is given."""

    seen: dict = {}

    def preprocess(self, nb, resources):
        Fingerprint.seen[resources["nbgrader"]["notebook"]] = fingerprint(nb)
        return nb, resources


class Capture(_preprocessor()):
    """(in a task) Keeps each notebook as the execute step left it, to send it back."""

    kept: dict = {}

    def preprocess(self, nb, resources):
        import nbformat

        name = resources["nbgrader"]["notebook"]
        Capture.kept[name] = (Fingerprint.seen[name], nbformat.writes(nb))
        return nb, resources


class Replay(_preprocessor()):
    """(in the writer) The execute step: hands back the notebook a task executed, after checking
    that the task was given the very notebook this course's sanitizing made."""

    executed: dict = {}

    def preprocess(self, nb, resources):
        import nbformat

        name = resources["nbgrader"]["notebook"]
        if os.environ.get(PAUSE_WRITE):
            _pause(os.environ[PAUSE_WRITE], f"writing {resources['nbgrader']['student']}/{name}")
        if name not in Replay.executed:
            raise RuntimeError(f"the task sent back no executed copy of {name}.ipynb")
        expected, text = Replay.executed[name]
        if fingerprint(nb) != expected:
            raise RuntimeError(f"the task executed another version of {name}.ipynb than this "
                               "course's (did the gradebook or the submission change during the run?)")
        return nbformat.reads(text, as_version=4), resources


def _pause(fifo: str, where: str) -> None:
    """(for the tests) Say ``where`` into ``fifo`` (blocks until it is read), then wait until it
    is opened again and closed: the test knows the writer is here and decides when it goes on."""
    with open(fifo, "w") as f:
        f.write(where + "\n")
    with open(fifo) as f:
        f.read()


def _dotted(pp) -> str:
    return pp if isinstance(pp, str) else f"{pp.__module__}.{pp.__qualname__}"


def _execute_index(preprocessors: list[str]) -> int:
    from nbgrader.preprocessors import Execute
    from traitlets.utils.importstring import import_item

    for i, pp in enumerate(preprocessors):
        cls = import_item(pp)
        if isinstance(cls, type) and issubclass(cls, Execute):
            return i
    raise SystemExit("Autograde.autograde_preprocessors has no execute step (a subclass of "
                     "nbgrader.preprocessors.Execute): nothing would be graded")


def _pipelines(app) -> tuple[list[str], list[str]]:
    """(the task's autograde preprocessors, the writer's): the course's, with the execute step
    fingerprinted and captured in the task, replayed in the writer."""
    from nbgrader.converters import Autograde

    configured = app.config.Autograde.get("autograde_preprocessors")
    course = [_dotted(p) for p in (configured if configured is not None
                                   else Autograde.autograde_preprocessors.default_value)]
    i = _execute_index(course)
    task = course[:i] + [_dotted(Fingerprint), course[i], _dotted(Capture)] + course[i + 1:]
    writer = course[:i] + [_dotted(Replay)] + course[i + 1:]
    return task, writer


# ============================================================================ the gradebook


def definition(db_url: str) -> dict[str, list[dict]]:
    """The gradebook's assignment definitions, as plain rows, and its schema version."""
    from nbgrader.api import Base
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = {t: [dict(r._mapping) for r in conn.execute(Base.metadata.tables[t].select())]
                    for t in DEFINITION_TABLES}
            version = conn.execute(text("SELECT version_num FROM alembic_version"))
            rows["alembic_version"] = [dict(r._mapping) for r in version]
            return rows
    finally:
        engine.dispose()


def _restore(db_url: str, rows: dict[str, list[dict]]) -> None:
    """A gradebook with these rows, made as nbgrader's ``Gradebook`` makes one (its tables, then
    the schema version), the version taken from the real gradebook instead of asking alembic."""
    from nbgrader.api import Base
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        Base.metadata.create_all(bind=engine)
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
            for row in rows["alembic_version"]:
                conn.execute(text("INSERT INTO alembic_version (version_num) VALUES (:v)"), {"v": row["version_num"]})
            for table in DEFINITION_TABLES:
                if rows.get(table):
                    conn.execute(Base.metadata.tables[table].insert(), rows[table])
    finally:
        engine.dispose()


def task_gradebook(db_url: str) -> bytes:
    """A SQLite gradebook holding only the assignment definitions of ``db_url``'s, as bytes: made
    once per run (nbgrader stamps a new gradebook by running alembic, seconds each time), it
    travels with every task."""
    with tempfile.TemporaryDirectory(prefix="course-grade-db-") as tmp:
        path = Path(tmp) / "gradebook.db"
        _restore(f"sqlite:///{path}", definition(db_url))
        return path.read_bytes()


def _files(folder: Path, skip_notebooks: bool = False) -> dict[str, bytes]:
    out = {}
    if folder.is_dir():
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            if path.is_file() and "__pycache__" not in rel.parts and ".ipynb_checkpoints" not in rel.parts \
                    and not (skip_notebooks and path.suffix == ".ipynb"):
                out[str(rel)] = path.read_bytes()
    return out


def _write_files(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        dest = folder / rel
        if dest.resolve().parent != folder.resolve() and folder.resolve() not in dest.resolve().parents:
            raise ValueError(f"a file outside the submission: {rel}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)


# ============================================================================ one task


class _ClusterStop:
    """The run's stop flag on a Dask cluster: a ``distributed.Event`` the instructor's process sets
    on Ctrl-C, read by each task on its worker (a cancelled Dask task's thread is not stopped)."""

    def __init__(self, name: str):
        from distributed import Event

        self.event = Event(name)

    def is_set(self) -> bool:
        try:
            return self.event.is_set()
        except Exception:  # noqa: BLE001 - the scheduler unreachable: the task goes on (its process
            return False  # ends with the worker, which ends when the scheduler is gone for good)


def run_task(payload: dict, stop: threading.Event | None = None, cluster_stop: str | None = None) -> dict:
    """Grade one submission in a private course, in a child process; return plain data.

    ``payload`` carries everything (see :func:`_payload`), so this runs on any machine with the
    course's environment. Never raises for a submission's fault: the result says why. ``stop``
    (a local run) or the Dask event named ``cluster_stop`` ends it early, as interrupted."""
    t0 = time.monotonic()
    student = payload["student"]
    if cluster_stop is not None:
        stop = _ClusterStop(cluster_stop)
    if stop is not None and stop.is_set():  # the run was interrupted before this task started
        return {"student": student, "ok": False, "interrupted": True, "error": "interrupted", "seconds": 0.0}
    folder = Path(tempfile.mkdtemp(prefix="course-grade-"))
    try:
        course = folder / "course"
        _write_files(course / "submitted" / student / payload["assignment"], payload["files"])
        _write_files(course / "source" / payload["assignment"], payload["source_files"])
        (course / "nbgrader_config.py").write_text(payload["config"])
        (folder / "tmp").mkdir()
        with open(folder / "task.pickle", "wb") as f:
            pickle.dump({k: payload[k] for k in ("assignment", "student", "preprocessors")}, f)
        (folder / "gradebook.db").write_bytes(payload["gradebook"])
        env = dict(os.environ, TMPDIR=str(folder / "tmp"), COURSE_GRADE_PARENT=str(os.getpid()))
        env[TASK_MARK] = payload.get("mark") or env.get(TASK_MARK, "1")
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        with open(folder / "task.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "course_tools.grade", "--task", str(folder)],
                                    cwd=course, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            bound = payload.get("bound")
            while True:
                try:
                    proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    if stop is not None and stop.is_set():
                        _end(proc)
                        return {"student": student, "ok": False, "interrupted": True,
                                "error": "interrupted", "seconds": time.monotonic() - t0}
                    if bound and time.monotonic() - t0 > bound:
                        _end(proc)
                        return {"student": student, "ok": False,
                                "error": f"grading ran past its bound of {bound:.0f} s and was stopped",
                                "seconds": time.monotonic() - t0}
        result_path = folder / "result.json"
        if result_path.exists():
            result = json.loads(result_path.read_text())
        else:
            result = {"ok": False, "error": f"the grading process ended ({proc.returncode}) without a result"}
        if not result["ok"]:
            tail = (folder / "task.log").read_text(errors="replace").strip().splitlines()
            errors = [line for line in tail if "[ERROR]" in line or "Error" in line][-3:]
            result["error"] = "; ".join([result.get("error", "")] + errors)[:600]
        result.update(student=student, seconds=time.monotonic() - t0)
        return result
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _end(proc: subprocess.Popen) -> None:
    """Stop a task's process: SIGTERM (its execute step then ends the kernel and what it started),
    then SIGKILL for whatever of it is still alive."""
    import psutil

    try:
        family = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        family = []
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        pass
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(family, timeout=10)
    proc.wait()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _task_main(folder: Path) -> int:
    """The task's process: nbgrader's autograde of one submission in the private course. If the
    process that waits for it is gone (a Dask worker killed), it removes its folder itself."""
    parent = int(os.environ.get("COURSE_GRADE_PARENT", "0"))
    try:
        return _task_body(folder, parent)
    finally:
        if parent and os.getppid() != parent:  # nobody is left to read the result
            shutil.rmtree(folder, ignore_errors=True)


def _task_body(folder: Path, parent: int) -> int:
    import ctypes

    import psutil

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG: end with the process that waits for us
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: daemons of the kernel stay ours
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    if parent and os.getppid() != parent:
        return 1
    with open(folder / "task.pickle", "rb") as f:
        task = pickle.load(f)
    result: dict = {"ok": False}
    try:
        db_url = f"sqlite:///{folder / 'gradebook.db'}"
        from nbgrader.apps import AutogradeApp

        app = AutogradeApp()
        app.initialize([task["assignment"], "--student", task["student"], "--force",
                        f"--CourseDirectory.db_url={db_url}", "--log-level=INFO"])
        app.config.Autograde.autograde_preprocessors = task["preprocessors"]
        try:
            app.start()
        except SystemExit as e:
            if e.code:
                result["error"] = "nbgrader autograde failed"
                return 1
        result = {"ok": True, "executed": Capture.kept, "scores": _scores(db_url, task["assignment"], task["student"])}
        if not Capture.kept:
            result = {"ok": False, "error": "no notebook of the submission was graded"}
        return 0
    except KeyboardInterrupt:
        result = {"ok": False, "error": "interrupted"}
        return 130
    except Exception as e:  # noqa: BLE001 - said in the result, the class goes on
        first = (str(e).strip().splitlines() or [""])[0]
        result = {"ok": False, "error": f"{type(e).__name__}: {first}"}
        return 1
    finally:
        for p in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                p.kill()
        result["cpu_seconds"], result["cpu_exact"] = _cpu()
        tmp = folder / "result.json.part"
        tmp.write_text(json.dumps(result))
        os.replace(tmp, folder / "result.json")


def _cpu() -> tuple[float, bool]:
    """(CPU seconds of this process since it started and of everything it started, the sandboxed
    kernels and ranks counted exactly by their cgroups; whether that is exact): the whole
    submission's cost, for a task; see :func:`course_tools.autograde.cpu_seconds`."""
    from course_tools.autograde import cpu_seconds

    return cpu_seconds()


def _is_db_url(target) -> bool:
    """``c.CourseDirectory.db_url`` or ``c["CourseDirectory"]["db_url"]`` as an assignment target."""
    import ast

    def name(node):
        if isinstance(node, ast.Attribute):
            return node.attr
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            return node.slice.value
        return None

    return name(target) == "db_url" and name(getattr(target, "value", None)) == "CourseDirectory"


def shipped_config(text: str, db_url: str) -> tuple[str, bool]:
    """The course's ``nbgrader_config.py`` as it travels with each task: every assignment to
    ``c.CourseDirectory.db_url`` taken out (a task grades against its own private gradebook, so
    the real one's URL and password stay here). Also returns whether the gradebook's password
    is still in the text (set elsewhere, e.g. a variable the URL was built from)."""
    import ast
    import re

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text, False  # nbgrader will say what is wrong with it

    class Strip(ast.NodeTransformer):
        def visit_Assign(self, node):
            return ast.Pass() if any(_is_db_url(t) for t in node.targets) else node

        def visit_AnnAssign(self, node):
            return ast.Pass() if _is_db_url(node.target) else node

        visit_AugAssign = visit_AnnAssign

    if any(isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and
           any(_is_db_url(t) for t in getattr(n, "targets", [getattr(n, "target", None)]))
           for n in ast.walk(tree)):
        text = "# c.CourseDirectory.db_url is not sent to the grading workers\n" + \
            ast.unparse(ast.fix_missing_locations(Strip().visit(tree))) + "\n"
    left = False
    try:
        from sqlalchemy.engine import make_url

        password = make_url(db_url).password
    except Exception:  # noqa: BLE001 - not a URL sqlalchemy reads: nbgrader will say so
        password = None
    if password:
        from urllib.parse import quote

        for form in {str(password), quote(str(password), safe="")}:
            left |= re.search(rf"(?<![A-Za-z0-9_]){re.escape(form)}(?![A-Za-z0-9_])", text) is not None
    return text, left


def _scores(db_url: str, assignment: str, student: str) -> dict[str, dict[str, float]]:
    """notebook -> grade_id -> the autograder's score, of one submission."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url) as gb:
        sub = gb.find_submission(assignment, student)
        return {nb.name: {g.name: float(g.auto_score or 0) for g in nb.grades} for nb in sub.notebooks}


# ============================================================================ the class


class Course:
    """The course in the current folder, as nbgrader sees it (its own config loading)."""

    def __init__(self, assignment: str):
        from nbgrader.apps import AutogradeApp

        self.app = AutogradeApp()
        self.app.initialize([assignment, "--log-level=ERROR"])
        for handler in self.app.log.handlers:  # its errors are said per student, at the end
            handler.setLevel(logging.CRITICAL)
        self.assignment = assignment
        self.coursedir = self.app.coursedir
        self.coursedir.assignment_id = assignment
        self.root = Path(self.coursedir.root)
        self.db_url = self.coursedir.db_url
        self.task_pps, self.writer_pps = _pipelines(self.app)
        config = self.root / "nbgrader_config.py"
        self.config_text = config.read_text() if config.exists() else ""
        #: what travels with every task: the config without the gradebook's URL (and password)
        self.shipped_config, self.secret_left = shipped_config(self.config_text, self.db_url)

    def preflight(self) -> str | None:
        """The course's preflight, once, here, before any submission goes out: the reference
        answers of each notebook must pass in this machine's sandbox (what ``nbgrader autograde``
        checks before its first student; a task's private course holds no source to check).
        ``None``, or what is wrong and how to fix it."""
        from traitlets.utils.importstring import import_item

        step_class = import_item(self.task_pps[_execute_index(self.task_pps)])
        if not hasattr(step_class, "_run_preflight"):
            return None  # not the course's execute step: it has no preflight
        step = step_class(config=self.app.config)
        if not step.preflight:
            return None
        source = Path(self.coursedir.format_path(self.coursedir.source_directory, ".", self.assignment))
        for nb in sorted(source.glob("*.ipynb")):
            problem = step._run_preflight({"assignment": self.assignment, "notebook": nb.stem,
                                           "db_url": self.db_url})
            if problem:
                return f"{nb.name}: {problem}"
        return None

    def folder(self, tree: str, student: str) -> Path:
        return Path(self.coursedir.format_path(tree, student, self.assignment))

    def students(self) -> list[str]:
        base = Path(self.coursedir.format_path(self.coursedir.submitted_directory, ".", "."))
        return sorted(p.parent.name for p in base.glob(f"*/{self.assignment}") if p.is_dir())

    def graded(self, student: str) -> bool:
        """Whether ``nbgrader autograde`` would skip this submission (autograded, and its
        submission no newer) and the gradebook holds it whole: every autograded test cell of
        every notebook scored. (This grader's own writes are whole by construction: the
        ``autograded/`` folder appears only once the rows are written and checked; the scores
        are checked too for a folder plain ``nbgrader autograde`` wrote.)"""
        from nbgrader.api import Gradebook, MissingEntry

        dest = self.folder(self.coursedir.autograded_directory, student)
        if not dest.is_dir():
            return False
        new = self.coursedir.get_existing_timestamp(str(self.folder(self.coursedir.submitted_directory, student)))
        old = self.coursedir.get_existing_timestamp(str(dest))
        if new is not None and old is not None and new > old:
            return False
        with Gradebook(self.db_url) as gb:
            try:
                sub = gb.find_submission(self.assignment, student)
            except MissingEntry:
                return False
            for nb in sub.notebooks:
                solutions = {c.name for c in nb.notebook.solution_cells}
                tests = {c.name for c in nb.notebook.grade_cells if c.cell_type == "code"} - solutions
                if any(g.name in tests and g.auto_score is None for g in nb.grades):
                    return False  # a write that stopped half-way
        return True

    def payload(self, student: str, gradebook: bytes, bound: float | None, mark: str) -> dict:
        return {"assignment": self.assignment, "student": student, "gradebook": gradebook,
                "files": _files(self.folder(self.coursedir.submitted_directory, student)),
                "source_files": _files(self.folder(self.coursedir.source_directory, "."), skip_notebooks=True),
                "config": self.shipped_config, "preprocessors": self.task_pps, "bound": bound, "mark": mark}

    def bound(self) -> float:
        """Seconds one submission may take: every code cell at its limit, a kernel start per
        notebook, plus two minutes (the configured Execute limits)."""
        import nbformat

        cfg = self.app.config.get("Execute", {})
        timeout, startup = float(cfg.get("timeout", 30) or 30), float(cfg.get("startup_timeout", 60))
        source = self.folder(self.coursedir.source_directory, ".")
        cells = nbs = 0
        for path in source.glob("*.ipynb"):
            nbs += 1
            cells += sum(c.cell_type == "code" for c in nbformat.read(path, as_version=4).cells)
        return cells * timeout + nbs * startup + 120

    def write(self, result: dict) -> dict[str, dict[str, float]]:
        """Write one result into the real gradebook and ``autograded/`` with nbgrader's own
        converter (:class:`Replay` as its execute step); return the gradebook's scores.

        The converter builds the ``autograded/`` folder under :data:`STAGING`; once its rows
        are written and hold the scores the task found, the folder is moved into place (a
        rename), so :meth:`graded` never sees a submission written half-way, whatever stops
        this process. If the write fails or the scores differ, the submission is taken out of
        the gradebook and ``autograded/`` (:meth:`discard`) and the error raised: a rerun
        grades it again."""
        student = result["student"]
        try:
            self._convert(result)
            scores = _scores(self.db_url, self.assignment, student)
            if scores != result["scores"]:
                raise RuntimeError(f"the gradebook holds {scores}, the worker scored {result['scores']}")
        except BaseException as e:
            self.discard(student)
            if isinstance(e, Exception):
                raise RuntimeError(f"{e}; nothing of it was kept, a rerun grades it again") from None
            raise
        self._publish(student)
        return scores

    def _convert(self, result: dict) -> None:
        from nbgrader.converters import Autograde
        from nbgrader.converters.base import NbGraderException

        student = result["student"]
        Replay.executed = result["executed"]
        self.app.config.Autograde.autograde_preprocessors = self.writer_pps
        errors = _Errors()
        self.app.log.addHandler(errors)
        self.coursedir.student_id = student
        real = self.coursedir.autograded_directory
        self.coursedir.autograded_directory = STAGING
        try:
            converter = Autograde(coursedir=self.coursedir, parent=self.app)
            converter.force = True
            converter.create_student = True
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # SQLAlchemy's notes on nbgrader's sessions
                    converter.start()
            except NbGraderException as e:
                raise RuntimeError("; ".join(errors.lines[-3:]) or str(e)) from None
        finally:
            self.coursedir.autograded_directory = real
            self.coursedir.student_id = "*"
            self.app.log.removeHandler(errors)
            Replay.executed = {}
        if errors.lines:
            raise RuntimeError("; ".join(errors.lines[-3:]))

    def _publish(self, student: str) -> None:
        """Move the staged ``autograded/`` folder into place (the one that was there goes first,
        aside, so the folder is at no time a mix of both)."""
        staged = self.folder(STAGING, student)
        dest = self.folder(self.coursedir.autograded_directory, student)
        aside = self.root / STAGING / f".replaced-{student}-{os.getpid()}"
        if dest.exists():
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(dest, aside)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, dest)
        shutil.rmtree(aside, ignore_errors=True)
        self._tidy()

    def discard(self, student: str) -> None:
        """Take a submission out of the gradebook and of ``autograded/`` (staged or not)."""
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(self.db_url) as gb:
            with contextlib.suppress(MissingEntry):
                gb.remove_submission(self.assignment, student)
        for tree in (STAGING, self.coursedir.autograded_directory):
            shutil.rmtree(self.folder(tree, student), ignore_errors=True)
        self._tidy()

    def _tidy(self) -> None:
        """Remove the staging folders left empty."""
        staging = self.root / STAGING
        if staging.is_dir():
            for folder in sorted(staging.rglob("*"), key=lambda p: -len(p.parts)) + [staging]:
                if folder.is_dir():
                    with contextlib.suppress(OSError):
                        folder.rmdir()

    def summary(self, student: str) -> str:
        from nbgrader.api import Gradebook

        with Gradebook(self.db_url) as gb:
            sub = gb.find_submission(self.assignment, student)
            text = f"{sub.score:g} of {sub.max_score:g}"
            if sub.late_submission_penalty:
                text += f", late: penalty {sub.late_submission_penalty:g}"
            return text


class _Errors(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage().strip().splitlines()[-1][:300] if record.getMessage().strip() else "")


@contextlib.contextmanager
def _one_writer(db_url: str):
    """With SQLite, one process writes the gradebook: a second run waits for nothing, it is refused."""
    import fcntl

    if not db_url.startswith("sqlite:///"):
        yield
        return
    path = Path(db_url.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    from nbgrader.api import Gradebook

    Gradebook(db_url).close()
    with open(path, "rb+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(
                f"another course_tools.grade run is writing {path}: a SQLite gradebook has one "
                "writer. Wait for it to end, or point c.CourseDirectory.db_url at PostgreSQL "
                "(README, instructor section) to grade from several machines.") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class _Stopped(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP: the run stops (exit status 128 + the signal's number)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stop(signum, frame):
    raise _Stopped(signum)


@contextlib.contextmanager
def _stop_signals():
    """For the run: Ctrl-C, SIGTERM and SIGHUP stop it cleanly (:class:`_Stopped`), all alike."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only: whoever runs us there handles them
        return
    previous = {s: signal.signal(s, _raise_stop) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _held_signals():
    """A stop signal while one submission is written, or while the run is stopping, is kept
    for later: it yields the list of signals that came."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    previous = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in STOP_SIGNALS}
    try:
        yield got
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop_cluster_tasks(client, futures: list, name: str) -> None:
    """Ctrl-C on a Dask run: every task still running ends its grading process (its kernel and
    ranks included) and returns unwritten, every task not started returns at once; wait for both,
    so nothing of the run is left on any worker, then forget the tasks and the flag."""
    from distributed import Event, wait

    flag = Event(name, client=client)
    try:
        flag.set()
        wait(futures, timeout=STOP_GRACE + 30)
    except Exception:  # noqa: BLE001 - a worker or the scheduler lost: its tasks end with it
        pass
    finally:
        with contextlib.suppress(Exception):
            client.cancel(futures)
            flag.clear()
        client.close()


def slots_allowed(cores: int, free_bytes: int, budgeted: bool) -> tuple[int, str]:
    """The default number of submissions graded at once on a machine, and why.

    One per core, fewer if memory is short (:data:`SLOT_BYTES` each). Every time limit of a test
    is wall-clock (a pool's timeout, the cell's, the 1.2 s within which every rank must return
    after a save): a correct answer passes them when its submission gets about a core. Each
    submission's cgroup has an equal CPU weight, so with at most one slot per core each gets at
    least a core while all are busy, however many ranks the others run (busy-looping hangs
    included), as serial nbgrader on a one-core machine would. Without per-submission cgroups
    (``budgeted`` False) every rank competes alone and a pool has up to :data:`POOL_RANKS` of
    them: one slot per that many cores."""
    n = max(1, min(cores, free_bytes // SLOT_BYTES))
    why = f"one per core: {cores} cores, {free_bytes / 2**30:.0f} GiB free, {SLOT_BYTES / 2**30:.0f} GiB per slot"
    if not budgeted:
        n = max(1, min(n, cores // POOL_RANKS))
        why += (f"; no per-submission cgroup here, so each rank of a pool competes on its own: "
                f"one slot per {POOL_RANKS} cores")
    return n, why


def budgeted(course: Course) -> bool:
    """Whether each submission of this course gets a cgroup here (the course's execute step makes
    one, its budget is not off, and this machine lets it)."""
    from traitlets.utils.importstring import import_item

    from course_tools import budget
    from course_tools.autograde import CourseExecute

    step = import_item(course.task_pps[_execute_index(course.task_pps)])
    if not (isinstance(step, type) and issubclass(step, CourseExecute)):
        return False
    if course.app.config.get("CourseExecute", {}).get("budget", "auto") == "off":
        return False
    group, _ = budget.create(budget.Budget())
    if group is None:
        return False
    group.remove()
    return True


def _busy() -> str | None:
    """A warning if this machine is already busy with other work (its load average at least its
    cores): that work takes its share from every submission's cgroup alike, and a submission
    needs about a quarter of a core for its first test cell (which starts the pools' fork server)
    to end within 30 s; serial nbgrader is as exposed."""
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    if load < cores:
        return None
    return (f"warning: this machine is busy before grading starts (load average {load:.1f} on {cores} "
            "cores): other work takes CPU from every submission, and a correct answer can then run "
            "past a wall-clock limit, as in serial nbgrader. For scores that do not depend on the "
            "load, grade on a quiet machine (README: grading a whole class in parallel).")


def default_workers(course: Course) -> tuple[int, str]:
    """:func:`slots_allowed` on this machine, for this course."""
    import psutil

    return slots_allowed(len(os.sched_getaffinity(0)), psutil.virtual_memory().available, budgeted(course))


def grade(assignment: str, workers: int | None = None, students: list[str] | None = None,
          force: bool = False, scheduler: str | None = None, out=sys.stderr, progress: bool = True,
          bound: float | None = None, stats: Path | None = None) -> int:
    """Grade the class; return the exit status (0: all graded, 1: some could not be, 130, 143 or
    129: stopped by Ctrl-C, SIGTERM or SIGHUP). ``stats``: a JSON file to write the run's figures
    to (per submission its wall and CPU seconds and its write's, the start-up, the total)."""
    with _stop_signals():
        try:
            return _grade(assignment, workers, students, force, scheduler, out, progress, bound, stats)
        except _Stopped as e:  # before any task went out (a stop later is handled in _grade)
            print(f"\nstopped ({e}) before grading began: nothing was written", file=out, flush=True)
            return 128 + e.signum


def _grade(assignment, workers, students, force, scheduler, out, progress, bound, stats) -> int:
    from tqdm.auto import tqdm

    started = time.monotonic()
    course = Course(assignment)
    everyone = course.students()
    if students:
        unknown = [s for s in students if s not in everyone]
        if unknown:
            raise SystemExit(f"no submission of {assignment} for {', '.join(unknown)} in "
                             f"{course.coursedir.submitted_directory}/ (nbgrader collect puts them there)")
    todo = list(dict.fromkeys(students)) if students else everyone
    if not todo:
        raise SystemExit(f"no submission of {assignment} in {course.coursedir.submitted_directory}/")
    if scheduler and course.secret_left:
        raise SystemExit(
            "nbgrader_config.py holds the gradebook's password outside `c.CourseDirectory.db_url = ...` "
            "(a variable the URL is built from?), and the config travels with every task to the "
            "cluster's workers, which do not need it. Write the password only in that assignment, "
            "or read it from the environment (os.environ), then run again.")
    with _one_writer(course.db_url):
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(course.db_url) as gb:
            try:
                gb.find_assignment(assignment)
            except MissingEntry:
                raise SystemExit(f"no assignment {assignment!r} in the gradebook: run "
                                 f"nbgrader generate_assignment {assignment} first") from None
        skipped = [] if force else [s for s in todo if course.graded(s)]
        todo = [s for s in todo if s not in skipped]
        if scheduler:
            where = f"on the Dask cluster at {scheduler}"
        else:
            if workers is None:
                workers, why = default_workers(course)
                where = f"{workers} at a time ({why})"
            else:
                where = f"{workers} at a time"
                cores = len(os.sched_getaffinity(0))
                if workers > cores:
                    where += (f"; more slots than this machine's {cores} cores: each submission gets "
                              "less than a core when all are busy, and a correct answer can run past a "
                              "time limit (see the README: grading in parallel, equal scores)")
        print(f"grading {len(todo)} submission(s) of {assignment} {where}"
              + (f"; {len(skipped)} already graded (--force regrades them)" if skipped else ""),
              file=out, flush=True)
        if not todo:
            return 0
        busy = _busy()
        if busy and not scheduler:
            print(busy, file=out, flush=True)
        t0 = time.monotonic()
        problem = course.preflight()
        if problem:
            print(f"grading stopped before any submission (preflight, {time.monotonic() - t0:.0f} s): "
                  f"{problem}", file=out, flush=True)
            return 1
        gradebook = task_gradebook(course.db_url)
        bound = bound or course.bound()
        mark = os.environ.get(TASK_MARK) or f"{os.getpid()}-{time.time_ns()}"
        failed: dict[str, str] = {}
        figures: dict[str, dict] = {}
        done = 0
        bar = tqdm(total=len(todo), unit="submission", desc=f"grading {assignment}", file=out,
                   disable=not progress, dynamic_ncols=True, mininterval=1.0)
        stop = threading.Event()
        pool = client = None
        futures: dict = {}
        stopped: int | None = None
        startup = None
        try:
            if scheduler:
                from distributed import Client
                from distributed import as_completed as dask_completed

                client = Client(scheduler, timeout=30)
                startup = time.monotonic() - started
                futures = {client.submit(run_task, course.payload(s, gradebook, bound, mark),
                                         cluster_stop=f"grade-stop-{mark}",
                                         key=f"grade-{assignment}-{s}-{mark}",
                                         pure=False): s for s in todo}
                stream = dask_completed(futures)
            else:
                pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grade")
                startup = time.monotonic() - started
                futures = {pool.submit(run_task, course.payload(s, gradebook, bound, mark), stop): s for s in todo}
                stream = as_completed(futures)
            for fut in stream:
                student = futures[fut]
                try:
                    result = fut.result()
                except Exception as e:  # noqa: BLE001 - a lost task (e.g. KilledWorker) fails its own slot
                    result = {"student": student, "ok": False, "error": f"{type(e).__name__}: {e}"}
                figure = figures[student] = {k: result.get(k) for k in ("seconds", "cpu_seconds", "cpu_exact")}
                held: list = []
                if result["ok"]:
                    try:
                        w0, c0 = time.monotonic(), time.thread_time()
                        with _held_signals() as held:
                            course.write(result)
                            done += 1
                            said = course.summary(student)
                        figure.update(write_seconds=time.monotonic() - w0, write_cpu=time.thread_time() - c0)
                        bar.write(f"graded {student}: {said} ({result['seconds']:.0f} s)", file=out)
                    except Exception as e:  # noqa: BLE001
                        failed[student] = f"writing the gradebook failed: {e}"
                else:
                    failed[student] = result.get("error") or "unknown error"
                figure["ok"] = student not in failed
                bar.update(1)
                bar.set_postfix(failed=len(failed))
                if held:  # a stop signal came while that submission was written
                    raise _Stopped(held[0])
        except _Stopped as e:
            stopped = e.signum
            with _held_signals():  # a second Ctrl-C does not cut the stopping short
                stop.set()
                bar.close()
                if pool is not None:
                    pool.shutdown(wait=True, cancel_futures=True)
                if client is not None:
                    _stop_cluster_tasks(client, list(futures), f"grade-stop-{mark}")
            print(f"\ninterrupted ({signal.Signals(stopped).name}): {done} graded and written, "
                  f"{len(todo) - done - len(failed)} not; run it again to grade what is missing",
                  file=out, flush=True)
        finally:
            bar.close()
            if pool is not None:
                pool.shutdown(wait=True)
            if client is not None:
                client.close()
            course._tidy()
    wall = time.monotonic() - started
    _write_stats(stats, course, figures, startup, wall, workers if not scheduler else None, scheduler)
    if stopped is not None:
        return 128 + stopped
    cpu = [f["cpu_seconds"] for f in figures.values() if f.get("cpu_seconds") is not None]
    exact = all(f.get("cpu_exact") for f in figures.values() if f.get("cpu_seconds") is not None)
    if cpu:
        print(f"took {wall:.0f} s; grading used {sum(cpu):.0f} CPU-s, {sum(cpu) / len(cpu):.1f} per submission"
              + (" (the sandboxed kernels and ranks counted by their cgroups)" if exact else
                 " at least (some were graded without a cgroup to count their kernels and ranks)"), file=out)
    print(f"{done} of {len(todo)} graded" + (f", {len(failed)} could not be:" if failed else ""), file=out)
    for student, why in sorted(failed.items()):
        print(f"  {student}: {why}", file=out)
    return 1 if failed else 0


def _write_stats(path, course, figures, startup, wall, workers, scheduler) -> None:
    """The run's figures, for the bench: per submission, and for the instructor's process."""
    if path is None:
        return
    from course_tools.autograde import cpu_seconds

    own, exact = cpu_seconds()  # this process, its preflight's sandbox included
    data = {"assignment": course.assignment, "workers": workers, "scheduler": scheduler,
            "cores": len(os.sched_getaffinity(0)), "startup_seconds": startup, "wall_seconds": wall,
            "instructor_cpu_seconds": own, "instructor_cpu_exact": exact, "submissions": figures}
    tmp = Path(f"{path}.part")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def report(assignment: str, out=sys.stdout) -> int:
    from course_tools import class_report

    course = Course(assignment)
    rep = class_report.collect(course.root, assignment, course.db_url)
    if not rep.totals:
        raise SystemExit(f"no graded submission of {assignment} in the gradebook: grade them first")
    print(class_report.text(rep), file=out)
    png = course.root / "build" / "class-report" / f"{assignment}.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    class_report.plot(rep).savefig(png, dpi=100)
    print(f"\nplots: {png}", file=out)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m course_tools.grade", description=__doc__.splitlines()[0])
    ap.add_argument("assignment", nargs="?", help="the assignment (a depth: beginner, developer, researcher)")
    ap.add_argument("--workers", type=int, help="submissions graded at a time on this machine "
                    "(default: what its cores and memory allow)")
    ap.add_argument("--scheduler", help="grade on a Dask distributed cluster: tcp://HOST:PORT of its scheduler")
    ap.add_argument("--student", nargs="+", action="extend", help="grade only these students")
    ap.add_argument("--force", action="store_true", help="regrade submissions already graded")
    ap.add_argument("--bound", type=float, help="seconds one submission may take before it is stopped "
                    "and reported (default: every code cell at its limit, a kernel start per "
                    "notebook, plus two minutes)")
    ap.add_argument("--stats", type=Path, help="write the run's figures to this JSON file (per "
                    "submission its wall time and CPU seconds, the writer's time, the start-up)")
    ap.add_argument("--report", action="store_true", help="grade nothing: print the class report "
                    "(per test the share that passed, common failures, linter codes, scores) and "
                    "save its plots to build/class-report/ASSIGNMENT.png")
    ap.add_argument("--task", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    # nbgrader runs `alembic` when it makes a gradebook: this environment's bin/ first
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    if args.task:
        return _task_main(args.task)
    if not args.assignment:
        ap.error("the assignment to grade is needed")
    if args.workers is not None and args.workers < 1:
        ap.error("--workers must be 1 or more")
    if args.scheduler and args.workers:
        ap.error("--workers is for this machine; with --scheduler the cluster's workers grade")
    if args.report:
        return report(args.assignment)
    if args.bound is not None and args.bound <= 0:
        ap.error("--bound must be a number of seconds above 0")
    return grade(args.assignment, args.workers, args.student, args.force, args.scheduler,
                 bound=args.bound, stats=args.stats)


if __name__ == "__main__":
    # run as course_tools.grade, not __main__: the preprocessors nbgrader imports by name
    # (course_tools.grade.Replay, Capture...) must be the very classes this run fills and reads
    from course_tools.grade import main as _main

    sys.exit(_main())
