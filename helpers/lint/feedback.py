"""The linter's word in grading feedback: a failing exercise test also shows what the linter finds
in the learner's answer (when it finds something).

Called by the course's autograde step (``course_tools/autograde.py``) after each cell; it only adds
an output to a graded test cell that failed, so it never changes a score.
"""

from __future__ import annotations

import ast

from helpers.lint.core import lint_cells

HEADER = "The linter (python -m helpers.lint) on your answer"


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _failed(cell) -> bool:
    return any(o.get("output_type") == "error" for o in cell.get("outputs", []))


def _defined(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _mentioned(source: str) -> set[str]:
    """Names a test cell uses, as code or as the ``name="..."`` it gives the grader."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
            out.add(n.value)
    return out


def lint_feedback(nb, cell) -> str | None:
    """The text to add under a failed graded test cell, or None (not a failed test, nothing found)."""
    meta = _meta(cell)
    if cell.get("cell_type") != "code" or not meta.get("grade") or meta.get("solution") or not _failed(cell):
        return None
    wanted = _mentioned(cell.get("source", ""))
    parts = []
    for answer in nb.cells:
        if answer.get("cell_type") != "code" or not _meta(answer).get("solution"):
            continue
        names = _defined(answer.source) & wanted
        if not names:
            continue
        findings, _ = lint_cells([answer.source])
        if findings:
            parts.append(f"{HEADER} ({', '.join(sorted(names))}):")
            parts += [f"  line {f.line}: {f.code} {f.message}" for f in findings]
    return "\n".join(parts) + "\n" if parts else None


def add_lint_feedback(nb, cell) -> None:
    """Append the linter's findings to a failed graded test cell's outputs (never raises)."""
    try:
        text = lint_feedback(nb, cell)
    except Exception:
        return
    if text:
        from nbformat.v4 import new_output

        cell.outputs.append(new_output("stream", name="stdout", text=text))
