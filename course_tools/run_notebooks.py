"""`make course`: execute every notebook with papermill into build/ and print a table.

Instructors run this to see the whole course work on their machine (``make course QUICK=1``
runs the CI sizes). Each notebook runs from its own folder, as a learner would run it; the
executed copies land in ``build/<tree>/<depth>/`` and nothing is written next to the sources.

A learner's "Run all" at full size should take at most :data:`BUDGET` seconds: the table flags each
notebook over it and the last line counts them. Being over budget does not change the exit status
(a failure does: 1).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from course_tools import ROOT

BUDGET = 60.0  # seconds a lesson's "Run all" may take at the learner's (full) size


def notebooks(trees=("solutions", "notebooks")) -> list[Path]:
    return [p for tree in trees for p in sorted((ROOT / tree).rglob("*.ipynb"))
            if ".ipynb_checkpoints" not in p.parts]


def execute(path: Path, out: Path, quick: bool, timeout: float) -> tuple[str, float]:
    import papermill as pm

    from course_tools import kernels

    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        kernels.execute_notebook(str(path), str(out), parameters={"QUICK": quick}, cwd=str(path.parent),
                                 kernel_name="python3", execution_timeout=timeout, progress_bar=False)
        status = "ok"
    except pm.PapermillExecutionError as e:
        status = f"error in cell {e.exec_count}: {e.ename}"
    return status, time.monotonic() - t0


def row_line(rel: str, seconds: float, status: str, budget: float = BUDGET) -> str:
    """One row of the table: the notebook, its time, its status, and a flag when it took over ``budget``."""
    flag = f"  OVER BUDGET (> {budget:.0f} s)" if seconds > budget else ""
    return f"{rel:<55} {seconds:7.1f} s  {status}{flag}"


def summary_lines(rows: list[tuple[str, float, str]], budget: float = BUDGET) -> list[str]:
    """The total, then how many notebooks took over ``budget`` seconds."""
    failed = sum(status != "ok" for _, _, status in rows)
    over = [rel for rel, seconds, _ in rows if seconds > budget]
    total = sum(seconds for _, seconds, _ in rows)
    return [f"{'total':<55} {total:7.1f} s  {len(rows) - failed} ok, {failed} failed",
            f"{len(over)} of {len(rows)} notebooks over the {budget:.0f} s budget" + (f": {', '.join(over)}" if over else "")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI sizes (QUICK=True)")
    ap.add_argument("--tree", choices=["solutions", "notebooks"], action="append",
                    help="which tree(s) to run (default: solutions; learner versions have empty answers)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per cell")
    ap.add_argument("--only", metavar="TEXT", help="only notebooks whose path contains TEXT")
    ap.add_argument("--out", type=Path, default=ROOT / "build", help="where the executed copies go")
    ap.add_argument("--budget", type=float, default=BUDGET,
                    help=f"seconds a notebook may take before it is flagged (default {BUDGET:.0f})")
    args = ap.parse_args(argv)
    trees = args.tree or ["solutions"]
    chosen = [p for p in notebooks(trees) if not args.only or args.only in str(p.relative_to(ROOT))]
    if not chosen:
        ap.error(f"no notebook matches --only {args.only!r}")
    rows = []
    for path in chosen:
        rel = path.relative_to(ROOT)
        status, seconds = execute(path, args.out / rel, args.quick, args.timeout)
        rows.append((str(rel), seconds, status))
        print(row_line(*rows[-1], budget=args.budget), flush=True)
    print(*summary_lines(rows, budget=args.budget), sep="\n")
    print(f"executed notebooks are in {args.out}")
    return 1 if any(status != "ok" for _, _, status in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
