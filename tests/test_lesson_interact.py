"""helpers.lessons.interact: run sizes, scratch folders, proofs and predictions."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.lessons.interact import confirm, predict, quick


def test_quick_follows_the_setting_and_the_unattended_runners(monkeypatch):
    monkeypatch.delenv("COURSE_QUICK", raising=False)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert quick(False) is False and quick(True) is True
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert quick(False) is True


def test_scratch_dir_is_removed_when_the_kernel_exits(tmp_path):
    code = ("import os; from helpers.lessons.interact import scratch_dir; d = scratch_dir('demo'); "
            "open(os.path.join(d, 'f.pt'), 'w').write('x'); print(d)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    folder = out.stdout.strip()
    assert folder and "demo-" in folder
    import os

    assert not os.path.exists(folder)


def test_confirm_prints_the_claim_or_names_it_in_the_failure(capsys):
    confirm(True, "rank 0's loss is 2.3x too low")
    assert capsys.readouterr().out == "✓ rank 0's loss is 2.3x too low\n"
    with pytest.raises(AssertionError, match=r"✗ expected: the file is whole -- torn"):
        confirm(False, "the file is whole", "torn")


def test_predict_answers_each_choice_and_starts_unanswered():
    box = predict("What does rank 1 read?", {"a whole file": "no: nothing made it wait",
                                              "a torn or missing file": "yes: it read during the write"},
                  answer="a torn or missing file")
    assert box.choices.value is None and box.feedback.value == ""
    box.choices.value = "a whole file"
    assert "Not quite" in box.feedback.value and "nothing made it wait" in box.feedback.value
    box.choices.value = "a torn or missing file"
    assert "Right" in box.feedback.value and "during the write" in box.feedback.value


def test_predict_refuses_an_answer_that_is_not_a_choice():
    with pytest.raises(ValueError, match="not one of the choices"):
        predict("?", {"a": "", "b": ""}, answer="c")


def test_predict_shows_backticked_spans_as_code_and_escapes_the_rest():
    box = predict("Does `a < b` hold?", {"yes": "`a` is 1 & `b` is 2", "no": "it does"}, answer="yes")
    assert "<code>a &lt; b</code>" in box.children[0].value
    box.choices.value = "yes"
    assert "<code>a</code> is 1 &amp; <code>b</code> is 2" in box.feedback.value


def test_predict_carries_its_question_choices_and_answer_for_static_pages():
    """What the course site shows where the widget cannot run (course_tools/site.py)."""
    from IPython.core.formatters import DisplayFormatter

    from helpers.lessons.interact import PREDICTION_MIME

    box = predict("What does rank 1 read?", {"a whole file": "no: nothing made it wait",
                                              "a torn or missing file": "yes: it read during the write"},
                  answer="a torn or missing file")
    data, _ = DisplayFormatter().format(box)
    assert "application/vnd.jupyter.widget-view+json" in data      # JupyterLab draws the widget
    assert data[PREDICTION_MIME] == {"question": "What does rank 1 read?", "choices": [
        {"text": "a whole file", "explanation": "no: nothing made it wait", "right": False},
        {"text": "a torn or missing file", "explanation": "yes: it read during the write", "right": True}]}
