"""Plumbing for tests/test_browser.py: a private JupyterLab server and a driven Chromium page.

Nothing here is a lesson. ``LabServer`` serves a temporary copy of the course from the course's
own .venv (temporary config, data, runtime, workspace, IPython and matplotlib dirs; the nbgrader
and ipywidgets lab extensions stay visible because they live at the venv's sys-prefix level) and
stops it, its kernels and their rank processes, pass or fail. ``NotebookDriver`` opens one
notebook in a Chromium page, waits for its kernel, runs every cell and reads back what the
learner sees (outputs, images, widgets) from the DOM and from Lab's own models.

Facts this relies on are in the course's shared notes "JupyterLab in headless Chromium".
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course_tools import ROOT, venv_env
from tests.conftest import QUICK_ENV

# Without the networking flags Chromium floods a closed network with connection attempts.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                 "--disable-dev-shm-usage"]
COURSE_ID = "one-rank"
# What a temporary copy of the course leaves out: the environment, git, generated state.
_NOT_COPIED = shutil.ignore_patterns(".venv", ".git", "build", "__pycache__", ".pytest_cache",
                                     ".ipynb_checkpoints", "*.egg-info", "gradebook.db",
                                     "submitted", "autograded", "feedback")
# Lab settings for the test: no news/update toast over the page, every cell attached to the DOM.
LAB_OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {"checkForUpdates": False, "fetchNews": "false"},
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none", "scrollPastEnd": False},
}


def chromium_path() -> str:
    """The browser to drive (see :func:`course_tools.browser.find_chromium`)."""
    from course_tools.browser import find_chromium

    path = find_chromium()
    if path is None:
        raise FileNotFoundError(
            "no Chromium or Chrome found for the browser test: install Debian's chromium "
            "(`sudo apt-get install chromium`; `make test` does it when run as root), "
            "or set COURSE_CHROMIUM to a Chromium/Chrome binary")
    return path


def chromium_session(home: Path, playwright):
    """``yield from chromium_session(home, playwright)`` in a fixture: headless Chromium launched
    (:func:`launch_chromium`) from the test process's one Playwright (the ``playwright`` fixture
    of tests/conftest.py), closed afterwards whatever happens."""
    browser = launch_chromium(playwright, home)
    try:
        yield browser
    finally:
        browser.close()


def launch_chromium(playwright, home: Path):
    """Headless Chromium from the system; its profile and crash database go under ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / "config"),
               XDG_CACHE_HOME=str(home / "cache"))
    return playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS,
                                      headless=True, timeout=120_000, env=env)


def learner_notebooks(root: Path = ROOT) -> list[Path]:
    """Every learner notebook, discovered: notebooks/**/*.ipynb (paths relative to the course)."""
    return sorted(p.relative_to(root) for p in (root / "notebooks").rglob("*.ipynb")
                  if ".ipynb_checkpoints" not in p.parts)


def copy_course(dest: Path, root: Path = ROOT) -> Path:
    shutil.copytree(root, dest, ignore=_NOT_COPIED)
    return dest


def release_assignments(course: Path, exchange: Path, assignments: list[str]) -> None:
    """``nbgrader release_assignment`` each assignment of the course copy into ``exchange``."""
    exchange.mkdir(parents=True, exist_ok=True)
    with_db = f"--CourseDirectory.db_url=sqlite:///{course}/gradebook.db"
    for name in assignments:
        cmd = [sys.executable, "-m", "nbgrader", "release_assignment", name, "--force",
               f"--Exchange.root={exchange}", f"--CourseDirectory.root={course}",
               f"--CourseDirectory.course_id={COURSE_ID}", with_db, "--log-level=WARN"]
        proc = subprocess.run(cmd, cwd=course, capture_output=True, text=True, env=venv_env(),
                              timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"nbgrader release_assignment {name} failed:\n{proc.stdout}\n{proc.stderr}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


class LabServer:
    """``jupyter lab`` from this interpreter's environment, serving ``course`` on 127.0.0.1.

    Use as a context manager: the server, its kernels and everything they started are gone when
    the block exits, whatever happened inside it.
    """

    def __init__(self, course: Path, state: Path, exchange: Path | None = None,
                 startup_timeout: float = 120):
        self.course, self.state, self.exchange = Path(course), Path(state), exchange
        self.startup_timeout = startup_timeout
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log_path = self.state / "lab.log"
        self.started: list = []  # every process seen below the server, for the final sweep

    # ------------------------------------------------------------------ lifecycle
    def _env(self) -> dict:
        dirs = {name: self.state / name for name in
                ("config", "data", "runtime", "ipython", "mpl", "workspaces", "lab-settings")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        (dirs["lab-settings"] / "overrides.json").write_text(json.dumps(LAB_OVERRIDES, indent=1))
        if self.exchange is not None:
            # nbgrader's server extensions read nbgrader_config.py files, not the server's
            # command line: give them the exchange through the (temporary) config dir too.
            (dirs["config"] / "nbgrader_config.py").write_text(
                "c = get_config()  # noqa\n"
                f"c.Exchange.root = {str(self.exchange)!r}\n"
                f"c.CourseDirectory.course_id = {COURSE_ID!r}\n")
        self._settings_dir = dirs["lab-settings"]
        return venv_env(
            JUPYTER_CONFIG_DIR=str(dirs["config"]), JUPYTER_DATA_DIR=str(dirs["data"]),
            JUPYTER_RUNTIME_DIR=str(dirs["runtime"]), IPYTHONDIR=str(dirs["ipython"]),
            MPLCONFIGDIR=str(dirs["mpl"]), JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]),
            PYTHONDONTWRITEBYTECODE="1", **QUICK_ENV,
            # the copy's helpers, not the repo's (the editable install points at the repo):
            # kernels see one consistent snapshot of the course
            PYTHONPATH=os.pathsep.join(filter(None, [str(self.course), os.environ.get("PYTHONPATH")])))

    def start(self) -> "LabServer":
        env = self._env()
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={self.port}",
               "--port-retries=0", "--ServerApp.ip=127.0.0.1", f"--ServerApp.token={self.token}",
               "--allow-root", f"--ServerApp.root_dir={self.course}",
               "--LabApp.expose_app_in_browser=True", f"--LabApp.app_settings_dir={self._settings_dir}",
               "--LabApp.news_url=None", "--ServerApp.terminals_enabled=False"]
        if self.exchange is not None:
            cmd += [f"--Exchange.root={self.exchange}", f"--CourseDirectory.course_id={COURSE_ID}"]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=self.course, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.api("GET", "/api/status", timeout=5)
                return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"JupyterLab did not answer in {self.startup_timeout} s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.25)  # polling the status endpoint, not synchronising on time

    def remember_children(self) -> None:
        """Note every process below the server (kernels start in their own sessions)."""
        if self.proc is not None:
            seen = {p.pid for p in self.started}
            self.started += [p for p in _descendants(self.proc.pid) if p.pid not in seen]

    def leftovers(self) -> list[int]:
        """PIDs of processes this server started that are still alive."""
        import psutil

        alive = []
        for p in self.started:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p.pid)
            except psutil.NoSuchProcess:
                pass
        return alive

    def stop(self) -> list[str]:
        """Stop the server and every process it started; return what had to be killed."""
        import psutil

        if self.proc is None:
            return []
        self.remember_children()
        if self.proc.poll() is None:
            try:  # let Lab shut its kernels down itself
                for s in self.api("GET", "/api/sessions", timeout=10):
                    self.api("DELETE", f"/api/sessions/{s['id']}", timeout=30)
            except Exception:
                pass
            self.remember_children()
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        killed = []
        for p in [*self.started, psutil.Process(os.getpid())]:
            if p.pid == os.getpid():
                continue
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    killed.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
                    p.kill()
            except psutil.NoSuchProcess:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()
        self.proc = None
        return killed

    def __enter__(self) -> "LabServer":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ REST
    def api(self, method: str, path: str, body: dict | None = None, timeout: float = 30):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def close_sessions(self) -> None:
        """Shut down every kernel session (kernels outlive the pages that opened them)."""
        self.remember_children()
        for s in self.api("GET", "/api/sessions"):
            self.api("DELETE", f"/api/sessions/{s['id']}", timeout=60)

    def lab_url(self, path: str = "") -> str:
        where = f"/lab/tree/{path}" if path else "/lab"
        return f"{self.url}{where}?reset&token={self.token}"

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


# ---------------------------------------------------------------------- the notebook page

# Installed into the page once Lab is up. It reads Lab's own models (outputs, execution counts,
# kernel status), so the waits below are on real conditions, never on time.
_JS = r"""
() => {
  if (window.__bt) return true;
  const CONTROLS = ['.widget-slider', '.widget-dropdown', '.widget-toggle-buttons',
    '.widget-toggle-button', '.widget-checkbox', '.widget-radio', '.widget-select',
    '.widget-button', '.widget-text', '.widget-play', '.widget-colorpicker', '.widget-datepicker'];
  const bt = {panel: null, kernelSeen: null, infoOk: null, busy: 0, runDone: false, runs: 0, events: [],
              sent: 0, replied: 0, kernelLost: false};
  const hash = (s) => { let h = 5381; for (let i = 0; i < s.length; i++) h = ((h * 33) ^ s.charCodeAt(i)) >>> 0; return h.toString(16) + ':' + s.length; };
  bt.find = (path) => {
    for (const w of jupyterapp.shell.widgets('main')) {
      if (w.context && w.context.path === path && w.content && w.content.widgets) { bt.panel = w; return true; }
    }
    return false;
  };
  bt.kernel = () => { const s = bt.panel && bt.panel.sessionContext.session; return s ? s.kernel : null; };
  bt.track = () => {
    const k = bt.kernel();
    if (!k || bt.kernelSeen === k) return k;
    bt.kernelSeen = k;
    k.statusChanged.connect((_, s) => {
      if (s === 'busy') bt.busy++;
      else if (s !== 'idle') bt.events.push(`${new Date().toISOString()} kernel ${s}`);
      if (['restarting', 'autorestarting', 'dead'].includes(s)) bt.kernelLost = true;
    });
    k.connectionStatusChanged.connect((_, s) => bt.events.push(`${new Date().toISOString()} connection ${s}`));
    // The kernel's own account of the run: every execute_request sent, every execute_reply back.
    // (Lab's Run All promise settles at the first error reply and clears the [*] of the cells still
    // queued, which the kernel then runs anyway: neither says when the run is over.)
    k.anyMessage.connect((_, {msg, direction}) => {
      const type = msg.header.msg_type;
      if (direction === 'send' && type === 'execute_request') bt.sent++;
      if (direction === 'recv' && type === 'execute_reply') bt.replied++;
    });
    k.info.then(() => { bt.infoOk = k; });
    return k;
  };
  bt.ready = () => {
    if (!bt.panel || !bt.panel.context.isReady) return false;
    const k = bt.track();
    return !!k && bt.infoOk === k && k.connectionStatus === 'connected' && k.status === 'idle'
      && bt.panel.content.widgets.length > 0;
  };
  bt.status = () => { const k = bt.kernel(); return k ? k.status : 'none'; };
  bt.prompts = () => bt.panel.content.widgets.map(c => c.model.type !== 'code' ? null
      : ((c.node.querySelector('.jp-InputPrompt') || {}).textContent || '').trim());
  bt.started = () => bt.sent > 0;
  bt.running = () => bt.prompts().some(p => p && p.includes('*'));
  bt.runAll = () => {
    bt.runDone = false; bt.runError = null; bt.runs++;
    jupyterapp.shell.activateById(bt.panel.id);
    jupyterapp.commands.execute('notebook:run-all-cells').then(
      r => { bt.runDone = true; bt.runResult = r; bt.events.push(`${new Date().toISOString()} run-all resolved ${r}`); },
      e => { bt.runDone = true; bt.runError = String(e); });
  };
  bt.finished = () => bt.kernelLost
      || (bt.runDone && bt.sent > 0 && bt.replied >= bt.sent && bt.status() === 'idle');
  // The page has caught up with the kernel: every image output drawn, every widget view rendered.
  bt.settled = () => bt.cells().every(c => c.type !== 'code' || (c.imgs >= c.png
      && (!c.widgetViews || c.renderedWidgets > 0) && !c.widgetProblems.includes('Loading widget...')));
  bt.controlSelector = CONTROLS.join(', ');
  // What a widget drives, as the learner sees it: each cell's output minus the controls.
  bt.signature = () => bt.panel.content.widgets.map(c => {
    const area = c.node.querySelector('.jp-Cell-outputArea');
    if (!area) return '';
    const copy = area.cloneNode(true);
    copy.querySelectorAll(bt.controlSelector).forEach(e => e.remove());
    const imgs = [...copy.querySelectorAll('img')].map(i => i.getAttribute('src') || '');
    return hash(copy.textContent + '\u0000' + imgs.join('\u0000'));
  });
  bt.cells = () => bt.panel.content.widgets.map((c, index) => {
    const cell = {index, type: c.model.type, prompt: null, errors: [], png: 0, widgetViews: 0,
                  imgs: 0, text: '', widgetProblems: [], controls: [], renderedWidgets: 0, uncaught: 0,
                  streamText: '', duplicateImgs: 0, mathErrors: []};
    // A formula MathJax could not typeset (the learner sees a red "Math input error").
    cell.mathErrors = [...c.node.querySelectorAll('mjx-merror')].map(e => e.getAttribute('data-mjx-error') || 'Math input error');
    if (c.model.type !== 'code') return cell;
    cell.prompt = ((c.node.querySelector('.jp-InputPrompt') || {}).textContent || '').trim();
    for (const o of c.model.outputs.toJSON()) {
      if (o.output_type === 'error') cell.errors.push(o.ename + ': ' + o.evalue);
      if (o.output_type === 'stream') cell.streamText += [].concat(o.text).join('');
      const d = o.data || {};
      if (d['image/png']) cell.png++;
      if (d['application/vnd.jupyter.widget-view+json']) cell.widgetViews++;
    }
    const area = c.node.querySelector('.jp-Cell-outputArea');
    if (!area) return cell;
    const srcs = [...area.querySelectorAll('img[src^="data:image/png"]')].map(i => i.getAttribute('src'));
    cell.imgs = srcs.length;
    cell.duplicateImgs = srcs.length - new Set(srcs).size;
    cell.text = area.innerText;
    // IPython's header of an uncaught exception: also catches those shown inside widget outputs.
    cell.uncaught = (cell.text.match(/^-{40,}\s*\n\S+\s+Traceback \(most recent call last\)/gm) || []).length;
    for (const m of ['Error displaying widget', 'Loading widget...', 'model not found'])
      if (cell.text.includes(m)) cell.widgetProblems.push(m);
    cell.renderedWidgets = area.querySelectorAll('.jupyter-widgets').length;
    // Outermost controls only (a ToggleButtons group holds toggle buttons).
    const found = [...area.querySelectorAll(bt.controlSelector)]
      .filter(e => !e.parentElement.closest(bt.controlSelector));
    found.forEach((e, j) => {
      const id = `c${index}_${j}`;
      e.setAttribute('data-bt-id', id);
      const kind = CONTROLS.find(s => e.matches(s)).slice(8);
      const clean = t => (t || '').replace(/\u200b/g, '').trim();
      const label = (clean((e.querySelector('.widget-label') || {}).textContent) || clean(e.textContent)).slice(0, 40);
      const r = e.getBoundingClientRect();
      const labelNode = e.querySelector('.widget-label');
      const cut = !!labelNode && labelNode.scrollWidth > labelNode.clientWidth + 1;
      cell.controls.push({id, kind, label: label.trim(), labelCut: cut, disabled: !!e.querySelector('[disabled]') || e.hasAttribute('disabled'),
                          visible: r.width > 0 && r.height > 0, inPrediction: !!e.closest('.course-prediction')});
    });
    return cell;
  });
  // The course's "Predict first" widgets (helpers.lessons.interact.predict): choices and feedback.
  bt.predictions = () => [...bt.panel.content.node.querySelectorAll('.course-prediction')].map((p, j) => {
    const id = `p${j}`;
    p.setAttribute('data-bt-pred', id);
    const htmls = p.querySelectorAll('.widget-html');
    const feedback = htmls.length > 1 ? htmls[htmls.length - 1].innerText.trim() : null;
    const cellNode = p.closest('.jp-Cell');
    const cell = bt.panel.content.widgets.findIndex(c => c.node === cellNode);
    return {id, cell, choices: p.querySelectorAll('input[type="radio"]').length,
            checked: p.querySelectorAll('input[type="radio"]:checked').length, feedback};
  });
  // Review answers: <details> blocks in rendered markdown, and whether their answer shows.
  bt.details = () => [...bt.panel.content.node.querySelectorAll('.jp-MarkdownCell details')].map((d, j) => {
    const id = `d${j}`;
    d.setAttribute('data-bt-details', id);
    const body = [...d.children].filter(n => n.tagName !== 'SUMMARY');
    // A closed <details> keeps its children in the layout under content-visibility: hidden, so
    // their boxes are not empty; checkVisibility() says whether the learner can see them.
    const shown = body.some(n => n.checkVisibility ? n.checkVisibility({contentVisibilityAuto: true,
        visibilityProperty: true, opacityProperty: true}) : n.getClientRects().length > 0);
    const cellNode = d.closest('.jp-Cell');
    return {id, cell: bt.panel.content.widgets.findIndex(c => c.node === cellNode), open: d.open,
            answerShown: shown, answerText: body.map(n => n.innerText).join(' ').trim().slice(0, 80)};
  });
  bt.scroller = () => bt.panel.content.node.querySelector('.jp-WindowedPanel-outer') || bt.panel.content.node;
  // Scrolled to the top, how much taller the notebook is than its panel (0: all of it shows).
  bt.overflow = () => { const s = bt.scroller(); s.scrollTop = 0; return s.scrollHeight - s.clientHeight; };
  bt.frames = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  window.__bt = bt;
  return true;
}
"""


@dataclass
class ControlResult:
    cell: int
    kind: str
    label: str
    action: str = ""
    changed_cells: list[int] = field(default_factory=list)
    problem: str = ""
    seconds: float = 0.0


class NotebookDriver:
    """One learner notebook open in a page of Lab; every wait is on a condition in the page."""

    def __init__(self, page, lab: LabServer, relpath: str, timeouts: dict):
        self.page, self.lab, self.relpath = page, lab, relpath
        self.t = timeouts  # seconds: open, kernel, start, run, widget
        self.run_attempts = 0

    def _wait(self, expr: str, seconds: float, what: str, arg=None, polling: int = 250):
        from playwright.sync_api import TimeoutError as PWTimeout

        try:
            self.page.wait_for_function(expr, arg=arg, timeout=seconds * 1000, polling=polling)
        except PWTimeout:
            state = self.page.evaluate("() => window.__bt && window.__bt.panel ? "
                                       "{status: __bt.status(), prompts: __bt.prompts(), "
                                       "runDone: __bt.runDone, runs: __bt.runs, sent: __bt.sent, "
                                       "replied: __bt.replied, events: __bt.events} : null")
            raise TimeoutError(f"{self.relpath}: {what} did not happen in {seconds:.0f} s "
                               f"(page state: {state})") from None

    def open(self) -> None:
        self.page.goto(self.lab.lab_url(self.relpath), timeout=self.t["open"] * 1000)
        self._wait("() => !!(window.jupyterapp && window.jupyterapp.shell)", self.t["open"],
                   "JupyterLab loading")
        self.page.evaluate(_JS)
        self._wait("p => window.__bt.find(p)", self.t["open"], "the notebook opening", self.relpath)
        self._wait("() => window.__bt.ready()", self.t["kernel"], "the kernel becoming ready")

    def run_all(self) -> float:
        """Run All, retried if Lab accepted it but started nothing; returns the run's seconds."""
        t0 = time.monotonic()
        for attempt in range(3):
            self.run_attempts = attempt + 1
            self.page.evaluate("() => window.__bt.runAll()")
            try:
                self._wait("() => window.__bt.started() || window.__bt.runDone", self.t["start"],
                           "Run All starting")
            except TimeoutError:
                continue
            if self.page.evaluate("() => window.__bt.started()"):
                break
            self._wait("() => window.__bt.ready()", self.t["kernel"], "the kernel being idle")
        else:
            raise AssertionError(f"{self.relpath}: Run All started no cell in 3 attempts")
        self._wait("() => window.__bt.finished()", self.t["run"], "the run finishing", polling=500)
        seconds = time.monotonic() - t0
        try:  # rendering lags the kernel by a moment; what is still missing then is reported
            self._wait("() => window.__bt.settled()", self.t["redraw"], "the outputs rendering", polling=500)
        except TimeoutError:
            pass
        return seconds

    def cells(self) -> list[dict]:
        return self.page.evaluate("() => window.__bt.cells()")

    def signature(self) -> list[str]:
        return self.page.evaluate("() => window.__bt.signature()")

    def screenshot(self, path: Path, width: int = 1280, max_height: int = 16000) -> None:
        """The whole notebook in one picture: a viewport as tall as the notebook."""
        height = self.page.viewport_size["height"]
        for _ in range(5):  # Lab lays the page out again after each resize: measure, grow, repeat
            self.page.evaluate("() => window.__bt.frames()")
            extra = self.page.evaluate("() => window.__bt.overflow()")
            if extra <= 0 or height >= max_height:
                break
            height = min(max_height, height + extra + 40)
            self.page.set_viewport_size({"width": width, "height": height})
        self.page.evaluate("() => window.__bt.frames()")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path), timeout=120_000)

    # ------------------------------------------------------------------ predictions and review answers
    def predictions(self) -> list[dict]:
        return self.page.evaluate("() => window.__bt.predictions()")

    def answer_prediction(self, pred: dict) -> str:
        """Pick the first choice of one prediction, as a learner clicks it; return the feedback
        shown, or raise TimeoutError if none appears."""
        loc = self.page.locator(f'[data-bt-pred="{pred["id"]}"] input[type="radio"]').first
        loc.scroll_into_view_if_needed(timeout=10_000)
        busy = self._busy_count()
        loc.click()
        self._answered(busy, f"the prediction in cell {pred['cell']}")
        self._wait("id => { const p = window.__bt.predictions().find(q => q.id === id);"
                   " return p && p.feedback && /Right|Not quite/.test(p.feedback); }",
                   self.t["redraw"], f"the feedback of the prediction in cell {pred['cell']}",
                   arg=pred["id"])
        return next(p for p in self.predictions() if p["id"] == pred["id"])["feedback"]

    def details(self) -> list[dict]:
        return self.page.evaluate("() => window.__bt.details()")

    def open_details(self, item: dict) -> dict:
        """Click a review question's summary, as a learner opens the answer; return it again."""
        loc = self.page.locator(f'[data-bt-details="{item["id"]}"] > summary')
        loc.scroll_into_view_if_needed(timeout=10_000)
        loc.click()
        self.page.evaluate("() => window.__bt.frames()")
        return next(d for d in self.details() if d["id"] == item["id"])

    # ------------------------------------------------------------------ widgets
    def _busy_count(self) -> int:
        return self.page.evaluate("() => window.__bt.busy")

    def _gesture(self, control: dict) -> tuple[str, str]:
        """Do what a learner does to this control; return (what was done, what went wrong)."""
        loc = self.page.locator(f'[data-bt-id="{control["id"]}"]')
        loc.scroll_into_view_if_needed(timeout=10_000)
        kind = control["kind"]
        if kind == "slider":
            handle = loc.locator(".noUi-handle").first
            value = handle.get_attribute("aria-valuenow")
            handle.focus()
            handle.press("ArrowRight")
            action = f"ArrowRight from {value}"
            if handle.get_attribute("aria-valuenow") == value:  # already at the maximum
                handle.press("ArrowLeft")
                action = f"ArrowLeft from {value}"
            if handle.get_attribute("aria-valuenow") == value:
                return action, "the slider did not move"
            return action, ""
        if kind in ("dropdown", "select"):
            sel = loc.locator("select")
            current = sel.input_value()
            options = sel.locator("option").evaluate_all("os => os.map(o => o.value)")
            other = next((o for o in options if o != current), None)
            if other is None:
                return "", "a single option: nothing to choose"
            sel.select_option(value=other)
            return f"select option {other!r}", ""
        if kind in ("toggle-buttons", "radio"):
            choices = loc.locator("button:not(.mod-active)" if kind == "toggle-buttons"
                                  else "input:not(:checked)")
            if choices.count() == 0:
                return "", "no other choice to click"
            action = f"click {(choices.first.inner_text() or 'another choice')!r}"
            choices.first.click()
            return action, ""
        if kind in ("toggle-button", "button"):
            loc.click()
            return "click", ""
        if kind == "checkbox":
            loc.locator("input").click()
            return "click the checkbox", ""
        return "", "no learner gesture defined for this kind of control"

    def _answered(self, busy: int, what: str) -> None:
        """The kernel took the change (it went busy) and has finished with it (idle again)."""
        self._wait(f"() => window.__bt.busy > {busy} && window.__bt.status() === 'idle'",
                   self.t["widget"], f"the kernel answering {what}")

    def move(self, control: dict, press: dict | None = None, must_change: bool = True) -> ControlResult:
        """Move one control (then press ``press``, a Run button, if the cell has one); wait for the
        kernel; return which cells' outputs changed. ``must_change``: no change is a problem."""
        res = ControlResult(cell=int(control["id"][1:].split("_")[0]), kind=control["kind"],
                            label=control["label"])
        what = f"{control['kind']} {control['label']!r}"
        before = self.signature()
        t0 = time.monotonic()
        busy = self._busy_count()
        res.action, res.problem = self._gesture(control)
        if res.problem:
            return res
        self._answered(busy, what)
        if press is not None:
            busy = self._busy_count()
            action, res.problem = self._gesture(press)
            if res.problem:
                return res
            res.action += f", then {action} {press['label']!r}"
            self._answered(busy, f"{press['kind']} {press['label']!r}")
        try:
            self._wait("before => { const now = window.__bt.signature();"
                       " return now.some((s, i) => s !== before[i]); }",
                       self.t["redraw"] if must_change else 5,
                       f"an output redrawing after {what}", arg=before)
        except TimeoutError:
            if must_change:
                res.problem = "no output changed"
        after = self.signature()
        res.changed_cells = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
        res.seconds = time.monotonic() - t0
        return res


# ---------------------------------------------------------------------- what the .ipynb says

def graded_cells(path: Path, tests_only: bool = False) -> set[int]:
    """Indexes of the cells nbgrader grades: answers (solution) and tests (grade)."""
    nb = nbformat.read(path, as_version=4)
    keys = ("grade",) if tests_only else ("grade", "solution")
    return {i for i, c in enumerate(nb.cells)
            if any(c.metadata.get("nbgrader", {}).get(k) for k in keys)}


_DRAWS = re.compile(r"^(?!\s)(?!def |class |#).*(\bplt\.(subplots|figure|show|plot|bar|hist|imshow)\(|"
                    r"\bplot_\w+\(|\.(plot|bar|barh|hist|imshow|scatter|step|errorbar)\()", re.M)
_POOL = re.compile(r"\brun\(")


def cells_that_draw(path: Path) -> set[int]:
    """Non-graded code cells whose top-level code draws a figure (so an image must appear)."""
    nb = nbformat.read(path, as_version=4)
    graded = graded_cells(path)
    return {i for i, c in enumerate(nb.cells) if c.cell_type == "code" and i not in graded
            and _DRAWS.search(c.source) and "plt.close(" not in c.source}


def runs_pools(path: Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    graded = graded_cells(path)
    return any(c.cell_type == "code" and i not in graded and _POOL.search(c.source)
               for i, c in enumerate(nb.cells))


def mark_graded_cells_may_raise(path: Path) -> None:
    """Tag the graded cells of a (copied) learner notebook ``raises-exception``.

    A learner's empty answers raise; Lab's Run All would then abort every later cell. The tag
    makes Lab run on past them (as nbclient's allow_errors does in tests/nbrun.py), so the test
    sees every other cell run. Only the temporary copy is changed.
    """
    nb = nbformat.read(path, as_version=4)
    for i in graded_cells(path):
        tags = nb.cells[i].metadata.setdefault("tags", [])
        if "raises-exception" not in tags:
            tags.append("raises-exception")
    nbformat.write(nb, path)


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RANK_LINE = re.compile(r"^\[rank (\d+)\] (.*)$", re.M)
NOISE = re.compile(r"^\[(Gloo|W\d+|I\d+|E\d+) |UserWarning|FutureWarning|DeprecationWarning|"
                   r"Connection closed by peer", re.M)


def check_notebook(driver: NotebookDriver, source: Path, shot: Path, long_output: int = 40) -> dict:
    """Open, Run All, screenshot, then check what the learner sees. Returns the report (also
    written beside the screenshot as .json): ``problems`` fail the test, ``notes`` are for a human.
    """
    graded = graded_cells(source)
    report = {"notebook": driver.relpath, "graded_cells": sorted(graded), "problems": [],
              "notes": [], "widget_moves": []}
    problems, notes = report["problems"], report["notes"]
    t0 = time.monotonic()
    driver.open()
    report["open_seconds"] = round(time.monotonic() - t0, 1)
    try:
        report["run_seconds"] = round(driver.run_all(), 1)
        report["run_attempts"] = driver.run_attempts
    finally:  # a screenshot of whatever the page shows, even after a timeout
        cells = driver.cells()
        driver.screenshot(shot)
        report["cells"] = [{k: c[k] for k in ("index", "prompt", "errors", "imgs", "controls")}
                           for c in cells if c["type"] == "code"]
        _write(report, shot)
    code = [c for c in cells if c["type"] == "code"]

    # Every cell ran; errors only where the learner's answers go.
    not_run = [c["index"] for c in code if not re.search(r"\d", c["prompt"] or "")]
    report["events"] = driver.page.evaluate("() => window.__bt.events")
    if driver.page.evaluate("() => window.__bt.kernelLost"):
        problems.append(f"the kernel died or restarted during the run: {report['events']}")
    if not_run:
        problems.append(f"cells that did not run: {not_run} (kernel/run events: {report['events']})")
        report["lab_log"] = driver.lab.log_tail(80)
    problems += _errors_outside(code, graded)
    if graded_cells(source, tests_only=True) and not any(c["errors"] for c in code
                                                         if c["index"] in graded):
        problems.append("the empty answers should make a graded test fail on the page")

    # Plots: every image output is on the page, and every cell that draws shows one.
    for c in code:
        if c["imgs"] < c["png"]:
            problems.append(f"cell {c['index']}: {c['png']} image outputs but {c['imgs']} images shown")
    for i in sorted(cells_that_draw(source)):
        if cells[i]["imgs"] == 0:
            problems.append(f"cell {i} draws a figure but no data:image/png image is shown")

    # Per-rank output of a pool: every line the ranks streamed is shown in the cell that ran
    # them; the start notebook, which teaches the pool, shows lines from two ranks.
    ranks_seen = set()
    for c in code:
        lines = RANK_LINE.findall(ANSI.sub("", c["streamText"]))
        ranks_seen.update(int(r) for r, _ in lines)
        shown = {" ".join(line.split()) for line in c["text"].splitlines()}
        missing = [f"[rank {r}] {t}" for r, t in lines
                   if "\r" not in t and " ".join(f"[rank {r}] {t}".split()) not in shown]
        if missing:
            problems.append(f"cell {c['index']}: per-rank output not shown on the page: {missing[:3]}")
    if source.parent.name == "start" and not {0, 1} <= ranks_seen:
        problems.append(f"per-rank output ('[rank 0] ...', '[rank 1] ...') missing; ranks seen: {ranks_seen}")
    elif runs_pools(source) and not ranks_seen:
        notes.append("runs pools but no rank prints a line ('[rank r] ...') anywhere")
    report["ranks_seen_printing"] = sorted(ranks_seen)

    # "Predict first" widgets start unanswered, and a pick shows whether it was right, and why.
    predictions = driver.predictions()
    report["predictions"] = len(predictions)
    for pred in predictions:
        if pred["choices"] < 2:
            problems.append(f"cell {pred['cell']}: a prediction with {pred['choices']} choices shown")
        elif pred["checked"] or pred["feedback"]:
            problems.append(f"cell {pred['cell']}: a prediction is answered before the learner picks")
        else:
            try:
                report.setdefault("prediction_feedback", []).append(driver.answer_prediction(pred))
            except TimeoutError as e:
                problems.append(f"cell {pred['cell']}: picking a choice showed no feedback ({e})")
    # Review answers start collapsed, and open when their question is clicked.
    details = driver.details()
    report["review_answers"] = len(details)
    for item in details:
        if item["open"] or item["answerShown"]:
            problems.append(f"cell {item['cell']}: a review answer is shown before it is opened")
    if details:
        opened = driver.open_details(details[0])
        if not (opened["open"] and opened["answerShown"] and opened["answerText"]):
            problems.append(f"cell {details[0]['cell']}: clicking a review question does not show its answer")

    # Widgets render, and each control, moved, changes the output it drives.
    for c in code:
        if c["widgetViews"] and not c["renderedWidgets"]:
            problems.append(f"cell {c['index']}: its widget output is not rendered")
        if c["widgetProblems"]:
            problems.append(f"cell {c['index']}: {c['widgetProblems']}")
    for c in code:
        usable = []
        for control in c["controls"]:
            if control.get("inPrediction"):
                continue  # the predictions were answered above
            if not control["visible"]:
                problems.append(f"cell {c['index']}: control {control['label']!r} is not visible")
            elif control["disabled"]:
                notes.append(f"cell {c['index']}: control {control['label']!r} is disabled; not moved")
            else:
                usable.append(control)
        buttons = [k for k in usable if k["kind"] == "button"]
        others = [k for k in usable if k["kind"] != "button"]
        # With a Run button, a learner sets the controls, then presses it; a button alone may
        # redo a deterministic run (same picture), so it only has to run without an error.
        plan = ([(k, buttons[0] if buttons else None, True) for k in others]
                or [(k, None, False) for k in buttons])
        for control, press, must_change in plan:
            moved = driver.move(control, press=press, must_change=must_change)
            report["widget_moves"].append(moved.__dict__)
            what = f"cell {c['index']}: {moved.kind} {moved.label!r} ({moved.action})"
            if moved.problem:
                problems.append(f"{what}: {moved.problem}")
            elif moved.changed_cells and c["index"] not in moved.changed_cells:
                notes.append(f"{what} redraws cell(s) {moved.changed_cells}, not its own: keep "
                             "widgets next to what they drive")
            elif not moved.changed_cells:
                notes.append(f"{what}: nothing on the page changed")

    final = driver.cells()
    if report["widget_moves"]:  # a callback's exception shows inside the widget's output
        problems += [f"after moving the widgets: {p}" for p in
                     _errors_outside([c for c in final if c["type"] == "code"], graded)
                     if "widget output" in p]
    for c in final:
        if c["mathErrors"]:
            problems.append(f"cell {c['index']} ({c['type']}): a formula does not render (MathJax: "
                            f"{c['mathErrors']}); check the LaTeX, e.g. a non-raw string turning "
                            "\\b or \\t into control characters")
    for c in code:
        if c["duplicateImgs"]:
            notes.append(f"cell {c['index']}: the same figure is shown {c['duplicateImgs'] + 1} times")
        for control in c["controls"]:
            if control["labelCut"]:
                notes.append(f"cell {c['index']}: the description of {control['kind']} "
                             f"{control['label']!r} is cut off (style={{'description_width': 'initial'}})")

    # What a learner should not have to read: log noise and walls of output (noted, not failed).
    noisy = {c["index"]: len(NOISE.findall(c["text"])) for c in code if c["index"] not in graded}
    noisy = {i: n for i, n in noisy.items() if n}
    walls = {c["index"]: c["text"].count("\n") + 1 for c in code
             if c["index"] not in graded and c["text"].count("\n") + 1 > long_output}
    if noisy:
        notes.append(f"log-like lines (Python warnings, gloo/c10d logs) in cells {noisy}")
    if walls:
        notes.append(f"long outputs (lines per cell): {walls}")
    report["reads_course_quick"] = "COURSE_QUICK" in source.read_text()
    report["total_seconds"] = round(time.monotonic() - t0, 1)
    _write(report, shot)
    return report


def _errors_outside(code: list[dict], graded: set[int]) -> list[str]:
    found = []
    for c in code:
        if c["index"] in graded:
            continue
        if c["errors"]:
            found.append(f"cell {c['index']} (not graded) shows an error: {c['errors']}")
        if c["uncaught"] > len(c["errors"]):
            found.append(f"cell {c['index']} (not graded) shows an exception in a widget output: "
                         f"{c['text'].strip().splitlines()[-1]!r}")
    return found


def _write(report: dict, shot: Path) -> None:
    shot.parent.mkdir(parents=True, exist_ok=True)
    shot.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
