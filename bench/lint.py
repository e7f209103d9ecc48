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
from tests.lint_corpus.public import present
from tests.lint_corpus.score import public as score_public
from tests.lint_corpus.score import score

TARGET = 25.0
RECALL_TARGET = 0.90


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
    groups = {"course": course, "corpus": [f for f in iter_files([corpus]) if corpus / "public" not in f.parents]}
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
    public = [s.copy for s in present()]
    if public:
        texts = [sources(f) for f in public]
        parse_s, _ = timed(parse_all, texts, repeats=repeats)
        lint_s, findings = timed(lint_all, public, repeats=repeats)
        ratios.append(lint_s / parse_s)
        lines = sum(t.count("\n") + 1 for parts in texts for t in parts)
        print(f"{'public':>12} {len(public):>6} {lines:>7} {lint_s:>7.3f}s {parse_s:>7.3f}s {lint_s / parse_s:>10.1f}x "
              f"{findings:>9}", flush=True)
    ok = max(ratios) <= TARGET
    print(("MET: " if ok else "MISSED: ") + f"target: lint <= {TARGET:.0f}x parse ({max(ratios):.1f}x)")
    print("Recall and false findings (mutants from tests/lint_corpus/mutate.py inject):")
    print("  " + score([(p.name, p.read_text()) for p in sorted((corpus / "correct").glob("*.py"))]).line(
        "generated mutants of the committed scripts"))
    if not public:
        print("  public corpus: no copies (python -m tests.lint_corpus.public copies them from git snapshots)")
    for split in ("dev", "heldout"):
        if not any(s.split == split for s in present()):
            continue
        sc = score_public(split)
        print("  " + sc.line(f"public {split}"))
        for name, code, form, line in sc.misses:
            print(f"    missed {code} ({form}) at line {line} of {name}")
        for name, what in sc.false_alarms:
            print(f"    false finding: {what} in {name}")
        if split == "heldout":
            met = sc.recall >= RECALL_TARGET and not sc.false_alarms
            ok = ok and met
            print(("MET: " if met else "MISSED: ") + f"target on held-out public scripts: recall >= "
                  f"{RECALL_TARGET:.0%} and no false finding ({sc.recall:.0%}, {len(sc.false_alarms)})")
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
