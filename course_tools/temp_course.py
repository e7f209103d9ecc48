"""A temporary nbgrader course: the engine of ``make check`` and of the grading tests.

A temporary course holds ``solutions/<depth>/`` (the instructor notebooks, so locked test
cells are restored from them and hidden tests run) and the course's ``nbgrader_config.py``;
``nbgrader generate_assignment`` registers the assignment, submissions go in
``submitted/<student>/<depth>/``, and :func:`read_scores` reads the gradebook.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from course_tools import ROOT, is_answer_cell, nbgrader

__all__ = ["make_course", "has_hidden_tests", "read_scores", "Graded", "cell_output", "exercise_of",
           "reference_answers", "with_body", "fill", "submit"]

_SOLUTION = re.compile(r"^([ \t]*)### BEGIN SOLUTION\n(.*?)^[ \t]*### END SOLUTION\n?", re.S | re.M)


def has_hidden_tests(depth: str, root: Path = ROOT) -> bool:
    """Whether the instructor's notebooks of ``depth`` are here (a learner's copy has none)."""
    return (root / "solutions" / depth).is_dir()


def make_course(tmp: Path, depths: list[str], root: Path = ROOT) -> Path:
    """A course in ``tmp/course`` with these depths' instructor notebooks, assignments generated.

    In a learner's copy (no ``solutions/``) the released notebooks stand in for them: the
    visible tests are the same, and there are no hidden ones."""
    course = Path(tmp) / "course"
    (course / "solutions").mkdir(parents=True)
    for depth in depths:
        source = root / ("solutions" if has_hidden_tests(depth, root) else "notebooks") / depth
        shutil.copytree(source, course / "solutions" / depth,
                        ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    shutil.copy(root / "nbgrader_config.py", course / "nbgrader_config.py")
    for depth in depths:
        nbgrader("generate_assignment", depth, "--force", cwd=course)
    return course


@dataclass
class Graded:
    scores: dict[str, dict[str, float]]  # student -> grade_id -> score
    max_scores: dict[str, float]  # grade_id -> points
    seconds: float
    course: Path
    notebook_of: dict[str, str] = field(default_factory=dict)  # grade_id -> notebook name
    depth: str = ""

    def total(self, student: str) -> float:
        return sum(self.scores[student].values())

    def lost(self, student: str) -> set[str]:
        """grade_ids where this student scored below the maximum."""
        return {g for g, s in self.scores[student].items() if s < self.max_scores[g]}

    def notebook(self, student: str, name: str) -> Path:
        """The student's autograded copy of notebook ``name`` (without .ipynb)."""
        return self.course / "autograded" / student / self.depth / f"{name}.ipynb"

    def shown(self, student: str, grade_ids, limit: int | None = 1200) -> dict[str, str]:
        """What each of these graded cells showed in the student's autograded notebook (what it
        printed and raised), its last ``limit`` characters (``None``: all): why a point was lost
        or kept. A cell that cannot be read says why instead (a failing test's message must not
        fail in its turn)."""
        shown = {}
        for g in sorted(grade_ids):
            try:
                shown[g] = cell_output(self.notebook(student, self.notebook_of[g]), g)[-(limit or 0):]
            except (KeyError, OSError) as e:
                shown[g] = f"(nothing to show: {type(e).__name__}: {e})"
        return shown


def cell_output(nb_path: Path, grade_id: str) -> str:
    """Everything a graded notebook's cell printed or raised (text, error values, tracebacks)."""
    import nbformat

    nb = nbformat.read(nb_path, as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            parts = []
            for out in cell.get("outputs", []):
                parts.append(out.get("text", ""))
                parts.append(out.get("evalue", ""))
                parts.extend(out.get("traceback", []))
            return "\n".join(parts)
    raise KeyError(grade_id)


def read_scores(course: Path, depth: str, notebooks: list[str] | str, students: list[str],
                seconds: float = 0.0) -> Graded:
    """Scores of every graded cell of these notebooks (names without .ipynb) per student."""
    from nbgrader.api import Gradebook, MissingEntry

    if isinstance(notebooks, str):
        notebooks = [notebooks]
    scores, max_scores, notebook_of = {}, {}, {}
    with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
        for student in students:
            scores[student] = {}
            for nb in notebooks:
                try:
                    sub = gb.find_submission_notebook(nb, depth, student)
                except MissingEntry:
                    continue
                for g in sub.grades:
                    scores[student][g.name] = float(g.score)
                    max_scores[g.name] = float(g.max_score)
                    notebook_of[g.name] = nb
    return Graded(scores, max_scores, seconds, course, notebook_of, depth)


def exercise_of(test_id: str, answer_ids: list[str]) -> str:
    """The exercise a test cell checks: the longest answer grade_id its own grade_id contains."""
    hits = [a for a in answer_ids if a in test_id]
    return max(hits, key=len) if hits else test_id


# ----------------------------------------------------------------------------- submissions


def with_body(source: str, body: str | None = None) -> str:
    """An instructor answer cell as a learner would submit it: the solution region replaced by
    ``body`` (indented like the region; ``None`` keeps the reference solution), the def line
    and docstring around it kept."""
    m = _SOLUTION.search(source)
    if m is None:
        return source
    if body is None:
        body = m.group(2)
    else:
        body = "".join(m.group(1) + line + "\n" if line.strip() else "\n" for line in body.splitlines())
    return source[: m.start()] + body + source[m.end():]


def reference_answers(source: Path, body: str | None = None) -> dict[str, str]:
    """grade_id -> every answer cell of an instructor notebook as submitted: its reference
    solution, or ``body`` in place of each solution region."""
    import nbformat

    nb = nbformat.read(source, as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: with_body(c.source, body).rstrip("\n")
            for c in nb.cells if c.cell_type == "code" and is_answer_cell(c)}


def fill(released: Path, answers: dict[str, str]):
    """The released notebook with these answer cells written in (others keep their stub)."""
    import nbformat

    nb = nbformat.read(released, as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if is_answer_cell(cell) and gid in answers:
            cell.source = answers[gid]
    return nb


def submit(course: Path, student: str, depth: str, name: str, answers: dict[str, str]) -> Path:
    """Write ``student``'s submission of ``depth/name`` (the released notebook, these answers)."""
    import nbformat

    dest = course / "submitted" / student / depth
    dest.mkdir(parents=True, exist_ok=True)
    nbformat.write(fill(course / "notebooks" / depth / name, answers), dest / name)
    return dest / name
