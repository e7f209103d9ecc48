"""Robustness of grading under real autograde: no answer can stall the grader or earn a false pass,
tampering with locked cells changes nothing, grading leaves nothing behind; and the course's execute
step (course_tools.autograde.CourseExecute) on its own."""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path

import nbformat
import psutil
import pytest

from course_tools import nbgrader
from course_tools.temp_course import make_course, read_scores
from tests.grading_runs import NOTEBOOKS
from tests.nbgrade import autograde, fill

pytestmark = pytest.mark.grading

# ----------------------------------------------------------------------------- robustness

CORRECT_COMBINED = """
def combined_average(loss, count):
    import torch, torch.distributed as dist
    t = torch.tensor([loss * count, float(count)], dtype=torch.float64)
    dist.all_reduce(t)
    return (t[0] / t[1]).item()
"""

CORRECT_SAVE_ONCE = """
def save_once(obj, path):
    import torch, torch.distributed as dist
    if dist.get_rank() == 0:
        torch.save(obj, path)
    dist.barrier()
"""


def test_no_answer_stalls_the_grader_or_earns_a_false_pass(tmp_path):
    source = NOTEBOOKS["beginner"]
    token = tmp_path.name.replace("-", "_")
    messy = CORRECT_SAVE_ONCE.replace("    import torch, torch.distributed as dist\n", textwrap.indent(textwrap.dedent(f"""
        import subprocess, tempfile, pathlib
        import torch, torch.distributed as dist
        for _ in range(20_000):
            print("a line of noise")
        pathlib.Path(tempfile.gettempdir(), "left_behind_{token}.txt").write_text("junk")
        subprocess.Popen(["sleep", "600.{len(token)}"], start_new_session=True)
    """), "    "))
    kills_the_kernel = textwrap.dedent("""
        def save_once(obj, path):
            import os, signal
            pool_server = os.getppid()
            with open(f"/proc/{pool_server}/stat") as f:
                kernel = int(f.read().rsplit(")", 1)[1].split()[1])
            os.kill(kernel, signal.SIGKILL)
        """)
    submissions = {
        "reference": None,
        # a barrier only rank 0 reaches: that test fails within its pool timeout, the rest is graded
        "pool_hang": {"save_once": CORRECT_SAVE_ONCE.replace(
            "        torch.save(obj, path)\n    dist.barrier()",
            "        torch.save(obj, path)\n        dist.barrier()"),
            "combined_average": CORRECT_COMBINED},
        # an endless loop at the top of an answer cell: the cell is not run, the notebook goes on
        "kernel_loop": {"save_once": "while True:\n    pass\n" + CORRECT_SAVE_ONCE,
                        "combined_average": CORRECT_COMBINED},
        # a rank kills the grading kernel: the correct second answer must not be counted
        "kernel_killed": {"save_once": kills_the_kernel, "combined_average": CORRECT_COMBINED},
        # a rank dies of SIGABRT inside the second answer; the first answer keeps its points
        "rank_abort": {"save_once": CORRECT_SAVE_ONCE, "combined_average": textwrap.dedent("""
            def combined_average(loss, count):
                import os, torch.distributed as dist
                if dist.get_rank() == 1:
                    os.abort()
                return loss
            """)},
        # noise, a file in the temp folder and a process started from a rank
        "messy": {"save_once": messy, "combined_average": CORRECT_COMBINED},
    }
    graded = autograde(source, submissions, tmp_path)
    save_tests = {g for g in graded.max_scores if "save_once" in g}
    avg_tests = {g for g in graded.max_scores if "combined_average" in g}
    full = sum(graded.max_scores.values())
    assert graded.total("reference") == full, graded.shown("reference", graded.lost("reference"))
    theirs = save_tests | avg_tests  # the students answer these two; the notebook's other stubs fail
    assert graded.lost("pool_hang") & theirs == save_tests
    assert graded.lost("kernel_loop") & theirs == save_tests
    assert graded.total("kernel_killed") == 0, graded.scores["kernel_killed"]
    assert graded.lost("rank_abort") & theirs == avg_tests
    assert graded.lost("messy") & theirs == set()

    survivors = [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"])
                 if f"600.{len(token)}" in " ".join(p.info["cmdline"] or [])]
    assert survivors == [], "a process started by an answer survived grading"
    tmp = Path(tempfile.gettempdir())
    leftovers = [*graded.course.rglob(f"left_behind_{token}.txt"), *tmp.glob(f"left_behind_{token}.txt"),
                 *tmp.glob(f"course-grading-*/**/left_behind_{token}.txt")]
    assert not leftovers, f"an answer's file outlived grading: {leftovers}"

    died = nbformat.read(graded.notebook("kernel_killed", source.stem), as_version=4)
    messages = [o.get("evalue", "") for c in died.cells for o in c.get("outputs", [])
                if o.get("output_type") == "error"]
    assert any("the kernel died while running this cell" in m for m in messages), messages
    assert any(m.startswith("not run: the kernel died in cell") for m in messages), messages


def test_editing_or_deleting_a_locked_test_cell_changes_nothing(tmp_path):
    source = NOTEBOOKS["beginner"]
    wrong = "def combined_average(loss, count):\n    return loss\n"
    graded = autograde(source, {"honest": {"combined_average": wrong}}, tmp_path / "a")
    course = make_course(tmp_path / "b", ["beginner"])
    nb = fill(course / "notebooks" / "beginner" / source.name, {"combined_average": wrong})
    tests = [c for c in nb.cells if "combined_average" in c.metadata.get("nbgrader", {}).get("grade_id", "")
             and c.metadata["nbgrader"].get("grade")]
    tests[0].source = "print('all tests pass')"  # edited
    nb.cells.remove(tests[1])  # deleted
    dest = course / "submitted" / "tamper" / "beginner"
    dest.mkdir(parents=True)
    nbformat.write(nb, dest / source.name)
    nbgrader("autograde", "beginner", "--force", cwd=course)
    tampered = read_scores(course, "beginner", source.stem, ["tamper"])
    assert tampered.scores["tamper"] == graded.scores["honest"]
    assert tampered.total("tamper") < sum(tampered.max_scores.values())


# ----------------------------------------------------------------------------- the execute step


def test_the_execute_step_runs_only_notebooks_with_graded_cells():
    import copy

    from course_tools.autograde import CourseExecute

    lesson = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('ran')")])
    nb, _ = CourseExecute().preprocess(copy.deepcopy(lesson), {})
    assert nb.cells[0].outputs == []  # a lesson notebook: not executed, no kernel started
    every = CourseExecute(skip_ungraded=False, answers_in_workers=False, sandbox="off")
    nb, _ = every.preprocess(copy.deepcopy(lesson), {})
    assert [o.get("text") for o in nb.cells[0].outputs] == ["ran\n"]


def test_the_execute_step_settings_have_help():
    from course_tools.autograde import CourseExecute

    for name in ("skip_ungraded", "answers_in_workers", "sandbox", "temp_workdir", "kill_processes",
                 "max_output_bytes", "limit_processes", "limit_file_bytes", "limit_cpu_seconds",
                 "limit_memory_bytes"):
        trait = CourseExecute.class_traits()[name]
        assert trait.metadata.get("config") and len(trait.help) > 40, name


def test_a_cell_past_its_limit_that_ignores_the_interrupt_stops_the_notebook_not_the_grader():
    """Handled like a dead kernel: earlier cells keep their outputs, later ones are not run."""
    from course_tools.autograde import CourseExecute

    swallow = "import time\nwhile True:\n    try:\n        time.sleep(0.1)\n    except KeyboardInterrupt:\n        pass"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in
                                         ("print('before')", swallow, "print('after')")])
    step = CourseExecute(skip_ungraded=False, answers_in_workers=False, sandbox="off", timeout=3)
    nb, _ = step.preprocess(nb, {})
    assert [o.get("text") for o in nb.cells[0].outputs] == ["before\n"]
    assert [o.get("ename") for o in nb.cells[1].outputs] == ["CellTimeoutError"]
    assert [(o.get("ename"), o.get("evalue")) for o in nb.cells[2].outputs] == [
        ("NotRun", "not run: cell 1 ran past its time limit, so this cell earns no points.")]


def test_a_cell_keeps_at_most_its_byte_budget_of_output():
    from course_tools.autograde import CourseExecute

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('x' * 3_000_000)"),
                                         nbformat.v4.new_code_cell("print('small')")])
    step = CourseExecute(skip_ungraded=False, answers_in_workers=False, sandbox="off", max_output_bytes=100_000)
    nb, _ = step.preprocess(nb, {})
    big = nb.cells[0].outputs
    assert sum(len(o.get("text", "")) for o in big) < 101_000
    assert big[-1]["text"].strip().startswith("[output cut:") and "more bytes than the grader keeps" in big[-1]["text"]
    assert [o.get("text") for o in nb.cells[1].outputs] == ["small\n"]
