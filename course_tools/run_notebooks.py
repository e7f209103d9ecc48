"""`make course`: execute every notebook with papermill into build/ and print a table.

Instructors run this to see the whole course work on their machine (``make course QUICK=1``
runs the CI sizes). Each notebook runs from its own folder, as a learner would run it; the
executed copies land in ``build/<tree>/<depth>/`` and nothing is written next to the sources.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from course_tools import ROOT


def notebooks(trees=("solutions", "notebooks")) -> list[Path]:
    return [p for tree in trees for p in sorted((ROOT / tree).rglob("*.ipynb"))
            if ".ipynb_checkpoints" not in p.parts]


def execute(path: Path, out: Path, quick: bool, timeout: float) -> tuple[str, float]:
    import papermill as pm

    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        pm.execute_notebook(str(path), str(out), parameters={"QUICK": quick}, cwd=str(path.parent),
                            kernel_name="python3", execution_timeout=timeout, progress_bar=False)
        status = "ok"
    except pm.PapermillExecutionError as e:
        status = f"error in cell {e.exec_count}: {e.ename}"
    return status, time.monotonic() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI sizes (QUICK=True)")
    ap.add_argument("--tree", choices=["solutions", "notebooks"], action="append",
                    help="which tree(s) to run (default: solutions; learner versions have empty answers)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per cell")
    ap.add_argument("--only", metavar="TEXT", help="only notebooks whose path contains TEXT")
    ap.add_argument("--out", type=Path, default=ROOT / "build", help="where the executed copies go")
    args = ap.parse_args(argv)
    trees = args.tree or ["solutions"]
    chosen = [p for p in notebooks(trees) if not args.only or args.only in str(p.relative_to(ROOT))]
    if not chosen:
        ap.error(f"no notebook matches --only {args.only!r}")
    rows, failed = [], 0
    for path in chosen:
        rel = path.relative_to(ROOT)
        status, seconds = execute(path, args.out / rel, args.quick, args.timeout)
        failed += status != "ok"
        rows.append((str(rel), seconds, status))
        print(f"{str(rel):<55} {seconds:7.1f} s  {status}", flush=True)
    total = sum(s for _, s, _ in rows)
    print(f"{'total':<55} {total:7.1f} s  {len(rows) - failed} ok, {failed} failed")
    print(f"executed notebooks are in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
