"""Inside a graded rank: everything an answer wrote to stdout and stderr.

Used by the logging exercises (``beginner.report_average_*``, ``developer.setup_logging_*``),
whose tests are about *who prints what*. An answer can write through ``print``, through
``sys.stdout``/``sys.stderr`` (as a ``logging.StreamHandler`` made in the block does), through
``sys.__stdout__``, or straight to file descriptors 1 and 2: :func:`captured_output` catches all
of them, so no route is missed and nothing reaches the pool's own output.

Importing it changes nothing.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from typing import Iterator

__all__ = ["captured_output"]

_LIMIT = 20_000  # characters kept per stream: enough to judge, bounded for a flood


@contextlib.contextmanager
def captured_output() -> Iterator[dict]:
    """``with captured_output() as out:`` -- after the block, ``out["stdout"]`` and
    ``out["stderr"]`` hold what was written to each stream inside it (Python-level writes
    first, then what reached the file descriptor directly)."""
    out = {"stdout": "", "stderr": ""}
    streams = {"stdout": (1, io.StringIO()), "stderr": (2, io.StringIO())}
    raw, saved = {}, {}
    for name, (fd, _) in streams.items():
        getattr(sys, name).flush()
        raw[name] = tempfile.TemporaryFile()
        saved[name] = os.dup(fd)
        os.dup2(raw[name].fileno(), fd)
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = streams["stdout"][1], streams["stderr"][1]
    try:
        yield out
    finally:
        sys.stdout, sys.stderr = before
        for name, (fd, text) in streams.items():
            for stream in (sys.__stdout__, sys.__stderr__):
                try:
                    stream.flush()  # what the answer wrote to sys.__stdout__ reaches the fd now
                except (OSError, ValueError, AttributeError):
                    pass
            os.dup2(saved[name], fd)
            os.close(saved[name])
            raw[name].seek(0)
            direct = raw[name].read(_LIMIT * 4).decode("utf-8", "replace")
            raw[name].close()
            out[name] = (text.getvalue()[:_LIMIT] + direct)[:2 * _LIMIT]
