"""The logging exercises (issue 11 §4) under real `nbgrader autograde`: the reference solutions and
answers in other correct styles get full marks; each mistake the issue lists loses exactly the points
of the tests that cover it, with feedback that names it; the released stubs score nothing.

One autograde run per depth grades these students together with the depth's other wrong-answer suites
(tests/grading_runs.py): each suite writes its own exercises' answers and compares only its own tests.
"""

from __future__ import annotations

import pytest

from tests.grading_runs import NOTEBOOKS, SuiteView
from tests.nbgrade import reference_answers

# ----------------------------------------------------------------------------- beginner

RETURNS, PRINTS = "test_report_average_returns_combined", "test_report_average_only_worker0_prints"
REPORT = "def report_average(loss, count):\n    \"\"\"Combine, then worker 0 announces.\"\"\"\n"

REPORT_GATHER_OBJECT = REPORT + """\
    pairs = [None] * dist.get_world_size()
    dist.all_gather_object(pairs, (loss, count))
    average = sum(l * c for l, c in pairs) / sum(c for _, c in pairs)
    if dist.get_rank() == 0:
        print("average loss:", f"{average:.4f}")
    return average
"""

REPORT_REDUCE_BROADCAST = REPORT + """\
    t = torch.tensor([loss * count, float(count)], dtype=torch.float64)
    dist.reduce(t, dst=0)
    dist.broadcast(t, src=0)
    if not dist.get_rank():
        print("average loss: %.4f" % (t[0] / t[1]).item())
    return float(t[0] / t[1])
"""

REPORT_ENV_TWO_SCALARS = "import os\nimport sys\n\n" + REPORT + """\
    total, n = torch.tensor(float(loss * count)), torch.tensor(float(count))
    dist.all_reduce(total)
    dist.all_reduce(n)
    if int(os.environ["RANK"]) == 0:
        sys.stdout.write(f"average loss: {(total / n).item():.4f}\\n")
    return (total / n).item()
"""

REPORT_COMBINE_ON_RANK0 = REPORT + """\
    if dist.get_rank() == 0:
        t = torch.tensor([loss * count, count], dtype=torch.float64)
        dist.all_reduce(t)
        print(f"average loss: {(t[0] / t[1]).item():.4f}")
        return (t[0] / t[1]).item()
"""

REPORT_EVERY_RANK_PRINTS = REPORT + """\
    t = torch.tensor([loss * count, count], dtype=torch.float64)
    dist.all_reduce(t)
    print(f"average loss: {(t[0] / t[1]).item():.4f}")
    return (t[0] / t[1]).item()
"""

REPORT_LOCAL = REPORT + """\
    t = torch.tensor([loss * count, count], dtype=torch.float64)
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        print(f"average loss: {loss:.4f}")
    return loss
"""

REPORT_PRINTS_LOCAL = REPORT + """\
    t = torch.tensor([loss * count, count], dtype=torch.float64)
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        print(f"average loss: {loss:.4f}")
    return (t[0] / t[1]).item()
"""

REPORT_RETURNS_ON_RANK0 = REPORT + """\
    t = torch.tensor([loss * count, count], dtype=torch.float64)
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        print(f"average loss: {(t[0] / t[1]).item():.4f}")
        return (t[0] / t[1]).item()
"""

BEGINNER = {
    "reference": {"report_average": None},
    "gather_object": {"report_average": REPORT_GATHER_OBJECT},
    "reduce_broadcast": {"report_average": REPORT_REDUCE_BROADCAST},
    "env_two_scalars": {"report_average": REPORT_ENV_TWO_SCALARS},
    "combine_on_rank0": {"report_average": REPORT_COMBINE_ON_RANK0},
    "every_rank_prints": {"report_average": REPORT_EVERY_RANK_PRINTS},
    "local_loss": {"report_average": REPORT_LOCAL},
    "prints_local": {"report_average": REPORT_PRINTS_LOCAL},
    "returns_on_rank0": {"report_average": REPORT_RETURNS_ON_RANK0},
    "blank": {},
}
BEGINNER_LOST = {
    "reference": set(), "gather_object": set(), "reduce_broadcast": set(), "env_two_scalars": set(),
    "combine_on_rank0": {RETURNS, PRINTS},
    "every_rank_prints": {PRINTS},
    "local_loss": {RETURNS, PRINTS},
    "prints_local": {PRINTS},
    "returns_on_rank0": {RETURNS},
    "blank": {RETURNS, PRINTS},
}
BEGINNER_FEEDBACK = {
    ("combine_on_rank0", RETURNS): "Rank 0 was stuck at `dist.all_reduce(t)`",
    ("combine_on_rank0", PRINTS): "Not run again",
    ("every_rank_prints", PRINTS): "Workers 1 and 2 printed too",
    ("local_loss", RETURNS): "Each worker returned its own loss",
    ("local_loss", PRINTS): "its own loss",
    ("prints_local", PRINTS): "Worker 0 printed `average loss: 0.5900`: its own loss",
    ("returns_on_rank0", RETURNS): "returned None on workers 1 and 2",
    ("blank", RETURNS): "is not written yet",
}

# ----------------------------------------------------------------------------- developer

CONSOLE, TWICE = "test_setup_logging_console_and_files", "test_setup_logging_twice"
RUNS, NAME = "test_rank_zero_only_runs_on_rank_0", "test_rank_zero_only_keeps_name_and_doc"
BEFORE, EACH_CALL = "test_rank_zero_only_before_init", "test_rank_zero_only_decides_at_each_call"
SETUP = ("import logging\nimport sys\n\ndef setup_logging(rank, log_dir):\n"
         "    \"\"\"The train logger of this rank.\"\"\"\n")
RZO = "import functools\n\ndef rank_zero_only(fn):\n    \"\"\"Run fn on rank 0 only.\"\"\"\n"


def _setup(body: str, handlers: str = "", fmt: str = "f\"rank {rank} %(levelname)s %(message)s\"") -> str:
    """A setup_logging answer: ``handlers`` builds the list ``hs``; ``body`` runs first."""
    return SETUP + body + f"""\
    logger = logging.getLogger("train")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    hs = [logging.FileHandler(os.path.join(log_dir, f"rank{{rank}}.log"))]
{handlers}\
    for h in hs:
        h.setFormatter(logging.Formatter({fmt}))
        logger.addHandler(h)
    return logger
"""


CONSOLE_ON_RANK0 = """\
    if rank == 0:
        hs.append(logging.StreamHandler(sys.stdout))
        hs[-1].setLevel(logging.INFO)
"""
FRESH = """\
    os.makedirs(log_dir, exist_ok=True)
    for old in list(logging.getLogger("train").handlers):
        logging.getLogger("train").removeHandler(old)
        old.close()
"""

SETUP_FILTER_RETURN_EARLY = SETUP + """\
    class StampRank(logging.Filter):
        def filter(self, record):
            record.rank = rank
            return True

    logger = logging.getLogger("train")
    if logger.handlers:              # set up already: leave it as it is
        return logger
    os.makedirs(log_dir, exist_ok=True)
    logger.setLevel("DEBUG")
    logger.propagate = False
    to_file = logging.FileHandler(f"{log_dir}/rank{rank}.log", mode="a")
    to_file.addFilter(StampRank())
    to_file.setFormatter(logging.Formatter("[rank %(rank)s] %(name)s %(levelname)s: %(message)s"))
    logger.addHandler(to_file)
    if rank == 0:
        console = logging.StreamHandler(stream=sys.stdout)
        console.setLevel("INFO")
        console.addFilter(StampRank())
        console.setFormatter(logging.Formatter("[rank %(rank)s] %(message)s"))
        logger.addHandler(console)
    return logger
"""

SETUP_EVERY_RANK_CONSOLE = _setup(FRESH, """\
    hs.append(logging.StreamHandler(sys.stdout))
    hs[-1].setLevel(logging.INFO)
""")
SETUP_NO_RANK = _setup(FRESH, CONSOLE_ON_RANK0, fmt="\"%(levelname)s %(message)s\"")
SETUP_TWICE = _setup("    os.makedirs(log_dir, exist_ok=True)\n", CONSOLE_ON_RANK0)
SETUP_DEBUG_ON_CONSOLE = _setup(FRESH, """\
    if rank == 0:
        hs.append(logging.StreamHandler(sys.stdout))
""")
SETUP_BASIC_CONFIG = SETUP + """\
    os.makedirs(log_dir, exist_ok=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format=f"rank {rank} %(message)s")
    logger = logging.getLogger("train")
    logger.handlers.clear()
    logger.setLevel(logging.DEBUG)
    to_file = logging.FileHandler(os.path.join(log_dir, f"rank{rank}.log"))
    to_file.setFormatter(logging.Formatter(f"rank {rank} %(message)s"))
    logger.addHandler(to_file)
    return logger
"""

RZO_ENV_ONLY = "import os\n\n" + RZO + """\
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if os.environ.get("RANK", "0") == "0":
            return fn(*args, **kwargs)
        return None
    return wrapper
"""

# a class whose instance wraps the function
RZO_CLASS = "import functools\nimport os\n\nclass OnRankZero:\n" + """\
    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self.fn = fn

    def __call__(self, *args, **kwargs):
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
        return self.fn(*args, **kwargs) if rank == 0 else None

""" + RZO + "    return OnRankZero(fn)\n"

RZO_AT_DECORATION = RZO + """\
    rank = int(os.environ.get("RANK", 0))

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if rank == 0:
            return fn(*args, **kwargs)
    return wrapper
"""

RZO_DIST_ONLY = RZO + """\
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if dist.get_rank() == 0:
            return fn(*args, **kwargs)
    return wrapper
"""

RZO_NO_WRAPS = RZO + """\
    def wrapper(*args, **kwargs):
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
        if rank == 0:
            return fn(*args, **kwargs)
    return wrapper
"""

RZO_RUNS_EVERYWHERE = RZO + """\
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        value = fn(*args, **kwargs)
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
        return value if rank == 0 else None
    return wrapper
"""

RZO_NEEDS_RANK = RZO + """\
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if int(os.environ["RANK"]) == 0:
            return fn(*args, **kwargs)
    return wrapper
"""

# What the logging lesson's practitioners write, which the grader once refused to run: a module-level
# logging.Filter subclass, top-level code, a computed default value, a decorator applied at the top level
SETUP_MODULE_FILTER = """\
import logging
import sys


class _Rank(logging.Filter):
    \"\"\"Stamps each record with the rank of the process that logs it.\"\"\"

    def filter(self, record):
        record.rank = int(os.environ.get("RANK", 0))
        return True


FORMAT = "[rank %(rank)s] " + "%(levelname)s %(message)s"
print("setup_logging defined")


def setup_logging(rank, log_dir, fmt=logging.Formatter(FORMAT)._fmt):
    \"\"\"The train logger of this rank.\"\"\"
    os.makedirs(log_dir, exist_ok=True)
    logger = logging.getLogger("train")
    for old in list(logger.handlers):
        logger.removeHandler(old)
        old.close()
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    handlers = [logging.FileHandler(os.path.join(log_dir, f"rank{rank}.log"))]
    if rank == 0:
        handlers.append(logging.StreamHandler(sys.stdout))
        handlers[-1].setLevel(logging.INFO)
    for h in handlers:
        h.addFilter(_Rank())
        h.setFormatter(logging.Formatter(fmt.replace("%(rank)s", str(rank))))
        logger.addHandler(h)
    return logger
"""

RZO_TOP_LEVEL_DECORATOR = """\
import functools


def _traced(f):
    return functools.wraps(f)(lambda *a, **k: f(*a, **k))


@_traced
def rank_zero_only(fn):
    \"\"\"Run fn on rank 0 only.\"\"\"
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
        return fn(*args, **kwargs) if rank == 0 else None
    return wrapper
"""

DEVELOPER = {
    "reference": {"setup_logging": None, "rank_zero_only": None},
    "filter_return_early_env_only": {"setup_logging": SETUP_FILTER_RETURN_EARLY, "rank_zero_only": RZO_ENV_ONLY},
    "every_rank_console_class": {"setup_logging": SETUP_EVERY_RANK_CONSOLE, "rank_zero_only": RZO_CLASS},
    "no_rank_at_decoration": {"setup_logging": SETUP_NO_RANK, "rank_zero_only": RZO_AT_DECORATION},
    "twice_dist_only": {"setup_logging": SETUP_TWICE, "rank_zero_only": RZO_DIST_ONLY},
    "debug_console_no_wraps": {"setup_logging": SETUP_DEBUG_ON_CONSOLE, "rank_zero_only": RZO_NO_WRAPS},
    "basic_config_runs_everywhere": {"setup_logging": SETUP_BASIC_CONFIG, "rank_zero_only": RZO_RUNS_EVERYWHERE},
    "needs_rank": {"rank_zero_only": RZO_NEEDS_RANK},
    "module_level_code": {"setup_logging": SETUP_MODULE_FILTER, "rank_zero_only": RZO_TOP_LEVEL_DECORATOR},
    "blank": {},
}
DEVELOPER_LOST = {
    "reference": set(),
    "module_level_code": set(),
    "filter_return_early_env_only": set(),
    "every_rank_console_class": {CONSOLE},
    "no_rank_at_decoration": {CONSOLE, RUNS, BEFORE, EACH_CALL},
    "twice_dist_only": {TWICE, BEFORE},
    "debug_console_no_wraps": {CONSOLE, NAME},
    "basic_config_runs_everywhere": {CONSOLE, TWICE, RUNS, BEFORE, EACH_CALL},
    "needs_rank": {CONSOLE, TWICE, BEFORE},
    "blank": {CONSOLE, TWICE, RUNS, NAME, BEFORE, EACH_CALL},
}
DEVELOPER_FEEDBACK = {
    ("every_rank_console_class", CONSOLE): "Rank 1 printed to stdout",
    ("no_rank_at_decoration", CONSOLE): "does not say `rank 0`",
    ("no_rank_at_decoration", EACH_CALL): "The wrapper decided once, when decorating",
    ("no_rank_at_decoration", RUNS): "ran on rank 1",
    ("twice_dist_only", TWICE): "Calling setup_logging() again must not add handlers",
    ("twice_dist_only", BEFORE): "Before init_process_group, dist.get_rank() raises",
    ("debug_console_no_wraps", CONSOLE): "Rank 0 printed a DEBUG record on stdout",
    ("debug_console_no_wraps", NAME): "functools.wraps",
    ("basic_config_runs_everywhere", CONSOLE): "records also went through the root logger",
    ("basic_config_runs_everywhere", RUNS): "without calling the function",
    ("needs_rank", BEFORE): "KeyError",
    ("blank", CONSOLE): "is not written yet",
    ("blank", RUNS): "is not written yet",
}

# ----------------------------------------------------------------------------- researcher

POOLED, ONE, LARGE = ("test_distributed_mean_pooled", "test_distributed_mean_one_collective",
                      "test_distributed_mean_past_2_24")
EMPTY, RESET = "test_distributed_mean_no_samples", "test_distributed_mean_reset"
MEAN_TESTS = {POOLED, ONE, LARGE, EMPTY, RESET}


def _mean(init: str, update: str, compute: str, reset: str | None = None) -> str:
    return ("class DistributedMean:\n    \"\"\"A running mean over every rank's samples.\"\"\"\n\n"
            f"    def __init__(self):\n{init}\n"
            f"    def update(self, batch_mean, n):\n{update}\n"
            f"    def compute(self):\n{compute}\n"
            f"    def reset(self):\n{reset or init}")


PY_STATE = "        self.total, self.count = 0.0, 0\n"
PY_UPDATE = "        self.total += batch_mean * n\n        self.count += n\n"
REDUCE_COPY = """\
        t = torch.tensor([self.total, self.count], dtype=torch.float64)
        dist.all_reduce(t)
        if t[1] == 0:
            raise ValueError("no samples on any rank")
        return (t[0] / t[1]).item()
"""

MEAN_TENSOR_STATE = _mean("        self.state = torch.zeros(2, dtype=torch.float64)\n",
                          "        self.state += torch.tensor([batch_mean * n, n], dtype=torch.float64)\n",
                          """\
        totals = self.state.clone()
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        total, count = totals.tolist()
        if count == 0:
            raise ValueError("nothing to average")
        return total / count
""", "        self.state.zero_()\n")
MEAN_INT64_COUNT = _mean("        self.sums = torch.zeros(1, dtype=torch.float64)\n"
                         "        self.counts = torch.zeros(1, dtype=torch.int64)\n",
                         "        self.sums += float(batch_mean) * n\n        self.counts += n\n",
                         """\
        both = torch.cat([self.sums, self.counts.double()])
        dist.all_reduce(both)
        if both[1].item() <= 0:
            raise ValueError("no rank has seen a sample")
        return float(both[0] / both[1])
""", "        self.sums.zero_()\n        self.counts.zero_()\n")
MEAN_FLOAT32 = _mean("        self.state = torch.zeros(2)\n",
                     "        self.state += torch.tensor([batch_mean * n, n])\n",
                     """\
        t = self.state.clone()
        dist.all_reduce(t)
        if t[1] == 0:
            raise ValueError("empty")
        return (t[0] / t[1]).item()
""", "        self.state.zero_()\n")
MEAN_IN_PLACE = _mean("        self.state = torch.zeros(2, dtype=torch.float64)\n",
                      "        self.state += torch.tensor([batch_mean * n, n], dtype=torch.float64)\n",
                      """\
        dist.all_reduce(self.state)
        if self.state[1] == 0:
            raise ValueError("empty")
        return (self.state[0] / self.state[1]).item()
""", "        self.state.zero_()\n")
MEAN_GATHER_OBJECT = _mean(PY_STATE, PY_UPDATE, """\
        pairs = [None] * dist.get_world_size()
        dist.all_gather_object(pairs, (self.total, self.count))
        count = sum(c for _, c in pairs)
        if count == 0:
            raise ValueError("empty")
        return sum(t for t, _ in pairs) / count
""")
MEAN_OF_BATCH_MEANS = _mean(PY_STATE, "        self.total += batch_mean\n        self.count += 1\n", REDUCE_COPY)
MEAN_LOCAL_EMPTY_RAISES = _mean(PY_STATE, PY_UPDATE, """\
        if self.count == 0:
            raise ValueError("this rank has no samples")
""" + REDUCE_COPY)
MEAN_NAN_WHEN_EMPTY = _mean(PY_STATE, PY_UPDATE, """\
        t = torch.tensor([self.total, self.count], dtype=torch.float64)
        dist.all_reduce(t)
        return (t[0] / t[1]).item()
""")
MEAN_LOCAL_ONLY = _mean(PY_STATE, PY_UPDATE, """\
        if self.count == 0:
            raise ValueError("empty")
        return self.total / self.count
""")

RESEARCHER = {
    "reference": {"distributed_mean": None},
    "tensor_state": {"distributed_mean": MEAN_TENSOR_STATE},
    "int64_count": {"distributed_mean": MEAN_INT64_COUNT},
    "float32": {"distributed_mean": MEAN_FLOAT32},
    "in_place": {"distributed_mean": MEAN_IN_PLACE},
    "gather_object": {"distributed_mean": MEAN_GATHER_OBJECT},
    "mean_of_batch_means": {"distributed_mean": MEAN_OF_BATCH_MEANS},
    "local_empty_raises": {"distributed_mean": MEAN_LOCAL_EMPTY_RAISES},
    "nan_when_empty": {"distributed_mean": MEAN_NAN_WHEN_EMPTY},
    "local_only": {"distributed_mean": MEAN_LOCAL_ONLY},
    "blank": {},
}
RESEARCHER_LOST = {
    "reference": set(), "tensor_state": set(), "int64_count": set(),
    "float32": {LARGE},
    "in_place": {ONE},
    "gather_object": {ONE},
    "mean_of_batch_means": {POOLED, ONE, LARGE, RESET},
    "local_empty_raises": MEAN_TESTS,
    "nan_when_empty": {EMPTY},
    "local_only": MEAN_TESTS - {EMPTY},
    "blank": MEAN_TESTS,
}
RESEARCHER_FEEDBACK = {
    ("float32", LARGE): "float32 stops counting single samples",
    ("in_place", ONE): "all_reduce a copy",
    ("gather_object", ONE): "all_gather_object runs two collectives",
    ("mean_of_batch_means", POOLED): "the plain mean of the batch means",
    ("local_empty_raises", POOLED): "a rank with no sample of its own too",
    ("local_empty_raises", RESET): "Not run again",
    ("nan_when_empty", EMPTY): "Raise ValueError, on every rank",
    ("local_only", POOLED): "That is this rank's own mean",
    ("local_only", ONE): "ran 0 collectives",
    ("blank", POOLED): "DistributedMean is not written yet",
}

SUITES = {
    "beginner": (BEGINNER, BEGINNER_LOST, BEGINNER_FEEDBACK, {RETURNS: 1, PRINTS: 2}),
    "developer": (DEVELOPER, DEVELOPER_LOST, DEVELOPER_FEEDBACK,
                  {CONSOLE: 2, TWICE: 1, RUNS: 1, NAME: 1, BEFORE: 1, EACH_CALL: 1}),
    "researcher": (RESEARCHER, RESEARCHER_LOST, RESEARCHER_FEEDBACK,
                   {POOLED: 2, ONE: 1, LARGE: 1, EMPTY: 1, RESET: 1}),
}


def submissions(depth: str) -> dict:
    """Each student's answers: the logging exercises only (None: that answer's reference)."""
    reference = reference_answers(NOTEBOOKS[depth])
    return {student: {gid: reference[gid] if src is None else src for gid, src in answers.items()}
            for student, answers in SUITES[depth][0].items()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Each depth's shared autograde run (tests/grading_runs.py), graded the first time it is asked."""
    return lambda depth: SuiteView("tests.test_logging_exercises_grading", depth, tmp_path_factory)


CASES = [(depth, student) for depth, suite in SUITES.items() for student in suite[0]]
FEEDBACK = [(depth, student, gid) for depth, suite in SUITES.items() for student, gid in suite[2]]


@pytest.mark.grading
@pytest.mark.parametrize("depth", list(SUITES))
def test_the_logging_exercises_have_their_tests_and_points(graded, depth):
    points = SUITES[depth][3]
    assert {g: graded(depth).max_scores.get(g) for g in points} == points


@pytest.mark.grading
@pytest.mark.parametrize("depth,student", CASES, ids=[f"{d}-{s}" for d, s in CASES])
def test_each_answer_loses_exactly_the_right_points(graded, depth, student):
    result, mine = graded(depth), set(SUITES[depth][3])
    lost = result.lost(student) & mine
    assert lost == SUITES[depth][1][student], (student, result.shown(student, lost ^ SUITES[depth][1][student]))
    assert all(result.scores[student][g] == 0 for g in lost)  # a failed test scores nothing


@pytest.mark.grading
@pytest.mark.parametrize("depth,student,grade_id", FEEDBACK, ids=[f"{d}-{s}-{g}" for d, s, g in FEEDBACK])
def test_feedback_names_the_mistake(graded, depth, student, grade_id):
    result = graded(depth)
    text = result.shown(student, [grade_id], limit=None)[grade_id]
    assert SUITES[depth][2][student, grade_id] in text, text[-1500:]


@pytest.mark.grading
@pytest.mark.parametrize("depth", list(SUITES))
def test_the_shared_runs_first_submission_scores_full_marks_on_every_test(graded, depth):
    """Every depth's shared run starts with a submission of every reference answer (each suite's
    first student): it earns every point of the notebook, the tests of every suite together."""
    run = graded(depth).run
    first = next(iter(run.scores))
    assert run.lost(first) == set(), run.shown(first, run.lost(first))
    assert run.total(first) == sum(run.max_scores.values()) > 0
