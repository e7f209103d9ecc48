"""`make lab` serves JupyterLab on 127.0.0.1, opening at the start notebook, with nbgrader's server
extensions and a local exchange, so the learner's Assignment List lists the course's assignments."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import json
import urllib.request

from course_tools import depths
from tests.conftest import ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_lab_serves_the_start_notebook(tmp_path):
    port = _free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), BROWSER="true",
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"), IPYTHONDIR=str(tmp_path / "ipy"))
    proc = subprocess.Popen(["make", "lab", f"PORT={port}"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    log = []
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None:
            assert time.monotonic() < deadline, "JupyterLab did not start:\n" + "".join(log)
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "make lab exited:\n" + "".join(log)
            log.append(line)
            m = re.search(rf"(http://127\.0\.0\.1:{port}/lab/tree/notebooks/start/00_start_here\.ipynb\?token=\w+)", line)
            url = m.group(1) if m else None
        token = url.split("token=")[1]
        status = f"http://127.0.0.1:{port}/api/status?token={token}"
        while True:  # the address is printed a moment before the server accepts connections
            try:
                urllib.request.urlopen(status, timeout=5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "JupyterLab never answered:\n" + "".join(log)
                time.sleep(0.2)
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200
        api = f"http://127.0.0.1:{port}/api/contents/notebooks/start/00_start_here.ipynb?token={token}"
        with urllib.request.urlopen(api, timeout=30) as r:
            assert b"00_start_here" in r.read()
        text = "".join(log)
        for ext in ("formgrader", "assignment_list", "validate_assignment"):
            assert f"nbgrader.server_extensions.{ext} | extension was successfully loaded" in text
        # What Nbgrader > Assignment List asks the server: every depth is released, none missing.
        listed = f"http://127.0.0.1:{port}/assignments?course_id=one-rank&token={token}"
        with urllib.request.urlopen(listed, timeout=120) as r:
            answer = json.loads(r.read())
        assert answer["success"] is True, answer["value"]
        released = {a["assignment_id"] for a in answer["value"] if a["status"] == "released"}
        assert released == set(depths(ROOT)), answer["value"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
