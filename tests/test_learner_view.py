"""What a learner reads: every learner notebook (notebooks/, discovered, new lessons included).

- every code cell fits on a screen: at most 12 lines (lesson cells and exercise test cells alike);
- no sentence about the computer the course was written on, its CI, or a document learners do not
  have (the course's source lesson), and no CI plumbing in sight;
- every lesson (a notebook without graded cells) asks before it shows: a prediction in each numbered
  section that runs ranks (an environment check or a text-only section needs none), and ends with 3 to 5 review questions whose answers are collapsed;
- the settings cell holds plain settings; the run sizes come from ``helpers.lessons.interact.quick``;
- a lesson's code reads plainly: no `if QUICK:` override, no statements joined with `;`, no
  subscript chained four deep (`timings[0][0][1][1]`), no cell that is only `confirm(...)` calls.

The widgets themselves (a pick shows the feedback) and the collapsed answers in a real browser are
checked by tests/test_browser.py.
"""

from __future__ import annotations

import ast
import re

import nbformat
import pytest

from course_tools import has_graded_cells
from tests.conftest import RELEASED, rel

MAX_LINES = 12

# No exceptions: every code cell a learner meets, graded test cells included, fits on a screen.

# Phrases a learner must not meet: the computer the notebooks were developed on, the course's
# CI, and the source document learners do not have.
FORBIDDEN = [
    (re.compile(r"\bthis (?:\d+-core )?machine\b", re.I), "talks about the author's computer"),
    (re.compile(r"\bbusy machine\b|\bCI machine\b|\bcourse's machines?\b", re.I), "talks about the author's computer"),
    (re.compile(r"\bcourse's (?:own )?tests\b", re.I), "talks about the course's own test machinery"),
    (re.compile(r"\b\d+[- ]cores?\b", re.I), "talks about the author's computer"),
    (re.compile(r"\bseen (?:here|on this)\b", re.I), "an observation from the author's computer"),
    (re.compile(r"\breference lesson\b", re.I), "names a document learners do not have"),
    (re.compile(r"\bCI\b|\bused by CI\b|\btest suite\b|\bautomatic tests?\b", re.I),
     "talks about the course's own test machinery"),
    (re.compile(r"NBGRADER_EXECUTION|COURSE_QUICK"), "CI plumbing in a learner's cell"),
    (re.compile(r"\blive_ranks\b"), "a process check the test suite already makes"),
]


def _cells(path):
    return nbformat.read(path, as_version=4).cells


def _lines(source: str) -> int:
    return len(source.rstrip().splitlines())


LESSONS = [p for p in RELEASED if not has_graded_cells(nbformat.read(p, as_version=4))]


@pytest.mark.parametrize("path", RELEASED, ids=rel)
def test_code_cells_fit_on_a_screen(path):
    long = []
    for i, cell in enumerate(_cells(path)):
        if cell.cell_type != "code" or _lines(cell.source) <= MAX_LINES:
            continue
        first = cell.source.strip().splitlines()[0]
        long.append(f"cell {i} ({_lines(cell.source)} lines): {first[:60]}")
    assert not long, (f"{rel(path)}: code cells over {MAX_LINES} lines (split them, or move plumbing "
                      "into a helper):\n  " + "\n  ".join(long))


@pytest.mark.parametrize("path", RELEASED, ids=rel)
def test_no_machine_ci_or_source_lesson_talk(path):
    found = []
    for i, cell in enumerate(_cells(path)):
        for pattern, why in FORBIDDEN:
            for m in pattern.finditer(cell.source):
                found.append(f"cell {i}: {m.group(0)!r} ({why})")
    assert not found, f"{rel(path)}:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("path", LESSONS, ids=rel)
def test_settings_are_plain_and_sizes_come_from_quick(path):
    cells = _cells(path)
    params = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, f"{rel(path)}: one cell tagged `parameters`, found {len(params)}"
    code = params[0].source
    statements = [l for l in code.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    plain = re.compile(r"^[A-Z][A-Z0-9_]*(, [A-Z][A-Z0-9_]*)* = [^=()]+?(#.*)?$")
    fancy = [l for l in statements if not plain.match(l) and not l.startswith(" ")]
    assert not fancy, f"{rel(path)}: the parameters cell holds plain settings only: {fancy}"
    assert any("QUICK = quick(QUICK)" in c.source for c in cells if c.cell_type == "code"), \
        f"{rel(path)}: the setup cell should say QUICK = quick(QUICK)"


def _sections(cells) -> list[tuple[str, list]]:
    """Numbered sections ("## 1. ...") with their cells, up to the review."""
    sections, current = [], None
    for cell in cells:
        head = re.search(r"^## (\d+\.\s.*)$", cell.source, re.M) if cell.cell_type == "markdown" else None
        if cell.cell_type == "markdown" and re.search(r"^## (Review|Summary|Appendix)", cell.source, re.M):
            current = None
        if head:
            current = (head.group(1), [])
            sections.append(current)
        if current is not None:
            current[1].append(cell)
    return sections


@pytest.mark.parametrize("path", LESSONS, ids=rel)
def test_every_section_asks_for_a_prediction(path):
    sections = _sections(_cells(path))
    assert sections, f"{rel(path)}: no numbered sections (## 1. ...)"
    demos = [(title, cells) for title, cells in sections  # a section that runs ranks shows something
             if any(c.cell_type == "code" and re.search(r"\brun\(", c.source) for c in cells)]
    silent = [title for title, cells in demos
              if not any(c.cell_type == "code" and "predict(" in c.source for c in cells)]
    assert not silent, f"{rel(path)}: sections without a prediction: {silent}"


@pytest.mark.parametrize("path", LESSONS, ids=rel)
def test_lesson_ends_with_review_questions_answers_collapsed(path):
    cells = _cells(path)
    review = [i for i, c in enumerate(cells) if c.cell_type == "markdown"
              and re.search(r"^## Review\b", c.source, re.M)]
    assert review, f"{rel(path)}: no '## Review' section"
    text = cells[review[-1]].source.split("## Review", 1)[1].split("\n## ", 1)[0]
    questions = re.findall(r"<details>\s*<summary>", text)
    assert 3 <= len(questions) <= 5, f"{rel(path)}: {len(questions)} review questions, want 3 to 5"
    assert "<details open" not in text, f"{rel(path)}: a review answer is open from the start"
    later = cells[review[-1] + 1:]
    assert not any(c.cell_type == "code" or re.search(r"^## ", c.source, re.M) for c in later), \
        f"{rel(path)}: the lesson must end on its review; move what follows it (an appendix, a demo) before it"


def _plainness_problems(source: str) -> list[str]:
    """What makes a lesson's code cell hard to read (see the module docstring); IPython magics skipped."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    tree = ast.parse(code)
    found = [f"line {n.lineno}: `if QUICK:` (choose the sizes in the setup cell: `X = a if QUICK else X`)"
             for n in ast.walk(tree) if isinstance(n, ast.If) and "QUICK" in ast.unparse(n.test)]
    lines = code.splitlines()
    starts = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.stmt):
            starts.setdefault(n.lineno, []).append(n)
    found += [f"line {ln}: statements joined with ';': {lines[ln - 1].strip()[:60]}"
              for ln, nodes in starts.items() if len({id(x) for x in nodes}) > 1 and ";" in lines[ln - 1]
              and not any(isinstance(x, (ast.If, ast.For, ast.While, ast.With, ast.FunctionDef)) for x in nodes)]
    for n in ast.walk(tree):
        depth, inner = 0, n
        while isinstance(inner, ast.Subscript):
            depth, inner = depth + 1, inner.value
        if depth >= 4:
            found.append(f"line {n.lineno}: {ast.unparse(n)} (name the parts)")
    if tree.body and all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                         and getattr(s.value.func, "id", "") == "confirm" for s in tree.body):
        found.append("only confirm(...) calls (put them in the cell whose result they check)")
    return found


def test_plainness_rules_catch_what_they_say():
    assert _plainness_problems("if QUICK:\n    N = 2")
    assert _plainness_problems("a = 1; b = 2")
    assert _plainness_problems("v = t[0][0][1][1]")
    assert _plainness_problems("confirm(x, 'y')\nconfirm(z, 'w')")
    assert not _plainness_problems("N = 2 if QUICK else N\nv = t[0][1][2]\nprint(v)\nconfirm(v, 'v')\n"
                                   "s = 'a; b'\nax.legend();")


@pytest.mark.parametrize("path", LESSONS, ids=rel)
def test_lesson_code_reads_plainly(path):
    found = [f"cell {i}: {problem}" for i, cell in enumerate(_cells(path)) if cell.cell_type == "code"
             for problem in _plainness_problems(cell.source)]
    assert not found, f"{rel(path)}:\n  " + "\n  ".join(found)
