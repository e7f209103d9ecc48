"""`make learner-bundle`: the copy of the course to hand learners in a graded class.

It holds what a learner needs and nothing that gives answers away: ``notebooks/`` (the
released exercises, no solutions, no hidden tests), ``helpers/``, the setup files, and the
self-check (``make check`` grades with the visible tests and says that hidden tests run when
the instructor grades). Not copied: ``solutions/`` (the instructor's notebooks, with the
solutions and the hidden tests), ``tests/``, ``bench/``, CI files.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from course_tools import ROOT

__all__ = ["build", "INCLUDED"]

#: What a learner's copy holds, relative to the course root.
INCLUDED = ["notebooks", "helpers", "course_tools", "docs", "Makefile", "README.md", "requirements.txt",
            "environment.yml", "pyproject.toml", "nbgrader_config.py", ".gitignore"]
_SKIP = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.pyc", "*.egg-info")


def build(dest: Path, root: Path = ROOT) -> Path:
    """Write the learner copy to ``dest`` (which must not exist yet, or be empty)."""
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"{dest} is not empty: choose a new folder for the learner copy")
    dest.mkdir(parents=True, exist_ok=True)
    for name in INCLUDED:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=_SKIP)
        elif src.exists():
            shutil.copy2(src, dest / name)
    return dest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path, nargs="?", default=ROOT / "build" / "learner",
                    help="where to write it (default: build/learner)")
    args = ap.parse_args(argv)
    if args.dest.exists() and args.dest.resolve().is_relative_to(ROOT / "build"):
        shutil.rmtree(args.dest)
    out = build(args.dest)
    print(f"learner copy written to {out}: {', '.join(n for n in INCLUDED if (out / n).exists())}")
    print("hand learners this folder (or a repository made from it); solutions/ is not in it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
