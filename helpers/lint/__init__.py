"""A linter for the course's distributed mistakes (codes ORK101-ORK107), built on Python's ``ast``.

Taught in the developer lesson on common mistakes (``developer/02_common_mistakes``). Three ways in:

* ``python -m helpers.lint PATH...`` -- files, notebooks or folders (see :mod:`helpers.lint.__main__`);
* ``flake8 --select=ORK train.py`` -- the flake8 plugin (:mod:`helpers.lint.flake8_plugin`);
* ``%load_ext helpers.lint`` -- checks each notebook cell before it runs (:mod:`helpers.lint.ipython`).

Importing this package changes nothing; loading the extension is what registers the check.
"""

from __future__ import annotations

from helpers.lint.core import ParseError, lint_cells, lint_file, lint_paths, lint_source
from helpers.lint.rules import CODES, Finding

__all__ = ["CODES", "Finding", "ParseError", "lint_cells", "lint_file", "lint_paths", "lint_source",
           "load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython) -> None:
    """``%load_ext helpers.lint``: check every cell before it runs (never stops it)."""
    from helpers.lint.ipython import load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    from helpers.lint.ipython import unload

    unload(ipython)
