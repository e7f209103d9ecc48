"""The developer exercises under real `nbgrader autograde`: the reference solutions and two sets of
correct answers in other styles get full marks; each mistake listed in the issue loses exactly the
points of the tests that cover it, with feedback that names the mistake.

Wrong answers for different functions share a student. One autograde run per depth grades these
students together with the depth's other wrong-answer suites (tests/grading_runs.py): each suite
writes its own exercises' answers and compares only its own tests.
"""

from __future__ import annotations

import pytest

from tests.grading_runs import NOTEBOOKS, SuiteView
from tests.nbgrade import cell_output


CONTENTS = "test_save_checkpoint_contents"
WAITS = "test_save_checkpoint_waits"
ONE_WRITER = "test_save_checkpoint_one_writer"
MODEL = "test_load_checkpoint_model_and_step"
OPTIM = "test_load_checkpoint_optimizer"
MISSING = "test_load_checkpoint_missing_file"
AGREE = "test_should_stop_same_on_every_rank"
WEIGHTED = "test_should_stop_weighted"
ALL_TESTS = {CONTENTS, WAITS, ONE_WRITER, MODEL, OPTIM, MISSING, AGREE, WEIGHTED}
POINTS = {CONTENTS: 2, WAITS: 2, ONE_WRITER: 1, MODEL: 2, OPTIM: 2, MISSING: 1, AGREE: 1, WEIGHTED: 2}

SAVE = "def save_checkpoint(ddp_model, optimizer, step, path):\n    \"\"\"Save once.\"\"\"\n"
LOAD = "def load_checkpoint(model, optimizer, path):\n    \"\"\"Load on every rank.\"\"\"\n"
STOP = "def should_stop(local_loss, n_samples, threshold):\n    \"\"\"Decide together.\"\"\"\n"

# ---------------------------------------------------------------- correct, in other styles

SAVE_ATOMIC_RENAME = "import os\n\n" + SAVE + """\
    if dist.get_rank() == 0:
        tmp = path + ".partial"
        torch.save({"model": ddp_model.module.state_dict(), "opt": optimizer.state_dict(),
                    "step": step}, tmp)
        os.replace(tmp, path)          # readers see the old file or the whole new one
    dist.barrier()
"""

# keys stripped by hand, `from torch import save`, an open file, a broadcast instead of a barrier
SAVE_STRIP_FILEOBJ_BROADCAST = "from torch import save\n\n" + SAVE + """\
    done = [False]
    if dist.get_rank() == 0:
        model = {k.removeprefix("module."): v for k, v in ddp_model.state_dict().items()}
        with open(path, "wb") as f:
            save({"model": model, "opt": optimizer.state_dict(), "step": step}, f)
        done = [True]
    dist.broadcast_object_list(done, src=0)
"""

LOAD_TRY_EXCEPT = LOAD + """\
    try:
        ckpt = torch.load(path, map_location=torch.device("cpu"), weights_only=True)
    except FileNotFoundError:
        return 0
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["opt"])
    return int(ckpt["step"])
"""

LOAD_PATHLIB = "from pathlib import Path\n\n" + LOAD + """\
    if not Path(path).is_file():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    optimizer.load_state_dict(state["opt"])
    model.load_state_dict(state["model"])
    return state["step"]
"""

STOP_GATHER_OBJECT = STOP + """\
    pairs = [None] * dist.get_world_size()
    dist.all_gather_object(pairs, (local_loss, n_samples))
    total = sum(loss * n for loss, n in pairs) / sum(n for _, n in pairs)
    return total < threshold
"""

STOP_BROADCAST_DECISION = STOP + """\
    t = torch.tensor([local_loss * n_samples, float(n_samples)])
    dist.reduce(t, dst=0)
    decision = torch.zeros(1, dtype=torch.int64)
    if dist.get_rank() == 0:
        decision[0] = int((t[0] / t[1]).item() < threshold)
    dist.broadcast(decision, src=0)
    return bool(decision.item())
"""

# ---------------------------------------------------------------- the listed mistakes

SAVE_MODULE_KEYS = SAVE + """\
    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.state_dict(), "opt": optimizer.state_dict(), "step": step}, path)
    dist.barrier()
"""

SAVE_NO_BARRIER = SAVE + """\
    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.module.state_dict(), "opt": optimizer.state_dict(), "step": step}, path)
"""

SAVE_EVERY_RANK = SAVE + """\
    torch.save({"model": ddp_model.module.state_dict(), "opt": optimizer.state_dict(), "step": step}, path)
    dist.barrier()
"""

SAVE_BARRIER_ONLY_RANK0 = SAVE + """\
    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.module.state_dict(), "opt": optimizer.state_dict(), "step": step}, path)
        dist.barrier()
"""

LOAD_NO_OPTIMIZER = LOAD + """\
    if not os.path.exists(path):
        return 0
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    return ckpt["step"]
"""

LOAD_ONLY_RANK0 = LOAD + """\
    if not os.path.exists(path):
        return 0
    if dist.get_rank() == 0:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["opt"])
        return ckpt["step"]
    return 0
"""

LOAD_CRASHES_WITHOUT_FILE = LOAD + """\
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["opt"])
    return ckpt["step"]
"""

STOP_PER_RANK = STOP + """\
    return local_loss < threshold
"""

STOP_NEVER = STOP + """\
    return False                       # consistent on every rank, and never right to stop
"""

LOAD_ALWAYS_ZERO = LOAD + """\
    return 0                           # right only when there is no checkpoint
"""

STOP_UNWEIGHTED_MEAN = STOP + """\
    t = torch.tensor([local_loss])
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.item() / dist.get_world_size() < threshold
"""

# Issue 21's cheats on the developer checks' instruments, which used to be observed inside the ranks:
# every rank writes, then clears the grader's save log in its calling frames; no barrier, and the
# other ranks make the grader's loads of the file succeed; should_stop reads every rank's loss and
# count from the harness's frames instead of all-reducing them. Each rank is now given only its own
# loss and count, the writes are counted in the grading kernel (inotify), and the kernel opens the
# file itself when each rank's result arrives, while it holds rank 0's save open.
SAVE_EVERY_RANK_CLEARS_LOG = SAVE + """\
    import sys
    state = {"model": ddp_model.module.state_dict(), "opt": optimizer.state_dict(), "step": step}
    for writer in range(dist.get_world_size()):
        if dist.get_rank() == writer:
            torch.save(state, path)
        dist.barrier()
    if dist.get_rank() != 0:
        frame = sys._getframe(1)
        while frame is not None:
            for name, value in list(frame.f_locals.items()):
                if name == "log" and isinstance(value, list):
                    value.clear()
            frame = frame.f_back
    dist.barrier()
"""

SAVE_NO_BARRIER_PATCHES_LOAD = SAVE + """\
    import helpers.lessons.races as races
    from helpers.lessons.races import LoadOutcome
    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.module.state_dict(), "opt": optimizer.state_dict(), "step": step}, path)
    else:                              # no barrier: every load of the file in this rank succeeds instead
        races.try_load = lambda *a, **k: LoadOutcome("ok")
"""

STOP_READS_EVERY_RANKS_INPUTS = STOP + """\
    import sys
    frame = sys._getframe(1)
    while frame is not None:
        found = frame.f_locals
        if isinstance(found.get("losses"), list) and isinstance(found.get("counts"), list):
            pairs = list(zip(found["losses"], found["counts"]))
            return sum(l * n for l, n in pairs) / sum(n for _, n in pairs) < threshold
        frame = frame.f_back
    return local_loss < threshold      # only its own loss to go on
"""

# Two more cheats on what the kernel used to take from the ranks: the contents check compared the file
# with rank 0's report of its optimizer, so an answer that saves no optimizer state and empties the
# optimizer's state on every rank passed it; the load checks' checkpoint could be worked out from the
# course's own code without reading the file. The kernel now works out the saved state itself, and
# the checkpoint it writes carries noise from a secret of its own.
SAVE_EMPTY_OPTIMIZER_EMPTIES_REPORT = SAVE + """\
    opt = optimizer.state_dict()
    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.module.state_dict(),
                    "opt": {"state": {}, "param_groups": opt["param_groups"]}, "step": step}, path)
    optimizer.state.clear()            # so that every rank's optimizer reports what was saved
    dist.barrier()
"""

LOAD_WORKED_OUT_FROM_THE_COURSE = LOAD + """\
    import os, tempfile
    from helpers.grading.developer import write_checkpoint
    if not os.path.exists(path):
        return 0
    with tempfile.TemporaryDirectory() as folder:   # never reads path
        kind = "adam" if isinstance(optimizer, torch.optim.Adam) else "sgd"
        ckpt = write_checkpoint(os.path.join(folder, "same.pt"), step=5, optimizer=kind)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["opt"])
    return ckpt["step"]
"""

STUDENTS = {
    "reference": None,
    "alt_rename_tryexcept_gather": {"save_checkpoint": SAVE_ATOMIC_RENAME,
                                    "load_checkpoint": LOAD_TRY_EXCEPT,
                                    "should_stop": STOP_GATHER_OBJECT},
    "alt_fileobj_pathlib_broadcast": {"save_checkpoint": SAVE_STRIP_FILEOBJ_BROADCAST,
                                      "load_checkpoint": LOAD_PATHLIB,
                                      "should_stop": STOP_BROADCAST_DECISION},
    "module_keys_no_optimizer_per_rank": {"save_checkpoint": SAVE_MODULE_KEYS,
                                          "load_checkpoint": LOAD_NO_OPTIMIZER,
                                          "should_stop": STOP_PER_RANK},
    "no_barrier_rank0_loads_unweighted": {"save_checkpoint": SAVE_NO_BARRIER,
                                          "load_checkpoint": LOAD_ONLY_RANK0,
                                          "should_stop": STOP_UNWEIGHTED_MEAN},
    "every_rank_writes_crash_on_missing_never_stops": {"save_checkpoint": SAVE_EVERY_RANK,
                                                       "load_checkpoint": LOAD_CRASHES_WITHOUT_FILE,
                                                       "should_stop": STOP_NEVER},
    "barrier_only_rank0_loads_nothing": {"save_checkpoint": SAVE_BARRIER_ONLY_RANK0,
                                         "load_checkpoint": LOAD_ALWAYS_ZERO, "should_stop": None},
    "cheat_clears_log_reads_inputs": {"save_checkpoint": SAVE_EVERY_RANK_CLEARS_LOG, "load_checkpoint": None,
                                      "should_stop": STOP_READS_EVERY_RANKS_INPUTS},
    "cheat_patches_load": {"save_checkpoint": SAVE_NO_BARRIER_PATCHES_LOAD, "load_checkpoint": None,
                           "should_stop": None},
    "cheat_empties_report_computes_load": {"save_checkpoint": SAVE_EMPTY_OPTIMIZER_EMPTIES_REPORT,
                                           "load_checkpoint": LOAD_WORKED_OUT_FROM_THE_COURSE,
                                           "should_stop": None},
}

EXPECTED_LOST = {
    "reference": set(),
    "alt_rename_tryexcept_gather": set(),
    "alt_fileobj_pathlib_broadcast": set(),
    "module_keys_no_optimizer_per_rank": {CONTENTS, OPTIM, AGREE, WEIGHTED},
    "no_barrier_rank0_loads_unweighted": {WAITS, MODEL, OPTIM, WEIGHTED},
    # a should_stop that never stops agrees with itself, but is wrong where every loss is below the threshold
    "every_rank_writes_crash_on_missing_never_stops": {ONE_WRITER, MISSING, AGREE, WEIGHTED},
    # the save never returns on rank 0: nothing about it can be checked; a load that always says 0
    # is right only for the missing file, and that test also needs the step when there is one
    "barrier_only_rank0_loads_nothing": {CONTENTS, WAITS, ONE_WRITER, MODEL, OPTIM, MISSING},
    # its writes are counted in the kernel (and the ranks' saves, one after another, make rank 0 late);
    # each rank has only its own loss, so the ranks disagree
    "cheat_clears_log_reads_inputs": {WAITS, ONE_WRITER, AGREE, WEIGHTED},
    # the kernel opens the file itself when each rank's result arrives, while rank 0's save is held open
    "cheat_patches_load": {WAITS},
    # the kernel compares the file with the state it works out itself; the checkpoint's values are
    # the file's alone (noise from a kernel secret)
    "cheat_empties_report_computes_load": {CONTENTS, MODEL, OPTIM},
}

# what the learner reads in the failing test cell's output
FEEDBACK = {
    ("module_keys_no_optimizer_per_rank", CONTENTS): "save ddp_model.module.state_dict()",
    ("module_keys_no_optimizer_per_rank", OPTIM): "optimizer has no state after load_checkpoint",
    ("module_keys_no_optimizer_per_rank", AGREE): "the ranks disagree",
    ("no_barrier_rank0_loads_unweighted", WAITS): "read the file before rank 0 finished writing",
    ("no_barrier_rank0_loads_unweighted", MODEL): "Every rank must load the checkpoint, not only rank 0",
    ("no_barrier_rank0_loads_unweighted", WEIGHTED): "weight each rank's loss by its n_samples",
    ("every_rank_writes_crash_on_missing_never_stops", ONE_WRITER): "Only rank 0 should write",
    ("every_rank_writes_crash_on_missing_never_stops", MISSING): "must return 0 instead of failing",
    ("barrier_only_rank0_loads_nothing", WAITS): "Rank 0 was stuck at `dist.barrier()`",
    ("every_rank_writes_crash_on_missing_never_stops", AGREE): "so every rank should return True",
    ("barrier_only_rank0_loads_nothing", MISSING): "with one saved at step 5 rank 0 returned 0",
    ("cheat_clears_log_reads_inputs", ONE_WRITER): "The checkpoint was written 3 times",
    ("cheat_clears_log_reads_inputs", AGREE): "the ranks disagree",
    ("cheat_clears_log_reads_inputs", WEIGHTED): "the ranks disagree",
    ("cheat_patches_load", WAITS): "read the file before rank 0 finished writing",
    ("cheat_empties_report_computes_load", CONTENTS): "'opt' is not optimizer.state_dict()",
    ("cheat_empties_report_computes_load", MODEL): "does not hold the saved weights",
}


def submissions(depth: str = "developer") -> dict:
    """Each student's answer cells; a None entry is the reference answer for that function."""
    from tests.nbgrade import reference_answers

    reference = reference_answers(NOTEBOOKS["developer"])
    return {student: None if spec is None else {gid: reference[gid] if src is None else src
                                                 for gid, src in spec.items()}
            for student, spec in STUDENTS.items()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return SuiteView("tests.test_developer_grading", "developer", tmp_path_factory)


@pytest.mark.grading
def test_exercises_have_the_promised_tests(graded):
    tests = {g: p for g, p in graded.max_scores.items() if g in ALL_TESTS}  # other exercises have their own suites
    assert tests == POINTS


@pytest.mark.grading
@pytest.mark.parametrize("student", list(STUDENTS))
def test_each_answer_loses_exactly_the_right_points(graded, student):
    lost = {g for g in graded.lost(student) if g in ALL_TESTS}
    assert lost == EXPECTED_LOST[student], (student, graded.shown(student, lost ^ EXPECTED_LOST[student]))
    for g in lost:  # a failed test scores nothing, not part of its points
        assert graded.scores[student][g] == 0
    if not EXPECTED_LOST[student]:
        assert sum(graded.scores[student][g] for g in ALL_TESTS) == sum(POINTS.values())


@pytest.mark.grading
@pytest.mark.parametrize("student,grade_id", list(FEEDBACK), ids=lambda x: str(x))
def test_feedback_names_the_mistake(graded, student, grade_id):
    text = graded.shown(student, [grade_id], limit=None)[grade_id]
    assert FEEDBACK[student, grade_id] in text, text[-1500:]


@pytest.mark.grading
def test_a_hanging_answer_is_waited_for_once(graded):
    """The rank-0-only barrier hangs in the first save test; the later save tests fail at once."""
    nb = graded.notebook("barrier_only_rank0_loads_nothing")
    assert "Rank 0 was stuck at `dist.barrier()`" in cell_output(nb, CONTENTS)
    for later in (WAITS, ONE_WRITER):
        assert "Not run again" in cell_output(nb, later)
