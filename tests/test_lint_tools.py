"""The linter's three ways in, each run for real: the command (a subprocess: output, exit codes 0/1/2,
notebooks, folders), the flake8 plugin (flake8 as a subprocess, found through its entry point), and
the IPython extension (a real kernel through nbclient: findings above the cell's output, the cell
still runs).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import nbformat
import pytest

from tests.conftest import ROOT

EVERY_RANK_SAVES = textwrap.dedent("""\
    import torch
    import torch.distributed as dist

    def save(state, path):
        torch.save(state, path)
        dist.barrier()
    """)
CLEAN = EVERY_RANK_SAVES.replace("    torch.save(state, path)\n",
                                 "    if dist.get_rank() == 0:\n        torch.save(state, path)\n")
assert CLEAN != EVERY_RANK_SAVES


def run(*args, cwd):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def notebook(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a lesson")] + [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)


def test_command_exit_codes_and_positions(tmp_path):
    (tmp_path / "clean.py").write_text(CLEAN)
    (tmp_path / "bad.py").write_text(EVERY_RANK_SAVES)
    (tmp_path / "broken.py").write_text("def f(:\n    pass\n")

    ok = run("-m", "helpers.lint", "clean.py", cwd=tmp_path)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "", "")

    bad = run("-m", "helpers.lint", "bad.py", "clean.py", cwd=tmp_path)
    assert bad.returncode == 1
    assert bad.stdout.splitlines() == [
        "bad.py:5:5: ORK102 torch.save runs on every rank: every process writes the same file at once, which "
        "can leave it torn or mixed; write from rank 0 only (`if rank == 0:`), then dist.barrier() before anyone "
        "reads it"]

    broken = run("-m", "helpers.lint", "broken.py", "bad.py", cwd=tmp_path)
    assert broken.returncode == 2
    assert "broken.py: cannot parse:" in broken.stderr and "line 1" in broken.stderr
    assert "bad.py:5:5: ORK102" in broken.stdout          # the other files are still checked


def test_command_reads_notebooks_cell_by_cell_and_walks_folders(tmp_path):
    sub = tmp_path / "course" / "lessons"
    sub.mkdir(parents=True)
    notebook(sub / "lesson.ipynb", "import torch.distributed as dist\n%matplotlib inline",
             "def f():\n    if dist.get_rank() == 0:\n        dist.barrier()\n", "!echo hi")
    (tmp_path / "course" / "ok.py").write_text(CLEAN)
    (tmp_path / "course" / ".venv").mkdir()
    (tmp_path / "course" / ".venv" / "skipped.py").write_text(EVERY_RANK_SAVES)
    out = run("-m", "helpers.lint", "course", cwd=tmp_path)
    assert out.returncode == 1
    assert [line.split(" ORK")[0] for line in out.stdout.splitlines()] == ["course/lessons/lesson.ipynb:cell 3:3:9:"]
    assert "ORK101 dist.barrier() is reached by rank 0 only" in out.stdout


def test_command_rejects_a_file_that_is_not_a_notebook(tmp_path):
    (tmp_path / "bad.ipynb").write_text("{not json")
    out = run("-m", "helpers.lint", "bad.ipynb", cwd=tmp_path)
    assert out.returncode == 2 and "not a readable notebook" in out.stderr


def test_flake8_plugin(tmp_path):
    (tmp_path / "train.py").write_text(EVERY_RANK_SAVES)
    (tmp_path / "ok.py").write_text(CLEAN)
    (tmp_path / "silenced.py").write_text(EVERY_RANK_SAVES.replace("(state, path)\n", "(state, path)  # noqa: ORK102\n"))
    out = run("-m", "flake8", "--select=ORK", "train.py", "ok.py", "silenced.py", cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert out.stdout.splitlines() == ["train.py:5:5: ORK102 torch.save runs on every rank: every process writes "
                                       "the same file at once, which can leave it torn or mixed; write from rank 0 "
                                       "only (`if rank == 0:`), then dist.barrier() before anyone reads it"]
    version = run("-m", "flake8", "--version", cwd=tmp_path)
    assert "one-rank-course-helpers" in version.stdout       # the plugin, registered by the package


def test_flake8_agrees_with_the_command_on_the_corpus():
    corpus = ROOT / "tests" / "lint_corpus"
    flake = run("-m", "flake8", "--select=ORK", "--format=%(path)s:%(row)d:%(col)d: %(code)s %(text)s", ".",
                cwd=corpus)
    ours = run("-m", "helpers.lint", ".", cwd=corpus)
    assert flake.returncode == ours.returncode == 1
    normalise = lambda text: sorted(line.removeprefix("./") for line in text.splitlines())  # noqa: E731
    assert normalise(flake.stdout) == normalise(ours.stdout)


@pytest.mark.notebook
def test_ipython_extension_in_a_real_kernel(tmp_path):
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    sources = [
        "%load_ext helpers.lint",
        "import torch\nimport torch.distributed as dist",
        "def save(state, path):\n    if dist.get_rank() == 0:\n        torch.save(state, path)\n"
        "        dist.barrier()\nprint('defined')",
        "def fixed(state, path):\n    if dist.get_rank() == 0:\n        torch.save(state, path)\n"
        "    dist.barrier()\nprint('fine')",
        "def f(:\n    pass",
        "%unload_ext helpers.lint",
        "def again():\n    if dist.get_rank() == 0:\n        dist.barrier()\nprint('unchecked')",
    ]
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    def streams(i):  # a stream's text may come in several messages: one entry per run of a stream
        runs = []
        for o in nb.cells[i].outputs:
            if o.output_type != "stream":
                continue
            if runs and runs[-1][0] == o.get("name"):
                runs[-1] = (runs[-1][0], runs[-1][1] + o.get("text", ""))
            else:
                runs.append((o.get("name"), o.get("text", "")))
        return runs

    flagged = streams(2)
    assert [name for name, _ in flagged] == ["stderr", "stdout"]      # the finding comes first
    assert flagged[0][1].startswith("helpers.lint, before this cell runs:\n  line 4: ORK101 dist.barrier()")
    assert flagged[1][1] == "defined\n"                                # and the cell still ran
    assert streams(3) == [("stdout", "fine\n")]
    assert [o.output_type for o in nb.cells[4].outputs] == ["error"]   # Python reports the syntax error itself
    assert streams(6) == [("stdout", "unchecked\n")]
    assert all(o.output_type != "error" for i in (0, 1, 2, 3, 5, 6) for o in nb.cells[i].outputs)


def test_importing_the_linter_changes_nothing():
    code = ("import sys, builtins; before = set(sys.modules); p = builtins.print\n"
            "import helpers.lint\n"
            "new = set(sys.modules) - before\n"
            "assert builtins.print is p\n"
            "assert not any(m.split('.')[0] in ('IPython', 'torch', 'flake8') for m in new), sorted(new)\n"
            "print('ok')")
    out = run("-c", code, cwd=ROOT)
    assert out.stdout.strip() == "ok", out.stderr


def test_json_notebook_sources_as_lists(tmp_path):
    """Notebooks store each cell's source as a list of lines; both forms are read."""
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                     "source": ["import torch.distributed as dist\n", "def f():\n",
                                "    if dist.get_rank() == 0:\n", "        dist.barrier()\n"]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "n.ipynb").write_text(json.dumps(nb))
    out = run("-m", "helpers.lint", "n.ipynb", cwd=tmp_path)
    assert out.returncode == 1 and out.stdout.startswith("n.ipynb:cell 1:4:9: ORK101")
