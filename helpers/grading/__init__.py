"""What runs inside a graded kernel: the learner's answers on real ranks, and the checks of every depth.

* :mod:`helpers.grading.answers` -- :func:`run_answer` and :func:`call_answer`: run an answer with a
  bounded time, turn a hang or a crash into feedback that teaches.
* :mod:`helpers.grading.beginner`, :mod:`helpers.grading.developer` -- the checks and in-rank
  harnesses of each depth's exercises notebook.
"""

from helpers.grading.answers import (GRADER_TIMEOUT, call_answer, feedback_for_error,  # noqa: F401
                                     feedback_for_hang, forget_hangs, run_answer)

__all__ = ["run_answer", "call_answer", "GRADER_TIMEOUT", "feedback_for_hang", "feedback_for_error",
           "forget_hangs"]
