"""The small pieces every lesson notebook shares: run sizes, scratch folders, proofs and predictions.

* :func:`quick` -- the notebook's ``QUICK`` setting, also on when the course runs notebooks
  unattended (the grader and the test suite ask for the smallest sizes through the environment).
* :func:`scratch_dir` -- a temporary folder for the files a demo writes, removed when the kernel ends.
* :func:`confirm` -- the proof under a demo: one plain line, ``✓ rank 0's loss is 2.3x too low``,
  or an ``AssertionError`` that says which claim did not hold.
* :func:`predict` -- a multiple-choice question asked *before* a demo runs, answered in place.

Importing this module changes nothing and imports nothing heavy.
"""

from __future__ import annotations

import atexit
import html
import os
import re
import shutil
import tempfile
from typing import Mapping

__all__ = ["quick", "scratch_dir", "confirm", "predict", "PREDICTION_MIME"]

#: The mime type of a prediction's static form, shown beside its widget in the cell's output
#: (``{"question": ..., "choices": [{"text": ..., "explanation": ..., "right": bool}]}``):
#: JupyterLab draws the widget and ignores it; a page that cannot run widgets (the course site,
#: course_tools/site.py) shows the question, the choices and, folded, the answer from it.
PREDICTION_MIME = "application/vnd.one-rank.prediction+json"

#: Set by the course's own runners (the grader sets ``NBGRADER_EXECUTION`` itself).
_UNATTENDED = ("COURSE_QUICK", "NBGRADER_EXECUTION")


def quick(requested: bool) -> bool:
    """``True`` when the parameters cell asked for the small sizes, or the course runs unattended."""
    return bool(requested) or any(os.environ.get(name) for name in _UNATTENDED)


def scratch_dir(prefix: str) -> str:
    """A new temporary folder; it and everything in it are removed when the kernel exits."""
    path = tempfile.mkdtemp(prefix=f"{prefix}-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def confirm(holds: bool, claim: str, otherwise: str = "") -> None:
    """Print ``✓ claim`` when ``holds``; otherwise raise ``AssertionError`` naming the claim.

    ``otherwise`` adds what was seen instead, for the failure message.
    """
    if not holds:
        raise AssertionError(f"✗ expected: {claim}" + (f" -- {otherwise}" if otherwise else ""))
    print(f"✓ {claim}")


def _inline_code(text: str) -> str:
    """``text`` as HTML, with `backticked` spans shown as code (as in the notebook's markdown)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def predict(question: str, choices: Mapping[str, str], answer: str):
    """Ask ``question`` before a demo: the learner picks one of ``choices`` and is told at once
    whether it was right, and why.

    ``choices`` maps each choice's text to the explanation shown when it is picked (why it is
    right, or why it is not); ``answer`` is the right choice's text. `Backticked` spans of the
    question and the explanations are shown as code. Nothing is picked at first, so the notebook
    runs unattended. Returns the widget (a ``VBox``); its ``.choices`` is the
    ``RadioButtons`` and its ``.feedback`` the ``HTML`` that answers. Its output also carries
    the question, choices and answer as :data:`PREDICTION_MIME`, for pages that show it statically.
    """
    import ipywidgets as widgets

    if answer not in choices:
        raise ValueError(f"the answer {answer!r} is not one of the choices {list(choices)}")
    if not 2 <= len(choices) <= 4:
        raise ValueError(f"a prediction offers 2 to 4 choices, got {len(choices)}")
    radio = widgets.RadioButtons(options=list(choices), value=None,
                                 layout=widgets.Layout(width="max-content"))
    feedback = widgets.HTML(value="")

    def show(change) -> None:
        picked = change["new"]
        if picked is None:
            feedback.value = ""
            return
        verdict = "✓ Right." if picked == answer else "✗ Not quite."
        colour = "#4c956c" if picked == answer else "#d1495b"
        feedback.value = (f'<span style="color:{colour}"><b>{verdict}</b></span> '
                          f"{_inline_code(choices[picked])}")

    radio.observe(show, names="value")
    box = widgets.VBox([widgets.HTML(f"<b>Predict first:</b> {_inline_code(question)}"), radio, feedback])
    box.add_class("course-prediction")
    box.choices, box.feedback = radio, feedback
    static = {"question": question,
              "choices": [{"text": text, "explanation": why, "right": text == answer}
                          for text, why in choices.items()]}
    widget_bundle = box._repr_mimebundle_

    def bundle(**kwargs):
        data = widget_bundle(**kwargs)
        if data is not None:
            data[PREDICTION_MIME] = static
        return data

    box._repr_mimebundle_ = bundle
    return box
