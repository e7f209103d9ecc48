"""What a learner reads: every learner notebook (notebooks/, discovered, new lessons included).

- every code cell fits on a screen: at most 12 lines (lesson cells and exercise test cells alike);
- no sentence about the computer the course was written on, its CI, or a document learners do not
  have (the course's source lesson), and no CI plumbing in sight;
- every lesson (a notebook without graded cells) asks before it shows: in each numbered section, and in each
  part of one under its own heading, the first cell that runs ranks comes after a `predict(...)` (an environment
  check or a text-only section needs none); and it ends with 3 to 5 review questions whose answers are collapsed;
- no sentence says that a collective only some ranks reach simply hangs or waits until the timeout: it can
  also pair with the others' next collective (wrong data, no error) or fail when they exit;
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
from tests.conftest import RELEASED, ROOT, rel

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


HEADING = re.compile(r"^(#{2,3}) (.+?)\s*$", re.M)


def _parts(cells) -> list[tuple[str, list[tuple[int, object]]]]:
    """The numbered sections ("## 1. ...") up to the review, each cut into parts at its other headings
    ("### ..."): (title, [(index, cell), ...]) per part, a section's first part titled by the section.

    Every heading of a markdown cell counts, in order (one cell may close a section and open the next); the
    cell itself goes with the part its last heading opens. "## Review", "## Summary" and "## Appendix" end
    the numbered sections.
    """
    parts, section, current = [], None, None
    for i, cell in enumerate(cells):
        for level, title in (HEADING.findall(cell.source) if cell.cell_type == "markdown" else []):
            if level == "##" and re.match(r"\d+\.\s", title):
                section = title
                current = (section, [])
                parts.append(current)
            elif level == "##" and re.match(r"(Review|Summary|Appendix)\b", title):
                section = current = None
            elif section is not None:
                current = (f"{section} / {title}", [])
                parts.append(current)
        if current is not None:
            current[1].append((i, cell))
    return parts


def _sections(cells) -> list[tuple[str, list]]:
    """Numbered sections ("## 1. ...") with their cells, up to the review; every heading of a cell counts."""
    sections = {}
    for title, cells_of_part in _parts(cells):
        sections.setdefault(title.split(" / ")[0], []).extend(cell for _, cell in cells_of_part)
    return list(sections.items())


# What runs ranks: the pool (`run`), the lessons' helpers around it (`logs.run_and_capture`,
# `torchrun`), a command line that launches `torch.distributed.run`, and any function a notebook
# defines that calls one of these (found in cell order). `subprocess.run` is not the pool.
RANK_RUNNERS = {"run", "run_and_capture", "torchrun"}


def _calls(node) -> set[str]:
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            names.add(n.func.id)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr != "run":
            names.add(n.func.attr)
        elif isinstance(n, ast.Constant) and n.value == "torch.distributed.run":
            names.add("torchrun")
    return names


def _parse(source: str) -> ast.Module:
    """A code cell's source as Python, IPython magics and shell lines blanked."""
    return ast.parse("\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()))


def _cells_that_run_ranks(cells) -> set[int]:
    """Indices of the code cells whose own statements (not a function they only define) run ranks."""
    runners, found = set(RANK_RUNNERS), set()
    for i, cell in enumerate(cells):
        if cell.cell_type != "code":
            continue
        for stmt in _parse(cell.source).body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if _calls(stmt) & runners:
                    runners.add(stmt.name)
            elif _calls(stmt) & runners:
                found.add(i)
    return found


def _asks(cell) -> bool:
    return cell.cell_type == "code" and "predict" in _calls(_parse(cell.source))


def _demos_without_prediction(cells) -> list[str]:
    """Each part of a numbered section that runs ranks must ask before its first cell that does."""
    running = _cells_that_run_ranks(cells)
    late = []
    for title, part in _parts(cells):
        demos = [i for i, _ in part if i in running]
        if demos and not any(_asks(cell) for i, cell in part if i < demos[0]):
            late.append(f"{title} (cell {demos[0]})")
    return late


def test_prediction_rules_read_every_heading_and_every_runner():
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    cells = [md("## 1. One\n\ntext"), code("predict('q', {'a': '', 'b': ''}, answer='a')"), code("run(f)"),
             md("end of 1\n\n## 2. Two\n\ntext\n\n## 3. Three"), code("import subprocess\nsubprocess.run(['ls'])"),
             code("def show(n):\n    return run(f, world_size=n)"), code("button.on_click(show)"),
             md("### A part"), code("predict('q', {'a': '', 'b': ''}, answer='a')"), code("grid = show(4)"),
             md("### Another"), code("cmd = ['python', '-m', 'torch.distributed.run', 'x.py']\nsubprocess.run(cmd)"),
             md("## Summary\n\n## Review"), code("run(f)")]
    assert [title for title, _ in _sections(cells)] == ["1. One", "2. Two", "3. Three"]
    assert _cells_that_run_ranks(cells) == {2, 9, 11, 13}
    assert _demos_without_prediction(cells) == ["3. Three / Another (cell 11)"]
    cells[8:10] = [code("grid = show(4)"), code("predict('q', {'a': '', 'b': ''}, answer='a')")]  # asked too late
    assert _demos_without_prediction(cells) == ["3. Three / A part (cell 8)", "3. Three / Another (cell 11)"]


@pytest.mark.parametrize("path", LESSONS, ids=rel)
def test_every_section_asks_for_a_prediction(path):
    """Every demo that runs ranks comes after a prediction: in each numbered section, and in each part of
    one under its own heading, the first cell that runs ranks has a `predict(...)` cell before it."""
    cells = _cells(path)
    assert _sections(cells), f"{rel(path)}: no numbered sections (## 1. ...)"
    late = _demos_without_prediction(cells)
    assert not late, f"{rel(path)}: ranks run before any prediction in: {late}"


# A collective that only some ranks reach does not always hang: collectives pair by order, so it can
# pair with the others' next collective and return wrong data, or fail when they exit. A sentence that
# says a skipped collective hangs (or waits until the timeout) must say more, in the same sentence or,
# for "that is the lucky case", the next one.
SKIPPED = re.compile(r"only rank 0|rank 0 (?:alone|only)|on rank 0 only|from rank 0 alone|`if rank == 0:`|"
                     r"only some ranks|not every rank|some rank never|never (?:reach|call|come|join)|"
                     r"\bskip(?:s|ped)?\b|only worker 0|only clerk 0|ranks? (?:disagree|split)|job splits", re.I)
HANGS = re.compile(r"\bhang(?:s|ing)?\b(?! (?:limit|report))|\bhung\b|\bforever\b|"
                   r"until the (?:collective |process group's )?timeout", re.I)
QUALIFIED = re.compile(r"\bpair|\bwrong\b|garbage|lucky|at best|\bcrash|\bexits?\b|Connection closed|"
                       r"\bthe pool\b|returned|\bor fail", re.I)


def _sentences(markdown: str) -> list[str]:
    """Sentences of a markdown text; a table row, a list item or a heading is one at least."""
    found = []
    for block in re.split(r"\n\s*\n|\n(?=\s*[|#-] )|\n(?=\s*\d+\. )", markdown):
        for row in re.split(r"\n(?=\s*\|)", block):
            found += re.split(r"(?<=[.!?])(?<!\d\.)\s+(?=[A-Z`(\"*<])", re.sub(r"\s+", " ", row).strip())
    return [s for s in found if s]


def _hangs_unqualified(markdown: str) -> list[str]:
    said = _sentences(markdown)
    return [s for k, s in enumerate(said) if SKIPPED.search(s) and HANGS.search(s) and not QUALIFIED.search(s)
            and not (k + 1 < len(said) and "lucky" in said[k + 1])]


def test_the_hang_rule_catches_what_it_says():
    assert _hangs_unqualified("Inside `if rank == 0:` rank 0 waits for ranks that never call it, and the job hangs.")
    assert _hangs_unqualified("| 4 | `compute()` is a collective: calling it on rank 0 only hangs |")
    assert _hangs_unqualified("A barrier that some rank never reaches waits, silently, until the collective timeout.")
    assert not _hangs_unqualified("A rank that skips it leaves the others waiting: until the timeout if it carries on, "
                                  'or until they fail with "Connection closed by peer" if it exits.')
    assert not _hangs_unqualified("If only worker 0 calls it, the job hangs until it fails. That is the lucky case: "
                                  "the calls can also pair up.")
    assert not _hangs_unqualified("The pool catches the hang after `HANG_TIMEOUT` seconds. A rank that skipped it waits.")
    assert _sentences("| a | b |\n| c | d |\n\n## 2. Two\n\nOne. Two.") == ["| a | b |", "| c | d |", "## 2. Two",
                                                                             "One.", "Two."]


@pytest.mark.parametrize("path", LESSONS, ids=rel)
def test_a_skipped_collective_is_not_said_to_always_hang(path):
    found = [f"cell {i}: {s}" for i, cell in enumerate(_cells(path)) if cell.cell_type == "markdown"
             for s in _hangs_unqualified(cell.source)]
    assert not found, (f"{rel(path)}: a collective only some ranks reach can also pair with the others' next one "
                       "(wrong data, no error) or fail when they exit; say so:\n  " + "\n  ".join(found))


def test_readme_does_not_say_a_skipped_collective_always_hangs():
    opening = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    assert not _hangs_unqualified(opening), _hangs_unqualified(opening)


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
