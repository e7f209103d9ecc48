"""``python -m helpers.lint PATH...``: report the course's distributed mistakes in files and folders.

Prints ``path:line:col: ORK10x message`` (``path:cell N:line:col:`` in a notebook) for each
finding. Exit status: 0 nothing found, 1 findings, 2 a path could not be read or parsed (the
reason is printed; the other paths are still checked).
"""

from __future__ import annotations

import argparse
import sys

from helpers.lint.core import lint_paths
from helpers.lint.rules import CODES


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m helpers.lint", description=__doc__.split("\n\n")[0],
        epilog="codes: " + "; ".join(f"{c} {d}" for c, d in CODES.items())
        + ". Silence one line with `# noqa: ORK10x`.")
    ap.add_argument("paths", nargs="+", metavar="PATH", help="Python files, notebooks or folders")
    args = ap.parse_args(argv)
    status = 0
    for report in lint_paths(args.paths):
        for err in report.errors:
            print(f"{report.path}: cannot parse: {err}", file=sys.stderr)
            status = 2
        for f in report.findings:
            print(f.format(report.path))
            status = status or 1
    return status


if __name__ == "__main__":
    sys.exit(main())
