"""What a learner wrote is shown, never run: the sanitizing step of every page rendered from a
submission (nbgrader's feedback and the formgrader's submission view).

Both pages are nbconvert HTML exports of the autograded notebook, which holds what the learner
submitted (markdown and raw cells, attachments, metadata) and what grading printed. Nothing in
nbgrader sanitizes it, so a ``<script>`` in a markdown cell would run in the instructor's session.
:class:`SanitizeSubmission` (an ``HTMLExporter`` preprocessor, see ``nbgrader_config.py``):

- a markdown or raw cell is the instructor's, and kept as it is, only when its source is, verbatim,
  one of the markdown or raw cells of the assignment's released (or source) notebook; every other
  one is rendered here (the exporter's own markdown, math kept for MathJax) and cleaned with
  bleach's allow-list: text, headings, emphasis, lists, code, tables, links to http(s)/mailto/an
  anchor, images only as inline PNG/JPEG/GIF data;
- outputs of every cell: ``text/html`` and ``text/markdown`` cleaned the same way, ``image/svg+xml``
  shown only as an image (an SVG in an ``<img>`` cannot run script), ``application/javascript``,
  widgets and any other type dropped; output metadata keeps numeric ``width``/``height`` and ``alt``;
- attachments other than PNG/JPEG/GIF are dropped; tags and grade ids that are not plain words
  lose the characters a template would paste into HTML; the notebook's widget state is dropped.

:func:`with_csp` adds a Content-Security-Policy to the page's ``<head>`` (the template
``course_tools/templates/course_safe``): inline script runs only when it is one of the template's
own (by hash), script files only from the page's server or the folders of those the template names, no
plugins, no frames. It is the second line: a payload the cleaning missed still does not run.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
from pathlib import Path
from urllib.parse import urlsplit

from jinja2 import pass_environment
from traitlets import Unicode

from nbconvert.preprocessors import Preprocessor

__all__ = ["SanitizeSubmission", "clean", "learner_markdown", "policy", "with_csp", "template_dirs",
           "nbgrader_template", "TEMPLATE"]

TEMPLATE = "course_safe"
TAGS = {"a", "abbr", "b", "blockquote", "br", "code", "dd", "del", "div", "dl", "dt", "em", "h1",
        "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "kbd", "li", "ol", "p", "pre", "s", "span",
        "strong", "sub", "sup", "table", "tbody", "td", "th", "thead", "tr", "ul"}
ATTRIBUTES = {"*": ["class", "title"], "a": ["href"], "img": ["src", "alt", "width", "height"],
              "td": ["align", "colspan", "rowspan"], "th": ["align", "colspan", "rowspan"],
              "ol": ["start"], **{f"h{n}": ["id"] for n in range(1, 7)}}
RASTER = ("image/png", "image/jpeg", "image/gif")
_DATA_IMAGE = re.compile(r"^data:image/(png|jpeg|gif|svg\+xml);base64,[A-Za-z0-9+/=\s]*$")
_WORD = re.compile(r"[^A-Za-z0-9_.\-]")
# Output types shown as they are: text, and raster images the template puts in a quoted src.
_SAFE_OUTPUT = {"text/plain", "text/latex", "image/png", "image/jpeg", "application/json"}


def _allowed(tag: str, name: str, value: str) -> bool:
    if name == "href":
        return value.startswith(("#", "http://", "https://", "mailto:"))
    if name == "src":
        return bool(_DATA_IMAGE.match(value))
    if name in ("width", "height"):
        return value.isdigit()
    return name in ATTRIBUTES.get(tag, ()) or name in ATTRIBUTES["*"]


def clean(markup: str) -> str:
    """``markup`` with only the allow-listed tags and attributes (the rest shown as text)."""
    import bleach

    return bleach.clean(markup, tags=TAGS, attributes=_allowed,
                        protocols={"http", "https", "mailto", "data"}, strip=False, strip_comments=True)


class _Attachments(dict):
    """A cell's raster attachments; any other name (dropped, or never attached) is a blank image,
    where nbconvert would fail the whole page."""

    def __contains__(self, name) -> bool:
        return True

    def __missing__(self, name):
        return {"image/png": _BLANK}


_BLANK = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="


def _markdown_html(source: str, attachments: dict | None = None) -> str:
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    renderer = IPythonRenderer(escape=False, attachments=attachments or {}, anchor_link_text="¶")
    return MarkdownWithMath(renderer=renderer).render(source)


def learner_markdown(source: str, attachments: dict | None = None) -> str:
    """A learner's markdown as the cleaned HTML the page will show, written as markdown that the
    template's own markdown step passes through unchanged: one HTML block on one line (a newline
    is the character reference ``&#10;``, the same character to the browser). If that step would
    change it after all, the cell is shown as plain text instead."""
    kept = _Attachments({k: v for k, v in (attachments or {}).items()
                         if isinstance(v, dict) and v and set(v) <= set(RASTER)})
    cleaned = '<div class="learner-markdown">' + clean(_markdown_html(source, kept)) + "</div>"
    block = cleaned.replace("\r", "").replace("\n", "&#10;")
    if _markdown_html(block).strip() != block:
        return "<pre>" + html.escape(source).replace("\n", "&#10;") + "</pre>"
    return block


def _release_cells(course: Path, release: str, source: str, assignment: str, notebook: str) -> set:
    """Sources of the markdown and raw cells of the assignment's released and source notebooks."""
    import nbformat

    found = set()
    for folder in (release, source):
        path = course / folder / assignment / f"{notebook}.ipynb"
        if path.is_file():
            nb = nbformat.read(path, as_version=4)
            found |= {c.source for c in nb.cells if c.cell_type in ("markdown", "raw")}
    return found


class SanitizeSubmission(Preprocessor):
    """Cleans what the learner wrote before the page renders it (see the module's docstring)."""

    course_root = Unicode("", help="The course folder (default: CourseDirectory.root, the current "
                          "folder)").tag(config=True)

    def _instructor_cells(self, resources: dict) -> set:
        from nbgrader.coursedir import CourseDirectory

        meta = resources.get("nbgrader", {})
        assignment = meta.get("assignment") or resources.get("assignment_id")
        notebook = meta.get("notebook") or resources.get("notebook_id")
        coursedir = CourseDirectory(config=self.config)
        root = Path(self.course_root or coursedir.root)
        if not (assignment and notebook):
            self.log.warning("Sanitizing a page with no assignment/notebook named: every markdown "
                             "cell is treated as the learner's.")
            return set()
        return _release_cells(root, coursedir.release_directory, coursedir.source_directory,
                              assignment, notebook)

    def preprocess(self, nb, resources):
        trusted = self._instructor_cells(resources)
        nb.metadata.pop("widgets", None)
        for cell in nb.cells:
            self._metadata(cell.metadata)
            if cell.cell_type in ("markdown", "raw") and cell.source not in trusted:
                if cell.cell_type == "markdown":
                    cell.source = learner_markdown(cell.source, cell.get("attachments"))
                else:
                    cell.source = clean(cell.source)
                cell.pop("attachments", None)
            for out in cell.get("outputs", []):
                self._output(out)
        return nb, resources

    @staticmethod
    def _metadata(meta) -> None:
        if isinstance(meta.get("tags"), list):
            meta["tags"] = [_WORD.sub("", str(t)) for t in meta["tags"]]
        nbg = meta.get("nbgrader")
        if isinstance(nbg, dict) and "grade_id" in nbg:
            nbg["grade_id"] = _WORD.sub("", str(nbg["grade_id"]))
        if "alt" in meta:
            meta["alt"] = str(meta["alt"])

    def _output(self, out) -> None:
        if out.get("output_type") not in ("display_data", "execute_result"):
            return
        data = out.get("data", {})
        for key in list(data):
            value = data[key]
            text = "".join(value) if isinstance(value, list) else str(value)
            if key in _SAFE_OUTPUT:
                continue
            if key == "text/html":
                data[key] = clean(text)
            elif key == "text/markdown":
                data["text/html"] = learner_markdown(text)
                del data[key]
            elif key == "image/svg+xml":
                b64 = base64.b64encode(text.encode()).decode()
                data["text/html"] = f'<img src="data:image/svg+xml;base64,{b64}" alt="SVG output">'
                del data[key]
            else:
                self.log.info("Dropping a %s output from the rendered page", key)
                del data[key]
        if not data:
            data["text/plain"] = "(an output that cannot be shown safely was removed)"
        meta = out.get("metadata", {})
        for key in list(meta):
            if isinstance(meta[key], dict):
                sub = meta[key]
                for k in list(sub):
                    if not (k in ("width", "height") and isinstance(sub[k], int) or k == "alt"):
                        del sub[k]
                if "alt" in sub:
                    sub["alt"] = str(sub["alt"])
            elif key not in ("width", "height") or not isinstance(meta[key], int):
                del meta[key]


# ------------------------------------------------------------------------- Content-Security-Policy

_SCRIPT = re.compile(r"<script\b([^>]*)>(.*?)</script>", re.S | re.I)
_SRC = re.compile(r"""\bsrc\s*=\s*["']([^"']+)["']""", re.I)
_TYPE = re.compile(r"""\btype\s*=\s*["']([^"']+)["']""", re.I)
_HANDLER = re.compile(r'\son[a-z]+\s*=\s*"([^"]*)"', re.I)


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


_EXECUTABLE = {"", "text/javascript", "application/javascript", "module"}


def policy(*trusted_html: str) -> str:
    """The page's policy: the inline scripts of ``trusted_html`` (the template's own markup, no
    learner content in it) by hash, its external scripts by their folder's URL, the page's own server."""
    hashes, urls = set(), set()
    for part in trusted_html:
        for attrs, body in _SCRIPT.findall(part):
            src = _SRC.search(attrs)
            kind = _TYPE.search(attrs)
            if src:
                url = urlsplit(src.group(1))
                if url.scheme in ("http", "https"):  # its folder: a loader fetches its parts from there
                    urls.add(f"{url.scheme}://{url.netloc}{url.path.rsplit('/', 1)[0]}/")
            elif (kind.group(1).lower() if kind else "") in _EXECUTABLE:
                hashes.add(_sha256(body))
    # The template's own event handlers (the formgrader's show/hide-name icons), by exact text.
    handlers = {_sha256(html.unescape(v)) for part in trusted_html for v in _HANDLER.findall(part)}
    scripts = " ".join(["'self'", *sorted(urls), *sorted(hashes),
                        *(["'unsafe-hashes'", *sorted(handlers)] if handlers else [])])
    return ("default-src 'self'; "
            f"script-src {scripts}; "
            "style-src 'self' 'unsafe-inline' https:; img-src 'self' data:; font-src 'self' data: https:; "
            "connect-src 'self'; object-src 'none'; frame-src 'none'; base-uri 'self'; form-action 'self'")


def with_csp(head: str, *trusted: str) -> str:
    """The template's ``<head>`` markup with the policy as its first element."""
    meta = f'<meta http-equiv="Content-Security-Policy" content="{html.escape(policy(head, *trusted))}">'
    return re.sub(r"<head\b[^>]*>", lambda m: m.group(0) + "\n" + meta, head, count=1)


def template_dirs() -> list[str]:
    """``HTMLExporter.extra_template_basedirs``: ``course_safe`` and the nbgrader templates it is
    built on (their macros)."""
    return [str(Path(__file__).parent / "templates"), str(_nbgrader_templates())]


@pass_environment
def nbgrader_template(environment, page: str):
    """The filter ``nbgrader_template``: nbgrader's own ``feedback`` or ``formgrade`` page template, for
    ``course_safe`` to extend (nbconvert finds templates by a name that ``course_safe`` itself takes)."""
    path = _nbgrader_templates() / page / "index.html.j2"
    return environment.from_string(path.read_text())


def _nbgrader_templates() -> Path:
    from importlib.util import find_spec

    return Path(find_spec("nbgrader").origin).parent / "server_extensions" / "formgrader" / "templates"
