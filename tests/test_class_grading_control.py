"""`python -m course_tools.grade`: what the instructor controls and what stops it.

On the small class of tests/class_course.py (its preflight off: tests/test_class_grading.py runs
it): --student grades only those named; without --workers the default and its reason are said;
the progress bar and its ETA reach a pipe; --force rewrites a submission's row, never a second
one; a submission that runs past its bound costs its own slot; SIGTERM while a submission is
written is held until the write is complete, and a write killed half-way (SIGKILL) leaves a
submission that the next run grades again; a writer that finds other scores than the worker's
keeps nothing; what travels to a worker holds no gradebook password.
"""

from __future__ import annotations

import datetime
import errno
import os
import pickle
import re
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from course_tools import venv_env
from tests.class_course import ASSIGNMENT, NOTEBOOK, grade, gradebook_rows, make_class, marked

NO_PREFLIGHT = "c.CourseExecute.preflight = False\n"
#: What plain `nbgrader autograde` writes for these two (tests/test_class_grading.py compares the two graders).
EXPECTED = {
    "s1": {"grades": {"test_double": (2.0, None, False), "test_halve": (1.0, None, False)}, "penalty": 0.0,
           "timestamp": datetime.datetime(2026, 1, 10, 11, 0), "seconds_late": 0, "score": 3.0, "grade_rows": 2},
    "s2": {"grades": {"test_double": (2.0, None, False), "test_halve": (1.0, None, False)}, "penalty": 3.0,
           "timestamp": datetime.datetime(2026, 1, 11, 9, 30), "seconds_late": 77400.0, "score": 3.0,
           "grade_rows": 2},
}


def sqlite(course: Path) -> str:
    return f"sqlite:///{course}/gradebook.db"


def submission_rows(course: Path, student: str) -> int:
    """How many submissions of the assignment the gradebook holds for ``student``."""
    from nbgrader.api import Assignment, Gradebook, SubmittedAssignment

    with Gradebook(sqlite(course)) as gb:
        return gb.db.query(SubmittedAssignment).join(Assignment).filter(
            Assignment.name == ASSIGNMENT, SubmittedAssignment.student_id == student).count()


def autograded(course: Path) -> list[str]:
    folder = course / "autograded"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_student_default_workers_progress_and_force(tmp_path):
    course = make_class(tmp_path / "course", students=("s1", "s2"), extra_config=NO_PREFLIGHT)
    proc = grade(course, "--student", "s2")
    assert proc.returncode == 0
    out = proc.stderr
    # the default slots, with why: the rule of course_tools.grade.slots_allowed, on this machine's figures
    said = re.search(r"grading 1 submission\(s\) of tiny (\d+) at a time \(one per core: (\d+) cores?, "
                     r"(\d+) GiB free, 3 GiB per slot(; [^)]*)?\)", out)
    assert said, out
    from course_tools.grade import slots_allowed

    n, cores, budgeted = int(said[1]), int(said[2]), "no per-submission cgroup" not in (said[4] or "")
    assert cores == len(os.sched_getaffinity(0))
    assert 1 <= n <= cores and n == slots_allowed(cores, int(said[3]) * 2**30 + 2**29, budgeted)[0]
    # the progress bar reaches a pipe too: count, failures, elapsed<remaining
    assert re.search(r"grading tiny: 100%\|[^|]*\| 1/1 \[\d\d:\d\d<\d\d:\d\d, [^]]*failed=0\]", out), out
    assert "graded s2: 3 of 3, late: penalty 3" in out
    rows = gradebook_rows(sqlite(course), ["s1", "s2"])
    assert rows == {"s1": None, "s2": EXPECTED["s2"]}, "only the student named is graded"
    assert autograded(course) == ["s2"]

    again = grade(course, "--student", "s2")
    assert again.returncode == 0 and "grading 0 submission(s) of tiny" in again.stderr
    assert "1 already graded (--force regrades them)" in again.stderr and "graded s2" not in again.stderr

    before = (course / "autograded" / "s2" / ASSIGNMENT / NOTEBOOK).stat().st_mtime_ns
    forced = grade(course, "--student", "s2", "--force", "--workers", "1")
    assert forced.returncode == 0
    assert "grading 1 submission(s) of tiny 1 at a time" in forced.stderr and "already graded" not in forced.stderr
    assert "graded s2: 3 of 3, late: penalty 3" in forced.stderr
    assert (course / "autograded" / "s2" / ASSIGNMENT / NOTEBOOK).stat().st_mtime_ns > before, "rewritten"
    assert gradebook_rows(sqlite(course), ["s1", "s2"]) == {"s1": None, "s2": EXPECTED["s2"]}
    assert submission_rows(course, "s2") == 1, "the row is rewritten, not a second one written"
    assert autograded(course) == ["s2"] and not (course / ".autograded-partial").exists()


def test_a_submission_past_its_bound_costs_its_slot_only(tmp_path):
    """s3's answer hangs: with a 240 s cell limit its pool waits 120 s. The run's bound of 75 s
    stops its grading (kernel, ranks and all) while s1, graded beside it, is written."""
    mark = uuid.uuid4().hex
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    course = make_class(tmp_path / "course", students=("s1", "s3"),
                        extra_config=NO_PREFLIGHT + "c.Execute.timeout = 240\n")
    t0 = time.monotonic()
    proc = grade(course, "--workers", "2", "--bound", "75",
                 env=venv_env(COURSE_GRADE_TASK=mark, TMPDIR=str(private_tmp)))
    took = time.monotonic() - t0
    assert proc.returncode == 1, "a submission could not be graded: the exit status says so"
    assert "1 of 2 graded, 1 could not be:" in proc.stderr
    assert "  s3: grading ran past its bound of 75 s and was stopped" in proc.stderr
    assert "graded s1: 3 of 3" in proc.stderr
    assert took < 120, f"the run waited for s3's hang ({took:.0f} s)"
    assert gradebook_rows(sqlite(course), ["s1", "s3"]) == {"s1": EXPECTED["s1"], "s3": None}
    assert autograded(course) == ["s1"]
    assert marked(mark) == [], "s3's kernel and ranks were stopped with it"
    assert list(private_tmp.iterdir()) == [], "its temporary folders are gone"


class Paused:
    """The writer's pause (course_tools.grade.PAUSE_WRITE): a FIFO the writer says where it is
    into, then waits on until :meth:`go`."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.fifo = folder / "pause"
        os.mkfifo(self.fifo)
        self.said: list[str] = []
        self.thread = threading.Thread(target=self._listen, daemon=True)
        self.thread.start()

    def _listen(self):
        with open(self.fifo) as f:  # blocks until the writer opens it
            self.said.append(f.read().strip())

    def wait(self, proc: subprocess.Popen, timeout: float = 600) -> str:
        """What the writer said once it has paused (the process must not end first)."""
        deadline = time.monotonic() + timeout  # a safety net: the tasks run first
        while self.thread.is_alive() and proc.poll() is None and time.monotonic() < deadline:
            self.thread.join(0.2)
        ended = proc.poll() is not None
        assert self.said, ("the writer never paused", proc.poll(), proc.stderr.read() if ended else "")
        return self.said[0]

    def go(self, proc: subprocess.Popen):
        """Let the writer go on: it waits in open() for a writer of the FIFO (unless its process
        has ended: then there is nobody to let go)."""
        while True:
            try:
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                if e.errno != errno.ENXIO:  # ENXIO: not opened for reading yet
                    raise
                if proc.poll() is not None:
                    return
                select.select([], [], [], 0.05)
                continue
            os.close(fd)
            return


def start(course: Path, env: dict, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "course_tools.grade", ASSIGNMENT, *args], cwd=course,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigterm_during_a_write_is_held_and_a_killed_write_is_graded_again(tmp_path):
    """SIGTERM arrives while a submission is half-written (its row committed, its scores not yet):
    the write completes, then the run stops (exit 143), leaving nothing running; the rerun grades
    only the other submission. Then that rerun's write is killed (SIGKILL) at the same point: the
    submission does not count as graded, and the next run grades it whole."""
    mark = uuid.uuid4().hex
    course = make_class(tmp_path / "course", students=("s1", "s2"), extra_config=NO_PREFLIGHT)
    pause = Paused(tmp_path)
    env = venv_env(COURSE_GRADE_TASK=mark, COURSE_GRADE_TEST_PAUSE_WRITE=str(pause.fifo))
    proc = start(course, env, "--workers", "2")
    try:
        where = pause.wait(proc)
        first = re.fullmatch(r"writing (s[12])/tiny", where)[1]
        other = {"s1": "s2", "s2": "s1"}[first]
        proc.send_signal(signal.SIGTERM)  # the writer is inside nbgrader's converter now
        pause.go(proc)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(out, err)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert f"graded {first}: 3 of 3" in err
    assert "interrupted (SIGTERM): 1 graded and written, 1 not; run it again" in err
    rows = gradebook_rows(sqlite(course), ["s1", "s2"])
    assert rows == {first: EXPECTED[first], other: None}, "the held write is whole, the other not begun"
    assert autograded(course) == [first]
    psutil.wait_procs(marked(mark), timeout=10)
    assert marked(mark) == [], "the run's tasks ended with it"

    pause = Paused(tmp_path / "again")
    rerun = start(course, dict(env, COURSE_GRADE_TEST_PAUSE_WRITE=str(pause.fifo)))
    try:
        assert pause.wait(rerun) == f"writing {other}/tiny"
        rerun.kill()  # SIGKILL: nothing is held, the write stops half-way
        rerun.wait()
    finally:
        if rerun.poll() is None:
            rerun.kill()
            rerun.wait()
    assert submission_rows(course, other) == 1, "half-written: its row was committed"
    last = grade(course, env=venv_env(COURSE_GRADE_TASK=mark))
    assert last.returncode == 0
    assert "grading 1 submission(s)" in last.stderr and "1 already graded" in last.stderr
    assert f"graded {other}: 3 of 3" in last.stderr
    assert gradebook_rows(sqlite(course), ["s1", "s2"]) == EXPECTED
    assert submission_rows(course, other) == 1 and autograded(course) == ["s1", "s2"]
    assert not (course / ".autograded-partial").exists(), "the killed write's staging folder is gone"
    psutil.wait_procs(marked(mark), timeout=10)
    assert marked(mark) == []


def test_scores_that_differ_from_the_worker_s_keep_nothing(tmp_path, monkeypatch):
    """The writer's scores must be the worker's: if not, the submission is taken out of the
    gradebook and autograded/, and a rerun grades it (here: the worker's scores altered)."""
    from course_tools import grade as grader

    course = make_class(tmp_path / "course", students=("s1",), extra_config=NO_PREFLIGHT)
    monkeypatch.chdir(course)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    c = grader.Course(ASSIGNMENT)
    result = grader.run_task(c.payload("s1", grader.task_gradebook(c.db_url), c.bound(), uuid.uuid4().hex))
    assert result["ok"], result
    assert result["scores"] == {"tiny": {"test_double": 2.0, "test_halve": 1.0}}
    assert result["cpu_seconds"] > 1 and result["cpu_exact"], "the kernel and ranks counted by its cgroup"
    told = dict(result, scores={"tiny": {"test_double": 2.0, "test_halve": 0.0}})
    with pytest.raises(RuntimeError, match=r"the worker scored .*nothing of it was kept, a rerun grades it again"):
        c.write(told)
    assert gradebook_rows(sqlite(course), ["s1"]) == {"s1": None}
    assert autograded(course) == [] and not (course / ".autograded-partial").exists()
    assert not c.graded("s1")
    assert c.write(result) == result["scores"]
    assert c.graded("s1") and gradebook_rows(sqlite(course), ["s1"]) == {"s1": EXPECTED["s1"]}


def test_what_travels_holds_no_password(tmp_path, monkeypatch):
    """A task's payload carries the course's config without `c.CourseDirectory.db_url`; a password
    set elsewhere in the config stops a Dask run, saying where it is and what to do."""
    from course_tools import grade as grader

    password = "pw-" + uuid.uuid4().hex
    url = f"postgresql+psycopg://grader:{password}@127.0.0.1:9/gradebook"
    course = make_class(tmp_path / "course", students=("s1",))  # its gradebook: SQLite
    config = course / "nbgrader_config.py"
    text = config.read_text()
    config.write_text(text + f"c.CourseDirectory.db_url = {url!r}\n")
    monkeypatch.chdir(course)
    c = grader.Course(ASSIGNMENT)
    assert c.db_url == url and not c.secret_left
    payload = c.payload("s1", b"", 100.0, "mark")
    assert password.encode() not in pickle.dumps(payload)
    assert "postgresql" not in payload["config"] and "c.Execute.timeout = 30" in payload["config"]
    assert not re.search(r"^c\.CourseDirectory\.db_url *=", payload["config"], re.M)
    config.write_text(text + f"PASSWORD = {password!r}\n"
                      f"c.CourseDirectory.db_url = f'postgresql+psycopg://grader:{{PASSWORD}}@127.0.0.1:9/gradebook'\n")
    c = grader.Course(ASSIGNMENT)
    assert c.secret_left and password.encode() in pickle.dumps(c.payload("s1", b"", 100.0, "mark"))
    proc = grade(course, "--scheduler", "tcp://127.0.0.1:9")
    assert proc.returncode != 0
    assert "holds the gradebook's password outside `c.CourseDirectory.db_url = ...`" in proc.stderr
    assert "os.environ" in proc.stderr
