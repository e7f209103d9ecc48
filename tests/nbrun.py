"""Execute notebooks in real kernels for the tests (papermill for instructor versions, nbclient
with errors allowed for learner versions, whose answer cells are empty)."""

from __future__ import annotations

import time
from pathlib import Path

import nbformat

CELL_TIMEOUT = 300


def run_papermill(path: Path, out: Path, **parameters) -> tuple[nbformat.NotebookNode, float]:
    import papermill as pm

    t0 = time.monotonic()
    pm.execute_notebook(str(path), str(out), parameters={"QUICK": True, **parameters},
                        cwd=str(path.parent), kernel_name="python3",
                        execution_timeout=CELL_TIMEOUT, progress_bar=False, log_output=False)
    return nbformat.read(out, as_version=4), time.monotonic() - t0


def run_allowing_errors(path: Path, **parameters) -> nbformat.NotebookNode:
    """Run every cell even after errors; used for learner notebooks with empty answers.

    The parameters are injected by papermill (``QUICK=True`` by default), exactly as
    :func:`run_papermill` does; nbclient then runs the notebook, errors allowed.
    """
    from nbclient import NotebookClient
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    nb = parameterize_notebook(load_notebook_node(str(path)), {"QUICK": True, **parameters},
                               kernel_name="python3", language="python")
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


def is_graded(cell) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return bool(meta.get("grade") or meta.get("solution"))


def errors(nb) -> list[tuple[int, object, str]]:
    """(index, cell, 'Ename: evalue') for every cell whose output is an error."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append((i, cell, f"{out['ename']}: {out['evalue']}"))
    return found
