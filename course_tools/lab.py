"""`make lab`'s local nbgrader exchange, so a learner's Nbgrader > Assignment List works at home.

nbgrader's Assignment List lists what an instructor released to an *exchange* folder and fetches
it into the learner's folder. On a shared server the exchange is set up by an administrator; for
one learner running ``make lab`` on their own computer, this releases every learner notebook
(``notebooks/<depth>/``) into ``build/exchange`` and writes ``build/lab-config/nbgrader_config.py``
pointing at it. ``make lab`` puts that folder on ``JUPYTER_CONFIG_PATH`` (where nbgrader's server
extensions read their settings), so the course's own ``nbgrader_config.py`` stays as it is.
Fetched assignments land in the course folder (``start/``, ``beginner/``, ...), which git ignores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from course_tools import ROOT, depths, nbgrader

__all__ = ["prepare"]


def prepare(root: Path = ROOT, build: Path | None = None) -> Path:
    """Release every depth into ``build/exchange``; return the config folder that points at it."""
    root = Path(root).resolve()
    build = Path(build).resolve() if build else root / "build"
    exchange, config = build / "exchange", build / "lab-config"
    missing = [d for d in depths(root) if not (root / "notebooks" / d).is_dir()]
    if missing:
        raise FileNotFoundError(f"notebooks/{missing[0]} is missing: run `make release` first")
    exchange.mkdir(parents=True, exist_ok=True)
    for depth in depths(root):
        nbgrader("release_assignment", depth, "--force", f"--Exchange.root={exchange}",
                 f"--CourseDirectory.root={root}",
                 f"--CourseDirectory.db_url=sqlite:///{build / 'lab-gradebook.db'}", cwd=root)
    config.mkdir(parents=True, exist_ok=True)
    (config / "nbgrader_config.py").write_text(
        "# Written by `make lab` (course_tools/lab.py): the local exchange of this course.\n"
        "c = get_config()  # noqa: F821\n"
        f"c.Exchange.root = {str(exchange)!r}\n")
    return config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=Path, default=None, help="where exchange/ and lab-config/ go")
    args = ap.parse_args(argv)
    print(prepare(build=args.build))
    return 0


if __name__ == "__main__":
    sys.exit(main())
