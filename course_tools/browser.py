"""Find the Chromium (or Chrome) that the browser test drives: ``python -m course_tools.browser``.

Order: ``$COURSE_CHROMIUM`` if set; Debian's ``/usr/bin/chromium``; then whatever the machine has
on PATH under the usual names (GitHub's Ubuntu runners ship Google Chrome, not Debian's package).
``make test`` installs Debian's chromium when none is found and it runs as root.
"""

from __future__ import annotations

import os
import shutil
import sys

__all__ = ["find_chromium", "CANDIDATES"]

CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome",
              "google-chrome-stable", "chrome")


def find_chromium(candidates=CANDIDATES) -> str | None:
    """The path of a Chromium-family browser, or ``None``."""
    chosen = os.environ.get("COURSE_CHROMIUM")
    if chosen:
        return chosen if os.access(chosen, os.X_OK) else None
    for name in candidates:
        path = name if os.path.isabs(name) else shutil.which(name)
        if path and os.access(path, os.X_OK):
            return path
    return None


def main() -> int:
    path = find_chromium()
    if path is None:
        where = os.environ.get("COURSE_CHROMIUM")
        print(f"COURSE_CHROMIUM={where} is not an executable" if where else
              "no Chromium or Chrome found: install Debian's chromium (sudo apt-get install chromium) "
              "or set COURSE_CHROMIUM=/path/to/chrome", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
