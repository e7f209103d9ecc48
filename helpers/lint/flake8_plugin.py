"""The flake8 plugin: ``flake8 --select=ORK train.py`` reports the same findings as ``python -m helpers.lint``.

Registered through the ``flake8.extension`` entry point in pyproject.toml (code prefix ``ORK``).
flake8 handles ``# noqa`` itself, so the findings are handed over unfiltered.
"""

from __future__ import annotations

import ast
from typing import Iterator

import helpers
from helpers.lint.analysis import analyse


class Plugin:
    name = "one-rank-lint"    # flake8 lists the distribution (one-rank-course-helpers) in --version
    version = helpers.__version__

    def __init__(self, tree: ast.AST):
        self.tree = tree

    def run(self) -> Iterator[tuple[int, int, str, type]]:
        for f in analyse(self.tree):
            yield f.line, f.col - 1, f"{f.code} {f.message}", type(self)
