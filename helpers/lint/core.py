"""Lint Python source, notebook cells and paths; honour ``# noqa``.

A notebook is read cell by cell, in order, as its kernel would run it: imports and functions of
earlier cells are known in later ones, and each finding names its cell (1-based, counting every
cell of the notebook as Jupyter lists them). IPython syntax (``%magic``, ``!cmd``, ``%%time``) is
blanked out before parsing; cells in another language (``%%bash``, ``%%writefile``) are skipped.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from helpers.lint.analysis import analyse
from helpers.lint.rules import Finding

NOQA = re.compile(r"#\s*noqa(?::[\s]?(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.I)
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug"}
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", "build", "node_modules", ".ipynb_checkpoints",
             ".pytest_cache", ".tox", ".eggs"}
_CELL_FLAGS = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


class ParseError(Exception):
    """A file (or a notebook cell) that is not valid Python; ``str()`` says where and why."""


@dataclass
class Report:
    """What linting one path found: findings, and the reason it could not be parsed (if so)."""

    path: str
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def noqa_lines(source: str) -> dict[int, set[str] | None]:
    """line -> codes silenced on it (``None``: a bare ``# noqa`` silences everything)."""
    out: dict[int, set[str] | None] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return out
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        m = NOQA.search(tok.string)
        if not m:
            continue
        codes = m.group("codes")
        out[tok.start[0]] = None if not codes else {c.upper() for c in re.split(r"[,\s]+", codes) if c}
    return out


def _silenced(f: Finding, noqa: dict[int, set[str] | None]) -> bool:
    if f.line not in noqa:
        return False
    codes = noqa[f.line]
    return codes is None or f.code in codes


def _tag(module: ast.Module, cell: int) -> ast.Module:
    for n in ast.walk(module):
        n._ork_cell = cell
    return module


def lint_source(source: str, filename: str = "<source>") -> list[Finding]:
    """Findings in one Python file's text. Raises :class:`ParseError` when it does not parse."""
    try:
        module = ast.parse(source, filename=filename)
    except SyntaxError as e:
        raise ParseError(f"{e.msg} (line {e.lineno}, column {e.offset})") from None
    return lint_tree(module, source)


def lint_tree(module: ast.Module, source: str | None = None, cells_mode: bool = False) -> list[Finding]:
    findings = analyse(module, cells_mode=cells_mode)
    if source is not None:
        noqa = noqa_lines(source)
        findings = [f for f in findings if not _silenced(f, noqa)]
    return findings


def python_of_cell(source: str) -> str | None:
    """A code cell's text as plain Python (same line numbers), or None for a non-Python cell."""
    lines = source.splitlines()
    if lines and lines[0].lstrip().startswith("%%"):
        magic = lines[0].lstrip()[2:].split()[0] if lines[0].strip() != "%%" else ""
        if magic not in PYTHON_CELL_MAGICS:
            return None
        lines[0] = ""
    out = []
    for line in lines:
        stripped = line.lstrip()
        if stripped.startswith(("%", "!")) or (stripped.endswith("?") and not stripped.startswith("#")
                                               and "(" not in stripped):
            out.append(line[: len(line) - len(stripped)] + "pass")
        elif re.match(r"^\s*[\w.]+\s*=\s*[!%]", line):     # x = !ls, x = %time f()
            out.append(re.sub(r"=\s*[!%].*$", "= None", line))
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def lint_cells(sources: list[str], only_cell: int | None = None, numbers: list[int] | None = None,
               ) -> tuple[list[Finding], list[str]]:
    """Lint code cells as one program, in order.

    ``numbers`` gives each cell's number to report (default 1, 2, ...). ``only_cell`` keeps the
    findings of that cell number only (the IPython extension checks one new cell at a time,
    knowing the cells run before it). Returns findings and one error per cell that does not parse.
    """
    numbers = numbers or list(range(1, len(sources) + 1))
    body, errors, noqa = [], [], {}
    for number, src in zip(numbers, sources):
        code = python_of_cell(src)
        if code is None or not code.strip():
            continue
        try:
            module = compile(code, f"<cell {number}>", "exec", flags=_CELL_FLAGS)
        except SyntaxError as e:
            errors.append(f"cell {number}: {e.msg} (line {e.lineno}, column {e.offset})")
            continue
        body.extend(_tag(module, number).body)
        noqa[number] = noqa_lines(code)
    findings = analyse(ast.Module(body=body, type_ignores=[]), cells_mode=True)
    findings = [f for f in findings if not _silenced(f, noqa.get(f.cell, {}))]
    if only_cell is not None:
        findings = [f for f in findings if f.cell == only_cell]
    return findings, errors


def lint_notebook(path: str | os.PathLike) -> Report:
    report = Report(str(path))
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
        cells = nb["cells"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        report.errors.append(f"not a readable notebook: {e}")
        return report
    sources, numbers = [], []
    for i, cell in enumerate(cells, start=1):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        sources.append("".join(src) if isinstance(src, list) else src)
        numbers.append(i)
    report.findings, report.errors = lint_cells(sources, numbers=numbers)
    return report


def lint_file(path: str | os.PathLike) -> Report:
    path = Path(path)
    if path.suffix == ".ipynb":
        return lint_notebook(path)
    report = Report(str(path))
    try:
        source = tokenize.open(path).read()      # honours a PEP 263 encoding line
    except (OSError, SyntaxError, UnicodeDecodeError) as e:
        report.errors.append(f"cannot read: {e}")
        return report
    try:
        report.findings = lint_source(source, str(path))
    except ParseError as e:
        report.errors.append(str(e))
    return report


def iter_files(paths) -> list[Path]:
    """Python files and notebooks under the given files and folders, in a stable order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
                out.extend(Path(root) / f for f in sorted(files) if f.endswith((".py", ".ipynb")))
        else:
            out.append(p)
    return out


def lint_paths(paths) -> list[Report]:
    return [lint_file(p) for p in iter_files(paths)]
