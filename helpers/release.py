"""`make release`: regenerate the learner notebooks (notebooks/) from the instructor ones (solutions/).

One source of truth: lessons are edited in solutions/<depth>/, never in notebooks/. This
runs ``nbgrader generate_assignment`` for every depth (an nbgrader "assignment" per
folder), which empties the answer cells, strips hidden tests and outputs, locks the test
cells and copies the scripts beside the notebooks. The test suite checks that notebooks/
is exactly what this produces.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def venv_env() -> dict:
    """The environment with this interpreter's bin/ first on PATH (nbgrader runs `alembic` from PATH)."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def depths(root: Path = ROOT) -> list[str]:
    """The assignment folders under solutions/, in order."""
    return sorted(p.name for p in (root / "solutions").iterdir()
                  if p.is_dir() and not p.name.startswith((".", "_")))


def generate(dest: Path, root: Path = ROOT, only: list[str] | None = None) -> None:
    """Write the learner version of every depth (or of ``only`` those) into ``dest/<depth>/``."""
    dest = Path(dest).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        for depth in only or depths(root):
            cmd = [sys.executable, "-m", "nbgrader", "generate_assignment", depth, "--force",
                   f"--CourseDirectory.root={root}",
                   f"--CourseDirectory.release_directory={dest}",
                   f"--CourseDirectory.db_url=sqlite:///{tmp}/gradebook.db",
                   "--log-level=WARN"]
            proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=venv_env())
            if proc.returncode != 0:
                raise RuntimeError(f"nbgrader generate_assignment {depth} failed:\n"
                                   f"{proc.stdout}\n{proc.stderr}")
            for junk in (dest / depth).rglob("__pycache__"):
                shutil.rmtree(junk)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", default=str(ROOT / "notebooks"), help="release folder")
    ap.add_argument("depth", nargs="*", help="only these depths (default: all)")
    args = ap.parse_args(argv)
    dest = Path(args.dest)
    staged = Path(tempfile.mkdtemp(prefix="release-"))
    try:
        generate(staged, only=args.depth or None)
        for made in sorted(p for p in staged.iterdir() if p.is_dir()):
            if (dest / made.name).exists():
                shutil.rmtree(dest / made.name)
            shutil.copytree(made, dest / made.name)
        for old in (p for p in dest.iterdir() if p.is_dir()) if dest.exists() else []:
            if not (ROOT / "solutions" / old.name).is_dir():
                shutil.rmtree(old)  # a depth removed from solutions/
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    for depth in args.depth or depths():
        for nb in sorted((dest / depth).glob("*.ipynb")):
            print(f"released {nb}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
