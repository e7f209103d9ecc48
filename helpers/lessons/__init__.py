"""Per-lesson data, demos and figures: what the lesson notebooks import besides the pool.

* :mod:`helpers.lessons.figures` -- every figure, in one palette.
* :mod:`helpers.lessons.races` -- slow writes and torn reads (the race made visible).
* :mod:`helpers.lessons.beginner`, :mod:`helpers.lessons.developer`,
  :mod:`helpers.lessons.researcher` -- each depth's data sets and demo plumbing.
"""
