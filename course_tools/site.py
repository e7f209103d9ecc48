"""`make site`: the course as a website, built with the MyST toolchain (Jupyter Book 2's) into build/site/.

Steps, each one a function the tests reuse:

1. :func:`execute_all` runs every learner notebook (``notebooks/``) with papermill at the CI sizes
   (``QUICK=True``, as ``make course QUICK=1``), from its own folder. An execution is cached in
   ``build/site-cache/`` under a key made of the bytes of what the run may read (:func:`inputs`:
   the notebook, the files beside it that are not notebooks, every file of ``helpers/``): an
   unchanged lesson is not run again, and editing one lesson does not run its neighbours.
   In an exercises notebook the learner's answers are empty, so the graded cells are allowed to
   fail and their outputs are dropped: the page shows the exercise as the learner gets it.
2. :func:`page` turns an executed notebook into the page's notebook: papermill's injected
   parameters cell becomes a note saying the page ran at the smallest sizes, each widget's output
   is replaced by what it drew (a widget cannot run on a static page: its figures, a progress
   bar's last line, the values its controls were set to), each prediction by its question, its
   choices and its answer folded in a ``<details>``, and a first cell links to the lesson on the
   course's JupyterHub (an nbgitpuller link) and to the notebook's download. A widget the page
   cannot show fails the build.
3. :func:`write_project` writes the MyST project (``myst.yml`` with the pages in the course's
   order, the landing page from the README's depth table) and :func:`build_html` runs
   ``myst build --site`` (MyST parses every page into its AST) and ``site/render.mjs``, which
   renders that AST to HTML with myst-to-html and the course's own handlers and page template
   (``site/``, installed by ``make site`` with ``npm ci``: nothing is downloaded at build time).

Where the launch links point is set here, in :data:`HUB`, or by the environment variables it names.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import nbformat

from course_tools import ROOT, is_answer_cell, is_graded_cell, kernels

#: The course's JupyterHub and repository, for the launch links (nbgitpuller). Each can be set
#: by the environment variable of the same name (e.g. SITE_HUB_URL=https://hub.example.edu).
HUB = {
    "SITE_HUB_URL": "https://hub.example.edu",
    "SITE_REPO": "https://github.com/example/one-rank-course",
    "SITE_BRANCH": "main",
}
SITE_DIR = ROOT / "site"            # the pinned MyST toolchain and theme (package.json, lock files)
BUILD = ROOT / "build"
CACHE = BUILD / "site-cache"
PROJECT = BUILD / "site-src"
OUT = BUILD / "site"
#: Bump when what is cached changes shape (a new step below), so old entries are not reused.
CACHE_VERSION = "2"
CELL_TIMEOUT = 600


def hub() -> dict:
    return {k: os.environ.get(k, v) for k, v in HUB.items()}


def lessons(root: Path = ROOT) -> list[Path]:
    """The learner notebooks in the course's order: start, then each depth (paths relative to root)."""
    from course_tools import depths

    order = sorted(depths(root, "notebooks"), key=lambda d: (d != "start", d))
    return [p.relative_to(root) for d in order for p in sorted((root / "notebooks" / d).glob("*.ipynb"))]


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and ".ipynb_checkpoints" not in p.parts)


def inputs(notebook: Path, root: Path = ROOT) -> list[Path]:
    """The files an execution of ``notebook`` may read: the notebook, the files beside it that are
    not notebooks (the scripts a lesson runs, ``ddp_*.py``), and every file of ``helpers/``. The
    other notebooks of its folder are not among them: editing one lesson runs that lesson again,
    not its neighbours."""
    beside = [p for p in _files(notebook.parent) if p.suffix != ".ipynb"]
    return [notebook, *beside, *_files(root / "helpers")]


def cache_key(notebook: Path, root: Path = ROOT) -> str:
    """What the executed page depends on: :func:`inputs`' bytes, the sizes and the build's first cell."""
    h = hashlib.sha256(f"v{CACHE_VERSION} quick\0{FIGURE_NOTES_CELL}".encode())
    for path in inputs(notebook, root):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:20]


#: The first cell of a build run (removed from the page): every figure the inline backend shows
#: carries, in its output's metadata, the titles and axis labels it was drawn with, so that the page
#: can say in the image's alt text what the figure shows (its title states the finding); and a
#: widget the notebook closes (a finished ``tqdm(leave=False)``, which JupyterLab then no longer
#: shows) is marked so in the saved widget state (:data:`CLOSED`), so the page leaves it out too.
FIGURE_NOTES = "site-figure-notes"
CLOSED = "site-closed"
FIGURE_NOTES_CELL = """import matplotlib_inline.backend_inline as _site_bi
def _site_notes(fig, _fetch=_site_bi._fetch_figure_metadata):
    md = dict(_fetch(fig) or {})
    sup = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else ""
    md["%s"] = {"suptitle": sup, "axes": [{"titles": [ax.get_title(loc) for loc in ("left", "center", "right")],
        "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel()} for ax in fig.axes if ax.get_visible()]}
    return md
_site_bi._fetch_figure_metadata = _site_notes
import ipywidgets as _site_w
def _site_close(self, _close=_site_w.Widget.close):
    if getattr(self, "comm", None) is not None and hasattr(self, "_dom_classes"):
        self._dom_classes = (*self._dom_classes, "%s")
    _close(self)
_site_w.Widget.close = _site_close
del _site_bi, _site_notes, _site_w, _site_close""" % (FIGURE_NOTES, CLOSED)


def _graded(cell) -> bool:
    return is_answer_cell(cell) or is_graded_cell(cell)


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` (a file made for it), held by one process at a time: two
    builds, or two pytest workers, never run the same notebook at once; the second waits, then
    finds the first one's run in the cache."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def execute(notebook: Path, root: Path = ROOT, cache: Path = CACHE,
            fresh_after: float | None = None) -> tuple[Path, str, float]:
    """The executed notebook (from the cache if its key is there), 'cached' or 'ran', seconds.

    ``fresh_after`` (a ``time.time()``): a cached run older than that is run again (the test
    suite asks each notebook to have run in its own session, once, whichever test asks first).
    """
    rel = notebook.relative_to(root)
    out = cache / rel.parent / f"{rel.stem}.{cache_key(notebook, root)}.ipynb"
    with _locked(cache / "locks" / rel.parent / f"{rel.stem}.lock"):
        if out.exists() and (fresh_after is None or out.stat().st_mtime >= fresh_after):
            return out, "cached", 0.0
        return out, "ran", _run(notebook, rel, out)


def _run(notebook: Path, rel: Path, out: Path) -> float:
    """Execute ``notebook`` at the CI sizes into ``out`` (the only entry of the cache for it)."""
    import papermill as pm

    out.parent.mkdir(parents=True, exist_ok=True)
    for old in out.parent.glob(f"{rel.stem}.*.ipynb"):
        if old != out:                   # one entry per notebook: the cache does not grow
            old.unlink()                 # (an older run of this key is replaced at the end, at once:
                                         # a build that took it from the cache may be reading it)
    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:                # the learner's empty answers fail: run on past them
        if _graded(cell):
            cell.metadata.setdefault("tags", []).append("raises-exception")
    notes = nbformat.v4.new_code_cell(FIGURE_NOTES_CELL)
    notes.metadata["tags"] = [FIGURE_NOTES]
    nb.cells.insert(0, notes)
    source = out.with_suffix(".in.ipynb")
    nbformat.write(nb, source)
    t0 = time.monotonic()
    # the same environment whoever asks (make site, or the test suite with its QUICK_ENV): a
    # cached run is the same run
    env = {"PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "ignore::DeprecationWarning"),
           "COURSE_QUICK": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    partial = out.with_suffix(".partial.ipynb")
    try:
        try:
            kernels.execute_notebook(str(source), str(partial), parameters={"QUICK": True},
                                     cwd=str(notebook.parent), kernel_name="python3",
                                     execution_timeout=CELL_TIMEOUT, progress_bar=False, log_output=False)
        except pm.PapermillExecutionError:
            # papermill raises for any error output, also in the graded cells it ran past
            bad = errors_outside_graded(nbformat.read(partial, as_version=4))
            if bad:
                raise RuntimeError(f"{rel} fails outside its graded cells: {bad}") from None
        partial.replace(out)             # only a finished run is cached, in one step
    finally:
        source.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return time.monotonic() - t0


def errors_outside_graded(nb) -> list[str]:
    """Cells other than the learner's answers and their tests whose output is an error."""
    return [f"cell {i}: {o.get('ename')}: {o.get('evalue')}" for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and not _graded(c)
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


# ----------------------------------------------------------------------------- the page

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
QUICK_NOTE = ("*On this page the notebook was run with `QUICK = True`: the smallest sizes, the ones "
              "the course's tests run. Open it on the hub to run it at full size and move the "
              "widgets.*")


def launch_url(rel: Path, cfg: dict | None = None) -> str:
    """An nbgitpuller link: the hub clones (or updates) the course into the learner's folder
    ``<repository name>`` and opens ``rel`` there in JupyterLab. The folder is named in the link
    (``targetpath``): nbgitpuller's own default keeps a ``.git`` ending, which the path to open
    would then miss."""
    cfg = cfg or hub()
    repo = cfg["SITE_REPO"].rstrip("/")
    folder = repo.rsplit("/", 1)[-1].removesuffix(".git")
    query = urllib.parse.urlencode({"repo": repo, "branch": cfg["SITE_BRANCH"], "targetpath": folder,
                                    "urlpath": f"lab/tree/{folder}/{rel.as_posix()}"})
    return f"{cfg['SITE_HUB_URL'].rstrip('/')}/hub/user-redirect/git-pull?{query}"


PREDICTION_MIME = "application/vnd.one-rank.prediction+json"   # helpers.lessons.interact's

#: Widgets a reader would move (the lesson's controls): on a page they become one line saying
#: the values the page ran with. A button is pressed, not set: it adds nothing to that line.
CONTROLS = {"IntSliderModel", "FloatSliderModel", "FloatLogSliderModel", "IntRangeSliderModel",
            "FloatRangeSliderModel", "ToggleButtonsModel", "DropdownModel", "RadioButtonsModel",
            "SelectModel", "SelectionSliderModel", "CheckboxModel", "ToggleButtonModel", "TextModel",
            "IntTextModel", "FloatTextModel", "BoundedIntTextModel", "BoundedFloatTextModel"}
BUTTONS = {"ButtonModel"}
PROGRESS = {"FloatProgressModel", "IntProgressModel"}
TEXTS = {"HTMLModel", "LabelModel", "HTMLMathModel"}


class StaticWidgetError(RuntimeError):
    """A widget the page cannot show: its view would leave a hole where the notebook shows something."""


def _value(model: dict) -> str:
    """What a control is set to, as a reader would say it."""
    st = model.get("state", {})
    if "index" in st and "_options_labels" in st:
        labels, index = st["_options_labels"], st["index"]
        if isinstance(index, (list, tuple)):
            return ", ".join(str(labels[i]) for i in index)
        return "(none)" if index is None else str(labels[index])
    value = st.get("value")
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return " to ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return str(value)


def _text(markup: str) -> str:
    import html as _html

    return " ".join(_html.unescape(re.sub(r"<[^>]*>", " ", markup or "")).split())


def _widget_items(model_id: str, state: dict, seen: set) -> list[tuple[str, object]]:
    """What one widget shows, as ("output", nbformat output), ("setting", "label: value") and
    ("text", html) items, in the order the widget lays them out. Raises for a kind of widget
    this page cannot show."""
    if model_id in seen:
        return []
    seen.add(model_id)
    model = state[model_id]
    name, st = model.get("model_name", "?"), model.get("state", {})
    children = [c.removeprefix("IPY_MODEL_") for c in st.get("children", [])
                if isinstance(c, str) and c.startswith("IPY_MODEL_")]
    if name == "OutputModel":
        return [("output", nbformat.from_dict(o)) for o in st.get("outputs", [])]
    if children and any(state.get(c, {}).get("model_name") in PROGRESS for c in children):
        # a progress bar (tqdm's: its label, the bar, its counts): its last state as a line
        bar = next(state[c] for c in children if state.get(c, {}).get("model_name") in PROGRESS)
        words = [_text(state[c]["state"].get("value", "")) for c in children
                 if state.get(c, {}).get("model_name") in TEXTS]
        line = " ".join(w for w in words if w) or \
            f"{_value(bar)} of {bar.get('state', {}).get('max', '?')}"
        return [("output", nbformat.v4.new_output("stream", name="stdout", text=line + "\n"))]
    if "children" in st:
        items = []
        for child in children:
            if child not in state:
                raise StaticWidgetError(f"a {name} holds a widget missing from the saved state")
            items += _widget_items(child, state, seen)
        return items
    if name in CONTROLS:
        label = _text(st.get("description", ""))
        return [("setting", f"{label}: {_value(model)}" if label else _value(model))]
    if name in BUTTONS:
        return []
    if name in TEXTS:
        return [("text", st.get("value", ""))] if _text(st.get("value", "")) else []
    raise StaticWidgetError(f"no static form for a {name}")


SETTINGS = "Widgets set to"


def _widget_outputs(model_id: str, state: dict) -> list:
    """The outputs a widget view becomes on a page: what its Output widgets drew (figures, text),
    a progress bar's last line, and one line with the values its controls were set to."""
    result, settings = [], []

    def flush():
        if settings:
            html_ = f"<p><em>{SETTINGS}:</em> " + " · ".join(html.escape(t) for t in settings) + "</p>"
            result.append(nbformat.v4.new_output("display_data", data={
                "text/html": html_, "text/plain": f"{SETTINGS}: " + " · ".join(settings)}))
            settings.clear()

    for kind, item in _widget_items(model_id, state, set()):
        if kind == "setting":
            settings.append(item)
            continue
        flush()
        if kind == "text":
            item = nbformat.v4.new_output("display_data", data={"text/html": item, "text/plain": _text(item)})
        result.append(item)
    flush()
    return result


def _static(outputs: list, state: dict, where: str = "") -> tuple[list, list[dict]]:
    """Each widget view replaced by what it shows (:func:`_widget_outputs`), and the predictions
    (helpers.lessons.interact.predict) taken out: (outputs, predictions).

    A view whose widget the notebook closed (a finished ``tqdm(leave=False)``, marked by the build's
    first cell) shows nothing in JupyterLab either, and is dropped; any other view that would show
    nothing, or whose widget is not in the saved state, fails the build."""
    result, predictions = [], []
    for out in outputs:
        data = out.get("data", {})
        if WIDGET_VIEW not in data:
            result.append(out)
            continue
        if PREDICTION_MIME in data:
            predictions.append(data[PREDICTION_MIME])
            continue
        model_id = data[WIDGET_VIEW]["model_id"]
        if model_id not in state:
            raise StaticWidgetError(f"{where}: a widget view whose state was not saved with the notebook")
        if CLOSED in state[model_id].get("state", {}).get("_dom_classes", []):
            continue                     # closed by the notebook: JupyterLab no longer shows it either
        try:
            drawn = _widget_outputs(model_id, state)
        except StaticWidgetError as e:
            raise StaticWidgetError(f"{where}: {e}") from None
        if not drawn:
            raise StaticWidgetError(f"{where}: a widget view ({state[model_id].get('model_name')}) "
                                    "shows nothing on a static page")
        result += drawn
    return result, predictions


def _inline(text: str) -> str:
    """``text`` as HTML, `backticked` spans as code (as predict() shows them in JupyterLab).
    HTML, not markdown: MyST would read a file name (``model.pt``, ``train.py``) as a web address
    and ``@record`` as a citation."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(" ".join(str(text).split()), quote=False))


def prediction_html(prediction: dict) -> str:
    """A prediction as the page shows it: the question, the choices, and the answer with why (and
    why not each other choice) folded in a <details>, as a lesson's review answers are. One HTML
    block (no blank line in it), which MyST passes through as it is."""
    choices = prediction["choices"]
    right = [c for c in choices if c["right"]]
    if len(right) != 1 or not prediction.get("question"):
        raise StaticWidgetError(f"a prediction without one right answer or a question: {prediction}")
    items = "".join(f"<li>{_inline(c['text'])}</li>" for c in choices)
    others = "".join(f"<li><em>{_inline(c['text'])}</em> — {_inline(c['explanation'])}</li>"
                     for c in choices if not c["right"])
    return "\n".join([
        f"<p><strong>Predict first:</strong> {_inline(prediction['question'])}</p>",
        f"<ul>{items}</ul>",
        "<details><summary>Answer</summary>",
        f"<p><strong>Right: {_inline(right[0]['text'])}</strong> {_inline(right[0]['explanation'])}</p>",
        f"<p>The other choices:</p><ul>{others}</ul>",
        "</details>"])


IMAGES = ("image/svg+xml", "image/png", "image/jpeg", "image/gif")


def figure_alt(notes: dict | None) -> str:
    """The alt text of a figure: its title (which states the finding) and axes, from the notes the
    build's first cell recorded (:data:`FIGURE_NOTES_CELL`); '' when the figure has no title."""
    def tidy(t):
        return " ".join((t or "").split())

    if not notes:
        return ""
    panels = []
    for ax in notes.get("axes", []):
        title = "; ".join(tidy(t) for t in ax.get("titles", []) if tidy(t))
        axes = [f"{name} axis: {tidy(ax.get(key))}" for name, key in (("x", "xlabel"), ("y", "ylabel"))
                if tidy(ax.get(key))]
        if title:
            panels.append(title + (f" ({', '.join(axes)})" if axes else ""))
    sup = tidy(notes.get("suptitle"))
    if not sup and not panels:
        return ""
    if len(panels) > 1:
        panels = [f"panel {i}: {t}" for i, t in enumerate(panels, 1)]
    return "Figure: " + ". ".join(filter(None, [sup, *panels])) + "."


def _shown(out):
    """An output as the page shows it: a figure with its alt text, HTML cleaned by the course's
    sanitizer (course_tools/sanitize.py), scripts and widget views dropped."""
    out = copy.deepcopy(out)
    data = out.get("data")
    if data is None:
        return out
    for mime in ("application/javascript", WIDGET_VIEW):
        data.pop(mime, None)
    if "text/html" in data:
        from course_tools.sanitize import clean

        html = data["text/html"]
        data["text/html"] = clean(html if isinstance(html, str) else "".join(html))
    if any(m in data for m in IMAGES):
        meta = out.setdefault("metadata", {})
        alt = figure_alt(meta.pop(FIGURE_NOTES, None))
        if alt:
            meta["alt"] = alt
    return out


def page(executed: Path, rel: Path, cfg: dict | None = None):
    """The notebook the site shows for the learner notebook ``rel`` executed into ``executed``."""
    nb = nbformat.read(executed, as_version=4)
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    cells = []
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if FIGURE_NOTES in tags or "papermill-error-cell-tag" in tags:
            continue                     # build plumbing: the notes cell, papermill's error banner
        if "injected-parameters" in tags:
            cells.append(nbformat.v4.new_markdown_cell(QUICK_NOTE))
            continue
        cell, predictions = copy.deepcopy(cell), []
        if cell.cell_type == "code":
            if _graded(cell):
                cell.outputs = []        # as the learner gets it: nothing run yet
            else:
                where = f"{rel}, the cell ending {(cell.source.strip().splitlines() or [''])[-1][:70]!r}"
                shown, predictions = _static(cell.outputs, state, where)
                cell.outputs = [_shown(o) for o in shown]
            cell.metadata.pop("papermill", None)
            cell.metadata["tags"] = [t for t in tags if t != "raises-exception"]
        cells.append(cell)
        for prediction in predictions:   # the question where the widget was, the answer folded
            md = nbformat.v4.new_markdown_cell(prediction_html(prediction))
            md.metadata["tags"] = ["prediction"]
            cells.append(md)
    links = (f"[Open this lesson on the course's JupyterHub]({launch_url(rel, cfg)}) · "
             f"{{download}}`Download the notebook <../downloads/{rel.parent.name}/{rel.name}>`")
    first_heading = next((i for i, c in enumerate(cells) if c.cell_type == "markdown"
                          and c.source.lstrip().startswith("# ")), -1)
    if first_heading >= 0:               # the links go right under the title
        title, _, rest = cells[first_heading].source.lstrip().partition("\n")
        if rest.strip():
            cells[first_heading].source = title
            cells.insert(first_heading + 1, nbformat.v4.new_markdown_cell(rest.lstrip("\n")))
    cells.insert(first_heading + 1, nbformat.v4.new_markdown_cell(links))
    nb.cells = cells
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("papermill", None)
    return nb


# ----------------------------------------------------------------------------- the project

def depth_table(readme: str) -> str:
    """The README's table of depths (the lines from its header row to the blank line after it)."""
    lines = readme.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("| depth |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def landing(readme: str, pages: list[Path]) -> str:
    """The landing page: the course's title and pitch, and the depth table with links to pages."""
    title = readme.splitlines()[0].lstrip("# ").strip()
    table = depth_table(readme)
    for depth in ("beginner", "developer", "researcher"):
        first = next((p for p in pages if p.parts[1] == depth), None)
        if first is not None:
            table = table.replace(f"[{depth}](notebooks/{depth}/)",
                                  f"[{depth}]({first.relative_to('notebooks').as_posix()})")
    start = next(p for p in pages if p.parts[1] == "start").relative_to("notebooks")
    return (f"---\ntitle: {title}\n---\n\n"
            "An interactive course on one practical topic of distributed PyTorch training: saving and "
            "logging from one rank only. Every page is a notebook with its outputs; each lesson "
            "opens on the course's JupyterHub from its first lines.\n\n"
            f"Start with [the start notebook]({start.as_posix()}), then pick one depth:\n\n"
            f"{table}\n")


def write_project(pages: dict[Path, object], project: Path = PROJECT, root: Path = ROOT) -> Path:
    """The MyST project: index.md, the pages' notebooks (and their downloads), myst.yml."""
    if project.exists():
        shutil.rmtree(project)
    project.mkdir(parents=True)
    order = list(pages)
    (project / "index.md").write_text(landing((root / "README.md").read_text(), order))
    toc = ["    - file: index.md"]
    by_depth: dict[str, list[Path]] = {}
    for rel in order:
        by_depth.setdefault(rel.parts[1], []).append(rel)
    for depth, rels in by_depth.items():
        toc.append(f"    - title: {depth.capitalize()}\n      children:")
        toc += [f"        - file: {r.relative_to('notebooks').as_posix()}" for r in rels]
    for rel, nb in pages.items():
        dest = project / rel.relative_to("notebooks")
        dest.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, dest)
        # the download: the learner's notebook as committed (no outputs)
        download = project / "downloads" / rel.parent.name / rel.name
        download.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / rel, download)
    for rel in {r.parent for r in order}:      # the scripts the lessons link to (ddp_*.py)
        for side in sorted((root / rel).iterdir()):
            if side.is_file() and side.suffix != ".ipynb":
                shutil.copy(side, project / rel.relative_to("notebooks") / side.name)
    (project / "myst.yml").write_text(
        f"version: 1\nproject:\n  title: {TITLE}\n"
        "  exclude: ['downloads/**']\n  toc:\n" + "\n".join(toc) + "\n"
        + "site:\n  options: {}\n")
    sections = [{"title": "Course", "pages": ["index.md"]}]
    sections += [{"title": depth.capitalize(), "pages": [r.relative_to("notebooks").as_posix() for r in rels]}
                 for depth, rels in by_depth.items()]
    (project / "site-pages.json").write_text(json.dumps({"title": TITLE, "sections": sections}, indent=1))
    return project


TITLE = "Saving and logging from one rank only"


def node_bin(site_dir: Path = SITE_DIR) -> dict[str, Path]:
    """The pinned tools: ``myst`` (mystmd) and the renderer's modules (myst-to-html)."""
    tools = {"myst": site_dir / "node_modules" / ".bin" / "myst",
             "renderer": site_dir / "node_modules" / "myst-to-html" / "package.json"}
    missing = [str(p) for p in tools.values() if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)} missing: run `make site` (it installs the pinned "
                                "MyST toolchain with npm ci into site/node_modules)")
    if shutil.which("node") is None:
        raise FileNotFoundError("node is not on PATH: make site needs Node.js 18 or newer "
                                "(sudo apt-get install nodejs npm)")
    return tools


def build_html(project: Path = PROJECT, out: Path = OUT) -> tuple[str, float]:
    """``myst build --site`` (MyST parses every page and writes its AST and outputs into
    ``_build/site/content`` and ``_build/site/public``), then ``site/render.mjs`` renders that AST
    to HTML (myst-to-html's handlers and the course's own, in the course's page template) into
    ``out``. Nothing is downloaded: mystmd's step that would fetch its theme is never reached.
    """
    t0 = time.monotonic()
    tools = node_bin()
    built_dir = project / "_build" / "site"
    shutil.rmtree(project / "_build", ignore_errors=True)
    proc = subprocess.run([str(tools["myst"]), "build", "--site"], cwd=project,
                          capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    (project / "myst-build.log").write_text(log)
    built = re.search(r"Built (\d+) pages? for project", log)
    # mystmd 1.8.3 writes the content, then asks the network for its theme (which the renderer
    # below replaces): that request failing is the only failure allowed here
    if not built or not (built_dir / "content").is_dir() or (
            proc.returncode != 0 and "Querying template metadata" not in log):
        raise RuntimeError(f"myst build --site failed ({proc.returncode}):\n{log}")
    manifest = json.loads((project / "site-pages.json").read_text())
    manifest.update(project=str(project), content=str(built_dir / "content"),
                    public=str(built_dir / "public"), out=str(out))
    (project / "render.json").write_text(json.dumps(manifest, indent=1))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    render = subprocess.run(["node", str(SITE_DIR / "render.mjs"), str(project / "render.json")],
                            capture_output=True, text=True, timeout=600)
    if render.returncode != 0:
        shutil.rmtree(out, ignore_errors=True)     # no half-written site
        raise RuntimeError(f"site/render.mjs failed ({render.returncode}):\n{render.stdout}{render.stderr}")
    flagged = sorted({l.strip() for l in log.splitlines() if l.startswith(("⛔", "⚠"))})
    return (f"{built.group(1)} pages parsed, {render.stdout.strip()}; MyST flagged {len(flagged)} "
            f"problems (listed in {project / 'myst-build.log'})"), time.monotonic() - t0


def build(root: Path = ROOT, cache: Path = CACHE, project: Path = PROJECT, out: Path = OUT,
          log=print) -> dict:
    """Execute (or take from the cache) every learner notebook, write the project, build the site.

    Returns what happened: per notebook 'ran'/'cached' and seconds, and the HTML build's seconds.
    """
    report, pages = {"notebooks": {}}, {}
    for rel in lessons(root):
        executed, how, seconds = execute(root / rel, root, cache)
        nb = nbformat.read(executed, as_version=4)
        bad = errors_outside_graded(nb)
        if bad:
            raise RuntimeError(f"{rel} fails outside its graded cells: {bad}")
        pages[rel] = page(executed, rel)
        report["notebooks"][str(rel)] = {"how": how, "seconds": round(seconds, 1)}
        log(f"{str(rel):<55} {how:>6} {seconds:7.1f} s")
    write_project(pages, project, root)
    what, seconds = build_html(project, out)
    report["myst"], report["myst_seconds"] = what, round(seconds, 1)
    log(f"{'myst build':<55} {seconds:14.1f} s  {what}")
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help="where the static site goes")
    args = ap.parse_args(argv)
    build(out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
