"""The beginner exercises under real `nbgrader autograde`: reference and alternative correct
answers get full marks; each listed mistake loses exactly the points of the test that covers it,
with feedback that names the mistake; an empty notebook scores nothing.

One autograde run per depth grades these students together with the depth's other wrong-answer suites
(tests/grading_runs.py): each suite writes its own exercises' answers and compares only its own tests."""

from __future__ import annotations

import pytest

from tests.grading_runs import SuiteView


ONLY_RANK0 = "test_save_once_only_rank0_writes"
WAITS = "test_save_once_everyone_waits"
SAME = "test_combined_average_same_on_every_worker"
UNEQUAL = "test_combined_average_unequal_counts"
ALL_TESTS = {ONLY_RANK0, WAITS, SAME, UNEQUAL}

DOC_SAVE = '    """Save obj to path once."""\n'
DOC_AVG = '    """Average over all workers."""\n'

# ---------------------------------------------------------------- correct, in other styles

SAVE_ATOMIC_RENAME = "import os\n\ndef save_once(obj, path):\n" + DOC_SAVE + """\
    if int(os.environ["RANK"]) == 0:
        tmp = path + ".partial"
        torch.save(obj, tmp)
        os.replace(tmp, path)
    dist.barrier()
"""

SAVE_BARE_IMPORT_IF_ELSE = "from torch import save\n\ndef save_once(obj, path):\n" + DOC_SAVE + """\
    if dist.get_rank() == 0:
        save(obj, path)
        dist.barrier()
    else:
        dist.barrier()
"""

SAVE_FILE_OBJECT_BROADCAST = "def save_once(obj, path):\n" + DOC_SAVE + """\
    done = [False]
    if dist.get_rank() == 0:
        with open(path, "wb") as f:
            torch.save(obj, f)
        done = [True]
    dist.broadcast_object_list(done, src=0)
    assert done[0]
"""

AVG_GATHER_OBJECT = "def combined_average(loss, count):\n" + DOC_AVG + """\
    pairs = [None] * dist.get_world_size()
    dist.all_gather_object(pairs, (loss, count))
    return sum(l * c for l, c in pairs) / sum(c for _, c in pairs)
"""

AVG_TWO_SCALARS = "def combined_average(loss, count):\n" + DOC_AVG + """\
    total = torch.tensor(loss * count)
    n = torch.tensor(float(count))
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    dist.all_reduce(n, op=dist.ReduceOp.SUM)
    return float(total / n)
"""

AVG_REDUCE_BROADCAST = "def combined_average(loss, count):\n" + DOC_AVG + """\
    t = torch.tensor([loss * count, float(count)])
    dist.reduce(t, dst=0)
    dist.broadcast(t, src=0)
    return (t[0] / t[1]).item()
"""

# ---------------------------------------------------------------- the listed mistakes

SAVE_NO_BARRIER = "def save_once(obj, path):\n" + DOC_SAVE + """\
    if dist.get_rank() == 0:
        torch.save(obj, path)
"""

SAVE_EVERY_WORKER = "def save_once(obj, path):\n" + DOC_SAVE + """\
    torch.save(obj, path)
    dist.barrier()
"""

SAVE_BARRIER_ONLY_RANK0 = "def save_once(obj, path):\n" + DOC_SAVE + """\
    if dist.get_rank() == 0:
        torch.save(obj, path)
        dist.barrier()
"""

AVG_OF_AVERAGES = "def combined_average(loss, count):\n" + DOC_AVG + """\
    t = torch.tensor([loss])
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()
"""

AVG_LOCAL = "def combined_average(loss, count):\n" + DOC_AVG + """\
    return loss
"""

AVG_COUNT_TIMES_WORLD = "def combined_average(loss, count):\n" + DOC_AVG + """\
    t = torch.tensor([loss * count])
    dist.all_reduce(t)
    return t.item() / (count * dist.get_world_size())
"""

STUDENTS = {
    "reference": None,
    "alt_rename_gather": {"save_once": SAVE_ATOMIC_RENAME, "combined_average": AVG_GATHER_OBJECT},
    "alt_bare_scalars": {"save_once": SAVE_BARE_IMPORT_IF_ELSE, "combined_average": AVG_TWO_SCALARS},
    "alt_fileobj_reduce": {"save_once": SAVE_FILE_OBJECT_BROADCAST,
                           "combined_average": AVG_REDUCE_BROADCAST},
    "no_barrier_avg_of_avgs": {"save_once": SAVE_NO_BARRIER, "combined_average": AVG_OF_AVERAGES},
    "every_writer_local": {"save_once": SAVE_EVERY_WORKER, "combined_average": AVG_LOCAL},
    "rank0_barrier_count_x_world": {"save_once": SAVE_BARRIER_ONLY_RANK0,
                                    "combined_average": AVG_COUNT_TIMES_WORLD},
    "blank": {},  # the released stubs: raise NotImplementedError
}

EXPECTED_LOST = {
    "reference": set(),
    "alt_rename_gather": set(),
    "alt_bare_scalars": set(),
    "alt_fileobj_reduce": set(),
    "no_barrier_avg_of_avgs": {WAITS, UNEQUAL},
    "every_writer_local": {ONLY_RANK0, SAME, UNEQUAL},
    "rank0_barrier_count_x_world": {ONLY_RANK0, WAITS, UNEQUAL},
    "blank": ALL_TESTS,
}

# what the learner reads in the failing test cell's output
FEEDBACK = {
    ("no_barrier_avg_of_avgs", WAITS): "opened the file as soon as save_once returned",
    ("no_barrier_avg_of_avgs", UNEQUAL): "average of the 3 workers' averages",
    ("every_writer_local", ONLY_RANK0): "Only worker 0 should write",
    ("every_writer_local", SAME): "Each worker returned its own loss",
    ("every_writer_local", UNEQUAL): "Each worker returned its own loss",
    ("rank0_barrier_count_x_world", ONLY_RANK0): "Rank 0 was stuck at `dist.barrier()`",
    ("rank0_barrier_count_x_world", WAITS): "Rank 0 was stuck at `dist.barrier()`",
    ("rank0_barrier_count_x_world", UNEQUAL): "You divided by count × world size",
    ("blank", ONLY_RANK0): "is not written yet",
    ("blank", SAME): "is not written yet",
}


def submissions(depth: str = "beginner") -> dict:
    return STUDENTS


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return SuiteView("tests.test_beginner_grading", "beginner", tmp_path_factory)


@pytest.mark.grading
def test_exercises_have_the_promised_tests(graded):
    assert set(graded.max_scores) >= ALL_TESTS
    assert {g for g in graded.max_scores if g.startswith("test_")} >= ALL_TESTS


@pytest.mark.grading
@pytest.mark.parametrize("student", list(STUDENTS))
def test_each_answer_loses_exactly_the_right_points(graded, student):
    lost = graded.lost(student) & ALL_TESTS  # the notebook's other exercises have their own suites
    assert lost == EXPECTED_LOST[student], (student, graded.shown(student, lost ^ EXPECTED_LOST[student]))
    if not EXPECTED_LOST[student]:
        assert sum(graded.scores[student][g] for g in ALL_TESTS) == sum(graded.max_scores[g] for g in ALL_TESTS)


@pytest.mark.grading
@pytest.mark.parametrize("student,grade_id", list(FEEDBACK), ids=lambda x: str(x))
def test_feedback_names_the_mistake(graded, student, grade_id):
    text = graded.shown(student, [grade_id], limit=None)[grade_id]
    assert FEEDBACK[student, grade_id] in text, text[-1500:]
