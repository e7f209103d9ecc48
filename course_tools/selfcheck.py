"""`make check DEPTH=developer`: grade your own work, no instructor needed.

Runs the real grader (``nbgrader autograde``, with the course's hidden tests when the
instructor notebooks are present; in a learner's copy, the visible tests only) on your copies of one depth's notebooks in a temporary
course, prints your score per exercise, and writes nbgrader's feedback pages, which show
every test and what went wrong, to ``build/feedback/<depth>/``. Your notebooks are only read.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from course_tools import ROOT, answer_ids, depths, has_graded_cells, nbgrader
from course_tools.temp_course import exercise_of, has_hidden_tests, make_course, read_scores

STUDENT = "me"


def graded_notebooks(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.glob("*.ipynb"))
            if has_graded_cells(nbformat.read(p, as_version=4))]


def check(depth: str, notebooks: Path | None = None, feedback_dir: Path | None = None,
          out=sys.stdout) -> dict[str, tuple[float, float]]:
    """Grade ``notebooks`` (default: notebooks/<depth>/); return {exercise: (score, max)}."""
    notebooks = Path(notebooks or ROOT / "notebooks" / depth)
    feedback_dir = Path(feedback_dir or ROOT / "build" / "feedback" / depth)
    if depth not in depths(ROOT, "notebooks"):
        raise SystemExit(f"unknown depth {depth!r}: choose one of {depths(ROOT, 'notebooks')}")
    hidden = has_hidden_tests(depth)
    mine = graded_notebooks(notebooks)
    if not mine:
        raise SystemExit(f"no notebook with graded exercises in {notebooks}")
    with tempfile.TemporaryDirectory(prefix="selfcheck-") as tmp:
        course = make_course(Path(tmp), [depth])
        dest = course / "submitted" / STUDENT / depth
        dest.mkdir(parents=True)
        for path in mine:
            shutil.copy(path, dest / path.name)
        print(f"grading {len(mine)} notebook(s) of {depth} with the real grader ...", file=out,
              flush=True)
        t0 = time.monotonic()
        nbgrader("autograde", depth, "--force", cwd=course)
        nbgrader("generate_feedback", depth, "--force", cwd=course)
        seconds = time.monotonic() - t0
        graded = read_scores(course, depth, [p.stem for p in mine], [STUDENT], seconds)
        if feedback_dir.exists():
            shutil.rmtree(feedback_dir)
        shutil.copytree(course / "feedback" / STUDENT / depth, feedback_dir)

    table: dict[str, list[float]] = {}
    for path in mine:
        ids = answer_ids(nbformat.read(path, as_version=4))
        for test_id, score in graded.scores[STUDENT].items():
            if graded.notebook_of[test_id] != path.stem:
                continue
            row = table.setdefault(f"{path.name}: {exercise_of(test_id, ids)}", [0.0, 0.0])
            row[0] += score
            row[1] += graded.max_scores[test_id]
    width = max(len(k) for k in table)
    print(f"\n{'exercise':<{width}}  score", file=out)
    for name, (score, most) in table.items():
        mark = "ok" if score == most else "  "
        print(f"{name:<{width}}  {score:g} / {most:g}  {mark}", file=out)
    total = sum(s for s, _ in table.values()), sum(m for _, m in table.values())
    print(f"{'total':<{width}}  {total[0]:g} / {total[1]:g}   (graded in {seconds:.0f} s)", file=out)
    if not hidden:
        print("\nThese are the visible tests only: hidden tests (the same ideas on other sizes and "
              "inputs) run when your instructor grades.", file=out)
    print(f"\nfeedback, with every test and what went wrong: {feedback_dir}/", file=out)
    for html in sorted(feedback_dir.glob("*.html")):
        print(f"  {html}", file=out)
    return {k: (v[0], v[1]) for k, v in table.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("depth", help="beginner, developer or researcher")
    ap.add_argument("--notebooks", type=Path, help="folder with your notebooks "
                    "(default: notebooks/<depth>/)")
    ap.add_argument("--feedback", type=Path, help="where to write the feedback pages")
    args = ap.parse_args(argv)
    check(args.depth, args.notebooks, args.feedback)
    return 0


if __name__ == "__main__":
    sys.exit(main())
