"""Autograde time of whole submissions: every depth's exercises, all correct or all hanging.

One student submits the reference answers of every graded notebook of every depth; another
submits answers that all hang (a barrier only rank 0 reaches inside a pool, an endless loop
outside one). Targets (issue 6): a full correct submission in at most 60 s, an all-hanging
one within what the course promises a hang costs: one pool timeout per answer (its later tests
fail at once), so the target is that many timeouts plus the correct submission's 60 s. Both are
graded with the course's real nbgrader settings (each kernel in its sandbox when bubblewrap works
here: the line says which).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import nbformat

from course_tools import ROOT, depths, nbgrader
from course_tools.selfcheck import graded_notebooks
from course_tools.temp_course import fill, make_course, read_scores, reference_answers

HANG = """import torch.distributed as dist
if dist.is_initialized():
    if dist.get_rank() == 0:
        dist.barrier()          # only rank 0 ever gets here
else:
    while True:                 # no process group: just never return
        pass"""


def grade_everything(hang: bool) -> tuple[float, float, float]:
    """(seconds, score, max) for one student's submission of every depth."""
    graded = [d for d in depths() if graded_notebooks(ROOT / "solutions" / d)]
    student = "hangs" if hang else "correct"
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        course = make_course(Path(tmp), graded)
        for depth in graded:
            dest = course / "submitted" / student / depth
            dest.mkdir(parents=True)
            for source in graded_notebooks(ROOT / "solutions" / depth):
                answers = reference_answers(source, HANG if hang else None)
                nbformat.write(fill(course / "notebooks" / depth / source.name, answers),
                               dest / source.name)
            # the lesson notebooks are submitted too, as a learner's fetched folder holds them
            for lesson in (course / "notebooks" / depth).glob("*.ipynb"):
                if not (dest / lesson.name).exists():
                    (dest / lesson.name).write_bytes(lesson.read_bytes())
        t0 = time.monotonic()
        for depth in graded:
            nbgrader("autograde", depth, "--force", cwd=course, timeout=1800)
        seconds = time.monotonic() - t0
        score = most = 0.0
        for depth in graded:
            names = [p.stem for p in graded_notebooks(ROOT / "solutions" / depth)]
            g = read_scores(course, depth, names, [student])
            score += g.total(student)
            most += sum(g.max_scores.values())
    return seconds, score, most


def main() -> bool:
    from course_tools.sandbox import probe

    print(__doc__.strip().splitlines()[0])
    why = probe()
    print("kernels sandboxed with bubblewrap" if why is None else f"kernels NOT sandboxed: {why}")
    from helpers.grading.answers import pool_timeout

    answers = sum(len(reference_answers(nb)) for d in depths() for nb in graded_notebooks(ROOT / "solutions" / d))
    hang_target = 60.0 + answers * pool_timeout()
    print(f"{answers} answers; a hanging answer costs one pool timeout ({pool_timeout():g} s): "
          f"target for an all-hanging submission {answers} x {pool_timeout():g} + 60 = {hang_target:.0f} s")
    ok = True
    for hang, target in ((False, 60.0), (True, hang_target)):
        seconds, score, most = grade_everything(hang)
        kind = "every answer hangs" if hang else "every answer correct"
        met = seconds <= target and (score == 0 if hang else score == most)
        ok &= met
        print(f"{kind:<22} {seconds:6.1f} s (target <= {target:.0f} s)  score {score:g}/{most:g}  "
              f"{'MET' if met else 'MISSED'}", flush=True)
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
