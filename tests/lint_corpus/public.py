"""The public part of the linter's corpus: real training scripts, listed in public.json.

    python -m tests.lint_corpus.public [MIRROR_DIR]

copies each listed file, at the commit public.json pins, out of a local git snapshot of its
repository (``MIRROR_DIR/owner+name/repo``, default /work/.mirror, as the course's code search
tool leaves them) into ``tests/lint_corpus/public/<split>/`` with a header naming its repository,
path, commit and licence. That folder is git-ignored: the scripts are other projects' code and
stay out of this repository's history; only the list, the split and the hand-reviewed verdicts
(``reviewed``: the findings expected on the untouched file, each with a reason, and the documented
``noqa`` lines) are committed. A copy whose text no longer matches the pinned commit's is rewritten.

The split was fixed before rules were written for these files: ``dev`` files were read while the
rules grew; ``heldout`` files are only measured (bench/lint.py and tests/test_lint_corpus.py
report them separately).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
MANIFEST = HERE / "public.json"
COPIES = HERE / "public"
DEFAULT_MIRROR = Path("/work/.mirror")


@dataclass(frozen=True)
class Script:
    split: str
    repo: str
    path: str
    commit: str
    licence: str
    expected: tuple[tuple[str, int, str], ...]   # (code, line in the copy, why it is a true finding)
    noqa: tuple[tuple[str, int, str], ...]       # (code, line in the copy, why the finding is debatable)

    @property
    def copy(self) -> Path:
        name = f"{self.repo.replace('/', '__')}__{self.path.replace('/', '__')}"
        return COPIES / self.split / name


def manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def scripts() -> list[Script]:
    m = manifest()
    out = []
    for f in m["files"]:
        rev = m.get("reviewed", {}).get(f"{f['repo']}:{f['path']}", {})
        out.append(Script(f["split"], f["repo"], f["path"], f.get("commit", ""), m["licences"][f["repo"]],
                          tuple((c, n, why) for c, n, why in rev.get("expected", [])),
                          tuple((c, n, why) for c, n, why in rev.get("noqa", []))))
    return out


def header(s: Script) -> str:
    return (f"# Copied for the linter's corpus from https://github.com/{s.repo}, file {s.path},\n"
            f"# commit {s.commit}. Licence: {s.licence} (the repository's LICENSE file; its copyright\n"
            f"# notice and terms apply to this copy). Unchanged below this header except for `# noqa`\n"
            f"# comments that tests/lint_corpus/public.json documents.\n")


HEADER_LINES = 4


def with_noqa(text: str, s: Script) -> str:
    lines = text.split("\n")
    for code, n, why in s.noqa:
        i = n - 1 - HEADER_LINES
        lines[i] = f"{lines[i]}  # noqa: {code} {why}"
    return "\n".join(lines)


def source_of(s: Script, mirror: Path) -> str:
    git_dir = mirror / s.repo.replace("/", "+") / "repo"
    if not git_dir.exists():
        raise SystemExit(f"no git snapshot of {s.repo} at {git_dir}: fetch github:{s.repo} first")
    rev = s.commit or "HEAD"
    try:
        return subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{rev}:{s.path}"], check=True,
                              capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"{s.repo} has no {s.path} at {rev} in {git_dir}: {e.stderr.strip()}") from None


def materialise(mirror: Path = DEFAULT_MIRROR) -> list[Path]:
    m = manifest()
    written = []
    for f in m["files"]:
        if not f.get("commit"):
            git_dir = mirror / f["repo"].replace("/", "+") / "repo"
            f["commit"] = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "HEAD"], check=True,
                                         capture_output=True, text=True).stdout.strip()
    MANIFEST.write_text(json.dumps(m, indent=1) + "\n")
    for s in scripts():
        text = with_noqa(header(s) + source_of(s, mirror), s)
        s.copy.parent.mkdir(parents=True, exist_ok=True)
        if not s.copy.exists() or s.copy.read_text() != text:
            s.copy.write_text(text)
        written.append(s.copy)
    return written


def present() -> list[Script]:
    """The listed scripts whose copy is on disk (all of them once ``materialise`` has run)."""
    return [s for s in scripts() if s.copy.exists()]


if __name__ == "__main__":
    paths = materialise(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_MIRROR)
    print(f"{len(paths)} public scripts in {COPIES}")
