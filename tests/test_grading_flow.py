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
    witness = tmp_path / "witness"
    witness.mkdir()
    messy = CORRECT_SAVE_ONCE + textwrap.dedent(f"""
        import subprocess, pathlib
        for _ in range(20_000):
            print("a line of noise")
        pathlib.Path("left_behind.txt").write_text("junk")
        orphan = subprocess.Popen(["sleep", "600"])
        pathlib.Path({str(witness / "orphan.pid")!r}).write_text(str(orphan.pid))
    """)
    submissions = {
        "reference": None,
        # a barrier only rank 0 reaches: that test fails within its pool timeout, the rest is graded
        "pool_hang": {"save_once": CORRECT_SAVE_ONCE.replace(
            "        torch.save(obj, path)\n    dist.barrier()",
            "        torch.save(obj, path)\n        dist.barrier()"),
            "combined_average": CORRECT_COMBINED},
        # an infinite loop at top level of an answer cell: the cell times out, the notebook goes on
        "kernel_loop": {"save_once": "while True:\n    pass\n" + CORRECT_SAVE_ONCE,
                        "combined_average": CORRECT_COMBINED},
        # the kernel dies in the first answer: the correct second answer must not be counted
        "kernel_exit": {"save_once": "import os\nos._exit(1)", "combined_average": CORRECT_COMBINED},
        # a rank dies of SIGABRT inside the second answer; the first answer keeps its points
        "rank_abort": {"save_once": CORRECT_SAVE_ONCE, "combined_average": textwrap.dedent("""
            def combined_average(loss, count):
                import os, torch.distributed as dist
                if dist.get_rank() == 1:
                    os.abort()
                return loss
            """)},
        # huge output, a file in the working folder, and a process started from the kernel
        "messy": {"save_once": messy, "combined_average": CORRECT_COMBINED},
    }
    graded = autograde(source, submissions, tmp_path)
    save_tests = {g for g in graded.max_scores if "save_once" in g}
    avg_tests = {g for g in graded.max_scores if "combined_average" in g}
    full = sum(graded.max_scores.values())
    assert graded.total("reference") == full
    assert graded.lost("pool_hang") == save_tests
    assert graded.lost("kernel_loop") == save_tests
    assert graded.total("kernel_exit") == 0, graded.scores["kernel_exit"]
    assert graded.lost("rank_abort") == avg_tests
    assert graded.total("messy") == full

    pid = int((witness / "orphan.pid").read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, \
        "a process started by an answer survived grading"
    leftovers = [p for p in graded.course.rglob("left_behind.txt")]
    assert not leftovers, f"an answer's file landed in the course: {leftovers}"
    autograded = graded.course / "autograded" / "messy" / "beginner" / "03_exercises.ipynb"
    nb = nbformat.read(autograded, as_version=4)
    printed = sum(len(o.get("text", "").splitlines()) for c in nb.cells for o in c.get("outputs", []))
    assert printed < 2000, "huge output was not cut"

    died = nbformat.read(graded.course / "autograded" / "kernel_exit" / "beginner" / source.name,
                         as_version=4)
    messages = [o.get("evalue", "") for c in died.cells for o in c.get("outputs", [])
                if o.get("output_type") == "error"]
    assert any("kernel died" in m for m in messages)


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
