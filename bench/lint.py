"""Lint time of the whole course (every .py and .ipynb of the repository) plus the linter's corpus.

Each file is linted the way ``python -m helpers.lint`` does it; the reference, measured in the
same run on the same files, is Python's own parse of them (``ast.parse``, cell by cell for a
notebook), which any ast linter pays. Medians of several passes. Target (issue 16): linting costs
at most 25x parsing, so checking a whole course stays interactive.
"""

from __future__ import annotations

import ast
import json
import statistics
import sys
import time
from pathlib import Path

from course_tools import ROOT
from helpers.lint.core import iter_files, lint_file, python_of_cell

TARGET = 25.0


def sources(path: Path) -> list[str]:
    if path.suffix != ".ipynb":
        return [path.read_text(encoding="utf-8")]
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    out = []
    for c in cells:
        if c.get("cell_type") == "code":
            code = python_of_cell("".join(c["source"]) if isinstance(c["source"], list) else c["source"])
            if code:
                out.append(code)
    return out


def parse_all(texts: list[list[str]]) -> None:
    for parts in texts:
        for text in parts:
            try:
                ast.parse(text)
            except SyntaxError:
                pass


def lint_all(files: list[Path]) -> int:
    return sum(len(lint_file(f).findings) for f in files)


def timed(fn, *args, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main(repeats: int = 5) -> bool:
    print(__doc__.strip().splitlines()[0])
    corpus = ROOT / "tests" / "lint_corpus"
    course = [f for f in iter_files([ROOT]) if corpus not in f.parents]
    groups = {"course": course, "corpus": iter_files([corpus])}
    print(f"{'files':>12} {'count':>6} {'lines':>7} {'lint':>8} {'parse':>8} {'lint/parse':>11} {'findings':>9}")
    ok, ratios = True, []
    for name, files in groups.items():
        texts = [sources(f) for f in files]
        lines = sum(t.count("\n") + 1 for parts in texts for t in parts)
        parse_s, _ = timed(parse_all, texts, repeats=repeats)
        lint_s, findings = timed(lint_all, files, repeats=repeats)
        ratio = lint_s / parse_s
        ratios.append(ratio)
        print(f"{name:>12} {len(files):>6} {lines:>7} {lint_s:>7.3f}s {parse_s:>7.3f}s {ratio:>10.1f}x {findings:>9}",
              flush=True)
    ok = max(ratios) <= TARGET
    print(("MET: " if ok else "MISSED: ") + f"target: lint <= {TARGET:.0f}x parse ({max(ratios):.1f}x)")
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
