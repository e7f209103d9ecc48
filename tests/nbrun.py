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


def run_allowing_errors(path: Path) -> nbformat.NotebookNode:
    """Run every cell even after errors; used for learner notebooks with empty answers."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:  # what papermill does with QUICK=True: inject after the parameters
        if "parameters" in cell.metadata.get("tags", []):
            idx = nb.cells.index(cell)
            nb.cells.insert(idx + 1, nbformat.v4.new_code_cell("QUICK = True"))
            break
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
