"""The IPython extension: ``%load_ext helpers.lint`` checks each cell before it runs.

The findings are printed above the cell's output, on stderr, with the cell's own line numbers;
the cell then runs as usual (the check never stops it, and an error inside the check is
swallowed). Cells run before are known (their imports, their functions), as they are to the
kernel. ``%unload_ext helpers.lint`` stops the checks.
"""

from __future__ import annotations

import sys

from helpers.lint.core import lint_cells

_STATE: dict = {}


class CellChecker:
    def __init__(self, stream=None):
        self.history: list[str] = []
        self.stream = stream

    def check(self, source: str) -> list[str]:
        """Lines to print for this cell (empty when nothing is found); remembers the cell."""
        if not isinstance(source, str):
            return []
        findings, errors = lint_cells(self.history + [source], only_cell=len(self.history) + 1)
        if not errors or not any(e.startswith(f"cell {len(self.history) + 1}:") for e in errors):
            self.history.append(source)
        return [f"line {f.line}: {f.code} {f.message}" for f in findings]

    def pre_run_cell(self, info=None) -> None:
        try:
            source = getattr(info, "raw_cell", None) or ""
            if not source.strip():
                return
            lines = self.check(source)
            if lines:
                out = self.stream or sys.stderr
                print("helpers.lint, before this cell runs:", file=out)
                for line in lines:
                    print("  " + line, file=out)
                out.flush()
        except Exception:      # a linter must never break a learner's cell
            pass


def load(ipython) -> None:
    if "checker" in _STATE:
        return
    checker = CellChecker()
    # The cells run before the extension was loaded: their imports and functions are known.
    for source in (ipython.user_ns.get("In") or [])[1:]:
        checker.check(source)
    ipython.events.register("pre_run_cell", checker.pre_run_cell)
    _STATE["checker"] = checker


def unload(ipython) -> None:
    checker = _STATE.pop("checker", None)
    if checker is not None:
        ipython.events.unregister("pre_run_cell", checker.pre_run_cell)
