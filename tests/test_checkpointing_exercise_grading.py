"""The developer exercise `save_rotating` under real `nbgrader autograde`: the reference solution and
correct answers in other styles get full marks; each mistake the issue lists loses the points of the
tests that catch it, with feedback that names the mistake.

One autograde run per depth grades these students together with the depth's other wrong-answer suites
(tests/grading_runs.py): each suite writes its own exercises' answers and compares only its own tests.
"""

from __future__ import annotations

import pytest

from tests.grading_runs import NOTEBOOKS, SuiteView


FILES = "test_save_rotating_files"
WAITS = "test_save_rotating_waits"
ONE_WRITER = "test_save_rotating_one_writer"
ATOMIC = "test_save_rotating_atomic"
DURABLE = "test_save_rotating_durable"
MODE = "test_save_rotating_mode"
FAILURE = "test_save_rotating_failure"
POINTS = {FILES: 2, WAITS: 2, ONE_WRITER: 1, ATOMIC: 2, DURABLE: 1, MODE: 1, FAILURE: 1}

HEAD = ("import glob\nimport os\nimport tempfile\n\n"
        "def save_rotating(state, ckpt_dir, step, keep=3):\n    \"\"\"Save every k steps, keep the last k.\"\"\"\n")

# ---------------------------------------------------------------- correct, in other styles

# pathlib, a helper for both files, os.rename, fdatasync, a broadcast instead of a barrier
PATHLIB_HELPER = """\
from pathlib import Path

def _publish(path, write):
    \"\"\"Write path through a temp file beside it.\"\"\"
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fdatasync(f.fileno())
        os.rename(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)

""" + HEAD + """\
    folder = Path(ckpt_dir)
    name = f"step_{step:08d}.pt"
    done = [None]
    if dist.get_rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
        _publish(folder / name, lambda f: torch.save(state, f))
        _publish(folder / "latest", lambda f: f.write(name.encode()))
        for old in sorted(folder.glob("step_*.pt"))[:-keep]:
            old.unlink()
        done = [str(folder / name)]
    dist.broadcast_object_list(done, src=0)
    return done[0]
"""

# torch.save to a temp path (not a file object), fsync through a separate descriptor
SAVE_TO_TEMP_PATH = HEAD + """\
    path = os.path.join(ckpt_dir, f"step_{step:08d}.pt")
    if dist.get_rank() == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
        tmp = path + ".tmp"
        try:
            torch.save(state, tmp)
            fd = os.open(tmp, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            os.replace(tmp, path)
            with open(os.path.join(ckpt_dir, "latest.tmp"), "w") as f:
                f.write(os.path.basename(path))
                f.flush()
                os.fsync(f.fileno())
            os.replace(os.path.join(ckpt_dir, "latest.tmp"), os.path.join(ckpt_dir, "latest"))
        finally:
            for leftover in (tmp, os.path.join(ckpt_dir, "latest.tmp")):
                if os.path.exists(leftover):
                    os.remove(leftover)
        steps = sorted(f for f in os.listdir(ckpt_dir) if f.startswith("step_") and f.endswith(".pt"))
        for old in steps[:max(0, len(steps) - keep)]:
            os.remove(os.path.join(ckpt_dir, old))
    dist.barrier()
    return path
"""

# ---------------------------------------------------------------- the mistakes the issue lists


def _reference_with(*changes: tuple[str, str]) -> str:
    """The reference answer with some lines changed (each change must apply)."""
    from tests.nbgrade import reference_answers

    source = reference_answers(NOTEBOOKS["developer"])["save_rotating"]
    for old, new in changes:
        assert old in source, f"the reference answer no longer contains {old!r}"
        source = source.replace(old, new)
    return source


ROTATE = ("        for old in sorted(glob.glob(os.path.join(ckpt_dir, \"step_*.pt\")))[:-keep]:\n"
          "            os.remove(old)\n")

STRAIGHT_TO_FINAL = HEAD + """\
    name = f"step_{step:08d}.pt"
    path = os.path.join(ckpt_dir, name)
    if dist.get_rank() == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        with open(os.path.join(ckpt_dir, "latest"), "w") as f:
            f.write(name)
        for old in sorted(glob.glob(os.path.join(ckpt_dir, "step_*.pt")))[:-keep]:
            os.remove(old)
    dist.barrier()
    return path
"""


# Issue 21's cheats on the instruments these checks used to read inside the ranks: every rank writes,
# then empties the grader's log of its torch.save calls in the calling frames; rank 0 writes straight
# to the final name, then tells the grader's notes of the file it was writing and of what the folder
# held meanwhile that it was a temp file.
# The kernel now watches ckpt_dir itself (inotify: the writes and renames onto each name) and looks at
# the folder while it holds rank 0's last save open.
CLEAR_SAVE_LOG = """\
    import sys
    frame = sys._getframe(1)
    while frame is not None and dist.get_rank() != 0:
        seen = frame.f_locals.get("seen")
        if isinstance(seen, dict) and isinstance(seen.get("saves"), list):
            seen["saves"].clear()
        frame = frame.f_back
"""

FAKES_ITS_TEMP_FILE = HEAD + """\
    import sys
    name = f"step_{step:08d}.pt"
    path = os.path.join(ckpt_dir, name)
    if dist.get_rank() == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
        with open(path, "wb") as f:            # straight to the final name
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        frame = sys._getframe(1)              # then the grader's note says it was a temp file
        while frame is not None:
            seen = frame.f_locals.get("seen")
            if isinstance(seen, dict) and seen.get("half"):
                seen["half"]["target"] = path + ".tmp"
                seen["half"]["listing"].remove(name)
            frame = frame.f_back
        with open(os.path.join(ckpt_dir, "latest.tmp"), "w") as f:
            f.write(name)
        os.replace(os.path.join(ckpt_dir, "latest.tmp"), os.path.join(ckpt_dir, "latest"))
        for old in sorted(glob.glob(os.path.join(ckpt_dir, "step_*.pt")))[:-keep]:
            os.remove(old)
    dist.barrier()
    return path
"""

# A cheat on the old fsync log: no fsync at all, then an entry for the temp file written into the
# grader's note of rank 0's fsyncs in the calling frames. The kernel now sees the calls themselves.
FAKES_ITS_FSYNC = (("                    os.fsync(f.fileno())\n",
                    "                    import sys\n"
                    "                    frame = sys._getframe(1)\n"
                    "                    while frame is not None:\n"
                    "                        seen = frame.f_locals.get(\"seen\")\n"
                    "                        if isinstance(seen, dict) and isinstance(seen.get(\"fsyncs\"), list):\n"
                    "                            seen[\"fsyncs\"].append((os.path.realpath(tmp), f.tell()))\n"
                    "                        frame = frame.f_back\n"),)

EVERY_RANK_IN_TURN = (("    if dist.get_rank() == 0:\n",
                       "    for _ in range(dist.get_rank()):\n        dist.barrier()\n    if True:\n"),
                      ("    dist.barrier()\n    return",
                       "    for _ in range(dist.get_world_size() - dist.get_rank()):\n        dist.barrier()\n    return"))


def students() -> dict[str, dict[str, str] | None]:
    return {
        "reference": None,
        "pathlib_helper_broadcast": {"save_rotating": PATHLIB_HELPER},
        "save_to_temp_path": {"save_rotating": SAVE_TO_TEMP_PATH},
        "straight_to_final_name": {"save_rotating": STRAIGHT_TO_FINAL},
        "removes_before_writing": {"save_rotating": _reference_with(
            (ROTATE, ""),
            ("        os.makedirs(ckpt_dir, exist_ok=True)\n",
             "        os.makedirs(ckpt_dir, exist_ok=True)\n" + ROTATE.replace("[:-keep]", "[:-keep + 1 or None]")))},
        # every rank writes, in turn (rank r after ranks 0..r-1): the writes never interleave, so what
        # the checks see does not depend on how the ranks are scheduled
        "every_rank_writes": {"save_rotating": _reference_with(*EVERY_RANK_IN_TURN)},
        "cheat_clears_save_log": {"save_rotating": _reference_with(*EVERY_RANK_IN_TURN, (
            "    for _ in range(dist.get_world_size() - dist.get_rank()):\n",
            CLEAR_SAVE_LOG + "    for _ in range(dist.get_world_size() - dist.get_rank()):\n"))},
        "cheat_fakes_its_temp_file": {"save_rotating": FAKES_ITS_TEMP_FILE},
        "cheat_fakes_its_fsync": {"save_rotating": _reference_with(*FAKES_ITS_FSYNC)},
        # three independent mistakes in one answer: each loses only its own test
        "owner_only_no_fsync_no_barrier": {"save_rotating": "import tempfile\n" + _reference_with(
            ("tmp = f\"{target}.tmp\"\n", "fd, tmp = tempfile.mkstemp(dir=ckpt_dir)\n            os.close(fd)\n"),
            ("                    os.fsync(f.fileno())\n", ""),
            ("    dist.barrier()\n", ""))},
    }


STUDENTS = students()

EXPECTED_LOST = {
    "reference": set(),
    "pathlib_helper_broadcast": set(),
    "save_to_temp_path": set(),
    "straight_to_final_name": {ATOMIC, FAILURE},
    "removes_before_writing": {ATOMIC, FAILURE},
    "every_rank_writes": {ONE_WRITER},
    "cheat_clears_save_log": {ONE_WRITER},
    # its own note of the file is not what the kernel saw: graded as what it did, writing (and
    # fsyncing) the final name in place
    "cheat_fakes_its_temp_file": {ATOMIC, FAILURE},
    "owner_only_no_fsync_no_barrier": {MODE, DURABLE, WAITS},
    "cheat_fakes_its_fsync": {DURABLE},
}
#: Tests an answer may also lose (none: `latest` rewritten in place is now seen as a write onto the name
#: itself, no longer guessed from inode numbers, which a filesystem may reuse).
MAY_ALSO_LOSE: dict[str, set[str]] = {}

FEEDBACK = {
    ("straight_to_final_name", ATOMIC): "wrote straight to the final name",
    ("straight_to_final_name", FAILURE): "was left under the final name",
    ("owner_only_no_fsync_no_barrier", WAITS): "returned before the save was finished",
    ("removes_before_writing", ATOMIC): "old checkpoints were removed before the new one was complete",
    ("removes_before_writing", FAILURE): "remove old checkpoints only after the new one is complete",
    ("every_rank_writes", ONE_WRITER): "Only rank 0 should write",
    ("cheat_clears_save_log", ONE_WRITER): "step_00000001.pt was written 3 times",
    ("cheat_fakes_its_temp_file", ATOMIC): "wrote straight to the final name",
    ("owner_only_no_fsync_no_barrier", MODE): "owner-only",
    ("owner_only_no_fsync_no_barrier", DURABLE): "never called os.fsync",
    ("cheat_fakes_its_fsync", DURABLE): "never called os.fsync",
}


def submissions(depth: str = "developer") -> dict:
    return STUDENTS


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return SuiteView("tests.test_checkpointing_exercise_grading", "developer", tmp_path_factory)


def _mine(grade_ids) -> set[str]:
    return {g for g in grade_ids if g in POINTS}


@pytest.mark.grading
def test_the_exercise_has_the_promised_tests(graded):
    assert {g: p for g, p in graded.max_scores.items() if g.startswith("test_save_rotating")} == POINTS


@pytest.mark.grading
@pytest.mark.parametrize("student", list(STUDENTS))
def test_each_answer_loses_exactly_the_right_points(graded, student):
    lost = _mine(graded.lost(student))
    must, may = EXPECTED_LOST[student], MAY_ALSO_LOSE.get(student, set())
    assert must <= lost <= must | may, (student, graded.shown(student, (must - lost) | (lost - must - may)))
    for g in lost:
        assert graded.scores[student][g] == 0


@pytest.mark.grading
@pytest.mark.parametrize("student,grade_id", list(FEEDBACK), ids=lambda x: str(x))
def test_feedback_names_the_mistake(graded, student, grade_id):
    text = graded.shown(student, [grade_id], limit=None)[grade_id]
    assert FEEDBACK[student, grade_id] in text, text[-1500:]
