"""A determined learner against the grader, through real `nbgrader autograde` (issue 13).

One autograde run grades a class of the beginner exercises in which most students try to cheat
or to break grading, between honest classmates (one sorted first, one last, whose submission a
cheater tries to overwrite). Each attack is what a learner could really submit; the test checks
the outcome a grader must guarantee: cheats score nothing for what they attack, honest
classmates keep full marks, no process outlives grading, no course file changes, and the run
finishes within the bound its configured limits give.
"""

from __future__ import annotations

import hashlib
import re
from html import unescape
import textwrap
from pathlib import Path

import nbformat
import psutil
import pytest

from course_tools import nbgrader
from course_tools.sandbox import probe
from course_tools.temp_course import make_course, read_scores, reference_answers, submit
from tests.grading_runs import NOTEBOOKS
from tests.nbgrade import cell_output, grading_bound

pytestmark = pytest.mark.grading

SOURCE = NOTEBOOKS["beginner"]
SAVE = {"test_save_once_only_rank0_writes", "test_save_once_everyone_waits"}
AVERAGE = {"test_combined_average_same_on_every_worker", "test_combined_average_unequal_counts"}
REPORT = {"test_report_average_returns_combined", "test_report_average_only_worker0_prints"}
STUB = "def {name}({args}):\n    pass\n"
SAVE_STUB = STUB.format(name="save_once", args="obj, path")
AVG_STUB = STUB.format(name="combined_average", args="loss, count")

# Markers in the command lines of the processes attacks start, to find survivors afterwards.
DAEMON_MARKS = ("600.101", "600.102", "600.103", "600.104")

STEAL = textwrap.dedent('''
    def {name}({args}):
        """Find the course from /proc, run the instructor's answer, sabotage the class."""
        import glob, json, os, sqlite3, subprocess, sys
        courses = set()
        for link in glob.glob("/proc/[0-9]*/cwd"):
            try:
                here = os.readlink(link)
            except OSError:
                continue
            for up in (here, os.path.dirname(here), os.path.dirname(os.path.dirname(here))):
                if os.path.exists(os.path.join(up, "gradebook.db")):
                    courses.add(up)
        for course in courses:
            for victim in glob.glob(os.path.join(course, "submitted", "zz_victim", "*", "*.ipynb")):
                open(victim, "w").write("{{}}")
            db = os.path.join(course, "gradebook.db")
            try:
                con = sqlite3.connect(db)
                con.execute("UPDATE grade SET manual_score = 100")
                con.commit()
            except Exception:
                pass
            subprocess.Popen([sys.executable, "-c", "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], "
                              "isolation_level=None); c.execute('BEGIN EXCLUSIVE'); time.sleep(600.104)", db],
                             start_new_session=True)
            nb = json.load(open(os.path.join(course, "solutions", "beginner", "03_exercises.ipynb")))
            space = {{}}
            for cell in nb["cells"]:
                if cell["metadata"].get("nbgrader", {{}}).get("solution"):
                    exec("".join(cell["source"]), space)
            return space["{name}"]({args})
''')

DAEMONS = textwrap.dedent('''
    def save_once(obj, path):
        """Leave processes behind three ways, then do the job properly."""
        import os, subprocess, time
        import torch, torch.distributed as dist
        subprocess.Popen(["sleep", "600.101"], start_new_session=True)          # setsid
        if os.fork() == 0:                                                     # double fork
            if os.fork() == 0:
                os.setsid()
                os.execvp("sleep", ["sleep", "600.102"])
            os._exit(0)
        subprocess.Popen(["sleep", "600.103"])                                 # a plain child
        if dist.get_rank() == 0:
            torch.save(obj, path)
        dist.barrier()
''')

REDUCE = textwrap.dedent('''
    def combined_average(loss, count):
        """Return an object that would run code in the grading kernel when unpickled."""
        class Boom:
            def __reduce__(self):
                return (exec, ("import helpers.grading.answers as a; a.fail = print",))
        return Boom()
''')

SWALLOW = textwrap.dedent('''
    def save_once(obj, path):
        """Ignore interrupts and never finish."""
        import time
        while True:
            try:
                time.sleep(0.2)
            except KeyboardInterrupt:
                pass
''')

HUGE = textwrap.dedent('''
    def combined_average(loss, count):
        """A 100 MB line."""
        raise ValueError("x" * 100_000_000)
''')

# Any valid Python in an answer cell: what the old definitions-only rule refused
ANY_PYTHON_SAVE = textwrap.dedent('''
    import functools
    import torch.distributed as dist

    class Saver(object):
        """A base class, state computed at the top level."""
        rank_zero = 0

    def logged(f):
        return functools.wraps(f)(lambda *a, **k: f(*a, **k))

    print("defining save_once")

    @logged
    def save_once(obj, path, saver=Saver()):
        if dist.get_rank() == saver.rank_zero:
            torch.save(obj, path)
        dist.barrier()
''')

ANY_PYTHON_AVERAGE = textwrap.dedent('''
    DTYPE = getattr(torch, "float" + str(32 * 2))

    def combined_average(loss, count, dtype=DTYPE):
        totals = torch.tensor([loss * count, count], dtype=dtype)
        dist.all_reduce(totals)
        return (totals[0] / totals[1]).item()
''')

TOP_LEVEL_LOOP = "while True:\n    pass\n"

# Issue 21's cheats on the grader's instruments: each wrote the one wrong answer and faked what the
# grader used to observe inside the rank. The grader now observes from the kernel.
CLEAR_LOG = textwrap.dedent('''
    def save_once(obj, path):
        """Every worker writes; the others then clear the grader's save log in the calling frames."""
        import sys
        torch.save(obj, path)
        if dist.get_rank() != 0:
            frame = sys._getframe(1)
            while frame is not None:
                for name, value in list(frame.f_locals.items()):
                    if name == "log" and isinstance(value, list):
                        value.clear()
                frame = frame.f_back
        dist.barrier()
''')

CLEAR_CAPTURE = textwrap.dedent('''
    def report_average(loss, count):
        """Every worker prints; then each empties the grader's capture of its output in the calling frames."""
        import sys
        t = torch.tensor([loss * count, count], dtype=torch.float64)
        dist.all_reduce(t)
        average = (t[0] / t[1]).item()
        print(f"average loss: {average:.4f}")
        frame = sys._getframe(1)
        while frame is not None:
            for value in list(frame.f_locals.values()):
                if isinstance(value, dict) and "stdout" in value:
                    value["stdout"] = ""
            frame = frame.f_back
        return average
''')

PATCH_LOAD = textwrap.dedent('''
    def save_once(obj, path):
        """No barrier; the other workers make every load of the file succeed with obj."""
        import helpers.lessons.races as races
        from helpers.lessons.races import LoadOutcome
        if dist.get_rank() == 0:
            torch.save(obj, path)
        else:
            torch.load = lambda *a, **k: obj
            races.try_load = lambda *a, **k: LoadOutcome("ok")
''')

FORGE_FRAME = textwrap.dedent('''
    def save_once(obj, path):
        """No barrier; the other workers write their own "all went well" result frame on the
        pool's result pipe, found in the rank's main frame, and never return."""
        import sys, threading, time
        from helpers._pool import messages
        if dist.get_rank() == 0:
            torch.save(obj, path)
            return
        frame = sys._getframe(1)
        while frame is not None and "result_fd" not in frame.f_locals:
            frame = frame.f_back
        rank = dist.get_rank()
        fake = {"rank": rank, "saves": 0, "runs": [{"saves_ended": [], "returned": time.time() + 9,
                "outcome": "ok", "detail": "", "same": True, "seconds": 0.0}] * 2}
        messages.send(frame.f_locals["result_fd"], messages.Returned(0.0, messages.dump_plain(fake)))
        threading.Event().wait()
''')

READ_INPUTS = textwrap.dedent('''
    def combined_average(loss, count):
        """No collective: the other workers' inputs from the calling frames or the pool's job files."""
        import glob, sys
        frame = sys._getframe(1)
        while frame is not None:
            found = frame.f_locals
            if isinstance(found.get("losses"), list) and isinstance(found.get("counts"), list):
                pairs = list(zip(found["losses"], found["counts"]))
                return sum(l * c for l, c in pairs) / sum(c for _, c in pairs)
            frame = frame.f_back
        for job in glob.glob("/tmp/helpers-spawn-*/job*.pkl"):
            open(job, "rb").read()  # there is none left to read by the time any answer runs
            raise RuntimeError("found another rank's job file: " + job)
        return loss
''')

EVERY_RANK_SAVES = "def save_once(obj, path):\n    torch.save(obj, path)\n"

LAZY = textwrap.dedent('''
    def save_once(obj, path):
        """Sleep instead of waiting for the save."""
        import time
        import torch, torch.distributed as dist
        if dist.get_rank() == 0:
            torch.save(obj, path)
        else:
            time.sleep(3)
''')


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attacks")
    course = make_course(tmp, ["beginner"])
    reference = reference_answers(SOURCE)
    students = {
        "aa_honest": reference,
        "cheat_rebind": {
            "save_once": "import helpers.grading.beginner as check\ncheck.save_once_only_rank0_writes = print\n"
                         "check.save_once_everyone_waits = print\n" + SAVE_STUB,
            "combined_average": "import helpers.grading.answers as answers\nanswers.fail = print\n" + AVG_STUB},
        "cheat_transformer": {
            "save_once": "get_ipython().input_transformers_post.append(lambda lines: ['pass\\n'])\n" + SAVE_STUB,
            "combined_average": AVG_STUB},
        "cheat_steal": {"save_once": STEAL.format(name="save_once", args="obj, path"),
                        "combined_average": STEAL.format(name="combined_average", args="loss, count")},
        "cheat_reduce": {"save_once": reference["save_once"], "combined_average": REDUCE},
        "daemons": {"save_once": DAEMONS, "combined_average": reference["combined_average"]},
        "swallow_interrupt": {"save_once": SWALLOW, "combined_average": reference["combined_average"]},
        "huge_output": {"save_once": reference["save_once"], "combined_average": HUGE},
        "lazy_sleep": {"save_once": LAZY, "combined_average": reference["combined_average"]},
        "any_python": {"save_once": ANY_PYTHON_SAVE, "combined_average": ANY_PYTHON_AVERAGE},
        "top_level_loop": {"save_once": TOP_LEVEL_LOOP + reference["save_once"],
                           "combined_average": reference["combined_average"]},
        "cheat_clear_log": {"save_once": CLEAR_LOG, "combined_average": reference["combined_average"],
                            "report_average": CLEAR_CAPTURE},
        "cheat_patch_load": {"save_once": PATCH_LOAD, "combined_average": reference["combined_average"]},
        "cheat_forge_frame": {"save_once": FORGE_FRAME, "combined_average": reference["combined_average"]},
        "cheat_read_inputs": {"save_once": reference["save_once"], "combined_average": READ_INPUTS},
        "every_rank_saves": {"save_once": EVERY_RANK_SAVES, "combined_average": reference["combined_average"]},
        "schema_99": reference,
        "zz_victim": reference,
    }
    for student, answers in students.items():
        path = submit(course, student, "beginner", SOURCE.name, answers)
        if student == "schema_99":  # a cell from the future in an otherwise correct submission
            nb = nbformat.read(path, as_version=4)
            nb.cells.insert(1, nbformat.v4.new_markdown_cell(
                "from the future", metadata={"nbgrader": {"schema_version": 99, "grade": True}}))
            nbformat.write(nb, path)
    before = _fingerprint(course)
    proc = nbgrader("autograde", "beginner", "--force", cwd=course, check=False, log_level="INFO",
                    timeout=grading_bound([SOURCE], len(students)))
    feedback = nbgrader("generate_feedback", "beginner", "--force", cwd=course, check=False)
    graded = read_scores(course, "beginner", SOURCE.stem, list(students))
    return {"graded": graded, "course": course, "log": proc.stdout + proc.stderr, "code": proc.returncode,
            "before": before, "after": _fingerprint(course), "feedback": feedback}


def _fingerprint(course: Path) -> dict[str, str]:
    """Hash of every file of the course that grading must not change."""
    out = {}
    for top in ("solutions", "source", "release", "submitted", "notebooks", "nbgrader_config.py"):
        for path in sorted((course / top).rglob("*")) if (course / top).is_dir() else [course / top]:
            if path.is_file():
                out[str(path.relative_to(course))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _lost(attacked, student) -> set[str]:
    """Lost tests of the two exercises the attacks answer (the notebook's other stubs fail)."""
    return attacked["graded"].lost(student) & (SAVE | AVERAGE)


def test_the_sandbox_is_used_here():
    """The attacks below are run sandboxed on this machine (bubblewrap installed by make test)."""
    assert probe() is None, probe()


def test_every_student_is_graded_and_the_run_succeeds(attacked):
    graded = attacked["graded"]
    assert all(SAVE | AVERAGE <= set(graded.scores[s]) for s in graded.scores), graded.scores
    assert attacked["code"] == 0, attacked["log"][-3000:]
    assert "NOT sandboxed" not in attacked["log"]


@pytest.mark.parametrize("student", ["aa_honest", "zz_victim", "schema_99"])
def test_honest_classmates_keep_full_marks(attacked, student):
    assert _lost(attacked, student) == set(), attacked["graded"].shown(student, _lost(attacked, student))


@pytest.mark.parametrize("student", ["cheat_rebind", "cheat_transformer", "cheat_steal"])
def test_cheats_score_nothing(attacked, student):
    assert attacked["graded"].total(student) == 0, attacked["graded"].scores[student]


def test_a_rebinding_answer_rebinds_nothing_in_the_grading_kernel(attacked):
    """Its top level ran in the test's workers only: the kernel's check ran and judged the stub."""
    nb = attacked["graded"].notebook("cheat_rebind", SOURCE.stem)
    assert "No worker called torch.save" in cell_output(nb, "test_save_once_only_rank0_writes")
    nb = attacked["graded"].notebook("cheat_transformer", SOURCE.stem)
    text = cell_output(nb, "test_save_once_only_rank0_writes")
    assert "NameError" in text and "get_ipython" in text  # no IPython in a worker


def test_any_valid_answer_cell_is_graded_on_what_its_function_does(attacked):
    """Top-level code, a decorator, a base class and computed defaults, as in JupyterLab."""
    assert _lost(attacked, "any_python") == set(), attacked["graded"].shown("any_python", _lost(attacked, "any_python"))


def test_an_endless_loop_at_the_top_of_a_cell_costs_only_its_answer(attacked):
    assert _lost(attacked, "top_level_loop") == SAVE
    nb = attacked["graded"].notebook("top_level_loop", SOURCE.stem)
    text = cell_output(nb, "test_save_once_only_rank0_writes")
    assert "was still running after 5 s in a worker" in text and "Move it inside a function" in text


def test_a_result_that_would_run_code_when_loaded_is_refused(attacked):
    assert _lost(attacked, "cheat_reduce") == AVERAGE
    nb = attacked["graded"].notebook("cheat_reduce", SOURCE.stem)
    text = cell_output(nb, "test_combined_average_same_on_every_worker")
    assert "combined_average() returned <Boom>" in text  # described in the rank, never loaded here


def test_processes_started_by_answers_do_not_survive_grading(attacked):
    assert _lost(attacked, "daemons") == set()  # the job itself was done right
    left = [p.info for p in psutil.process_iter(["pid", "cmdline"])
            if any(m in " ".join(p.info["cmdline"] or []) for m in DAEMON_MARKS)]
    assert left == []


def test_an_answer_that_swallows_interrupts_costs_only_its_own_tests(attacked):
    assert _lost(attacked, "swallow_interrupt") == SAVE


def test_output_is_capped_in_bytes(attacked):
    assert _lost(attacked, "huge_output") == AVERAGE
    nb = attacked["graded"].notebook("huge_output", SOURCE.stem)
    assert nb.stat().st_size < 2_000_000
    assert "ValueError" in cell_output(nb, "test_combined_average_same_on_every_worker")


def test_a_fixed_sleep_is_not_a_barrier(attacked):
    assert _lost(attacked, "lazy_sleep") == {"test_save_once_everyone_waits"}


def test_no_course_file_changed(attacked):
    assert attacked["after"] == attacked["before"]


def test_feedback_shows_hidden_failures_but_not_hidden_tests(attacked):
    assert attacked["feedback"].returncode == 0, attacked["feedback"].stderr[-2000:]
    html = (attacked["course"] / "feedback" / "lazy_sleep" / "beginner" / "03_exercises.html").read_text()
    text = unescape(re.sub(r"<[^>]+>", "", html))
    assert "check.save_once_everyone_waits(save_once, world_size=3)" in text  # the visible test
    assert "world_size=4" not in text and "world_size=5" not in text  # the hidden ones
    assert "hidden tests run here when graded" in text
    assert re.search(r"Worker [12] returned \d\.\d s after worker 0's save", text)  # the failure, in words


# ----------------------------------------------------------------------------- the instruments


def test_clearing_the_save_log_hides_no_write(attacked):
    """The writes are counted in the kernel (inotify), not in a list the rank can reach."""
    assert _lost(attacked, "cheat_clear_log") == {"test_save_once_only_rank0_writes"}
    nb = attacked["graded"].notebook("cheat_clear_log", SOURCE.stem)
    assert "The file was written 3 times" in cell_output(nb, "test_save_once_only_rank0_writes")


def test_emptying_the_capture_of_the_output_hides_no_print(attacked):
    """What each worker printed is read in the kernel, from the worker's own output pipe."""
    lost = attacked["graded"].lost("cheat_clear_log") & REPORT
    assert lost == {"test_report_average_only_worker0_prints"}
    nb = attacked["graded"].notebook("cheat_clear_log", SOURCE.stem)
    assert "Workers 1 and 2 printed too" in cell_output(nb, "test_report_average_only_worker0_prints")


def test_patching_torch_load_in_the_ranks_fakes_no_complete_file(attacked):
    """The kernel opens the file itself, when each rank's result arrives."""
    assert _lost(attacked, "cheat_patch_load") == {"test_save_once_everyone_waits"}
    nb = attacked["graded"].notebook("cheat_patch_load", SOURCE.stem)
    assert "before the file was complete" in cell_output(nb, "test_save_once_everyone_waits")


def test_a_forged_result_frame_is_only_an_early_return(attacked):
    """A frame carries only the answer's claim that it returned; the kernel looks then."""
    assert _lost(attacked, "cheat_forge_frame") == {"test_save_once_everyone_waits"}
    nb = attacked["graded"].notebook("cheat_forge_frame", SOURCE.stem)
    assert "before the file was complete" in cell_output(nb, "test_save_once_everyone_waits")


def test_a_rank_finds_no_other_ranks_inputs(attacked):
    """Each rank is given only its own loss and count; the job files are gone before any answer runs."""
    assert _lost(attacked, "cheat_read_inputs") == AVERAGE
    nb = attacked["graded"].notebook("cheat_read_inputs", SOURCE.stem)
    text = cell_output(nb, "test_combined_average_same_on_every_worker")
    assert "Each worker returned its own loss" in text and "job file" not in text


def test_every_rank_saving_fails_both_save_tests(attacked):
    """Plain torch.save on every worker: written 3 times, and workers return before worker 0's save."""
    assert _lost(attacked, "every_rank_saves") == SAVE
