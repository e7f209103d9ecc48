"""Execute notebooks in real kernels for the tests: papermill, as `make course` runs them."""

from __future__ import annotations

import time
from pathlib import Path

import nbformat

CELL_TIMEOUT = 300


def run_papermill(path: Path, out: Path, **parameters) -> tuple[nbformat.NotebookNode, float]:
    from course_tools import kernels

    t0 = time.monotonic()
    kernels.execute_notebook(str(path), str(out), parameters={"QUICK": True, **parameters},
                             cwd=str(path.parent), kernel_name="python3",
                             execution_timeout=CELL_TIMEOUT, progress_bar=False, log_output=False)
    return nbformat.read(out, as_version=4), time.monotonic() - t0


def errors(nb) -> list[tuple[int, object, str]]:
    """(index, cell, 'Ename: evalue') for every cell whose output is an error."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append((i, cell, f"{out['ename']}: {out['evalue']}"))
    return found
