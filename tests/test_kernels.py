"""course_tools/kernels.py: a notebook run whose kernel never takes up a cell is run once more.

The kernel here is a real ipykernel whose shell dispatcher drops, unread, the execute_request of
a cell marked for it (once, or every time): what a kernel that lost a request looks like from
the client (no busy, no reply). A slow cell, which the kernel did take up, is waited for.
"""

from __future__ import annotations

import json
import sys
import time

import nbformat
import papermill as pm
import pytest

from course_tools import kernels

#: A kernel that drops the first execute_request whose code holds "IGNORED", unless the marker
#: file (in the kernel's working folder) exists; "ALWAYS IGNORED" is dropped every time.
DROPPING_KERNEL = r'''
import json, pathlib
from ipykernel.ipkernel import IPythonKernel
from ipykernel.kernelapp import IPKernelApp

class DroppingKernel(IPythonKernel):
    async def dispatch_shell(self, msg, /, *args, **kwargs):
        _, parts = self.session.feed_identities(list(msg), copy=False)
        header, content = json.loads(parts[1].bytes), json.loads(parts[4].bytes)
        code = content.get("code", "") if header["msg_type"] == "execute_request" else ""
        marker = pathlib.Path("dropped-once")
        if "ALWAYS IGNORED" in code or ("IGNORED" in code and not marker.exists()):
            marker.touch()
            return
        return await super().dispatch_shell(msg, *args, **kwargs)

IPKernelApp.launch_instance(kernel_class=DroppingKernel)
'''


@pytest.fixture
def dropping_kernel(tmp_path, monkeypatch):
    spec = tmp_path / "jupyter" / "kernels" / "dropping"
    spec.mkdir(parents=True)
    (spec / "kernel.py").write_text(DROPPING_KERNEL)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, str(spec / "kernel.py"), "-f", "{connection_file}"],
        "display_name": "dropping", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setattr(kernels, "ACK_TIMEOUT", 3.0)
    return "dropping"


def _notebook(path, *sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "dropping", "display_name": "dropping", "language": "python"}
    nbformat.write(nb, path)
    return str(path)


def _run(tmp_path, source, kernel):
    return kernels.execute_notebook(source, str(tmp_path / "out.ipynb"), kernel_name=kernel, cwd=str(tmp_path),
                                    execution_timeout=60, progress_bar=False)


def test_a_cell_the_kernel_never_took_up_is_run_again_in_a_new_kernel(tmp_path, dropping_kernel, capfd):
    source = _notebook(tmp_path / "in.ipynb", "x = 1", "# IGNORED the first time\nprint('ran', x)")
    nb = _run(tmp_path, source, dropping_kernel)
    assert (tmp_path / "dropped-once").exists(), "the kernel did not drop the request: nothing was tested"
    assert [o.get("text") for o in nb.cells[1].outputs] == ["ran 1\n"]
    err = capfd.readouterr().err
    assert "never took up request" in err and err.count("running it again in a new kernel") == 1, err


def test_a_kernel_that_keeps_ignoring_fails_the_run_after_one_more_try(tmp_path, dropping_kernel, capfd):
    source = _notebook(tmp_path / "in.ipynb", "x = 1", "# ALWAYS IGNORED\nprint(x)")
    t0 = time.monotonic()
    with pytest.raises(kernels.KernelIgnoredRequest, match=r"never took up request .* in 3 s"):
        _run(tmp_path, source, dropping_kernel)
    assert time.monotonic() - t0 < 55, "given up by the acknowledgement, not by the cell's timeout"
    assert capfd.readouterr().err.count("running it again in a new kernel") == 1


def test_a_slow_cell_the_kernel_took_up_is_waited_for(tmp_path, dropping_kernel, capfd):
    source = _notebook(tmp_path / "in.ipynb", "import time\ntime.sleep(6)\nprint('slept')")
    nb = _run(tmp_path, source, dropping_kernel)
    assert [o.get("text") for o in nb.cells[0].outputs] == ["slept\n"]
    assert "running it again" not in capfd.readouterr().err
