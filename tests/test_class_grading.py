"""`python -m course_tools.grade`: a class graded in parallel writes what `nbgrader autograde` writes.

One small class (tests/class_course.py: right, late, hanging, not a notebook) is graded once by
plain `nbgrader autograde`; each test grades a copy of it with course_tools.grade and compares the
gradebook student by student (every cell's score, the late penalty, the timestamp) and the
autograded notebooks: with local workers and SQLite, after a Ctrl-C and a rerun, with a real
PostgreSQL gradebook, and on a real Dask cluster of two workers, one of them killed mid-run.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest

from course_tools import nbgrader, venv_env
from tests.class_course import ASSIGNMENT, NOTEBOOK, grade, gradebook_rows, make_class, marked
from tests.pg import postgresql

GRADED = ["s1", "s2", "s3"]  # s4's file is not a notebook: neither grader can grade it
FEW = ["s1", "s2"]  # on time and late: what the later tests grade (s3's hang costs a pool timeout)


def sqlite(course: Path) -> str:
    return f"sqlite:///{course}/gradebook.db"


def shown(course: Path, student: str) -> list:
    """An autograded notebook as a reader sees it: each cell's source and outputs."""
    nb = nbformat.read(course / "autograded" / student / ASSIGNMENT / NOTEBOOK, as_version=4)
    return [(c.cell_type, c.source, c.get("outputs")) for c in nb.cells]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The class graded by plain `nbgrader autograde` (it fails s4 and exits 1)."""
    course = make_class(tmp_path_factory.mktemp("plain") / "course")
    proc = nbgrader("autograde", ASSIGNMENT, cwd=course, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "s4" in log, log
    missing = [s for s in GRADED if not (course / "autograded" / s / ASSIGNMENT / NOTEBOOK).exists()]
    assert not missing, f"plain nbgrader did not grade {missing}:\n{log[-3000:]}"
    rows = gradebook_rows(sqlite(course), GRADED + ["s4"])
    return course, rows, {s: shown(course, s) for s in GRADED}


def assert_same(course: Path, db_url: str, plain, students=GRADED):
    _, rows, notebooks = plain
    ours = gradebook_rows(db_url, students)
    for student in students:
        assert ours[student] == rows[student], student
        assert shown(course, student) == notebooks[student], student


def test_same_rows_as_nbgrader_autograde(plain, tmp_path):
    course = make_class(tmp_path / "course")
    proc = grade(course, "--workers", "2")
    assert proc.returncode == 1, "a submission could not be graded: the exit status says so"
    out = proc.stderr
    assert "grading 4 submission(s) of tiny 2 at a time" in out
    assert "3 of 4 graded, 1 could not be:" in out
    (s4,) = [line for line in out.splitlines() if line.startswith("  s4: ")]
    assert "Notebook does not appear to be JSON" in s4
    assert_same(course, sqlite(course), plain)
    # the same scores, the same late penalty (s2: 3 points, all taken back), the same timestamps
    _, rows, _ = plain
    assert rows["s2"]["penalty"] == 3.0 and rows["s2"]["seconds_late"] > 0 and rows["s3"]["score"] == 2.0
    # plain nbgrader leaves s4 a submission whose cells are ungraded; here it has no row at all
    assert rows["s4"]["grades"]["test_double"] == (None, None, True)
    assert gradebook_rows(sqlite(course), ["s4"])["s4"] is None
    assert "graded s2: 3 of 3, late: penalty 3" in out

    again = grade(course)
    assert again.returncode == 1
    assert "grading 1 submission(s) of tiny" in again.stderr and "3 already graded" in again.stderr
    assert "graded s" not in again.stderr
    assert_same(course, sqlite(course), plain)


def test_sqlite_has_one_writer(plain):
    course = plain[0]
    with open(course / "gradebook.db", "rb") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another run writing the gradebook
        proc = grade(course, "--force")
    assert proc.returncode != 0
    assert "a SQLite gradebook has one writer" in proc.stderr and "PostgreSQL" in proc.stderr
    assert "graded s" not in proc.stderr


def interrupted_run(course: Path, mark: str, env: dict, *args) -> tuple[str, list[psutil.Process], set[int]]:
    """Start grading ``course``, press Ctrl-C once one submission is written and the next one's
    grading process runs; return the student written, the processes that were running and
    their parents' pids."""
    proc = subprocess.Popen([sys.executable, "-m", "course_tools.grade", ASSIGNMENT, *args],
                            cwd=course, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        lines = []
        for line in proc.stderr:  # the first submission is written, the second one grading
            lines.append(line)
            if line.startswith("graded "):
                break
        deadline = time.monotonic() + 60
        while not marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        running = marked(mark)
        assert running, "the next submission's task should be running"
        parents = {p.info["ppid"] for p in psutil.process_iter(["ppid"]) if p in running}
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = "".join(lines) + rest
    print(out)
    assert "interrupted (SIGINT): 1 graded and written, 1 not" in out
    (first,) = [line.split()[1].rstrip(":") for line in lines if line.startswith("graded ")]
    return first, running, parents


def assert_one_written(course: Path, db_url: str, plain, first: str, few: list[str]) -> None:
    rows = gradebook_rows(db_url, few)
    assert rows[first] == plain[1][first]
    assert all(rows[s] is None for s in few if s != first), "no half-written submission"
    assert sorted(p.name for p in (course / "autograded").iterdir()) == [first]


# s1, then s3: s3's hanging answer keeps its task running for its pool's whole timeout, so the
# second task is surely still grading when the first submission has been written
INTERRUPTED = ["s1", "s3"]


def test_ctrl_c_stops_cleanly_and_a_rerun_grades_the_rest(plain, tmp_path):
    course = make_class(tmp_path / "course", students=INTERRUPTED)
    mark = uuid.uuid4().hex
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = venv_env(COURSE_GRADE_TASK=mark, TMPDIR=str(private_tmp))
    first, running, _ = interrupted_run(course, mark, env, "--workers", "1")
    psutil.wait_procs(running, timeout=10)
    assert marked(mark) == [], "every process of the run has ended"
    assert list(private_tmp.iterdir()) == [], "its temporary folders are gone"
    assert_one_written(course, sqlite(course), plain, first, INTERRUPTED)

    again = grade(course, env=env)
    assert again.returncode == 0
    assert "grading 1 submission(s) of tiny" in again.stderr and "1 already graded" in again.stderr
    assert f"graded {first}:" not in again.stderr
    assert_same(course, sqlite(course), plain, INTERRUPTED)


def test_postgresql_gradebook(plain, tmp_path):
    with postgresql() as url:
        course = make_class(tmp_path / "course", db_url=url, students=FEW)
        assert not (course / "gradebook.db").exists()
        proc = grade(course, "--workers", "2")
        assert proc.returncode == 0
        assert_same(course, url, plain, FEW)


@pytest.fixture
def dask_cluster(tmp_path):
    """`dask scheduler` and two `dask worker`s on 127.0.0.1, each worker in a folder of its own."""
    from distributed import Client

    from tests.pg import _free_port

    procs = {}
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask = os.path.join(os.path.dirname(sys.executable), "dask")
    (tmp_path / "scheduler").mkdir()
    try:
        procs["scheduler"] = subprocess.Popen(
            [dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            cwd=tmp_path / "scheduler", env=venv_env(TMPDIR=str(tmp_path / "scheduler")),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name in ("wA", "wB"):
            folder = tmp_path / name
            (folder / "tmp").mkdir(parents=True)
            procs[name] = subprocess.Popen(
                [dask, "worker", address, "--name", name, "--nthreads", "1", "--no-nanny",
                 "--no-dashboard", "--local-directory", str(folder)],
                cwd=folder, env=venv_env(TMPDIR=str(folder / "tmp")),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
            yield address, procs, client
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_dask_cluster_loses_nothing_when_a_worker_dies(plain, tmp_path, dask_cluster):
    address, procs, client = dask_cluster
    mark = uuid.uuid4().hex
    with postgresql() as url:
        course = make_class(tmp_path / "course", db_url=url, students=FEW)
        run = subprocess.Popen([sys.executable, "-m", "course_tools.grade", ASSIGNMENT, "--scheduler", address],
                               cwd=course, env=venv_env(COURSE_GRADE_TASK=mark),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 600  # a safety net: the run's preflight comes first
            busy = []  # wA's grading process has started (its parent is the worker)
            while not busy and time.monotonic() < deadline and run.poll() is None:
                busy = marked(mark, parent=procs["wA"].pid)
                time.sleep(0.1)
            assert busy, ("worker wA should be grading a submission", run.poll(),
                          run.stderr.read() if run.poll() is not None else "")
            procs["wA"].kill()  # a grading machine lost mid-run
            procs["wA"].wait()
            out, err = run.communicate(timeout=600)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        print(out, err)
        assert run.returncode == 0, err
        assert "on the Dask cluster at " + address in err
        for student in FEW:
            assert err.count(f"graded {student}:") == 1, "each submission written once"
        assert_same(course, url, plain, FEW)
        rows = gradebook_rows(url, FEW)
        assert all(rows[s]["grade_rows"] == 2 for s in FEW), "no row written twice"
    deadline = time.monotonic() + 60
    while marked(mark) and time.monotonic() < deadline:  # the lost worker's task ends by itself
        time.sleep(0.2)
    assert marked(mark) == []
    for name in ("wA", "wB"):
        assert list((tmp_path / name / "tmp").iterdir()) == [], f"{name} left its temporary files"
    shutil.rmtree(course)


def test_ctrl_c_on_a_dask_cluster_ends_the_running_tasks(plain, tmp_path, dask_cluster):
    address, procs, client = dask_cluster
    course = make_class(tmp_path / "course", students=INTERRUPTED)
    mark = uuid.uuid4().hex
    first, running, parents = interrupted_run(course, mark, venv_env(COURSE_GRADE_TASK=mark),
                                              "--scheduler", address)
    assert parents & {procs["wA"].pid, procs["wB"].pid}, "a worker was grading when Ctrl-C came"
    psutil.wait_procs(running, timeout=10)
    assert marked(mark) == [], "the task still running on its worker ended its grading process"
    for name in ("wA", "wB"):
        assert list((tmp_path / name / "tmp").iterdir()) == [], f"{name} left its temporary files"
    assert_one_written(course, sqlite(course), plain, first, INTERRUPTED)
    assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 0, "no task is left"


def test_class_report(plain, tmp_path):
    """The report of the class graded by plain nbgrader: from the CLI and the instructor notebook."""
    import papermill as pm

    from course_tools import ROOT

    course = plain[0]
    proc = subprocess.run([sys.executable, "-m", "course_tools.grade", ASSIGNMENT, "--report"], cwd=course,
                          capture_output=True, text=True, timeout=300, env=venv_env())
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "test_double                              passed by 3/4 (75%)" in out
    assert "test_halve                               passed by 2/4 (50%)" in out
    # failures grouped by message, numbers made N: the hang is said with the line it hung on
    assert "1 x CheckFailed: halve() never finished: it hung for N s. Rank N was stuck at `while True: pass`" in out
    assert "scores (after late penalties) out of 3: min 0, median 1, mean 1.2, max 3" in out
    assert (course / "build" / "class-report" / f"{ASSIGNMENT}.png").stat().st_size > 10_000

    executed = tmp_path / "class_report.ipynb"
    pm.execute_notebook(str(ROOT / "instructor" / "class_report.ipynb"), str(executed),
                        parameters={"COURSE": str(course), "ASSIGNMENT": ASSIGNMENT},
                        cwd=str(ROOT / "instructor"), kernel_name="python3", progress_bar=False,
                        execution_timeout=300)
    nb = nbformat.read(executed, as_version=4)
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "test_halve                               passed by 2/4 (50%)" in printed
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert "s2" in printed and "late (penalty 3)" in printed and "s3" in printed


def test_a_grader_that_cannot_grade_stops_before_the_first_submission(tmp_path):
    """The course's preflight runs once, in the instructor's process, before any task goes out:
    a reference answer that fails its test (here the source's `double` was broken after the
    release) stops the run with what is wrong, and nobody gets a row of zeros."""
    course = make_class(tmp_path / "course", students=("s1",))
    source = course / "solutions" / ASSIGNMENT / NOTEBOOK
    nb = nbformat.read(source, as_version=4)
    (cell,) = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "double"]
    cell.source = cell.source.replace("return 2 * x", "return 3 * x")
    nbformat.write(nb, source)
    proc = grade(course, "--workers", "1")
    assert proc.returncode == 1
    assert "grading stopped before any submission (preflight" in proc.stderr
    assert "test_double" in proc.stderr and "fix the course or its environment" in proc.stderr
    assert "graded s1" not in proc.stderr
    assert gradebook_rows(sqlite(course), ["s1"])["s1"] is None
    assert not (course / "autograded").exists()
