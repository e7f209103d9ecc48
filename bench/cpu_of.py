"""``python -m bench.cpu_of OUT.json ARGS...``: ``nbgrader ARGS...``, run in this process, then the
CPU seconds it used written to OUT.json: this process's and its children's, the sandboxed kernels
and ranks counted exactly by their cgroups (:func:`course_tools.autograde.cpu_seconds`), as
``course_tools.grade`` counts each submission. The class bench's measure of serial nbgrader."""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    out, args = sys.argv[1], sys.argv[2:]
    sys.argv = ["nbgrader", *args]
    # nbgrader runs `alembic` when it makes a gradebook: this environment's bin/ first
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    code = 0
    try:
        from nbgrader.apps.nbgraderapp import main as nbgrader

        nbgrader()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        from course_tools.autograde import cpu_seconds

        cpu, exact = cpu_seconds()
        with open(out, "w") as f:
            json.dump({"cpu_seconds": cpu, "cpu_exact": exact}, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
