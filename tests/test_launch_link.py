"""The site's launch links (course_tools.site.launch_url): "Open this lesson on the course's JupyterHub".

- the hub, the repository and the branch come from SITE_HUB_URL, SITE_REPO and SITE_BRANCH, with
  course_tools.site.HUB's defaults;
- nbgitpuller, which serves the link's /git-pull, is pinned and enabled in the course's environment
  (the hub's is built from the same requirements.txt);
- the link works: on a real Jupyter server (127.0.0.1, a free port, a token, temporary folders) with
  nbgitpuller, Chromium opens the link's /git-pull (as JupyterHub's /hub/user-redirect/ sends the
  learner to their own server), nbgitpuller clones the course from a local bare repository and
  redirects to the lesson in JupyterLab; the lesson is there, as committed. No network.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from course_tools import site
from tests.conftest import ROOT

LESSON = Path("notebooks/beginner/01_one_rank_writes.ipynb")


def test_the_hub_repository_and_branch_come_from_the_environment(monkeypatch):
    for name in site.HUB:
        monkeypatch.delenv(name, raising=False)
    assert site.hub() == site.HUB
    default = urllib.parse.urlsplit(site.launch_url(LESSON))
    assert f"{default.scheme}://{default.netloc}" == site.HUB["SITE_HUB_URL"]

    monkeypatch.setenv("SITE_HUB_URL", "https://jupyter.uni.example/")
    monkeypatch.setenv("SITE_REPO", "https://git.uni.example/teach/one-rank.git")
    monkeypatch.setenv("SITE_BRANCH", "spring-term")
    url = urllib.parse.urlsplit(site.launch_url(LESSON))
    assert (url.scheme, url.netloc, url.path) == ("https", "jupyter.uni.example", "/hub/user-redirect/git-pull")
    assert urllib.parse.parse_qs(url.query) == {
        "repo": ["https://git.uni.example/teach/one-rank.git"], "branch": ["spring-term"],
        "targetpath": ["one-rank"], "urlpath": [f"lab/tree/one-rank/{LESSON.as_posix()}"]}
    shown = site.page(ROOT / LESSON, LESSON)                       # the page's first lines carry it
    links = "\n".join(c.source for c in shown.cells if c.cell_type == "markdown")
    assert f"]({site.launch_url(LESSON)})" in links


def test_nbgitpuller_is_pinned_and_enabled_in_the_course_environment():
    from importlib.metadata import version

    from tests.test_repo import conda_pins, pip_pins

    assert version("nbgitpuller") == pip_pins()["nbgitpuller"] == conda_pins()["nbgitpuller"]
    listed = subprocess.run([sys.executable, "-m", "jupyter", "server", "extension", "list"],
                            capture_output=True, text=True, timeout=120)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)     # its colours
    assert "nbgitpuller enabled" in text and f"nbgitpuller {version('nbgitpuller')} OK" in text, text


def _git(*args, cwd: Path) -> None:
    subprocess.run(["git", "-c", "user.name=course", "-c", "user.email=course@example.invalid",
                    "-c", "init.defaultBranch=main", *args], cwd=cwd, check=True, capture_output=True,
                   timeout=120)


def _course_repository(tmp_path: Path) -> Path:
    """A bare repository holding the course's notebooks on branch main, named as a repository on a
    forge often is, with ``.git`` at the end."""
    work = tmp_path / "work"
    shutil.copytree(ROOT / "notebooks", work / "notebooks",
                    ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    _git("init", "-q", cwd=work)
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "the course", cwd=work)
    bare = tmp_path / "one-rank-course.git"
    _git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path)
    return bare


@pytest.fixture(scope="module")
def chromium(tmp_path_factory, playwright):
    from tests.browser_support import chromium_session

    yield from chromium_session(tmp_path_factory.mktemp("chromium-home"), playwright)


@pytest.mark.browser
def test_the_launch_link_clones_the_course_and_opens_the_lesson(chromium, tmp_path):
    from tests.browser_support import LabServer

    bare = _course_repository(tmp_path)
    home = tmp_path / "learner-home"                               # the learner's server's folder
    home.mkdir()
    with LabServer(home, tmp_path / "state") as lab:
        cfg = {"SITE_HUB_URL": lab.url, "SITE_REPO": bare.as_uri(), "SITE_BRANCH": "main"}
        link = urllib.parse.urlsplit(site.launch_url(LESSON, cfg))
        # JupyterHub sends /hub/user-redirect/<rest> to /user/<name>/<rest>, the query unchanged:
        # the learner's own server gets the link's /git-pull?...
        assert link.path == "/hub/user-redirect/git-pull", link
        context = chromium.new_context()
        try:
            page = context.new_page()
            page.goto(f"{lab.url}/git-pull?{link.query}&token={lab.token}", timeout=120_000)
            page.wait_for_url(f"{lab.url}/lab/tree/one-rank-course/{LESSON.as_posix()}**", timeout=180_000)
            # nbgitpuller redirects once the clone is done: the lesson is where the link opens it
            clone = home / "one-rank-course"
            assert sorted(p.name for p in home.iterdir()) == ["one-rank-course"], list(home.iterdir())
            assert (clone / ".git").is_dir() and (clone / LESSON).read_bytes() == (ROOT / LESSON).read_bytes()
            # and JupyterLab opens it: the notebook is drawn, its title first
            page.wait_for_selector(".jp-NotebookPanel .jp-MarkdownCell h1", timeout=180_000)
        finally:
            context.close()
            lab.close_sessions()
