"""The researcher exercises under real `nbgrader autograde`: right answers in any style get full
marks, each listed mistake loses exactly the points of the tests that check for it.

One autograde run per depth grades these students together with the depth's other wrong-answer suites
(tests/grading_runs.py): each suite writes its own exercises' answers and compares only its own tests.
"""

from __future__ import annotations

import nbformat
import pytest

from tests.grading_runs import NOTEBOOKS, SuiteView


TESTS = {
    "test_pooled_mean_values", "test_pooled_mean_errors",
    "test_gather_unique_padded", "test_gather_unique_dtypes",
    "test_atomic_save_roundtrip", "test_atomic_save_no_torn_reads", "test_atomic_save_no_leftovers",
}

# ---------------------------------------------------------------- correct, in other styles

POOLED_TORCH = '''
def pooled_mean(losses, counts):
    """Sample-weighted mean, written with tensors."""
    l = torch.as_tensor(list(losses), dtype=torch.float64)
    n = torch.as_tensor(list(counts), dtype=torch.float64)
    if l.shape != n.shape:
        raise ValueError("losses and counts differ in length")
    if (n < 0).any() or n.sum() == 0:
        raise ValueError("counts must be >= 0 and not all zero")
    return float((l * n).sum() / n.sum())
'''

POOLED_LOOP = '''
def pooled_mean(losses, counts):
    """A running total, one group at a time."""
    if len(losses) != len(counts):
        raise ValueError("length mismatch")
    total_loss = total_n = 0.0
    for loss, n in zip(losses, counts):
        if n < 0:
            raise ValueError("negative count")
        total_loss += loss * n
        total_n += n
    if not total_n:
        raise ValueError("no samples")
    return total_loss / total_n
'''

GATHER_TENSORS = '''
def gather_unique(preds, labels, indices):
    """all_gather of equal-size tensors, then scatter by index (duplicates write the same value)."""
    world = dist.get_world_size()

    def gather(t):
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts)

    idx = gather(indices)
    n = int(idx.max()) + 1
    p = torch.empty(n, dtype=preds.dtype)
    l = torch.empty(n, dtype=labels.dtype)
    p[idx] = gather(preds)
    l[idx] = gather(labels)
    return p, l
'''

GATHER_DICT = '''
def gather_unique(preds, labels, indices):
    """all_gather_object of (index, pred, label) rows into a dict."""
    rows = list(zip(indices.tolist(), preds.tolist(), labels.tolist()))
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, rows)
    unique = {}
    for shard in everyone:
        for i, p, l in shard:
            unique.setdefault(i, (p, l))
    keys = sorted(unique)
    return (torch.tensor([unique[k][0] for k in keys], dtype=preds.dtype),
            torch.tensor([unique[k][1] for k in keys], dtype=labels.dtype))
'''

ATOMIC_NAMEDTEMP = '''
def atomic_save(obj, path):
    """NamedTemporaryFile in the same folder, fsync, then pathlib's replace."""
    import pathlib
    target = pathlib.Path(path)
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False, suffix=".tmp") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    pathlib.Path(f.name).replace(target)
'''

ATOMIC_RENAME = '''
def atomic_save(obj, path):
    """A unique sibling name, then os.rename."""
    import uuid
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    torch.save(obj, tmp)
    os.rename(tmp, path)
'''

# ---------------------------------------------------------------- the listed mistakes

POOLED_UNWEIGHTED_CHECKED = '''
def pooled_mean(losses, counts):
    if len(losses) != len(counts) or any(n < 0 for n in counts) or sum(counts) == 0:
        raise ValueError("bad input")
    return sum(losses) / len(losses)          # ignores the counts
'''

POOLED_UNWEIGHTED = '''
def pooled_mean(losses, counts):
    return sum(losses) / len(losses)
'''

GATHER_KEEPS_DUPLICATES = '''
def gather_unique(preds, labels, indices):
    shards = [None] * dist.get_world_size()
    dist.all_gather_object(shards, (preds, labels, indices))
    idx = torch.cat([s[2] for s in shards])
    order = torch.argsort(idx, stable=True)
    return torch.cat([s[0] for s in shards])[order], torch.cat([s[1] for s in shards])[order]
'''

GATHER_LOCAL_ONLY = '''
def gather_unique(preds, labels, indices):
    order = torch.argsort(indices)
    return preds[order], labels[order]
'''

POOLED_ALWAYS_RAISES = '''
def pooled_mean(losses, counts):
    raise ValueError("no")                    # "refuses" every input, valid ones too
'''

ATOMIC_NEVER_WRITES = '''
def atomic_save(obj, path):
    pass                                      # no torn read, no leftover: and no checkpoint
'''

ATOMIC_DIRECT = '''
def atomic_save(obj, path):
    torch.save(obj, path)
'''

ATOMIC_COPY = '''
def atomic_save(obj, path):
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    shutil.copy(tmp, path)                    # a copy writes path in place
    os.remove(tmp)
'''

ATOMIC_LEAVES_TEMP = '''
def atomic_save(obj, path):
    staging = path + ".staging"
    torch.save(obj, staging)
    shutil.copyfile(staging, path + ".new")
    os.replace(path + ".new", path)           # atomic, but the staging file stays
'''

STUDENTS = {
    "reference": None,
    "alt_one": {"pooled_mean": POOLED_TORCH, "gather_unique": GATHER_TENSORS, "atomic_save": ATOMIC_NAMEDTEMP},
    "alt_two": {"pooled_mean": POOLED_LOOP, "gather_unique": GATHER_DICT, "atomic_save": ATOMIC_RENAME},
    "wrong_a": {"pooled_mean": POOLED_UNWEIGHTED_CHECKED, "gather_unique": GATHER_KEEPS_DUPLICATES,
                "atomic_save": ATOMIC_DIRECT},
    "wrong_b": {"pooled_mean": POOLED_UNWEIGHTED, "gather_unique": GATHER_LOCAL_ONLY, "atomic_save": ATOMIC_COPY},
    "wrong_c": {"atomic_save": ATOMIC_LEAVES_TEMP},
    "lazy": {"pooled_mean": POOLED_ALWAYS_RAISES, "atomic_save": ATOMIC_NEVER_WRITES},
    "blank": {},
}
# the reference solutions fill every cell a student does not name (wrong_c writes only atomic_save)
_REFERENCE_FILL = ("pooled_mean", "gather_unique")

EXPECTED_LOST = {
    "reference": set(),
    "alt_one": set(),
    "alt_two": set(),
    "wrong_a": {"test_pooled_mean_values", "test_gather_unique_padded", "test_atomic_save_no_torn_reads"},
    "wrong_b": {"test_pooled_mean_values", "test_pooled_mean_errors", "test_gather_unique_padded",
                "test_gather_unique_dtypes", "test_atomic_save_no_torn_reads"},
    "wrong_c": {"test_atomic_save_no_leftovers"},
    "lazy": {"test_pooled_mean_values", "test_pooled_mean_errors", "test_atomic_save_roundtrip",
             "test_atomic_save_no_torn_reads", "test_atomic_save_no_leftovers"},
    "blank": set(TESTS),
}

FEEDBACK = {  # student -> phrases its autograded notebook must show (what went wrong, in words)
    "wrong_a": ["unweighted mean (2.0) ignores", "padded duplicates", "found a file that does not load"],
    "wrong_b": ["got back only its own", "expected ValueError (the lengths differ)", "path was written in place"],
    "wrong_c": ["the folder also holds ['model.pt.staging']"],
    "lazy": ["pooled_mean([1.0, 3.0], [1, 3]) raised ValueError: no. These inputs are valid",
             "there is no file at path"],
    "blank": ["is not written yet"],
}


def submissions(depth: str = "researcher") -> dict:
    from tests.nbgrade import reference_answers

    reference = reference_answers(NOTEBOOKS["researcher"])
    subs = {}
    for student, answers in STUDENTS.items():
        if answers is None or student == "blank":
            subs[student] = answers
        else:
            filled = {k: reference[k] for k in _REFERENCE_FILL if k not in answers}
            filled.update(answers)
            subs[student] = filled
    return subs


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return SuiteView("tests.test_researcher_grading", "researcher", tmp_path_factory)


def _outputs(graded, student) -> str:
    nb = nbformat.read(graded.notebook(student), as_version=4)
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text.append(out.get("text", "") + out.get("evalue", "") + "".join(out.get("traceback", [])))
    return "\n".join(text)


@pytest.mark.grading
def test_graded_cells_are_the_listed_ones(graded):
    assert set(graded.max_scores) >= TESTS  # the notebook's other exercises have their own suites
    assert sum(graded.max_scores[t] for t in TESTS) == 10


@pytest.mark.grading
@pytest.mark.parametrize("student", list(STUDENTS))
def test_each_student_loses_exactly_the_right_points(graded, student):
    lost = graded.lost(student) & TESTS
    assert lost == EXPECTED_LOST[student], (student, graded.shown(student, lost ^ EXPECTED_LOST[student]))
    want = sum(graded.max_scores[t] for t in TESTS) - sum(graded.max_scores[t] for t in EXPECTED_LOST[student])
    assert sum(graded.scores[student][t] for t in TESTS) == want


@pytest.mark.grading
@pytest.mark.parametrize("student", list(FEEDBACK))
def test_feedback_says_what_went_wrong(graded, student):
    text = _outputs(graded, student)
    for phrase in FEEDBACK[student]:
        assert phrase in text, f"{student}: feedback lacks {phrase!r}"
