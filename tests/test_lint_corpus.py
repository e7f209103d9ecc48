"""The linter on realistic training scripts (tests/lint_corpus/): six correct scripts in the shapes
people write, and mutated copies with one injected mistake each, its line marked ``# expect: ORK10x``.

Precision = findings at a marked line with the marked code / all findings; recall = marked lines
found / marked lines. Both are computed here and must match what the README reports.
"""

from __future__ import annotations

import re

import pytest

from helpers.lint import lint_file, lint_source
from tests.conftest import ROOT

CORPUS = ROOT / "tests" / "lint_corpus"
CORRECT = sorted((CORPUS / "correct").glob("*.py"))
MUTATED = sorted((CORPUS / "mutated").glob("*.py"))
EXPECT = re.compile(r"\s*#\s*expect:\s*(ORK\d{3})\s*$")


def marks(text: str) -> set[tuple[str, int]]:
    return {(m.group(1), i) for i, line in enumerate(text.splitlines(), start=1) if (m := EXPECT.search(line))}


def score():
    """(true positives, false positives, false negatives, per-file misses and false alarms)."""
    tp = fp = fn = 0
    problems = []
    for path in CORRECT + MUTATED:
        want = marks(path.read_text())
        report = lint_file(path)
        assert report.errors == [], (path, report.errors)
        got = {(f.code, f.line) for f in report.findings}
        tp += len(got & want)
        fp += len(got - want)
        fn += len(want - got)
        if got != want:
            problems.append((path.name, sorted(got - want), sorted(want - got)))
    return tp, fp, fn, problems


def test_corpus_shape():
    assert {p.stem for p in CORRECT} == {"ddp_tutorial_spawn", "torchrun_trainer", "torchvision_reference",
                                         "nanogpt_style", "accelerate_script", "fsdp_dcp"}
    codes = {p.stem.split("__")[1] for p in MUTATED}
    assert codes == {f"ORK10{i}" for i in range(1, 8)}
    for p in MUTATED:
        shape, code = p.stem.split("__")
        assert (CORPUS / "correct" / f"{shape}.py").exists()
        assert {c for c, _ in marks(p.read_text())} == {code}, p.name
    for p in CORRECT:
        assert marks(p.read_text()) == set()


def test_mutants_are_what_mutate_py_writes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutate", CORPUS / "mutate.py")
    mutate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutate)
    expected = set()
    for shape, mutations in mutate.MUTATIONS.items():
        source = (CORPUS / "correct" / f"{shape}.py").read_text()
        for code, replacements in mutations.items():
            path = CORPUS / "mutated" / f"{shape}__{code}.py"
            expected.add(path)
            assert path.read_text() == mutate.mutate(source, code, replacements), path.name
    assert expected == set(MUTATED)


@pytest.mark.parametrize("path", MUTATED, ids=lambda p: p.stem)
def test_the_marker_is_invisible_to_the_linter(path):
    text = path.read_text()
    stripped = "\n".join(EXPECT.sub("", line) for line in text.splitlines()) + "\n"
    assert lint_source(text) == lint_source(stripped)


@pytest.mark.parametrize("path", CORRECT, ids=lambda p: p.stem)
def test_correct_scripts_get_no_finding(path):
    report = lint_file(path)
    assert report.errors == [] and report.findings == [], [f.format() for f in report.findings]


@pytest.mark.parametrize("path", MUTATED, ids=lambda p: p.stem)
def test_each_mutation_is_flagged_at_its_line_and_nothing_else(path):
    got = {(f.code, f.line) for f in lint_file(path).findings}
    assert got == marks(path.read_text())


def test_precision_and_recall_match_the_readme():
    tp, fp, fn, problems = score()
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    line = (f"precision {precision:.2f} ({fp} false alarms among {tp + fp} findings), "
            f"recall {recall:.2f} ({tp} of {tp + fn} injected mistakes found)")
    readme = (ROOT / "README.md").read_text()
    assert line in readme, f"the README's linter section should say: {line}\n{problems}"
    assert f"{len(CORRECT)} correct scripts and {len(MUTATED)} mutated copies" in readme


# ---------------------------------------------------------------- mutants found by the ast (mutate.inject)

def generated():
    from tests.lint_corpus.score import score

    return score([(p.name, p.read_text()) for p in CORRECT])


def test_inject_writes_each_rule_in_several_forms_at_its_marked_line():
    from tests.lint_corpus.mutate import inject

    forms: dict[str, set[str]] = {}
    for p in CORRECT:
        for m in inject(p.read_text()):
            forms.setdefault(m.code, set()).add(m.form)
            assert marks(m.source) == {(m.code, m.line)}, (p.name, m.form)
            stripped = "\n".join(EXPECT.sub("", line) for line in m.source.splitlines()) + "\n"
            assert lint_source(m.source) == lint_source(stripped)
    assert set(forms) == {f"ORK10{i}" for i in range(1, 8)}
    assert all(len(f) >= 2 for f in forms.values()), forms


def test_inject_leaves_a_single_process_script_alone():
    from tests.lint_corpus.mutate import inject

    script = "import torch\nfor step in range(3):\n    loss = model(step)\n    loss.backward()\n"
    assert inject(script) == []


def test_generated_mutants_are_found_and_the_readme_says_so():
    sc = generated()
    assert sc.recall >= 0.90, sc.misses
    assert not [f for f in sc.false_alarms if "untouched" in f[1]], sc.false_alarms
    assert sc.line("generated mutants of the committed scripts") in (ROOT / "README.md").read_text(), sc.line(
        "generated mutants of the committed scripts")
