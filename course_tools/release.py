"""`make release`: regenerate the learner notebooks (notebooks/) from the instructor ones (solutions/).

One source of truth: lessons are edited in solutions/<depth>/, never in notebooks/. This
runs ``nbgrader generate_assignment`` for every depth (an nbgrader "assignment" per
folder), which empties the answer cells, strips hidden tests and outputs, locks the test
cells and copies the scripts beside the notebooks. The test suite checks that notebooks/
is exactly what this produces.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from course_tools import ROOT, depths, nbgrader

def generate(dest: Path, root: Path = ROOT, only: list[str] | None = None) -> None:
    """Write the learner version of every depth (or of ``only`` those) into ``dest/<depth>/``."""
    dest = Path(dest).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        for depth in only or depths(root):
            nbgrader("generate_assignment", depth, "--force", f"--CourseDirectory.root={root}",
                     f"--CourseDirectory.release_directory={dest}",
                     f"--CourseDirectory.db_url=sqlite:///{tmp}/gradebook.db", cwd=root)
            for junk in (dest / depth).rglob("__pycache__"):
                shutil.rmtree(junk)


def _is_released_depth(folder: Path) -> bool:
    """A folder this tool wrote: it holds notebooks, and each carries nbgrader's cell metadata."""
    import json

    notebooks = list(folder.glob("*.ipynb"))
    if not notebooks:
        return False
    for nb in notebooks:
        try:
            cells = json.loads(nb.read_text()).get("cells", [])
        except (OSError, ValueError):
            return False
        if not any("nbgrader" in c.get("metadata", {}) for c in cells):
            return False
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", default=str(ROOT / "notebooks"), help="release folder")
    ap.add_argument("depth", nargs="*", help="only these depths (default: all)")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.depth) - set(depths()))
    if unknown:
        ap.error(f"unknown depth(s) {', '.join(unknown)}: choose from {', '.join(depths())}")
    dest = Path(args.dest)
    staged = Path(tempfile.mkdtemp(prefix="release-"))
    try:
        generate(staged, only=args.depth or None)
        for made in sorted(p for p in staged.iterdir() if p.is_dir()):
            if (dest / made.name).exists():
                shutil.rmtree(dest / made.name)
            shutil.copytree(made, dest / made.name)
        for old in (p for p in dest.iterdir() if p.is_dir()) if dest.exists() else []:
            # a depth removed from solutions/; any other folder in dest is not ours to delete
            if not (ROOT / "solutions" / old.name).is_dir() and _is_released_depth(old):
                shutil.rmtree(old)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    for depth in args.depth or depths():
        for nb in sorted((dest / depth).glob("*.ipynb")):
            print(f"released {nb}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
