"""The class at a glance, read from the gradebook and the autograded notebooks.

``python -m course_tools.grade ASSIGNMENT --report`` prints it and saves its plots;
``instructor/class_report.ipynb`` shows the same in a notebook. Per exercise: the share of the
class that passed each test, the most common failure messages (grouped, numbers folded), and the
linter's codes found in the feedback of failing tests; then the distribution of the scores.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Outcome", "ClassReport", "collect", "load", "lost", "text", "plot"]

_CODE = re.compile(r"\bORK\d{3}\b")
_NUMBER = re.compile(r"\d+(\.\d+)?")


@dataclass
class Outcome:
    student: str
    notebook: str
    test: str
    exercise: str
    score: float
    max_score: float
    message: str = ""  # the first line of the error it raised, numbers folded to N
    codes: tuple = ()  # the linter's codes in its feedback

    @property
    def passed(self) -> bool:
        return self.score >= self.max_score


@dataclass
class ClassReport:
    assignment: str
    outcomes: list[Outcome] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)  # student -> score after penalties
    penalties: dict[str, float] = field(default_factory=dict)  # student -> late penalty
    max_total: float = 0.0

    def tests(self) -> dict[tuple[str, str], list[Outcome]]:
        """(exercise, test) -> every student's outcome, in the notebook's order."""
        out: dict = {}
        for o in self.outcomes:
            out.setdefault((o.exercise, o.test), []).append(o)
        return out


def _message(cell) -> str:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            value = (out.get("evalue") or "").strip().splitlines()
            line = f"{out.get('ename', 'Error')}: {value[0] if value else ''}".strip()
            return _NUMBER.sub("N", line)[:160]
    return ""


def _codes(cell) -> tuple:
    found = set()
    for out in cell.get("outputs", []):
        found.update(_CODE.findall(out.get("text", "") if out.get("output_type") == "stream" else ""))
    return tuple(sorted(found))


def _cell_order(course: Path, assignment: str, notebook: str) -> dict[str, int]:
    """grade_id -> position, from the first autograded copy of the notebook found."""
    import nbformat

    for path in sorted(course.glob(f"autograded/*/{assignment}/{notebook}.ipynb")):
        nb = nbformat.read(path, as_version=4)
        return {c.metadata.get("nbgrader", {}).get("grade_id"): i for i, c in enumerate(nb.cells)}
    return {}


def collect(course: Path, assignment: str, db_url: str | None = None) -> ClassReport:
    """Every graded test of every submission of ``assignment``: scores from the gradebook,
    failure messages and linter codes from the autograded notebooks."""
    import nbformat
    from nbgrader.api import Gradebook

    from course_tools.temp_course import exercise_of

    course = Path(course)
    report = ClassReport(assignment)
    with Gradebook(db_url or f"sqlite:///{course}/gradebook.db") as gb:
        definition = gb.find_assignment(assignment)
        report.max_total = definition.max_score
        order, exercise = {}, {}
        for nb in definition.notebooks:
            answers = [c.name for c in nb.solution_cells]
            cells = _cell_order(course, assignment, nb.name)
            for g in sorted(nb.grade_cells, key=lambda c: (cells.get(c.name, len(cells)), c.name)):
                order[nb.name, g.name] = len(order)
                exercise[nb.name, g.name] = exercise_of(g.name, answers)
        for sub in gb.assignment_submissions(assignment):
            student = sub.student.id
            report.penalties[student] = float(sub.late_submission_penalty or 0)
            report.totals[student] = float(sub.score) - report.penalties[student]
            for nb in sub.notebooks:
                path = course / "autograded" / student / assignment / f"{nb.name}.ipynb"
                cells = {}
                if path.exists():
                    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c
                             for c in nbformat.read(path, as_version=4).cells}
                for grade in nb.grades:
                    o = Outcome(student, nb.name, grade.name, exercise[nb.name, grade.name],
                                float(grade.score), float(grade.max_score))
                    if not o.passed:
                        cell = cells.get(grade.name)
                        o.message = _message(cell) if cell is not None else "not graded (no autograded notebook)"
                        o.codes = _codes(cell) if cell is not None else ()
                    report.outcomes.append(o)
    report.outcomes.sort(key=lambda o: (order[o.notebook, o.test], o.student))
    return report


def load(course, assignment: str) -> ClassReport:
    """:func:`collect` from the gradebook the course's ``nbgrader_config.py`` names."""
    course = Path(course).resolve()
    return collect(course, assignment, _db_url(course))


def _db_url(course: Path) -> str:
    from traitlets.config import Config

    c = Config()
    path = course / "nbgrader_config.py"
    if path.exists():
        exec(compile(path.read_text(), str(path), "exec"), {"get_config": lambda: c, "__file__": str(path)})
    return c.CourseDirectory.get("db_url") or f"sqlite:///{course}/gradebook.db"


def lost(report: ClassReport) -> dict[str, list[str]]:
    """student -> the tests they did not pass, in the notebook's order (and a late penalty)."""
    out: dict[str, list[str]] = {s: [] for s in sorted(report.totals)}
    for o in report.outcomes:
        if not o.passed:
            out[o.student].append(o.test)
    for student, penalty in report.penalties.items():
        if penalty:
            out[student].append(f"late (penalty {penalty:g})")
    return out


def text(report: ClassReport, top: int = 3) -> str:
    lines = [f"class report: {report.assignment}, {len(report.totals)} submission(s)"]
    exercise = None
    for (ex, test), outs in report.tests().items():
        if ex != exercise:
            lines.append(f"\n{ex}")
            exercise = ex
        passed = sum(o.passed for o in outs)
        lines.append(f"  {test:<40} passed by {passed}/{len(outs)} ({100 * passed / len(outs):.0f}%)")
        failures = collections.Counter(o.message or "(no error shown)" for o in outs if not o.passed)
        for message, n in failures.most_common(top):
            lines.append(f"      {n} x {message}")
        codes = collections.Counter(c for o in outs if not o.passed for c in o.codes)
        if codes:
            lines.append("      linter: " + ", ".join(f"{c} x{n}" for c, n in codes.most_common()))
    scores = sorted(report.totals.values())
    if scores:
        mid = len(scores) // 2
        median = scores[mid] if len(scores) % 2 else (scores[mid - 1] + scores[mid]) / 2
        lines.append(f"\nscores (after late penalties) out of {report.max_total:g}: min {scores[0]:g}, "
                     f"median {median:g}, mean {sum(scores) / len(scores):.1f}, max {scores[-1]:g}")
    return "\n".join(lines)


def plot(report: ClassReport):
    """One figure: the share of the class passing each test, and the scores' distribution."""
    import matplotlib

    matplotlib.use("Agg") if matplotlib.get_backend().lower().startswith("tk") else None
    import matplotlib.pyplot as plt

    tests = report.tests()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, max(3, 0.35 * len(tests) + 1.5)),
                                      gridspec_kw={"width_ratios": [3, 2]})
    names = [t for _, t in tests]
    shares = [100 * sum(o.passed for o in outs) / len(outs) for outs in tests.values()]
    left.barh(range(len(names)), shares, color="#4c72b0")
    left.set_yticks(range(len(names)), names, fontsize=8)
    left.invert_yaxis()
    left.set_xlim(0, 100)
    left.set_xlabel("share of the class that passed (%)")
    hardest = min(zip(shares, names))[1] if names else ""
    left.set_title(f"hardest test: {hardest}" if names else "no graded test")
    top = report.max_total or 1
    bins = [b - 0.5 for b in range(int(top) + 2)] if top <= 40 else 20  # a bar per whole point
    right.hist(list(report.totals.values()), bins=bins, color="#55a868", rwidth=0.9)
    right.set_xlabel(f"score after late penalties (out of {report.max_total:g})")
    right.set_ylabel("submissions")
    right.set_title(f"{len(report.totals)} submissions of {report.assignment}")
    fig.tight_layout()
    return fig
