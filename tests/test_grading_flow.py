"""nbgrader end to end, as instructors and learners use it, on a local exchange in a temp dir.

- the instructor flow: release -> fetch -> submit -> collect -> autograde -> feedback -> fetch_feedback;
- the learner's self-check (`make check`) and `nbgrader validate`;
- robustness: no answer can stall the grader or earn a false pass, and grading leaves nothing behind.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import nbformat
import psutil
import pytest

from course_tools import nbgrader
from course_tools.temp_course import make_course, read_scores
from course_tools.selfcheck import graded_notebooks
from tests.conftest import ROOT
from tests.nbgrade import autograde, fill, reference_answers

pytestmark = pytest.mark.grading

COURSE_ID = "one-rank"
EXERCISE_DEPTHS = sorted(p.name for p in (ROOT / "solutions").iterdir()
                         if p.is_dir() and graded_notebooks(p))
GRADED_SOURCES = [nb for d in EXERCISE_DEPTHS for nb in graded_notebooks(ROOT / "solutions" / d)]


def test_there_are_exercises_to_grade():
    assert "beginner" in EXERCISE_DEPTHS and GRADED_SOURCES


# ----------------------------------------------------------------------------- the instructor flow


def _feedback_score(html: Path) -> tuple[float, float]:
    text = re.sub(r"<[^>]+>", " ", html.read_text())
    m = re.search(r"Score:\s*([\d.]+)\s*/\s*([\d.]+)", text)
    assert m, f"no score in {html}"
    return float(m.group(1)), float(m.group(2))


def test_release_collect_grade_and_feedback_through_an_exchange(tmp_path):
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    ex = f"--Exchange.root={exchange}"
    course = make_course(tmp_path, EXERCISE_DEPTHS)  # what `make release` does, in a temp copy
    for depth in EXERCISE_DEPTHS:
        nbgrader("release_assignment", depth, ex, cwd=course)

    homes = {s: tmp_path / s for s in ("alice", "bob")}
    # each learner has their own nbgrader cache, as separate accounts would
    cache = {s: f"--Exchange.cache={home / '.nbgrader_cache'}" for s, home in homes.items()}
    for student, home in homes.items():
        home.mkdir()
        for depth in EXERCISE_DEPTHS:
            nbgrader("fetch_assignment", depth, f"--course={COURSE_ID}", ex, cache[student], cwd=home)
            assert (home / depth).is_dir()
    # alice writes every answer (the reference solutions); bob submits what he fetched.
    for source in GRADED_SOURCES:
        mine = homes["alice"] / source.parent.name / source.name
        nbformat.write(fill(mine, reference_answers(source)), mine)
    for student, home in homes.items():
        for depth in EXERCISE_DEPTHS:
            nbgrader("submit", depth, f"--course={COURSE_ID}", ex, cache[student],
                     f"--student={student}", cwd=home)

    for depth in EXERCISE_DEPTHS:
        nbgrader("collect", depth, ex, cwd=course)
        nbgrader("autograde", depth, "--force", cwd=course)
        nbgrader("generate_feedback", depth, "--force", cwd=course)
        nbgrader("release_feedback", depth, ex, cwd=course)

    for student, home in homes.items():
        for depth in EXERCISE_DEPTHS:
            nbgrader("fetch_feedback", depth, f"--course={COURSE_ID}", ex, cache[student],
                     f"--student={student}", cwd=home)
        for source in GRADED_SOURCES:
            pages = list((home / source.parent.name / "feedback").rglob(source.stem + ".html"))
            assert len(pages) == 1, f"{student} got no feedback for {source.name}"
            score, most = _feedback_score(pages[0])
            assert most > 0
            if student == "alice":
                assert score == most, f"reference solutions lost points in {source.name}"
            else:
                assert score == 0, f"untouched {source.name} earned {score}"


# ----------------------------------------------------------------------------- the learner's side


def test_make_check_grades_a_learner_copy_and_points_to_feedback(tmp_path):
    depth = "beginner"
    mine = tmp_path / "mine"
    shutil.copytree(ROOT / "notebooks" / depth, mine)
    source = graded_notebooks(ROOT / "solutions" / depth)[0]
    answers = reference_answers(source)
    first = next(iter(answers))  # answer only the first exercise
    nbformat.write(fill(mine / source.name, {first: answers[first]}), mine / source.name)
    out = subprocess.run([sys.executable, "-m", "course_tools.selfcheck", depth, "--notebooks", str(mine),
                          "--feedback", str(tmp_path / "fb")], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^\S+\.ipynb: (\w+)\s+([\d.]+) / ([\d.]+)", out.stdout, re.M)}
    assert set(rows) == set(answers), out.stdout
    assert rows[first][0] == rows[first][1] > 0
    assert all(score == 0 for name, (score, _) in rows.items() if name != first)
    assert str(tmp_path / "fb") in out.stdout
    assert (tmp_path / "fb" / source.with_suffix(".html").name).exists()


@pytest.mark.parametrize("source", GRADED_SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_validate_passes_on_solutions_and_fails_on_the_starter(source):
    depth = source.parent.name
    ok = nbgrader("validate", str(source), cwd=source.parent, log_level=None)
    assert "Success! Your notebook passes all the tests." in ok.stdout, ok.stdout[-3000:]
    starter = ROOT / "notebooks" / depth / source.name
    inv = nbgrader("validate", "--invert", str(starter), cwd=starter.parent, log_level=None, check=False)
    assert "Success! The notebook does not pass any tests." in inv.stdout, inv.stdout[-3000:]


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
    source = ROOT / "solutions" / "beginner" / "03_exercises.ipynb"
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
    assert graded.total("reference") == full
    assert graded.lost("pool_hang") == save_tests
    assert graded.lost("kernel_loop") == save_tests
    assert graded.total("kernel_killed") == 0, graded.scores["kernel_killed"]
    assert graded.lost("rank_abort") == avg_tests
    assert graded.total("messy") == full

    survivors = [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"])
                 if f"600.{len(token)}" in " ".join(p.info["cmdline"] or [])]
    assert survivors == [], "a process started by an answer survived grading"
    tmp = Path(tempfile.gettempdir())
    leftovers = [*graded.course.rglob(f"left_behind_{token}.txt"), *tmp.glob(f"left_behind_{token}.txt"),
                 *tmp.glob(f"course-grading-*/**/left_behind_{token}.txt")]
    assert not leftovers, f"an answer's file outlived grading: {leftovers}"

    died = nbformat.read(graded.course / "autograded" / "kernel_killed" / "beginner" / source.name,
                         as_version=4)
    messages = [o.get("evalue", "") for c in died.cells for o in c.get("outputs", [])
                if o.get("output_type") == "error"]
    assert any("the kernel died while running this cell" in m for m in messages), messages
    assert any(m.startswith("not run: the kernel died in cell") for m in messages), messages


def test_editing_or_deleting_a_locked_test_cell_changes_nothing(tmp_path):
    source = ROOT / "solutions" / "beginner" / "03_exercises.ipynb"
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


def test_the_learner_bundle_gives_nothing_away_and_checks_with_the_visible_tests(tmp_path):
    from course_tools.learner_bundle import build

    bundle = build(tmp_path / "learner")
    assert not (bundle / "solutions").exists() and (bundle / "notebooks" / "beginner").is_dir()
    for path in bundle.rglob("*.ipynb"):
        text = path.read_text()
        assert "BEGIN HIDDEN TESTS" not in text and "BEGIN SOLUTION" not in text, path
    source = ROOT / "solutions" / "beginner" / "03_exercises.ipynb"
    mine = tmp_path / "mine"
    shutil.copytree(bundle / "notebooks" / "beginner", mine)
    nbformat.write(fill(mine / source.name, reference_answers(source)), mine / source.name)
    out = subprocess.run([sys.executable, "-m", "course_tools.selfcheck", "beginner", "--notebooks", str(mine),
                          "--feedback", str(tmp_path / "fb")], capture_output=True, text=True, cwd=bundle,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "hidden tests (the same ideas on other sizes and inputs) run when your instructor grades" in out.stdout
    total = re.search(r"^total\s+([\d.]+) / ([\d.]+)", out.stdout, re.M)
    assert total and total.group(1) == total.group(2) != "0", out.stdout
    page = (tmp_path / "fb" / "03_exercises.html").read_text()
    assert "world_size=5" not in page  # no hidden test was there to run


# ----------------------------------------------------------------------------- the execute step


def test_the_execute_step_runs_only_notebooks_with_graded_cells():
    import copy

    from course_tools.autograde import CourseExecute

    lesson = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('ran')")])
    nb, _ = CourseExecute().preprocess(copy.deepcopy(lesson), {})
    assert nb.cells[0].outputs == []  # a lesson notebook: not executed, no kernel started
    every = CourseExecute(skip_ungraded=False, definitions_only=False, sandbox="off")
    nb, _ = every.preprocess(copy.deepcopy(lesson), {})
    assert [o.get("text") for o in nb.cells[0].outputs] == ["ran\n"]


def test_the_execute_step_settings_have_help():
    from course_tools.autograde import CourseExecute

    for name in ("skip_ungraded", "definitions_only", "sandbox", "temp_workdir", "kill_processes",
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
    step = CourseExecute(skip_ungraded=False, definitions_only=False, sandbox="off", timeout=3)
    nb, _ = step.preprocess(nb, {})
    assert [o.get("text") for o in nb.cells[0].outputs] == ["before\n"]
    assert [o.get("ename") for o in nb.cells[1].outputs] == ["CellTimeoutError"]
    assert [(o.get("ename"), o.get("evalue")) for o in nb.cells[2].outputs] == [
        ("NotRun", "not run: cell 1 ran past its time limit, so this cell earns no points.")]
