"""Recall and precision of the linter on a set of scripts, with mutants from mutate.inject.

For each untouched script: its findings against the hand-reviewed list (public.json's
``reviewed``: true findings; a debatable one is a documented ``# noqa`` in the copy). Any other
finding is a false alarm. For each mutant: found when the linter reports the mutant's code at its
marked line; any finding beyond the untouched script's own and the mark is a false alarm too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from helpers.lint import lint_source
from tests.lint_corpus.mutate import inject


@dataclass
class Score:
    scripts: int = 0
    mutants: int = 0
    found: int = 0
    false_alarms: list = field(default_factory=list)     # (script, what)
    misses: list = field(default_factory=list)           # (script, code, form, line)
    true_findings: list = field(default_factory=list)    # (script, code, line) expected on untouched code

    @property
    def recall(self) -> float:
        return self.found / self.mutants if self.mutants else 0.0

    @property
    def precision(self) -> float:
        n = self.found + len(self.true_findings) + len(self.false_alarms)
        return (self.found + len(self.true_findings)) / n if n else 1.0

    def line(self, name: str) -> str:
        return (f"{name}: {self.scripts} scripts, recall {self.recall:.0%} ({self.found} of {self.mutants} "
                f"injected mistakes), {len(self.false_alarms)} false findings")


def score(named_sources, expected=lambda name: set()) -> Score:
    """``named_sources``: (name, source) pairs; ``expected(name)``: {(code, line)} true findings."""
    sc = Score()
    for name, source in named_sources:
        sc.scripts += 1
        base = {(f.code, f.line) for f in lint_source(source)}
        want = expected(name)
        sc.true_findings += [(name, c, n) for c, n in sorted(base & want)]
        sc.false_alarms += [(name, f"{c} at line {n} of the untouched script") for c, n in sorted(base - want)]
        for m in inject(source):
            got = [(f.code, f.line) for f in lint_source(m.source)]
            sc.mutants += 1
            if (m.code, m.line) in got:
                sc.found += 1
            else:
                sc.misses.append((name, m.code, m.form, m.line))
            extra = Counter(c for c, _ in got) - Counter(c for c, _ in base) - Counter([m.code])
            sc.false_alarms += [(name, f"{c} in the {m.code} {m.form} mutant") for c in extra.elements()]
    return sc


def public(split: str) -> Score:
    from tests.lint_corpus.public import present

    scripts = [s for s in present() if s.split == split]
    expected = {s.copy.name: {(c, n) for c, n, _ in s.expected} for s in scripts}
    return score([(s.copy.name, s.copy.read_text()) for s in scripts], lambda name: expected[name])
