"""The linter on the course itself: each mistake the lessons run live is flagged, each wrong answer of
the wrong-answer suites that is one of the linter's mistakes is flagged, and every solution, both
torchrun scripts and every correct answer style of the suites get no finding.

The suites' answers are read from tests/test_*_grading.py, so new correct styles are checked as
they are added.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from helpers.lint import lint_file, lint_source
from tests.conftest import ROOT
from tests.nbgrade import reference_answers

SUITES = ["beginner", "developer", "researcher"]

# The lessons' live mistakes: notebook -> {(code, the flagged line, stripped)}. Every lesson is checked:
# each of these is found, and nothing else is flagged (a lesson not listed here has no finding).
DEMOS = {
    "start/00_start_here.ipynb": {("ORK101", "dist.barrier()          # the other ranks never call this")},
    "beginner/01_one_rank_writes.ipynb": {
        ("ORK102", 'torch.save(model.state_dict(), f"{folder}/model.pt")'),
        ("ORK102", 'with open(f"{folder}/sign_in.txt", "a") as sheet:'),
        ("ORK102", 'with open(path, "a") as report:         # every clerk adds to the same file'),
        ("ORK104", 'print(f"my loss on my {len(mine)} examples: {loss:.2f}")'),
    },
    "beginner/02_every_clerk_talks.ipynb": {
        ("ORK101", "dist.all_reduce(totals)                           # ...so clerk 0 waits for pairs that never come"),
    },
    "developer/01_save_log_resume.ipynb": {
        ("ORK106", "torch.save(ddp.state_dict(), wrapped_path)            # the wrapper's keys"),
        ("ORK107", "return list(torch.load(path, weights_only=True))"),
    },
    "developer/02_common_mistakes.ipynb": {
        ("ORK102", "slow_save(ckpt, path, pause=0.1)    # = torch.save(ckpt, path), stretched: no `if rank == 0:`"),
        ("ORK101", "dist.barrier()                  # only rank 0 ever reaches this line"),
        ("ORK101", "dist.barrier()                   # only rank 0 ever reaches this line"),   # others_carry_on
        ("ORK105", "if (history[-1][1] if use_global else loss) < threshold:   # the decision"),
        ("ORK103", "return str(try_load(path))          # every rank reads: no barrier before it"),
        ("ORK104", 'print(f"step 1: loss {loss.item():.4f}")   # what the dashboard shows'),
    },
    "developer/03_sharded_checkpoints.ipynb": {("ORK101", None)},
    "developer/04_logging_from_one_rank.ipynb": {
        ("ORK104", 'print(f"step {step}: loss {loss.item():.4f}")'),
    },
    "researcher/03_barriers_and_files.ipynb": {
        ("ORK101", "dist.barrier()"),
        ("ORK101", "dist.all_reduce(torch.ones(3))"),
    },
}

# Wrong answers of the suites that are the linter's mistakes: (depth, constant) -> codes. The others
# are mistakes no linter can see in the answer alone (a missing optimizer load, an unweighted mean,
# a barrier-free save whose read happens in the grader, a copy instead of a rename), or need a whole
# distributed script (ORK102/104 apply to a file that starts a process group; an answer is one
# function, so every rank writing its own temporary file or printing its own loss is not flagged there).
WRONG = {
    ("beginner", "SAVE_EVERY_WORKER"): {"ORK102"},
    ("beginner", "SAVE_BARRIER_ONLY_RANK0"): {"ORK101"},
    ("beginner", "REPORT_COMBINE_ON_RANK0"): {"ORK101"},
    ("developer", "SAVE_EVERY_RANK"): {"ORK102"},
    ("developer", "SAVE_BARRIER_ONLY_RANK0"): {"ORK101"},
    ("developer", "SAVE_MODULE_KEYS"): {"ORK106"},
}


def notebook_lines(path: Path) -> dict[int, list[str]]:
    import json

    cells = json.loads(path.read_text())["cells"]
    return {i: "".join(c["source"]).splitlines() for i, c in enumerate(cells, start=1)}


LESSONS = sorted(p.relative_to(ROOT / "solutions").as_posix() for p in (ROOT / "solutions").glob("*/*.ipynb")
                 if "exercises" not in p.name)


def test_every_listed_lesson_exists():
    assert set(DEMOS) <= set(LESSONS)


@pytest.mark.parametrize("notebook", LESSONS)
def test_each_lesson_mistake_is_flagged_and_nothing_else(notebook):
    path = ROOT / "solutions" / notebook
    report = lint_file(path)
    assert report.errors == []
    lines = notebook_lines(path)
    got = {(f.code, lines[f.cell][f.line - 1].strip()) for f in report.findings}
    want = DEMOS.get(notebook, set())
    if any(text is None for _, text in want):        # only the codes are pinned
        got = {(code, None) for code, _ in got}
    assert got == want


def _suites():
    """(depth, module, students, lost) for every wrong-answer suite of tests/."""
    for depth in SUITES:
        mod = importlib.import_module(f"tests.test_{depth}_grading")
        yield depth, mod, mod.STUDENTS, mod.EXPECTED_LOST
    mod = importlib.import_module("tests.test_checkpointing_exercise_grading")
    yield "developer", mod, mod.STUDENTS, mod.EXPECTED_LOST
    mod = importlib.import_module("tests.test_logging_exercises_grading")
    for depth, (students, lost, *_) in mod.SUITES.items():
        yield depth, mod, students, lost


def suite_answers():
    """(depth, name, source, correct?) for every answer of the wrong-answer suites: the name is the
    answer's constant in its suite, or student:grade_id for an answer built by a function."""
    out = []
    for depth, mod, students, lost in _suites():
        names = {id(v): k for k, v in vars(mod).items() if isinstance(v, str) and k.isupper()}
        for student, spec in students.items():
            for gid, src in (spec or {}).items():
                if src is None:
                    continue
                out.append((depth, names.get(id(src), f"{student}:{gid}"), src, not lost[student]))
    return sorted(set(out))


ANSWERS = suite_answers()


@pytest.mark.parametrize("depth,name,source,correct", ANSWERS, ids=[f"{a[0]}-{a[1]}" for a in ANSWERS])
def test_suite_answers(depth, name, source, correct):
    codes = {f.code for f in lint_source(source)}
    if correct:
        assert codes == set(), f"a correct answer style was flagged: {codes}"
    elif (depth, name) in WRONG:
        assert codes == WRONG[depth, name]


def test_every_listed_wrong_answer_exists():
    assert {(d, n) for d, n, _, correct in ANSWERS if not correct} >= set(WRONG)


@pytest.mark.parametrize("notebook", sorted(p.relative_to(ROOT / "solutions").as_posix()
                                            for p in (ROOT / "solutions").glob("*/*.ipynb")
                                            if "exercises" in p.name))
def test_every_solution_is_clean(notebook):
    for grade_id, source in reference_answers(ROOT / "solutions" / notebook).items():
        assert lint_source(source) == [], grade_id


@pytest.mark.parametrize("script", sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("solutions/*/*.py")))
def test_torchrun_scripts_are_clean(script):
    report = lint_file(ROOT / script)
    assert report.errors == [] and report.findings == []
