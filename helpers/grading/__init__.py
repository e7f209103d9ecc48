"""What runs inside a graded kernel: the learner's answers in worker processes, and the checks.

One pattern for every depth. A test cell imports its depth's checks inside the cell and calls
the check named after the cell, with the learner's function::

    from helpers.grading import beginner as check
    check.save_once_only_rank0_writes(save_once, world_size=3)

* :mod:`helpers.grading.answers` -- :func:`run_answer` (an answer on the ranks of a pool),
  :func:`call` (a single-process answer in one worker process), the time limits, and the
  one-line success message / teaching failure every check ends with.
* :mod:`helpers.grading.beginner`, :mod:`helpers.grading.developer`,
  :mod:`helpers.grading.researcher` -- each depth's checks and the harnesses they run on the
  ranks (``notebooks/<depth>/*_exercises.ipynb``).
"""

from helpers.grading.answers import (CheckFailed, call, cell_timeout, fail,  # noqa: F401
                                     forget_hangs, passed, pool_timeout, run_answer)

__all__ = ["run_answer", "call", "CheckFailed", "fail", "passed", "pool_timeout", "cell_timeout",
           "forget_hangs"]
